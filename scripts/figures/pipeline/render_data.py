"""The data each replica reads: the time part's race at one layout with SD-PIPE's data streams in place of ddp's
disjoint shards (measure.py --parts data), beside the time part's own runs of that layout.

    reads    figures/data/pipeline_data.csv, pipeline_time.csv
    writes   section pipeline-data
"""

from scripts.figures.pipeline.render_time import ORDER, finals, first, read, snapshot_every, target_of, time_cell
from scripts.figures.rendering import beyond_spread, table, with_range


def compared(shard, stream, label):
    """Streams against shards: higher or lower, beyond the spread or within it, or the same."""
    if shard is None or stream is None:
        return ""
    if stream["mean"] == shard["mean"]:
        return f"{label} the same"
    side = "higher" if stream["mean"] > shard["mean"] else "lower"
    return f"{label} {side}, " + ("beyond the spread" if beyond_spread(shard, stream) else "within the spread")


def section(data):
    streams, shards = read(data, "pipeline_data.csv"), read(data)
    body, said = [], []
    for (replicas, stages), methods in streams.items():
        if (replicas, stages) not in shards:
            continue
        own = shards[(replicas, stages)]
        target = target_of(own)
        for sync in [s for s in ORDER if s in methods and s in own]:
            cells = [time_cell(runs[sync], target) for runs in (own, methods)]
            ends = [finals(runs[sync]) for runs in (own, methods)]
            verdicts = [v for v in (compared(cells[0][1], cells[1][1], "time"),
                                    compared(ends[0], ends[1], "final top-1")) if v]
            body.append([f"{replicas} x {stages}", f"`{sync}`", cells[0][0], with_range(ends[0]), cells[1][0],
                         with_range(ends[1]), "; ".join(verdicts)])
        leaders = [first(own, target), first(methods, target)]
        said.append(f"at {replicas} x {stages} to {target:.1f} %, {leaders[0] or 'no method in every seed'} first on "
                    f"shards, {leaders[1] or 'no method in every seed'} first on streams")
    seeds = max(len(runs) for methods in streams.values() for runs in methods.values())
    every = snapshot_every(data, "pipeline_data.csv")
    return (table(["R x S", "method", "shards: seconds to the target", "shards: final top-1 (%)",
                   "streams: seconds to the target", "streams: final top-1 (%)", "streams against shards"], body) +
            f"\n\nShards are ddp's (replica r reads rank r's of R disjoint shards; the time part's runs above); "
            f"streams are SD-PIPE's (`--replica-data stream`: each replica reads the whole set, shuffled by its own "
            f"seed, a permutation after another). The rest is the time part's: PipeDream with stragglers, the "
            f"layout's target, {seeds} seeds, the mean and in brackets the lowest and highest, scored every "
            + ", ".join(f"{t:g} s" for t in every.values()) + " of training and at each epoch's end. The race: "
            + "; ".join(said) + ".")


def render(data):
    if not (data / "pipeline_time.csv").exists():
        return {}
    if not read(data, "pipeline_data.csv"):  # (absent, or no row yet)
        return {"pipeline-data": "Not measured yet: `python scripts/figures/pipeline/measure.py --parts data` (after "
                                 "the time part)."}
    return {"pipeline-data": section(data)}
