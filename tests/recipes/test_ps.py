"""The parameter-server recipe: push/pull against ddp, local steps against nd, chunks, the Zeno rules, the
attacks, async, bad input."""

import argparse
import re
import signal

import pytest
import torch
from conftest import (ROOT, TINY, assert_one_clear_line, free_port, read_summary, recipe_command, run_recipe,
                      start_python, wait_for_line)

from recipes.common import RecipeError, models, pushpull
from recipes.ps import attacks, roles, rules, steps, validators
from recipes.ps import train as ps

VALIDATED = ["--validation-split", "0.5"]  # 24 of the 48 tiny images for the validators, each all 24


def weights(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)


@pytest.mark.parametrize("servers", [1, 2])
def test_sync_mean_ends_with_ddps_weights(tiny_data, tmp_path, servers):
    """S servers and 2 workers, no attack: the same weights, momentum and lr as ddp on 2 processes."""
    ddp_out, ps_out = tmp_path / "ddp", tmp_path / "ps"
    run_recipe("ddp", [tiny_data, *TINY, "--epochs", "2", "--out", ddp_out], nproc=2)
    result = run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "--out", ps_out, "--servers", servers,
                               "--partition-bytes", "40000"], nproc=servers + 2)
    ddp, ps_state = weights(ddp_out), weights(ps_out)
    for key, value in ddp["model"].items():
        torch.testing.assert_close(ps_state["model"][key], value, atol=1e-5, rtol=0, msg=key)
    for key, value in ddp["optimizer"]["state"].items():
        torch.testing.assert_close(ps_state["optimizer"]["state"][key]["momentum_buffer"],
                                   value["momentum_buffer"], atol=1e-5, rtol=0)
    torch.manual_seed(0)  # the 6 steps moved every weight away from --seed 0's initialisation
    initial = models.build_model("lenet", 3).state_dict()
    assert all((ps_state["model"][key] - initial[key]).abs().max() > 1e-4 for key in initial)
    summary = read_summary(ps_out)
    assert summary["honest_pushed"] == 12 and summary["byzantine_pushed"] == summary["stale_dropped"] == 0
    assert summary["mode"] == "sync" and summary["aggregate"] == "mean" and summary["attack"] == "none"
    steps = [line for line in result.stdout.splitlines() if line.startswith("epoch 1 step ")]
    assert "images/s" not in steps[0] and "images/s" in steps[1]  # the first: a burst of pushes, no rate yet


def test_a_ps_checkpoint_evaluates_in_nd(tiny_data, tmp_path):
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "1", "--out", tmp_path / "ps"], nproc=3)
    result = run_recipe("nd", [tiny_data, *TINY, "-e", "--resume", tmp_path / "ps" / "best.pt",
                               "--out", tmp_path / "eval"])
    assert read_summary(tmp_path / "eval")["top1_correct"] == read_summary(tmp_path / "ps")["top1_correct"]
    assert "resuming" in result.stdout


@pytest.mark.parametrize("sizes,partition_bytes,servers", [
    ([1200, 16, 25600, 32, 262144, 128, 1280, 10], 4096, 3),
    ([10, 7, 3], 4, 2), ([5], 4_096_000, 1), ([1000, 1000, 1000], 400, 5)])
def test_chunks_cover_every_parameter_once_balanced_to_one_chunk(sizes, partition_bytes, servers):
    owned = pushpull.partition(sizes, partition_bytes, servers)
    chunks = sorted(chunk for server_chunks in owned for chunk in server_chunks)
    covered = [i for start, end in chunks for i in range(start, end)]
    assert covered == list(range(sum(sizes)))  # every element once, in one chunk
    assert all((end - start - 1) * 4 < partition_bytes for start, end in chunks)  # about --partition-bytes
    loads = [sum(end - start for start, end in server_chunks) for server_chunks in owned]
    assert max(loads) - min(loads) <= max(end - start for start, end in chunks)
    vector = torch.arange(sum(sizes), dtype=torch.float32)
    rebuilt = torch.zeros_like(vector)
    for server_chunks in owned:
        pushpull.put(rebuilt, server_chunks, pushpull.take(vector, server_chunks))
    assert torch.equal(rebuilt, vector)


def test_more_servers_than_chunks_is_one_line():
    with pytest.raises(RecipeError, match="make 1 chunk"):
        pushpull.partition([5], 4_096_000, 2)


def test_a_byzfl_rule_without_byzfl_is_one_line_naming_the_extra(monkeypatch):
    """pip install -e . brings no byzfl (an extra): its rules say what to install, before any process starts."""
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "byzfl" else found(name, *a))
    with pytest.raises(RecipeError, match=r"--aggregate median is byzfl's: pip install byzfl \(or pip install -e "):
        ps.parse_args(["data", "--aggregate", "median"])
    assert ps.parse_args(["data", "--aggregate", "phocas"]).aggregate == "phocas"  # (the recipe's own rules)


def honest_and_flipped():
    generator = torch.Generator().manual_seed(0)
    v = torch.randn(1000, generator=generator)
    honest = v + 0.3 * torch.randn(1000, generator=generator)  # a noisy estimate of the same update
    return v, honest, -4 * honest


def test_zenops_sync_judges_each_tensor_exactly_where_its_formula_says():
    """Per tensor, (the sign test passed, the norm test passed): mean(u v) > eta mean(v^2), mean(u^2) < (1 + rho)
    mean(v^2)."""
    v, honest, flipped = honest_and_flipped()
    assert rules.zenops_sync(honest, v, [600, 400], eta=-0.001, rho=0.6) == [(True, True)] * 2
    assert [sign for sign, _ in rules.zenops_sync(flipped, v, [600, 400], eta=-0.001, rho=0.6)] == [False, False]
    v = torch.ones(4)  # two tensors of 2, mean(v^2) = 1 in each
    assert rules.zenops_sync(torch.tensor([0.5, 0.5, 0.5, 0.5]), v, [2, 2], 0.4, 0.6) == [(True, True)] * 2  # > 0.4
    assert rules.zenops_sync(torch.tensor([0.5, 0.5, 0.5, 0.5]), v, [2, 2], 0.5, 0.6) == [(False, True)] * 2  # not >
    assert rules.zenops_sync(torch.tensor([1.2, 1.2, 1.3, 1.3]), v, [2, 2], 0.0, 0.6) == [(True, True), (True, False)]
    assert rules.zenops_sync(torch.tensor([1.0, 1.0, -1.0, -1.0]), v, [2, 2], 0.0, 0.6) == [(True, True), (False, True)]
    # a liar inside the norm bound: -1.2 v has mean(u^2) 1.44 < 1.6, and only the sign test rejects it
    assert rules.zenops_sync(-1.2 * v, v, [2, 2], -0.001, 0.6) == [(False, True)] * 2


def test_the_accepted_mean_is_taken_tensor_by_tensor():
    a, b = torch.tensor([1.0, 1.0, 2.0]), torch.tensor([3.0, 3.0, 4.0])
    whole = validators.tensor_of([2, 1], [(0, 3)])  # one server owning all 3 elements

    def mean_of_accepted(passed):  # a validator's sum and counts, divided by the server
        total = sum(rules.accepted_part(u, ok, [2, 1]) for u, ok in zip((a, b), passed))
        counts = torch.tensor([sum(ok[t] for ok in passed) for t in range(2)], dtype=torch.float32)
        return validators.accepted_mean([torch.cat([total, counts])], 3, whole)
    mean = mean_of_accepted([[True, True], [True, False]])
    assert torch.equal(mean, torch.tensor([2.0, 2.0, 2.0]))  # tensor 0: both; tensor 1: a alone
    assert torch.equal(mean_of_accepted([[False, False], [False, False]]), torch.zeros(3))
    # the servers' side: two validators' sums and counts, a server that owns elements 1 and 2 (tensors 0 and 1)
    owned = validators.tensor_of([2, 1], [(1, 3)])
    assert owned.tolist() == [0, 1]
    sums = [torch.tensor([1.0, 2.0, 1.0, 1.0]), torch.tensor([3.0, 0.0, 1.0, 0.0])]  # 2 values, then 2 counts
    assert torch.equal(validators.accepted_mean(sums, 2, owned), torch.tensor([2.0, 2.0]))
    assert torch.equal(validators.accepted_mean([torch.tensor([0.0, 0.0, 0.0, 0.0])], 2, owned), torch.zeros(2))


def test_zenops_async_clips_and_scales_each_tensor_as_its_formula_says():
    v, honest, flipped = honest_and_flipped()
    assert rules.zenops_async(honest, v, [1000], eta=-0.02, alpha=0.4)[1] == [True]
    update, passed = rules.zenops_async(flipped, v, [1000], eta=-0.02, alpha=0.4)
    assert passed == [False] and update @ v > 0  # alpha s u with s < 0: turned round
    v = torch.tensor([3.0, 4.0, 1.0, 0.0])  # ||v_0|| = 5
    update, passed = rules.zenops_async(torch.tensor([6.0, 8.0, 0.0, 2.0]), v, [2, 2], eta=0.5, alpha=0.4)
    assert passed == [True, False]  # s = 1: clipped to 5; s = 0 < 0.5: alpha x 0 x u
    assert torch.allclose(update, torch.tensor([1.2, 1.6, 0.0, 0.0]))
    update, passed = rules.zenops_async(torch.tensor([0.0, 1.0, 4.0, -3.0]), v, [2, 2], eta=0.0, alpha=0.5)
    assert passed == [True, True] and torch.allclose(update, torch.tensor([0.0, 0.5, 0.4, -0.3]))  # 2nd: clipped to 1


def test_zeno_scores_with_a_penalty_scaled_by_lr_and_dimension_and_keeps_the_n_minus_b_best():
    v, honest, flipped = honest_and_flipped()

    def loss_at(weights):  # f(x) = ||x||^2 / 2, whose gradient at x is x
        return 0.5 * (weights ** 2).sum().item()

    x = v.clone()  # the gradient at x is v
    scores = rules.zeno_scores(loss_at, x, [honest, flipped, honest], lr=0.1, rho_ratio=200)
    assert rules.zeno_keep(scores, 1) == [0, 2]  # the flipped one scores lowest
    g, lr = torch.tensor([1.0, 0.0, 0.0, 3.0]), 0.5  # exactly: f(x) - f(x - lr g) - lr / ratio x mean(g^2)
    x = torch.tensor([2.0, 1.0, 0.0, 0.0])
    expected = loss_at(x) - loss_at(x - lr * g) - lr / 200 * (1 + 9) / 4
    assert rules.zeno_scores(loss_at, x, [g], lr, 200) == [pytest.approx(expected)]
    assert rules.zeno_keep([0.3, -1.0, 2.0, 0.1], 2) == [0, 2]


def test_zeno_plus_plus_uses_the_base_lr_and_the_norm_before_rescaling():
    v, honest, flipped = honest_and_flipped()
    assert rules.zeno_plus_plus(honest, v, base_lr=0.1, rho=1e-3, eps=0)[1]
    assert not rules.zeno_plus_plus(flipped, v, base_lr=0.1, rho=1e-3, eps=0)[1]
    v = torch.tensor([1.0, 0.0])  # g is rescaled to ||v|| = 1: g' = (0, 1), <g', v> = 0; ||g||^2 = 25 before
    g, accepted = rules.zeno_plus_plus(torch.tensor([0.0, 5.0]), v, base_lr=0.1, rho=0.0004, eps=0.1)
    assert torch.allclose(g, torch.tensor([0.0, 1.0])) and accepted  # 0 - 0.0004 x 25 + 0.01 >= 0
    assert not rules.zeno_plus_plus(torch.tensor([0.0, 5.0]), v, base_lr=0.1, rho=0.00041, eps=0.1)[1]
    g, accepted = rules.zeno_plus_plus(torch.tensor([3.0, 4.0]), v, base_lr=0.2, rho=0.008, eps=0)  # cos 0.6
    assert accepted == (0.2 * 0.6 - 0.008 * 25 >= 0) is False  # 0.12 - 0.2 < 0: its ||g|| = 5 counts, not 1


def test_phocas_averages_the_values_nearest_the_trimmed_mean():
    vectors = torch.tensor([[1.0, 10.0], [2.0, 11.0], [3.0, 12.0], [100.0, -50.0]])
    # b = 1: trimmed means 2.5 and 10.5; the 3 nearest: 1, 2, 3 and 10, 11, 12
    assert torch.allclose(rules.phocas(vectors, 1), torch.tensor([2.0, 11.0]))


def test_the_trim_ratio_draws_b_from_each_rounds_pushes_as_zenops_validators():
    """ZenoPS's trimmed mean trims int(min((n - 2) // 2, 0.2 n)), its phocas int(max(1, 0.2 n)), and neither
    applies anything from 2 pushes or fewer (zeno_ps byteps/mxnet/validator.py 66-90)."""
    pushes = [torch.tensor([float(v)]) for v in (1, 2, 3, 100, -50)]
    assert rules.aggregate("trimmed-mean", pushes[:4], 0, trim_ratio=0.2).item() == 26.5  # n 4: b 0, the mean
    assert rules.aggregate("trimmed-mean", pushes, 0, trim_ratio=0.2).item() == 2.0  # n 5: b 1, of 1, 2, 3
    assert rules.aggregate("phocas", pushes[:4], 0, trim_ratio=0.2).item() == 2.0  # n 4: b 1, the 3 nearest 2.5
    assert rules.aggregate("trimmed-mean", pushes[:2], 0, trim_ratio=0.2).item() == 0.0
    assert rules.aggregate("phocas", pushes[:2], 0, trim_ratio=0.2).item() == 0.0
    assert rules.aggregate("trimmed-mean", pushes[:4], 1).item() == 2.5  # --zeno-b 1: b 1 whatever the round's n


def test_phocas_rejects_a_sign_flip():
    honest = torch.tensor([[1.0, 2.0], [1.2, 2.2], [0.8, 1.8]])
    flipped = -4 * honest[:1]  # b = 1: trimmed means 0.9 and 1.9; the 3 nearest: the honest values
    assert torch.allclose(rules.phocas(torch.cat([honest, flipped]), 1), torch.tensor([1.0, 2.0]))
    generator = torch.Generator().manual_seed(0)  # 1000 coordinates: 3 noisy estimates of v, one of them flipped
    v = torch.randn(1000, generator=generator)
    honest = v + 0.3 * torch.randn(3, 1000, generator=generator)
    stacked = torch.cat([honest, -4 * honest[:1]])
    result = rules.phocas(stacked, 1)
    # the flipped value is dropped where it is not among the 3 nearest the trimmed mean: all but the coordinates
    # where every value is near 0 (92% of them here)
    assert torch.isclose(result, honest.mean(dim=0)).float().mean() > 0.85
    assert torch.nn.functional.cosine_similarity(result, v, dim=0) > 0.95  # along v, as the honest mean
    assert torch.nn.functional.cosine_similarity(stacked.mean(dim=0), v, dim=0) < 0  # the plain mean turns round


def attacker(attack, scale=2.0, byzantine=0, prob=0.0, index=0, seed=0, draw="tensor", sizes=(10000,), clean=0):
    return attacks.Attacker(argparse.Namespace(attack=attack, attack_scale=scale, byzantine=byzantine, attack_prob=prob,
                                               attack_draw=draw, seed=seed), index, list(sizes), clean)


def test_each_attack_pushes_what_its_paper_says_tensor_by_tensor():
    u = torch.arange(1.0, 10001.0) / 10000
    assert torch.equal(attacker("signflip", 6).poison(u, [True]), -6 * u)
    noise = attacker("gaussian", 2).poison(u, [True])  # N(0, s^2) in place of u
    assert abs(noise.mean()) < 0.1 and abs(noise.std() - 2) < 0.1 and abs(noise @ u / (noise.norm() * u.norm())) < 0.05
    direction = attacker("random", 8).poison(u, [True])  # s times ||u||, in a random direction
    assert torch.isclose(direction.norm(), 8 * u.norm()) and abs(direction @ u / direction.norm() / u.norm()) < 0.05
    assert not torch.equal(attacker("random", 8, seed=1).poison(u, [True]), direction)  # another seed, another one
    # two tensors, the second lying: the first is pushed as it is, the second at s times its own norm
    pushed = attacker("random", 8, sizes=(4000, 6000)).poison(u, [False, True])
    assert torch.equal(pushed[:4000], u[:4000]) and torch.isclose(pushed[4000:].norm(), 8 * u[4000:].norm())
    assert torch.equal(attacker("signflip", 6, sizes=(4000, 6000)).poison(u, [True, False])[4000:], u[4000:])
    target = torch.tensor([0, 1, 9])
    assert attacker("labelflip").relabel([True], 10)(target).tolist() == [9, 8, 0]
    assert attacker("labelflip").relabel([False], 10) is None and attacker("signflip", 6).relabel([True], 10) is None
    assert torch.equal(attacker("labelflip").poison(u, [True]), u)  # (computed on flipped labels already)


def test_who_lies_byzantine_always_and_every_worker_with_the_attack_probability():
    always = attacker("signflip", byzantine=1, index=0, sizes=(3, 4, 5))
    assert all(always.next_push(r) == [True] * 3 for r in range(100))
    assert not any(any(attacker("signflip", byzantine=1, index=1).next_push(r)) for r in range(100))
    workers = [attacker("signflip", prob=0.2, index=i, draw="push", sizes=(3, 4)) for i in range(3)]
    draws = [[worker.next_push(r) for r in range(2000)] for worker in workers]
    assert all(lies[0] == lies[1] for d in draws for lies in d)  # --attack-draw push: the whole push, or none of it
    assert all(0.17 < sum(lies[0] for lies in d) / 2000 < 0.23 for d in draws) and draws[0] != draws[1]
    again = attacker("signflip", prob=0.2, index=0, draw="push", sizes=(3, 4))
    assert draws[0] == [again.next_push(r) for r in range(2000)]  # seeded: by worker and round
    resumed = attacker("signflip", prob=0.2, index=0, draw="push", sizes=(3, 4))  # (a resumed run's, at round 1000)
    assert [resumed.next_push(r) for r in range(1000, 2000)] == draws[0][1000:]
    clean = attacker("signflip", byzantine=1, sizes=(3, 4), clean=5)  # --clean-epochs: nobody lies in those rounds
    assert [any(clean.next_push(r)) for r in range(8)] == [False] * 5 + [True] * 3
    # per tensor (ZenoPS's): each of 10 tensors on its own, so most pushes are partly poisoned, few whole
    pushes = [attacker("signflip", prob=0.2, sizes=[1] * 10, seed=seed).next_push(0) for seed in range(300)]
    tensors = [lie for lies in pushes for lie in lies]
    assert 0.17 < sum(tensors) / len(tensors) < 0.23 and sum(any(lies) for lies in pushes) / 300 > 0.8
    assert not any(all(lies) for lies in pushes)  # (0.2^10 per push)
    assert attacker("labelflip", prob=0.2, sizes=[1] * 10).per_tensor is False  # a data attack lies whole


def test_a_worker_pushes_in_a_round_with_the_subsample_probability_seeded():
    args = argparse.Namespace(worker_subsample=0.5, seed=3)
    draws = [[steps.joins(args, worker, r) for r in range(1000)] for worker in range(3)]
    assert all(0.45 < sum(d) / 1000 < 0.55 for d in draws) and draws[0] != draws[1]  # each worker on its own
    assert draws[0] == [steps.joins(argparse.Namespace(worker_subsample=0.5, seed=3), 0, r) for r in range(1000)]
    assert all(steps.joins(argparse.Namespace(worker_subsample=1.0, seed=3), 0, r) for r in range(100))


def test_zeno_plus_plus_refreshes_v_every_k_pushes_of_all_validators():
    store = torch.distributed.HashStore()
    args = argparse.Namespace(aggregate="zeno++")
    seen, refreshed = {0: 0, 1: 0}, []
    for arrival in range(40):  # two validators, their pushes alternating; k = 10
        validator = arrival % 2
        seen[validator], v = validators.refresh(args, store, seen[validator], 10, "v")
        refreshed += [arrival + 1] if v is None else []
    # each validator's v is new once every 10 pushes of both together (counted per validator: 19, 20, 39, 40)
    assert refreshed == [10, 11, 20, 21, 30, 31, 40]
    zenops = argparse.Namespace(aggregate="zenops")
    assert [validators.refresh(zenops, store, n, 3, "v")[1] for n in range(6)] == ["v", "v", None, "v", "v", None]


def test_counts_by_pushes_tensors_and_parameters():
    counts = attacks.counts([False, True, True], [10, 1, 100], passed=[False, True, False]).tolist()
    assert counts[:3] == [0, 1, 0] and abs(counts[3] - 2 / 3) < 1e-12  # by pushes: a poisoned push, 2 / 3 rejected
    assert counts[4:8] == [1, 2, 1, 1]  # by tensors: 1 honest (rejected), 2 lying (1 rejected)
    assert counts[8:12] == [10, 101, 10, 100]  # by parameters
    assert counts[12:] == [0, 0, 0, 0]  # no test named: none failed
    assert attacks.counts([False] * 2, [3, 4]).tolist() == [1, 0, 0, 0, 2, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]
    # zenops' tests, per tensor (sign passed, norm passed): the parameters that failed each, honest and lying apart
    tested = attacks.counts([False, True, True], [10, 1, 100], [False, False, False],
                            [(True, False), (False, True), (False, False)]).tolist()
    assert tested[12:] == [10, 0, 100, 101]  # honest: 10 failed the norm test; lying: 100 the norm, 101 the sign


def test_local_steps_push_the_change_of_the_weights_and_keep_the_momentum():
    torch.manual_seed(0)
    model, criterion = models.build_model("lenet", 3), torch.nn.CrossEntropyLoss()
    reference = models.build_model("lenet", 3)
    reference.load_state_dict(model.state_dict())
    batches = [(torch.rand(4, 3, 16, 16), torch.tensor([0, 1, 2, 0])) for _ in range(4)]
    vector = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), 0.0, momentum=0.9, weight_decay=1e-4)
    g, stats = steps.local_update(model, optimizer, criterion, vector, iter(batches[:1]), 1, 0.1, lambda *b: b)
    reference.zero_grad()
    criterion(reference(batches[0][0]), batches[0][1]).backward()
    assert torch.equal(g, torch.cat([p.grad.reshape(-1) for p in reference.parameters()]))  # one step: the gradient
    assert stats[3] == 4 and torch.equal(torch.nn.utils.parameters_to_vector(model.parameters()), vector)
    expected = torch.optim.SGD(reference.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    for round_batches in (batches[:2], batches[2:]):  # two rounds of 2 steps, each from the same weights
        torch.nn.utils.vector_to_parameters(vector.clone(), reference.parameters())
        for images, target in round_batches:
            expected.zero_grad()
            criterion(reference(images), target).backward()
            expected.step()
        u, stats = steps.local_update(model, optimizer, criterion, vector, iter(round_batches), 2, 0.1,
                                      lambda *b: b)
        moved = vector - torch.nn.utils.parameters_to_vector(reference.parameters()).detach()
        torch.testing.assert_close(u, moved, atol=1e-6, rtol=0)  # x - x_local, momentum carried into round 2
        assert stats[3] == 8


@pytest.mark.parametrize("aggregate,mode,extra", [("zenops", "sync", []),
                                                  ("zeno", "sync", ["--zeno-b", "1", "--validator-batch", "8"]),
                                                  ("zenops", "async", []),
                                                  ("zeno++", "async", ["--validator-batch", "8"])])
def test_validators_count_what_they_reject(tiny_data, tmp_path, aggregate, mode, extra):
    """One Byzantine worker in 3 pushes -4 g: every push is counted, pushed or rejected, by whom; its pushes are
    rejected and the honest ones pass."""
    out = tmp_path / "ps"
    result = run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "--out", out, "--validators", "1", "--mode", mode,
                               "--aggregate", aggregate, "--byzantine", "1", "--attack", "signflip",
                               "--attack-scale", "4", *VALIDATED, *extra], nproc=5)
    summary = read_summary(out)
    assert summary["honest_pushed"] + summary["byzantine_pushed"] == 6  # 3 workers, 1 step of 8 each, 2 epochs
    # each epoch's line of the validators' work: its counts add up to the summary's
    lines = re.findall(r"^epoch (\d) validators: pushes rejected ([\d.]+) of (\d+) honest, ([\d.]+) of (\d+) "
                       r"poisoned; parameters rejected ([\d,]+) of ([\d,]+) honest, ([\d,]+) of ([\d,]+) poisoned"
                       r"(?:; of the poisoned, ([\d,]+) failed the norm test, ([\d,]+) the sign test)?$",
                       result.stdout, re.M)
    assert [int(line[0]) for line in lines] == [1, 2], result.stdout
    total = [sum(float(line[i].replace(",", "")) for line in lines) for i in range(1, 9)]
    assert total == pytest.approx([summary[key] for key in (
        "honest_rejected", "honest_pushed", "byzantine_rejected", "byzantine_pushed", "honest_params_rejected",
        "honest_params_pushed", "byzantine_params_rejected", "byzantine_params_pushed")], abs=2e-3), lines
    assert 0 <= summary["honest_rejected"] <= summary["honest_pushed"]
    tests = [sum(float(line[i].replace(",", "") or 0) for line in lines) for i in (9, 10)]
    assert tests == [summary["byzantine_params_failed_norm"], summary["byzantine_params_failed_sign"]] if \
        (aggregate, mode) == ("zenops", "sync") else tests == [0, 0], lines  # (async: no norm test, no such line)
    if mode == "sync":
        assert summary["byzantine_pushed"] == 2 and summary["byzantine_rejected"] == 2
        return
    # async: the 6 pushes go to whichever worker comes first, but the 3 start together (1 to 3 are the attacker's)
    byzantine, rejected = summary["byzantine_pushed"], summary["byzantine_rejected"]
    assert byzantine >= 1, summary
    # -4 g scores cos(-g, v) = -cos(g, v), tensor by tensor for zenops: it rejects a tensor when that is below
    # --zeno-eta -0.02, wherever the attacker's own gradient agrees with v. A push on weights older than v's (the
    # order depends on the machine's load) can disagree with v on a tensor or two of lenet's 8: measured under load,
    # 7/8 to 8/8 of each push rejected. zeno++ accepts when cos(g, v) >= rho ||g||^2 / (lr0 ||v||^2) (rho 0.01
    # lr0, eps 0), a whole push at a time: a flip passes only where g disagrees with v; one may pass, not more
    if aggregate == "zenops":
        assert rejected >= 0.75 * byzantine, summary
    else:
        assert rejected >= max(1, byzantine - 1), summary
    assert summary["honest_rejected"] <= 1, summary  # the honest ones agree with v here: they pass


@pytest.mark.parametrize("attack", [["--byzantine", "1", "--attack", "signflip", "--attack-scale", "1.2"],
                                    ["--byzantine", "2", "--attack", "alie"]])
def test_a_liar_built_to_pass_the_norm_test_is_rejected_by_the_sign_test(tiny_data, tmp_path, attack):
    """Sync zenops, 3 workers, 2 local steps a push. One flips its update x 1.2: built to pass the norm test (1.44 <
    1.6 x mean(v^2) where its update is no longer than v), so what rejects it is the sign test, and the counts name
    it. ALIE (2 liars, mean - z std of their own updates, z the paper's z_max for 2 of 3: Phi^-1(2 / 3)): every liar
    pushes each round, and the counts say which test each rejected parameter failed."""
    out = tmp_path / "ps"
    result = run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "--out", out, "--validators", "1", "--aggregate",
                               "zenops", "--local-steps", "2", "-b", "4", *attack, *VALIDATED], nproc=5)
    summary = read_summary(out)
    liars = int(attack[1])
    assert summary["byzantine_pushed"] == 2 * liars and summary["honest_pushed"] == 2 * (3 - liars), summary
    pushed, failed_sign = summary["byzantine_params_pushed"], summary["byzantine_params_failed_sign"]
    rejected, failed_norm = summary["byzantine_params_rejected"], summary["byzantine_params_failed_norm"]
    assert max(failed_sign, failed_norm) <= rejected <= failed_sign + failed_norm, summary  # each by a test
    if attack[3] == "signflip":
        assert failed_sign >= 0.9 * pushed and failed_norm < failed_sign, summary
        assert "--attack signflip x 1.2 by workers 0..0 always" in result.stdout
    else:
        assert "--attack alie (mean - 0.431 std of the liars' updates) by workers 0..1 always" in result.stdout


def test_a_worker_sleeps_up_to_the_worker_delay_before_each_push_drawn_from_the_seed(monkeypatch):
    """--worker-delay W, ZenoPS's simulated asynchrony: before a push (not a round sat out), a uniform draw from [0, W)
    seconds, the same for the same seed, worker and round."""
    from recipes.ps import worker
    slept = []
    monkeypatch.setattr(worker.time, "sleep", slept.append)
    flags = argparse.Namespace(mode="async", local_steps=8, attack="none", byzantine=0, worker_delay=2.0, seed=0)
    u = torch.ones(3)
    for round_ in range(200):
        worker.prepare_push(flags, attacker("none", sizes=(3,)), 1, round_, u, torch.zeros(3), True, [False])
    assert len(slept) == 200 and 0 <= min(slept) < 0.1 and 1.9 < max(slept) < 2.0
    again = []
    monkeypatch.setattr(worker.time, "sleep", again.append)
    worker.prepare_push(flags, attacker("none", sizes=(3,)), 1, 0, u, torch.zeros(3), True, [False])
    worker.prepare_push(flags, attacker("none", sizes=(3,)), 1, 1, u, torch.zeros(3), False, [False])  # sat out
    assert again == slept[:1]


def test_an_alie_liar_shares_its_update_in_every_round_it_sits_out_too(monkeypatch):
    """ALIE's liars gather their updates every round (a collective of theirs): a liar that sits a round out takes
    part all the same, or the others would wait for it; an honest worker never does."""
    from recipes.ps import worker
    gathered = []
    monkeypatch.setattr(attacks.dist, "all_gather", lambda every, update, group: gathered.append(update) or
                        every.__setitem__(slice(None), [update, update + 2]))
    monkeypatch.setattr(attacks.dist, "get_world_size", lambda group: 2)
    flags = argparse.Namespace(mode="sync", local_steps=8, attack="alie", byzantine=2, worker_delay=0, seed=0)
    liar, honest, u = attacker("alie", 1.5, byzantine=2, sizes=(3,)), attacker("alie", 1.5, byzantine=2, index=2,
                                                                              sizes=(3,)), torch.ones(3)
    pushed, _, _ = worker.prepare_push(flags, liar, 0, 0, u, torch.zeros(3), False, [False])  # (sits it out)
    assert len(gathered) == 1 and torch.equal(pushed, u)
    worker.prepare_push(flags, honest, 2, 0, u, torch.zeros(3), True, [False])
    assert len(gathered) == 1


def test_alie_pushes_the_mean_minus_z_std_of_the_liars_own_updates(monkeypatch):
    """Every liar gathers the liars' honest updates of the round and pushes, as Baruch et al.'s code, mean - z std
    (the population std), coordinate-wise; a liar that sits the round out takes part in the gather and pushes
    nothing. z defaults to the paper's z_max: 1.15 for 4 liars of 8 workers (their Phi^-1(7 / 8))."""
    theirs = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([3.0, 2.0, 0.0])]

    def all_gather(every, update, group):
        every[:] = [update, *theirs]
    monkeypatch.setattr(attacks.dist, "all_gather", all_gather)
    monkeypatch.setattr(attacks.dist, "get_world_size", lambda group: 3)
    liar = attacker("alie", 1.5, byzantine=3, sizes=(2, 1))
    mine = torch.tensor([2.0, 2.0, 2.0])
    # (the three's mean: 2, 2, 2; their population variances: 2 / 3, 0, 8 / 3)
    expected = torch.tensor([2.0, 2.0, 2.0]) - 1.5 * torch.tensor([(2 / 3) ** 0.5, 0.0, (8 / 3) ** 0.5])
    torch.testing.assert_close(liar.poison(mine, liar.next_push(0)), expected)
    assert round(attacks.alie_z_max(8, 4), 4) == 1.1503 and round(attacks.alie_z_max(8, 2), 4) == 0.3186  # (5 / 8)
    assert liar.next_push(0) == [True, True]  # (a whole push)
    assert torch.equal(liar.poison(mine, [False, False]), mine)


@pytest.mark.parametrize("aggregate", ["naive-async", "zenops"])
def test_the_naive_async_validator_computes_v_as_zenops_does_and_leaves_it_unused(monkeypatch, aggregate):
    """ZenoPS's validator runs its held-out forward and backward whatever the rule: naive-async's computes v at the
    latest weights as often as zenops' (at the start, then every k = 2 pushes of its 2 workers), on as many images
    a step, and forwards alpha u all the same."""
    model = torch.nn.Linear(3, 2)  # (tensors of 6 and 2: a push is their 8 numbers, then a lie flag each)
    pushes = [(2 + i % 2, torch.cat([torch.full((8,), float(i + 1)), torch.zeros(2)])) for i in range(4)]
    arrivals = [(pushpull.header(pushpull.PUSH), worker, [0], u) for worker, u in pushes]
    arrivals += [(pushpull.header(pushpull.BYE), worker, None, None) for worker in (2, 3)]
    computed, forwarded = [], []
    monkeypatch.setattr(pushpull, "pull", lambda vector, chunks, versions: (False, 0.1))
    monkeypatch.setattr(pushpull, "recv_candidate", lambda *args: arrivals.pop(0))
    monkeypatch.setattr(pushpull, "send", lambda message, dst, payload=None: forwarded.append(payload))
    monkeypatch.setattr(steps, "local_optimizer", lambda args, model: None)
    monkeypatch.setattr(steps, "local_update", lambda *args: computed.append(args[4]) or (torch.ones(8), None))
    monkeypatch.setattr(validators.dist, "PrefixStore", lambda *args: None)
    monkeypatch.setattr(validators.dist.distributed_c10d, "_get_default_store", lambda: None)
    args = ps.parse_args(["data", "--mode", "async", "--validators", "1", "--aggregate", aggregate, "-b", "8"])
    roles.check_world(args, 4)
    assert args.validator_batch == 8  # (the batch ZenoPS's validator steps on, whatever the rule)
    validators.validator_async(args, roles.Layout(1, 1, 4), 1, model, "held-out batches", [[(0, 8)]], None, 0.1,
                               None, None)
    assert len(computed) == 3 and len(forwarded) == 4  # (at the start, after the 2nd push, after the 4th)
    if aggregate == "naive-async":
        torch.testing.assert_close(forwarded[0], 0.4 * torch.ones(8))  # (alpha u, v unused)


def test_naive_async_in_the_validators_moves_alpha_of_the_push_once(tiny_data, tmp_path):
    """ZenoPS runs its naive-async baseline in the validators: through one validator, one push of 6 local steps at
    alpha 0.5 moves the servers' weights as naive-async on the servers does (the same held-out share), neither
    scaled twice nor not at all."""
    runs = {name: tmp_path / name for name in ("servers", "validators")}
    for name, extra in (("servers", []), ("validators", ["--validators", "1"])):
        run_recipe("ps", [tiny_data, *TINY, "--epochs", "1", "-b", "4", "--out", runs[name], "--local-steps", "6",
                          "--mode", "async", "--aggregate", "naive-async", "--zeno-alpha", "0.5", *VALIDATED, *extra],
                   nproc=2 + len(extra) // 2)
    on_servers, in_validators = weights(runs["servers"])["model"], weights(runs["validators"])["model"]
    torch.manual_seed(0)
    initial = models.build_model("lenet", 3).state_dict()
    for key, value in on_servers.items():
        assert (value - initial[key]).abs().max() > 1e-4, key
        torch.testing.assert_close(in_validators[key], value, atol=1e-6, rtol=0, msg=key)
    assert read_summary(runs["validators"])["honest_pushed"] == 1


def test_async_validators_forward_a_round_a_worker_sat_out_as_a_skip(tiny_data, tmp_path):
    """Async zenops, 3 workers pushing in a round with probability 0.5: the validator passes each round a worker
    sat out on as a skip, so the servers count 2 x 6 rounds (3 workers x 8 images / 4) and the run ends; fewer were
    pushed."""
    out = tmp_path / "ps"
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "-b", "4", "--out", out, "--validators", "1", "--mode",
                      "async", "--aggregate", "zenops", "--worker-subsample", "0.5", *VALIDATED], nproc=5)
    summary = read_summary(out)
    assert summary["epochs"] == 2 and 0 < summary["honest_pushed"] < 2 * 6, summary


def test_async_zeno_plus_plus_with_two_servers_and_a_refresh_every_two_pushes_accepts_honest_pushes(tiny_data,
                                                                                                   tmp_path):
    """Each validator's first pull brings the weights, whatever the refresh period."""
    out = tmp_path / "ps"
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "--warmup-epochs", "1", "--out", out, "--servers", "2",
                      "--partition-bytes", "40000", "--validators", "2", "--mode", "async", "--aggregate", "zeno++",
                      "--zeno-delay", "2", "-b", "4", "--validator-batch", "4", *VALIDATED], nproc=7)
    summary = read_summary(out)
    assert summary["honest_pushed"] == 2 * 3 * 2
    # v on 4 images, up to 2 pushes old, disagrees with a few pushes
    assert summary["honest_rejected"] <= 6, summary  # at least half of them pass


def test_a_validation_split_without_validators_is_held_out_all_the_same(tiny_data, tmp_path):
    """A run without validators beside one with them trains on the same shards: 24 of the 48 images held out,
    12 a worker, 1 round of 8 an epoch (without the split: 3, test_sync_mean_ends_with_ddps_weights)."""
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "1", "--out", tmp_path, *VALIDATED], nproc=3)
    assert read_summary(tmp_path)["honest_pushed"] == 2


def test_local_steps_with_one_worker_train_nds_model_and_naive_async_moves_alpha_of_it(tiny_data, tmp_path):
    """One worker taking 3 SGD steps a push, the server moving by its change: nd's weights after the same steps.
    ZenoPS's naive_async, one push of 6 steps at alpha 0.5: halfway to nd's weights. --worker-subsample, one round
    an epoch (seed 0: sits the first out, pushes the second): the worker goes on from the servers' weights plus
    its change of epoch 1 (here nd's after epoch 1); sync, it pushes epoch 2's change alone, so the server ends at
    its start + (nd's 2 epochs - nd's 1); async, it pushes all it trained since its pull: nd's 2 epochs."""
    nd_out, nd2_out, ps_out, naive_out, sub_out, async_out = (tmp_path / name for name in
                                                              ("nd", "nd2", "ps", "naive", "sub", "async"))
    run_recipe("nd", [tiny_data, *TINY, "--epochs", "1", "--out", nd_out])
    run_recipe("nd", [tiny_data, *TINY, "--epochs", "2", "--out", nd2_out])
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "1", "--out", ps_out, "--local-steps", "3"], nproc=2)
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "1", "--out", naive_out, "--local-steps", "6", "--mode", "async",
                      "--aggregate", "naive-async", "--zeno-alpha", "0.5"], nproc=2)
    for out, mode in ((sub_out, "sync"), (async_out, "async")):
        run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "--out", out, "--local-steps", "6", "--worker-subsample",
                          "0.5", "--mode", mode], nproc=2)
    nd_state, ps_state, naive_state = weights(nd_out), weights(ps_out), weights(naive_out)
    nd2_state, sub_state, async_state = weights(nd2_out), weights(sub_out), weights(async_out)
    torch.manual_seed(0)
    initial = models.build_model("lenet", 3).state_dict()
    for key, value in nd_state["model"].items():
        torch.testing.assert_close(ps_state["model"][key], value, atol=1e-5, rtol=0, msg=key)
        assert (value - initial[key]).abs().max() > 1e-4, key  # (the 6 steps moved it)
        torch.testing.assert_close(naive_state["model"][key], (initial[key] + value) / 2, atol=1e-5, rtol=0, msg=key)
        torch.testing.assert_close(sub_state["model"][key], initial[key] + nd2_state["model"][key] - value, atol=1e-5,
                                   rtol=0, msg=key)
        torch.testing.assert_close(async_state["model"][key], nd2_state["model"][key], atol=1e-5, rtol=0, msg=key)
    assert [steps.joins(argparse.Namespace(worker_subsample=0.5, seed=0), 0, r) for r in (0, 1)] == [False, True]
    assert read_summary(sub_out)["honest_pushed"] == 1  # 1 round an epoch, the first sat out


def test_every_worker_lies_with_the_attack_probability_and_zenops_rejects_their_tensors(tiny_data, tmp_path):
    """3 workers, 2 local steps a push, each tensor of each push flipped x 6 with probability 0.5 (ZenoPS's draw):
    zenops rejects every flipped tensor, and counts the rejected ones by pushes, tensors and parameters."""
    out = tmp_path / "ps"
    result = run_recipe("ps", [tiny_data, *TINY, "-b", "4", "--epochs", "4", "--out", out, "--validators", "1",
                               "--aggregate", "zenops", "--local-steps", "2", "--attack", "signflip", "--attack-scale",
                               "6", "--attack-prob", "0.5", *VALIDATED], nproc=5)
    summary = read_summary(out)
    assert summary["honest_pushed"] + summary["byzantine_pushed"] == 3 * 4  # 8 images each: 1 push an epoch
    tensors = summary["honest_tensors_pushed"] + summary["byzantine_tensors_pushed"]
    lenet = list(models.build_model("lenet", 3).parameters())  # (8 tensors)
    assert tensors == 3 * 4 * len(lenet) and 25 <= summary["byzantine_tensors_pushed"] <= 71, summary
    assert summary["byzantine_tensors_rejected"] == summary["byzantine_tensors_pushed"], summary
    assert summary["byzantine_params_rejected"] == summary["byzantine_params_pushed"] > 0, summary
    assert summary["honest_params_pushed"] + summary["byzantine_params_pushed"] == 3 * 4 * sum(p.numel() for p in lenet)
    assert 0 <= summary["honest_tensors_rejected"] <= summary["honest_tensors_pushed"], summary  # (4 images: noisy)
    assert "2 local step(s) a push" in result.stdout and "every tensor of every push with probability 0.5" in \
        result.stdout


def test_sync_resumes_where_it_stopped_and_stops_everyone_at_the_desired_accuracy(tiny_data, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "--out", straight, "--servers", "2",
                      "--partition-bytes", "40000"], nproc=4)
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "1", "--out", resumed, "--servers", "2",
                      "--partition-bytes", "40000"], nproc=4)
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "--out", resumed, "--servers", "2",
                      "--partition-bytes", "40000", "--auto-resume"], nproc=4)
    for key, value in weights(straight)["model"].items():
        torch.testing.assert_close(weights(resumed)["model"][key], value, atol=1e-6, rtol=0, msg=key)
    early = tmp_path / "early"  # every rank ends with exit 0 (run_recipe checks torchrun's code)
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "5", "--out", early, "--desired-acc", "0.01", "--validators",
                      "1", "--aggregate", "zenops", *VALIDATED], nproc=4)
    assert read_summary(early)["epochs"] == 1


def test_async_never_applies_a_gradient_older_than_the_bound(tiny_data, tmp_path):
    out = tmp_path / "ps"
    run_recipe("ps", [tiny_data, *TINY, "-b", "4", "--epochs", "3", "--out", out, "--mode", "async",
                      "--max-staleness", "0"], nproc=4)
    summary = read_summary(out)
    assert summary["max_applied_staleness"] == 0
    assert summary["honest_pushed"] == 36  # 3 workers x 4 steps x 3 epochs, applied or dropped


def test_async_goes_on_when_a_worker_is_killed(tiny_data, tmp_path):
    """Launched process by process (torchrun would stop all of them): SIGKILL to one worker mid-run."""
    out, port = tmp_path / "ps", free_port()
    args = [tiny_data, *TINY, "-b", "4", "--epochs", "8", "--out", out, "--mode", "async", "--dist-timeout", "10",
            "--dist-url", f"tcp://127.0.0.1:{port}", "--world-size", "4"]
    outputs = [tmp_path / f"rank{rank}.out" for rank in range(4)]
    processes = [start_python(recipe_command("ps", [str(a) for a in [*args, "--rank", rank]]), open(output, "w"))
                 for rank, output in enumerate(outputs)]  # (each forked from the suite's fork server)
    try:  # rank 0 prints each step (its first line is no step of epoch 2): kill worker rank 3 in epoch 2
        wait_for_line(outputs[0], "\nepoch 2 step", running=processes)
        processes[3].send_signal(signal.SIGKILL)
        returncodes = [process.wait(timeout=120) for process in processes]
    finally:
        for process in processes:
            process.kill()
    output = outputs[0].read_text()
    every = "".join(f"\n--- rank {rank} (exit {code}) ---\n{path.read_text()[-1500:]}"
                    for rank, (path, code) in enumerate(zip(outputs, returncodes)))  # (each rank's own account)
    assert returncodes[:3] == [0, 0, 0], every
    summary = read_summary(out)
    assert summary["epochs"] == 8 and summary["honest_pushed"] == 8 * 3 * 4  # the others trained its share
    assert "done: top1" in output


@pytest.mark.parametrize("flags,world_size,phrase", [
    (["--servers", "2", "--validators", "1", "--aggregate", "zenops"], 3, "leave no worker in a world of 3"),
    (["--byzantine", "2", "--attack", "signflip"], 3, "--byzantine 2 must be smaller than the 2 worker(s)"),
    (["--byzantine", "2", "--attack", "signflip", "--aggregate", "median"], 5,
     "median tolerates fewer than half of the workers Byzantine: 2 of 4"),
    (["--byzantine", "2", "--attack", "gaussian", "--aggregate", "trimmed-mean"], 5, "fewer than half"),
    (["--byzantine", "1", "--attack", "signflip", "--aggregate", "krum"], 4, "krum needs more than 2 b + 2"),
    (["--aggregate", "zenops"], 4, "needs --validators"),
    (["--validators", "1", "--aggregate", "median"], 4, "score pushes with a Zeno rule"),
    (["--mode", "async", "--aggregate", "median"], 4, "--mode async applies each push alone"),
    (["--validators", "1", "--aggregate", "zeno++"], 4, "zeno++ is asynchronous"),
    (["--byzantine", "1"], 4, "--byzantine and --attack-prob need an --attack"),
    (["--validators", "3", "--aggregate", "zenops"], 6, "3 validators for 2 worker(s)"),
    (["--byzantine", "1", "--attack", "labelflip", "--mixup-alpha", "0.2"], 4, "not with --mixup-alpha"),
])
def test_impossible_roles_are_one_line(flags, world_size, phrase):
    with pytest.raises(RecipeError) as error:
        roles.check_world(ps.parse_args(["data", *flags]), world_size)
    assert phrase in str(error.value)


@pytest.mark.parametrize("flags,phrase", [
    (["--local-steps", "0"], "--local-steps must be at least 1, got 0"),
    (["--attack", "signflip", "--attack-prob", "1.5"], "--attack-prob is a probability in [0, 1], got 1.5"),
    (["--attack", "signflip", "--attack-prob", "-0.1"], "--attack-prob is a probability in [0, 1]"),
    (["--attack", "signflip", "--byzantine", "1", "--attack-scale", "-2"], "--attack-scale must be 0 or more"),
    (["--validators", "1", "--aggregate", "zenops", "--validator-batch", "0"], "--validator-batch must be at least 1"),
    (["--validators", "1", "--aggregate", "zeno", "--zeno-rho-ratio", "0"], "--zeno-rho-ratio must be positive"),
    (["--attack", "signflip"], "--attack signflip needs --byzantine K or --attack-prob q"),
    (["--attack-prob", "0.2"], "--byzantine and --attack-prob need an --attack"),
    (["--validators", "1", "--aggregate", "zeno", "--local-steps", "8"], "zeno judges gradients, as its authors: "
                                                                         "--local-steps 1, not 8"),
    (["--validators", "1", "--aggregate", "zeno++", "--mode", "async", "--local-steps", "2"], "--local-steps 1"),
    (["--attack", "gaussian", "--attack-prob", "0.2", "--aggregate", "median"],
     "--attack-prob leaves the number of liars to chance: give --aggregate median its --zeno-b b"),
    (["--validators", "1", "--aggregate", "zenops", "--rho", "-1"], "--rho must be 0 or more, got -1"),
    (["--validators", "1", "--aggregate", "zenops", "--mode", "async", "--zeno-alpha", "0"],
     "--zeno-alpha must be positive"),
    (["--validators", "1", "--aggregate", "zeno++", "--mode", "async", "--eps", "-0.1"], "--eps must be 0 or more"),
    (["--worker-subsample", "0"], "--worker-subsample is a probability in (0, 1], got 0"),
    (["--worker-subsample", "1.5"], "--worker-subsample is a probability in (0, 1], got 1.5"),
    (["--validators", "1", "--aggregate", "zeno", "--worker-subsample", "0.5"], "not with --worker-subsample"),
    (["--aggregate", "naive-async"], "naive-async is ZenoPS's asynchronous baseline: use --mode async"),
    (["--aggregate", "mean", "--validators", "1"], "--validators score pushes with a Zeno rule: --aggregate zenops"),
    (["--attack", "alie", "--byzantine", "1"], "--attack alie: the liars share their updates each round"),
    (["--attack", "alie", "--byzantine", "2", "--mode", "async", "--aggregate", "naive-async"], "--mode sync"),
    (["--worker-delay", "-1"], "--worker-delay must be 0 or more, got -1"),
    (["--aggregate", "trimmed-mean", "--trim-ratio", "0.5"], "--trim-ratio is a fraction in (0, 0.5), got 0.5"),
    (["--trim-ratio", "0.2"], "--trim-ratio sets the trim of --aggregate trimmed-mean or phocas, not mean"),
    (["--aggregate", "phocas", "--trim-ratio", "0.2", "--zeno-b", "1"], "not with --zeno-b"),
    (["--clean-epochs", "-1"], "--clean-epochs must be 0 or more, got -1"),
])
def test_impossible_flags_are_one_line(flags, phrase):
    with pytest.raises(RecipeError) as error:
        ps.parse_args(["data", *flags])
    assert phrase in str(error.value)


@pytest.mark.parametrize("flags,phrase", [
    ([], "1 server(s) and 0 validator(s) leave no worker in a world of 1"),
    (["--attack", "flood"], "argument --attack: invalid choice: 'flood'"),
    (["--attack", "ipm"], "argument --attack: invalid choice: 'ipm'"),
    (["--aggregate", "bulyan"], "argument --aggregate: invalid choice: 'bulyan'"),
    (["--attack-draw", "step"], "argument --attack-draw: invalid choice: 'step'"),
])
def test_bad_input_from_the_command_line(tiny_data, tmp_path, flags, phrase):
    result = run_recipe("ps", [tiny_data, *TINY, "--out", tmp_path / "out", *flags], expect_ok=False)
    assert_one_clear_line(result, phrase)


def test_validators_with_too_little_held_out_data_say_so(tiny_data, tmp_path):
    result = run_recipe("ps", [tiny_data, *TINY, "--out", tmp_path / "out", "--validators", "1", "--aggregate",
                               "zenops", "--validation-split", "0.1"], nproc=3, expect_ok=False)
    assert result.returncode != 0 and 'recipes/ps/train.py", line' not in result.stderr  # (torchrun's own traceback
    # follows: the launcher's ChildFailedError, naming the failed ranks)
    # every rank finds it and says it, rank 0 bare and the others with their rank; the first rank to exit ends
    # the run, so torchrun may stop the others before they have printed their line
    lines = [line for line in result.stderr.splitlines() if "error: --validation-split" in line]
    assert 1 <= len(lines) <= 3, result.stderr
    for line in lines:
        assert re.fullmatch(r"(\[rank [12]\] )?error: --validation-split 0\.1 holds out 5 train images: fewer than "
                            r"one batch of --validator-batch 8", line), line


def test_more_local_steps_than_an_epoch_holds_say_so(tiny_data, tmp_path):
    result = run_recipe("ps", [tiny_data, *TINY, "--out", tmp_path / "out", "--local-steps", "4"], nproc=3,
                        expect_ok=False)
    lines = [line for line in result.stderr.splitlines() if "error: " in line]
    assert 1 <= len(lines) <= 3 and result.returncode != 0, result.stderr
    for line in lines:
        assert re.fullmatch(r"(\[rank [12]\] )?error: train/ gives 24 images per worker, fewer than one round of "
                            r"--batch-size 8 x --local-steps 4", line), line


def test_the_deviations_from_the_authors_code_are_listed_once_each_with_a_line_it_cites():
    """recipes/ps/deviations.py is the one list: every row names what both do, where in the authors' code and why,
    and quotes a line among those it cites (scripts/checks/authors_lines.py checks the quotes against clones of
    the four repositories); every file it cites is named in FILES, in a repository with a commit; the README points
    to it; the long form holds the table it renders."""
    from scripts.checks.authors_lines import authors_code, cited, place
    from scripts.figures.ps.render_deviations import deviations

    rows, files, commits = authors_code("ps")
    assert {repository for repository, _ in files.values()} == set(commits)
    for row in rows:
        assert all(row[key] for key in ("here", "theirs", "where", "why")), row
        name, line, piece = row["shows"]
        places = dict(cited(row["where"], files, commits))
        assert all(repository in commits for repository, _ in places), row  # (every file by its short name)
        lines = places[place(files, commits, name)]  # (a file the row cites ...)
        assert min(lines) <= line <= max(lines) and piece, row  # (... and a line there)
    assert len({row["here"] for row in rows}) == len(rows)  # (each once)
    for module in (ROOT / "recipes" / "ps").glob("*.py"):  # (no other list of them)
        assert module.name == "deviations.py" or "departs from the authors' code" not in module.read_text() or \
            "deviations.py, the one list" in module.read_text(), module
    assert "deviations.py" in (ROOT / "recipes" / "ps" / "README.md").read_text()
    assert deviations() in (ROOT / "docs" / "results" / "ps.md").read_text()
