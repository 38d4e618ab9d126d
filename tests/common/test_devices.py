"""Devices and process groups: what a CPU can show of the recipes' CUDA and NCCL paths.

The model's tensors travel over device groups (NCCL on CUDA), everything else over a
gloo group of CPU tensors. Here the meta device stands in for a GPU where a tensor's
device is what matters, and scripts/harness/nccl_rules.py refuses, on gloo, what NCCL refuses.
"""

import argparse

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conftest import ROOT, TINY, child_env, read_summary, run_recipe
from recipes.common import RecipeError, amp, cli, data, distributed, models, pushpull

META = torch.device("meta")


@pytest.fixture
def recorded(monkeypatch):
    """torch.distributed's calls, recorded instead of made: [(name, tensor, group, peer)]; a control group."""
    calls, control = [], object()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed, "_control", control)
    for name in ("broadcast", "send", "recv", "all_reduce"):
        monkeypatch.setattr(dist, name, lambda tensor, peer=None, group=None, name=name, **_:
                            calls.append((name, tensor, group, peer)))
    return calls, control


def test_a_buffer_kept_on_the_cpu_is_broadcast_over_the_control_group(recorded):
    """--ema-decay: AveragedModel keeps its update counter on the CPU, whatever the model's device; NCCL takes
    no CPU tensor."""
    calls, control = recorded
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).to(META)
    ema = models.build_ema(model, 0.9)
    assert ema.n_averaged.device.type == "cpu"
    distributed.broadcast_buffers(ema, group=None)
    routes = {(tensor.device.type, group is control) for _, tensor, group, _ in calls}
    assert routes == {("meta", False), ("cpu", True)}  # the statistics over the device group, the counter not


def test_the_ema_update_copies_nothing_to_the_device_and_equals_averaged_model(monkeypatch):
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    ours, theirs = models.build_ema(model, 0.9), models.build_ema(model, 0.9)
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        model(torch.randn(8, 4))  # (moves the BatchNorm statistics)
        models.update_ema(ours, model)
        theirs.update_parameters(model)
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()):
        torch.testing.assert_close(a, b)

    model = model.to(META)
    ema = models.build_ema(model, 0.9)
    copies, to = [], torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: copies.append(self.device.type) or to(self, *a, **k))
    for _ in range(3):
        models.update_ema(ema, model)
    assert "cpu" not in copies and ema.n_averaged.device.type == "cpu" and int(ema.n_averaged) == 3
    ema.update_parameters(model)
    assert "cpu" in copies  # (what AveragedModel does each step: the counter to the GPU, a host synchronisation)


def test_pulled_weights_go_into_the_model_where_it_is():
    """A parameter-server client keeps its copy of the weights on the CPU; its model may be on a GPU."""
    layer = nn.Linear(2, 3).to(META)
    pushpull.copy_into(layer.parameters(), torch.arange(9.0))
    assert {p.device.type for p in layer.parameters()} == {"meta"}  # (vector_to_parameters: the vector's device)
    layer = nn.Linear(2, 3)
    pushpull.copy_into(layer.parameters(), torch.arange(9.0))
    assert torch.equal(layer.weight, torch.arange(6.0).view(3, 2)) and torch.equal(layer.bias, torch.arange(6.0, 9))


def test_pushes_and_pulls_travel_over_the_control_group(recorded):
    calls, control = recorded
    pushpull.send(pushpull.header(pushpull.PUSH), 1, torch.zeros(5))
    pushpull.recv_header()
    pushpull.recv_payload(1, 5)
    assert [name for name, *_ in calls] == ["send", "send", "recv", "recv"]
    assert all(group is control and tensor.device.type == "cpu" for _, tensor, group, _ in calls)


def test_the_summary_counts_go_over_a_control_group(recorded):
    """The pipeline's and the servers' counts are CPU numbers: on the world's or the servers' device group (NCCL on
    GPUs) their all-reduce would fail, after training, before summary.json."""
    from recipes.pipeline import sync
    from recipes.pipeline.layout import Layout
    from recipes.ps import attacks, server as ps

    calls, control = recorded
    tally = sync.Tally(waits=3, partial_syncs=4, gap=1, longest_gap=2, full_syncs=5)
    counts = sync.counts_of_every_rank(tally, Layout(stages=2, world_size=4), rank=0)
    servers = argparse.Namespace(group=object(), control=object())  # a Run of the servers: device and gloo groups
    flags = argparse.Namespace(mode="sync", aggregate="mean", attack="none", byzantine=0, attack_prob=0, local_steps=1,
                               servers=1, validators=0)
    ps.summary_of(flags, argparse.Namespace(workers=2), argparse.Namespace(
        counts=torch.ones(attacks.COUNTS, dtype=torch.float64), stale=0, oldest=2), servers)
    assert [(name, group) for name, _, group, _ in calls] == [("all_reduce", control)] * 2 + [
        ("all_reduce", servers.control)] * 2
    assert all(tensor.device.type == "cpu" for _, tensor, _, _ in calls)
    assert counts["waits"] == 1.5 and counts["longest_without_full_sync"] == 2


@pytest.mark.parametrize("before,after", [(None, "2"), ("1", "2"), ("0", "0"), ("3", "3"), ("2", "2")])
def test_nccl_errors_raise_unless_the_user_chose_otherwise(before, after):
    environ = {} if before is None else {"TORCH_NCCL_ASYNC_ERROR_HANDLING": before}  # (1: torchrun's default)
    distributed.raise_nccl_errors(environ)
    assert environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == after


def test_batches_leave_the_workers_as_uint8_and_are_normalised_on_the_device(tiny_data):
    args = cli.parse_args(cli.build_parser("nd", ""), [str(tiny_data), *TINY])
    train_set, _, num_classes = data.build_datasets(args)
    from multiprocessing.reduction import ForkingPickler
    ForkingPickler.dumps(train_set[0][0])  # what a worker does to send it (else the loader below never ends)
    loader = data.train_loader(train_set, args, data.EpochShuffle(train_set, 0))
    images, target = next(iter(loader))
    assert images.dtype == torch.uint8  # 4x fewer bytes than float through shared memory and the copy
    on_device, _ = data.device_transform(args, torch.device("cpu"), num_classes)(images, target)
    expected = torch.stack([data.v2.Normalize(data.IMAGENET_MEAN, data.IMAGENET_STD)(image.float() / 255)
                            for image in images])
    torch.testing.assert_close(on_device, expected)
    args.channels_last = True  # --channels-last: the batches too, not only the weights
    on_device, _ = data.device_transform(args, torch.device("cpu"), num_classes)(images, target)
    assert on_device.is_contiguous(memory_format=torch.channels_last)


def test_workers_persist_across_epochs_unless_a_seed_asks_for_repeatable_augmentations(tiny_data):
    seed = TINY.index("--seed")
    unseeded = [str(tiny_data), *TINY[:seed], *TINY[seed + 2:], "-j", "1"]
    for flags, persistent in (([*unseeded, "--seed", "0"], False), (unseeded, True)):
        args = cli.parse_args(cli.build_parser("nd", ""), flags)
        train_set, val_set, _ = data.build_datasets(args)
        assert data.train_loader(train_set, args, data.EpochShuffle(train_set, 0)).persistent_workers == persistent
        assert data.val_loader(val_set, args).persistent_workers  # (evaluation draws nothing at random)


def test_loader_workers_default_to_every_core_but_one_per_process_on_cuda(monkeypatch):
    monkeypatch.setattr(cli, "usable_cores", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cli.default_workers(False) == 4  # CPU: training needs the cores
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.default_workers(False) == 7  # CUDA: 8 cores per process, one of them for the process itself


def test_the_gpu_decoder_reads_jpeg_files_only_and_needs_cuda(tmp_path):
    from PIL import Image
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    Image.new("RGB", (8, 8)).save(tmp_path / "a.jpg")
    assert data.read_jpeg_bytes(tmp_path / "a.jpg")[:2].tolist() == [0xFF, 0xD8]
    with pytest.raises(RecipeError, match="--decoder gpu decodes JPEG files on the GPU, and .*a.png is not one"):
        data.read_jpeg_bytes(tmp_path / "a.png")
    if not torch.cuda.is_available():
        with pytest.raises(RecipeError, match="--decoder gpu decodes the JPEG files on a CUDA GPU"):
            cli.parse_args(cli.build_parser("nd", ""), [str(tmp_path), "--decoder", "gpu"])


def test_the_gpu_decoders_batches_are_decoded_cropped_and_normalised_where_the_model_is(tmp_path):
    """--decoder gpu's path after the loader, on the CPU (decode_jpeg decodes there too): the files' bytes, of
    different lengths and image sizes, become one normalised batch."""
    import numpy as np
    from PIL import Image

    for i, (height, width, value) in enumerate([(20, 30, 40), (48, 24, 200)]):
        Image.fromarray(np.full((height, width, 3), value, np.uint8)).save(tmp_path / f"{i}.jpg", quality=95)
    images, target = data.collate_encoded([(data.read_jpeg_bytes(tmp_path / f"{i}.jpg"), i) for i in range(2)])
    assert isinstance(images, list) and target.tolist() == [0, 1]
    args = argparse.Namespace(decoder="gpu", image_size=16, scale=[0.5, 1.0], hflip=0.5, channels_last=True,
                              mixup_alpha=0.0, cutmix_alpha=0.0)
    for train in (True, False):
        batch, _ = data.device_transform(args, torch.device("cpu"), 2, train)(images, target)
        assert batch.shape == (2, 3, 16, 16) and batch.dtype == torch.float32
        assert batch.is_contiguous(memory_format=torch.channels_last)
        expected = [(value - 255 * torch.tensor(data.IMAGENET_MEAN)) / (255 * torch.tensor(data.IMAGENET_STD))
                    for value in (40, 200)]  # (flat images: every crop is the same colour)
        for image, colour in zip(batch, expected):
            torch.testing.assert_close(image.mean(dim=(1, 2)), colour, atol=0.05, rtol=0)
    empty, _ = data.device_transform(args, torch.device("cpu"), 2, False)([], torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0, 3, 16, 16)  # (evaluation in lockstep runs empty batches)


def test_the_gpu_decoders_bytes_come_through_loader_workers(tmp_path):
    """--decoder gpu with loader workers: each file's bytes reach the training process (read_file maps the file,
    and a mapped tensor failed in the workers with EBADF, the loader waiting for ever), and decode there."""
    import numpy as np
    from PIL import Image

    for split in ("train", "val"):
        for label in range(2):
            (tmp_path / split / str(label)).mkdir(parents=True)
            for i in range(4):
                Image.fromarray(np.full((20 + i, 24, 3), 60 + 100 * label, np.uint8)).save(
                    tmp_path / split / str(label) / f"{i}.jpg", quality=95)
    args = argparse.Namespace(data=str(tmp_path), synthetic=False, decoder="gpu", image_size=16, scale=[0.5, 1.0],
                              hflip=0.5, batch_size=4, accum_steps=1, workers=2, seed=0, channels_last=False,
                              mixup_alpha=0.0, cutmix_alpha=0.0)
    train_set, _, num_classes = data.build_datasets(args)
    from multiprocessing.reduction import ForkingPickler
    ForkingPickler.dumps(train_set[0][0])  # what a worker does to send it (else the loader below never ends)
    loader = data.train_loader(train_set, args, data.EpochShuffle(train_set, 0))
    batches = [data.device_transform(args, torch.device("cpu"), num_classes)(images, target)
               for images, target in loader]
    assert [batch.shape for batch, _ in batches] == [(4, 3, 16, 16)] * 2
    for batch, target in batches:  # (flat images, class 0 darker than the mean colour, class 1 lighter)
        assert ((batch.mean(dim=(1, 2, 3)) > 0) == (target == 1)).all(), (batch.mean(dim=(1, 2, 3)), target)


def test_a_sharded_model_at_fp16_answers_in_fp32(monkeypatch):
    """fully_shard at O1 fp16: the loss in fp16 would overflow once scaled (about 7 x 65,536 > 65,504)."""
    from recipes.fsdp import train as fsdp

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        args = argparse.Namespace(opt_level="O1", amp_dtype="fp16", channels_last=False, shard="full", arch="lenet")
        log = argparse.Namespace(print=lambda message: None)
        model, policy, _ = amp.fsdp_policy(models.lenet(3), args, torch.device("cpu"), log)
        model = fsdp.shard_model(model, args, policy)
        output = model(torch.randn(2, 3, 16, 16))
        assert policy.param_dtype == torch.float16 and output.dtype == torch.float32
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("shard", ["grad-op", "full"])
def test_fully_sharded_training_takes_channels_last(tiny_data, tmp_path, shard):
    """fully_shard takes only contiguous weights: --channels-last makes the batches NHWC instead."""
    run_recipe("fsdp", [tiny_data, *TINY, "-b", "4", "--epochs", "1", "--shard", shard, "--channels-last",
                        "--out", tmp_path], nproc=2)
    assert read_summary(tmp_path)["shard"] == shard


def test_adpsgd_exchanges_weights_in_grouped_pairs(tiny_data, tmp_path):
    """Posted one after the other (isend, then irecv) on both partners, the pairs' exchanges could deadlock NCCL;
    as every ps and pipeline test, this one runs under scripts/harness/nccl_rules.py (conftest.recipe_command)."""
    run_recipe("pipeline", [tiny_data, *TINY, "-b", "4", "--epochs", "1", "--stages", "2", "--microbatches", "2",
                            "--sync", "adpsgd", "--out", tmp_path], nproc=6)
    summary = read_summary(tmp_path)
    assert summary["replicas"] == 3 and summary["partial_syncs"] > 0  # (3 replicas: one of them sits out each step)


RULE_BREAKERS = {
    "a receive from any source on a device group": "dist.recv(torch.zeros(1))",
    "an object collective on a device group": "dist.broadcast_object_list([1], src=0)",
    "an isend or irecv not grouped by batch_isend_irecv": "dist.isend(torch.zeros(1), 0)",
}


@pytest.mark.parametrize("rule", RULE_BREAKERS)
def test_nccl_rules_end_a_run_that_breaks_one(tmp_path, rule):
    """The wrapper that checks the ps and pipeline tests can fail: each rule, broken once, by a script standing in
    for a recipe."""
    import subprocess
    import sys

    script = tmp_path / "breaks_a_rule.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo', rank=0, world_size=1, store=dist.HashStore())\n"
                      f"{RULE_BREAKERS[rule]}\n")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "harness" / "nccl_rules.py"), str(script)],
                            cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "nccl-rules: rank 0: " in result.stderr and rule in result.stderr and "breaks_a_rule.py:3" in result.stderr
