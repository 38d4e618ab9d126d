"""io: the input pipeline's images/s and MB/s per decoder and worker count (scripts/figures/io/measure.py).

    reads    figures/data/io.csv, io_loader.json
    draws    figures/io.png
    writes   sections io, hardware (when scaling has not run)
"""

import json

from scripts.figures.rendering import hardware_line, plt, read_csv, save, table


def io_batches(row):
    """uint8 (the workers hand over uint8, the device normalises) or float32 (normalised in the workers)."""
    return row.get("batches") or "float32"  # (before the column: the workers normalised)


def plot_io(io_rows, figures):
    fig, ax = plt.subplots(figsize=(6, 4))
    for decoder, batches in sorted({(r["decoder"], io_batches(r)) for r in io_rows}):
        points = sorted((int(r["workers"]), float(r["images_per_s"])) for r in io_rows
                        if (r["decoder"], io_batches(r)) == (decoder, batches))
        ax.plot(*zip(*points), marker="o", linestyle="-" if batches == "uint8" else "--",
                label=f"{DECODERS.get(decoder, decoder)}, {batches} batches")
    size = io_rows[0].get("image_size") or "?"
    ax.set(xlabel="data-loader workers (0: in the training process)", ylabel="images/s",
           title=f"Input pipeline throughput (decode + augment to {size} px)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, figures / "io.png")


DECODERS = {"pil": "PIL + transforms", "tensor": "torchvision.io + transforms.v2"}


def io_tables(io_rows, loader=None):
    rows, by_key = [], {(r["decoder"], io_batches(r), int(r["workers"])): r for r in io_rows}
    for (decoder, batches, workers), r in sorted(by_key.items()):
        rows.append([decoder, batches, workers, f"{float(r['images_per_s']):.1f}", f"{float(r['mb_per_s']):.1f}",
                     f"{float(r['images_per_s_per_worker']):.1f}"])
    io_md = table(["decoder", "batches", "workers", "images/s", "MB/s read", "images/s per worker"], rows)
    rate = {key: float(r["images_per_s"]) for key, r in by_key.items()}
    ratios = [f"{workers} worker(s): {rate['tensor', 'uint8', workers] / rate['pil', 'uint8', workers]:.2f}x"
              for decoder, batches, workers in sorted(rate)
              if (decoder, batches) == ("pil", "uint8") and ("tensor", "uint8", workers) in rate]
    if ratios:
        io_md += "\n\ntensor / PIL images/s: " + ", ".join(ratios) + "."
    ratios = [f"{workers} worker(s): {rate['tensor', 'uint8', workers] / rate['tensor', 'float32', workers]:.2f}x"
              for decoder, batches, workers in sorted(rate)
              if (decoder, batches) == ("tensor", "float32") and ("tensor", "uint8", workers) in rate]
    if ratios:
        io_md += "\n\nuint8 / float32 batches, images/s of the tensor decoder: " + ", ".join(ratios) + "."
    if loader:
        io_md += (f"\n\nWhat the uint8 batches move to the training process on a CPU: "
                  f"{loader['normalise_ms_per_batch']:.2f} ms to convert and normalise a batch of "
                  f"{loader['batch_size']} at {loader['image_size']} px (on a GPU, the device does it); a batch is "
                  f"{loader['uint8_batch_bytes'] / 1e6:.1f} MB as uint8 and {loader['float32_batch_bytes'] / 1e6:.1f} "
                  f"MB as float32. An epoch's first batch, with {loader['first_batch_workers']} workers: "
                  f"{loader['first_batch_s_fresh_workers']:.3f} s when they start anew each epoch (with --seed), "
                  f"{loader['first_batch_s_persistent_workers']:.3f} s when they persist (the default).")
    return io_md


def render(data, figures, missing):
    if not (data / "io.csv").exists():
        missing.append("io.csv (scripts/figures/io/measure.py)")
        return {}
    io_rows = read_csv(data / "io.csv")
    plot_io(io_rows, figures)
    loader = data / "io_loader.json"
    return {"io": io_tables(io_rows, json.loads(loader.read_text()) if loader.exists() else None),
            "hardware": hardware_line(data)}  # (scaling writes the same)


def headline(data):
    if not (data / "io.csv").exists():
        return None
    best = max(read_csv(data / "io.csv"), key=lambda r: float(r["images_per_s"]))
    return (f"{float(best['images_per_s']):.0f} images/s at best ({best['decoder']}, {best['workers']} loader "
            f"workers, {best['image_size']} px)")
