"""The pipeline recipe: stages against the unsplit model, each sync method, stragglers, bad input."""

import types

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import TINY, free_port, read_summary, run_recipe
from test_bad_input import assert_one_clear_line

from recipes.common import data, models
from recipes.pipeline import train as pipeline

EPOCH = [*TINY, "--epochs", "1"]  # 48 train images: 3 steps of -b 8 per replica with 2 replicas


def weights(out, name="checkpoint.pt"):
    return torch.load(out / name, weights_only=True)["model"]


def assert_same_weights(a, b, tolerance=1e-5):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=tolerance), (key, (a[key] - b[key]).abs().max())


# ---- units --------------------------------------------------------------------------------------------------

def test_balanced_split_minimises_the_largest_stage():
    assert pipeline.balanced_split([1, 1, 1, 1], 2) == [0, 2, 4]
    assert pipeline.balanced_split([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]
    assert pipeline.balanced_split([1, 2, 3], 3) == [0, 1, 2, 3]


def test_stages_start_at_layers_with_weights_and_cover_the_model_once():
    model = models.build_model("lenet", 3)
    log = types.SimpleNamespace(print=lambda *a: None)
    for stages in (2, 3, 4):
        parts = pipeline.split_model(model, types.SimpleNamespace(arch="lenet", image_size=16, stages=stages), log)
        assert len(parts) == stages
        assert [layer for part in parts for layer in part] == list(model)  # every layer once, in order
        assert all(any(True for _ in part[0].parameters()) for part in parts)


def test_stragglers_are_drawn_from_the_seed():
    def draws(seed, epoch=0):  # (a fresh namespace each time: nothing carried over between the calls)
        args = types.SimpleNamespace(seed=seed, hetero=0.5, hetero_prob=0.3, stages=2, slow_rank=None)
        return [pipeline.straggles(args, rank, epoch, step) for rank in range(4) for step in range(50)]

    seeded = draws(3)
    assert draws(3) == seeded  # the same seed: the same stragglers (whichever rank asks, and when)
    assert 0.15 < sum(seeded) / len(seeded) < 0.45  # about --hetero-prob
    # another seed, or another epoch: other stragglers (two independent draws of 200 at 0.3 differ in about 84)
    for other in (draws(4), draws(3, epoch=1)):
        assert sum(a != b for a, b in zip(other, seeded)) > 20
    args = types.SimpleNamespace(seed=3, hetero=0.5, hetero_prob=0.3, stages=2, slow_rank=None)
    assert pipeline.pipeline_straggles(types.SimpleNamespace(**{**vars(args), "hetero": 0, "slow_rank": 3}), 1, 0, 0)


def _split_and_compare(rank, world_size, port, schedule, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = models.build_model("lenet", 3)
    reference = models.build_model("lenet", 3)
    reference.load_state_dict(model.state_dict())
    log = types.SimpleNamespace(print=lambda *a: None)
    parts = pipeline.split_model(model, types.SimpleNamespace(arch="lenet", image_size=16, stages=2), log)
    stage = pipeline.PipelineStage(torch.nn.Sequential(*parts[rank]), rank, 2, torch.device("cpu"))
    criterion = torch.nn.CrossEntropyLoss()
    run = pipeline.SCHEDULES[schedule](stage, 4, loss_fn=criterion)
    images, target = torch.randn(8, 3, 16, 16), torch.randint(0, 3, (8,))
    losses = []
    run.step(images) if rank == 0 else run.step(target=target, losses=losses)
    loss = criterion(reference(images), target)
    loss.backward()
    mine = [(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()) if p.grad is not None]
    gap = max((a - b).abs().max().item() for a, b in mine)
    loss_gap = abs(torch.stack(losses).mean().item() - loss.item()) if rank == 1 else 0.0
    results.put((rank, len(mine), gap, loss_gap))
    dist.destroy_process_group()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_the_pipelined_model_has_the_unsplit_models_loss_and_gradients(schedule):
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_split_and_compare, args=(2, free_port(), schedule, results), nprocs=2, start_method="spawn")
    found = sorted(results.get() for _ in range(2))
    assert sum(n for _, n, _, _ in found) == len(list(models.build_model("lenet", 3).parameters()))
    assert all(gap < 1e-6 and loss_gap < 1e-6 for _, _, gap, loss_gap in found), found


def _average_in_pairs(rank, world_size, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    params = [torch.randn(5, generator=torch.Generator().manual_seed(rank)), torch.randn(3, 2)]
    before = torch.cat([p.reshape(-1) for p in params])
    args = types.SimpleNamespace(seed=0, stages=1)
    pipeline.pairwise_average(params, world_size, args, epoch=0, step=0, straggled=False)
    after = torch.cat([p.reshape(-1) for p in params])
    sums = torch.stack([before, after])
    dist.all_reduce(sums)
    results.put((rank, (sums[0] - sums[1]).abs().max().item(), (after - before).abs().max().item()))
    dist.destroy_process_group()


def test_an_adpsgd_round_keeps_the_replicas_average():
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_average_in_pairs, args=(5, free_port(), results), nprocs=5, start_method="spawn")
    found = sorted(results.get() for _ in range(5))
    assert all(change_of_sum < 1e-5 for _, change_of_sum, _ in found), found
    assert sum(moved > 0 for _, _, moved in found) == 4  # two pairs averaged; the fifth replica sat out


# ---- runs -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ddp_run(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "run"
    run_recipe("ddp", [tiny_data, *EPOCH, "--out", out], nproc=2)
    return out


@pytest.fixture(scope="module")
def allreduce_run(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("allreduce") / "run"
    run_recipe("pipeline", [tiny_data, *EPOCH, "--out", out, "--sync", "allreduce", "--schedule", "gpipe"], nproc=4)
    return out


def test_allreduce_ends_with_ddps_weights(ddp_run, allreduce_run):
    assert_same_weights(weights(allreduce_run), weights(ddp_run))
    summary = read_summary(allreduce_run)
    assert (summary["stages"], summary["replicas"], summary["global_batch"]) == (2, 2, 16)
    assert summary["full_syncs"] == 3 and summary["disagreement"] == 0


def test_preduce_with_every_replica_in_each_group_is_allreduce(tiny_data, tmp_path, allreduce_run):
    out = tmp_path / "run"
    run_recipe("pipeline", [tiny_data, *EPOCH, "--out", out, "--sync", "preduce", "--preduce-size", "2",
                            "--preduce-wait-ms", "60000", "--sync-bound", "100"], nproc=4)
    assert_same_weights(weights(out), weights(allreduce_run))
    summary = read_summary(out)
    assert summary["partial_syncs"] == 3 and summary["full_syncs"] == 1  # 3 steps in pairs, the epoch's end
    assert summary["disagreement"] == 0, summary  # (measured before the epoch's end: each pair left alike)


def test_one_stage_is_ddp_and_the_replicas_start_alike_without_a_seed(tiny_data, tmp_path, ddp_run):
    out = tmp_path / "one-stage"
    run_recipe("pipeline", [tiny_data, *EPOCH, "--out", out, "--stages", "1", "--microbatches", "1"], nproc=2)
    assert_same_weights(weights(out), weights(ddp_run))
    unseeded = [flag for i, flag in enumerate(EPOCH) if "--seed" not in EPOCH[max(i - 1, 0):i + 1]]
    run_recipe("pipeline", [tiny_data, *unseeded, "--out", tmp_path / "unseeded"], nproc=4)
    assert read_summary(tmp_path / "unseeded")["disagreement"] < 1e-6  # rank 0's weights everywhere, then the mean
    # gradient: replicas that started apart would stay apart


def test_the_checkpoint_evaluates_in_nd_and_a_ddp_checkpoint_in_the_pipeline(tiny_data, tmp_path, ddp_run,
                                                                              allreduce_run):
    nd = tmp_path / "nd"
    run_recipe("nd", [tiny_data, *TINY, "-e", "--resume", allreduce_run / "best.pt", "--out", nd])
    assert read_summary(nd)["top1_correct"] == read_summary(allreduce_run)["top1_correct"]
    piped = tmp_path / "pipeline"
    run_recipe("pipeline", [tiny_data, *TINY, "-e", "--resume", ddp_run / "best.pt", "--out", piped], nproc=4)
    assert read_summary(piped)["top1_correct"] == read_summary(ddp_run)["top1_correct"]


def test_a_straggler_holds_up_allreduce_more_often_than_preduce(tiny_data, tmp_path):
    straggling = [tiny_data, *TINY, "--epochs", "2", "-b", "4", "--microbatches", "2", "--hetero", "0.2",
                  "--hetero-prob", "0.5", "--preduce-wait-ms", "5", "--sync-bound", "3"]
    waits = {}
    for sync in ("allreduce", "preduce"):
        run_recipe("pipeline", [*straggling, "--out", tmp_path / sync, "--sync", sync], nproc=4)
        summary = read_summary(tmp_path / sync)
        waits[sync] = summary["waits"]
        assert summary["longest_without_full_sync"] <= (1 if sync == "allreduce" else 3)
    assert waits["allreduce"] > waits["preduce"], waits
    assert read_summary(tmp_path / "preduce")["full_syncs"] == 2 * 2  # after steps 3 and 6 (the epoch's end, too)


def test_hetpipe_applies_no_update_older_than_the_staleness_bound(tiny_data, tmp_path):
    out = tmp_path / "run"
    run_recipe("pipeline", [tiny_data, *TINY, "--epochs", "2", "-b", "4", "--microbatches", "2", "--sync",
                            "hetpipe", "--staleness", "1", "--slow-rank", "0", "--slow-factor", "4", "--out", out],
               nproc=6)
    summary = read_summary(out)
    assert summary["replicas"] == 2 and summary["partial_syncs"] == 2 * 2 * 6  # every push of both replicas
    assert summary["max_applied_staleness"] <= 1  # (a consistency check: the server answers no pull earlier)
    assert summary["waits"] >= 1  # the fast replica's pulls were held for the slow one
    data.set_seed(0)
    initial = models.build_model("lenet", 3).state_dict()
    trained = weights(out)
    assert all(not torch.allclose(trained[key], initial[key]) for key in initial)  # the pushes reached the servers


# ---- bad input ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,phrase", [
    (["--stages", "2"], "the world size 1 is not a multiple of --stages 2"),
    (["--stages", "5"], "--stages 5: --arch lenet has only 4 layers with weights to split into stages"),
    (["--stages", "1", "--sync", "preduce", "--preduce-size", "2"], "--preduce-size 2 must be at least 2 and at "
                                                                    "most the 1 replica(s)"),
    (["--stages", "1", "--sync", "preduce", "--preduce-size", "1"], "--preduce-size 1 must be at least 2"),
    (["--microbatches", "3"], "--microbatches 3 must divide --batch-size 8"),
    (["--microbatches", "1"], "--schedule 1f1b needs at least as many --microbatches as --stages: 1 < 2"),
    (["--stages", "1", "--sync", "hetpipe"], "--sync hetpipe needs the 1 servers and at least one replica"),
    (["--schedule", "zb"], "argument --schedule: invalid choice: 'zb'"),
    (["--mixup-alpha", "0.2"], "--mixup-alpha is not supported by the pipeline recipe"),
])
def test_bad_input(tiny_data, tmp_path, flags, phrase):
    result = run_recipe("pipeline", [tiny_data, *TINY, "--out", tmp_path / "out", *flags], expect_ok=False)
    assert_one_clear_line(result, phrase)
