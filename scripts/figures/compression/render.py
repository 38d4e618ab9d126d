"""compression: time, accuracy and bytes of each gradient compression, over seeds
(scripts/figures/compression/measure.py).

    reads    figures/data/compression.csv, and the virtual cluster's rows (render_cluster.py)
    draws    figures/compression.png
    writes   sections compression, compression-summary (RESULTS.md), compression-cluster (render_cluster.py)
"""

import statistics

from scripts.figures.compression import render_cluster
from scripts.figures.rendering import beyond_spread, plt, read_csv, spread, table, with_range


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


def compression_summary(rows, cluster_rows=()):
    """RESULTS.md's form: a method a row, its bytes, its top-1 at each process count against uncompressed DDP's
    (the long form's table has every column), and on the virtual cluster its step against uncompressed DDP's."""
    speedups = render_cluster.speedups(cluster_rows)
    groups = compression_groups(rows)
    top1 = {key: spread([float(r["top1"]) for r in runs]) for key, runs in groups.items()}
    counts = sorted({count for label, count in groups if label != "serial"})
    body = []
    for label in dict.fromkeys(label for label, _ in groups if label != "serial"):
        r = next(runs[0] for (name, _), runs in groups.items() if name == label)
        cells = []
        for count in counts:
            result, none = top1.get((label, count)), top1.get(("none", count))
            mark = "" if label == "none" or not result or not none else \
                f", {result['mean'] - none['mean']:+.2f}{', beyond the spread' if beyond_spread(result, none) else ''}"
            cells.append(with_range(result) + mark if result else "")
        faster = [f"{speedups[setting][label][0]:.2f}x{'*' if speedups[setting][label][1] else ''}"
                  if label in speedups[setting] else "" for setting in speedups]
        body.append([label, f"{float(r['bytes_per_step']):,.0f}", f"{float(r['compression_ratio']):.2f}", *cells,
                     *faster])
    r = rows[0]
    text = (table(["method", "bytes per step", "compression ratio",
                   *(f"val top-1 (%), {count} processes" for count in counts),
                   *(f"step vs none: {link.split(' (')[0]}, {nodes} nodes" for link, nodes in speedups)], body) +
            f"\n\nTop-1: {r['arch']}, {r['epochs']} epochs, global batch {r['global_batch']}, "
            f"{max(v['n'] for v in top1.values())} seed(s) on this machine: the mean, in brackets the lowest and "
            f"highest, then the difference from uncompressed DDP's mean (points), \"beyond the spread\" where their "
            f"ranges do not overlap.")
    if speedups:
        unrun = [label for label in dict.fromkeys(label for label, _ in groups if label != "serial")
                 if not any(label in methods for methods in speedups.values())]
        text += (" Step vs none: uncompressed DDP's mean step over the method's on the virtual cluster, each link "
                 "sized so that uncompressed DDP's wire takes the share of its step that ResNet-50's takes on that "
                 "real link (* beyond the seeds' spread)" +
                 (f"; {' and '.join(unrun)} not run there (the same bytes as fp8-e4m3's)" if unrun else "") + ".")
    return text


def render(data, figures, missing):
    if not (data / "compression.csv").exists():
        missing.append("compression.csv (scripts/figures/compression/measure.py)")
        return {}
    compression = read_csv(data / "compression.csv")
    plot_compression(compression, figures)
    cluster = data / "compression_cluster.csv"
    summary = compression_summary(compression, read_csv(cluster) if cluster.exists() else [])
    return {"compression": compression_table(compression), "compression-summary": summary,
            **render_cluster.render(data)}


def headline(data):
    if not (data / "compression.csv").exists():
        return None
    rows = read_csv(data / "compression.csv")
    top1 = {}
    for r in rows:
        top1.setdefault((r["method"], r["error_feedback"], r["processes"]), []).append(float(r["top1"]))
    compressed = [r for r in rows if r["compression_ratio"]]
    if not compressed:
        return None
    most = max(compressed, key=lambda r: (float(r["compression_ratio"]), -int(r["processes"])))
    key = (most["method"], most["error_feedback"], most["processes"])
    if ("none", "0", most["processes"]) not in top1:
        return None
    accuracy = (f"{most['method']}{' with error feedback' if most['error_feedback'] == '1' else ''} sends "
                f"{float(most['compression_ratio']):.0f}x fewer bytes: top-1 {statistics.mean(top1[key]):.2f} "
                f"against {statistics.mean(top1['none', '0', most['processes']]):.2f} uncompressed, on "
                f"{most['processes']} processes")
    return "; ".join([*render_cluster.headline(data), accuracy])
