"""io: the input pipeline's images/s and MB/s per decoder and worker count (scripts/figures/io/measure.py).

    reads    figures/data/io.csv, io_loader.json, io_storage.csv, cluster/seed_io.csv, seed_throughput.csv
    draws    figures/io.png, io_storage.png (with the seed's files)
    writes   sections io, io-rates and io-storage (the long form's), hardware (when scaling has not run)
"""

import json

from scripts.figures.cluster import seed
from scripts.figures.rendering import hardware_line, plt, read_csv, save, table


def io_batches(row):
    """uint8 (the workers hand over uint8, the device normalises) or float32 (normalised in the workers)."""
    return row.get("batches") or "float32"  # (before the column: the workers normalised)


# what decodes each decoder's rows ("tensor": rows measured before TorchCodec, with torchvision.io)
DECODERS = {"pil": "PIL + transforms", "torchcodec": "TorchCodec + transforms.v2",
            "torchvision": "torchvision.io + transforms.v2", "tensor": "torchvision.io + transforms.v2"}
LIBRARIES = {"pil": "PIL", "torchcodec": "TorchCodec", "torchvision": "torchvision.io", "tensor": "torchvision.io"}
FLAGS = {"pil": "pil"}  # the --decoder flag of each decoder's rows: tensor, but for PIL


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


def workers_named(workers):
    return f"{workers} worker{'' if workers == 1 else 's'}"


def ratios(rate, top, bottom):
    """top / bottom images/s at each worker count both were measured at, in one line; '' where none."""
    shared = sorted(workers for key, workers in rate if key == top and (bottom, workers) in rate)
    return ", ".join(f"{workers_named(w)} {rate[top, w] / rate[bottom, w]:.2f}x" for w in shared)


def io_tables(io_rows, loader=None):
    """RESULTS.md's table (images/s, a column per worker count) with its ratios; and the long form's, every
    row with its MB/s."""
    by_key = {(r["decoder"], io_batches(r), int(r["workers"])): r for r in io_rows}
    rate = {((decoder, batches), workers): float(r["images_per_s"])
            for (decoder, batches, workers), r in by_key.items()}
    counts = sorted({workers for _, _, workers in by_key})
    kinds = sorted({(decoder, batches) for decoder, batches, _ in by_key}, key=lambda k: (k[1] != "uint8", k))
    io_md = table(["--decoder", "library", "batches", *(f"images/s, {workers_named(w)}" for w in counts)],
                  [[FLAGS.get(decoder, "tensor"), LIBRARIES.get(decoder, decoder), batches,
                    *(f"{rate[(decoder, batches), w]:.0f}" if ((decoder, batches), w) in rate else "" for w in counts)]
                   for decoder, batches in kinds])
    decoders = {decoder for decoder, _, _ in by_key}
    tensor = next((d for d in ("torchcodec", "torchvision", "tensor") if d in decoders), None)  # --decoder tensor
    lines = [("TorchCodec / torchvision.io", ratios(rate, ("torchcodec", "uint8"), ("torchvision", "uint8"))),
             ("--decoder tensor / PIL", ratios(rate, (tensor, "uint8"), ("pil", "uint8"))),
             ("uint8 / float32 batches of --decoder tensor",
              ratios(rate, (tensor, "uint8"), (tensor, "float32")))]
    io_md += "".join(f"\n\n{name}, images/s: {line}." for name, line in lines if line)
    if loader:
        io_md += (f"\n\nWhat the uint8 batches move to the training process on a CPU: "
                  f"{loader['normalise_ms_per_batch']:.2f} ms to convert and normalise a batch of "
                  f"{loader['batch_size']} at {loader['image_size']} px (on a GPU, the device does it); a batch is "
                  f"{loader['uint8_batch_bytes'] / 1e6:.1f} MB as uint8 and {loader['float32_batch_bytes'] / 1e6:.1f} "
                  f"MB as float32. An epoch's first batch, with {loader['first_batch_workers']} workers: "
                  f"{loader['first_batch_s_fresh_workers']:.3f} s when they start anew each epoch (with --seed), "
                  f"{loader['first_batch_s_persistent_workers']:.3f} s when they persist (the default).")
    rows = [[decoder, batches, workers, f"{float(r['images_per_s']):.1f}", f"{float(r['mb_per_s']):.1f}",
             f"{float(r['images_per_s_per_worker']):.1f}"]
            for (decoder, batches, workers), r in sorted(by_key.items())]
    rates_md = table(["decoder", "batches", "workers", "images/s", "MB/s read", "images/s per worker"], rows)
    return io_md, rates_md


def storage_tables(rows):
    """RESULTS.md's sentence (shards against the folder) and the long form's table, from io_storage.csv."""
    by_key = {(r["source"], r["cache"], int(r["workers"])): r for r in rows}
    cache = "cold" if any(key[1] == "cold" for key in by_key) else "warm"
    rate = {key: float(r["images_per_s"]) for key, r in by_key.items()}
    shared = sorted(w for source, c, w in rate if (source, c) == ("shards", cache) and ("folder", cache, w) in rate)
    ratios = ", ".join(f"{workers_named(w)} {rate['shards', cache, w] / rate['folder', cache, w]:.2f}x"
                       for w in shared)
    per_image = {source: float(r["reads_per_image"]) for (source, c, _), r in by_key.items() if c == cache}
    sentence = (f"Shards / image folder, images/s of a whole epoch on a {cache} page cache"
                f"{'' if cache == 'cold' else ' (this machine could not drop it)'}: {ratios}; read calls an image: "
                f"folder {per_image.get('folder', 0):.2f}, shards {per_image.get('shards', 0):.2f}.")
    table_md = table(["source", "page cache", "workers", "images/s", "MB/s read", "reads/s", "reads an image"],
                     [[source, c, w, f"{float(r['images_per_s']):.1f}", f"{float(r['read_mb_per_s']):.1f}",
                       f"{float(r['reads_per_s']):.0f}", f"{float(r['reads_per_image']):.2f}"]
                      for (source, c, w), r in sorted(by_key.items())])
    return sentence, table_md


def seed_storage(data):
    """What the seed's 64 V100s asked of their shared storage, from its latest run with both IO files (bandwidth and
    operations) and its images/s (figures/data/cluster/ by scripts/figures/cluster/seed.py): {day, images_per_s,
    bytes_per_s, operations_per_s}; None without them."""
    if not all((data / "cluster" / name).exists() for name in ("seed_io.csv", "seed_throughput.csv")):
        return None
    both = [run for run in seed.io_of_64_gpu_runs(data) if len(run[2]) == 2]  # (bandwidth and operations)
    if not both:
        return None
    run, images_per_s, measured = both[-1]
    return {"day": run[:5], "images_per_s": images_per_s, "bytes_per_s": measured["bandwidth"],
            "operations_per_s": measured["iops"]}


def seed_sentence(seed, rows):
    """RESULTS.md's answer: what the seed's storage delivered, and what its images/s would ask of a folder and of
    shards at the read calls an image measured here (io_storage.csv's rows)."""
    calls = {r["source"]: float(r["reads_per_image"]) for r in rows}
    rate = seed["images_per_s"]
    return (f"What does the storage need to deliver? The seed's 64 V100s (its {seed['day']} run) trained "
            f"{rate:,.0f} images/s and read {seed['bytes_per_s'] / 1e9:.2f} GB/s in {seed['operations_per_s']:,.0f} "
            f"operations/s from their shared storage: {seed['bytes_per_s'] / rate / 1e3:.1f} kB and "
            f"{seed['operations_per_s'] / rate:.2f} operations an image. At those images/s this loader asks "
            f"{calls['folder'] * rate:,.0f} read calls/s of a folder ({calls['folder']:.2f} an image, besides opening "
            f"each file) and {calls['shards'] * rate:,.0f} of shards ({calls['shards']:.2f} an image, one open a "
            f"shard).")


def plot_storage(rows, seed, figures):
    """Left: the read calls/s the loader asked of this machine's storage, folder against shards; right: the seed's
    64 V100s, the operations/s their storage delivered beside the read calls/s their images/s would ask of a
    folder and of shards with this loader."""
    fig, (here, there) = plt.subplots(1, 2, figsize=(10, 4))
    cache = "cold" if any(r["cache"] == "cold" for r in rows) else "warm"
    for source, marker in (("folder", "o"), ("shards", "s")):
        points = sorted((int(r["workers"]), float(r["reads_per_s"]), float(r["read_mb_per_s"])) for r in rows
                        if (r["source"], r["cache"]) == (source, cache))
        here.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=f"{source}: read calls/s")
    here.set(xlabel="data-loader workers", ylabel="read calls/s", xticks=sorted({int(r["workers"]) for r in rows}),
             title=f"This machine, {cache} page cache")
    here.set_ylim(bottom=0)
    here.grid(alpha=0.3)
    here.legend(fontsize=8)
    calls = {r["source"]: float(r["reads_per_image"]) for r in rows}
    bars = {"the seed's storage\n(operations/s)": seed["operations_per_s"],
            "a folder\n(read calls/s)": calls["folder"] * seed["images_per_s"],
            "shards\n(read calls/s)": calls["shards"] * seed["images_per_s"]}
    there.bar(list(bars), list(bars.values()), color=["grey", "C0", "C1"])
    there.set(ylabel="per second", title=f"At the seed's 64 V100s: {seed['images_per_s']:,.0f} images/s")
    there.tick_params(axis="x", labelsize=8)
    save(fig, figures / "io_storage.png")


def render(data, figures, missing):
    if not (data / "io.csv").exists():
        missing.append("io.csv (scripts/figures/io/measure.py)")
        return {}
    io_rows = read_csv(data / "io.csv")
    plot_io(io_rows, figures)
    loader = data / "io_loader.json"
    io_md, rates_md = io_tables(io_rows, json.loads(loader.read_text()) if loader.exists() else None)
    sections = {"io": io_md, "io-rates": rates_md, "hardware": hardware_line(data)}  # (scaling writes the same)
    if (data / "io_storage.csv").exists():
        storage_rows = read_csv(data / "io_storage.csv")
        sentence, sections["io-storage"] = storage_tables(storage_rows)
        seed = seed_storage(data)
        sections["io"] += "\n\n" + sentence + (f"\n\n{seed_sentence(seed, storage_rows)}" if seed else "")
        if seed:
            plot_storage(storage_rows, seed, figures)
    else:
        missing.append("io_storage.csv (scripts/figures/io/measure.py)")
    return sections


def headline(data):
    if not (data / "io.csv").exists():
        return None
    best = max(read_csv(data / "io.csv"), key=lambda r: float(r["images_per_s"]))
    library = LIBRARIES.get(best["decoder"], best["decoder"])
    return (f"{float(best['images_per_s']):.0f} images/s at best ({library}, {best['workers']} loader workers, "
            f"{best['image_size']} px)")
