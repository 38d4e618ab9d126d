"""ps, second half: why the targets that miss do, measured by scripts/figures/ps/why.py (the recipe under
scripts/figures/ps/why_probe.py, on scripts/figures/ps/table.py's flags).

    reads    figures/data/ps_why.csv, and ps.csv's rows (the attacks that leave the plain rule as it was)
    writes   sections ps-why-rejections, ps-why-zeno-pp, ps-why-signflip, ps-why-async, ps-why-unbroken
"""

import statistics

from scripts.figures.rendering import beyond_spread, fisher, read_csv, spread, table, with_range
from scripts.figures.ps.table_rows import naive_in_validators, ps_groups, top1_or_chance


def by_label(rows, study):
    groups = {}
    for r in rows:
        if r["study"] == study:
            groups.setdefault(r["label"], []).append(r)
    return groups


def cell(runs, field, digits=1):
    values = [float(r[field]) for r in runs if r.get(field) not in (None, "")]
    return with_range(spread(values), digits) if values else ""


def top1(runs):
    """Over the seeds, a diverged run counted as chance (10 %)."""
    return spread([top1_or_chance(r) for r in runs])


def against(a, b):
    """Whether two results over seeds differ by more than their spread."""
    if a["n"] < 2 or b["n"] < 2:
        return "one seed: no spread"
    return "beyond the seeds' spread" if beyond_spread(a, b) else "within the seeds' spread"


def rejections(groups):
    fields = ["honest_params_rejected", "sign_failed", "norm_failed", "first_third_rejected", "last_third_rejected",
              "after_sit_out_rejected", "after_push_rejected"]
    body = [[label, with_range(top1(runs), 1), *(cell(runs, field) for field in fields)] for label, runs in
            groups.items()]
    text = table(["sync `zenops`, no attack", "val top-1 (%)", "honest parameters rejected", "failing the sign test",
                  "failing the norm test", "in the first third of the rounds", "in the last third",
                  "pushed after a round sat out", "pushed after a push"], body)
    text += ("\n\nThe share (%) of the honest parameters pushed that `zenops` rejected, and that failed each of its "
             "tests (a tensor can fail both): the mean over the seeds, in brackets the lowest and highest.")
    one = groups.get("sync-1v")
    if one and cell(one, "after_sit_out_rejected"):
        text += (f" With one validator, a push made after a round its worker sat out is rejected for "
                 f"{cell(one, 'after_sit_out_rejected')} % of its parameters, one after a push for "
                 f"{cell(one, 'after_push_rejected')} %.")
    for label, runs in groups.items():
        if label != "sync-1v":
            text += (f" {label}: {cell(runs, 'first_third_rejected')} % in the first third of the rounds, "
                     f"{cell(runs, 'last_third_rejected')} % in the last.")
    return text


def longest(runs):
    """A ratio that a blow-up takes to 1e10: the median over the seeds, and the range, to 3 digits."""
    values = sorted(float(r["longest_step"]) for r in runs if r.get("longest_step"))
    if not values:
        return ""
    return f"{statistics.median(values):.3g} ({values[0]:.3g}\u2013{values[-1]:.3g})"


def zeno_plus_plus(groups):
    body = [[label, len(runs), with_range(top1(runs), 1), cell(runs, "accepted", 0), cell(runs, "lengthened", 0),
             longest(runs)] for label, runs in groups.items()]
    text = table(["what the servers apply of an accepted g", "seeds", "val top-1 (%)", "pushes accepted (%)",
                  "accepted with \\|\\|v\\|\\| > \\|\\|g\\|\\| (%)",
                  "longest accepted update applied / median (norms, before the learning rate): median over the "
                  "seeds (lowest-highest)"], body)
    text += ("\n\nOne gradient a push, SGD without momentum on the servers, no attack unless the row names one (then "
             "after an attack-free first epoch); the validator's test is Zeno++'s in every row but the mean's. The "
             "mean over the seeds (a diverged run as chance, 10 %), in brackets the lowest and highest.")
    for label, runs in groups.items():
        same = "".join(part for part in (", batch 32", ", at its authors' learning rate an image", ", 20 epochs")
                       if part in label)
        result, plain = top1(runs), groups.get("mean" + same)  # (the mean of the same batch, lr and epochs)
        if "signflip" in label:
            text += f" {label}: {result['mean']:.1f}, {'at least' if result['mean'] >= 90 else 'below'} 90 %."
        elif not label.startswith("mean") and plain:
            base = top1(plain)
            text += (f" {label}: {result['mean']:.1f}, {result['mean'] - base['mean']:+.1f} points from the mean's "
                     f"{base['mean']:.1f} ({against(result, base)}).")
    return text


def signflip(groups, zeno_groups):
    def under(runs):
        return sum(top1_or_chance(r) < 90 for r in runs)

    def total(runs, field):
        return sum(int(r[field]) for r in runs if r.get(field))

    body = [[label, len(runs), with_range(top1(runs), 1), under(runs), f"{total(runs, 'lies_accepted')} of "
             f"{total(runs, 'lies_pushed')}", cell(runs, "peak_loss", 2), total(runs, "lies_before_peak")]
            for label, runs in groups.items()]
    text = table(["Zeno++, batch 32, at its authors' learning rate an image", "seeds", "val top-1 (%)",
                  "runs under 90 %", "lies accepted, of pushed (summed over the runs)", "the validator's highest loss "
                  "after its first tenth of pushes", "lies accepted before it (summed over the runs)"], body)
    text += ("\n\nAs the zeno++ table's batch-32 rows, at Zeno++'s own learning rate an image; the mean over the seeds "
             "(a diverged run as chance, 10 %), in brackets the lowest and highest. The validator's loss: on the batch "
             "where it last computed v, before each push it judged (chance: ln 10 = 2.30).")
    for label, clean in groups.items():
        runs = groups.get(f"{label}, signflip x10, p 0.2 per push")
        if not runs:
            continue
        low = [float(r["peak_loss"]) for r in runs + clean if r.get("peak_loss") and top1_or_chance(r) < 90]
        high = [float(r["peak_loss"]) for r in runs + clean if r.get("peak_loss") and top1_or_chance(r) >= 90]
        text += (f" Over {runs[0]['epochs']} epochs: {under(runs)} of {len(runs)} runs under 90 % with the sign flip, "
                 f"{under(clean)} of {len(clean)} without (Fisher's exact p = "
                 f"{fisher(under(runs), len(runs), under(clean), len(clean)):.2f}); {total(runs, 'lies_accepted')} "
                 f"lies accepted of {total(runs, 'lies_pushed')} pushed, {total(runs, 'lies_before_peak')} before "
                 f"the highest loss of their run.")
        if low and high:
            text += (f" The validator's highest loss: {min(low):.2f} to {max(low):.2f} in the runs under 90 %, "
                     f"{min(high):.2f} to {max(high):.2f} in the others"
                     f"{' (the ranges overlap: a run can come back from a climb)' if min(low) <= max(high) else ''}.")
        earlier = [zeno_groups.get("g at the length of v (Zeno++)" + name.removeprefix("Zeno++")) for name in
                   (f"{label}, signflip x10, p 0.2 per push", label)]
        if all(earlier):
            text += (f" The Zeno++ study's {len(earlier[0])} and {len(earlier[1])} runs of the same two rows reached "
                     f"{top1(earlier[0])['mean']:.1f} with the sign flip and {top1(earlier[1])['mean']:.1f} without; "
                     f"these {len(runs)} and {len(clean)}: {top1(runs)['mean']:.1f} and {top1(clean)['mean']:.1f}.")
    return text


def async_rows(groups):
    body = [[label, runs[0]["epochs"], with_range(top1(runs), 1), cell(runs, "mean_step", 2),
             cell(runs, "mean_along", 2), runs[0]["alpha"]] for label, runs in groups.items()]
    text = table(["async-2v, no attack", "epochs", "val top-1 (%)", "zenops' update over alpha u, by norm",
                  "zenops' update projected on alpha u", "alpha"], body)
    text += ("\n\nTwo validators and two servers, every worker every round, 8 local steps a push, for 4 x the "
             "table's epochs; the mean over the seeds, in brackets the lowest and highest. What `zenops` applies of "
             "a push u, over `naive-async`'s alpha u: its norm over ||alpha u||, and c of the c alpha u nearest to it "
             "(a reversed tensor counts against).")
    zenops, naive = groups.get("zenops"), groups.get("naive-async")
    at_step = groups.get("naive-async at zenops' mean step")
    if zenops and naive:
        a, b = top1(zenops), top1(naive)
        text += f" `zenops` {a['mean']:.1f} against `naive-async`'s {b['mean']:.1f} ({against(a, b)})."
    if zenops and at_step:
        a, c = top1(zenops), top1(at_step)
        text += (f" `naive-async` at alpha {at_step[0]['alpha']} (its alpha x zenops' mean projection): "
                 f"{c['mean']:.1f}, against `zenops`'s {a['mean']:.1f} ({against(c, a)}).")
    path = groups.get("alpha u through the validators (their path, not their rule)")
    if naive and path:
        b, d = top1(naive), top1(path)
        text += (f" alpha u through the validators: {d['mean']:.1f}, against `naive-async`'s {b['mean']:.1f} "
                 f"({against(d, b)}).")
    clipped = groups.get("zenops at eta -1: clipped, nothing reversed")
    if zenops and naive and clipped:
        a, b, c = top1(zenops), top1(naive), top1(clipped)
        text += (f" `zenops` at eta -1: {c['mean']:.1f}, against `zenops`'s {a['mean']:.1f} ({against(c, a)}) and "
                 f"`naive-async`'s {b['mean']:.1f} ({against(c, b)}).")
    return text


def unbroken(ps_rows):
    """ps.csv's attacks that leave the plain rule (sync: `mean`; async: `naive-async`, in the validators where measured,
    as ZenoPS runs it) within the spread of its own
    top-1 without an attack, or above it: where a rule cannot beat the plain one by more than the seeds' spread
    for the attack's sake."""
    found = []
    for part, plain in (("sync-1v", "mean"), ("sync-2v", "mean"), ("async-1v", "naive-async"),
                        ("async-2v", "naive-async")):
        groups = ps_groups(ps_rows, part)
        plain = naive_in_validators(groups) or plain if plain == "naive-async" else plain  # (ZenoPS's placement)
        clean = groups.get((plain, "none"))
        for (aggregate, attack), runs in groups.items():
            if aggregate == plain and attack != "none" and clean:
                hit, base = spread([top1_or_chance(r) for r in runs]), spread([top1_or_chance(r) for r in clean])
                if not (beyond_spread(hit, base) and hit["mean"] < base["mean"]):
                    found.append(f"{part}, {attack}: `{plain}` {with_range(hit, 1)} against {with_range(base, 1)} "
                                 f"without an attack")
    return ("The attacks after which the plain rule's top-1 over the seeds is not below the range of its own without "
            "an attack (it reaches into that range, or lies above it), in the table above (ps.csv): "
            + ("; ".join(found) or "none") + ".")


def why_sections(data, missing, ps_rows):
    if not (data / "ps_why.csv").exists():
        missing.append("ps_why.csv (scripts/figures/ps/why.py)")
        return {}
    rows = read_csv(data / "ps_why.csv")
    return {"ps-why-rejections": rejections(by_label(rows, "rejections")),
            "ps-why-zeno-pp": zeno_plus_plus(by_label(rows, "zeno++")),
            "ps-why-signflip": signflip(by_label(rows, "signflip"), by_label(rows, "zeno++")),
            "ps-why-async": async_rows(by_label(rows, "async-2v")),
            "ps-why-unbroken": unbroken(ps_rows)}
