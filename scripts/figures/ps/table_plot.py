"""The ps table's figures: top-1 per rule and attack, one grid per figure of the authors, and ZenoPS's eta sweep.

    reads    figures/data/ps.csv (through render.py)
    draws    figures/ps.png, ps_eta.png
"""

import statistics

from scripts.figures.ps.table_rows import MATRICES, finished, ps_groups
from scripts.figures.rendering import plt, save, spread


def plot_ps(rows, figures):
    """Top-1 per aggregation and attack, one annotated grid per figure of the authors; and the eta sweep."""
    parts = [part for part in MATRICES if ps_groups(rows, part)]
    fig, axes = plt.subplots(1, max(1, len(parts)), figsize=(3.4 * max(1, len(parts)), 5), squeeze=False)
    for ax, part in zip(axes[0], parts):
        groups = ps_groups(rows, part)
        aggregates = list(dict.fromkeys(aggregate for aggregate, _ in groups))
        attacks = list(dict.fromkeys(attack for _, attack in groups))
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
        ax.set_yticks(range(len(attacks)), attacks, fontsize=7)
        ax.set_title(part)
    fig.suptitle(f"Parameter server, 8 workers, lenet on the digits, {rows[0]['epochs']} epochs: val top-1 (%), "
                 f"mean of {len({x['seed'] for x in rows})} seed(s)")
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
                marker="o", capsize=3, label="sync zenops, two validators, N(0, 1) per tensor at 0.2")
    baseline = [float(x["top1"]) for x in finished(rows) if x["aggregate"] == "validation data only"]
    if baseline:
        ax.axhspan(min(baseline), max(baseline), color="gray", alpha=0.2)
        ax.axhline(statistics.mean(baseline), color="gray", linestyle="--", label="validation data only (nd)")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set(xlabel="--zeno-eta", ylabel="final val top-1 (%)", title="ZenoPS's eta sweep: mean, min-max over seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, figures / "ps_eta.png")
