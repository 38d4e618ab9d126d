"""The ps table's second half: its targets, and the batch part (whether the authors' batch is why a target misses).

    reads    figures/data/ps.csv (through render.py)
    writes   sections ps-targets, ps-batch
"""

import statistics

from scripts.figures.rendering import beyond_spread, spread, table, with_range
from scripts.figures.ps.table_rows import (INBOUND, distinct_attacks, diverged, naive_in_validators, params_shares,
                                           ps_groups, ps_top1, rejected, top1_or_chance)


def ps_targets(rows):
    """The parameter-server table's targets, each with what was measured and whether it holds. Each measures the
    rule: against itself without the attack, or against the plain rule under the same attack (a diverged run of
    the plain rule counts as chance, 10 %; a rule with a diverged seed fails its target); never the attack's
    success alone. The "within N points" targets are judged at N - 1 and N + 1 too (the text says which flip)."""
    def runs_of(part, aggregate, attack):
        return ps_groups(rows, part).get((aggregate, attack), [])

    def top1(runs):
        return spread([top1_or_chance(r) for r in runs]) if runs else None
    body, flips = [], {-1: [], 1: []}

    def check(target, value, holds):
        body.append([target, "not measured" if value is None else value, "" if value is None else
                     ("yes" if holds else "no")])

    def share(runs, who, what="rejected"):  # (rows.params_shares' mean)
        rates = params_shares(runs, who, what)
        return statistics.mean(rates) if rates else None

    def or_diverged(runs, text):  # what a target shows: its measure, or that every run of it diverged
        return text if text is not None else ("every run diverged" if runs else None)

    def near_its_own(where, rule, runs, clean_runs, points):
        """The rule under the attack within `points` of its own top-1 without one (and at points -/+ 1, for flips)."""
        attacked, clean = top1(runs), top1(clean_runs)
        ok = attacked and clean and not diverged(runs)
        gap = clean["mean"] - attacked["mean"] if ok else None
        target = f"{where}: `{rule}` within {points} points of its own no-attack top-1"
        check(target, attacked and clean and f"{attacked['mean']:.1f} against {clean['mean']:.1f}{diverged(runs)}",
              ok and gap <= points)
        for step in flips:
            if ok and (gap <= points) != (gap <= points + step):
                other = f"within {points + step} point" + ("s" if points + step != 1 else "")
                flips[step].append(target.replace(f"within {points} points", other))

    def against_plain(where, rule, runs, plain, plain_runs, plain_clean):
        """The rule against the plain rule under the same attack, beyond the seeds' spread: above it where the attack
        took the plain rule below its own no-attack top-1 beyond the spread, else not below it."""
        mine, theirs, theirs_clean = top1(runs), top1(plain_runs), top1(plain_clean)
        if not (mine and theirs and theirs_clean):
            return check(f"{where}: `{rule}` against `{plain}` under the same attack", None, False)
        hurt = theirs["mean"] < theirs_clean["mean"] and beyond_spread(theirs, theirs_clean)
        text, every_seed = f"{with_range(mine, 1)}{diverged(runs)} against {with_range(theirs, 1)}", not diverged(runs)
        if hurt:
            check(f"{where}: `{rule}` above `{plain}` beyond the seeds' spread (the attack took `{plain}` below its "
                  f"own no-attack top-1)", text, every_seed and mine["mean"] > theirs["mean"] and
                  beyond_spread(mine, theirs))
        else:
            check(f"{where}: `{rule}` not below `{plain}` beyond the seeds' spread (the attack left `{plain}` within "
                  f"its spread)", text, every_seed and not (theirs["mean"] > mine["mean"] and
                                                           beyond_spread(mine, theirs)))

    def honest_rejected(where, runs):
        rate = share(runs, "honest")
        check(f"{where}: `zenops` rejects at most 10 % of the honest parameters",
              or_diverged(runs, None if rate is None else f"{rate:.1f} %"), rate is not None and rate <= 10)
    for part in ("sync-1v", "sync-2v"):
        groups = ps_groups(rows, part)
        attacks = [a for a in dict.fromkeys(key[1] for key in groups) if a != "none"]
        for same in distinct_attacks(groups, "zenops", attacks):  # (identical runs: one measurement, one target)
            label = " / ".join(same) + (" (identical runs: one measurement)" if len(same) > 1 else "")
            runs = runs_of(part, "zenops", same[0])
            near_its_own(f"{part}, {label}", "zenops", runs, runs_of(part, "zenops", "none"),
                         3 if same[0] in INBOUND else 2)
            against_plain(f"{part}, {label}", "zenops", runs, "mean", runs_of(part, "mean", same[0]),
                          runs_of(part, "mean", "none"))
            honest, poisoned = (share(runs, who) for who in ("honest", "byzantine"))
            both = honest is not None and poisoned is not None
            check(f"{part}, {label}: `zenops` rejects a larger share of the poisoned parameters than of the honest",
                  or_diverged(runs, f"{poisoned:.1f} % against {honest:.1f} %" if both else None),
                  both and poisoned > honest)
        honest_rejected(f"{part}, no attack", runs_of(part, "zenops", "none"))
    for part in ("async-1v", "async-2v", "async-delay"):
        groups = ps_groups(rows, part)
        naive_label = naive_in_validators(groups) or "naive-async"  # (ZenoPS's placement where measured)
        for attack in [a for a in dict.fromkeys(key[1] for key in groups) if a != "none"]:
            runs = runs_of(part, "zenops", attack)
            near_its_own(f"{part}, {attack}", "zenops", runs, runs_of(part, "zenops", "none"), 2)
            against_plain(f"{part}, {attack}", "zenops", runs, naive_label, runs_of(part, naive_label, attack),
                          runs_of(part, naive_label, "none"))
    # (the authors' batch: the same target, measured there)
    honest_rejected("sync-1v at a batch of 32, no attack", runs_of("batch", "zenops, batch 32", "none"))
    for batch in ("", ", batch 32"):  # Zeno's and Zeno++'s rows at 8 and at 32
        for part, rule in (("zeno", "zeno"), ("zeno++", "zeno++")):
            name, plain = f"{rule}, 1 step{batch}", f"mean, 1 step{batch}"
            if part == "zeno++":
                clean, mean = top1(runs_of(part, name, "none")), top1(runs_of(part, plain, "none"))
                check(f"zeno++{batch}, no attack: `zeno++` within 2 points of `mean`", clean and mean and
                      f"{clean['mean']:.1f} against {mean['mean']:.1f}", clean and mean and
                      mean["mean"] - clean["mean"] <= 2)
            for attack in [a for a in dict.fromkeys(key[1] for key in ps_groups(rows, part)) if a != "none"]:
                runs = runs_of(part, name, attack)
                near_its_own(f"{rule}{batch}, {attack}", rule, runs, runs_of(part, name, "none"), 2)
                against_plain(f"{rule}{batch}, {attack}", rule, runs, "mean", runs_of(part, plain, attack),
                              runs_of(part, plain, "none"))
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
    held = sum(row[2] == "yes" for row in body)
    sensitivity = " ".join(
        f"At {'one point less' if step < 0 else 'one point more'}, {len(changed)} of the \"within\" targets would "
        f"turn {'no' if step < 0 else 'yes'} ({held + len(changed) * step} of {len(body)} holding)"
        + (f": {'; '.join(changed)}." if changed else ".") for step, changed in flips.items())
    return (table(["target", "measured (mean over the seeds)", "holds"], body) +
            "\n\nThe targets this table was set against, each measuring the rule: against its own top-1 without "
            "the attack, or against the plain rule under the same attack (above it beyond the seeds' spread where "
            "the attack took the plain rule below its own no-attack top-1 beyond the spread, else not below it), "
            "never the attack's success alone. A diverged run of the plain rule counts as chance (10 %); a rule "
            "with a diverged seed fails its targets. Rows whose runs are identical seed by seed (the same top-1 and "
            "parameters rejected: every poisoned tensor was rejected, so the same pushes passed) are one "
            "measurement and one target. The two attacks built to slip past zenops (4 of 8 flipping x 1.2, ALIE) "
            "hold it within 3 points of its no-attack top-1, the others within 2. " + sensitivity + " The rows "
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
