"""The pipeline part's masked language model, SD-PIPE's BERT measure: the masked-LM loss against seconds for each
sync method under PipeDream with stragglers, bert_tiny at R x S = 2 x 4 on the pydoc topics.

    reads    figures/data/pipeline_bert.csv (scripts/figures/pipeline/measure.py --parts bert)
    draws    figures/pipeline_bert.png
    writes   section pipeline-bert

SD-PIPE plots BERT's training loss against time. Here each point is an epoch's end: the epoch's mean training loss
(the loss each minibatch had as it trained, stale weights and all) and the validation loss after it, at the
seconds of training and evaluation so far. The target is the highest final training loss of any run with
stragglers (a loss every run reaches), and a time is the first epoch's end at or under it.
"""

import matplotlib.pyplot as plt

from scripts.figures.rendering import beyond_spread, read_csv, save, spread, table, with_range

ORDER = ["allreduce", "preduce", "adpsgd", "hetpipe"]
OTHER_TARGETS = (-0.1, 0.1, 0.2)  # the table's target moved this much: whether the first method hangs on one
BASELINE = ("allreduce", False)  # without stragglers


def read(data):
    """{(sync, stragglers): {seed: [(epoch, seconds, train loss, val loss, top-1), ...]}}, or {}."""
    path = data / "pipeline_bert.csv"
    runs = {}
    for r in read_csv(path) if path.exists() else []:
        seeds = runs.setdefault((r["sync"], float(r["hetero"]) > 0), {})
        seeds.setdefault(r["seed"], []).append((int(r["epoch"]), float(r["seconds"]), float(r["train_loss"]),
                                                float(r["val_loss"]), float(r["top1"])))
    return runs


def methods_of(runs):
    return [(sync, True) for sync in ORDER if (sync, True) in runs]


def final(seeds, field):
    """The spread over seeds of a field of the last epoch (1 seconds, 2 training loss, 3 val loss, 4 top-1)."""
    return spread([points[-1][field] for points in seeds.values()])


def target_of(runs, above=0.0):
    return max(final(runs[key], 2)["high"] for key in methods_of(runs)) + above


def seconds_to(seeds, target):
    """The seconds at which each seed's training loss first reaches the target (None where it never does)."""
    return [next((seconds for _, seconds, loss, _, _ in points if loss <= target), None) for points in seeds.values()]


def first(runs, target):
    """The method with stragglers that reaches the target first: every seed there, the lowest mean time."""
    return race(runs, target)[0]


def race(runs, target):
    """(the first to the target, the next, whether the first's times are beyond the seeds' spread of the next's)."""
    times = sorted((sum(t) / len(t), key[0], t) for key in methods_of(runs) if None not in (t := seconds_to(runs[key],
                                                                                                            target)))
    if len(times) < 2:
        return (times[0][1] if times else None), None, False
    return times[0][1], times[1][1], beyond_spread(spread(times[0][2]), spread(times[1][2]))


def plot(runs, figures):
    """Training and validation loss against seconds, the mean over seeds at each epoch's end."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for key in [BASELINE, *methods_of(runs)] if BASELINE in runs else methods_of(runs):
        seeds = list(runs[key].values())
        epochs = min(len(points) for points in seeds)
        seconds = [sum(points[e][1] for points in seeds) / len(seeds) for e in range(epochs)]
        style = dict(color="gray", linestyle="--") if key == BASELINE else dict(color=f"C{ORDER.index(key[0])}")
        for axis, field in zip(axes, (2, 3)):
            axis.plot(seconds, [sum(points[e][field] for points in seeds) / len(seeds) for e in range(epochs)],
                      marker="o", label=f"{key[0]}" + ("" if key[1] else ", no stragglers"), **style)
    for axis, split in zip(axes, ("training (the epoch's mean)", "validation")):
        axis.set(xlabel="seconds (training and evaluation)", ylabel=f"masked-LM loss, {split}",
                 title=f"bert_tiny, 2 x 4, PipeDream with stragglers: {split.split()[0]} loss")
        axis.grid(alpha=0.3), axis.legend(fontsize=7)
    save(fig, figures / "pipeline_bert.png")


def section(runs):
    keys = ([BASELINE] if BASELINE in runs else []) + methods_of(runs)
    target = target_of(runs)
    leader = first(runs, target)
    body = []
    for key in keys:
        seeds = runs[key]
        reached = [s for s in seconds_to(seeds, target) if s is not None]
        time = (with_range(spread(reached), 1) + ("" if len(reached) == len(seeds) else
                                                  f" ({len(reached)} of {len(seeds)} seeds)")) if reached else \
            f"not reached (0 of {len(seeds)} seeds)"
        name = f"`{key[0]}`" + ("" if key[1] else " without stragglers")
        body.append([("**first**: " if key[1] and key[0] == leader else "") + name, time,
                     with_range(final(seeds, 1), 1), with_range(final(seeds, 2), 3), with_range(final(seeds, 3), 3),
                     with_range(final(seeds, 4))])
    _, second, beyond = race(runs, target)
    versus = (f" {leader}'s time is {'beyond' if beyond else 'within'} the seeds' spread of {second}'s." if second
              else "")
    ends = {key[0]: final(runs[key], 2) for key in methods_of(runs)}
    best = min(ends, key=lambda sync: ends[sync]["mean"])
    higher = [sync for sync in ends if sync != best and beyond_spread(ends[sync], ends[best])]
    others = "; ".join(f"{abs(d):g} {'above' if d > 0 else 'below'} it ({target + d:.3f}): "
                       f"{first(runs, target + d) or 'none in every seed'}" for d in OTHER_TARGETS)
    points = next(iter(runs[keys[0]].values()))
    row = (f"bert_tiny at R x S = 2 x 4 under PipeDream, AdamW, {len(points)} epochs, "
           f"{max(len(s) for s in runs.values())} seeds: the mean, in brackets the lowest and highest. The target is "
           f"the highest final training loss of any run with stragglers, {target:.3f}; a time is the first epoch's "
           f"end at or under it (training and evaluation). First: every seed reached it, in the least time on "
           f"average; the times are epochs' ends, so they move by whole epochs.{versus} The first with the target "
           f"moved {others}. Seconds in all: the run's training and evaluation. Top-1: of the positions of val/ "
           f"chosen for prediction (15 %: masked, replaced or kept). Final training losses beyond the seeds' spread "
           f"(ranges that do not overlap) of the lowest, {best}'s: " + (", ".join(higher) or "none") + ".")
    return table(["method", "seconds to the target", "seconds in all", "final training loss", "final val loss",
                  "val top-1 of the predicted tokens (%)"], body) + "\n\n" + row


def render(data, figures):
    runs = read(data)
    if not methods_of(runs):
        return {}
    plot(runs, figures)
    return {"pipeline-bert": section(runs)}


def headline(data):
    """'masked-LM loss (bert_tiny, 2 x 4): preduce first to 4.812, ...' for the pipeline's headline; None."""
    runs = read(data)
    if not methods_of(runs):
        return None
    target = target_of(runs)
    times = {key[0]: seconds_to(runs[key], target) for key in methods_of(runs)}
    said = [f"{sync} {sum(t) / len(t):.0f} s" if None not in t else f"{sync} {len(t) - t.count(None)} of {len(t)} "
            f"seeds" for sync, t in times.items()]
    leader, second, beyond = race(runs, target)
    return (f"bert_tiny's masked-LM training loss (2 x 4) to {target:.3f}: {leader or 'no method'} first"
            + (f" ({'beyond' if beyond else 'within'} the seeds' spread of {second}'s time)" if second else "")
            + f" ({', '.join(said)})")
