"""The parameter-server recipe: push/pull against ddp, chunks, the Zeno rules, async, bad input."""

import re
import signal
import subprocess

import pytest
import torch
from conftest import ROOT, TINY, child_env, free_port, read_summary, recipe_command, run_recipe
from test_bad_input import assert_one_clear_line

from recipes.common import RecipeError, models, pushpull
from recipes.ps import train as ps
from recipes.ps import zeno

VALIDATED = ["--validation-split", "0.5"]  # 24 of the 48 tiny images for the validators: a batch of 8 each


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


def honest_and_flipped():
    generator = torch.Generator().manual_seed(0)
    v = torch.randn(1000, generator=generator)
    honest = v + 0.3 * torch.randn(1000, generator=generator)  # a noisy estimate of the same gradient
    return v, honest, -4 * honest


def test_zenops_sync_accepts_exactly_where_its_formula_says():
    v, honest, flipped = honest_and_flipped()
    assert zeno.zenops_sync(honest, v, eta=-0.001, rho=0.6) and not zeno.zenops_sync(flipped, v, -0.001, 0.6)
    v = torch.tensor([1.0, 1.0])  # mean(v^2) = 1
    assert zeno.zenops_sync(torch.tensor([0.5, 0.5]), v, eta=0.4, rho=0.6)  # mean(g v) 0.5 > 0.4, mean(g^2) 0.25
    assert not zeno.zenops_sync(torch.tensor([0.5, 0.5]), v, eta=0.5, rho=0.6)  # 0.5 is not > 0.5
    assert zeno.zenops_sync(torch.tensor([1.2, 1.2]), v, eta=0.0, rho=0.6)  # mean(g^2) 1.44 < 1.6
    assert not zeno.zenops_sync(torch.tensor([1.3, 1.3]), v, eta=0.0, rho=0.6)  # 1.69 >= 1.6


def test_zenops_async_clips_and_scales_as_its_formula_says():
    v, honest, flipped = honest_and_flipped()
    assert zeno.zenops_async(honest, v, eta=-0.02, alpha=0.8)[1]
    update, accepted = zeno.zenops_async(flipped, v, eta=-0.02, alpha=0.8)
    assert not accepted and update @ v > 0  # alpha s g with s < 0: turned round
    v = torch.tensor([3.0, 4.0])  # ||v|| = 5
    update, accepted = zeno.zenops_async(torch.tensor([6.0, 8.0]), v, eta=0.5, alpha=0.8)  # s = 1: clipped to 5
    assert accepted and torch.allclose(update, torch.tensor([2.4, 3.2]))
    update, accepted = zeno.zenops_async(torch.tensor([4.0, -3.0]), v, eta=0.0, alpha=0.8)  # s = 0 >= 0
    assert accepted and torch.allclose(update, torch.tensor([3.2, -2.4]))
    update, accepted = zeno.zenops_async(torch.tensor([0.0, 1.0]), v, eta=0.9, alpha=0.5)  # s = 0.8 < 0.9
    assert not accepted and torch.allclose(update, torch.tensor([0.0, 0.4]))  # 0.5 x 0.8 x g


def test_zeno_scores_and_keeps_the_n_minus_b_best():
    v, honest, flipped = honest_and_flipped()

    def loss_at(weights):  # f(x) = ||x||^2 / 2, whose gradient at x is x
        return 0.5 * (weights ** 2).sum().item()

    x = v.clone()  # the gradient at x is v
    scores = zeno.zeno_scores(loss_at, x, [honest, flipped, honest], lr=0.1, rho=1e-3)
    assert zeno.zeno_keep(scores, 1) == [0, 2]  # the flipped one scores lowest
    g, lr, rho = torch.tensor([1.0, 0.0]), 0.5, 0.01  # exactly: f(x) - f(x - lr g) - rho ||g||^2
    x = torch.tensor([2.0, 1.0])
    expected = loss_at(x) - loss_at(x - lr * g) - rho * 1.0
    assert zeno.zeno_scores(loss_at, x, [g], lr, rho) == [pytest.approx(expected)]
    assert zeno.zeno_keep([0.3, -1.0, 2.0, 0.1], 2) == [0, 2]


def test_zeno_plus_plus_accepts_exactly_where_its_formula_says():
    v, honest, flipped = honest_and_flipped()
    assert zeno.zeno_plus_plus(honest, v, lr=0.1, rho=1e-3, eps=0.1)[1]
    assert not zeno.zeno_plus_plus(flipped, v, lr=0.1, rho=1e-3, eps=0.1)[1]
    v = torch.tensor([1.0, 0.0])  # g is rescaled to ||v|| = 1: g' = (0, 1), <v, g'> = 0, ||g'||^2 = 1
    g, accepted = zeno.zeno_plus_plus(torch.tensor([0.0, 5.0]), v, lr=0.1, rho=0.01, eps=0.1)
    assert torch.allclose(g, torch.tensor([0.0, 1.0])) and accepted  # 0 - 0.01 + 0.01 >= 0
    assert not zeno.zeno_plus_plus(torch.tensor([0.0, 5.0]), v, lr=0.1, rho=0.011, eps=0.1)[1]


def test_phocas_averages_the_values_nearest_the_trimmed_mean():
    vectors = torch.tensor([[1.0, 10.0], [2.0, 11.0], [3.0, 12.0], [100.0, -50.0]])
    # b = 1: trimmed means 2.5 and 10.5; the 3 nearest: 1, 2, 3 and 10, 11, 12
    assert torch.allclose(zeno.phocas(vectors, 1), torch.tensor([2.0, 11.0]))


def test_phocas_rejects_a_sign_flip():
    honest = torch.tensor([[1.0, 2.0], [1.2, 2.2], [0.8, 1.8]])
    flipped = -4 * honest[:1]  # b = 1: trimmed means 0.9 and 1.9; the 3 nearest: the honest values
    assert torch.allclose(zeno.phocas(torch.cat([honest, flipped]), 1), torch.tensor([1.0, 2.0]))
    generator = torch.Generator().manual_seed(0)  # 1000 coordinates: 3 noisy estimates of v, one of them flipped
    v = torch.randn(1000, generator=generator)
    honest = v + 0.3 * torch.randn(3, 1000, generator=generator)
    stacked = torch.cat([honest, -4 * honest[:1]])
    result = zeno.phocas(stacked, 1)
    # the flipped value is dropped where it is not among the 3 nearest the trimmed mean: all but the coordinates
    # where every value is near 0 (92% of them here)
    assert torch.isclose(result, honest.mean(dim=0)).float().mean() > 0.85
    assert torch.nn.functional.cosine_similarity(result, v, dim=0) > 0.95  # along v, as the honest mean
    assert torch.nn.functional.cosine_similarity(stacked.mean(dim=0), v, dim=0) < 0  # the plain mean turns round


@pytest.mark.parametrize("aggregate,mode,extra", [("zenops", "sync", []), ("zeno", "sync", ["--zeno-b", "1"]),
                                                  ("zenops", "async", []), ("zeno++", "async", [])])
def test_validators_count_what_they_reject(tiny_data, tmp_path, aggregate, mode, extra):
    """One Byzantine worker in 3 pushes -4 g: every push is counted, pushed or rejected, by whom; its pushes are
    rejected and the honest ones pass."""
    out = tmp_path / "ps"
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "--out", out, "--validators", "1", "--mode", mode,
                      "--aggregate", aggregate, "--byzantine", "1", "--attack", "signflip", "--attack-scale", "4",
                      *VALIDATED, *extra], nproc=5)
    summary = read_summary(out)
    assert summary["honest_pushed"] + summary["byzantine_pushed"] == 6  # 3 workers, 1 step of 8 each, 2 epochs
    assert 0 <= summary["honest_rejected"] <= summary["honest_pushed"]
    if mode == "sync":
        assert summary["byzantine_pushed"] == 2 and summary["byzantine_rejected"] == 2
        return
    # async: the 6 pushes go to whichever worker comes first, but the 3 start together (1 to 3 are the attacker's)
    byzantine, rejected = summary["byzantine_pushed"], summary["byzantine_rejected"]
    assert byzantine >= 1, summary
    # -4 g, scaled to ||v||, scores cos(-g, v) = -cos(g, v). zenops rejects it when that is below --zeno-eta
    # -0.001: whenever the attacker's own gradient agrees with v at all (it scores 0.17 to 0.86 here): all of them.
    # zeno++ accepts when cos >= rho / lr - eps / ||v||^2 (about -0.04 to -0.07 here): a flip passes only where g
    # barely agrees with v (seen down to 0.07: a push on weights older than v's): one may pass, not more
    assert rejected == byzantine if aggregate == "zenops" else rejected >= max(1, byzantine - 1), summary
    assert summary["honest_rejected"] <= 1, summary  # the honest ones score cos 0.18 to 0.88 here: they pass


def test_async_zeno_plus_plus_with_two_servers_and_a_delay_accepts_honest_pushes(tiny_data, tmp_path):
    """The validators' first pull brings the weights and the servers' lr (in warm-up too), whatever the delay."""
    out = tmp_path / "ps"
    run_recipe("ps", [tiny_data, *TINY, "--epochs", "2", "--warmup-epochs", "1", "--out", out, "--servers", "2",
                      "--partition-bytes", "40000", "--validators", "2", "--mode", "async", "--aggregate", "zeno++",
                      "--zeno-delay", "2", "-b", "4", *VALIDATED], nproc=7)
    summary = read_summary(out)
    assert summary["honest_pushed"] == 2 * 3 * 2
    # accepted when cos(g, v) >= rho / lr - eps / ||v||^2: above 0.1 in warm-up (the lr is small), about 0 after,
    # where v, 2 versions old, on 4 images, disagrees with a few pushes: 0 to 3 of the 12 rejected in 11 runs
    assert summary["honest_rejected"] <= 6, summary  # at least half of them pass


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
    processes = [subprocess.Popen(recipe_command("ps", [str(a) for a in [*args, "--rank", rank]]), cwd=ROOT,
                                  env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(4)]
    for line in processes[0].stdout:  # rank 0 prints each step: kill worker rank 3 in epoch 2
        if line.startswith("epoch 2 step"):
            processes[3].send_signal(signal.SIGKILL)
            break
    output = processes[0].stdout.read()
    returncodes = [process.wait(timeout=120) for process in processes]
    assert returncodes[:3] == [0, 0, 0], output
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
    (["--byzantine", "1"], 4, "needs an --attack"),
    (["--validators", "3", "--aggregate", "zenops"], 6, "3 validators for 2 worker(s)"),
    (["--byzantine", "1", "--attack", "labelflip", "--mixup-alpha", "0.2"], 4, "not with --mixup-alpha"),
])
def test_impossible_roles_are_one_line(flags, world_size, phrase):
    with pytest.raises(RecipeError) as error:
        ps.check_roles(ps.parse_args(["data", *flags]), world_size)
    assert phrase in str(error.value)


@pytest.mark.parametrize("flags,phrase", [
    ([], "1 server(s) and 0 validator(s) leave no worker in a world of 1"),
    (["--attack", "flood"], "argument --attack: invalid choice: 'flood'"),
    (["--aggregate", "bulyan"], "argument --aggregate: invalid choice: 'bulyan'"),
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
                            r"one batch of --batch-size 8 for each of the 1 validator\(s\)", line), line
