"""pipeline: pipelined replicas per sync method, layout and stragglers, beside the expected-maximum model,
and the bubble (scripts/bench_pipeline.py).

    reads    figures/data/pipeline.csv, pipeline_curves.csv
    draws    figures/pipeline.png
    writes   RESULTS.md's pipeline-sync, pipeline-model, pipeline-targets, pipeline-bubble
"""

import statistics

from scripts import bench_pipeline  # (the expected-maximum model of stragglers)
from scripts.results.common import mean_of, plt, read_csv, save, spread, table, targets_held, with_range


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
        steps = bench_pipeline.steps_of(runs)
        predicted = c / (c + bench_pipeline.expected_delay(sync, replicas, stages, microbatches, steps, x=hetero))
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
                         f"{measured['mean']:.2f} vs {predicted:.2f} ({off:+.1%})", "yes" if abs(off) <= 0.15 else "NO"])
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
        predicted = [(r, mean_of(groups[key], "updates_per_s") * c / (c + bench_pipeline.expected_delay(
            sync, r, 1, 1, bench_pipeline.steps_of(groups[key]), x=hetero)))
            for r in sorted({key[1] for key in groups if key[0] == 1}) for key in [(1, r, sync, 0.0)] if key in groups
            for c in [mean_of(groups[key], "step_s")] for hetero in [max(k[3] for k in groups)]]
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


def render(data, figures, missing):
    rows = read_csv(data / "pipeline.csv") if (data / "pipeline.csv").exists() else []
    if not rows:
        missing.append("pipeline.csv (scripts/bench_pipeline.py)")
        return {}
    curves = read_csv(data / "pipeline_curves.csv") if (data / "pipeline_curves.csv").exists() else []
    plot_pipeline(rows, curves, figures)
    return pipeline_tables(rows)


def headline(data):
    if not (data / "pipeline.csv").exists():
        return None
    groups = pipeline_groups(read_csv(data / "pipeline.csv"))
    straggled = {key[2]: key for key in groups if key[:2] == (1, 8) and key[3] and key[2] in ("preduce", "allreduce")}
    if len(straggled) < 2:
        return None
    speed = ratios(groups, straggled["preduce"], straggled["allreduce"])
    held, total = targets_held(pipeline_targets(groups, pipeline_model_rows(groups)))
    return (f"8 replicas with stragglers: partial reduce at {speed['mean']:.2f}x allreduce's updates/s; {held} of its "
            f"{total} targets hold")
