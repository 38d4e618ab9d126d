"""The pipeline part's time to a target, SD-PIPE's own measure: per layout, the seconds each sync method takes to
reach a top-1 near the best method's final one, and the final top-1, under PipeDream with stragglers.

    reads    figures/data/pipeline_time.csv (scripts/figures/pipeline/measure.py --parts time)
    draws    figures/pipeline_time.png
    writes   section pipeline-time; first_to_target() for the headline

Each layout's target is the best method's mean final top-1 less BELOW_BEST points, rounded down to a half
point: near where training ends, so that a method that gets there early but ends lower is seen to. A time is
that of the first score at or above the target: of the model as it was every T seconds of training (rows with
snapshot 1, scored at each epoch's end: recipes/pipeline/snapshots.py) or at an epoch's end, in seconds of
training; in files without snapshots (measured before them), of the first epoch's end, training and evaluation
summed.
"""

import math

import matplotlib.pyplot as plt

from scripts.figures.rendering import beyond_spread, read_csv, save, spread, table, with_range

BELOW_BEST = 1.0  # points under the best method's mean final top-1: the layout's target
SENSITIVITY = (0.5, 1.0, 2.0)  # the targets at which each layout's first method is also named
ORDER = ["allreduce", "preduce", "adpsgd", "hetpipe"]
SIZED = "allreduce's epoch without stragglers"  # what T is a quarter of (measure.py's snapshot_every)


def read(data, name="pipeline_time.csv"):
    """{(replicas, stages): {sync: {seed: [(epoch, seconds, top1), ...]}}}, or {} when not measured."""
    path = data / name
    layouts = {}
    for r in read_csv(path) if path.exists() else []:
        runs = layouts.setdefault((int(r["replicas"]), int(r["stages"])), {}).setdefault(r["sync"], {})
        runs.setdefault(r["seed"], []).append((int(r["epoch"]), float(r["seconds"]), float(r["top1"])))
    return layouts


def snapshot_every(data, name="pipeline_time.csv"):
    """{(replicas, stages): T}, the seconds between the snapshots of each layout (the first one's time); {} when the
    runs were scored at each epoch's end only."""
    every = {}
    for r in read_csv(data / name) if (data / name).exists() else []:
        if r.get("snapshot") == "1" and r["epoch"] == "1":
            key = (int(r["replicas"]), int(r["stages"]))
            every[key] = min(every.get(key, math.inf), float(r["seconds"]))
    return every


def finals(runs):
    return spread([points[-1][2] for points in runs.values()])


def target_of(methods, below=BELOW_BEST):
    best = max(finals(runs)["mean"] for runs in methods.values())
    return math.floor(2 * (best - below)) / 2


def seconds_to(runs, target):
    """The seconds to the target of each seed that reached it, and the count of seeds."""
    reached = [next((seconds for _, seconds, top1 in points if top1 >= target), None) for points in runs.values()]
    return [s for s in reached if s is not None], len(reached)


def time_cell(runs, target):
    """A table's cell of the seconds to the target, and their spread (None where no seed reached it)."""
    reached, seeds = seconds_to(runs, target)
    if not reached:
        return f"not reached (0 of {seeds} seeds)", None
    return with_range(spread(reached), 1) + " s" + ("" if len(reached) == seeds else
                                                     f" ({len(reached)} of {seeds} seeds)"), spread(reached)


def first(methods, target):
    """The method that reaches the target first: every seed there, the lowest mean time; None if none does."""
    times = {sync: seconds_to(runs, target) for sync, runs in methods.items()}
    whole = {sync: sum(t) / len(t) for sync, (t, n) in times.items() if t and len(t) == n}
    return min(whole, key=whole.get) if whole else None


def by_layout(layouts):
    """Each layout, S then R ascending: ("R x S", its methods, its target, the method first to it or None)."""
    for (replicas, stages), methods in sorted(layouts.items(), key=lambda item: (item[0][1], item[0][0])):
        target = target_of(methods)
        yield f"{replicas} x {stages}", methods, target, first(methods, target)


def spread_line(layouts):
    """Per layout, which differences exceed the seeds' spread: the first method's time against the next one's
    (every seed there), and each final top-1 below the best final one's."""
    said = []
    for layout, methods, target, leader in by_layout(layouts):
        if leader is None:
            continue
        times = {sync: seconds_to(runs, target) for sync, runs in methods.items()}
        whole = sorted((sum(t) / n, sync) for sync, (t, n) in times.items() if t and len(t) == n)
        line = f"{layout}: {leader} first"
        if len(whole) > 1:
            second = whole[1][1]
            line += (" beyond" if beyond_spread(spread(times[leader][0]), spread(times[second][0])) else
                     " within") + f" the spread of {second}'s time"
        ends = {sync: finals(runs) for sync, runs in methods.items()}
        best = max(ends, key=lambda sync: ends[sync]["mean"])
        lower = [sync for sync in ORDER if sync in ends and sync != best and beyond_spread(ends[sync], ends[best])]
        said.append(line + (f", {' and '.join(lower)} ending below {best} beyond it" if lower else
                            ", every final top-1 within it of the best"))
    return "Beyond the seeds' spread (the ranges do not overlap) or within it: " + "; ".join(said) + "."


def sensitivity_line(layouts):
    """Per layout, the first method with the target at the best final top-1 less each of SENSITIVITY's points:
    whether the verdict hangs on the one target the table uses."""
    said, steady = [], 0
    for layout, methods, _, _ in by_layout(layouts):
        firsts = [first(methods, target_of(methods, below)) or "none in every seed" for below in SENSITIVITY]
        steady += len(set(firsts)) == 1
        said.append(f"{layout}: {', '.join(firsts)}")
    points = ", ".join(f"{below:g}" for below in SENSITIVITY[:-1]) + f" or {SENSITIVITY[-1]:g}"
    return (f"With the target at the best final top-1 less {points} points, the first method: " + "; ".join(said) +
            f" ({steady} of {len(said)} layouts the same at all three).")


def resolution(every, sized=SIZED):
    """What a time is: the snapshots' (every: snapshot_every(); sized: what T is a quarter of) or the epochs' ends."""
    if not every:
        return "a time is the first epoch's end at or above it (training and evaluation)"
    return ("a time is the first score at or above it, of the model as it was every T seconds of training (T a "
            f"quarter of {sized}: " +
            ", ".join(f"{t:g} s at {r} x {s}" for (r, s), t in sorted(every.items(), key=lambda i: i[0][::-1])) +
            ") or at an epoch's end, in seconds of training (the scoring is not counted)")


def time_table(layouts, regime="X sized from each layout's allreduce run without them", every=None, sized=SIZED):
    """One row a layout: its target, then each method's seconds to it and its final top-1, the first marked (every:
    snapshot_every(), the seconds between the scores within an epoch)."""
    body, syncs = [], [s for s in ORDER if any(s in methods for methods in layouts.values())]
    for layout, methods, target, leader in by_layout(layouts):
        cells = [("**first**: " if sync == leader else "") + f"{time_cell(methods[sync], target)[0]}; ends at "
                 f"{with_range(finals(methods[sync]))}" if sync in methods else "" for sync in syncs]
        body.append([layout, f"{target:.1f}", *cells])
    epochs = max(points[-1][0] for methods in layouts.values() for runs in methods.values()
                 for points in runs.values())
    seeds = max(len(runs) for methods in layouts.values() for runs in methods.values())
    return (table(["R x S", "target top-1 (%)", *(f"`{sync}`: seconds to it; final top-1 (%)" for sync in syncs)],
                  body) +
            f"\n\nTime to a target, SD-PIPE's own measure: PipeDream with stragglers ({regime}), lenet on the "
            f"digits, "
            f"{epochs} epochs, {seeds} seeds: the mean, in brackets the lowest and highest. The target is the best "
            f"method's mean final top-1 less {BELOW_BEST:g} point, rounded down to a half point; "
            f"{resolution(every, sized)}. First: every seed reached it, in the "
            f"least time on average. {spread_line(layouts)} {sensitivity_line(layouts)}")


def first_to_target(data, name="pipeline_time.csv"):
    """'time to a top-1 near the best final one: 4 x 1 to 97.0 %: hetpipe first (...)', per layout: the first
    method, then preduce, allreduce and hetpipe, each with its time and final top-1; for the headline; None."""
    layouts = read(data, name)
    if not layouts:
        return None
    parts = []
    for layout, methods, target, leader in by_layout(layouts):
        if leader is None:
            parts.append(f"{layout} to {target:.1f} %: no method in every seed")
            continue

        def said(sync):
            reached, seeds = seconds_to(methods[sync], target)
            time = f"{sum(reached) / len(reached):.1f} s" if len(reached) == seeds else \
                f"{len(reached)} of {seeds} seeds reach it"
            return f"{sync} {time}, final {finals(methods[sync])['mean']:.1f} %"

        shown = [leader] + [s for s in ("preduce", "allreduce", "hetpipe") if s != leader and s in methods]
        parts.append(f"{layout} to {target:.1f} %: {leader} first ({'; '.join(said(s) for s in shown)})")
    return "time to a top-1 near the best final one: " + "; ".join(parts)


def plot(layouts, figures):
    """Top-1 against seconds of training, a panel a layout, a line a seed, the layout's target dashed."""
    fig, axes = plt.subplots(1, len(layouts), figsize=(4 * len(layouts), 4), squeeze=False)
    for axis, (layout, methods, target, _) in zip(axes[0], by_layout(layouts)):
        for sync in [s for s in ORDER if s in methods]:
            for n, points in enumerate(methods[sync].values()):
                axis.plot([p[1] for p in points], [p[2] for p in points], color=f"C{ORDER.index(sync)}", alpha=0.7,
                          linewidth=1, label=sync if n == 0 else None)
        axis.axhline(target, color="gray", linestyle="--", linewidth=1)
        axis.set(ylim=(target - 6, 100), xlabel="seconds of training", ylabel="val top-1 (%)",
                 title=f"R x S = {layout}")
        axis.grid(alpha=0.3), axis.legend(fontsize=7)
    save(fig, figures / "pipeline_time.png")


def render(data, figures):
    layouts = read(data)
    if not layouts:
        return {}
    plot(layouts, figures)
    return {"pipeline-time": time_table(layouts, every=snapshot_every(data))}
