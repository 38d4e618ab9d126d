"""ps: the parameter server against Byzantine workers, per figure of its authors, run and seed
(scripts/figures/ps/table.py), with its figures (table_plot.py) and targets (render_targets.py); the part's other
studies each by its render_<study>.py (ByzFL's benchmark, why the misses miss, ZenoPS on the virtual cluster).

    reads    figures/data/ps.csv, ps_byzfl.csv; ps_why.csv, ps_cluster.csv, ps_curves.csv (render_<study>.py)
    draws    figures/ps.png, ps_eta.png (table_plot.py), ps_curves.png; writes sections ps-<each MATRICES part>,
             -rejections, -batch, -eta, -speed, -targets, -byzfl, -deviations, -why-*, -cluster and -curves
"""

import statistics

from scripts.figures.ps import render_cluster, render_curves, render_deviations  # (the cluster; time; deviations)
from scripts.figures.ps.render_byzfl_reference import ps_byzfl_table  # (ByzFL's benchmark beside the table)
from scripts.figures.ps.render_targets import ps_batch, ps_targets  # (the table's targets and its batch part)
from scripts.figures.ps.render_why import why_sections  # (and why its misses miss)
from scripts.figures.ps.table_plot import plot_ps  # (the table's figures)
from scripts.figures.ps.table_rows import (INBOUND, MATRICES, VALIDATED, finished, naive_in_validators, pace,
                                           params_shares, ps_groups, ps_top1, rejected, sign_only, top1_or_chance)
from scripts.figures.rendering import beyond_spread, read_csv, spread, table, targets_held, with_range


def baseline_in(groups, aggregate):
    """The plain rule a rule is compared with: the mean with the same local steps and batch, where there is one
    (async zenops: ZenoPS's own baseline, naive-async, where ZenoPS runs it: in the validators; naive-async there:
    naive-async on the servers)."""
    same = "mean" + aggregate[aggregate.index(","):] if "," in aggregate else "mean"
    in_validators = naive_in_validators(groups) if aggregate in VALIDATED else None
    for plain in (same, "mean, 1 step" if "1 step" in aggregate else "mean", in_validators, "naive-async"):
        if plain and any(key[0] == plain for key in groups):
            return plain
    return "naive-async"


def ps_matrix(groups):
    """The top-1 table of one mode: a row per aggregation, a column per attack; and the sentence comparing each
    rule with the mean (of the same local steps) under the same attack (beyond the spread only)."""
    aggregates = list(dict.fromkeys(aggregate for aggregate, _ in groups))
    attacks = list(dict.fromkeys(attack for _, attack in groups))
    top1 = {key: spread([top1_or_chance(r) for r in runs]) for key, runs in groups.items()}  # (for judging)
    body = [[f"`{aggregate}`", *(ps_top1(groups[aggregate, attack]) if (aggregate, attack) in groups else ""
                                 for attack in attacks)] for aggregate in aggregates]
    header = ["aggregation", *attacks]
    better, worse = [], []
    for (aggregate, attack), result in top1.items():
        plain = baseline_in(groups, aggregate)
        mean = top1.get((plain, attack))
        if aggregate != plain and mean and beyond_spread(result, mean):
            (better if result["mean"] > mean["mean"] else worse).append(
                f"{aggregate} under {attack} ({result['mean'] - mean['mean']:+.1f})")
    return table(header, body), better, worse


def ps_tables(rows):
    """The parameter-server sections: a top-1 table per figure of the authors, the validators' rejections,
    the eta sweep beside the validation-data-only baseline, and ps against ddp in images/s."""
    sections, r = {}, rows[0]
    seeds = len({x["seed"] for x in rows})
    for part, stands_for in MATRICES.items():
        groups = ps_groups(rows, part)
        if not groups:
            continue
        text, better, worse = ps_matrix(groups)
        text += (f"\n\n{stands_for}. Final val top-1 (%) after {r['epochs']} epochs: the mean over {seeds} "
                 f"seed(s), in brackets the lowest and highest. A run that diverged (a non-finite loss) has no top-1: "
                 f"it is counted beside the others.")
        if seeds > 1:
            text += (" Beyond the spread of the plain rule beside it (`mean` of the same local steps and batch; for "
                     "async `zenops`, `naive-async` in the validators where measured, and for that, `naive-async` on "
                     "the servers) under the same attack, a diverged run counted as chance (10 %), better: " +
                     ("; ".join(better) or "none") + ". Worse: " + ("; ".join(worse) or "none") + ".")
        text += part_notes(part, groups)
        sections[f"ps-{part.replace('++', '-pp')}"] = text
    body = []
    for part in MATRICES:
        for (aggregate, attack), runs in ps_groups(rows, part).items():
            if aggregate.split(",")[0] in VALIDATED:
                rule = f"`{aggregate}`" + (" (reversed or damped, not dropped)" if part.startswith("async") else "")
                tests = [failed(runs, test) if aggregate == "zenops" and part.startswith("sync") and attack != "none"
                         else "" for test in ("norm", "sign")]
                body.append([part, rule, attack, *(rejected(runs, who, by) if who == "honest" or attack != "none"
                                                   else "" for who in ("honest", "byzantine")
                                                   for by in ("_tensors", "_params")), *tests])
    sections["ps-rejections"] = (
        table(["part", "rule", "attack", "honest tensors", "honest parameters", "poisoned tensors",
               "poisoned parameters", "poisoned parameters failing the norm test", "... the sign test"], body) +
        "\n\nRejected (%): the share of the honest and of the poisoned tensors the workers pushed, and of their "
        "parameters, that the rule did not pass; the mean over the seeds and in brackets the lowest and highest. "
        "Async `zenops` rejects nothing whole: what it counts as rejected is applied reversed or damped (its score "
        "below eta: alpha s u). `zeno` and `zeno++` judge a push whole, so its tensors go together; `zeno` drops "
        "the b lowest-scoring of every round's pushes whatever they are, so without an attack it rejects b of the "
        "8 honest pushes by construction. Sync `zenops` rejects a tensor that fails either of its tests: its norm "
        "test (mean(u^2) >= 1.6 mean(v^2)) or its sign test (mean(u v) <= eta mean(v^2)); the last two columns say "
        "which the poisoned parameters failed (one can fail both), where the runs counted it.")
    sections["ps-batch"] = ps_batch(rows)
    by_eta = {e: [x for x in rows if x["part"] == "eta" and x["zeno_eta"] == e] for e in sorted(
        {x["zeno_eta"] for x in rows if x["part"] == "eta" and x["zeno_eta"] != ""}, key=float, reverse=True)}
    top1 = {e: spread([float(x["top1"]) for x in finished(runs)]) for e, runs in by_eta.items() if finished(runs)}
    body = [[e, ps_top1(runs), rejected(runs, "honest"), rejected(runs, "byzantine")] for e, runs in by_eta.items()]
    baseline_runs = ps_groups(rows, "eta").get(("validation data only", "none"), [])
    baseline = spread([float(x["top1"]) for x in finished(baseline_runs)] or [float("nan")])
    body.append(["validation data only (nd)", ps_top1(baseline_runs) if baseline_runs else "", "", ""])
    best = max(top1, key=lambda e: top1[e]["mean"]) if top1 else None
    text = table(["--zeno-eta", "val top-1 (%)", "honest parameters rejected (%)", "poisoned parameters rejected (%)"],
                 body)
    if best is not None:
        tied = [e for e in top1 if e != best and not beyond_spread(top1[e], top1[best])]
        text += (f"\n\nsync `zenops` with two validators, 8 local steps a push, each tensor N(0, 1) with probability "
                 f"0.2 (ZenoPS's experiments_sync_tune_rho.sh). The best eta: {best} ({with_range(top1[best], 1)} %); "
                 f"within its spread (not told apart from it): {', '.join(tied) or 'none'}. Training on the "
                 f"validators' data alone: {with_range(baseline, 1)} %.")
    sections["ps-eta"] = text
    body = [[name, len(runs), with_range(spread([float(x["images_per_s"]) for x in runs]), 0),
             with_range(spread(ratios), 2) if ratios else ""] for name, (runs, ratios) in speed_vs_ddp(rows).items()]
    sections["ps-speed"] = (table(["run", "seeds", "train images/s", "vs ddp, seed by seed"], body) +
                            f"\n\n8 workers (ddp: 8 processes), global batch 64, one thread per process, on "
                            f"{r['cores']} cores, no attack; each run's images/s, the mean over the seeds and in "
                            f"brackets the lowest and highest. ps on one gradient a push pushes every step, as ddp "
                            f"allreduces every step; on 8 local steps, an eighth as often. Each seed's three runs "
                            f"follow one another, so the ratio carries this shared machine's noise: read its "
                            f"range, not only its mean.")
    return sections


def failed(runs, test):
    """'25 (20-30)': the share (%) of the poisoned parameters pushed that failed zenops' norm or sign test, over the
    seeds' runs that counted it."""
    rates = params_shares(runs, "byzantine", f"failed_{test}")
    return with_range(spread(rates), 0) if rates else ""


def part_notes(part, groups):
    """What a part's table says beside its numbers: the learning rate its rows ran at (zeno++), where its
    naive-async ran (async), the attacks built to slip past zenops (sync)."""
    runs = [r for group in groups.values() for r in group]
    if part == "zeno++":
        rates = sorted({(r["lr"], r["momentum"]) for r in runs if r.get("lr")})
        return "" if not rates else " The servers' SGD: " + "; ".join(
            f"--lr {lr} for 256 images ({float(lr) * 128 / 256:g} for a batch of 128) with momentum {momentum}"
            for lr, momentum in rates) + " (Zeno++'s authors: 0.1 for 128, no momentum), at a batch of 8 and of 32."
    if part.startswith("async") and (naive := naive_in_validators(groups)):
        return (f" `{naive}`: alpha u applied as on the servers, but scaled and forwarded by the validators, where "
                f"ZenoPS runs its baseline (the hop adds staleness); they compute v as `zenops`' do, unused, as "
                f"ZenoPS's: {pace(groups, naive):.0f} images/s against `zenops`' {pace(groups, 'zenops'):.0f}.")
    if part.startswith("sync") and any(attack in INBOUND for _, attack in groups):
        return (" The last two attacks are built to slip past zenops: 4 of 8 workers flip every push x 1.2 (1.44 < "
                "1.6: the norm test passes it where the update is no longer than v), or push ALIE (Baruch et "
                "al.'s, mean - 1.15 std of the 4 liars' own updates, coordinate by coordinate: the paper's z_max).")
    return ""


def render(data, figures, missing):
    rows = read_csv(data / "ps.csv") if (data / "ps.csv").exists() else []
    if not rows:
        missing.append("ps.csv (scripts/figures/ps/measure.py)")
        return render_deviations.render()
    plot_ps(rows, figures)
    sections = {**ps_tables(rows), "ps-targets": ps_targets(rows), **render_deviations.render()}
    if (data / "ps_byzfl.csv").exists():
        sections["ps-byzfl"] = ps_byzfl_table(read_csv(data / "ps_byzfl.csv"), rows)
    else:
        missing.append("ps_byzfl.csv (scripts/figures/ps/byzfl_reference.py)")
    return {**sections, **why_sections(data, missing, rows), **render_cluster.render(data),
            **render_curves.render(data, figures)}


def speed_vs_ddp(rows):
    """{speed run: (its finished runs, its images/s over ddp's of the same seed)}, in the order they ran."""
    speed = {x: finished([y for y in rows if y["part"] == "speed" and y["aggregate"] == x])
             for x in dict.fromkeys(y["aggregate"] for y in rows if y["part"] == "speed")}
    ddp = {x["seed"]: float(x["images_per_s"]) for x in speed.get("ddp", [])}
    return {name: (runs, [float(x["images_per_s"]) / ddp[x["seed"]] for x in runs if x["seed"] in ddp])
            for name, runs in speed.items()}


def headline(data):
    """sync-1v under sign flip x6 (zenops against the mean), zenops without an attack, ps's speed against ddp's."""
    if not (data / "ps.csv").exists():
        return None
    groups = ps_groups(rows := read_csv(data / "ps.csv"), "sync-1v")
    attacked, clean, mean, plain = (groups.get(key, []) for key in (("zenops", "signflip x6"), ("zenops", "none"),
                                                                     ("mean", "signflip x6"), ("mean", "none")))
    ratios = speed_vs_ddp(rows).get("ps sync, mean, 1 step", ([], []))[1]  # (the speed table's, seed by seed)
    if not (attacked and finished(clean) and mean and finished(plain) and ratios):
        return None
    paces = [render_cluster.images_per_s(runs) for runs in (clean, plain)]  # (the validator's cost)
    mean_text = (f"the plain mean diverges in {len(mean) - len(finished(mean))} of {len(mean)} seeds"
                 if len(finished(mean)) < len(mean) else f"the plain mean {ps_top1(mean)}")
    held, total = targets_held(ps_targets(rows))
    inbound, inbound_mean = (groups.get((rule, INBOUND[0]), []) for rule in ("zenops", "mean"))
    inside = "" if not (inbound and inbound_mean and (sign := sign_only(inbound))) else (
        f"; 4 of 8 flipping every push x1.2 (built to pass the norm test): zenops {ps_top1(inbound)} %, its sign test "
        f"rejecting {statistics.mean(sign):.0f} % of the poisoned parameters the norm test passed; the mean "
        + (f"diverging in {len(inbound_mean) - len(finished(inbound_mean))} of {len(inbound_mean)} seeds"
           if len(finished(inbound_mean)) < len(inbound_mean) else f"{ps_top1(inbound_mean)} %"))
    return (f"ZenoPS sync, one validator, each of 8 workers flipping each tensor of a push x6 with p 0.2: top-1 "
            f"{ps_top1(attacked)} % for zenops, where {mean_text}; without an attack zenops {ps_top1(clean)} %, at "
            f"{paces[0]['mean'] / paces[1]['mean']:.2f}x the mean's images/s (the validator's cost, "
            f"{'beyond' if beyond_spread(*paces) else 'within'} the seeds' spread){inside}; the server at "
            f"{statistics.mean(ratios):.2f}x ddp's images/s (mean, a push a step); {held} of {total} targets hold"
            + (f"; {on_a_cluster}" if (on_a_cluster := render_cluster.headline(data)) else ""))
