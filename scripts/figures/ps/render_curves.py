"""The parameter server's top-1 against time, sync and async: ZenoPS against the plain rule beside it, without an
attack and under the sign flip, each epoch's top-1 at its training seconds (evaluation left out).

    reads    figures/data/ps_curves.csv (scripts/figures/ps/table.py, with ps.csv)
    draws    figures/ps_curves.png
    writes   section ps-curves
"""

import matplotlib.pyplot as plt

from scripts.figures.rendering import read_csv, save, spread, table, with_range

PANELS = {  # part: (its plain rule, zenops, the attack): the runs each panel draws, without the attack and with it
    "sync-1v": ("mean", "zenops", "signflip x6"),
    "async-1v": ("naive-async, in the validator", "zenops", "signflip x2"),
}
TARGET = 90.0  # % top-1: the seconds to it, in the table


def in_panels(r):
    return r["part"] in PANELS and r["aggregate"] in PANELS[r["part"]][:2] and r["attack"] in ("none",
                                                                                               PANELS[r["part"]][2])


def read(data):
    """{(part, rule, attack): {seed: [(epoch, seconds, top1), ...]}} of the panels' runs, or {}."""
    path = data / "ps_curves.csv"
    runs = {}
    for r in read_csv(path) if path.exists() else []:
        if in_panels(r):
            runs.setdefault((r["part"], r["aggregate"], r["attack"]), {}).setdefault(r["seed"], []).append(
                (int(r["epoch"]), float(r["seconds"]), float(r["top1"])))
    return runs


def mean_curve(seeds):
    """(seconds, top-1) at each epoch, the means over the seeds that reached it."""
    epochs = max(len(points) for points in seeds.values())
    curve = []
    for e in range(epochs):
        at = [points[e] for points in seeds.values() if len(points) > e]
        curve.append((sum(p[1] for p in at) / len(at), sum(p[2] for p in at) / len(at)))
    return curve


def plot(runs, figures):
    fig, axes = plt.subplots(1, len(PANELS), figsize=(12, 4.5))
    for axis, (part, (plain, zenops, attack)) in zip(axes, PANELS.items()):
        for i, rule in enumerate((plain, zenops)):
            for against, style in (("none", "-"), (attack, "--")):
                if (part, rule, against) in runs:
                    seconds, top1 = zip(*mean_curve(runs[part, rule, against]))
                    axis.plot(seconds, top1, marker="o", linestyle=style, color=f"C{i}",
                              label=f"{rule}, {'no attack' if against == 'none' else against}")
        axis.set(xlabel="training seconds (evaluation left out)", ylabel="val top-1 (%)", ylim=(0, 100),
                 title=f"ZenoPS {part}: top-1 against time")
        axis.grid(alpha=0.3), axis.legend(fontsize=7)
    save(fig, figures / "ps_curves.png")


def section(runs, diverged):
    """diverged: {(part, rule, attack): seeds} of the panels' runs that left no curve."""
    body = []
    for part, (plain, zenops, attack) in PANELS.items():
        for rule in (plain, zenops):
            for against in ("none", attack):
                seeds = runs.get((part, rule, against))
                if not seeds:  # (every seed diverged, or the run is not measured)
                    if (part, rule, against) in diverged:
                        body.append([part, f"`{rule}`", against, f"diverged ({diverged[part, rule, against]} seeds)",
                                     "", "", ""])
                    continue
                reached = [next((s for _, s, top1 in points if top1 >= TARGET), None) for points in seeds.values()]
                hit = [s for s in reached if s is not None]
                time = (with_range(spread(hit), 1) + ("" if len(hit) == len(reached) else
                                                      f" ({len(hit)} of {len(reached)} seeds)")) if hit else \
                    f"not reached (0 of {len(reached)} seeds)"
                finals = [points[-1] for points in seeds.values()]
                body.append([part, f"`{rule}`", against, time, with_range(spread([p[1] for p in finals]), 1),
                             with_range(spread([p[2] for p in finals])),
                             " / ".join(f"{top1:.1f}" for _, top1 in mean_curve(seeds))])
    return (table(["part", "rule", "attack", f"seconds to {TARGET:g} %", "seconds in all", "final top-1 (%)",
                   "top-1 after each epoch (mean, %)"], body) +
            f"\n\nEach run's val top-1 after each epoch against its training seconds, the mean over "
            f"{max(len(seeds) for seeds in runs.values())} seeds, in brackets the lowest and highest; a run that "
            f"diverged has no curve. The seconds to {TARGET:g} % are the first epoch's end at or above it.")


def render(data, figures):
    runs = read(data)
    if not runs:
        return {}
    plot(runs, figures)
    diverged = {}
    for r in read_csv(data / "ps.csv") if (data / "ps.csv").exists() else []:
        if in_panels(r) and r["diverged"] == "1" and not runs.get((r["part"], r["aggregate"], r["attack"])):
            key = (r["part"], r["aggregate"], r["attack"])
            diverged[key] = diverged.get(key, 0) + 1
    return {"ps-curves": section(runs, diverged)}
