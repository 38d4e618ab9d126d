"""The ps part's second half: its targets, ByzFL's benchmark beside its table, and its figures.

    reads    figures/data/ps.csv, ps_byzfl.csv
    draws    figures/ps.png, ps_eta.png
    writes   RESULTS.md's ps-targets, ps-byzfl
"""

import statistics

from scripts.results.common import beyond_spread, plt, save, spread, table, with_range
from scripts.results.ps import finished, ps_groups, ps_top1


def top1_or_chance(run):
    """A run's top-1, or chance (10 %) where it diverged: for judging, not for the tables' means."""
    return float(run["top1"]) if run.get("diverged", "0") != "1" else 10.0


def ps_targets(rows):
    """The parameter-server table's targets, each with what was measured and whether it holds. A run that diverged
    counts as chance, 10 %."""
    def top1(part, aggregate, attack):
        runs = ps_groups(rows, part).get((aggregate, attack), [])
        return statistics.mean(top1_or_chance(r) for r in runs) if runs else None

    def honest(part, aggregate):
        runs = finished(ps_groups(rows, part).get((aggregate, "none"), []))
        return 100 * sum(float(r["honest_rejected"]) for r in runs) / max(1, sum(int(r["honest_pushed"]) for r in runs))
    flip, flip_4 = "signflip x4, 2 of 8", "signflip x10, p 0.4"
    body = []

    def check(target, value, holds):
        body.append([target, "not measured" if value is None else value, "" if value is None else
                     ("yes" if holds else "no")])
    mean = top1("sync", "mean", flip)
    check(f"sync, {flip}: `mean` at most 50 %", mean is not None and f"{mean:.1f}", mean is not None and mean <= 50)
    for rule in ("zenops", "zeno, 1 step"):
        attacked, clean = top1("sync", rule, flip), top1("sync", rule, "none")
        check(f"sync, {flip}: `{rule}` at least 95 % and within 2 points of its own no-attack top-1",
              attacked is not None and clean is not None and f"{attacked:.1f} against {clean:.1f}",
              attacked is not None and clean is not None and attacked >= 95 and clean - attacked <= 2)
    for part, rule in (("sync", "zenops"), ("async", "zenops"), ("async", "zeno++, 1 step")):
        rate = honest(part, rule) if (rule, "none") in ps_groups(rows, part) else None
        check(f"{part}, no attack: `{rule}` rejects at most 10 % of the honest updates",
              rate is not None and f"{rate:.0f} %", rate is not None and rate <= 10)
    zpp, mean = top1("async", "zeno++, 1 step", "none"), top1("async", "mean, 1 step", "none")
    check("async, no attack: `zeno++` within 2 points of `mean`", zpp is not None and mean is not None and
          f"{zpp:.1f} against {mean:.1f}", zpp is not None and mean is not None and mean - zpp <= 2)
    mean, zpp = top1("async", "mean, 1 step", flip_4), top1("async", "zeno++, 1 step", flip_4)
    check(f"async, {flip_4}: `mean` at most 50 %", mean is not None and f"{mean:.1f}", mean is not None and mean <= 50)
    check(f"async, {flip_4}: `zeno++` at least 90 %", zpp is not None and f"{zpp:.1f}", zpp is not None and zpp >= 90)
    by_eta = {}
    for x in finished([r for r in rows if r["part"] == "eta" and r["zeno_eta"] != ""]):
        by_eta.setdefault(x["zeno_eta"], []).append(float(x["top1"]))
    base = [float(x["top1"]) for x in finished(ps_groups(rows, "eta").get(("validation data only", "none"), []))]
    if by_eta and base:
        best = max(by_eta, key=lambda e: statistics.mean(by_eta[e]))
        a, b = spread(by_eta[best]), spread(base)
        check("the eta sweep's best eta beats training on the validators' data alone by more than the spread",
              f"{with_range(a, 1)} against {with_range(b, 1)} (eta {best})", a["mean"] > b["mean"] and
              beyond_spread(a, b))
    else:
        check("the eta sweep's best eta beats training on the validators' data alone by more than the spread", None,
              False)
    return (table(["target", "measured (mean over the seeds)", "holds"], body) +
            "\n\nThe targets this table was set against; a run that diverged counts as chance (10 %).")


BYZFL_NEAREST = {"none": "none", "signflip": "signflip x4, 2 of 8", "gaussian": "N(0,1), p 0.2"}  # ours nearest


def ps_byzfl_table(byzfl, rows):
    """ByzFL's benchmark beside the sync table's rows nearest each of its attacks, and where the two disagree in
    direction (a rule beyond the spread of mean in one, not in the other)."""
    def runs_of(table_rows, rule, attack, key="attack"):
        return [r for r in table_rows if r["aggregate"] == rule and r[key] == attack]

    def verdict(runs, mean_runs):  # +1 beats mean beyond the spread, -1 falls below it, 0 cannot be told apart
        if not runs or not mean_runs:
            return 0
        a, b = (spread([top1_or_chance(r) for r in x]) for x in (runs, mean_runs))
        return 0 if not beyond_spread(a, b) else (1 if a["mean"] > b["mean"] else -1)
    ours_rows = [r for r in rows if r["part"] == "sync"]
    attacks = list(dict.fromkeys(r["ps_attack"] for r in byzfl))
    rules = list(dict.fromkeys(r["aggregate"] for r in byzfl))
    body, disagree = [], []
    for rule in rules:
        line = [f"`{rule}`"]
        for attack in attacks:
            theirs, ours = runs_of(byzfl, rule, attack, "ps_attack"), runs_of(ours_rows, rule, BYZFL_NEAREST[attack])
            line += [ps_top1(theirs), ps_top1(ours) if ours else ""]
            if rule != "mean" and ours and attack != "none":
                v_theirs = verdict(theirs, runs_of(byzfl, "mean", attack, "ps_attack"))
                v_ours = verdict(ours, runs_of(ours_rows, "mean", BYZFL_NEAREST[attack]))
                if v_theirs != v_ours:
                    disagree.append(f"{rule} under {attack} (ByzFL {v_theirs:+d}, ours {v_ours:+d})")
        body.append(line)
    header = ["rule", *(f"{who}: {attack if who == 'ByzFL' else BYZFL_NEAREST[attack]}" for attack in attacks
                         for who in ("ByzFL", "ours"))]
    r = next((x for x in byzfl if x["ps_attack"] != "none"), byzfl[0])
    return (table(header, body) +
            f"\n\nFinal test top-1 (%): the mean over {len({x['seed'] for x in byzfl})} seed(s) of ByzFL's "
            f"benchmark ({r['byzfl']}: cnn_mnist, {r['steps']} steps of {r['batch']} images a client, lr {r['lr']}, "
            f"client momentum {r['momentum']}, {r['honest']} honest and {r['byzantine']} Byzantine clients when "
            f"attacked, every rule set for f = {r['tolerated_f']}), beside ours (sync, 8 local steps a push, the "
            f"nearest attack). Where the two disagree on a rule against the mean under the same attack "
            f"(+1 better beyond the spread, -1 worse, 0 not told apart; a run that diverged counts as chance, 10 %): " +
            ("; ".join(disagree) or "nowhere") + ".")


def plot_ps(rows, figures):
    """Top-1 per aggregation and attack, sync and async, as two annotated grids; and the eta sweep."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [8, 3.5]})
    for ax, mode in zip(axes, ("sync", "async")):
        groups = ps_groups(rows, mode)
        aggregates = list(dict.fromkeys(aggregate for aggregate, _ in groups))
        attacks = list(dict.fromkeys(attack for _, attack in groups))
        if not groups:  # (a table stopped before this mode)
            ax.axis("off")
            continue
        grid = [[statistics.mean(float(x["top1"]) for x in finished(groups[g, a]))
                 if (g, a) in groups and finished(groups[g, a]) else (-1.0 if (g, a) in groups else float("nan"))
                 for g in aggregates] for a in attacks]  # -1: every seed diverged
        ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        for i, line in enumerate(grid):
            for j, value in enumerate(line):
                if value == value:  # not NaN: a rule and attack that were trained
                    ax.text(j, i, f"{value:.0f}" if value >= 0 else "div.", ha="center", va="center",
                            color="white" if value < 60 else "black")
        ax.set_xticks(range(len(aggregates)), aggregates, rotation=45, ha="right")
        ax.set_yticks(range(len(attacks)), attacks)
        ax.set_title(f"{mode}: val top-1 (%)")
    fig.suptitle(f"Parameter server, 8 workers, lenet on the digits, "
                 f"{rows[0]['epochs']} epochs; mean of {len({x['seed'] for x in rows})} seed(s)")
    save(fig, figures / "ps.png")
    by_eta = {}
    for x in finished(rows):
        if x["part"] == "eta" and x["zeno_eta"] != "":
            by_eta.setdefault(float(x["zeno_eta"]), []).append(x)
    if not by_eta:
        return
    etas = sorted(by_eta)
    fig, ax = plt.subplots(figsize=(7, 4))
    top1 = [spread([float(x["top1"]) for x in by_eta[e]]) for e in etas]
    ax.errorbar(etas, [v["mean"] for v in top1], yerr=[[v["mean"] - v["low"] for v in top1],
                                                      [v["high"] - v["mean"] for v in top1]],
                marker="o", capsize=3, label="sync zenops, N(0, 1) with probability 0.2")
    baseline = [float(x["top1"]) for x in finished(rows) if x["aggregate"] == "validation data only"]
    if baseline:
        ax.axhspan(min(baseline), max(baseline), color="gray", alpha=0.2)
        ax.axhline(statistics.mean(baseline), color="gray", linestyle="--", label="validation data only (nd)")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set(xlabel="--zeno-eta", ylabel="final val top-1 (%)", title="ZenoPS's eta sweep: mean, min-max over seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, figures / "ps_eta.png")
