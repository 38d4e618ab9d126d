"""ByzFL's own benchmark (scripts/figures/ps/byzfl_reference.py) beside the table's sync rows nearest each of its
attacks.

    reads    figures/data/ps_byzfl.csv, ps.csv (through render.py)
    writes   section ps-byzfl
"""

from scripts.figures.ps.table_rows import ps_top1, top1_or_chance
from scripts.figures.rendering import beyond_spread, spread, table


BYZFL_NEAREST = {"none": "none", "signflip": "signflip x6", "gaussian": "N(0,1)"}  # ours nearest (sync-1v)


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
    ours_rows = [r for r in rows if r["part"] == "sync-1v"]
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
            f"attacked, every rule set for f = {r['tolerated_f']}), beside ours (sync-1v: 8 local steps a push, "
            f"each worker a round with probability 0.5, each tensor poisoned with probability 0.2, trimmed-mean's "
            f"b from each round's pushes at ratio 0.2; the nearest attack; no `median`, `krum` or "
            f"`centered-clipping` of ours in ZenoPS's regime). Where the two disagree on a rule against the mean "
            f"under the same attack "
            f"(+1 better beyond the spread, -1 worse, 0 not told apart; a run that diverged counts as chance, 10 %): " +
            ("; ".join(disagree) or "nowhere") + ".")
