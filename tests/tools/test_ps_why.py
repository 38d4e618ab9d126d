"""scripts/figures/ps/why_probe.py and scripts/figures/ps/why.py: the validators' judgements written down as the recipe
makes them, and what the why-table computes from them."""

import argparse
import statistics
import sys

import pytest
import torch
from conftest import ROOT, TINY, child_env, launch_ranks, read_summary, recipe_command

from recipes.ps import steps
from scripts.figures.ps import why as ps_why
from scripts.figures.ps import why_probe as ps_probe

# 1 server, 1 validator, 2 workers on 24 of the 48 tiny images (12 each): 3 rounds of 2 steps of 2 an epoch
PS = ["--epochs", "2", "-b", "2", "--validators", "1", "--validation-split", "0.5", "--local-steps", "2"]


def probed(tiny_data, out, probe_flags, flags):
    """The recipe on 4 ranks under the probe (and, as every ps test, under scripts/harness/nccl_rules.py)."""
    recipe = recipe_command("ps", [tiny_data, *TINY, *PS, *flags, "--out", out])
    command = [sys.executable, str(ROOT / "scripts" / "figures" / "ps" / "why_probe.py"), "--judgements",
               str(out / "probe"),
               *probe_flags, "--", *recipe[1:]]
    result = launch_ranks(command, 4, child_env(), 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return ps_why.probe_lines(out), read_summary(out)


def test_the_probe_writes_down_every_tensor_sync_zenops_judges_as_the_run_counts_it(tiny_data, tmp_path):
    lines, summary = probed(tiny_data, tmp_path / "sync", [],
                            ["--mode", "sync", "--aggregate", "zenops", "--worker-subsample", "0.5", "--byzantine",
                             "1", "--attack", "signflip", "--attack-scale", "10"])  # (worker 0, rank 2, lies)
    tensors = [t for t in lines if t["rule"] == "zenops"]
    assert len(tensors) == summary["honest_tensors_pushed"] + summary["byzantine_tensors_pushed"]
    assert summary["honest_tensors_pushed"] > 0 and summary["byzantine_tensors_pushed"] > 0
    rejected = [t for t in tensors if t["dot"] <= -0.001 or t["square"] >= 1.6]
    assert len(rejected) == summary["honest_tensors_rejected"] + summary["byzantine_tensors_rejected"]
    params = (summary[f"{who}_params_{what}"] for what in ("rejected", "pushed") for who in ("honest", "byzantine"))
    assert ps_why.rejections(lines, 0, 0.5)["honest_params_rejected"] == round(
        100 * (next(params) + next(params)) / (next(params) + next(params)), 1)
    # each tensor is its sender's: the liar's (rank 2) flipped x 10, the honest worker's (rank 3) not
    liar, honest = ([t["square"] for t in tensors if t["sender"] == rank] for rank in (2, 3))
    assert liar and honest and statistics.median(liar) > 10 * statistics.median(honest)
    # and it pushed in a round it joined, the validator's rounds being the workers' (6 in 2 epochs)
    assert {t["round"] for t in tensors} <= set(range(6))
    drawn = argparse.Namespace(seed=0, worker_subsample=0.5)
    assert all(steps.joins(drawn, t["sender"] - 2, t["round"]) for t in tensors)


def test_the_probe_writes_down_what_zeno_plus_plus_judged_it_on(tiny_data, tmp_path):
    lines, summary = probed(tiny_data, tmp_path / "async", ["--zeno-plus-plus-step", "at-most-v"],
                            ["--mode", "async", "--aggregate", "zeno++", "--momentum", "0", "--local-steps", "1",
                             "--attack", "signflip", "--attack-scale", "10", "--attack-prob", "0.5",
                             "--attack-draw", "push"])
    pushes = [p for p in lines if p["rule"] == "zeno++"]
    pushed = summary["honest_pushed"] + summary["byzantine_pushed"]
    assert len(pushes) >= pushed > 0  # (pushes judged after the servers' last update: not counted)
    # its test, from the logged norms: lr0 cos ||v||^2 >= rho ||g||^2, rho 0.01 lr0 (eps 0; a near-tie either way)
    for p in pushes:
        margin = p["cos"] * p["v"] ** 2 - 0.01 * p["g"] ** 2
        assert p["accepted"] == (margin >= 0) or abs(margin) < 1e-5 * p["g"] ** 2
    assert 0 < sum(p["accepted"] for p in pushes) < len(pushes)  # (the flipped x 10 rejected)
    # which pushes lied (the flipped x 10: 10 x as long), and the validator's loss and version where it computed v
    lies, honest = [p for p in pushes if p["lie"]], [p for p in pushes if not p["lie"]]
    assert len(lies) >= summary["byzantine_pushed"] > 0 and honest
    assert statistics.median(p["g"] for p in lies) > 5 * statistics.median(p["g"] for p in honest)
    assert all(0 < p["v_loss"] < 10 and isinstance(p["behind"], int) for p in pushes)
    assert all(abs(p["behind"]) <= len(pushes) for p in pushes)  # (versions: one a push applied, at most)


def test_what_the_probe_applies_of_an_accepted_gradient():
    g, v = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 10.0])  # ||g|| 5, ||v|| 10
    rescaled = g * 2
    assert torch.equal(ps_probe.applied(g, v, rescaled, None), rescaled)  # Zeno++'s
    assert torch.equal(ps_probe.applied(g, v, rescaled, "g"), g)
    assert torch.equal(ps_probe.applied(g, v, rescaled, "at-most-v"), g)  # (it would lengthen g: g as pushed)
    assert ps_probe.applied(g, v / 5, rescaled / 5, "at-most-v").norm().item() == pytest.approx(2.0)  # shortened


def test_the_why_table_splits_rejections_by_test_by_third_and_by_the_round_before():
    def tensor(round_, sender, numel, dot, square):
        return {"rule": "zenops", "round": round_, "sender": sender, "tensor": 0, "numel": numel, "cos": 0.0,
                "dot": dot, "square": square}
    lines = [tensor(0, 2, 10, 0.5, 1.0), tensor(0, 3, 30, -0.5, 1.0),  # round 0: one fails the sign test
             tensor(1, 2, 20, 0.5, 2.0), tensor(1, 3, 20, 0.5, 1.0),  # round 1: one fails the norm test
             tensor(2, 2, 10, -0.5, 2.0), tensor(2, 3, 10, 0.5, 1.0)]  # round 2: one fails both
    found = ps_why.rejections(lines, 0, 1.0)
    assert found == {"honest_params_rejected": 60.0, "sign_failed": 40.0, "norm_failed": 30.0,
                     "first_third_rejected": 75.0, "last_third_rejected": 50.0}
    found = ps_why.rejections(lines, 0, 0.5)  # seed 0: worker 0 (rank 2) sat out round 0, worker 1 round 1
    assert (found["after_sit_out_rejected"], found["after_push_rejected"]) == (66.7, 33.3)  # 20 of 30, 10 of 30


def test_the_why_table_measures_the_steps_each_way_of_applying_zeno_plus_plus_accepted_gradients():
    lines = [{"rule": "zeno++", "g": 1.0, "v": 3.0, "accepted": True},
             {"rule": "zeno++", "g": 2.0, "v": 3.0, "accepted": True},
             {"rule": "zeno++", "g": 8.0, "v": 2.0, "accepted": True},
             {"rule": "zeno++", "g": 0.5, "v": 9.0, "accepted": False}, {"rule": "zenops async"}]
    found = {step: ps_why.zeno_plus_plus(lines, step) for step in (None, "g", "at-most-v")}
    assert found[None] == {"accepted": 75.0, "lengthened": 66.7, "longest_step": 1.0}  # (at v: 3, 3, 2)
    assert found["g"]["longest_step"] == 4.0  # 8 / 2
    assert found["at-most-v"]["longest_step"] == 1.0  # 1, 2, 2
    assert ps_why.zeno_plus_plus([{"rule": "zeno++", "g": 1.0, "v": 1.0, "accepted": False}], None) == \
        {"accepted": 0.0}


def test_the_why_text_names_the_attacks_that_leave_the_plain_rule_as_it_was():
    from scripts.figures.ps.render_why import unbroken

    def runs(aggregate, attack, top1s):
        return [{"part": "sync-2v", "aggregate": aggregate, "attack": attack, "seed": str(seed), "diverged": "0",
                 "top1": str(top1)} for seed, top1 in enumerate(top1s)]
    rows = [*runs("mean", "none", [96, 96.5, 97]), *runs("mean", "random x8", [96, 96.2, 96.4]),
            *runs("mean", "signflip x6", [10, 11, 12]), *runs("zenops", "random x8", [97, 97, 97])]
    text = unbroken(rows)
    assert "sync-2v, random x8: `mean` 96.2 (96.0\u201396.4) against 96.5 (96.0\u201397.0) without an attack" in text
    assert "signflip" not in text and "zenops" not in text
    assert unbroken(rows[:3]).endswith(": none.")
    above = unbroken([*rows[:3], *runs("mean", "N(0,1)", [97.5, 97.6, 97.7])])  # (all of it above: listed too)
    assert "sync-2v, N(0,1): `mean` 97.6 (97.5\u201397.7) against 96.5 (96.0\u201397.0)" in above


def test_the_why_table_counts_the_lies_zeno_plus_plus_accepted_and_where_its_loss_peaked():
    def push(lie, accepted, v_loss):
        return {"rule": "zeno++", "g": 1.0, "v": 1.0, "accepted": accepted, "lie": lie, "v_loss": v_loss}
    lines = [push(False, True, 9.0)] + [push(False, True, 2.0)] * 9  # (the first tenth's loss is left out)
    lines += [push(True, True, 2.0), push(True, False, 2.0), push(True, True, 6.0), push(True, True, 2.0)]
    found = ps_why.zeno_plus_plus(lines, None)
    assert (found["lies_pushed"], found["lies_accepted"], found["peak_loss"], found["lies_before_peak"]) == \
        (4, 3, 6.0, 1)  # (the lie judged where the loss peaked is not before it)


def test_the_signflip_text_counts_the_runs_under_90_percent_and_tests_the_difference():
    from scripts.figures.rendering import fisher
    from scripts.figures.ps.render_why import signflip

    assert fisher(3, 8, 1, 8) == pytest.approx(0.5692, abs=1e-4)  # (scipy.stats.fisher_exact's)
    assert fisher(8, 8, 0, 8) == pytest.approx(0.000155, abs=1e-6) and fisher(0, 8, 0, 8) == pytest.approx(1.0)

    def runs(top1s, peaks, lies):
        return [{"top1": str(t), "diverged": "0", "epochs": "22", "peak_loss": str(p), "lies_pushed": "50",
                 "lies_accepted": str(a), "lies_before_peak": str(a)} for t, p, a in zip(top1s, peaks, lies)]
    label, attacked = "Zeno++, batch 32, at its authors' learning rate an image", ", signflip x10, p 0.2 per push"
    earlier = "g at the length of v (Zeno++), batch 32, at its authors' learning rate an image"
    text = signflip({label: runs([95, 10, 96], [2.2, 16.3, 2.1], [0, 0, 0]),
                     label + attacked: runs([10, 70, 95], [6.4, 3.0, 2.2], [1, 0, 0])},
                    {earlier: runs([90, 91, 92], [2, 2, 2], [0, 0, 0]), earlier + attacked: runs([60], [9], [0])})
    assert ("Over 22 epochs: 2 of 3 runs under 90 % with the sign flip, 1 of 3 without (Fisher's exact p = 1.00); "
            "1 lies accepted of 150 pushed, 1 before the highest loss of their run.") in text
    assert "highest loss: 3.00 to 16.30 in the runs under 90 %, 2.10 to 2.20 in the others." in text
    assert ("The Zeno++ study's 1 and 3 runs of the same two rows reached 60.0 with the sign flip and 91.0 without; "
            "these 3 and 3: 58.3 and 67.0.") in text
