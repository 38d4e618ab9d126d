"""ps.csv's rows by run: each part's groups of seeds, and a group's top-1 (render.py, render_targets.py and
render_why.py all read them so)."""

from scripts.figures.rendering import spread, with_range

# each part of the table, the authors' runs it stands for (scripts/figures/ps/table.py says how it is scaled down)
MATRICES = {"sync-1v": "ZenoPS, sync, one validator (its Figure 3: zeno_ps "
                       "launcher/experiments_sync_single_validator.sh)",
            "sync-2v": "ZenoPS, sync, two validators (its Figure 4: experiments_sync_two_validators.sh)",
            "async-1v": "ZenoPS, async, one validator (its Figure 5: experiments_async_single_validator.sh)",
            "async-2v": "ZenoPS, async, two validators and two servers (its Figure 6: "
                        "experiments_async_two_validators.sh)",
            "zeno": "Zeno (icml2019_zeno test_zeno_1.sh)",
            "zeno++": "Zeno++ (AsyncByzGrad exp_*.sh)"}
VALIDATED = ("zenops", "zeno", "zeno++")  # (the rule's name, before any ", 1 step, ...")


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


def top1_or_chance(run):
    """A run's top-1, or chance (10 %) where it diverged: for judging, not for the tables' means."""
    return float(run["top1"]) if run.get("diverged", "0") != "1" else 10.0


def ps_top1(runs):
    """'91.0 (90.0-92.0)' over the seeds that finished, and how many diverged."""
    done = finished(runs)
    text = with_range(spread([float(r["top1"]) for r in done]), 1) if done else "diverged"
    return text + (f" ({len(runs) - len(done)} of {len(runs)} diverged)" if done and len(done) < len(runs) else "")
