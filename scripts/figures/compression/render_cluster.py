"""compression on the virtual cluster: what each method buys in time over links sized after real clusters'
(scripts/figures/compression/cluster.py).

    reads    figures/data/compression_cluster.csv, compression_cluster_curves.csv, compression_cluster_skipped.csv
    writes   section compression-cluster (the long form); speedups() for RESULTS.md's summary; headline()

A step's model is the method's step on one node alone (measured, its compression work included) plus its bytes
on the wire: a ring all-reduce at the TCP payload rate of the link (scripts/figures/cluster/links.py). The time
to a target is read at three targets, so that no verdict hangs on one: the first epoch's end at or above it
(training seconds summed, evaluation left out).
"""

import statistics

from scripts.figures.cluster import links
from scripts.figures.rendering import beyond_spread, read_csv, spread, table, with_range

TARGETS = (96.0, 97.0, 98.0)  # top-1 (%)


def label(row):
    return row["method"] + (" + error feedback" if row["error_feedback"] == "1" else "")


def by_setting(rows):
    """{(link, nodes): {label: [rows, one a seed]}} in the order measured."""
    settings = {}
    for r in rows:
        settings.setdefault((r["link"], int(r["nodes"])), {}).setdefault(label(r), []).append(r)
    return settings


def times_to(curves, target):
    """{(link, nodes, label, seed): training seconds to the first epoch at or above target, or None}."""
    reached = {}
    for c in curves:
        key = (c["link"], int(c["nodes"]), label(c), c["seed"])
        reached.setdefault(key, None)
        if reached[key] is None and float(c["top1"]) >= target:
            reached[key] = float(c["train_s"])
    return reached


def step_spread(runs):
    return spread([float(r["step_s"]) * 1e3 for r in runs])


def speedups(rows):
    """{(link, nodes): {label: (none's mean step / its mean step, beyond the seeds' spread?)}}."""
    found, order = {}, [name for name, _ in links.REAL_LINKS]
    for setting, methods in sorted(by_setting(rows).items(), key=lambda item: (order.index(item[0][0]), item[0][1])):
        none = step_spread(methods["none"]) if "none" in methods else None
        found[setting] = {name: (none["mean"] / step_spread(runs)["mean"], beyond_spread(step_spread(runs), none))
                          for name, runs in methods.items() if none}
    return found


def floor_share(none):
    """How far uncompressed DDP's step with the wire unpriced is over its step alone: the emulation's floor, as a
    share of the step alone (as the wire's share, the ratio, is)."""
    return float(none[0]["unpriced_step_s"]) / statistics.mean(float(r["alone_step_s"]) for r in none) - 1


def cpu_paced(none):
    """Whether the emulation's floor, not the link, sets much of these steps (links.paced_by_cpu)."""
    return links.paced_by_cpu(floor_share(none), float(none[0]["ratio"]))


def time_cell(reached, key, seeds):
    times = [reached.get((*key, seed)) for seed in seeds]
    if any(t is None for t in times):
        return f"not reached ({sum(t is None for t in times)} of {len(times)})"
    return with_range(spread(times), 1)


def cluster_table(rows, curves, skipped):
    reached = {target: times_to(curves, target) for target in TARGETS}
    text, faster = [], speedups(rows)
    for (link, nodes), methods in by_setting(rows).items():
        first = next(iter(methods.values()))[0]
        ratio, rate = float(first["ratio"]), float(first["rate_bits"])
        body, none = [], methods.get("none")
        for name, runs in methods.items():
            seeds = [r["seed"] for r in runs]
            model = statistics.mean(float(r["alone_step_s"]) + links.wire_seconds(
                nodes, float(r["bytes_per_step"]), rate, gathered=r["method"] in links.GATHERED) for r in runs) * 1e3
            ratio_to_none, beyond = faster[link, nodes].get(name, (None, False))
            body.append([name, f"{float(runs[0]['bytes_per_step']):,.0f}", with_range(step_spread(runs), 1),
                         f"{model:.1f}", f"{ratio_to_none:.2f}x{' (beyond the spread)' if beyond else ''}"
                         if ratio_to_none and name != "none" else "",
                         *(time_cell(reached[target], (link, nodes, name), seeds) for target in TARGETS),
                         with_range(spread([float(r["top1"]) for r in runs]))])
        reached_here = ""
        if none:
            alone = statistics.mean(float(r["alone_step_s"]) for r in none)
            reached_here = (f" (measured: its step is {step_spread(none)['mean'] / 1e3 / alone - 1:+.0%} over its "
                            f"step alone; with the wire unpriced, {floor_share(none):+.0%}"
                            + (f", more than {links.TRUSTED:.0%} of the wire's share: this machine's CPU, not the "
                               f"link, sets much of these steps" if cpu_paced(none) else "") + ")")
        text.append(f"**{link}, {nodes} nodes.** There, ResNet-50's all-reduce takes {ratio:.1%} of a node's "
                    f"computing time; here the link runs at {rate / 1e6:.1f} Mbit/s, at which uncompressed DDP's wire "
                    f"takes the same share of its step alone{reached_here}.\n\n" +
                    table(["method", "bytes a step", "step (ms)", "model (ms)", "step: none's / its",
                           *(f"seconds to {target:g} %" for target in TARGETS), "final top-1 (%)"], body))
    r = rows[0]
    text.append(f"{r['arch']} on the digits, {r['epochs']} epochs, global batch {r['global_batch']} split over the "
                f"nodes, one process a node, {len({x['seed'] for x in rows})} seeds: the mean, in brackets the lowest "
                f"and highest. A step: the median over the epochs of global batch / images/s. The model: the method's "
                f"step on one node alone plus its bytes' ring all-reduce (the fp8 hooks: a gather, n - 1 times a "
                f"rank's bytes through each link) at {links.payload_shares()[1]:.1%} of the link (TCP's payload). "
                f"\"Beyond the spread\": the method's range of step times does not overlap "
                f"uncompressed DDP's. The seconds to a target: training time to the first epoch's end at or above it.")
    for s in skipped:
        ratio = float(s["ratio"])
        text.append(f"Not emulated: {s['link']} at {s['nodes']} nodes. There the wire takes {ratio:.1%} of a node's "
                    f"computing time, so its link here would run at {float(s['rate_bits']) / 1e6:,.0f} Mbit/s, above "
                    f"{links.TRUSTED:.0%} of the virtual cluster's ceiling of {float(s['ceiling_bits']) / 1e6:,.0f} "
                    f"Mbit/s at {s['nodes']} nodes, the most it is trusted with (docs/results/cluster.md). Compression "
                    f"can save at most the wire's share of a step there: {ratio / (1 + ratio):.1%}.")
    return "\n\n".join(text)


def render(data):
    path = data / "compression_cluster.csv"
    if not path.exists():
        return {}
    skipped = data / "compression_cluster_skipped.csv"
    return {"compression-cluster": cluster_table(read_csv(path), read_csv(data / "compression_cluster_curves.csv"),
                                                 read_csv(skipped) if skipped.exists() else [])}


def headline(data):
    """Per real link and node count: the method that reaches the middle target soonest in every seed, against
    uncompressed DDP's time (beyond the seeds' spread, or not), or, where the link is beyond the emulation, what
    the wire's share leaves to gain."""
    path, skipped = data / "compression_cluster.csv", data / "compression_cluster_skipped.csv"
    if not path.exists():
        return []
    target = TARGETS[len(TARGETS) // 2]
    reached = times_to(read_csv(data / "compression_cluster_curves.csv"), target)
    by_link = {}
    for (link, nodes), methods in by_setting(read_csv(path)).items():
        times = {name: spread([reached[link, nodes, name, r["seed"]] for r in runs]) for name, runs in methods.items()
                 if all(reached.get((link, nodes, name, r["seed"])) is not None for r in runs)}
        if "none" not in times or len(times) < 2:
            continue
        name = min((n for n in times if n != "none"), key=lambda n: times[n]["mean"])
        ratio, beyond = times["none"]["mean"] / times[name]["mean"], beyond_spread(times[name], times["none"])
        by_link.setdefault(link.split(" (")[0], []).append(
            f"{name} {ratio:.2f}x sooner at {nodes} nodes" + ("" if beyond else " (within the seeds' spread)")
            + (" (this machine's CPU, not the link, sets much of the step there)" if cpu_paced(methods["none"])
               else ""))
    lines = [f"to {target:g} % top-1 on links sized as {link} is to ResNet-50 on V100 nodes, the soonest against "
             f"uncompressed DDP: {', '.join(said)}" for link, said in by_link.items()]
    beyond = read_csv(skipped) if skipped.exists() else []
    for link in dict.fromkeys(s["link"] for s in beyond):
        ratios = [float(s["ratio"]) for s in beyond if s["link"] == link]
        shares = f"{min(ratios):.1%}" + (f" to {max(ratios):.1%}" if max(ratios) > min(ratios) else "")
        lines.append(f"on {link} the wire is {shares} of a node's computing time: at most "
                     f"{max(r / (1 + r) for r in ratios):.1%} of a step to gain (not emulated: beyond this machine's "
                     f"ceiling)")
    return lines
