"""ps.csv's rows by run: each part's groups of seeds, a group's top-1 and its shares rejected, and which rows are
one measurement (render.py, table_plot.py, render_targets.py, render_byzfl_reference.py, render_why.py and
render_cluster.py all read them so)."""

import statistics

from scripts.figures.rendering import spread, with_range

# each part of the table, the authors' runs it stands for (scripts/figures/ps/table.py says how it is scaled down)
MATRICES = {"sync-1v": "ZenoPS, sync, one validator (its Figure 3: zeno_ps "
                       "launcher/experiments_sync_single_validator.sh)",
            "sync-2v": "ZenoPS, sync, two validators (its Figure 4: experiments_sync_two_validators.sh)",
            "async-1v": "ZenoPS, async, one validator (its Figure 5: experiments_async_single_validator.sh)",
            "async-2v": "ZenoPS, async, two validators and two servers (its Figure 6: "
                        "experiments_async_two_validators.sh)",
            "async-delay": "ZenoPS, async, one validator, its workers' sleeps before each push at a tenth "
                           "(experiments_async_single_validator.sh; byteps/mxnet/__init__.py 821)",
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


def pace(groups, aggregate):
    """A rule's mean images/s over the runs of a part's groups that record it (a diverged run may not)."""
    return statistics.mean(float(r["images_per_s"]) for (rule, _), runs in groups.items() if rule == aggregate
                           for r in runs if r["images_per_s"])


def top1_or_chance(run):
    """A run's top-1, or chance (10 %) where it diverged: for judging, not for the tables' means."""
    return float(run["top1"]) if run.get("diverged", "0") != "1" else 10.0


def ps_top1(runs, unit=""):
    """'91.0 (90.0-92.0)' (and the unit) over the seeds that finished, and how many diverged."""
    done = finished(runs)
    return with_range(spread([float(r["top1"]) for r in done]), 1) + unit + diverged(runs) if done else "diverged"


def diverged(runs):
    """' (1 of 3 diverged)', or '' where every run finished."""
    done = len(finished(runs))
    return f" ({len(runs) - done} of {len(runs)} diverged)" if done < len(runs) else ""


INBOUND = ("4 of 8 flip x1.2", "ALIE, 4 of 8")  # the attacks built to slip past zenops (table.py's INBOUND_ATTACKS)
IN_VALIDATORS = "naive-async, in the validator"  # (the label's start: "validator" in async-1v, "validators" in 2v)


def naive_in_validators(groups):
    """The label of the part's naive-async row in the validators (ZenoPS's placement), or None."""
    return next((aggregate for aggregate, _ in groups if aggregate.startswith(IN_VALIDATORS)), None)


def measurement(runs):
    """What identifies a row's runs: seed by seed, the top-1 and the parameters pushed and rejected. Two rows with
    the same are one measurement (under two attacks whose every poisoned tensor is rejected, the accepted pushes
    are the same); a row with a diverged run is its own."""
    fields = ("seed", "top1", "honest_params_rejected", "byzantine_params_rejected", "byzantine_params_pushed")
    if any(r.get("diverged", "0") == "1" for r in runs):
        return ("diverged", id(runs))
    return tuple(sorted(tuple(r.get(field, "") for field in fields) for r in runs))


def distinct_attacks(groups, aggregate, attacks):
    """The attacks of one rule's rows grouped by measurement: a list of lists of attack labels, in order."""
    by_measurement = {}
    for attack in attacks:
        runs = groups.get((aggregate, attack))
        key = measurement(runs) if runs else ("not measured", attack)
        by_measurement.setdefault(key, []).append(attack)
    return list(by_measurement.values())


def sign_only(runs):
    """Run by run, the share (%) of the poisoned parameters that passed zenops' norm test and that its sign test
    rejected: what the sign test alone stops (rejected = failing either test)."""
    return [100 * (float(r["byzantine_params_rejected"]) - float(r["byzantine_params_failed_norm"])) /
            (float(r["byzantine_params_pushed"]) - float(r["byzantine_params_failed_norm"])) for r in finished(runs)
            if r.get("byzantine_params_failed_norm") not in (None, "")
            and float(r["byzantine_params_pushed"] or 0) > float(r["byzantine_params_failed_norm"])]


def params_shares(runs, who, what="rejected"):
    """Run by run, the share (%) of `who`'s (honest or byzantine) pushed parameters rejected, or failing zenops' test
    (what: "failed_norm", "failed_sign"), over the finished runs that counted it."""
    return [100 * float(r[f"{who}_params_{what}"]) / float(r[f"{who}_params_pushed"]) for r in finished(runs)
            if float(r[f"{who}_params_pushed"] or 0) and r.get(f"{who}_params_{what}") not in (None, "")]


def rejected(runs, who, by="_params"):
    """'25 (20-30)': the share (%) of `who`'s (honest or byzantine) pushed tensors (by="_tensors"), parameters
    ("_params") or pushes ("") that the rule dropped, its mean over the seeds' runs and its range."""
    rates = [100 * float(r[f"{who}{by}_rejected"]) / float(r[f"{who}{by}_pushed"]) for r in finished(runs)
             if r.get(f"{who}{by}_pushed") not in (None, "", "0", "0.0")]
    return with_range(spread(rates), 0) if rates else ""
