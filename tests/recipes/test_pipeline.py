"""The pipeline recipe: stages against the unsplit model, each sync method, stragglers, bad input."""

import copy
import csv
import json
import math
import re
import sys
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist
from conftest import (ROOT, TINY, assert_one_clear_line, child_env, free_port, injected, launch_ranks, read_summary,
                      run_recipe, spawn)
from torch.utils.data import DistributedSampler

from recipes.common import RecipeError, data, models, schedule
from recipes.pipeline import adpsgd, pipedream, preduce, replica_data, snapshots, stages, stragglers
from recipes.pipeline import train as pipeline
from recipes.pipeline.layout import Layout, check_world

EPOCH = [*TINY[:TINY.index("--scale")], "--epochs", "1"]  # the default augmentation; 48 train images: 3 steps
# of -b 8 per replica with 2 replicas


def weights(out, name="checkpoint.pt"):
    return torch.load(out / name, weights_only=True)["model"]


def assert_same_weights(a, b, tolerance=1e-5):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=tolerance), (key, (a[key] - b[key]).abs().max())


# ---- units --------------------------------------------------------------------------------------------------

def test_balanced_split_minimises_the_largest_stage():
    assert stages.balanced_split([1, 1, 1, 1], 2) == [0, 2, 4]
    assert stages.balanced_split([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]
    assert stages.balanced_split([1, 2, 3], 3) == [0, 1, 2, 3]


def test_stages_start_at_layers_with_weights_and_cover_the_model_once():
    model = models.build_model("lenet", 3)
    log = types.SimpleNamespace(print=lambda *a: None)
    for count in (2, 3, 4):
        parts, shapes, _ = stages.split_model(model, types.SimpleNamespace(arch="lenet", image_size=16,
                                                                           stages=count), log)
        assert len(parts) == count
        assert [layer for part in parts for layer in part] == list(model)  # every layer once, in order
        assert all(any(True for _ in part[0].parameters()) for part in parts)
        x = torch.zeros(2, 3, 16, 16)
        for part, shape in zip(parts, shapes):  # each stage's input shape, as PipeDream's receives expect it
            assert x.shape == (2, *shape)
            x = torch.nn.Sequential(*part)(x)


def test_a_transformer_splits_by_blocks_into_stages_of_equal_flops_that_compose_to_it():
    """vit_tiny at 28 px: its patch embedding with the first stage, its head with the last, whole encoder blocks
    between; stage FLOPs within 10 % of each other, attention counted; the stages run one after the other are
    the model, and their tensors are the model's state, each once."""
    torch.manual_seed(0)
    model = models.build_model("vit_tiny", 10, 28)
    log = types.SimpleNamespace(print=lambda *a: None)
    tokens, width, mlp = 50, 64, 256  # 7 x 7 patches and the class token
    block = 2 * tokens * (4 * width * width + 2 * width * mlp) + 4 * tokens * tokens * width  # linear, attention
    for count in (2, 4):
        parts, shapes, costs = stages.split_model(model, types.SimpleNamespace(arch="vit_tiny", image_size=28,
                                                                               stages=count), log)
        assert [type(layer).__name__ for layer in parts[0]][0] == "PatchEmbedding"
        assert [type(layer).__name__ for layer in parts[-1]][-1] == "ClassTokenHead"
        assert [sum(type(layer).__name__ == "EncoderBlock" for layer in part) for part in parts] == [8 // count] * count
        assert max(costs["stage_mflops"]) <= 1.1 * min(costs["stage_mflops"]), costs
        assert costs["stage_mflops"][1] * 1e6 == pytest.approx(8 // count * block, rel=0.01), costs
        assert costs["stage_activation_bytes"] == [4 * tokens * width] * (count - 1) + [0]
        assert shapes == [(3, 28, 28)] + [(tokens, width)] * (count - 1)
        keys = [key for part in parts for key in stages.state_names(model, part)]
        assert sorted(keys) == sorted(model.state_dict())
    x = torch.randn(2, 3, 28, 28)
    model.eval()
    assert torch.allclose(torch.nn.Sequential(*[layer for part in parts for layer in part])(x), model(x), atol=1e-6)


def test_bert_tiny_is_cut_as_sd_pipe_cuts_bert():
    """4 stages: the embeddings and one encoder layer, two layers, two layers, one layer and the vocabulary head
    (SD-PIPE's [2, 4, 4, 2] of 12 layers), so the end stages hold the most weights, as in their BERT; 2 stages:
    three layers each. Each stage's input is what the one before sends: the tokens, then (positions, width)."""
    model = models.build_model("bert_tiny", 2000)
    log = types.SimpleNamespace(print=lambda *a: None)
    for count, layers in ((4, [1, 2, 2, 1]), (2, [3, 3])):
        parts, shapes, costs = stages.split_model(model, types.SimpleNamespace(arch="bert_tiny", stages=count), log,
                                                  torch.zeros(1, 16, dtype=torch.long))
        assert [sum(type(layer).__name__ == "TransformerEncoderLayer" for layer in part) for part in parts] == layers
        assert type(parts[0][0]).__name__ == "TokenEmbedding" and type(parts[-1][-1]).__name__ == "MaskedLMHead"
        assert shapes == [(16,)] + [(16, 64)] * (count - 1) and costs["stage_activation_bytes"][0] == 4 * 16 * 64
    held = [sum(p.numel() for layer in part for p in layer.parameters()) for part in parts[:1] + parts[-1:]]
    assert min(held) > 2 * max(sum(p.numel() for p in layer.parameters()) for layer in parts[1]), held


def test_the_layout_maps_ranks_to_stages_replicas_and_servers():
    layout = Layout(stages=2, world_size=6, has_servers=True)
    assert layout.replicas == 2 and [layout.stage(r) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert layout.pipeline_ranks(1) == [2, 3] and layout.stage_ranks(1) == [1, 3]
    assert [layout.server(s) for s in (0, 1)] == [4, 5] and layout.is_server(5) and not layout.is_server(3)
    assert Layout(stages=2, world_size=6).replicas == 3 and not Layout(2, 6).is_server(5)


def test_stragglers_are_drawn_per_slot_from_the_seed():
    def draws(seed, epoch=0):  # (a fresh namespace each time: nothing carried over between the calls)
        args = types.SimpleNamespace(seed=seed, hetero=0.5, hetero_prob=0.3, microbatches=2)
        return [slot for rank in range(4) for step in range(25) for slot in stragglers.sleeps(args, rank, epoch, step)]

    seeded = draws(3)
    assert len(seeded) == 4 * 25 * 2  # before the minibatch's forward and its backward, whatever its microbatches
    assert draws(3) == seeded  # the same seed: the same stragglers (whichever rank asks, and when)
    assert 0.2 < sum(seeded) / len(seeded) < 0.4  # about --hetero-prob
    # another seed, or another epoch: other stragglers (two independent draws of 200 at 0.3 differ in about 84)
    for other in (draws(4), draws(3, epoch=1)):
        assert sum(a != b for a, b in zip(other, seeded)) > 40
    args = types.SimpleNamespace(seed=3, hetero=0, hetero_prob=0.3, microbatches=2, slow_rank=3)
    assert stragglers.replica_straggles(args, Layout(2, 4), 1, 0, 0)  # rank 3 is replica 1's
    assert not stragglers.replica_straggles(args, Layout(2, 4), 0, 0, 0)


def test_a_straggler_sleeps_before_a_minibatchs_first_forward_and_first_backward_as_drawn(monkeypatch):
    slept = []
    monkeypatch.setattr(stragglers.time, "sleep", slept.append)
    args = types.SimpleNamespace(seed=0, hetero=0.25, hetero_prob=1.0, microbatches=4)
    module = torch.nn.Linear(3, 2)
    slots = stragglers.inject(module, args)
    stragglers.plan(slots, args, rank=0, epoch=0, step=0)
    for _ in range(4):  # four microbatches: two sleeps, the minibatch's forward slot and its backward slot
        module(torch.randn(4, 3)).sum().backward()
    assert slept == [0.25] * 2 and slots == {"forward": [], "backward": []}
    slots["forward"][:], slots["backward"][:] = [False], [True]
    module(torch.randn(4, 3)).sum().backward()  # as the draws say
    assert len(slept) == 3 and slots == {"forward": [], "backward": []}
    on_meta = torch.nn.Linear(3, 2, device="meta")
    slots = stragglers.inject(on_meta, args)
    stragglers.plan(slots, args, rank=0, epoch=0, step=0)
    on_meta(torch.randn(4, 3, device="meta"))  # (shape inference: no slot)
    assert len(slept) == 3 and slots["forward"] == [True]


def test_the_deadline_doubles_after_a_group_of_one_and_shrinks_otherwise():
    wait, seen = preduce.FIRST_WAIT, []
    for size in (1, 1, 1, 1, 1, 2, 3):
        wait = preduce.next_wait(wait, size)
        seen.append(round(wait * 1000, 4))
    assert seen == [2, 4, 8, 10, 10, 9, 8.1]  # ms: SD-PIPE's 1 ms, doubled up to 10 ms, x 0.9 after a group
    assert preduce.next_wait(preduce.SHORTEST_WAIT, 2) == preduce.SHORTEST_WAIT


def queue(replicas, arrivals, state=None, wait=0.05):
    """Replicas of one stage arriving at the ready queue (in threads, over one store): arrivals is [(replica,
    seconds after the start, stopping)]. Returns {replica: [(group, connecting)]}."""
    store = dist.HashStore()
    layout = Layout(stages=1, world_size=replicas)
    queues = {r: preduce.PartialReduce(types.SimpleNamespace(preduce_size=None), layout, 0, r, None, store)
              for r in range(replicas)}
    if state is not None:  # (epoch 0's counts, handed to the first leader)
        store.set("preduce/0/member/1", f"lead;0;{state}")
    found, start = {r: [] for r in range(replicas)}, time.perf_counter()

    def arrive(replica, at, stopping):
        time.sleep(max(0.0, start + at - time.perf_counter()))
        queues[replica].wait = wait
        found[replica].append(queues[replica].arrive(0, stopping))

    threads = [threading.Thread(target=arrive, args=arrival) for arrival in arrivals]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    return found


def test_a_group_is_every_replica_ready_before_the_leaders_deadline():
    found = queue(4, [(0, 0.0, False), (1, 0.01, False), (2, 0.3, False), (3, 0.31, False)])
    assert found[0] == found[1] == [([0, 1], False)]  # 2 and 3 came after the 50 ms deadline
    assert found[2] == found[3] == [([2, 3], False)]
    found = queue(3, [(0, 0.0, False), (1, 0.0, False), (2, 0.0, False)], wait=5.0)
    assert found[0] == [([0, 1, 2], False)]  # all three ready: no need to wait out the deadline


def test_once_the_updates_cross_a_multiple_of_ten_r_the_next_group_connects_every_replica():
    # 40 updates: a check is due; the groups since the last joined {0, 1, 2}: 3 stays apart
    found = queue(4, [(0, 0.0, False), (1, 0.0, False), (3, 0.3, False)], state="40;0;0;0,0,0,3;1")
    assert found[0] == found[3] == [([0, 1, 3], True)]  # past the deadline, until 3 came: 2 was connected already
    found = queue(4, [(0, 0.0, False), (1, 0.3, True)], state="40;0;0;0,1,2,3;1")
    assert found[0] == [([0], False)]  # a replica out of the epoch ends the wait, and it connected nobody (the
    # epoch's end connects them)
    # 38 updates, the last check at 35: a group of 3 crosses 40 = 10 R (not 35 + 40), so the next one connects
    arrivals = [(0, 0.0, False), (1, 0.0, False), (2, 0.0, False), (0, 0.3, False), (3, 0.3, False),
                (1, 0.6, False), (2, 0.6, False)]
    found = queue(4, arrivals, state="38;35;0;0,1,2,3;0")
    assert found[1] == [([0, 1, 2], False), ([1, 2], False)] and found[3] == [([0, 3], True)]  # (then none is due)
    found = queue(4, arrivals[:5], state="28;25;0;0,1,2,3;0")  # 31: no multiple crossed, the deadline closes it
    assert found[3] == [([0, 3], False)]
    # 10 replicas: a group averages in pairs, which connect no one (SD-PIPE's getPartnerPairWise), so the sync due
    # after it (105 crosses 100 = 10 R) waits for every replica
    everyone = list(range(10))
    apart = ",".join(map(str, everyone))  # (the union-find: each replica on its own)
    found = queue(10, [(r, at, False) for at in (0.0, 0.3) for r in everyone], state=f"95;0;0;{apart};0")
    assert all(found[r] == [(everyone, False), (everyone, True)] for r in everyone), found


def test_beyond_eight_replicas_a_group_averages_in_pairs_in_order():
    group = [0, 2, 3, 5, 7]
    assert [preduce.pair_of(group, r, 9, False) for r in group] == [[0, 2], [0, 2], [3, 5], [3, 5], [7]]
    assert preduce.pair_of(group, 3, 8, False) == group  # R = 8: the whole group (SD-PIPE: pairs when R > 8)
    assert preduce.pair_of(group, 3, 9, True) == group  # a connectivity sync: the whole group


def _average_in_pairs(rank, world_size, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    params = [torch.randn(5, generator=torch.Generator().manual_seed(rank)), torch.randn(3, 2)]
    before = torch.cat([p.reshape(-1) for p in params])
    args = types.SimpleNamespace(seed=0)
    adpsgd.pairwise_average(params, Layout(1, world_size), args.seed, epoch=0, step=0, straggled=False)
    after = torch.cat([p.reshape(-1) for p in params])
    sums = torch.stack([before, after])
    dist.all_reduce(sums)
    (results / f"{rank}.json").write_text(json.dumps([rank, (sums[0] - sums[1]).abs().max().item(),
                                                      (after - before).abs().max().item()]))
    dist.destroy_process_group()


def test_an_adpsgd_round_keeps_the_replicas_average(tmp_path):
    spawn(_average_in_pairs, (5, free_port(), tmp_path), 5)
    found = sorted(json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(5))
    assert all(change_of_sum < 1e-5 for _, change_of_sum, _ in found), found
    assert sum(moved > 0 for _, _, moved in found) == 4  # two pairs averaged; the fifth replica sat out


def _gather_a_replica(rank, world_size, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    layout = Layout(2, world_size)  # 2 replicas x 2 stages
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    torch.nn.init.constant_(model[layout.stage(rank)].weight, rank)  # the stage this rank holds: its rank
    whole = copy.deepcopy(model)
    view = torch.optim.AdamW(whole.parameters(), 0.1)
    optimizer = torch.optim.AdamW(model[layout.stage(rank)].parameters(), 0.1)
    for p in model[layout.stage(rank)].parameters():
        p.grad = torch.full_like(p, rank + 1.0)  # (AdamW's first moment after a step: 0.1 x the gradient)
    optimizer.step()
    stage_keys = [stages.state_names(model, [layer]) for layer in model]
    groups = [dist.new_group(layout.pipeline_ranks(r), backend="gloo") for r in range(2)]
    replica = layout.replica(rank)
    stages.gather(model, optimizer, whole, view, stage_keys, layout.pipeline_ranks(replica), groups[replica])
    moments = [round(view.state[layer.weight]["exp_avg"].unique().item(), 4) for layer in whole]
    (results / f"{rank}.json").write_text(json.dumps([[round(layer.weight.unique().item())] for layer in whole] +
                                                     [moments]))
    dist.destroy_process_group()


def test_each_replica_gathers_its_own_stages_to_score(tmp_path):
    """As each of SD-PIPE's pipelines evaluates its own weights: on 2 replicas x 2 stages, the ranks of replica r
    put together the model from replica r's stages (ranks 2r and 2r + 1), not replica 0's, with their optimizer's
    state (AdamW's first moments, for the checkpoint)."""
    spawn(_gather_a_replica, (4, free_port(), tmp_path), 4)
    found = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(4)]
    assert found == [[[0], [1], [0.1, 0.2]]] * 2 + [[[2], [3], [0.3, 0.4]]] * 2, found


def _split_and_compare(rank, world_size, port, schedule, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = models.build_model("lenet", 3)
    reference = models.build_model("lenet", 3)
    reference.load_state_dict(model.state_dict())
    log = types.SimpleNamespace(print=lambda *a: None)
    parts, _, _ = stages.split_model(model, types.SimpleNamespace(arch="lenet", image_size=16, stages=2), log)
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
    (results / f"{rank}.json").write_text(json.dumps([rank, len(mine), gap, loss_gap]))
    dist.destroy_process_group()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_the_pipelined_model_has_the_unsplit_models_loss_and_gradients(tmp_path, schedule):
    spawn(_split_and_compare, (2, free_port(), schedule, tmp_path), 2)
    found = sorted(json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2))
    assert sum(n for _, n, _, _ in found) == len(list(models.build_model("lenet", 3).parameters()))
    assert all(gap < 1e-6 and loss_gap < 1e-6 for _, _, gap, loss_gap in found), found


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


def test_allreduce_trains_ddps_model_with_ddps_augmentations(ddp_run, allreduce_run):
    """Replica r trains on ddp's rank r's shard and draws its augmentations (random crops and flips here)."""
    assert_same_weights(weights(allreduce_run), weights(ddp_run))
    summary, ddp = read_summary(allreduce_run), read_summary(ddp_run)
    assert (summary["stages"], summary["replicas"], summary["global_batch"]) == (2, 2, 16)
    assert summary["full_syncs"] == 3 and summary["disagreement"] == 0
    assert summary["weight_versions_per_stage"] is None  # (gpipe stashes none)
    assert summary["top1_correct"] == ddp["top1_correct"]
    assert abs(summary["loss"] - ddp["loss"]) <= 1e-5 * ddp["loss"], (summary["loss"], ddp["loss"])


def test_preduce_counts_epochs_in_updates_and_connects_every_replica_within_the_bound(tiny_data, tmp_path):
    """2 replicas of one stage, replica 1 thirty times slower: an epoch is 2 x 12 updates of both together, the
    fast replica does more of them, and no more than (10 + 2) R updates pass between two moments that connect
    every replica (SD-PIPE's check at each multiple of 10 R updates, its group, the group before it)."""
    out = tmp_path / "run"
    run_recipe("pipeline", [tiny_data, *EPOCH, "-b", "2", "--epochs", "2", "--stages", "1", "--microbatches", "1",
                            "--sync", "preduce", "--slow-rank", "1", "--slow-factor", "30", "--out", out], nproc=2)
    summary = read_summary(out)
    fast, slow = summary["updates_per_replica"]
    assert fast + slow == 2 * 2 * 12 and fast > slow, summary["updates_per_replica"]
    assert summary["connectivity_syncs"] >= 1 and summary["longest_unconnected_updates"] <= 12 * 2, summary
    assert summary["full_syncs"] == 2  # the epochs' ends
    assert 1 <= summary["mean_group_size"] <= 2


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
    straggling = [tiny_data, *TINY, "--epochs", "2", "-b", "4", "--microbatches", "2", "--hetero", "0.05",
                  "--hetero-prob", "0.3"]
    waits = {}
    for sync_method in ("allreduce", "preduce"):
        run_recipe("pipeline", [*straggling, "--out", tmp_path / sync_method, "--sync", sync_method], nproc=4)
        summary = read_summary(tmp_path / sync_method)
        waits[sync_method] = summary["waits"]
        assert summary["longest_without_full_sync"] <= (1 if sync_method == "allreduce" else 2 * 6)
    assert waits["allreduce"] > waits["preduce"], waits
    assert read_summary(tmp_path / "preduce")["full_syncs"] == 2  # the epochs' ends


@pytest.mark.parametrize("sync_method", ["allreduce", "adpsgd"])
def test_a_step_makes_no_collective_of_every_rank_but_the_stop_check_every_tenth(tiny_data, tmp_path, sync_method):
    """AD-PSGD's replicas wait for their partners only, allreduce's for their stage's replicas: no step makes a
    collective over every rank (which would hold each rank to the slowest of the job) but every 10th, the stop
    checks' (each read 10 steps later); the first step of each epoch counts what came before it (the set-up, the
    epoch's end). 2 x 2 ranks, 12 steps an epoch, counted by scripts/harness/nccl_rules.py."""
    counts = tmp_path / "collectives.jsonl"
    flags = [tiny_data, *TINY, "--epochs", "2", "-b", "2", "--microbatches", "2", "--stages", "2", "--sync",
             sync_method, "--out", tmp_path / "run"]
    command = [sys.executable, ROOT / "scripts" / "harness" / "nccl_rules.py", "--collectives-per-step", counts,
               ROOT / "recipes" / "pipeline" / "train.py", *flags]
    result = launch_ranks([str(part) for part in command], 4, child_env(), 300)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = [0, 9, 12, 21]  # (each epoch's first and 10th step)
    ranks = [json.loads(line) for line in counts.read_text().splitlines()]
    assert sorted(rank["rank"] for rank in ranks) == [0, 1, 2, 3]
    for rank in ranks:
        assert len(rank["per_step"]) == 2 * 12, rank
        assert [step for step, count in enumerate(rank["per_step"]) if count] == expected, rank


def test_hetpipe_pushes_every_minibatch_and_bounds_no_pull_unless_asked(tiny_data, tmp_path):
    """SD-PIPE's HetPipe, replica 0 sixteen times slower: a push after each minibatch and a pull every --wave; no pull
    waits but the epoch's last (for every replica's whole epoch), so the fast replica pulls weights many pushes
    ahead of the slow one's; with HetPipe's own bound (--staleness 0 waves) its pulls wait for the slow one.
    (A lenet step takes milliseconds: at a factor of 4 a loaded machine's scheduling once let the slow replica
    catch up, to a staleness of 2; at 16 the slow one's step outlasts such a stall.)"""
    flags = [tiny_data, *TINY, "--epochs", "1", "-b", "4", "--stages", "1", "--microbatches", "2", "--sync",
             "hetpipe", "--wave", "2", "--slow-rank", "0", "--slow-factor", "16"]  # (2 replicas and a server)
    for name, bound in (("free", []), ("bounded", ["--staleness", "0"])):
        run_recipe("pipeline", [*flags, *bound, "--out", tmp_path / name], nproc=3)
    free, bounded = read_summary(tmp_path / "free"), read_summary(tmp_path / "bounded")
    assert free["replicas"] == 2 and free["partial_syncs"] == 2 * 6  # a push each step of each replica
    assert free["waits"] <= 1 < bounded["waits"], (free["waits"], bounded["waits"])  # (per stage)
    assert bounded["max_applied_staleness"] <= 2 < free["max_applied_staleness"]  # (in pushes: one wave at most)
    data.set_seed(0)
    initial = models.build_model("lenet", 3).state_dict()
    trained = weights(tmp_path / "free")
    assert all(not torch.allclose(trained[key], initial[key]) for key in initial)  # the pushes reached the servers


def _score_snapshots(rank, world_size, port, results):
    """Rank 0 updates at 0.5 s and 2.5 s and ends at 3.2 s; rank 1 updates at 1.5 s and ends at 2.1 s (T = 1 s)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    clock = [0.0]
    snapshots.time = types.SimpleNamespace(perf_counter=lambda: clock[0])  # (the clock the test moves)
    snapshots.distributed = types.SimpleNamespace(control_group=lambda: None)  # (the default group: gloo)
    weight = torch.nn.Parameter(torch.zeros(2))
    kept = snapshots.Snapshots(1.0, [weight], torch.device("cpu"))
    for at, value in ((0.5, 1.0), (2.5, 2.0)) if rank == 0 else ((1.5, 5.0),):
        clock[0] = at
        kept.before_update()
        weight.data.fill_(value)  # (the update)
    clock[0] = 3.2 if rank == 0 else 2.1
    kept.close()
    weight.data.fill_(9.0 if rank == 0 else 7.0)  # (the epoch's end: preduce's average)
    scored = []
    run = types.SimpleNamespace(args=types.SimpleNamespace(snapshot_every=1.0), epoch=0, first_step=0,
                                log=types.SimpleNamespace(enabled=rank == 0, out=results))

    def evaluate(loader):
        scored.append(weight[0].item())
        run.val_stats = {"loss": weight[0].item(), "top1": 0.0, "top5": 0.0}

    run.evaluate = evaluate
    snapshots.score(kept, run, None)
    (results / f"{rank}.json").write_text(json.dumps([scored, weight[0].item()]))
    dist.destroy_process_group()


def test_each_multiples_copies_are_scored_together_once_and_the_weights_put_back(tmp_path):
    """The multiples every rank reached (2: rank 1 ended at 2.1 s), each with every rank's weights as of it (rank 0's
    at 1 s and 2 s: those after its first update, one copy for both; rank 1's: the start's, then after its update),
    scored together; then each rank's weights as the epoch ended them."""
    spawn(_score_snapshots, (2, free_port(), tmp_path), 2)
    assert [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)] == [[[1.0, 1.0], 9.0],
                                                                                         [[0.0, 5.0], 7.0]]
    assert [(row["epoch"], row["seconds"]) for row in snapshot_rows(tmp_path)] == [("1", "1.000"), ("1", "2.000")]


def snapshot_rows(out):
    with open(out / "snapshots.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_snapshots_score_the_model_within_the_epoch_and_leave_its_training_alone(tiny_data, tmp_path,
                                                                                 allreduce_run):
    """--snapshot-every T: the run ends with the weights of a run without it (allreduce_run's: they were put back).
    Every process sleeps before each forward and backward, so its 3 updates are 0.08 s or more apart and T = 0.03 s
    passes between any two: the weights after 0, 1 and 2 updates at least are scored, each once, at multiples of T
    within the epoch's training, in order; the first about chance, above the epoch's end."""
    out = tmp_path / "run"
    flags = [tiny_data, *EPOCH, "--sync", "allreduce", "--schedule", "gpipe", "--snapshot-every", "0.03",
             "--hetero", "0.04", "--hetero-prob", "1"]
    run_recipe("pipeline", [*flags, "--out", out], nproc=4)
    assert_same_weights(weights(out), weights(allreduce_run))
    rows = snapshot_rows(out)
    with open(out / "metrics.csv", newline="") as f:
        epoch = {row["split"]: row for row in csv.DictReader(f)}
    seconds = [float(row["seconds"]) for row in rows]
    assert len(rows) >= 3 and {row["epoch"] for row in rows} == {"1"}, rows
    assert all(s == pytest.approx(0.03 * round(s / 0.03)) for s in seconds), seconds
    assert seconds == sorted(seconds) and seconds[-1] <= float(epoch["train"]["epoch_s"]), (seconds, epoch)
    assert all(a["loss"] != b["loss"] for a, b in zip(rows, rows[1:])), rows
    assert float(rows[0]["loss"]) == pytest.approx(math.log(3), abs=0.05), rows
    assert float(epoch["val"]["loss"]) < float(rows[0]["loss"]) - 0.01, (rows, epoch)


def test_hetpipes_servers_score_the_snapshots_with_the_replicas(tiny_data, tmp_path):
    """The servers hold no copies but evaluate their share of val/ with the others, epoch by epoch."""
    out = tmp_path / "run"
    run_recipe("pipeline", [tiny_data, *TINY, "--epochs", "2", "-b", "4", "--stages", "1", "--microbatches", "2",
                            "--sync", "hetpipe", "--snapshot-every", "0.001", "--out", out], nproc=3)
    rows = snapshot_rows(out)
    assert {row["epoch"] for row in rows} == {"1", "2"}, rows


def test_a_stream_is_each_replicas_own_permutations_of_the_whole_set_epoch_after_epoch():
    """--replica-data stream (SD-PIPE's): R epochs of a replica's stream read every image once, the next R another
    permutation; replicas read differently, and not disjoint shards; an epoch's order is the same whenever it is
    asked for (a resume)."""
    streams = [replica_data.Stream(12, 3, replica, seed=5) for replica in range(3)]

    def epoch(stream, e):
        stream.set_epoch(e)
        return list(stream)

    first = [i for e in range(3) for i in epoch(streams[0], e)]
    assert len(epoch(streams[0], 0)) == 4 and sorted(first) == list(range(12))
    assert sorted(i for e in range(3, 6) for i in epoch(streams[0], e)) == list(range(12))
    assert [i for e in range(3, 6) for i in epoch(streams[0], e)] != first
    assert epoch(streams[1], 0) != epoch(streams[0], 0) and epoch(streams[0], 4) == epoch(streams[0], 4)
    assert len({i for stream in streams for i in epoch(stream, 0)}) < 12  # (one epoch of all: some read twice)


def test_the_stream_is_what_a_replica_reads(tiny_data, tmp_path, allreduce_run):
    """The flag reaches the loader: the same run on streams ends elsewhere than on ddp's shards."""
    out = tmp_path / "run"
    run_recipe("pipeline", [tiny_data, *EPOCH, "--sync", "allreduce", "--schedule", "gpipe", "--replica-data",
                            "stream", "--out", out], nproc=4)
    ours, shards = weights(out), weights(allreduce_run)
    assert any(not torch.allclose(ours[key], shards[key]) for key in shards)


@pytest.mark.parametrize("sync_method, nproc, schedule", [("preduce", 4, ["--microbatches", "2"]),
                                                           ("hetpipe", 3, ["--stages", "1", "--microbatches", "2"]),
                                                           ("preduce", 4, ["--schedule", "pipedream"])])
def test_a_run_saved_at_an_epochs_end_resumes_there(tiny_data, tmp_path, sync_method, nproc, schedule):
    """preduce and hetpipe save a SIGTERM at the epoch's end (its epoch, and step = the epoch's steps): a restart
    trains nothing more of that epoch, and the next one from a fresh store; the epoch's snapshots scored before the
    stop are kept."""
    out = tmp_path / "run"
    flags = [tiny_data, *TINY, "-b", "4", *schedule, "--sync", sync_method, "--snapshot-every", "0.001", "--out", out]
    run_recipe("pipeline", [*flags, "--epochs", "1"], nproc=nproc)
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    state["epoch"], state["step"] = 0, 6  # as a SIGTERM at the first epoch's end saves it
    torch.save(state, out / "checkpoint.pt")
    result = run_recipe("pipeline", [*flags, "--epochs", "2", "--auto-resume"], nproc=nproc)
    assert "epoch 1 train" not in result.stdout and read_summary(out)["epochs"] == 2, result.stdout[-2000:]
    assert {row["epoch"] for row in snapshot_rows(out)} == {"1", "2"}


# ---- PipeDream ------------------------------------------------------------------------------------------------

def test_pipedream_runs_s_minus_s_forwards_then_one_backward_one_forward_then_drains():
    end = pipedream.EpochEnd
    assert list(pipedream.operations(0, 2, end(4))) == [("forward", 0), ("forward", 1), ("backward", 0),
                                                        ("forward", 2), ("backward", 1), ("forward", 3),
                                                        ("backward", 2), ("backward", 3)]
    assert list(pipedream.operations(1, 2, end(3))) == [("forward", 0), ("backward", 0), ("forward", 1),
                                                        ("backward", 1), ("forward", 2), ("backward", 2)]
    assert list(pipedream.operations(0, 3, end(5), first=3)) == [("forward", 3), ("forward", 4), ("backward", 3),
                                                                 ("backward", 4)]  # (resumed at step 3: 2 left)
    for depth in range(1, 5):
        for stage in range(depth):
            order = list(pipedream.operations(stage, depth, end(7)))
            assert sorted(order) == sorted((kind, i) for kind in ("forward", "backward") for i in range(7))
            in_flight = [sum(1 if kind == "forward" else -1 for kind, _ in order[:t + 1]) for t in range(len(order))]
            assert max(in_flight) == depth - stage and min(in_flight) >= 0
    epoch_end = end(10)  # preduce: the epoch's end found at stage 0's fifth forward (minibatch 4), the drain after it
    order = pipedream.operations(0, 2, epoch_end)
    assert [next(order) for _ in range(5)] == [("forward", 0), ("forward", 1), ("backward", 0), ("forward", 2),
                                               ("backward", 1)]
    epoch_end.step = 3
    assert list(order) == [("backward", 2)]


def pipedream_reference(args, replicas, pipelined=True, in_flight=None):
    """PipeDream's rule, written plainly in one process: at stage s, minibatch i's forward runs on the stage's
    weights after max(0, i - (S - s) + 1) updates, and its gradient there (averaged over the replicas' minibatches
    i) updates the stage's newest weights (pipelined=False: after i updates, plain SGD; in_flight=K: at most K
    minibatches in flight at any stage, min(K, S - s)). Returns the model's state after the epoch."""
    train_set, _, num_classes = data.build_datasets(args)
    loaders = []
    for replica in range(replicas):  # replica r: ddp's rank r's shard
        sampler = DistributedSampler(train_set, num_replicas=replicas, rank=replica, seed=args.seed)
        sampler.set_epoch(0)
        loaders.append(data.train_loader(train_set, args, sampler))
    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes, args.image_size)
    modules = [torch.nn.Sequential(*part) for part in stages.split_model(model, args, types.SimpleNamespace(
        print=lambda *a: None))[0]]
    lr = args.lr * args.batch_size * replicas / 256
    optimizers = [torch.optim.SGD(m.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay)
                  for m in modules]
    schedulers = [schedule.build_scheduler(o, args, steps_per_epoch=len(loaders[0])) for o in optimizers]
    history = [[{n: p.detach().clone() for n, p in m.named_parameters()}] for m in modules]
    to_device = data.device_transform(args, torch.device("cpu"), num_classes)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    count = len(modules)
    for i, batches in enumerate(zip(*loaders)):
        depth = [min(in_flight or count, count - s) for s in range(count)]
        used = [{n: w.clone().requires_grad_() for n, w in history[s][max(0, i - depth[s] + 1) if pipelined
                                                                        else i].items()} for s in range(count)]
        total = 0
        for images, target in batches:
            x, target = to_device(images, target)
            for module, weights in zip(modules, used):
                x = torch.func.functional_call(module, weights, (x,))
            total = total + criterion(x, target) / replicas
        grads = iter(torch.autograd.grad(total, [w for weights in used for w in weights.values()]))
        for s, module in enumerate(modules):
            for p in module.parameters():
                p.grad = next(grads)
            optimizers[s].step()
            schedulers[s].step()
            history[s].append({n: p.detach().clone() for n, p in module.named_parameters()})
    return model.state_dict()


@pytest.mark.parametrize("arch", ["lenet", "vit_tiny"])
def test_pipedream_updates_per_minibatch_with_stashed_weights_as_a_plain_reference_does(tiny_data, tmp_path, arch):
    """2 replicas x 2 stages, --sync allreduce: the weights after an epoch are those of pipedream_reference (each
    backward on its forward's weights, an update per minibatch); the replicas stay equal; stage 0 holds 2
    versions of its weights, the last stage only its own. The same for the transformer, whose stages' FLOPs the
    summary gives, equal within 10 %, and the bytes each sends per image (its tokens)."""
    out = tmp_path / "run"
    flags = [tiny_data, *TINY, "--epochs", "1", "--stages", "2", "--schedule", "pipedream", "--lr", "2", "-a", arch,
             *(["--image-size", "14"] if arch == "vit_tiny" else [])]
    run_recipe("pipeline", [*flags, "--out", out], nproc=4)
    summary = read_summary(out)
    assert summary["updates_per_replica"] == [3, 3] and summary["disagreement"] == 0, summary
    assert summary["weight_versions_per_stage"] == [2, 1] and summary["microbatches"] == 1
    assert max(summary["stage_mflops"]) <= 1.1 * min(summary["stage_mflops"]) or arch == "lenet", summary
    sent = 4 * 50 * 64 if arch == "vit_tiny" else 4 * 16 * 8 * 8  # (50 tokens of 64; 16 channels of 8 x 8)
    assert summary["stage_activation_bytes"] == [sent, 0], summary
    args = pipeline.parse_args([str(f) for f in flags])
    assert_same_weights(weights(out), pipedream_reference(args, 2), 1e-5)
    plain = pipedream_reference(args, 2, pipelined=False)  # (what the test tells apart: plain SGD's weights)
    gap = max((weights(out)[key] - plain[key]).abs().max().item() for key in plain)
    assert gap > (1e-4 if arch == "vit_tiny" else 1e-3), gap  # (vit_tiny's: 9e-4, 90 times the tolerance)


def test_a_masked_language_model_trains_with_adamw_and_its_checkpoint_evaluates_anywhere(tiny_text, tmp_path):
    """bert_tiny on a tiny text, 2 replicas x 2 stages under pipedream with AdamW (SD-PIPE's BERT): the replicas
    stay equal, the masked tokens' loss falls far below what the letters' frequencies give, and ddp on 3
    processes scores the checkpoint (weights and AdamW's moments gathered from the stages) to the same top-1
    and loss."""
    out = tmp_path / "run"
    flags = [tiny_text, "-a", "bert_tiny", "-b", "8", "-j", "0", "--seed", "0", "-p", "1", "--epochs", "3",
             "--stages", "2", "--schedule", "pipedream", "--optimizer", "adamw", "--lr", "0.032",
             "--weight-decay", "0.01", "--out", out]
    run_recipe("pipeline", flags, nproc=4)
    summary = read_summary(out)
    assert summary["updates_per_replica"] == [9, 9] and summary["disagreement"] == 0, summary
    losses = [float(row.split(",")[2]) for row in (out / "metrics.csv").read_text().splitlines() if ",val," in row]
    assert losses[-1] < 0.5 < math.log(8) and summary["top1"] > 90, (losses, summary["top1"])  # (8 letters: guessing
    # the commonest without reading the sequence scores ln 8)
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert {"exp_avg", "exp_avg_sq"} <= set(saved["optimizer"]["state"][0]), saved["optimizer"]["state"][0].keys()
    scored = tmp_path / "scored"
    run_recipe("ddp", [tiny_text, "-a", "bert_tiny", "-b", "8", "-j", "0", "-e", "--resume", out / "checkpoint.pt",
                       "--out", scored], nproc=3)
    again = read_summary(scored)
    assert (again["top1"], round(again["loss"], 4)) == (summary["top1"], round(summary["loss"], 4)), (again, summary)


def test_pipedream_at_three_stages_stashes_as_the_plain_reference_does(tiny_data, tmp_path):
    """2 replicas x 3 stages: stage s holds 3 - s versions of its weights, minibatch i's forward at stage 0 runs on
    the weights of two updates before, and the weights after an epoch are pipedream_reference's."""
    out = tmp_path / "run"
    flags = [tiny_data, *TINY, "-b", "4", "--epochs", "1", "--stages", "3", "--schedule", "pipedream", "--lr", "2"]
    run_recipe("pipeline", [*flags, "--out", out], nproc=6)
    summary = read_summary(out)
    assert summary["updates_per_replica"] == [6, 6] and summary["disagreement"] == 0, summary
    assert summary["weight_versions_per_stage"] == [3, 2, 1], summary
    args = pipeline.parse_args([str(f) for f in flags])
    assert_same_weights(weights(out), pipedream_reference(args, 2), 1e-5)
    two_stages_deep = pipedream_reference(args, 2, in_flight=2)  # (what the test tells apart: a pipeline of 2)
    gap = max((weights(out)[key] - two_stages_deep[key]).abs().max().item() for key in two_stages_deep)
    assert gap > 1e-3, gap


def test_the_schedule_stops_at_the_runs_end_for_a_replica_past_its_share(tiny_data, tmp_path):
    """--sync preduce with replica 1 ten times slower, under the cosine: replica 0 takes more than its share of
    the run's last epoch, and the learning rate its progress lines print (its stage's optimizer's) falls step by
    step to the run's last step's and stays there, never climbing back up the cosine."""
    result = run_recipe("pipeline", [tiny_data, *TINY, "-b", "4", "--epochs", "1", "--stages", "1", "--sync",
                                     "preduce", "--lr-schedule", "cosine", "--slow-rank", "1", "--slow-factor", "10",
                                     "--out", tmp_path / "run"], nproc=2)
    lrs = [float(lr) for lr in re.findall(r"^epoch 1 step \d+/6 .* lr (\S+)$", result.stdout, re.M)]
    assert len(lrs) > 6, result.stdout  # (a share is 6 of the epoch's 12 updates)
    assert all(a > b for a, b in zip(lrs[:6], lrs[1:6])) and lrs[6:] == [lrs[5]] * (len(lrs) - 6), lrs


def test_pipedream_with_preduce_counts_epochs_in_updates_and_every_stage_updates_once_a_minibatch(tiny_data,
                                                                                                   tmp_path):
    """2 replicas x 2 stages, replica 0's second stage ten times slower: an epoch is 2 x 6 updates, the fast
    replica does more of them, each stage of a replica makes one update for each minibatch it took (the epoch's
    end travels down the pipeline with the activations) and queues for a group after each."""
    out = tmp_path / "run"
    run_recipe("pipeline", [tiny_data, *TINY, "-b", "4", "--epochs", "1", "--stages", "2", "--schedule", "pipedream",
                            "--sync", "preduce", "--slow-rank", "1", "--slow-factor", "10", "--out", out], nproc=4)
    summary = read_summary(out)
    slow, fast = summary["updates_per_replica"]
    assert slow + fast == 2 * 6 and fast > slow and summary["updates_per_rank"] == [slow, slow, fast, fast], summary
    assert summary["weight_versions_per_stage"] == [2, 1] and summary["full_syncs"] == 1
    assert 1 <= summary["mean_group_size"] <= 2  # every update of every stage joined a group, inside its backward


def test_pipedream_stops_on_sigterm_after_a_saved_update_and_resumes(tiny_data, tmp_path):
    """A SIGTERM to stage 0 after its 4th update: every stage stops after the same update, the 20th (the stop
    checks run every 10th and are read at the next), with no message left unmatched, and saves; the relaunch
    trains the updates left."""
    out = tmp_path / "run"
    flags = [tiny_data, *TINY, "--epochs", "1", "-b", "2", "--stages", "2", "--schedule", "pipedream", "-p", "100",
             "--auto-resume", "--out", out]
    result = injected("pipeline", flags, "term", 4, nproc=2, inject_args=["--rank", "0"])
    assert result.returncode != 0 and "preempted: SIGTERM received; saved" in result.stdout + result.stderr, \
        result.stderr[-3000:]
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert (saved["epoch"], saved["step"]) == (0, 20), (saved["epoch"], saved["step"])
    run_recipe("pipeline", flags, nproc=2)
    summary = read_summary(out)
    assert summary["epochs"] == 1 and summary["updates_per_replica"] == [24 - 20], summary


# ---- bad input ------------------------------------------------------------------------------------------------

REFUSED = [  # (flags, the reason; with TINY on one process)
    (["--stages", "2"], "the world size 1 is not a multiple of --stages 2"),
    (["--stages", "5"], "--stages 5: --arch lenet has only 4 layers with weights to split into stages"),
    (["--sync", "preduce", "--preduce-size", "1"], "--preduce-size must be at least 2, got 1"),
    (["--sync", "preduce", "--save-every", "2"], "--save-every is not supported with --sync preduce"),
    (["--sync", "hetpipe", "--wave", "0"], "--wave must be at least 1, got 0"),
    (["--microbatches", "3"], "--microbatches 3 must divide --batch-size 8"),
    (["--microbatches", "0"], "--microbatches must be at least 1, got 0"),
    (["--microbatches", "1"], "--schedule 1f1b needs at least as many --microbatches as --stages: 1 < 2"),
    (["--stages", "1", "--sync", "hetpipe"], "--sync hetpipe needs the 1 servers and at least one replica"),
    (["--schedule", "pipedream", "--microbatches", "2"], "--schedule pipedream sends whole minibatches"),
    (["--sync", "hetpipe", "--staleness", "-1"], "--staleness must be 0 or more, got -1"),
    (["--mixup-alpha", "0.2"], "--mixup-alpha is not supported by the pipeline recipe"),
    (["--snapshot-every", "0"], "--snapshot-every must be a number of seconds, got 0"),
]


@pytest.mark.parametrize("flags,phrase", REFUSED)
def test_each_refused_flag_combination_names_its_reason(tiny_data, flags, phrase):
    """Where the recipe refuses it: parsing, or the check once the world size is known (here 1)."""
    with pytest.raises(RecipeError) as refused:
        check_world(pipeline.parse_args([str(tiny_data), *TINY, *flags]), 1)
    assert phrase in str(refused.value)


@pytest.mark.parametrize("flags,phrase", [REFUSED[0], REFUSED[9], (["--schedule", "zb"],
                                                                   "argument --schedule: invalid choice: 'zb'")])
def test_bad_input(tiny_data, tmp_path, flags, phrase):
    """Launched: one clear line and exit 2 (test_bad_input.py checks the mechanism for every recipe)."""
    result = run_recipe("pipeline", [tiny_data, *TINY, "--out", tmp_path / "out", *flags], expect_ok=False)
    assert_one_clear_line(result, phrase)


def test_the_deviations_from_sd_pipe_are_listed_once_each_with_a_line_it_cites():
    """recipes/pipeline/deviations.py is the one list: every row names what both do, where in the authors' code and
    why, and quotes a line among those it cites (scripts/checks/authors_lines.py checks the quotes against a
    clone); the modules point to it and list none of their own; the long form holds the table it renders."""
    from scripts.checks.authors_lines import authors_code, cited, place
    from scripts.figures.pipeline.render import deviations

    rows, files, commits = authors_code("pipeline")
    for row in rows:
        assert all(row[key] for key in ("here", "theirs", "where", "why")), row
        name, line, piece = row["shows"]
        places = dict(cited(row["where"], files, commits))
        lines = places[place(files, commits, name)]  # (a file the row cites ...)
        assert min(lines) <= line <= max(lines) and piece, row  # (... and a line there)
    folder = ROOT / "recipes" / "pipeline"
    for module in folder.glob("*.py"):
        text = module.read_text()
        assert module.name == "deviations.py" or not re.search(r"deviations?[ :(]", text, re.I), module
    assert "deviations.py" in (folder / "train.py").read_text() and "deviations.py" in (folder / "sync.py").read_text()
    assert deviations() in (ROOT / "docs" / "results" / "pipeline.md").read_text()
