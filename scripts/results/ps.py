"""ps: the parameter server against Byzantine workers, per run and seed (scripts/bench_ps.py), its targets
and ByzFL's benchmark beside it (ps_targets.py).

    reads    figures/data/ps.csv, ps_byzfl.csv
    draws    figures/ps.png, ps_eta.png (ps_targets.py)
    writes   RESULTS.md's ps-sync, ps-async, ps-eta, ps-speed, ps-targets, ps-byzfl
"""

from scripts.results.common import beyond_spread, read_csv, spread, table, targets_held, with_range


def ps_attacks(rows, parts=("sync", "async")):
    """The attacks of those parts of ps.csv, in the order the script ran them."""
    return list(dict.fromkeys(r["attack"] for r in rows if r["part"] in parts))


def ps_groups(rows, part):
    """{(aggregate, attack): that row's runs, one per seed} of one part of ps.csv, in the order the script ran them."""
    groups = {}
    for r in rows:
        if r["part"] == part:
            groups.setdefault((r["aggregate"], r["attack"]), []).append(r)
    return groups


def finished(runs):
    """The runs that did not diverge (ps.csv: diverged = 1, no top-1)."""
    return [r for r in runs if r.get("diverged", "0") != "1"]


def ps_top1(runs):
    """'91.0 (90.0-92.0)' over the seeds that finished, and how many diverged."""
    done = finished(runs)
    text = with_range(spread([float(r["top1"]) for r in done]), 1) if done else "diverged"
    return text + (f" ({len(runs) - len(done)} of {len(runs)} diverged)" if done and len(done) < len(runs) else "")


def rejected(runs, who):
    """'25 (20-30)': the share (%) of `who`'s (honest or byzantine) pushed updates that the rule dropped, its mean
    over the seeds' runs and its range."""
    rates = [100 * float(r[f"{who}_rejected"]) / int(r[f"{who}_pushed"]) for r in finished(runs)
             if int(r[f"{who}_pushed"])]
    return with_range(spread(rates), 0) if rates else ""


def mean_of_its_kind(aggregate):
    """The plain mean a rule is compared with: the one with the same local steps."""
    return "mean, 1 step" if aggregate.endswith("1 step") else "mean"


def ps_matrix(groups):
    """The top-1 table of one mode: a row per aggregation, a column per attack; and the sentence comparing each
    rule with the mean (of the same local steps) under the same attack (beyond the spread only)."""
    aggregates = list(dict.fromkeys(aggregate for aggregate, _ in groups))
    attacks = list(dict.fromkeys(attack for _, attack in groups))
    top1 = {key: spread([float(r["top1"]) for r in finished(runs)]) for key, runs in groups.items() if finished(runs)}
    body = [[f"`{aggregate}`", *(ps_top1(groups[aggregate, attack]) if (aggregate, attack) in groups else ""
                                 for attack in attacks)] for aggregate in aggregates]
    header = ["aggregation", *attacks]
    better, worse = [], []
    for (aggregate, attack), result in top1.items():
        mean = top1.get((mean_of_its_kind(aggregate), attack))
        if not aggregate.startswith("mean") and (mean_of_its_kind(aggregate), attack) in groups and not mean:
            better.append(f"{aggregate} under {attack} (the mean diverged)")
        if not aggregate.startswith("mean") and mean and beyond_spread(result, mean):
            (better if result["mean"] > mean["mean"] else worse).append(
                f"{aggregate} under {attack} ({result['mean'] - mean['mean']:+.1f})")
    return table(header, body), better, worse


def ps_tables(rows):
    """RESULTS.md's parameter-server sections: sync and async top-1, the Zeno rules' rejections, the eta sweep
    beside the validation-data-only baseline, and ps against ddp in images/s."""
    sections, r = {}, rows[0]
    seeds = len({x["seed"] for x in rows})
    for mode in ("sync", "async"):
        text, better, worse = ps_matrix(ps_groups(rows, mode))
        text += (f"\n\nFinal val top-1 (%) after {r['epochs']} epochs: the mean over {seeds} seed(s), in brackets the "
                 f"lowest and highest. A run that diverged (a non-finite loss) has no top-1: it is counted beside "
                 f"the others.")
        if seeds > 1:
            text += (" Beyond the spread of `mean` (of the same local steps) under the same attack, better: " +
                     ("; ".join(better) or "none") +
                     ". Worse: " + ("; ".join(worse) or "none") + ".")
        sections[f"ps-{mode}"] = text
    validated = [(mode, aggregate) for mode in ("sync", "async") for aggregate in
                 dict.fromkeys(key[0] for key in ps_groups(rows, mode)) if aggregate.startswith("zeno")]
    body = []
    for mode, aggregate in validated:
        groups = ps_groups(rows, mode)
        attacks = ps_attacks(rows, (mode,))
        body.append([mode, f"`{aggregate}`", *(
            (rejected(groups[aggregate, a], "honest") +
             ("" if a == "none" else f" / {rejected(groups[aggregate, a], 'byzantine')}"))
            if (aggregate, a) in groups else "" for a in attacks)])
    sync_attacks, async_attacks = ps_attacks(rows, ("sync",)), ps_attacks(rows, ("async",))
    columns = max(len(sync_attacks), len(async_attacks))
    header = ["mode", "rule", *(" / ".join(dict.fromkeys(names[i] for names in (sync_attacks, async_attacks)
                                                          if i < len(names))) for i in range(columns))]
    sections["ps-rejections"] = (
        table(header, [line + [""] * (len(header) - len(line)) for line in body]) +
        "\n\nRejected updates (%): honest / Byzantine, of the updates each kind of worker pushed (zenops judges "
        "tensor by tensor: a push counts as the share of its tensors rejected); the mean over the seeds and in "
        "brackets the lowest and highest. `zeno` drops the b = 2 lowest-scoring of every 8, whatever they are, so "
        "it rejects 25 % in all.")
    eta = ps_groups(rows, "eta")
    etas = sorted({x["zeno_eta"] for x in rows if x["part"] == "eta" and x["zeno_eta"] != ""}, key=float,
                  reverse=True)
    by_eta = {e: [x for x in rows if x["part"] == "eta" and x["zeno_eta"] == e] for e in etas}
    top1 = {e: spread([float(x["top1"]) for x in finished(runs)]) for e, runs in by_eta.items() if finished(runs)}
    body = [[e, ps_top1(runs), rejected(runs, "honest"), rejected(runs, "byzantine")] for e, runs in by_eta.items()]
    baseline_runs = eta.get(("validation data only", "none"), [])
    baseline = spread([float(x["top1"]) for x in finished(baseline_runs)] or [float("nan")])
    body.append(["validation data only (nd)", ps_top1(baseline_runs) if baseline_runs else "", "", ""])
    best = max(top1, key=lambda e: top1[e]["mean"]) if top1 else None
    text = table(["--zeno-eta", "val top-1 (%)", "honest rejected (%)", "Byzantine rejected (%)"], body)
    if best is not None:
        tied = [e for e in top1 if e != best and not beyond_spread(top1[e], top1[best])]
        text += (f"\n\nsync `zenops`, 8 local steps a push, each push N(0, 1) with probability 0.2. "
                 f"The best eta: {best} "
                 f"({with_range(top1[best], 1)} %); within its spread (not told apart from it): "
                 f"{', '.join(tied) or 'none'}. Training on the validators' data alone: {with_range(baseline, 1)} %.")
    sections["ps-eta"] = text
    speed = [(f"ps {mode}, `{aggregate}`", finished(ps_groups(rows, mode).get((aggregate, "none"), [])))
             for mode in ("sync", "async") for aggregate in ("mean", "mean, 1 step")
             if (aggregate, "none") in ps_groups(rows, mode)]
    speed.append(("ddp", finished([x for x in rows if x["part"] == "speed"])))
    ddp = {x["seed"]: float(x["images_per_s"]) for x in speed[-1][1]}
    body = []
    for name, runs in speed:
        ratios = [float(x["images_per_s"]) / ddp[x["seed"]] for x in runs if x["seed"] in ddp]
        body.append([name, len(runs), with_range(spread([float(x["images_per_s"]) for x in runs]), 0),
                     with_range(spread(ratios), 2) if ratios else ""])
    sections["ps-speed"] = (table(["run", "seeds", "train images/s", "vs ddp, seed by seed"], body) +
                            f"\n\n8 workers (ddp: 8 processes), global batch 64, one thread per process, on "
                            f"{r['cores']} cores; each run's images/s, the mean over the seeds and in brackets the "
                            f"lowest and highest. ps: the runs without an attack of the tables above; ddp: its own "
                            f"runs, each trained minutes after the ps runs of its seed, so the ratio (of the same "
                            f"seed's runs) carries this shared machine's noise: read its range, not only its mean.")
    return sections


def render(data, figures, missing):
    from scripts.results.ps_targets import plot_ps, ps_byzfl_table, ps_targets  # (the part's second half)

    rows = read_csv(data / "ps.csv") if (data / "ps.csv").exists() else []
    if not rows:
        missing.append("ps.csv (scripts/bench_ps.py)")
        return {}
    plot_ps(rows, figures)
    sections = {**ps_tables(rows), "ps-targets": ps_targets(rows)}
    if (data / "ps_byzfl.csv").exists():
        sections["ps-byzfl"] = ps_byzfl_table(read_csv(data / "ps_byzfl.csv"), rows)
    else:
        missing.append("ps_byzfl.csv (scripts/bench_ps_byzfl.py)")
    return sections


def headline(data):
    from scripts.results.ps_targets import ps_targets

    if not (data / "ps.csv").exists():
        return None
    held, total = targets_held(ps_targets(read_csv(data / "ps.csv")))
    return f"{held} of its {total} targets hold (Zeno's validators against Byzantine workers)"
