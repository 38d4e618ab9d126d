"""The pipeline's race on the virtual cluster (scripts/figures/pipeline/cluster.py): the time part's table where
the links cost time, each method's updates/s, and whether partial reduce is first as SD-PIPE finds.

    reads    figures/data/pipeline_cluster.csv, pipeline_cluster_time.csv, pipeline_time.csv
    writes   section pipeline-cluster
"""

from scripts.figures.pipeline.render_time import ORDER, by_layout, first, read, snapshot_every, target_of, time_table
from scripts.figures.rendering import read_csv, spread, table, with_range


def cluster_section(data):
    """The race on the virtual cluster (scripts/figures/pipeline/cluster.py): the time table, each method's
    updates/s, and, layout by layout, whether partial reduce is first as SD-PIPE finds, beside loopback's."""
    layouts, runs = read(data, "pipeline_cluster_time.csv"), read_csv(data / "pipeline_cluster.csv")
    r = runs[0]
    settings = {(int(x["replicas"]), int(x["stages"])): x for x in runs}  # (each layout's link and X)
    regime = (f"on the virtual cluster: a node a replica and one more for HetPipe's servers, one process a node, "
              f"links sized after {r['link']} at R nodes ("
              + ", ".join(f"{float(x['rate_bits']) / 1e6:.1f} Mbit/s at {x['replicas']}"
                          for x in settings.values())
              + " here), X a replica's step alone / 0.5 (" + ", ".join(f"{float(x['hetero']):g} s at {x['replicas']}"
                                                                     for x in settings.values()) + ")")
    syncs = [s for s in ORDER if any(x["sync"] == s for x in runs)]
    grouped = {}
    for x in runs:
        grouped.setdefault(((int(x["replicas"]), int(x["stages"])), x["sync"]), []).append(float(x["updates_per_s"]))
    updates = {key: spread(values) for key, values in grouped.items()}  # ((R, S), sync): updates/s over the seeds
    body = [[f"{replicas} x {stages}", *(with_range(updates[(replicas, stages), s], 1)
                                         if ((replicas, stages), s) in updates else "" for s in syncs)]
            for replicas, stages in settings]
    local = {layout: leader for layout, _, _, leader in by_layout(read(data))}
    said = []
    for layout, methods, target, leader in by_layout(layouts):
        there = f"; on loopback {local[layout]} first" if local.get(layout) else ""
        verdict = ("agrees with SD-PIPE (partial reduce first)" if leader == "preduce" else
                   f"does not agree with SD-PIPE: {leader or 'no method in every seed'} first")
        others = {f"{below:g}": first(methods, target_of(methods, below)) for below in (0.5, 1.5)}
        robust = "; with the target at the best less " + " or ".join(
            f"{below} points, {other or 'no method in every seed'} first" for below, other in others.items())
        said.append(f"{layout} to {target:.1f} %: {verdict}{there}{robust}")
    hetpipe = {layout: u["mean"] for (layout, sync), u in updates.items() if sync == "hetpipe"}
    why = ""
    if len(hetpipe) > 1:
        few, many = min(hetpipe), max(hetpipe)
        why = (f" HetPipe's updates/s at R = {many[0]} are {hetpipe[many] / hetpipe[few]:.2f}x those at R = "
               f"{few[0]}: its servers' one link carries the pushes and pulls of every replica.")
    every = snapshot_every(data, "pipeline_cluster_time.csv")
    unlike = (" The loopback verdicts beside these come from scores within epochs, in seconds of training alone; "
              "these from epochs' ends, training and evaluation summed (this part was measured before scores "
              "within epochs)."
              if snapshot_every(data) and not every else "")
    sized = "a replica's epoch computing alone, its step alone x its minibatches"
    return (time_table(layouts, regime, every, sized) + "\n\nUpdates/s (all replicas'), the same runs:\n\n" +
            table(["R x S", *(f"`{s}`" for s in syncs)], body) + "\n\nAgainst the paper: " + "; ".join(said) + "."
            + why + unlike)


def render(data):
    if (data / "pipeline_cluster_time.csv").exists() and (data / "pipeline_cluster.csv").exists():
        return {"pipeline-cluster": cluster_section(data)}
    return {}
