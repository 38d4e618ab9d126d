"""ZenoPS on the virtual cluster (scripts/figures/ps/cluster.py): each rule and attack's top-1 and images/s with
every role on a node of its own, beside the same runs on loopback (ps.csv's sync-1v rows).

    reads    figures/data/ps_cluster.csv, ps.csv
    writes   section ps-cluster; headline()
"""

from scripts.figures.ps.table_rows import finished, ps_groups, ps_top1
from scripts.figures.rendering import beyond_spread, read_csv, spread, table, with_range


def groups(rows):
    """{(aggregate, attack): runs, one a seed}, in the order measured."""
    found = {}
    for r in rows:
        found.setdefault((r["aggregate"], r["attack"]), []).append(r)
    return found


def images_per_s(runs):
    done = finished(runs)
    return spread([float(r["images_per_s"]) for r in done]) if done else None


def cluster_section(data):
    rows = read_csv(data / "ps_cluster.csv")
    local = ps_groups(read_csv(data / "ps.csv"), "sync-1v") if (data / "ps.csv").exists() else {}
    body = []
    for (aggregate, attack), runs in groups(rows).items():
        here, there = images_per_s(runs), images_per_s(local.get((aggregate, attack), []))
        body.append([aggregate, attack, ps_top1(runs), with_range(here, 0) if here else "",
                     with_range(there, 0) if there else "", f"{here['mean'] / there['mean']:.2f}x" if here and there
                     else ""])
    r = rows[0]
    text = table(["rule", "attack", "top-1 (%)", "images/s on the cluster", "images/s on loopback (the table's)",
                  "cluster / loopback"], body)
    text += (f"\n\nZenoPS's sync runs with one validator (the table's sync-1v flags), the server, the validator and "
             f"each of the 8 workers on a node of its own; the links sized after {r['link']} at 8 nodes "
             f"({float(r['rate_bits']) / 1e6:.1f} Mbit/s here: DDP's wire would take {float(r['ratio']):.0%} of a "
             f"worker's step alone, {float(r['alone_step_s']) * 1e3:.1f} ms), lenet on the digits, {r['epochs']} "
             f"epochs, {len({x['seed'] for x in rows})} seeds: the mean, in brackets the lowest and highest.")
    same = [(x, y) for key, runs in groups(rows).items() for x in finished(runs)
            for y in finished(local.get(key, [])) if x["seed"] == y["seed"]]
    if same:
        equal = sum(x["top1"] and float(x["top1"]) == float(y["top1"]) for x, y in same)
        text += (f" {equal} of the {len(same)} runs that finished on both end at the top-1 of the same run on "
                 f"loopback" + (": sync training waits for every push, so the wire changes its time, not its "
                                "arithmetic." if equal == len(same) else "."))
    return text + " " + verdict(rows)


def verdict(rows):
    """Against ZenoPS's paper: its validators hold the attack off the model, and they cost the workers little
    time (the rule's images/s against the mean's without an attack, beyond the seeds' spread or not)."""
    found = groups(rows)
    said = []
    attacked, mean_attacked = found.get(("zenops", "signflip x6"), []), found.get(("mean", "signflip x6"), [])
    clean = found.get(("zenops", "none"), [])
    if attacked and mean_attacked:
        lost = len(mean_attacked) - len(finished(mean_attacked))
        said.append(f"under the sign flip zenops ends at {ps_top1(attacked)} % where the mean "
                    + (f"diverges in {lost} of {len(mean_attacked)} seeds" if lost else
                       f"ends at {ps_top1(mean_attacked)} %"))
    plain, zeno = images_per_s(found.get(("mean", "none"), [])), images_per_s(clean)
    if plain and zeno:
        said.append(f"without an attack zenops trains at {zeno['mean'] / plain['mean']:.2f}x the mean's images/s"
                    + (" (beyond the seeds' spread)" if beyond_spread(zeno, plain) else " (within the seeds' spread)"))
    return ("Against the paper: " + "; ".join(said) + ".") if said else ""


def render(data):
    return {"ps-cluster": cluster_section(data)} if (data / "ps_cluster.csv").exists() else {}


def headline(data):
    if not (data / "ps_cluster.csv").exists():
        return None
    found = groups(read_csv(data / "ps_cluster.csv"))
    plain, zeno = images_per_s(found.get(("mean", "none"), [])), images_per_s(found.get(("zenops", "none"), []))
    attacked = found.get(("zenops", "signflip x6"), [])
    if not (plain and zeno and attacked):
        return None
    return (f"on the virtual cluster, each role on a node of its own: zenops {ps_top1(attacked)} % under the sign "
            f"flip, at {zeno['mean'] / plain['mean']:.2f}x the mean's images/s without an attack")
