"""Draw every figure and rewrite every table of RESULTS.md from figures/data/ alone.

    python scripts/plot_results.py                 # figures/*.png and RESULTS.md
    python scripts/plot_results.py --data D --figures F --results R.md   # elsewhere (tests)

Reads only the measured files that the benchmark scripts write:
  curves/<recipe>-seed<S>.csv  per-epoch metrics copied from run directories (learning_curves.py)
  scaling.csv           images/s and epoch time per world size, and the bare loop (bench_scaling.py)
  io.csv                input-pipeline images/s and MB/s per decoder and worker count (bench_io.py)
  io_loader.json        uint8 batches on the trainer, first-batch waits (bench_io.py)
  examples.json         the nd recipe against pytorch/examples' imagenet/main.py (bench_examples.py)
  recovery.json         checkpoint cost and restart time (bench_recovery.py)
  compression.csv       time, accuracy and bytes per gradient-compression method and seed (compression_table.py)
  compile.csv           epoch times, eager against torch.compile (bench_compile.py)
  ps.csv                the parameter server against Byzantine workers, per run and seed (ps_table.py)
  byzfl.csv             ByzFL's own benchmark on the same digits, per rule, attack and seed (byzfl_reference.py)
  pipeline.csv, pipeline_curves.csv   pipelined replicas per sync method, stragglers and the bubble
                        (pipeline_table.py)
  sharding.csv          bytes per rank and images/s of each --shard mode against processes (bench_sharding.py)
  timings.csv           how long each part of make figures took (every script above)
  gpu/precision.csv, gpu/compression.csv   the GPU sweep (bench_gpu.py, make figures-gpu)
Accuracy over several seeds is reported as the mean and the min-max range; two
results differ by more than the seed-to-seed spread when their ranges do not
overlap. In RESULTS.md only the text between `<!-- BEGIN name -->` and
`<!-- END name -->` markers is rewritten; the prose around it is kept.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts import pipeline_table  # noqa: E402  (the expected-maximum model of stragglers)

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


def spread(values):
    """Mean and min-max range of one result over seeds."""
    return {"mean": statistics.mean(values), "low": min(values), "high": max(values), "n": len(values)}


def with_range(result, digits=2):
    """'98.53 (98.20-98.90)'; a single seed has no range."""
    if result["n"] == 1:
        return f"{result['mean']:.{digits}f}"
    return f"{result['mean']:.{digits}f} ({result['low']:.{digits}f}\u2013{result['high']:.{digits}f})"


def beyond_spread(a, b):
    """True when two results' ranges over seeds do not overlap: their difference exceeds the spread."""
    return a["n"] > 1 and b["n"] > 1 and (a["low"] > b["high"] or b["low"] > a["high"])


def by_recipe(curve_files):
    """{recipe: {seed: metrics rows}} from curves/<recipe>-seed<S>.csv (or one seed's curves/<recipe>.csv)."""
    order = {"nd": 0, "dp": 1, "ddp": 2, "apex": 3}
    curves = {}
    for path in sorted(curve_files):
        recipe, _, seed = path.stem.partition("-seed")
        curves.setdefault(recipe, {})[seed or "0"] = read_csv(path)
    return dict(sorted(curves.items(), key=lambda item: order.get(item[0], 9)))


def per_epoch(runs, split, metric):
    """[(epoch, spread over seeds)] of one recipe."""
    values = {}
    for rows in runs.values():
        for r in rows:
            if r["split"] == split:
                values.setdefault(int(r["epoch"]), []).append(float(r[metric]))
    return sorted((epoch, spread(v)) for epoch, v in values.items())


def plot_curves(curves, figures):
    for metric, split in CURVES:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, (recipe, runs) in enumerate(curves.items()):
            points = per_epoch(runs, split, metric)
            epochs = [e for e, _ in points]
            line, = ax.plot(epochs, [p["mean"] for _, p in points], marker="o", markersize=3,
                            linestyle=("-", "--", ":", "-.")[i % 4],  # curves that coincide stay visible
                            label=f"{recipe} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
            ax.fill_between(epochs, [p["low"] for _, p in points], [p["high"] for _, p in points],
                            color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set(xlabel="epoch", ylabel=f"{metric} accuracy (%)",
               title=f"{metric} accuracy, {split} set (mean; band: min-max over seeds)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, figures / f"{metric}_{split}.png")


def curves_tables(curves, summaries):
    """The final and best validation accuracy of each recipe over its seeds, and what differs beyond the
    spread."""
    rows, finals = [], {}
    for recipe, runs in curves.items():
        final = {metric: spread([float([r for r in rows_of if r["split"] == "val"][-1][metric])
                                 for rows_of in runs.values()]) for metric in ("top1", "top5")}
        best = spread([max(float(r["top1"]) for r in rows_of if r["split"] == "val") for rows_of in runs.values()])
        finals[recipe] = final["top1"]
        runs_summaries = [summaries[recipe, seed] for seed in runs if (recipe, seed) in summaries]
        rate = [s["images_per_s"] for s in runs_summaries if s.get("images_per_s")]
        wall = [s["wall_s"] for s in runs_summaries if s.get("wall_s")]
        epochs = len([r for r in next(iter(runs.values())) if r["split"] == "val"])
        rows.append([recipe, runs_summaries[0]["world_size"] if runs_summaries else "", len(runs), epochs,
                     with_range(final["top1"]), with_range(final["top5"]), with_range(best),
                     f"{statistics.mean(rate):.1f}" if rate else "", f"{statistics.mean(wall):.0f}" if wall else ""])
    text = table(["recipe", "processes", "seeds", "epochs", "final val top-1 (%)", "final val top-5 (%)",
                  "best val top-1 (%)", "train images/s", "wall time (s)"], rows)
    first = next(iter(summaries.values()), {})
    text += (f"\n\n{first.get('arch', '?')}, global batch {first.get('global_batch', '?')}; top-1 and top-5: mean "
             f"over the seeds, and in brackets the lowest and highest (the min-max range).")
    spreads = [f"{recipe} {result['high'] - result['low']:.2f}" for recipe, result in finals.items()
               if result["n"] > 1]
    if spreads:
        text += " Seed-to-seed spread of the final top-1 (points): " + ", ".join(spreads) + "."
    names = list(finals)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    beyond = [f"{a} and {b} ({finals[a]['mean'] - finals[b]['mean']:+.2f})" for a, b in pairs
              if beyond_spread(finals[a], finals[b])]
    within = [f"{a} and {b} ({finals[a]['mean'] - finals[b]['mean']:+.2f})" for a, b in pairs
              if not beyond_spread(finals[a], finals[b])]
    if beyond:
        text += " Differences beyond the spread (ranges that do not overlap): " + "; ".join(beyond) + "."
    if within and all(finals[name]["n"] > 1 for name in names):
        text += (" Within the spread (ranges that overlap), so not told apart from noise: " + "; ".join(within)
                 + ".")
    return text


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
    save(fig, figures / "IO.png")


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


def examples_table(result):
    """The nd recipe against pytorch/examples' imagenet/main.py (bench_examples.py)."""
    rows = [[name, f"{result[key]['wall_s']:.2f}", f"{result[key]['cpu_s']:.2f}", result[key]["left_running"]]
            for name, key in (("recipes/nd/train.py", "recipe"), ("pytorch/examples imagenet/main.py", "examples"))]
    return (table(["command", "wall (s)", "CPU (s)", "processes left when it ended"], rows) +
            f"\n\nrecipe / examples: wall {result['wall_ratio']:.3f}x, CPU {result['cpu_ratio']:.3f}x; the medians "
            f"of {result['repeats']} runs of each, taken in turn: `{result['flags']}`, one epoch of "
            f"{result['images']} JPEGs on {result['cpu']} ({result['cores']} cores), torch {result['torch']}.")


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


def recovery_recipes_table(rows):
    """Each recipe killed and restarted under torchrun (bench_recovery.py, recovery_recipes.csv)."""
    def compared(row):
        if row["top1"] == "":
            return "did not finish"
        if row["deterministic"] == "True":
            return f"{'equal to' if row['as_uninterrupted'] == 'True' else 'differs from'} seed 0's {row['reference_top1']}"
        where = ("within" if row["as_uninterrupted"] == "True" else
                 "above" if float(row["top1"]) > float(row["reference_max"]) else "below")
        return f"{where} seeds 0-2's {row['reference_min']}-{row['reference_max']}"
    body = table(["recipe", "processes", "rank killed", "kill to first step after restart (s)",
                  "steps redone (of an epoch)", "final top-1", "against uninterrupted runs"],
                 [[row["row"], row["processes"], row["killed_rank"], row["kill_to_first_step_s"],
                   f"{row['steps_redone']} (of {row['steps_per_epoch']})" if row["steps_redone"] else "",
                   row["top1"], compared(row)] for row in rows])
    first = rows[0]
    unfinished = [row["row"] for row in rows if row["finished"] != "True"]
    return body + (f"\n\n{len(rows) - len(unfinished)} of {len(rows)} killed runs finished after their restart"
                   f"{': not ' + ', '.join(unfinished) if unfinished else ''}; on {first['cpu']} ({first['cores']} "
                   f"cores), torch {first['torch']}.")


def method_label(row):
    return row["method"] + (" + error feedback" if row["error_feedback"] == "1" else "")


def compression_groups(rows):
    """{(label, processes): that row's runs, one per seed}, in the order the script ran them."""
    groups = {}
    for r in rows:
        groups.setdefault((method_label(r), int(r["processes"])), []).append(r)
    return groups


def plot_compression(rows, figures):
    groups = compression_groups(rows)
    labels = list(dict.fromkeys(label for label, _ in groups))
    processes = sorted({count for _, count in groups})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    width = 0.8 / len(processes)
    for column, (key, xlabel) in enumerate((("top1", "final validation top-1 (%): mean, min-max"),
                                            ("train_s", "training time (s): mean, min-max"))):
        ax = axes[column]
        for i, count in enumerate(processes):
            present = [(y, spread([float(r[key]) for r in groups[label, count]]))
                       for y, label in enumerate(labels) if (label, count) in groups]
            ax.barh([y + i * width for y, _ in present], [v["mean"] for _, v in present], height=width,
                    xerr=[[v["mean"] - v["low"] for _, v in present], [v["high"] - v["mean"] for _, v in present]],
                    capsize=2, label=f"{count} process{'es' if count > 1 else ''}")
        ax.set(xlabel=xlabel)
        ax.grid(axis="x", alpha=0.3)
        if key == "top1":  # the differences are small: start the axis near the lowest accuracy
            low = min(float(r["top1"]) for r in rows)
            ax.set_xlim(left=max(0, low - 5), right=100)
    axes[0].set_yticks([y + width * (len(processes) - 1) / 2 for y in range(len(labels))], labels)
    axes[0].invert_yaxis()
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(processes))
    seeds = len({r.get("seed", "0") for r in rows})
    fig.suptitle(f"Gradient compression: {rows[0]['arch']} on the digits, {rows[0]['epochs']} epoch(s), "
                 f"global batch {rows[0]['global_batch']}, {seeds} seed(s)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend below
    fig.savefig(figures / "compression.png", dpi=120)
    plt.close(fig)
    print(f"wrote {figures / 'compression.png'}")


def compression_table(rows):
    groups = compression_groups(rows)
    top1 = {key: spread([float(r["top1"]) for r in runs]) for key, runs in groups.items()}
    body, beyond, within = [], [], []
    for (label, count), runs in groups.items():
        r, none = runs[0], top1.get(("none", count))
        gap = exceeds = ""
        if label not in ("none", "serial") and none:
            difference = top1[label, count]["mean"] - none["mean"]
            gap, exceeds = f"{difference:+.2f}", "yes" if beyond_spread(top1[label, count], none) else "no"
            (beyond if exceeds == "yes" else within).append(f"{label} at {count} ({difference:+.2f})")
        body.append([label, count, len(runs), f"{statistics.mean(float(x['train_s']) for x in runs):.1f}",
                     with_range(top1[label, count]), gap, exceeds,
                     f"{float(r['bytes_per_step']):,.0f}" if r["bytes_per_step"] else "",
                     f"{float(r['compression_ratio']):.2f}" if r["compression_ratio"] else ""])
    text = table(["method", "processes", "seeds", "training time (s)", "val top-1 (%)", "top-1 vs none (points)",
                  "beyond the spread", "bytes per step", "compression ratio"], body)
    r = rows[0]
    text += (f"\n\n{r['arch']}, {r['epochs']} epochs, global batch {r['global_batch']}. Top-1: the mean over the "
             f"seeds, and in brackets the lowest and highest (the min-max range); training time: the mean. "
             f"\"Beyond the spread\": the method's range of top-1 does not overlap uncompressed DDP's at the same "
             f"number of processes.")
    spreads = [f"{none['high'] - none['low']:.2f} points at {count} processes"
               for (label, count), none in top1.items() if label == "none" and none["n"] > 1]
    if spreads:
        text += " Uncompressed DDP's top-1 spreads over " + " and ".join(spreads) + " from seed to seed."
    if any(v["n"] > 1 for v in top1.values()):
        text += (" Beyond the spread: " + ("; ".join(beyond) if beyond else "none") + ". Within it (not told "
                 "apart from noise): " + ("; ".join(within) if within else "none") + ".")
    return text


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


TIMED_PARTS = ["io", "scaling", "curves", "recovery", "compile", "compression", "ps", "pipeline", "sharding"]  # make figures' order


def timings_table(rows):
    """How long each part of make figures takes, and all of them."""
    by_part = {r["part"]: r for r in rows}
    body = [[f"`make figures ONLY={part}`", f"{float(by_part[part]['seconds']) / 60:.1f}",
             by_part[part]["runs_trained"], by_part[part]["runs_reused"], by_part[part]["date"]]
            for part in TIMED_PARTS if part in by_part]
    total = sum(float(by_part[part]["seconds"]) for part in TIMED_PARTS if part in by_part)
    missing = [part for part in TIMED_PARTS if part not in by_part]
    body.append(["`make figures` (the parts summed)" + (f", without {', '.join(missing)}" if missing else ""),
                 f"{total / 60:.1f}", "", "", ""])
    r = rows[0]
    return (table(["command", "minutes", "runs trained", "runs kept from an earlier start", "measured on"], body) +
            f"\n\nOn CPU {r['cpu']} ({r['cores']} cores). A part resumed after a stop counts its kept runs at the "
            f"time they took when they were trained.")


def ps_attacks(rows, parts=("sync", "async")):
    """The attacks of those parts of ps.csv, in the order the script ran them."""
    return list(dict.fromkeys(r["attack"] for r in rows if r["part"] in parts))


def ps_groups(rows, part):
    """{(aggregate, attack): that row's runs, one per seed} of one part of ps.csv, in the order the script ran them."""
    groups = {}
    for r in rows:
        if r["part"] == part:
            groups.setdefault((r["aggregate"], r["attack"]), []).append(r)
    return groups


def finished(runs):
    """The runs that did not diverge (ps.csv: diverged = 1, no top-1)."""
    return [r for r in runs if r.get("diverged", "0") != "1"]


def ps_top1(runs):
    """'91.0 (90.0-92.0)' over the seeds that finished, and how many diverged."""
    done = finished(runs)
    text = with_range(spread([float(r["top1"]) for r in done]), 1) if done else "diverged"
    return text + (f" ({len(runs) - len(done)} of {len(runs)} diverged)" if done and len(done) < len(runs) else "")


def rejected(runs, who):
    """'25 (20-30)': the share (%) of `who`'s (honest or byzantine) pushed updates that the rule dropped, its mean
    over the seeds' runs and its range."""
    rates = [100 * float(r[f"{who}_rejected"]) / int(r[f"{who}_pushed"]) for r in finished(runs)
             if int(r[f"{who}_pushed"])]
    return with_range(spread(rates), 0) if rates else ""


def mean_of_its_kind(aggregate):
    """The plain mean a rule is compared with: the one with the same local steps."""
    return "mean, 1 step" if aggregate.endswith("1 step") else "mean"


def ps_matrix(groups):
    """The top-1 table of one mode: a row per aggregation, a column per attack; and the sentence comparing each
    rule with the mean (of the same local steps) under the same attack (beyond the spread only)."""
    aggregates = list(dict.fromkeys(aggregate for aggregate, _ in groups))
    attacks = list(dict.fromkeys(attack for _, attack in groups))
    top1 = {key: spread([float(r["top1"]) for r in finished(runs)]) for key, runs in groups.items() if finished(runs)}
    body = [[f"`{aggregate}`", *(ps_top1(groups[aggregate, attack]) if (aggregate, attack) in groups else ""
                                 for attack in attacks)] for aggregate in aggregates]
    header = ["aggregation", *attacks]
    better, worse = [], []
    for (aggregate, attack), result in top1.items():
        mean = top1.get((mean_of_its_kind(aggregate), attack))
        if not aggregate.startswith("mean") and (mean_of_its_kind(aggregate), attack) in groups and not mean:
            better.append(f"{aggregate} under {attack} (the mean diverged)")
        if not aggregate.startswith("mean") and mean and beyond_spread(result, mean):
            (better if result["mean"] > mean["mean"] else worse).append(
                f"{aggregate} under {attack} ({result['mean'] - mean['mean']:+.1f})")
    return table(header, body), better, worse


def ps_tables(rows):
    """RESULTS.md's parameter-server sections: sync and async top-1, the Zeno rules' rejections, the eta sweep
    beside the validation-data-only baseline, and ps against ddp in images/s."""
    sections, r = {}, rows[0]
    seeds = len({x["seed"] for x in rows})
    for mode in ("sync", "async"):
        text, better, worse = ps_matrix(ps_groups(rows, mode))
        text += (f"\n\nFinal val top-1 (%) after {r['epochs']} epochs: the mean over {seeds} seed(s), in brackets the "
                 f"lowest and highest. A run that diverged (a non-finite loss) has no top-1: it is counted beside "
                 f"the others.")
        if seeds > 1:
            text += (" Beyond the spread of `mean` (of the same local steps) under the same attack, better: " +
                     ("; ".join(better) or "none") +
                     ". Worse: " + ("; ".join(worse) or "none") + ".")
        sections[f"ps-{mode}"] = text
    validated = [(mode, aggregate) for mode in ("sync", "async") for aggregate in
                 dict.fromkeys(key[0] for key in ps_groups(rows, mode)) if aggregate.startswith("zeno")]
    body = []
    for mode, aggregate in validated:
        groups = ps_groups(rows, mode)
        attacks = ps_attacks(rows, (mode,))
        body.append([mode, f"`{aggregate}`", *(
            (rejected(groups[aggregate, a], "honest") +
             ("" if a == "none" else f" / {rejected(groups[aggregate, a], 'byzantine')}"))
            if (aggregate, a) in groups else "" for a in attacks)])
    sync_attacks, async_attacks = ps_attacks(rows, ("sync",)), ps_attacks(rows, ("async",))
    columns = max(len(sync_attacks), len(async_attacks))
    header = ["mode", "rule", *(" / ".join(dict.fromkeys(names[i] for names in (sync_attacks, async_attacks)
                                                          if i < len(names))) for i in range(columns))]
    sections["ps-rejections"] = (
        table(header, [line + [""] * (len(header) - len(line)) for line in body]) +
        "\n\nRejected updates (%): honest / Byzantine, of the updates each kind of worker pushed (zenops judges "
        "tensor by tensor: a push counts as the share of its tensors rejected); the mean over the seeds and in "
        "brackets the lowest and highest. `zeno` drops the b = 2 lowest-scoring of every 8, whatever they are, so "
        "it rejects 25 % in all.")
    eta = ps_groups(rows, "eta")
    etas = sorted({x["zeno_eta"] for x in rows if x["part"] == "eta" and x["zeno_eta"] != ""}, key=float,
                  reverse=True)
    by_eta = {e: [x for x in rows if x["part"] == "eta" and x["zeno_eta"] == e] for e in etas}
    top1 = {e: spread([float(x["top1"]) for x in finished(runs)]) for e, runs in by_eta.items() if finished(runs)}
    body = [[e, ps_top1(runs), rejected(runs, "honest"), rejected(runs, "byzantine")] for e, runs in by_eta.items()]
    baseline_runs = eta.get(("validation data only", "none"), [])
    baseline = spread([float(x["top1"]) for x in finished(baseline_runs)] or [float("nan")])
    body.append(["validation data only (nd)", ps_top1(baseline_runs) if baseline_runs else "", "", ""])
    best = max(top1, key=lambda e: top1[e]["mean"]) if top1 else None
    text = table(["--zeno-eta", "val top-1 (%)", "honest rejected (%)", "Byzantine rejected (%)"], body)
    if best is not None:
        tied = [e for e in top1 if e != best and not beyond_spread(top1[e], top1[best])]
        text += (f"\n\nsync `zenops`, 8 local steps a push, each push N(0, 1) with probability 0.2. "
                 f"The best eta: {best} "
                 f"({with_range(top1[best], 1)} %); within its spread (not told apart from it): "
                 f"{', '.join(tied) or 'none'}. Training on the validators' data alone: {with_range(baseline, 1)} %.")
    sections["ps-eta"] = text
    speed = [(f"ps {mode}, `{aggregate}`", finished(ps_groups(rows, mode).get((aggregate, "none"), [])))
             for mode in ("sync", "async") for aggregate in ("mean", "mean, 1 step")
             if (aggregate, "none") in ps_groups(rows, mode)]
    speed.append(("ddp", finished([x for x in rows if x["part"] == "speed"])))
    ddp = {x["seed"]: float(x["images_per_s"]) for x in speed[-1][1]}
    body = []
    for name, runs in speed:
        ratios = [float(x["images_per_s"]) / ddp[x["seed"]] for x in runs if x["seed"] in ddp]
        body.append([name, len(runs), with_range(spread([float(x["images_per_s"]) for x in runs]), 0),
                     with_range(spread(ratios), 2) if ratios else ""])
    sections["ps-speed"] = (table(["run", "seeds", "train images/s", "vs ddp, seed by seed"], body) +
                            f"\n\n8 workers (ddp: 8 processes), global batch 64, one thread per process, on "
                            f"{r['cores']} cores; each run's images/s, the mean over the seeds and in brackets the "
                            f"lowest and highest. ps: the runs without an attack of the tables above; ddp: its own "
                            f"runs, each trained minutes after the ps runs of its seed, so the ratio (of the same "
                            f"seed's runs) carries this shared machine's noise: read its range, not only its mean.")
    return sections


def top1_or_chance(run):
    """A run's top-1, or chance (10 %) where it diverged: for judging, not for the tables' means."""
    return float(run["top1"]) if run.get("diverged", "0") != "1" else 10.0


def ps_targets(rows):
    """The parameter-server table's targets, each with what was measured and whether it holds. A run that diverged
    counts as chance, 10 %."""
    def top1(part, aggregate, attack):
        runs = ps_groups(rows, part).get((aggregate, attack), [])
        return statistics.mean(top1_or_chance(r) for r in runs) if runs else None

    def honest(part, aggregate):
        runs = finished(ps_groups(rows, part).get((aggregate, "none"), []))
        return 100 * sum(float(r["honest_rejected"]) for r in runs) / max(1, sum(int(r["honest_pushed"]) for r in runs))
    flip, flip_4 = "signflip x4, 2 of 8", "signflip x10, p 0.4"
    body = []

    def check(target, value, holds):
        body.append([target, "not measured" if value is None else value, "" if value is None else
                     ("yes" if holds else "no")])
    mean = top1("sync", "mean", flip)
    check(f"sync, {flip}: `mean` at most 50 %", mean is not None and f"{mean:.1f}", mean is not None and mean <= 50)
    for rule in ("zenops", "zeno, 1 step"):
        attacked, clean = top1("sync", rule, flip), top1("sync", rule, "none")
        check(f"sync, {flip}: `{rule}` at least 95 % and within 2 points of its own no-attack top-1",
              attacked is not None and clean is not None and f"{attacked:.1f} against {clean:.1f}",
              attacked is not None and clean is not None and attacked >= 95 and clean - attacked <= 2)
    for part, rule in (("sync", "zenops"), ("async", "zenops"), ("async", "zeno++, 1 step")):
        rate = honest(part, rule) if (rule, "none") in ps_groups(rows, part) else None
        check(f"{part}, no attack: `{rule}` rejects at most 10 % of the honest updates",
              rate is not None and f"{rate:.0f} %", rate is not None and rate <= 10)
    zpp, mean = top1("async", "zeno++, 1 step", "none"), top1("async", "mean, 1 step", "none")
    check("async, no attack: `zeno++` within 2 points of `mean`", zpp is not None and mean is not None and
          f"{zpp:.1f} against {mean:.1f}", zpp is not None and mean is not None and mean - zpp <= 2)
    mean, zpp = top1("async", "mean, 1 step", flip_4), top1("async", "zeno++, 1 step", flip_4)
    check(f"async, {flip_4}: `mean` at most 50 %", mean is not None and f"{mean:.1f}", mean is not None and mean <= 50)
    check(f"async, {flip_4}: `zeno++` at least 90 %", zpp is not None and f"{zpp:.1f}", zpp is not None and zpp >= 90)
    by_eta = {}
    for x in finished([r for r in rows if r["part"] == "eta" and r["zeno_eta"] != ""]):
        by_eta.setdefault(x["zeno_eta"], []).append(float(x["top1"]))
    base = [float(x["top1"]) for x in finished(ps_groups(rows, "eta").get(("validation data only", "none"), []))]
    if by_eta and base:
        best = max(by_eta, key=lambda e: statistics.mean(by_eta[e]))
        a, b = spread(by_eta[best]), spread(base)
        check("the eta sweep's best eta beats training on the validators' data alone by more than the spread",
              f"{with_range(a, 1)} against {with_range(b, 1)} (eta {best})", a["mean"] > b["mean"] and
              beyond_spread(a, b))
    else:
        check("the eta sweep's best eta beats training on the validators' data alone by more than the spread", None,
              False)
    return (table(["target", "measured (mean over the seeds)", "holds"], body) +
            "\n\nThe targets this table was set against; a run that diverged counts as chance (10 %).")


BYZFL_NEAREST = {"none": "none", "signflip": "signflip x4, 2 of 8", "gaussian": "N(0,1), p 0.2"}  # ours nearest


def ps_byzfl_table(byzfl, rows):
    """ByzFL's benchmark beside the sync table's rows nearest each of its attacks, and where the two disagree in
    direction (a rule beyond the spread of mean in one, not in the other)."""
    def runs_of(table_rows, rule, attack, key="attack"):
        return [r for r in table_rows if r["aggregate"] == rule and r[key] == attack]

    def verdict(runs, mean_runs):  # +1 beats mean beyond the spread, -1 falls below it, 0 cannot be told apart
        if not runs or not mean_runs:
            return 0
        a, b = (spread([top1_or_chance(r) for r in x]) for x in (runs, mean_runs))
        return 0 if not beyond_spread(a, b) else (1 if a["mean"] > b["mean"] else -1)
    ours_rows = [r for r in rows if r["part"] == "sync"]
    attacks = list(dict.fromkeys(r["ps_attack"] for r in byzfl))
    rules = list(dict.fromkeys(r["aggregate"] for r in byzfl))
    body, disagree = [], []
    for rule in rules:
        line = [f"`{rule}`"]
        for attack in attacks:
            theirs, ours = runs_of(byzfl, rule, attack, "ps_attack"), runs_of(ours_rows, rule, BYZFL_NEAREST[attack])
            line += [ps_top1(theirs), ps_top1(ours) if ours else ""]
            if rule != "mean" and ours and attack != "none":
                v_theirs = verdict(theirs, runs_of(byzfl, "mean", attack, "ps_attack"))
                v_ours = verdict(ours, runs_of(ours_rows, "mean", BYZFL_NEAREST[attack]))
                if v_theirs != v_ours:
                    disagree.append(f"{rule} under {attack} (ByzFL {v_theirs:+d}, ours {v_ours:+d})")
        body.append(line)
    header = ["rule", *(f"{who}: {attack if who == 'ByzFL' else BYZFL_NEAREST[attack]}" for attack in attacks
                         for who in ("ByzFL", "ours"))]
    r = next((x for x in byzfl if x["ps_attack"] != "none"), byzfl[0])
    return (table(header, body) +
            f"\n\nFinal test top-1 (%): the mean over {len({x['seed'] for x in byzfl})} seed(s) of ByzFL's "
            f"benchmark ({r['byzfl']}: cnn_mnist, {r['steps']} steps of {r['batch']} images a client, lr {r['lr']}, "
            f"client momentum {r['momentum']}, {r['honest']} honest and {r['byzantine']} Byzantine clients when "
            f"attacked, every rule set for f = {r['tolerated_f']}), beside ours (sync, 8 local steps a push, the "
            f"nearest attack). Where the two disagree on a rule against the mean under the same attack "
            f"(+1 better beyond the spread, -1 worse, 0 not told apart; a run that diverged counts as chance, 10 %): " +
            ("; ".join(disagree) or "nowhere") + ".")


def plot_ps(rows, figures):
    """Top-1 per aggregation and attack, sync and async, as two annotated grids; and the eta sweep."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [8, 3.5]})
    for ax, mode in zip(axes, ("sync", "async")):
        groups = ps_groups(rows, mode)
        aggregates = list(dict.fromkeys(aggregate for aggregate, _ in groups))
        attacks = list(dict.fromkeys(attack for _, attack in groups))
        if not groups:  # (a table stopped before this mode)
            ax.axis("off")
            continue
        grid = [[statistics.mean(float(x["top1"]) for x in finished(groups[g, a]))
                 if (g, a) in groups and finished(groups[g, a]) else (-1.0 if (g, a) in groups else float("nan"))
                 for g in aggregates] for a in attacks]  # -1: every seed diverged
        ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        for i, line in enumerate(grid):
            for j, value in enumerate(line):
                if value == value:  # not NaN: a rule and attack that were trained
                    ax.text(j, i, f"{value:.0f}" if value >= 0 else "div.", ha="center", va="center",
                            color="white" if value < 60 else "black")
        ax.set_xticks(range(len(aggregates)), aggregates, rotation=45, ha="right")
        ax.set_yticks(range(len(attacks)), attacks)
        ax.set_title(f"{mode}: val top-1 (%)")
    fig.suptitle(f"Parameter server, 8 workers, lenet on the digits, "
                 f"{rows[0]['epochs']} epochs; mean of {len({x['seed'] for x in rows})} seed(s)")
    save(fig, figures / "ps.png")
    by_eta = {}
    for x in finished(rows):
        if x["part"] == "eta" and x["zeno_eta"] != "":
            by_eta.setdefault(float(x["zeno_eta"]), []).append(x)
    if not by_eta:
        return
    etas = sorted(by_eta)
    fig, ax = plt.subplots(figsize=(7, 4))
    top1 = [spread([float(x["top1"]) for x in by_eta[e]]) for e in etas]
    ax.errorbar(etas, [v["mean"] for v in top1], yerr=[[v["mean"] - v["low"] for v in top1],
                                                      [v["high"] - v["mean"] for v in top1]],
                marker="o", capsize=3, label="sync zenops, N(0, 1) with probability 0.2")
    baseline = [float(x["top1"]) for x in finished(rows) if x["aggregate"] == "validation data only"]
    if baseline:
        ax.axhspan(min(baseline), max(baseline), color="gray", alpha=0.2)
        ax.axhline(statistics.mean(baseline), color="gray", linestyle="--", label="validation data only (nd)")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set(xlabel="--zeno-eta", ylabel="final val top-1 (%)", title="ZenoPS's eta sweep: mean, min-max over seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, figures / "ps_eta.png")


PRECISION_LABELS = {"fp32": "fp32", "fp16": "O1 fp16", "bf16": "O1 bf16"}


def gpu_config(row):
    """'apex O1 fp16, channels_last' and the like (', --decoder gpu' when nvjpeg decoded the JPEGs)."""
    decoder = ", --decoder gpu" if row.get("decoder") == "gpu" else ""
    if row["recipe"] != "apex":
        return f"{row['recipe']} fp32{decoder}"
    precision = "O0 fp32" if row["precision"] == "fp32" else PRECISION_LABELS[row["precision"]]
    return f"apex {precision}" + (", channels_last" if row["channels_last"] == "1" else "") + decoder


def gpu_precision_table(rows):
    rate = {(gpu_config(r), r["data"], int(r["gpus"])): r for r in rows}
    configs = list(dict.fromkeys(gpu_config(r) for r in rows))
    counts = sorted({int(r["gpus"]) for r in rows})
    body = []
    for config in configs:
        for gpus in counts:
            synthetic, jpeg = rate.get((config, "synthetic", gpus)), rate.get((config, "jpeg", gpus))
            if not synthetic and not jpeg:
                continue
            baseline = rate.get(("ddp fp32", "synthetic", gpus))
            first = rate.get((config, "synthetic", counts[0]))
            row = [config, gpus, (synthetic or jpeg)["batch_size"]]
            if synthetic:
                images = float(synthetic["images_per_s"])
                row += [f"{images:.0f}", f"{images / float(baseline['images_per_s']):.2f}x" if baseline else "",
                        f"{100 * images / (float(first['images_per_s']) * gpus / counts[0]):.0f} %" if first else "",
                        f"{100 * float(synthetic['data_wait_share']):.0f} %"]
            else:
                row += ["", "", "", ""]
            row += ([f"{float(jpeg['images_per_s']):.0f}", f"{float(jpeg['whole_epoch_images_per_s']):.0f}",
                     f"{100 * float(jpeg['data_wait_share']):.0f} %"] if jpeg else ["", "", ""])
            body.append(row)
    r = rows[0]
    return (table(["recipe and precision", "GPUs", "batch per GPU", "synthetic images/s", "vs ddp fp32",
                   f"scaling efficiency (vs {counts[0]} GPU)", "synthetic: waiting for data", "JPEG images/s",
                   "JPEG images/s, whole epochs", "JPEG: waiting for data"], body) +
            f"\n\n{r['arch']} at {r['image_size']} px. Images/s: all GPUs together, every step after the first of "
            f"an epoch, the median over the epochs after the first; \"whole epochs\" also counts each epoch's loader "
            f"start-up and first batch.")


def gpu_compression_table(rows):
    rate = {(method_label(r), int(r["gpus"])): float(r["images_per_s"]) for r in rows}
    body = [[method_label(r), r["gpus"], r["batch_size"], f"{float(r['images_per_s']):.0f}",
             f"{float(r['images_per_s']) / rate[('none', int(r['gpus']))]:.2f}x" if ("none", int(r["gpus"])) in rate
             else "", f"{float(r['bytes_per_step']):,.0f}",
             f"{float(r['compression_ratio']):.2f}" if float(r["compression_ratio"]) else ""] for r in rows]
    return table(["method", "GPUs", "batch per GPU", "synthetic images/s", "vs none", "bytes per step",
                  "compression ratio"], body)


def plot_gpu(rows, figures):
    """Images/s per recipe and precision on the fewest GPUs measured, synthetic and JPEG; and against the
    number of GPUs when more than one number was measured."""
    counts = sorted({int(r["gpus"]) for r in rows})
    configs = list(dict.fromkeys(gpu_config(r) for r in rows))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(configs) + 1.5))
    for i, data in enumerate(("synthetic", "jpeg")):
        rate = {gpu_config(r): float(r["images_per_s"]) for r in rows
                if r["data"] == data and int(r["gpus"]) == counts[0]}
        ys = [y + 0.4 * i for y, config in enumerate(configs) if config in rate]
        if ys:
            ax.barh(ys, [rate[c] for c in configs if c in rate], height=0.4, label=f"{data} data")
    ax.set_yticks([y + 0.2 for y in range(len(configs))], configs)
    ax.invert_yaxis()
    ax.set(xlabel="training images/s", title=f"{rows[0]['arch']} at {rows[0]['image_size']} px on {counts[0]} "
           f"x {rows[0]['gpu'].split(' x ', 1)[-1]}")
    ax.grid(axis="x", alpha=0.3)
    ax.legend()
    save(fig, figures / "gpu_throughput.png")
    if len(counts) < 2:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for config in configs:
        points = sorted((int(r["gpus"]), float(r["images_per_s"])) for r in rows
                        if gpu_config(r) == config and r["data"] == "synthetic")
        if len(points) > 1:
            ax.plot(*zip(*points), marker="o", label=config)
    ax.set(xlabel="GPUs", ylabel="training images/s (synthetic)", title="Scaling on GPUs")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, figures / "gpu_scaling.png")


def pipeline_groups(rows):
    """{(stages, replicas, sync, hetero): runs, one per seed} of pipeline.csv's sync part, in the order run."""
    groups = {}
    for r in rows:
        if r["part"] == "sync":
            groups.setdefault((int(r["stages"]), int(r["replicas"]), r["sync"], float(r["hetero"])), []).append(r)
    return groups


def ratios(groups, key, base, field="updates_per_s"):
    """field of the runs of `key` over those of `base`, seed by seed (a spread), or None."""
    plain = {r["seed"]: float(r[field]) for r in groups.get(base, [])}
    values = [float(r[field]) / plain[r["seed"]] for r in groups.get(key, []) if r["seed"] in plain]
    return spread(values) if values else None


def mean_of(runs, field):
    return statistics.mean(float(r[field]) for r in runs)


def pipeline_model_rows(groups):
    """Per layout and sync method with stragglers: the step measured without them (c), the model's slowdown and
    the measured one, and whether they agree within 15 %."""
    body = []
    for (stages, replicas, sync, hetero), runs in groups.items():
        base = (stages, replicas, sync, 0.0)
        measured = ratios(groups, (stages, replicas, sync, hetero), base) if hetero else None
        if measured is None:
            continue
        c = mean_of(groups[base], "step_s")
        microbatches = int(runs[0]["microbatches"])
        predicted = c / (c + pipeline_table.expected_delay(sync, replicas, stages, microbatches, x=hetero))
        body.append((stages, replicas, sync, c, predicted, measured))
    return body


def pipeline_targets(groups, body):
    """The issue's targets, each with its numbers and whether it holds."""
    rows = []
    straggled = {sync: key for key in groups for sync in ("preduce", "allreduce")
                 if key[0] == 1 and key[1] == 8 and key[3] and key[2] == sync}
    if len(straggled) == 2:
        speed = ratios(groups, straggled["preduce"], straggled["allreduce"])
        rows.append(["R = 8, stragglers: `preduce` at least 2x `allreduce`'s updates/s", with_range(speed),
                     "yes" if speed["mean"] >= 2 else "NO"])
        reach = {sync: [float(r["seconds_to_target"]) for r in groups[key] if r["seconds_to_target"] != ""]
                 for sync, key in straggled.items()}
        holds = reach["preduce"] and len(reach["preduce"]) == len(groups[straggled["preduce"]]) and (
            not reach["allreduce"] or statistics.mean(reach["preduce"]) <= statistics.mean(reach["allreduce"]))
        rows.append(["R = 8, stragglers: `preduce` no slower to the target top-1",
                     " vs ".join(f"{statistics.mean(reach[s]):.1f} s" if reach[s] else "not reached"
                                 for s in ("preduce", "allreduce")), "yes" if holds else "NO"])
    for stages, replicas, sync, c, predicted, measured in body:
        if stages == 1:
            off = measured["mean"] / predicted - 1
            rows.append([f"R = {replicas}: `{sync}`'s slowdown within 15 % of the model",
                         f"{measured['mean']:.2f} vs {predicted:.2f} ({off:+.0%})", "yes" if abs(off) <= 0.15 else "NO"])
    for (stages, replicas, sync, hetero), runs in groups.items():
        base = (stages, replicas, "allreduce", 0.0)
        if sync == "preduce" and not hetero and base in groups:
            ratio = ratios(groups, (stages, replicas, sync, hetero), base)
            rows.append([f"{replicas} x {stages}, no stragglers: `preduce` within 10 % of `allreduce`",
                         with_range(ratio), "yes" if abs(ratio["mean"] - 1) <= 0.10 else "NO"])
    return table(["target", "measured", "holds"], rows)


def pipeline_tables(rows):
    """RESULTS.md's pipeline sections: the methods against R with and without stragglers, the model, the targets;
    the bubble against M."""
    groups = pipeline_groups(rows)
    sections = {}
    if groups:
        first = next(iter(groups.values()))[0]
        target, body = float(first["target"]), []
        for (stages, replicas, sync, hetero), runs in groups.items():
            reached = [float(r["seconds_to_target"]) for r in runs if r["seconds_to_target"] != ""]
            some = f" ({len(reached)} of {len(runs)})" if len(reached) < len(runs) else ""
            body.append([f"{replicas} x {stages}", f"`{sync}`", f"{hetero:g} s" if hetero else "none", len(runs),
                         with_range(spread([float(r["updates_per_s"]) for r in runs]), 0),
                         with_range(spread(reached), 1) + some if reached else "not reached",
                         with_range(spread([float(r["top1"]) for r in runs])),
                         f"{mean_of(runs, 'mean_group_size'):.2f}" if sync == "preduce" else "",
                         f"{mean_of(runs, 'waits'):.1f}", f"{mean_of(runs, 'disagreement'):.4f}"])
        sections["pipeline-sync"] = (
            table(["replicas x stages", "sync", "stragglers", "seeds", "updates/s", f"seconds to {target:g} % top-1",
                   "final top-1", "group size", "waits", "disagreement"], body) +
            f"\n\nlenet on the digits, -b {first['batch']} per replica, {first['epochs']} epoch(s), one thread per "
            f"process on {first['cores']} cores (`hetpipe`: and one server per stage). Each value is the mean over "
            f"the seeds, in brackets the lowest and highest. updates/s: replicas' steps per second of training, all "
            f"replicas together; seconds to {target:g} %: training and evaluation until the first epoch whose top-1 "
            f"reaches it; group size: `preduce`'s mean group, single replicas included; waits: syncs per stage in "
            f"which a replica was held up by a straggling one; disagreement: the replicas' mean L2 distance from "
            f"their average weights before the last epoch's end.")
        model_rows = pipeline_model_rows(groups)
        hetero = max(key[3] for key in groups)
        sections["pipeline-model"] = table(
            ["replicas x stages", "sync", "step c without stragglers (s)", "model: updates/s with over without",
             "measured (seeds)"],
            [[f"{replicas} x {stages}", f"`{sync}`", f"{c:.4f}", f"{predicted:.2f}", with_range(measured)]
             for stages, replicas, sync, c, predicted, measured in model_rows]) + (
            f"\n\nc / X, the step against the straggler's sleep: {min(r[3] for r in model_rows) / hetero:.2f} to "
            f"{max(r[3] for r in model_rows) / hetero:.2f}." if model_rows else "")
        sections["pipeline-targets"] = pipeline_targets(groups, model_rows)
    bubble = [r for r in rows if r["part"] == "bubble"]
    if bubble:
        stages = int(bubble[0]["stages"])
        rate = {(r["schedule"], int(r["microbatches"])): float(r["images_per_s"]) for r in bubble}
        counts = sorted({m for _, m in rate})
        largest = counts[-1]

        def model(m):  # the share of a step that no stage idles, relative to the largest M's
            return (m / (m + stages - 1)) / (largest / (largest + stages - 1))
        body = []
        for m in counts:
            measured = [f"{rate[s, m]:.0f} ({rate[s, m] / rate[s, largest]:.2f})" if (s, m) in rate and
                        (s, largest) in rate else "" for s in ("gpipe", "1f1b")]
            body.append([m, f"{(stages - 1) / (m + stages - 1):.2f}", f"{model(m):.2f}", *measured])
        sections["pipeline-bubble"] = (
            table(["microbatches M", "bubble (S - 1) / (M + S - 1)", "model: images/s relative to M = "
                   f"{largest}", "gpipe images/s (relative)", "1f1b images/s (relative)"], body) +
            f"\n\nOne replica of {stages} stages, lenet on the digits, -b {bubble[0]['batch']}, one epoch; in "
            f"brackets each schedule's images/s relative to its own at M = {largest}. 1f1b needs M >= S.")
    return sections


def plot_pipeline(rows, curves, figures):
    """Updates/s against replicas per sync method (with stragglers, beside the model), and images/s against M."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    groups = pipeline_groups(rows)
    for i, sync in enumerate(dict.fromkeys(key[2] for key in groups)):
        for hetero, style in ((0.0, ":"), (max(key[3] for key in groups), "-")):
            keys = sorted(key for key in groups if key[0] == 1 and key[2] == sync and key[3] == hetero)
            if keys:
                points = [(key[1], mean_of(groups[key], "updates_per_s")) for key in keys]
                left.plot(*zip(*points), marker="o", color=f"C{i}", linestyle=style,
                          label=f"{sync}" + (f", stragglers {hetero:g} s" if hetero else ", none"))
        predicted = [(r, mean_of(groups[1, r, sync, 0.0], "updates_per_s") * c / (c + pipeline_table.expected_delay(
            sync, r, 1, 1, x=hetero))) for r in sorted({key[1] for key in groups if key[0] == 1})
            for key in [(1, r, sync, 0.0)] if key in groups for c in [mean_of(groups[key], "step_s")]
            for hetero in [max(k[3] for k in groups)]]
        if predicted:
            left.plot(*zip(*predicted), color=f"C{i}", linestyle="none", marker="x")
    left.set(xlabel="replicas R (one stage)", ylabel="updates/s (all replicas)",
             title="Updates/s; x: the expected-maximum model with stragglers")
    left.xaxis.get_major_locator().set_params(integer=True)
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    bubble = [r for r in rows if r["part"] == "bubble"]
    for schedule in ("gpipe", "1f1b"):
        points = sorted((int(r["microbatches"]), float(r["images_per_s"])) for r in bubble if r["schedule"] == schedule)
        if points:
            right.plot(*zip(*points), marker="o", label=schedule)
    if bubble:
        stages = int(bubble[0]["stages"])
        gpipe = sorted((int(r["microbatches"]), float(r["images_per_s"])) for r in bubble if r["schedule"] == "gpipe")
        largest, top = gpipe[-1]
        bubble_model = [(m, top * (m / (m + stages - 1)) / (largest / (largest + stages - 1))) for m, _ in gpipe]
        right.plot(*zip(*bubble_model), color="gray", linestyle=":",
                   label="model: 1 - (S - 1) / (M + S - 1), at gpipe's last")
    right.set_xscale("log", base=2)
    right.set(xlabel="microbatches M", ylabel="train images/s", title="The pipeline bubble, 1 replica x 2 stages")
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    save(fig, figures / "pipeline.png")


SHARD_MODES = ["none", "optimizer", "grad-op", "full"]
MIB = 2 ** 20


def sharding_rows(rows):
    """{(shard, processes): row} of sharding.csv, and the process counts measured."""
    by_run = {(r["shard"], int(r["processes"])): r for r in rows}
    return by_run, sorted({n for _, n in by_run})


def sharding_table(rows):
    """RESULTS.md's sharding section: bytes per rank against the ZeRO model, images/s relative to ddp."""
    by_run, counts = sharding_rows(rows)
    body, ratios = [], {}
    for n in counts:
        for shard in SHARD_MODES:
            r = by_run.get((shard, n))
            if r is None:
                continue
            ddp = by_run.get(("none", n))
            relative = f"{float(r['images_per_s']) / float(ddp['images_per_s']):.2f}" if ddp else ""
            ratios.setdefault(shard, []).append(int(r["state_bytes"]) / float(r["model_bytes"]))
            cuda = f" / {int(r['peak_cuda_bytes']) / MIB:.0f}" if r["peak_cuda_bytes"] else ""
            body.append([f"`{shard}` ({r['zero']})", n, *(f"{int(r[name]) / MIB:.1f}" for name in
                         ("param_bytes", "grad_bytes", "optimizer_bytes", "state_bytes")),
                         f"{float(r['model_bytes']) / MIB:.1f}", f"{int(r['peak_rss_bytes']) / MIB:.0f}{cuda}",
                         f"{float(r['images_per_s']):.1f}", relative, f"{float(r['comm_bytes_model']) / MIB:.0f}"])
    first = rows[0]
    measured_over_model = "; ".join(f"`{shard}` {min(v):.2f}-{max(v):.2f}" for shard, v in ratios.items())
    peak = "peak resident (/ peak CUDA) MiB" if any(r["peak_cuda_bytes"] for r in rows) else "peak resident MiB"
    return (table(["--shard", "processes", "weights MiB", "gradients MiB", "optimizer MiB", "sum MiB",
                   "ZeRO model MiB", peak, "train images/s", "relative to ddp", "sent per step MiB (model)"], body) +
            f"\n\n{first['arch']} ({int(first['parameters']) / 1e6:.1f} M parameters) at {first['image_size']} px, "
            f"-b {first['batch']} per process, one epoch, fp32, SGD with momentum; each byte count is the largest "
            f"rank's, measured from its tensors (weights: the most held when a forward ends). The ZeRO model for this set-up, "
            f"with P parameters and N processes: `none` 12 P, `optimizer` 8 P + 4 P / N, `grad-op` 4 P + 8 P / N, "
            f"`full` 12 P / N bytes. Measured sum over the model: {measured_over_model}. Sent per step: what the "
            f"ring algorithms of each mode send per rank, from P and N (not measured). On {first['cores']} cores "
            f"({first['cpu']}); more processes than cores share them.")


def plot_sharding(rows, figures):
    """Bytes per rank against processes per mode, beside the ZeRO model; images/s relative to ddp."""
    by_run, counts = sharding_rows(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, shard in enumerate(SHARD_MODES):
        points = [(n, by_run[shard, n]) for n in counts if (shard, n) in by_run]
        if not points:
            continue
        ns = [n for n, _ in points]
        left.plot(ns, [int(r["state_bytes"]) / MIB for _, r in points], marker="o", color=f"C{i}",
                  label=f"{shard} ({points[0][1]['zero']}), measured")
        left.plot(ns, [float(r["model_bytes"]) / MIB for _, r in points], linestyle=":", color=f"C{i}",
                  label=f"{shard}, ZeRO model")
        relative = [(n, float(r["images_per_s"]) / float(by_run["none", n]["images_per_s"]))
                    for n, r in points if ("none", n) in by_run]
        if relative:
            right.plot(*zip(*relative), marker="o", color=f"C{i}", label=shard)
    left.set(xlabel="processes", ylabel="MiB per rank (weights + gradients + optimizer)", xticks=counts,
             title=f"Bytes per rank, {rows[0]['arch']}")
    right.set(xlabel="processes", ylabel="train images/s relative to ddp", xticks=counts,
              title="Speed of each mode relative to ddp")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, figures / "sharding.png")


def gpu_sections(gpu_data, figures):
    """The GPU section of RESULTS.md from gpu/*.csv; a line saying so when the GPU sweep has not run."""
    measured = [name for name in ("precision.csv", "compression.csv") if (gpu_data / name).exists()]
    if not measured:
        return {"gpu-hardware": "Not measured yet: no GPU was available. `make figures-gpu` on a machine with CUDA "
                                "fills this section.", "gpu-precision": "", "gpu-compression": ""}
    sections = {"gpu-precision": "", "gpu-compression": ""}
    if (gpu_data / "precision.csv").exists():
        rows = read_csv(gpu_data / "precision.csv")
        plot_gpu(rows, figures)
        charts = "![GPU throughput](figures/gpu_throughput.png)\n\n"
        if len({r["gpus"] for r in rows}) > 1:
            charts += "![GPU scaling](figures/gpu_scaling.png)\n\n"
        sections["gpu-precision"] = charts + gpu_precision_table(rows)
    if (gpu_data / "compression.csv").exists():
        sections["gpu-compression"] = gpu_compression_table(read_csv(gpu_data / "compression.csv"))
    r = read_csv(gpu_data / measured[0])[0]
    line = f"GPU {r['gpu']}, CPU {r['cpu']} ({r['cores']} cores), torch {r['torch']}."
    if (gpu_data / "timings.csv").exists():
        timings = [t for t in read_csv(gpu_data / "timings.csv") if t["part"].startswith("gpu")]
        parts = ", ".join(f"{t['part'].removeprefix('gpu-')} {float(t['seconds']) / 60:.1f}" for t in timings
                          if t["part"] != "gpu")
        line += (f" The sweep took {sum(float(t['seconds']) for t in timings) / 60:.1f} minutes"
                 f"{' (' + parts + ')' if parts else ''}: {sum(int(t['runs_trained']) for t in timings)} runs "
                 f"trained, {sum(int(t['runs_reused']) for t in timings)} kept from an earlier start.")
    sections["gpu-hardware"] = line
    return sections


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
        curves = by_recipe(curve_files)
        summaries = {}
        for path in curve_files:
            if path.with_suffix(".json").exists():
                recipe, _, seed = path.stem.partition("-seed")
                summaries[recipe, seed or "0"] = json.loads(path.with_suffix(".json").read_text())
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
        loader = data / "io_loader.json"
        sections["io"] = io_tables(io_rows, json.loads(loader.read_text()) if loader.exists() else None)
        sections.setdefault("hardware", hardware_line(io_rows))
    else:
        missing.append("io.csv (scripts/bench_io.py)")
    if (data / "examples.json").exists():  # (scripts/bench_examples.py, run by hand: it needs pytorch/examples)
        sections["examples"] = examples_table(json.loads((data / "examples.json").read_text()))
    if (data / "recovery.json").exists():
        sections["recovery"] = recovery_table(json.loads((data / "recovery.json").read_text()))
    else:
        missing.append("recovery.json (scripts/bench_recovery.py)")
    if (data / "recovery_recipes.csv").exists():
        sections["recovery-recipes"] = recovery_recipes_table(read_csv(data / "recovery_recipes.csv"))
    else:
        missing.append("recovery_recipes.csv (scripts/bench_recovery.py)")
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
    ps_rows = read_csv(data / "ps.csv") if (data / "ps.csv").exists() else []
    if ps_rows:
        plot_ps(ps_rows, figures)
        sections.update(ps_tables(ps_rows))
        sections["ps-targets"] = ps_targets(ps_rows)
        if (data / "byzfl.csv").exists():
            sections["ps-byzfl"] = ps_byzfl_table(read_csv(data / "byzfl.csv"), ps_rows)
        else:
            missing.append("byzfl.csv (scripts/byzfl_reference.py)")
    else:
        missing.append("ps.csv (scripts/ps_table.py)")
    pipeline_rows = read_csv(data / "pipeline.csv") if (data / "pipeline.csv").exists() else []
    if pipeline_rows:
        curves = read_csv(data / "pipeline_curves.csv") if (data / "pipeline_curves.csv").exists() else []
        plot_pipeline(pipeline_rows, curves, figures)
        sections.update(pipeline_tables(pipeline_rows))
    else:
        missing.append("pipeline.csv (scripts/pipeline_table.py)")
    if (data / "sharding.csv").exists():
        sharding = read_csv(data / "sharding.csv")
        plot_sharding(sharding, figures)
        sections["sharding"] = sharding_table(sharding)
    else:
        missing.append("sharding.csv (scripts/bench_sharding.py)")
    if (data / "timings.csv").exists():
        sections["timings"] = timings_table(read_csv(data / "timings.csv"))
    sections.update(gpu_sections(data / "gpu", figures))
    rewrite(Path(args.results), sections)
    for name in missing:
        print(f"warning: no {data / name.split(' ')[0]}: run {name.split(' ')[1][1:-1]} to measure it",
              file=sys.stderr)


if __name__ == "__main__":
    main()
