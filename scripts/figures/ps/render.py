"""ps: the parameter server against Byzantine workers, per figure of its authors, run and seed
(scripts/figures/ps/table.py), its targets and ByzFL's benchmark beside it (scripts/figures/ps/render_targets.py).

    reads    figures/data/ps.csv, ps_byzfl.csv, ps_why.csv (ps_why.py)
    draws    figures/ps.png, ps_eta.png (scripts/figures/ps/render_targets.py)
    writes   sections ps-sync-1v, ps-sync-2v, ps-async-1v, ps-async-2v, ps-zeno, ps-zeno-pp, ps-rejections,
             ps-batch, ps-eta, ps-speed, ps-targets, ps-byzfl, ps-why-* (ps_why.py)
"""

import statistics

from scripts.figures.ps.render_targets import plot_ps, ps_byzfl_table, ps_targets  # (the part's second half)
from scripts.figures.ps.render_why import why_sections  # (and why its misses miss)
from scripts.figures.ps.rows import MATRICES, VALIDATED, finished, ps_groups, ps_top1, top1_or_chance
from scripts.figures.rendering import beyond_spread, read_csv, spread, table, targets_held, with_range

def rejected(runs, who, by="_params"):
    """'25 (20-30)': the share (%) of `who`'s (honest or byzantine) pushed tensors (by="_tensors"), parameters
    ("_params") or pushes ("") that the rule dropped, its mean over the seeds' runs and its range."""
    rates = [100 * float(r[f"{who}{by}_rejected"]) / float(r[f"{who}{by}_pushed"]) for r in finished(runs)
             if r.get(f"{who}{by}_pushed") not in (None, "", "0", "0.0")]
    return with_range(spread(rates), 0) if rates else ""


def baseline_in(groups, aggregate):
    """The plain rule a rule is compared with: the mean with the same local steps and batch, where there is one
    (async zenops: ZenoPS's own baseline, naive-async)."""
    same = "mean" + aggregate[aggregate.index(","):] if "," in aggregate else "mean"
    for plain in (same, "mean, 1 step" if "1 step" in aggregate else "mean", "naive-async"):
        if any(key[0] == plain for key in groups):
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
                     "async `zenops`, `naive-async`) under the same attack, a diverged run counted as chance (10 %), "
                     "better: " + ("; ".join(better) or "none") +
                     ". Worse: " + ("; ".join(worse) or "none") + ".")
        sections[f"ps-{part.replace('++', '-pp')}"] = text
    body = []
    for part in MATRICES:
        for (aggregate, attack), runs in ps_groups(rows, part).items():
            if aggregate.split(",")[0] in VALIDATED:
                rule = f"`{aggregate}`" + (" (reversed or damped, not dropped)" if part.startswith("async") else "")
                body.append([part, rule, attack, *(rejected(runs, who, by) if who == "honest" or attack != "none"
                                                   else "" for who in ("honest", "byzantine")
                                                   for by in ("_tensors", "_params"))])
    sections["ps-rejections"] = (
        table(["part", "rule", "attack", "honest tensors", "honest parameters", "poisoned tensors",
               "poisoned parameters"], body) +
        "\n\nRejected (%): the share of the honest and of the poisoned tensors the workers pushed, and of their "
        "parameters, that the rule did not pass; the mean over the seeds and in brackets the lowest and highest. "
        "Async `zenops` rejects nothing whole: what it counts as rejected is applied reversed or damped (its score "
        "below eta: alpha s u). `zeno` and `zeno++` judge a push whole, so its tensors go together; `zeno` drops "
        "the b lowest-scoring of every round's pushes whatever they are, so without an attack it rejects b of the "
        "8 honest pushes by construction.")
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


def ps_batch(rows):
    """sync-1v's zenops without an attack at the workers' batch of 8, 16 and 32: its honest rejections."""
    runs = [("8", ps_groups(rows, "sync-1v").get(("zenops", "none"), []))]
    runs += [(aggregate.split()[-1], group) for (aggregate, _), group in ps_groups(rows, "batch").items()]
    body = [[batch, group[0]["epochs"], ps_top1(group), rejected(group, "honest", "_tensors"),
             rejected(group, "honest")] for batch, group in runs if group]
    return (table(["batch", "epochs", "val top-1 (%)", "honest tensors rejected (%)", "honest parameters rejected (%)"],
                  body) +
            "\n\nsync `zenops`, one validator, each worker a round with probability 0.5, 8 local steps a push, no "
            "attack, at the workers' (and the validator's) batch; at 16 and 32 for more epochs (and a longer "
            "warm-up), so that every batch trains as many rounds, at the same learning rate a step. ZenoPS's runs "
            "use 32. The mean over the seeds, in "
            "brackets the lowest and highest.")


def render(data, figures, missing):
    rows = read_csv(data / "ps.csv") if (data / "ps.csv").exists() else []
    if not rows:
        missing.append("ps.csv (scripts/figures/ps/measure.py)")
        return {}
    plot_ps(rows, figures)
    sections = {**ps_tables(rows), "ps-targets": ps_targets(rows)}
    if (data / "ps_byzfl.csv").exists():
        sections["ps-byzfl"] = ps_byzfl_table(read_csv(data / "ps_byzfl.csv"), rows)
    else:
        missing.append("ps_byzfl.csv (scripts/figures/ps/byzfl_reference.py)")
    return {**sections, **why_sections(data, missing, rows)}


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
    rows = read_csv(data / "ps.csv")
    groups = ps_groups(rows, "sync-1v")
    attacked, clean, mean = (groups.get(key, []) for key in (("zenops", "signflip x6"), ("zenops", "none"),
                                                                ("mean", "signflip x6")))
    ratios = speed_vs_ddp(rows).get("ps sync, mean, 1 step", ([], []))[1]  # (the speed table's, seed by seed)
    if not (attacked and clean and mean and ratios):
        return None
    mean_text = (f"the plain mean diverges in {len(mean) - len(finished(mean))} of {len(mean)} seeds"
                 if len(finished(mean)) < len(mean) else f"the plain mean {ps_top1(mean)}")
    ratio = statistics.mean(ratios)
    held, total = targets_held(ps_targets(rows))
    return (f"ZenoPS sync, one validator, each of 8 workers flipping each tensor of a push x6 with p 0.2: top-1 "
            f"{ps_top1(attacked)} % for zenops, where {mean_text}; without an attack zenops {ps_top1(clean)} %; the "
            f"server at {ratio:.2f}x ddp's images/s (mean, a push a step); {held} of {total} targets hold")
