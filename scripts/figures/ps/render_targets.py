"""The ps table's second half: its targets, and the batch part (whether the authors' batch is why a target misses).

    reads    figures/data/ps.csv (through render.py)
    writes   sections ps-targets, ps-batch
"""

import statistics

from scripts.figures.rendering import beyond_spread, spread, table, with_range
from scripts.figures.ps.table_rows import (INBOUND, distinct_attacks, naive_in_validators, params_shares, ps_groups,
                                           ps_top1, rejected, sign_only, top1_or_chance)


def ps_targets(rows):
    """The parameter-server table's targets (the issue's), each with what was measured and whether it holds. A run
    that diverged counts as chance, 10 %."""
    def runs_of(part, aggregate, attack):
        return ps_groups(rows, part).get((aggregate, attack), [])

    def top1(part, aggregate, attack):
        runs = runs_of(part, aggregate, attack)
        return spread([top1_or_chance(r) for r in runs]) if runs else None
    body = []

    def check(target, value, holds):
        body.append([target, "not measured" if value is None else value, "" if value is None else
                     ("yes" if holds else "no")])

    def share(runs, who, what="rejected"):  # (rows.params_shares' mean)
        rates = params_shares(runs, who, what)
        return statistics.mean(rates) if rates else None

    def or_diverged(runs, text):  # what a target shows: its measure, or that every run of it diverged
        return text if text is not None else ("every run diverged" if runs else None)

    def honest_rejected(where, runs):
        rate = share(runs, "honest")
        check(f"{where}: `zenops` rejects at most 10 % of the honest parameters",
              or_diverged(runs, None if rate is None else f"{rate:.1f} %"), rate is not None and rate <= 10)
    for part in ("sync-1v", "sync-2v"):
        clean, groups = top1(part, "zenops", "none"), ps_groups(rows, part)
        attacks = [a for a in dict.fromkeys(key[1] for key in groups) if a != "none"]
        for attack in attacks:
            mean = top1(part, "mean", attack)
            check(f"{part}, {attack}: `mean` at most 50 %", mean and f"{mean['mean']:.1f}", mean and mean["mean"] <= 50)
        for same in distinct_attacks(groups, "zenops", attacks):  # (identical runs: one measurement, one target)
            label = " / ".join(same) + (" (identical runs: one measurement)" if len(same) > 1 else "")
            zenops, runs, points = top1(part, "zenops", same[0]), runs_of(part, "zenops", same[0]), \
                3 if same[0] in INBOUND else 2
            check(f"{part}, {label}: `zenops` within {points} points of its own no-attack top-1",
                  zenops and clean and f"{zenops['mean']:.1f} against {clean['mean']:.1f}",
                  zenops and clean and clean["mean"] - zenops["mean"] <= points)
            honest, poisoned = (share(runs, who) for who in ("honest", "byzantine"))
            both = honest is not None and poisoned is not None
            check(f"{part}, {label}: `zenops` rejects a larger share of the poisoned parameters than of the honest",
                  or_diverged(runs, f"{poisoned:.1f} % against {honest:.1f} %" if both else None),
                  both and poisoned > honest)
            if same[0] == INBOUND[0]:  # the flip built to pass the norm test: the sign test must stop what it passes
                norm, sign = share(runs, "byzantine", "failed_norm"), sign_only(runs)
                told = norm is not None and sign
                check(f"{part}, {label}: the sign test rejects at least 90 % of the poisoned parameters that the "
                      f"norm test passes", or_diverged(runs, f"{statistics.mean(sign):.1f} % (the norm test failed "
                                                            f"{norm:.1f} % of them)" if told else None),
                      told and statistics.mean(sign) >= 90)
        honest_rejected(f"{part}, no attack", runs_of(part, "zenops", "none"))
    for part in ("async-1v", "async-2v"):
        groups = ps_groups(rows, part)
        naive_label = naive_in_validators(groups) or "naive-async"  # (ZenoPS's placement where measured)
        where = " in the validators (ZenoPS's placement)" if naive_label != "naive-async" else ""
        for attack in [a for a in dict.fromkeys(key[1] for key in groups) if a != "none"]:
            zenops, naive = top1(part, "zenops", attack), top1(part, naive_label, attack)
            check(f"{part}, {attack}: `zenops` above `naive-async`{where} beyond the seeds' spread",
                  zenops and naive and f"{with_range(zenops, 1)} against {with_range(naive, 1)}",
                  zenops and naive and zenops["mean"] > naive["mean"] and beyond_spread(zenops, naive))
    # (the authors' batch: the same target, measured there)
    honest_rejected("sync-1v at a batch of 32, no attack", runs_of("batch", "zenops, batch 32", "none"))
    for batch in ("", ", batch 32"):  # Zeno's and Zeno++'s rows at 8 and at 32
        clean = top1("zeno", f"zeno, 1 step{batch}", "none")
        for attack in [a for a in dict.fromkeys(key[1] for key in ps_groups(rows, "zeno")) if a != "none"]:
            mean, zeno = top1("zeno", f"mean, 1 step{batch}", attack), top1("zeno", f"zeno, 1 step{batch}", attack)
            check(f"zeno{batch}, {attack}: `mean` at most 50 %", mean and f"{mean['mean']:.1f}",
                  mean and mean["mean"] <= 50)
            check(f"zeno{batch}, {attack}: `zeno` within 2 points of its own no-attack top-1",
                  zeno and clean and f"{zeno['mean']:.1f} against {clean['mean']:.1f}",
                  zeno and clean and clean["mean"] - zeno["mean"] <= 2)
        zpp, mean = top1("zeno++", f"zeno++, 1 step{batch}", "none"), top1("zeno++", f"mean, 1 step{batch}", "none")
        check(f"zeno++{batch}, no attack: `zeno++` within 2 points of `mean`", zpp and mean and
              f"{zpp['mean']:.1f} against {mean['mean']:.1f}", zpp and mean and mean["mean"] - zpp["mean"] <= 2)
        for attack in [a for a in dict.fromkeys(key[1] for key in ps_groups(rows, "zeno++")) if a != "none"]:
            zpp = top1("zeno++", f"zeno++, 1 step{batch}", attack)
            check(f"zeno++{batch}, {attack}: `zeno++` at least 90 %", zpp and f"{zpp['mean']:.1f}",
                  zpp and zpp["mean"] >= 90)
    by_eta = {}
    for x in [r for r in rows if r["part"] == "eta" and r["zeno_eta"] != ""]:
        by_eta.setdefault(x["zeno_eta"], []).append(top1_or_chance(x))
    base = [top1_or_chance(x) for x in runs_of("eta", "validation data only", "none")]
    target = "the eta sweep's best eta beats training on the validators' data alone by more than the spread"
    if by_eta and base:
        best = max(by_eta, key=lambda e: statistics.mean(by_eta[e]))
        a, b = spread(by_eta[best]), spread(base)
        check(target, f"{with_range(a, 1)} against {with_range(b, 1)} (eta {best})", a["mean"] > b["mean"] and
              beyond_spread(a, b))
    else:
        check(target, None, False)
    return (table(["target", "measured (mean over the seeds)", "holds"], body) +
            "\n\nThe targets this table was set against; a run that diverged counts as chance (10 %). Rows whose runs "
            "are identical seed by seed (the same top-1 and parameters rejected: every poisoned tensor was rejected, "
            "so the same pushes passed) are one measurement and one target. The two attacks built to slip past zenops "
            "(4 of 8 flipping x 1.2, ALIE) hold it within 3 points of its no-attack top-1, ZenoPS's own within 2. "
            "The rows "
            "\"at a batch of 32\" hold the same rule to the same target at the authors' batch (ZenoPS's 32; "
            "Zeno's 100, Zeno++'s 128), as many steps at the same learning rate a step: where a target fails at 8, "
            "whether the batch is why.")


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
