"""The sharded recipe: each --shard mode against ddp, the memory it measures, portable and sharded checkpoints,
bad input."""

import json
import types

import pytest
import torch
import torch.distributed as dist
from conftest import TINY, assert_one_clear_line, free_port, read_summary, run_recipe, spawn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from recipes.common import models
from recipes.fsdp import train as fsdp

MODES = ["none", "optimizer", "grad-op", "full"]
RUN = [*TINY, "--epochs", "2", "--accum-steps", "2", "-b", "4"]  # global batch 16: 3 steps per epoch, 2 micro-batches
FP32 = ["--opt-level", "O0"]  # (the default is O1 on CUDA and where the CPU has native bf16)


def checkpoint(out, name="checkpoint.pt"):
    return torch.load(out / name, weights_only=True)


def assert_same_state(a, b, tolerance=1e-5):
    """The same weights and the same momentum, to tolerance."""
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.allclose(a["model"][key], b["model"][key], atol=tolerance), key
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for index, state in a["optimizer"]["state"].items():
        other = b["optimizer"]["state"][index]["momentum_buffer"]
        assert torch.allclose(state["momentum_buffer"], other, atol=tolerance), index


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    """ddp, and the four modes, 2 processes, the same seed, steps and global batch."""
    root = tmp_path_factory.mktemp("fsdp")
    run_recipe("ddp", [tiny_data, *RUN, "--out", root / "ddp"], nproc=2)
    for mode in MODES:
        run_recipe("fsdp", [tiny_data, *RUN, *FP32, "--shard", mode, "--out", root / mode], nproc=2)
    return root


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_ends_with_ddps_weights(runs, mode):
    assert_same_state(checkpoint(runs / mode), checkpoint(runs / "ddp"))
    assert read_summary(runs / mode)["shard"] == mode


def test_the_measured_bytes_per_rank_are_what_each_mode_shards(runs):
    memory = {mode: read_summary(runs / mode) for mode in MODES}
    whole = memory["none"]["param_bytes"][0]  # ddp: everything whole on every rank, 4 bytes per parameter
    assert whole == 4 * sum(t.numel() for t in checkpoint(runs / "ddp")["model"].values())
    assert memory["none"]["grad_bytes"] == memory["none"]["optimizer_bytes"] == [whole, whole]
    # ZeRO-1: whole tensors, each owned by one rank: the two shares add up to ddp's, each smaller
    zero1 = memory["optimizer"]["optimizer_bytes"]
    assert sum(zero1) == whole and max(zero1) < whole
    assert memory["optimizer"]["param_bytes"] == memory["optimizer"]["grad_bytes"] == [whole, whole]
    for mode in ("grad-op", "full"):  # 1/2 of every tensor (rows split, so about half)
        for name in ("grad_bytes", "optimizer_bytes"):
            assert sum(memory[mode][name]) == whole and max(memory[mode][name]) < 0.51 * whole, (mode, name)
    assert sum(memory["full"]["param_bytes"]) == whole  # weights sharded: only full halves them in a step
    assert min(memory["grad-op"]["param_bytes"]) >= whole  # every block gathered between forward and backward
    assert all(rss > 0 for mode in MODES for rss in memory[mode]["peak_rss_bytes"])


def test_a_transformer_run_keeps_half_of_every_byte_on_each_of_2_ranks(tiny_data, tmp_path):
    """vit_tiny under --shard full on 2 ranks: each rank keeps half of the weights, gradients and momentum."""
    out = tmp_path / "vit"
    run_recipe("fsdp", [tiny_data, *RUN, *FP32, "-a", "vit_tiny", "--image-size", "14", "--shard", "full",
                        "--out", out], nproc=2)
    memory = read_summary(out)
    whole = 4 * sum(t.numel() for t in checkpoint(out)["model"].values())
    for name in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        assert sum(memory[name]) == whole and max(memory[name]) < 0.51 * whole, (name, memory[name], whole)


def _gathered_in_forward(rank, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = models.build_model("vit_tiny", 3, 14)
    args = types.SimpleNamespace(arch="vit_tiny", shard="full")
    model = fsdp.shard_model(model, args, MixedPrecisionPolicy())
    blocks = list(model.encoder.layers)
    gathered = []  # at each block's forward: the bytes of the model's parameters that are whole (not DTensors)
    for block in blocks:
        block.register_forward_pre_hook(lambda module, inputs: gathered.append(sum(
            4 * p.numel() for p in model.parameters() if not isinstance(p, DTensor))))
    model(torch.randn(2, 3, 14, 14)).sum().backward()
    sizes = {"block": 4 * sum(p.numel() for p in blocks[0].parameters()), "gathered": gathered,
             "wrapped": [isinstance(block, FSDPModule) for block in blocks] + [isinstance(model, FSDPModule)],
             "local": sum(4 * p.to_local().numel() for p in model.parameters()),
             "whole": 4 * sum(p.numel() for p in model.parameters())}
    (results / f"{rank}.json").write_text(json.dumps(sizes))
    dist.destroy_process_group()


def test_each_transformer_block_is_its_own_unit_so_one_is_gathered_at_a_time(tmp_path):
    """shard_model on vit_tiny, 2 ranks: every encoder block is a fully_shard unit, and the root the rest; at each
    block's forward the whole weights held are the root's and that block's (not the model's, as one unit would
    gather); each rank keeps half of the weights, to 1 % (FSDP2 splits a tensor by its first dimension: the class
    token and position embeddings, whose first dimension is 1, stay whole on rank 0)."""
    spawn(_gathered_in_forward, (free_port(), tmp_path), 2)
    for rank in range(2):
        sizes = json.loads((tmp_path / f"{rank}.json").read_text())
        assert all(sizes["wrapped"]) and len(sizes["wrapped"]) == 9, sizes["wrapped"]
        assert len(sizes["gathered"]) == 8 and max(sizes["gathered"]) < 0.2 * sizes["whole"], sizes
        assert sizes["block"] <= min(sizes["gathered"]), sizes
        assert abs(sizes["local"] - sizes["whole"] / 2) < 0.01 * sizes["whole"], sizes


def test_a_full_checkpoint_evaluates_in_nd_to_the_same_count(runs, tiny_data, tmp_path):
    run_recipe("nd", [tiny_data, *TINY, "-e", "--resume", runs / "full" / "checkpoint.pt", "--out", tmp_path / "e"])
    assert read_summary(tmp_path / "e")["top1_correct"] == read_summary(runs / "full")["top1_correct"]


def test_a_model_with_batchnorm_evaluates_as_its_checkpoint_does(tiny_data, tmp_path):
    # each rank's running statistics follow its own batches; evaluation uses rank 0's, which the checkpoint holds
    flags = [tiny_data, *TINY, "-a", "resnet18", "--epochs", "1", "--lr", "0.5"]
    run_recipe("fsdp", [*flags, *FP32, "--shard", "full", "--out", tmp_path / "full"], nproc=3)
    run_recipe("nd", [*flags, "-e", "--resume", tmp_path / "full" / "best.pt", "--out", tmp_path / "e"])
    assert read_summary(tmp_path / "e")["top1_correct"] == read_summary(tmp_path / "full")["top1_correct"]
    assert read_summary(tmp_path / "e")["loss"] == pytest.approx(read_summary(tmp_path / "full")["loss"], rel=1e-4)


def test_a_ddp_checkpoint_resumes_sharded_and_continues_as_ddp(tiny_data, tmp_path):
    first = [tiny_data, *TINY, "--accum-steps", "2", "-b", "4"]
    run_recipe("ddp", [*first, "--epochs", "1", "--out", tmp_path / "one"], nproc=2)
    resume = ["--epochs", "2", "--resume", tmp_path / "one" / "checkpoint.pt"]
    run_recipe("ddp", [*first, *resume, "--out", tmp_path / "ddp"], nproc=2)
    for mode in ("full", "optimizer"):  # the momentum resharded: 1/N of each tensor, or the tensors each rank owns
        result = run_recipe("fsdp", [*first, *resume, *FP32, "--shard", mode, "--out", tmp_path / mode], nproc=2)
        assert "saved by recipes/ddp" in result.stdout
        assert_same_state(checkpoint(tmp_path / mode), checkpoint(tmp_path / "ddp"))
        assert checkpoint(tmp_path / mode)["epoch"] == 2


def test_a_sharded_checkpoint_resumes_at_another_world_size_and_says_it_reshards(tiny_data, tmp_path):
    flags = [tiny_data, *TINY, "--shard", "full"]
    run_recipe("fsdp", [*flags, "--epochs", "1", "--sharded-checkpoint", "--out", tmp_path / "one"], nproc=2)
    sharded = tmp_path / "one" / "checkpoint_dcp"
    assert (sharded / ".metadata").is_file() and json.loads((sharded / "meta.json").read_text())["world_size"] == 2
    assert not (tmp_path / "one" / "checkpoint_dcp.tmp").exists()
    # the same training state as the gathered checkpoint.pt: resumed at 2 processes, both continue alike
    for source, out in ((sharded, "dcp"), (tmp_path / "one" / "checkpoint.pt", "whole")):
        run_recipe("fsdp", [*flags, "--epochs", "2", "--resume", source, "--out", tmp_path / out], nproc=2)
    assert_same_state(checkpoint(tmp_path / "dcp"), checkpoint(tmp_path / "whole"))
    result = run_recipe("fsdp", [*flags, "--epochs", "2", "--resume", sharded, "--out", tmp_path / "three"], nproc=3)
    assert f"resharding {sharded}: saved by 2 rank(s), loaded by 3" in result.stdout
    assert read_summary(tmp_path / "three")["epochs"] == 2


@pytest.mark.parametrize("flags, phrases", [
    (["--shard", "zero"], ["--shard: invalid choice: 'zero'"]),
    (["--shard", "grad-op", "--sync-bn"], ["--sync-bn with --shard grad-op"]),
    (["--shard", "full", "--sync-bn"], ["--sync-bn with --shard full"]),
    (["--shard", "full", "--ema-decay", "0.99"], ["--ema-decay with --shard full"]),
    (["--shard", "optimizer", "--sharded-checkpoint"], ["--sharded-checkpoint with --shard optimizer"]),
    (["--shard", "optimizer", "--resume", "."], ["(a --sharded-checkpoint directory) with --shard optimizer"]),
    (["--shard", "none", "--sharded-checkpoint", "--ema-decay", "0.9"], ["--sharded-checkpoint with --ema-decay"]),
])
def test_bad_flags_say_so_in_one_line(tiny_data, tmp_path, flags, phrases):
    result = run_recipe("fsdp", [tiny_data, *TINY, *flags, "--out", tmp_path / "run"], expect_ok=False)
    assert_one_clear_line(result, *phrases)


def test_a_directory_that_is_no_sharded_checkpoint_says_so(tiny_data, tmp_path):
    (tmp_path / "not_dcp").mkdir()
    (tmp_path / "not_dcp" / "meta.json").write_text("{}")
    result = run_recipe("fsdp", [tiny_data, *TINY, "--resume", tmp_path / "not_dcp", "--out", tmp_path / "run"],
                        expect_ok=False)
    assert_one_clear_line(result, "is a directory but not a --sharded-checkpoint")


def test_a_damaged_sharded_checkpoint_says_so(tiny_data, tmp_path):
    flags = [tiny_data, *TINY, "--shard", "full", "--epochs", "1"]
    run_recipe("fsdp", [*flags, "--sharded-checkpoint", "--out", tmp_path / "one"])
    sharded = tmp_path / "one" / "checkpoint_dcp"
    (sharded / "meta.json").write_text("{\"arch\": \"lenet\"")  # cut off
    result = run_recipe("fsdp", [*flags, "--resume", sharded, "--out", tmp_path / "two"], expect_ok=False)
    assert_one_clear_line(result, f"sharded checkpoint {sharded} is corrupt")
    for shard in sharded.glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])
    (sharded / "meta.json").write_text(json.dumps({**json.loads((tmp_path / "one" / "summary.json").read_text()),
                                                   "num_classes": 3, "step": 0, "world_size": 1}))
    result = run_recipe("fsdp", [*flags, "--resume", sharded, "--out", tmp_path / "three"], expect_ok=False)
    assert_one_clear_line(result, f"sharded checkpoint {sharded} is corrupt")


def test_a_sharded_checkpoint_of_another_model_says_so(tiny_data, tmp_path):
    flags = [tiny_data, *TINY, "--shard", "full", "--epochs", "1"]
    run_recipe("fsdp", [*flags, "--sharded-checkpoint", "--out", tmp_path / "one"])
    result = run_recipe("fsdp", [*flags, "-a", "resnet18", "--resume", tmp_path / "one" / "checkpoint_dcp",
                                 "--out", tmp_path / "run"], expect_ok=False)
    assert_one_clear_line(result, "holds a lenet model, not --arch resnet18")
