"""pipeline: pipelined replicas per sync method, layout, schedule and stragglers, beside the model of what
stragglers cost (scripts/figures/pipeline/render_targets.py), and the bubble (scripts/figures/pipeline/measure.py).

    reads    figures/data/pipeline.csv, pipeline_curves.csv
    draws    figures/pipeline.png
    writes   sections pipeline-sync, pipeline-model, pipeline-targets, pipeline-vit, pipeline-bubble,
             pipeline-time (render_time.py: pipeline_time.csv, figures/pipeline_time.png), pipeline-cluster
             (render_cluster.py), pipeline-data (render_data.py), pipeline-bert (render_bert.py), and
             pipeline-deviations (recipes/pipeline/deviations.py)
"""

from recipes.pipeline.deviations import AUTHORS_COMMIT, DEVIATIONS, FILES
from recipes.pipeline.sync import STOP_CHECKS_EVERY
from scripts.figures.pipeline import measure as pipeline_measure, render_bert, render_cluster, render_data, render_time
from scripts.figures.rendering import mean_of, plt, read_csv, save, spread, table, targets_held, with_range
from scripts.figures.pipeline.render_targets import (LAYOUTS, of, pipeline_groups, pipeline_model_rows,
                                              pipeline_targets, ratios)

def pipeline_tables(rows):
    """The pipeline sections: the methods per layout and schedule with and without stragglers, the model,
    the targets; the bubble against M."""
    groups = pipeline_groups(rows)
    sections = {}
    if groups:
        first = next(iter(groups.values()))[0]
        target, body = float(first["target"]), []
        for (stages, replicas, schedule, sync, stragglers), runs in sorted(
                groups.items(), key=lambda item: (LAYOUTS.index(item[0][:2]), item[0][2] != "pipedream",
                                                  item[0][4], pipeline_measure.SYNCS.index(item[0][3]))):
            reached = [float(r["seconds_to_target"]) for r in runs if r["seconds_to_target"] != ""]
            some = f" ({len(reached)} of {len(runs)})" if len(reached) < len(runs) else ""
            body.append([f"{replicas} x {stages}", schedule, f"`{sync}`",
                         f"{float(runs[0]['hetero']):g} s" if stragglers else "none", len(runs),
                         with_range(of(runs, "updates_per_s"), 0),
                         with_range(spread(reached), 1) + some if reached else "not reached",
                         with_range(of(runs, "top1")),
                         f"{mean_of(runs, 'mean_group_size'):.2f}" if sync == "preduce" else "",
                         f"{mean_of(runs, 'waits'):.1f}", f"{mean_of(runs, 'disagreement'):.4f}"])
        sections["pipeline-sync"] = (
            table(["replicas x stages", "schedule", "sync", "stragglers X", "seeds", "updates/s",
                   f"seconds to {target:g} % top-1", "final top-1", "group size", "waits", "disagreement"], body) +
            f"\n\nlenet on the digits, -b {first['batch']} per replica, {first['epochs']} epoch(s), one thread per "
            f"process on {first['cores']} cores (`hetpipe`: and one server per stage). Each value is the mean over "
            f"the seeds, in brackets the lowest and highest. updates/s: replicas' minibatches per second of "
            f"training, all replicas together; seconds to {target:g} %: training and evaluation until the first "
            f"epoch whose top-1 reaches it; group size: `preduce`'s mean group, single replicas included; waits: "
            f"syncs per stage in which a replica was held up by a straggling one; disagreement: the replicas' mean "
            f"L2 distance from their average weights before the last epoch's end." + stop_checks(rows))
        model_rows = pipeline_model_rows(groups)
        sections["pipeline-model"] = table(
            ["replicas x stages", "schedule", "sync", "trainers / cores", "c without stragglers (s)", "X (s)",
             "c / X", "model: updates/s with over without", "measured (seeds)", "off"],
            [[f"{r} x {s}", schedule, f"`{sync}`", f"{s * r} / {cores}", f"{c:.4f}", f"{x:g}", f"{c / x:.2f}",
              f"{predicted:.2f}", with_range(measured), f"{measured['mean'] / predicted - 1:+.0%}"]
             for (s, r, schedule, sync), c, x, cores, predicted, measured in model_rows])
        sections["pipeline-targets"] = pipeline_targets(groups, model_rows)
    if pipeline_groups(rows, "vit"):
        sections["pipeline-vit"] = pipeline_vit(pipeline_groups(rows, "vit"))
    bubble = [r for r in rows if r["part"] == "bubble"]
    if bubble:
        stages = int(bubble[0]["stages"])
        rate = {(r["schedule"], int(r["microbatches"])): float(r["images_per_s"]) for r in bubble}
        largest = max(m for _, m in rate)
        body = []
        for m in sorted({m for _, m in rate}):
            measured = [f"{rate[s, m]:.0f} ({rate[s, m] / rate[s, largest]:.2f})" if (s, m) in rate and
                        (s, largest) in rate else "" for s in ("gpipe", "1f1b")]
            relative = (m / (m + stages - 1)) / (largest / (largest + stages - 1))  # no stage idle, against M's
            body.append([m, f"{(stages - 1) / (m + stages - 1):.2f}", f"{relative:.2f}", *measured])
        sections["pipeline-bubble"] = (
            table(["microbatches M", "bubble (S - 1) / (M + S - 1)", "model: images/s relative to M = "
                   f"{largest}", "gpipe images/s (relative)", "1f1b images/s (relative)"], body) +
            f"\n\nOne replica of {stages} stages, lenet on the digits, -b {bubble[0]['batch']}, one epoch; in "
            f"brackets each schedule's images/s relative to its own at M = {largest}. 1f1b needs M >= S.")
    return sections


def preduce_over_allreduce(groups, layouts):
    """[(stages, replicas, updates/s of preduce over allreduce's, seed by seed)] under pipedream with stragglers,
    for the layouts measured."""
    found = [(s, r, ratios(groups, (s, r, "pipedream", "preduce", True), (s, r, "pipedream", "allreduce", True)))
             for s, r in layouts]
    return [(s, r, ratio) for s, r, ratio in found if ratio]


def pipeline_vit(groups):
    """The transformer's section: each layout and sync method without and with stragglers, beside the model of
    what they cost, and preduce's updates/s over allreduce's with them."""
    model = {key: (predicted, measured) for key, _, _, _, predicted, measured in pipeline_model_rows(groups)}
    body, none = [], (None, None)
    for (stages, replicas, schedule, sync, stragglers), runs in sorted(
            groups.items(), key=lambda item: (LAYOUTS.index(item[0][:2]), item[0][4],
                                              pipeline_measure.SYNCS.index(item[0][3]))):
        predicted, measured = model.get((stages, replicas, schedule, sync), none) if stragglers else none
        x = f"{float(runs[0]['hetero']):g} s" if stragglers else "none"
        body.append([f"{replicas} x {stages}", f"`{sync}`", x, len(runs), with_range(of(runs, "updates_per_s"), 0),
                     with_range(of(runs, "top1")),
                     f"{mean_of(runs, 'waits'):.1f}", f"{predicted:.2f}" if predicted else "",
                     with_range(measured) if measured else ""])
    first = next(iter(groups.values()))[0]
    faster = [f"{ratio['mean']:.2f}x ({ratio['low']:.2f}–{ratio['high']:.2f}) at {r} x {s}"
              for s, r, ratio in preduce_over_allreduce(groups, pipeline_measure.VIT_LAYOUTS)]
    return (table(["replicas x stages", "sync", "stragglers X", "seeds", "updates/s", "final top-1", "waits",
                   "model: updates/s with over without", "measured (seeds)"], body) +
            f"\n\nvit_tiny (8 pre-norm blocks of width 64 over a 7 x 7 grid of patches and a class token; each "
            f"stage the same number of blocks) on the digits at 28 px, pipedream, -b {first['batch']} per replica, "
            f"{first['epochs']} epoch(s), one thread per process on {first['cores']} cores; X sized as for lenet, "
            f"from the transformer's own step without stragglers. Mean over the seeds, in brackets the lowest and "
            f"highest. With stragglers, `preduce` over `allreduce`, updates/s seed by seed: "
            f"{'; '.join(faster) or 'not measured'}.")


def plot_pipeline(rows, figures):
    """Updates/s with stragglers over without, per layout and sync method under pipedream, beside the model; and
    images/s against M."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    model_rows = [row for row in pipeline_model_rows(pipeline_groups(rows)) if row[0][2] == "pipedream"]
    labels = [f"{r}x{s}" for s, r in LAYOUTS if any(row[0][:2] == (s, r) for row in model_rows)]
    for i, sync in enumerate(pipeline_measure.SYNCS):
        points = [(f"{key[1]}x{key[0]}", measured["mean"], predicted) for key, _, _, _, predicted, measured
                  in model_rows if key[3] == sync]
        if points:
            at = [labels.index(label) + 0.15 * (i - 1.5) for label, _, _ in points]
            left.plot(at, [m for _, m, _ in points], marker="o", linestyle="none", color=f"C{i}", label=sync)
            left.plot(at, [p for _, _, p in points], marker="x", linestyle="none", color=f"C{i}")
    left.set_xticks(range(len(labels)), labels)
    left.set(xlabel="replicas x stages (pipedream)", ylabel="updates/s with stragglers / without",
             title="What stragglers cost; x: the model")
    left.grid(alpha=0.3), left.legend(fontsize=7)
    bubble = [r for r in rows if r["part"] == "bubble"]
    for schedule in ("gpipe", "1f1b"):
        points = sorted((int(r["microbatches"]), float(r["images_per_s"])) for r in bubble if r["schedule"] == schedule)
        if points:
            right.plot(*zip(*points), marker="o", label=schedule)
    gpipe = sorted((int(r["microbatches"]), float(r["images_per_s"])) for r in bubble if r["schedule"] == "gpipe")
    if gpipe:
        stages, (largest, top) = int(bubble[0]["stages"]), gpipe[-1]
        right.plot([m for m, _ in gpipe], [top * (m / (m + stages - 1)) / (largest / (largest + stages - 1))
                                           for m, _ in gpipe], color="gray", linestyle=":",
                   label="model: 1 - (S - 1) / (M + S - 1), at gpipe's last")
    right.set_xscale("log", base=2)
    right.set(xlabel="microbatches M", ylabel="train images/s", title="The pipeline bubble, 1 replica x 2 stages")
    right.grid(alpha=0.3), right.legend(fontsize=7)
    save(fig, figures / "pipeline.png")


def stop_checks(rows):
    """How often the allreduce and adpsgd runs of every part checked for a stop (a collective of every rank), as
    their rows say: runs measured before the column checked at every step, and scored adpsgd on replica 0 alone."""
    periods = {r.get("stop_checks_every") or "every" for r in rows if r["sync"] in ("allreduce", "adpsgd")}
    if periods == {str(STOP_CHECKS_EVERY)}:
        return (f" In every part, `allreduce` and `adpsgd` checked for a stop (an allreduce of every rank) every "
                f"{STOP_CHECKS_EVERY}th step.")
    return (f" The `allreduce` and `adpsgd` rows of every part were measured with a check for a stop (an allreduce "
            f"of every rank) at {' or '.join(f'every {p}th' if p != 'every' else 'every' for p in sorted(periods))} "
            f"step (which holds every rank to the slowest of the job, a wait `adpsgd`'s model leaves out), and "
            f"`adpsgd`'s top-1 is replica 0's model's alone, where the recipe now checks every {STOP_CHECKS_EVERY}th "
            f"and pools each replica's own: `make figures ONLY=pipeline` measures them again.")


def deviations():
    """The recipe's deviations from SD-PIPE's code, as recipes/pipeline/deviations.py lists them."""
    files = "; ".join(f"{short} is `{path}`" for short, path in FILES.items())
    rows = [(row["here"], f"{row['theirs']} ({row['where']})", row["why"]) for row in DEVIATIONS]
    return (f"In Hsword/VLDB2023_SDPipe at {AUTHORS_COMMIT[:7]}, {files}.\n\n"
            + table(("here", "SD-PIPE (its files and lines)", "why"), rows))


def render(data, figures, missing):
    rows = read_csv(data / "pipeline.csv") if (data / "pipeline.csv").exists() else []
    if not rows:
        missing.append("pipeline.csv (scripts/figures/pipeline/measure.py)")
        return {"pipeline-deviations": deviations()}
    plot_pipeline(rows, figures)
    return {**pipeline_tables(rows), **render_time.render(data, figures), **render_cluster.render(data),
            **render_data.render(data), **render_bert.render(data, figures),
            "pipeline-deviations": deviations()}


def headline(data):
    if not (data / "pipeline.csv").exists():
        return None
    rows = read_csv(data / "pipeline.csv")
    groups = pipeline_groups(rows)
    speeds = preduce_over_allreduce(groups, ((2, 2), (2, 4)))
    if not speeds:
        return None
    held, total = targets_held(pipeline_targets(groups, pipeline_model_rows(groups)))
    cores = rows[0]["cores"]
    vit_speeds = preduce_over_allreduce(pipeline_groups(rows, "vit"), pipeline_measure.VIT_LAYOUTS)
    first = render_time.first_to_target(data)  # (time to a target: who gets there first, per layout)
    return ("PipeDream with stragglers (X sized to SD-PIPE's c / X): partial reduce at " +
            " and ".join(f"{speed['mean']:.2f}x ({r} x {s})" for s, r, speed in speeds) +
            f" allreduce's updates/s, on {cores} CPU cores shared by up to {max(s * r for s, r, _ in speeds)} "
            f"processes; {held} of its {total} targets hold" +
            ("; the transformer (vit_tiny): " + " and ".join(f"{speed['mean']:.2f}x ({r} x {s})"
                                                               for s, r, speed in vit_speeds) if vit_speeds else "") +
            (f"; {first}" if first else "") + (f"; {bert}" if (bert := render_bert.headline(data)) else "") +
            (f"; on the virtual cluster, {cluster}" if (cluster := render_time.first_to_target(
                data, "pipeline_cluster_time.csv")) else ""))
