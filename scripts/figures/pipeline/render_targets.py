"""The pipeline part's second half: the model of what stragglers cost beside the measurements, and the targets.

    reads    figures/data/pipeline.csv (through pipeline.py)
    writes   sections pipeline-model (its rows), pipeline-targets
"""

from scripts.figures.pipeline import measure as pipeline_measure  # (the model of what stragglers cost)
from scripts.figures.rendering import beyond_spread, mean_of, spread, table, with_range

LAYOUTS = pipeline_measure.LAYOUTS  # (stages, replicas), in the order of the tables


def pipeline_groups(rows, part="sync"):
    """{(stages, replicas, schedule, sync, stragglers): runs, one per seed} of one part of pipeline.csv (sync: lenet;
    vit: the transformer), in the order run."""
    groups = {}
    for r in rows:
        if r["part"] == part:
            key = (int(r["stages"]), int(r["replicas"]), r["schedule"], r["sync"], float(r["hetero"]) > 0)
            groups.setdefault(key, []).append(r)
    return groups


def ratios(groups, key, base, field="updates_per_s"):
    """field of the runs of `key` over those of `base`, seed by seed (a spread), or None."""
    plain = {r["seed"]: float(r[field]) for r in groups.get(base, [])}
    values = [float(r[field]) / plain[r["seed"]] for r in groups.get(key, []) if r["seed"] in plain]
    return spread(values) if values else None


def of(runs, field):  # one field over the seeds
    return spread([float(r[field]) for r in runs])


def pipeline_model_rows(groups):
    """Per layout, schedule and sync method with stragglers: c (the step without them), X, the trainers and the
    cores, the model's updates/s with over without, and the measured ratio seed by seed."""
    body = []
    for (stages, replicas, schedule, sync, stragglers), runs in groups.items():
        base = (stages, replicas, schedule, sync, False)
        if not stragglers or base not in groups:
            continue
        c, x, cores = mean_of(groups[base], "step_s"), float(runs[0]["hetero"]), int(runs[0]["cores"])
        step = pipeline_measure.expected_step(sync, c, replicas, stages, pipeline_measure.steps_of(runs), x,
                                            processes=stages * replicas, cores=cores)
        body.append(((stages, replicas, schedule, sync), c, x, cores, c / step,
                     ratios(groups, (stages, replicas, schedule, sync, True), base)))
    return body


def pipeline_targets(groups, model_rows):
    """The targets, each with its numbers and whether it holds."""
    rows = []
    predicted = {key: prediction for key, _, _, _, prediction, _ in model_rows}

    def model_rate(key):  # updates/s without stragglers x the model's ratio
        return mean_of(groups[(*key, False)], "updates_per_s") * predicted.get(key, float("nan"))
    for stages, replicas in ((2, 2), (2, 4)):  # R x S = 2 x 2 and 4 x 2
        fast, slow = (groups.get((stages, replicas, "pipedream", s, True)) for s in ("preduce", "allreduce"))
        if fast and slow:
            a, b = of(fast, "updates_per_s"), of(slow, "updates_per_s")
            model_ratio = model_rate((stages, replicas, "pipedream", "preduce")) / model_rate(
                (stages, replicas, "pipedream", "allreduce"))
            rows.append([f"{replicas} x {stages}, pipedream, stragglers: `preduce` faster than `allreduce` beyond "
                         "the seeds' spread", f"{with_range(a, 1)} vs {with_range(b, 1)} updates/s "
                         f"({a['mean'] / b['mean']:.2f}x; model {model_ratio:.2f}x)",
                         "yes" if beyond_spread(a, b) and a["mean"] > b["mean"] else "NO"])
    for sync in pipeline_measure.SYNCS:
        pipedream, flushed = (groups.get((2, 2, schedule, sync, False)) for schedule in ("pipedream", "1f1b"))
        if pipedream and flushed:
            a, b = of(pipedream, "top1"), of(flushed, "top1")
            rows.append([f"2 x 2, `{sync}`: pipedream's top-1 within the seeds' spread of 1f1b's",
                         f"{with_range(a)} vs {with_range(b)}",
                         "yes" if a["low"] <= b["high"] and b["low"] <= a["high"] else "NO"])
    for stages, replicas in LAYOUTS:
        base = (stages, replicas, "pipedream", "allreduce", False)
        key = (stages, replicas, "pipedream", "preduce", False)
        if key in groups and base in groups:
            ratio = ratios(groups, key, base)
            rows.append([f"{replicas} x {stages}, pipedream, no stragglers: `preduce` within 10 % of `allreduce`",
                         with_range(ratio), "yes" if abs(ratio["mean"] - 1) <= 0.10 else "NO"])
        near = [(sync, measured["mean"] / prediction - 1) for (s, r, schedule, sync), _, _, _, prediction, measured
                in model_rows if (s, r, schedule) == (stages, replicas, "pipedream")]
        if near:
            rows.append([f"{replicas} x {stages}, pipedream, stragglers: the model within 15 % for every method",
                         ", ".join(f"`{sync}` {off:+.0%}" for sync, off in near),
                         "yes" if all(abs(off) <= 0.15 for _, off in near) else "NO"])
    return table(["target", "measured", "holds"], rows)


