"""Draw every figure and rewrite every table of RESULTS.md from figures/data/ alone.

    python scripts/plot_results.py                 # figures/*.png and RESULTS.md
    python scripts/plot_results.py --data D --figures F --results R.md   # elsewhere (tests)

Reads only the measured files that the benchmark scripts write:
  curves/<recipe>.csv   per-epoch metrics copied from run directories (learning_curves.py)
  scaling.csv           images/s and epoch time per world size, and the bare loop (bench_scaling.py)
  io.csv                input-pipeline images/s and MB/s per decoder and worker count (bench_io.py)
  recovery.json         checkpoint cost and restart time (bench_recovery.py)
  compression.csv       time, accuracy and bytes per gradient-compression method (compression_table.py)
  compile.csv           epoch times, eager against torch.compile (bench_compile.py)
In RESULTS.md only the text between `<!-- BEGIN name -->` and `<!-- END name -->`
markers is rewritten; the prose around it is kept.
"""

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

CURVES = [("top1", "train"), ("top1", "val"), ("top5", "train"), ("top5", "val")]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def plot_curves(curves, figures):
    for metric, split in CURVES:
        fig, ax = plt.subplots(figsize=(6, 4))
        for recipe, rows in curves.items():
            points = [(int(r["epoch"]), float(r[metric])) for r in rows if r["split"] == split]
            ax.plot(*zip(*points), marker="o", label=recipe)
        ax.set(xlabel="epoch", ylabel=f"{metric} accuracy (%)", title=f"{metric} accuracy, {split} set")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, figures / f"{metric}_{split}.png")


def curves_tables(curves, summaries):
    rows = []
    for recipe, rows_of in curves.items():
        val = [r for r in rows_of if r["split"] == "val"]
        summary = summaries.get(recipe, {})
        rows.append([recipe, summary.get("world_size", ""), len(val), f"{float(val[-1]['top1']):.2f}",
                     f"{float(val[-1]['top5']):.2f}", f"{max(float(r['top1']) for r in val):.2f}",
                     f"{summary['images_per_s']:.1f}" if summary.get("images_per_s") else "",
                     f"{summary['wall_s']:.0f}" if summary.get("wall_s") else ""])
    return table(["recipe", "processes", "epochs", "final val top-1 (%)", "final val top-5 (%)",
                  "best val top-1 (%)", "train images/s", "wall time (s)"], rows)


def scaling_points(scaling, recipe, data):
    return sorted((int(r["processes"]), float(r["images_per_s"]), r["epoch_s"]) for r in scaling
                  if r["kind"] == "recipe" and r["recipe"] == recipe and r["data"] == data)


def bare_points(scaling, name):
    return sorted((int(r["processes"]), float(r["images_per_s"])) for r in scaling
                  if r["kind"] == "bare" and r["recipe"] == name)


def plot_scaling(scaling, figures):
    main_recipe = "apex" if any(r["recipe"] == "apex" for r in scaling) else "ddp"
    fig, ax = plt.subplots(figsize=(6, 4))
    for data in ("synthetic", "jpeg"):
        points = scaling_points(scaling, main_recipe, data)
        if points:
            ax.plot([p for p, _, _ in points], [rate for _, rate, _ in points], marker="o",
                    label=f"{main_recipe}, {data} data")
    bare = sorted((int(r["processes"]), float(r["images_per_s"])) for r in scaling
                  if r["kind"] == "bare" and r["recipe"] == main_recipe)
    if bare:
        ax.plot(*zip(*bare), marker="s", linestyle=":", label="bare loop (no loader, no metrics)")
    ceiling = bare_points(scaling, "independent")
    if ceiling:
        single = bare_points(scaling, "nd")[:1] or bare[:1]
        ax.plot(*zip(*(single + ceiling)), marker="^", linestyle="-.",
                label="unconnected bare loops, summed (the machine's ceiling)")
    synthetic = scaling_points(scaling, main_recipe, "synthetic")
    if synthetic:  # the speed-up the table reports is against this line
        first, rate = synthetic[0][0], synthetic[0][1]
        processes = [p for p, _, _ in synthetic]
        ax.plot(processes, [rate * p / first for p in processes], linestyle="--", color="grey",
                label=f"ideal: {main_recipe} synthetic x processes")
    ax.set(xlabel="processes", ylabel="training throughput (images/s)", title="Training throughput")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, figures / "training_throughput.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for data in ("synthetic", "jpeg"):
        points = [(p, float(epoch_s)) for p, _, epoch_s in scaling_points(scaling, main_recipe, data)]
        if points:
            ax.plot(*zip(*points), marker="o", label=f"{main_recipe}, {data} data")
    ax.set(xlabel="processes", ylabel="time per epoch (s)", title="Training time per epoch")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, figures / "training_time.png")


def scaling_tables(scaling):
    main_recipe = "apex" if any(r["recipe"] == "apex" for r in scaling) else "ddp"
    rows = []
    for data in ("synthetic", "jpeg"):
        points = scaling_points(scaling, main_recipe, data)
        for processes, rate, epoch_s in points:
            speedup = rate / points[0][1]
            rows.append([main_recipe, data, processes, f"{rate:.1f}", f"{float(epoch_s):.1f}", f"{speedup:.2f}x",
                         f"{100 * speedup * points[0][0] / processes:.0f} %"])
    single = bare_points(scaling, "nd")[:1] or bare_points(scaling, main_recipe)[:1]
    for label, points in ((f"bare loop, {main_recipe}", bare_points(scaling, main_recipe)),
                          ("unconnected bare loops", single + bare_points(scaling, "independent"))):
        for processes, rate in points[1:] if label.startswith("unconnected") else points:
            speedup = rate / points[0][1]
            rows.append([label, "memory", processes, f"{rate:.1f}", "", f"{speedup:.2f}x",
                         f"{100 * speedup * points[0][0] / processes:.0f} %"])
    scaling_md = table(["recipe", "data", "processes", "images/s", "epoch (s)", "speed-up",
                        "scaling efficiency"], rows)
    rows = []
    for bare in (r for r in scaling if r["kind"] == "bare" and r["recipe"] != "independent"):
        for run in (r for r in scaling if r["kind"] == "recipe" and r["recipe"] == bare["recipe"]
                    and r["data"] == "synthetic" and r["processes"] == bare["processes"]):
            ratio = float(run["images_per_s"]) / float(bare["images_per_s"])
            rows.append([run["recipe"], run["processes"], run["threads"], f"{float(run['images_per_s']):.1f}",
                         f"{float(bare['images_per_s']):.1f}", f"{100 * ratio:.1f} %"])
    overhead_md = table(["recipe", "processes", "threads each", "recipe images/s (synthetic)",
                         "bare loop images/s", "recipe / bare"], rows)
    first = scaling[0]
    setup = (f"Model {first['arch']} at {first['image_size']} px, batch {first['batch_size']} per process, "
             f"{first['threads']} thread(s) per process.")
    return setup + "\n\n" + scaling_md, overhead_md


def plot_io(io_rows, figures):
    fig, ax = plt.subplots(figsize=(6, 4))
    for decoder in sorted({r["decoder"] for r in io_rows}):
        points = sorted((int(r["workers"]), float(r["images_per_s"])) for r in io_rows if r["decoder"] == decoder)
        ax.plot(*zip(*points), marker="o", label=DECODERS.get(decoder, decoder))
    size = io_rows[0].get("image_size") or "?"
    ax.set(xlabel="data-loader workers (0: in the training process)", ylabel="images/s",
           title=f"Input pipeline throughput (decode + augment to {size} px)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, figures / "IO.png")


DECODERS = {"pil": "PIL + transforms", "tensor": "torchvision.io + transforms.v2 (uint8)"}


def io_tables(io_rows):
    rows, by_key = [], {(r["decoder"], int(r["workers"])): r for r in io_rows}
    for (decoder, workers), r in sorted(by_key.items()):
        rows.append([decoder, workers, f"{float(r['images_per_s']):.1f}", f"{float(r['mb_per_s']):.1f}",
                     f"{float(r['images_per_s_per_worker']):.1f}"])
    io_md = table(["decoder", "workers", "images/s", "MB/s read", "images/s per worker"], rows)
    rate = {key: float(r["images_per_s"]) for key, r in by_key.items()}
    ratios = [f"{workers} worker(s): {rate['tensor', workers] / rate['pil', workers]:.2f}x"
              for decoder, workers in sorted(rate) if decoder == "pil" and ("tensor", workers) in rate]
    if ratios:
        io_md += "\n\ntensor / PIL images/s: " + ", ".join(ratios) + "."
    return io_md


def recovery_table(recovery):
    check = recovery.get("stop_check_us")  # (not in files written before it was measured)
    return table(["model", "processes", "checkpoint (MB)", "seconds per save", "share of a training epoch",
                  "kill to first step after restart (s)", "steps redone", "stop check per step (µs)",
                  "share of a training step"],
                 [[recovery["arch"], recovery["processes"], recovery["checkpoint_mb"], recovery["seconds_per_save"],
                   f"{100 * recovery['save_share_of_epoch']:.2f} %",
                   f"{recovery['kill_to_first_step_s']:.1f}" if recovery.get("kill_to_first_step_s") else "",
                   recovery["steps_redone"], f"{check:.0f}" if check else "",
                   f"{100 * recovery['stop_check_share_of_step']:.2f} %" if check else ""]])


def method_label(row):
    return row["method"] + (" + error feedback" if row["error_feedback"] == "1" else "")


def plot_compression(rows, figures):
    labels = list(dict.fromkeys(method_label(r) for r in rows))
    processes = sorted({int(r["processes"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    width = 0.8 / len(processes)
    for column, (key, xlabel) in enumerate((("top1", "final validation top-1 (%)"),
                                            ("train_s", "training time (s)"))):
        ax = axes[column]
        for i, count in enumerate(processes):
            values = {method_label(r): float(r[key]) for r in rows if int(r["processes"]) == count}
            ys = [y + i * width for y, label in enumerate(labels) if label in values]
            ax.barh(ys, [values[label] for label in labels if label in values], height=width,
                    label=f"{count} process{'es' if count > 1 else ''}")
        ax.set(xlabel=xlabel)
        ax.grid(axis="x", alpha=0.3)
        if key == "top1":  # the differences are small: start the axis near the lowest accuracy
            low = min(float(r["top1"]) for r in rows)
            ax.set_xlim(left=max(0, low - 5), right=100)
    axes[0].set_yticks([y + width * (len(processes) - 1) / 2 for y in range(len(labels))], labels)
    axes[0].invert_yaxis()
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(processes))
    fig.suptitle(f"Gradient compression: {rows[0]['arch']} on the digits, {rows[0]['epochs']} epoch(s), "
                 f"global batch {rows[0]['global_batch']}")
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend below
    fig.savefig(figures / "compression.png", dpi=120)
    plt.close(fig)
    print(f"wrote {figures / 'compression.png'}")


def compression_table(rows):
    uncompressed = {r["processes"]: float(r["top1"]) for r in rows if r["method"] == "none"}
    body = []
    for r in rows:
        gap = (f"{float(r['top1']) - uncompressed[r['processes']]:+.2f}"
               if r["method"] != "none" and r["processes"] in uncompressed else "")
        body.append([method_label(r), r["processes"], f"{float(r['train_s']):.1f}", f"{float(r['top1']):.2f}", gap,
                     f"{float(r['bytes_per_step']):,.0f}" if r["bytes_per_step"] else "",
                     f"{float(r['compression_ratio']):.2f}" if r["compression_ratio"] else ""])
    return table(["method", "processes", "training time (s)", "val top-1 (%)", "top-1 vs none (points)",
                  "bytes per step", "compression ratio"], body)


COMPILE_MODES = {"eager": "eager (no --compile)", "cold": "--compile, empty Inductor cache",
                 "warm": "--compile, warm Inductor cache"}


def compile_table(rows):
    """Per mode: the first epoch, a steady epoch (median of the others), and what --compile adds or gains."""
    first, steady, rate = {}, {}, {}
    for mode in COMPILE_MODES:
        runs = [r for r in rows if r["mode"] == mode]
        first[mode] = float(runs[0]["epoch_s"])
        steady[mode] = statistics.median(float(r["epoch_s"]) for r in runs[1:])
        rate[mode] = statistics.median(float(r["images_per_s"]) for r in runs[1:])
    startup = {mode: (first[mode] - steady[mode]) - (first["eager"] - steady["eager"]) for mode in COMPILE_MODES}
    body = [[label, f"{first[mode]:.1f}", f"{steady[mode]:.1f}", f"{rate[mode]:.1f}",
             f"{rate[mode] / rate['eager']:.2f}x", f"{startup[mode]:+.1f}" if mode != "eager" else ""]
            for mode, label in COMPILE_MODES.items()]
    r = rows[0]
    return (table(["run", "first epoch (s)", "steady epoch (s)", "steady images/s", "vs eager",
                   "start-up cost (s)"], body) +
            f"\n\nnd recipe, {r['arch']}, one process of {r['threads']} thread(s), {len(rows) // 3} epochs per run. "
            f"Start-up cost: the first epoch's extra time over a steady epoch, minus eager's. --compile costs "
            f"{startup['cold']:.1f} s at start-up with an empty cache ({startup['warm']:.1f} s with a warm one) and "
            f"runs at {rate['cold'] / rate['eager']:.2f}x eager's images/s in steady state.")


def hardware_line(rows):
    r = rows[0]
    return (f"CPU {r['cpu']} ({r['cores']} cores), GPU {r['gpu'] or 'none: these results are CPU-only'}, "
            f"torch {r['torch']}.")


def rewrite(results, sections):
    text = results.read_text() if results.exists() else ""
    for name, body in sections.items():
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        block = f"<!-- BEGIN {name} -->\n{body}\n<!-- END {name} -->"
        if pattern.search(text):
            text = pattern.sub(lambda m: block, text)
        else:
            text += f"\n{block}\n"
    results.write_text(text)
    print(f"rewrote {len(sections)} table(s) in {results}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="figures/data")
    parser.add_argument("--figures", default="figures")
    parser.add_argument("--results", default="RESULTS.md")
    args = parser.parse_args()
    data, figures = Path(args.data), Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    sections, missing = {}, []

    curve_files = sorted((data / "curves").glob("*.csv"))
    if curve_files:
        order = {"nd": 0, "dp": 1, "ddp": 2, "apex": 3}
        curve_files.sort(key=lambda p: order.get(p.stem, 9))
        curves = {p.stem: read_csv(p) for p in curve_files}
        summaries = {p.stem: json.loads(p.with_suffix(".json").read_text()) for p in curve_files
                     if p.with_suffix(".json").exists()}
        plot_curves(curves, figures)
        sections["curves"] = curves_tables(curves, summaries)
    else:
        missing.append("curves/*.csv (scripts/learning_curves.py)")
    if (data / "scaling.csv").exists():
        scaling = read_csv(data / "scaling.csv")
        plot_scaling(scaling, figures)
        sections["scaling"], sections["overhead"] = scaling_tables(scaling)
        sections["hardware"] = hardware_line(scaling)
    else:
        missing.append("scaling.csv (scripts/bench_scaling.py)")
    if (data / "io.csv").exists():
        io_rows = read_csv(data / "io.csv")
        plot_io(io_rows, figures)
        sections["io"] = io_tables(io_rows)
        sections.setdefault("hardware", hardware_line(io_rows))
    else:
        missing.append("io.csv (scripts/bench_io.py)")
    if (data / "recovery.json").exists():
        sections["recovery"] = recovery_table(json.loads((data / "recovery.json").read_text()))
    else:
        missing.append("recovery.json (scripts/bench_recovery.py)")
    if (data / "compression.csv").exists():
        compression = read_csv(data / "compression.csv")
        plot_compression(compression, figures)
        sections["compression"] = compression_table(compression)
    else:
        missing.append("compression.csv (scripts/compression_table.py)")
    if (data / "compile.csv").exists():
        sections["compile"] = compile_table(read_csv(data / "compile.csv"))
    else:
        missing.append("compile.csv (scripts/bench_compile.py)")
    rewrite(Path(args.results), sections)
    for name in missing:
        print(f"warning: no {data / name.split(' ')[0]}: run {name.split(' ')[1][1:-1]} to measure it",
              file=sys.stderr)


if __name__ == "__main__":
    main()
