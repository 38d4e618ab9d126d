"""The training-recipe flags: gradient accumulation, schedules, EMA, mixup/cutmix, label smoothing,
torch.compile and the profiler."""

import argparse
import csv
import datetime
import functools
import importlib
import json
import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from conftest import TINY, assert_complete_run_dir, free_port, read_summary, run_recipe, spawn
from recipes.common import bookkeeping, checkpoint, cli, data, models, runlog, schedule

WORLD_SIZE, STEPS, MICRO_BATCH = 2, 3, 4


def training_args(tmp_path, accum_steps, **extra):
    return argparse.Namespace(accum_steps=accum_steps, epochs=1, print_freq=1000, save_every=0, out=str(tmp_path),
                              evaluate=False, resume=None, mixup_alpha=0, cutmix_alpha=0, **extra)


def one_epoch(recipe, rank, world_size, accum_steps, tmp_path, hook_calls=None):
    """recipes/<recipe>/train.py's own train_one_epoch on fixed data: STEPS steps of
    MICRO_BATCH x 4 images per process, split into accum_steps micro-batches."""
    train = importlib.import_module(f"recipes.{recipe}.train")
    torch.manual_seed(0)
    n = WORLD_SIZE * STEPS * MICRO_BATCH * 4
    images, labels = torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8), torch.randint(0, 3, (n,))
    sampler = DistributedSampler(TensorDataset(images, labels), world_size, rank, shuffle=False)
    loader = DataLoader(TensorDataset(images, labels), batch_size=MICRO_BATCH * 4, sampler=sampler, drop_last=True)
    model = models.lenet(3)  # no batch norm: a micro-batch's gradient does not depend on the others
    initial = [p.detach().clone() for p in model.parameters()]
    train_model = model
    if world_size > 1:
        train_model = DDP(model)  # lenet's gradients fit in one bucket: one allreduce per synchronised backward
        train_model.register_comm_hook(hook_calls, counting_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    args = training_args(tmp_path, accum_steps, channels_last=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    log = runlog.RunLog(args, enabled=False)
    criterion = torch.nn.CrossEntropyLoss()
    run = bookkeeping.Run(args, log, torch.device("cpu"), model, optimizer, scheduler, None, 3,
                          MICRO_BATCH * 4 * world_size, steps_per_epoch=len(loader))
    common = dict(model=train_model, loader=loader, criterion=criterion, optimizer=optimizer, run=run)
    if recipe in ("apex", "fsdp"):  # (fsdp: its DDP path, --shard none and optimizer, where a hook can count)
        # fp32 autocast, but a real GradScaler: each micro-batch's loss scaled, the sum unscaled once
        common.update(scaler=torch.amp.GradScaler("cpu", init_scale=2.0 ** 10),
                      autocast=functools.partial(torch.autocast, "cpu", enabled=False))
    train.train_one_epoch(**common)
    return initial, [p.detach().clone() for p in model.parameters()]


def counting_allreduce(calls, bucket):
    calls.append(bucket.index())
    return dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future().then(
        lambda future: future.value()[0])


def accumulation_worker(rank, port, recipe, tmp_path):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    for accum_steps in (1, 4):
        calls = []
        initial, weights = one_epoch(recipe, rank, WORLD_SIZE, accum_steps, tmp_path, calls)
        results[accum_steps] = {"initial": initial, "weights": weights, "allreduces": len(calls)}
    torch.save(results, tmp_path / f"{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("recipe", ["ddp", "apex", "compression", "fsdp"])
def test_accumulated_micro_batches_equal_one_big_batch_with_one_allreduce_per_step(tmp_path, recipe):
    spawn(accumulation_worker, (free_port(), recipe, tmp_path), WORLD_SIZE)
    for rank in range(WORLD_SIZE):
        results = torch.load(tmp_path / f"{rank}.pt")
        for big, accumulated in zip(results[1]["weights"], results[4]["weights"]):
            torch.testing.assert_close(accumulated, big, rtol=0, atol=1e-5)
        assert all((a - i).abs().max() > 1e-4 for a, i in zip(results[4]["weights"], results[4]["initial"]))  # trained
        assert results[1]["allreduces"] == STEPS  # one bucket, once per step ...
        assert results[4]["allreduces"] == STEPS  # ... also with 4 micro-batches per step: no_sync skipped 3


@pytest.mark.parametrize("recipe", ["nd", "dp"])
def test_accumulation_in_one_process_equals_one_big_batch(tmp_path, recipe):
    (initial, big), (_, accumulated) = (one_epoch(recipe, 0, 1, k, tmp_path) for k in (1, 4))
    for b, a in zip(big, accumulated):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert all((a - i).abs().max() > 1e-4 for a, i in zip(accumulated, initial))  # it did train


def schedule_args(*flags):
    parser = cli.build_parser("nd", "")
    return cli.parse_args(parser, ["--synthetic", *flags])


def lrs(args, steps_per_epoch, base_lr=0.4):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base_lr)
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch)
    used = []
    for _ in range(args.epochs * steps_per_epoch):
        used.append(optimizer.param_groups[0]["lr"])  # the learning rate this step uses
        optimizer.step()
        scheduler.step()
    return used


def test_warmup_then_cosine():
    used = lrs(schedule_args(*"--epochs 5 --lr-schedule cosine --warmup-epochs 1".split()), steps_per_epoch=10)
    assert len(used) == 50
    assert used[0] == pytest.approx(0.04)  # warmup: 0.4 x 1/10 ...
    assert used[4] == pytest.approx(0.2)  # ... 5/10 ...
    assert used[9] == pytest.approx(0.4)  # ... 10/10: the full rate at the last warmup step
    assert used[10] == pytest.approx(0.4)  # the cosine starts at its top
    assert used[30] == pytest.approx(0.2)  # half-way through the 40 cosine steps: half the rate
    assert used[49] == pytest.approx(0.2 * (1 + math.cos(math.pi * 39 / 40)))
    assert all(a > b for a, b in zip(used[10:], used[11:]))
    args = schedule_args(*"--epochs 5 --lr-schedule cosine --warmup-epochs 1".split())
    past_the_end = [schedule.lr_factor(step, 10, args) for step in (49, 50, 58, 90)]  # (90: 1.8 x the run's 50 steps)
    assert past_the_end == pytest.approx([used[49] / 0.4] * 4)  # the last step's rate, never back up the cosine


def test_step_schedule_with_warmup_and_the_classic_default():
    used = lrs(schedule_args(*"--epochs 6 --lr-steps 2 4 --warmup-epochs 0.5".split()), steps_per_epoch=4)
    assert used[:4] == pytest.approx([0.2, 0.4, 0.4, 0.4])  # warmup over round(0.5 x 4) = 2 steps
    assert used[7] == pytest.approx(0.4) and used[8] == pytest.approx(0.04)  # x0.1 from epoch 2's first step
    assert used[15] == pytest.approx(0.04) and used[16] == pytest.approx(0.004)
    classic = schedule_args("--epochs", "90")
    assert classic.lr_steps == [30, 60, 80] and classic.lr_schedule == "step"
    assert [schedule.lr_factor(s, 1, classic) for s in (29, 30, 59, 60, 79, 80)] == pytest.approx(
        [1, 0.1, 0.1, 0.01, 0.01, 0.001])


def test_resume_with_another_global_batch_continues_the_schedule_at_the_same_point(tmp_path):
    """Saved 1 epoch + 4 steps of 16 images into a 10-step epoch; resumed with a global batch of 32
    (5 steps an epoch), the run continues 1.4 epochs in, at twice the learning rate (linear scaling)."""
    args = schedule_args(*"--epochs 5 --lr-schedule cosine --warmup-epochs 1".split())
    model = models.lenet(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.4)
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=10)
    for _ in range(14):
        optimizer.step()
        scheduler.step()
    checkpoint.save({"arch": "lenet", "num_classes": 3, "epoch": 1, "step": 4, "global_batch": 16, "best_top1": 0.0,
                     "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict()}, tmp_path, is_best=False)
    saved_lr = optimizer.param_groups[0]["lr"]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.8)
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=5)
    epoch, step, _ = checkpoint.resume(tmp_path / "checkpoint.pt", "cpu", "lenet", 3, model, optimizer, scheduler,
                                       global_batch=32, steps_per_epoch=5)
    assert (epoch, step) == (1, 2)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2 * saved_lr)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.8 * schedule.lr_factor(7, 5, args))


def test_a_checkpoint_from_the_epoch_stepped_scheduler_resumes_on_the_per_step_schedule(tmp_path):
    """Checkpoints of earlier versions hold a StepLR state: the position alone sets the new schedule."""
    model = models.lenet(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.4)
    old_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    optimizer.step()
    old_scheduler.step()
    checkpoint.save({"arch": "lenet", "num_classes": 3, "epoch": 1, "step": 0, "global_batch": 16, "best_top1": 0.0,
                     "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": old_scheduler.state_dict()}, tmp_path, is_best=False)
    args = schedule_args(*"--epochs 4 --lr-schedule cosine".split())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.4)
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=10)
    assert checkpoint.resume(tmp_path / "checkpoint.pt", "cpu", "lenet", 3, model, optimizer, scheduler,
                             global_batch=16, steps_per_epoch=10)[:2] == (1, 0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.4 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_ema_after_n_updates_is_the_closed_form():
    """ema_1 = w_1 (the first update copies), ema_n = d ema_(n-1) + (1 - d) w_n, for weights and buffers."""
    decay = 0.8
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    ema = models.build_ema(model, decay)
    torch.manual_seed(0)
    history = []
    for _ in range(6):
        with torch.no_grad():
            for tensor in [*model.parameters(), model[1].running_mean]:
                tensor.copy_(torch.randn_like(tensor))
        history.append([t.clone() for t in (model[0].weight, model[1].bias, model[1].running_mean)])
        ema.update_parameters(model)
    n = len(history)
    for i, tensor in enumerate((ema.module[0].weight, ema.module[1].bias, ema.module[1].running_mean)):
        expected = decay ** (n - 1) * history[0][i] + sum(
            (1 - decay) * decay ** (n - 1 - k) * history[k][i] for k in range(1, n))
        torch.testing.assert_close(tensor, expected, rtol=1e-6, atol=1e-6)
    assert models.build_ema(model, None) is None


def test_ema_is_evaluated_saved_and_resumed_like_the_model(tiny_data, tmp_path):
    flags = [tiny_data, *TINY, "--ema-decay", "0.9"]
    run_recipe("nd", [*flags, "--epochs", "2", "--out", tmp_path / "whole"])
    summary = read_summary(tmp_path / "whole")
    assert set(summary["ema"]) == {"top1", "top5", "loss"}
    rows = (tmp_path / "whole" / "metrics.csv").read_text().splitlines()
    assert [row.split(",")[1] for row in rows[1:]] == ["train", "val", "val_ema"] * 2
    run_recipe("nd", [*flags, "--epochs", "1", "--out", tmp_path / "split"])
    run_recipe("nd", [*flags, "--epochs", "2", "--auto-resume", "--out", tmp_path / "split"])
    whole, split = (torch.load(tmp_path / run / "checkpoint.pt", weights_only=True) for run in ("whole", "split"))
    assert whole["ema"]["n_averaged"] == 12  # 2 epochs of 6 steps
    for key in whole["ema"]:
        torch.testing.assert_close(split["ema"][key], whole["ema"][key])
    assert any(not torch.equal(whole["ema"][f"module.{k}"], v) for k, v in whole["model"].items())
    evaluated = run_recipe("nd", [*flags, "-e", "--resume", tmp_path / "whole" / "checkpoint.pt",
                                  "--out", tmp_path / "eval"])
    assert read_summary(tmp_path / "eval")["ema"] == pytest.approx(summary["ema"])
    assert "(EMA: top1" in evaluated.stdout


def test_mixup_and_cutmix_blend_images_and_labels_on_the_device():
    args = argparse.Namespace(mixup_alpha=0.4, cutmix_alpha=1.0, decoder="tensor")
    to_device = data.device_transform(args, torch.device("cpu"), num_classes=3)
    torch.manual_seed(0)
    images = torch.randint(0, 256, (8, 3, 8, 8), dtype=torch.uint8)
    mixed, target = to_device(images, torch.arange(8) % 3)
    assert target.shape == (8, 3) and torch.allclose(target.sum(dim=1), torch.ones(8))
    assert (target.max(dim=1).values < 1).any()  # soft: two classes share each label
    plain, labels = data.device_transform(args, torch.device("cpu"), 3, train=False)(images, torch.arange(8) % 3)
    assert mixed.dtype == plain.dtype == torch.float32 and not torch.equal(mixed, plain)  # (validation: no mixing)
    assert torch.equal(labels, torch.arange(8) % 3)
    assert data.mixup_cutmix(argparse.Namespace(mixup_alpha=0, cutmix_alpha=0), 3) is None


def test_mixup_cutmix_and_label_smoothing_train_end_to_end(tiny_data, tmp_path):
    """The same seed and data: label smoothing alone changes the training loss, and mixup with cutmix on top of it
    changes it again."""
    runs = {"plain": [], "smoothed": ["--label-smoothing", "0.1"],
            "mixed": ["-j", "1", "--label-smoothing", "0.1", "--mixup-alpha", "0.2", "--cutmix-alpha", "1"]}
    train_loss = {}
    for name, flags in runs.items():
        run_recipe("ddp", [tiny_data, *TINY, "--epochs", "1", *flags, "--out", tmp_path / name], nproc=2)
        rows = list(csv.DictReader((tmp_path / name / "metrics.csv").open()))
        train_loss[name] = float(rows[0]["loss"])
    assert_complete_run_dir(tmp_path / "mixed", "ddp", 2)
    assert train_loss["smoothed"] != train_loss["plain"] and train_loss["mixed"] != train_loss["smoothed"], train_loss
    assert json.loads((tmp_path / "mixed" / "args.json").read_text())["label_smoothing"] == 0.1


def test_profiler_writes_a_trace_of_the_steps_asked_for(tiny_data, tmp_path):
    out = tmp_path / "profiled"
    result = run_recipe("ddp", [tiny_data, *TINY, "--epochs", "1", "--profile", "2", "--out", out], nproc=2)
    traces = list((out / "profile").glob("*.pt.trace.json"))
    assert len(traces) == 1, "only rank 0 writes files"
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= names and "ProfilerStep#4" not in names
    assert "gloo:all_reduce" in names and "DistributedDataParallel.forward" in names
    assert "profile of 2 steps written to" in result.stdout


def test_compile_without_a_compiler_is_one_clear_line(tiny_data, tmp_path):
    result = run_recipe("nd", [tiny_data, *TINY, "--compile", "--out", tmp_path / "out"], expect_ok=False,
                        env={"PATH": str(tmp_path), "CXX": ""})
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: --compile on CPU needs a C++ compiler for TorchInductor (g++ or clang++, or $CXX); none is on PATH"]


def test_accumulation_keeps_one_allreduce_per_step_in_the_compression_recipe(tiny_data, tmp_path):
    runs = {k: tmp_path / f"accum{k}" for k in (1, 3)}
    for k, out in runs.items():
        run_recipe("compression", [tiny_data, *TINY, "-b", str(24 // (2 * k)), "--accum-steps", k, "--epochs", "1",
                                   "--compress", "fp16", "--out", out], nproc=2)
    sent = {k: read_summary(out)["bytes_per_step"] for k, out in runs.items()}
    assert sent[1] == sent[3] > 0
    assert read_summary(runs[3])["global_batch"] == 24


# ---- each flag against a plain computation ----------------------------------------------------------------------
# The recipe runs its first steps (2 ddp ranks on the tiny folder, as torchrun starts them); the test computes the
# same steps plainly, from the same data and initial weights, and compares what the recipe wrote.

REFERENCE = [*TINY, "--lr", "2", "--epochs", "1"]  # lr 0.125 for a global batch of 16: steps that move the weights


def recipe_args(recipe, tiny_data, *flags):
    return importlib.import_module(f"recipes.{recipe}.train").parse_args([str(tiny_data), *REFERENCE, *flags])


def cross_entropy(output, target):
    """-log p(target), averaged over the batch, from the logits: the loss written out."""
    return -output.log_softmax(1).gather(1, target[:, None]).mean()


def plain_steps(args, world, loss_of=cross_entropy, lr_factor_at=lambda step: 1.0):
    """The recipe's steps, plainly: at each step the global batch (every rank's shard of its loader, rank by rank),
    the loss of the whole batch, and SGD with momentum and weight decay written out at lr x lr_factor_at(step).
    Returns the weights after each step."""
    train_set, _, num_classes = data.build_datasets(args)
    samplers = [DistributedSampler(train_set, num_replicas=world, rank=rank, seed=args.seed) for rank in range(world)]
    loaders = [data.train_loader(train_set, args, sampler) for sampler in samplers]
    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes)  # the recipe's initial weights
    normalise = data.device_transform(args, torch.device("cpu"), num_classes, train=False)
    lr = args.lr * args.batch_size * args.accum_steps * world / 256
    velocity = [torch.zeros_like(p) for p in model.parameters()]
    history, step = [], 0
    for epoch in range(args.epochs):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        for batches in zip(*loaders):
            images, target = normalise(torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches]))
            grads = torch.autograd.grad(loss_of(model(images), target), list(model.parameters()))
            with torch.no_grad():
                for weight, grad, v in zip(model.parameters(), grads, velocity):
                    v.mul_(args.momentum).add_(grad + args.weight_decay * weight)  # (the first step: v = g)
                    weight.sub_(lr * lr_factor_at(step) * v)
            history.append({name: p.detach().clone() for name, p in model.named_parameters()})
            step += 1
    return history


def saved(out, key="model"):
    return torch.load(out / "checkpoint.pt", weights_only=True)[key]


def distance(a, b):
    return max((a[name] - b[name]).abs().max().item() for name in b)


def step_values(out, tag):
    """Each step's value of a TensorBoard scalar rank 0 wrote (-p 1: every step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(out)).Reload()
    return [event.value for event in events.Scalars(tag)]


def test_label_smoothing_trains_on_the_smoothed_loss_written_out(tiny_data, tmp_path):
    """--label-smoothing 0.2: the weights after 3 steps are plain SGD's on (1 - e) (-log p_y) + e mean_k(-log p_k),
    and the first step's logged loss is that of rank 0's batch; plain cross-entropy's weights are far from them."""
    out, flags = tmp_path / "run", ["--label-smoothing", "0.2"]
    run_recipe("ddp", [tiny_data, *REFERENCE, *flags, "--out", out], nproc=2)
    args = recipe_args("ddp", tiny_data, *flags)

    def smoothed(output, target, e=0.2):
        log_p = output.log_softmax(1)
        return ((1 - e) * -log_p.gather(1, target[:, None]).squeeze(1) - e * log_p.mean(1)).mean()
    plain = plain_steps(args, 2, smoothed)
    assert len(plain) == 3 and distance(saved(out), plain[-1]) < 1e-5
    assert distance(saved(out), plain_steps(args, 2)[-1]) > 1e-3
    train_set, _, _ = data.build_datasets(args)
    loader = data.train_loader(train_set, args, DistributedSampler(train_set, 2, 0, seed=args.seed))
    data.set_seed(args.seed)
    model = models.build_model("lenet", 3)
    images, target = data.device_transform(args, torch.device("cpu"), 3, train=False)(*next(iter(loader)))
    assert step_values(out, "train/step_loss")[0] == pytest.approx(smoothed(model(images), target).item(), rel=1e-5)


def test_accumulated_micro_batches_train_as_one_batch_of_every_rank_and_micro_batch(tiny_data, tmp_path):
    """-b 4 --accum-steps 2 on 2 ranks: 3 steps of one global batch of 16 (the mean loss over all of it), at the
    learning rate of 16, as plain SGD on the 16 images computes; summed micro-batch gradients would be far."""
    out, flags = tmp_path / "run", ["-b", "4", "--accum-steps", "2"]
    run_recipe("ddp", [tiny_data, *REFERENCE, *flags, "--out", out], nproc=2)
    args = recipe_args("ddp", tiny_data, *flags)
    plain = plain_steps(args, 2)
    assert len(plain) == 3 and distance(saved(out), plain[-1]) < 1e-5
    summed = plain_steps(args, 2, lambda output, target: 2 * cross_entropy(output, target))
    assert distance(saved(out), summed[-1]) > 1e-3


SCHEDULES = {  # the flags, and the rate's multiple at each of the 9 steps of 3 epochs of 3 steps, written out
    "cosine after warmup": (["--lr-schedule", "cosine", "--warmup-epochs", "1"],
                            [1 / 3, 2 / 3, 1] + [0.5 * (1 + math.cos(math.pi * k / 6)) for k in range(6)]),
    "steps after warmup": (["--lr-steps", "1", "2", "--warmup-epochs", "0.67"],  # round(0.67 x 3) = 2 steps
                           [1 / 2, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01]),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_learning_rate_at_every_step_is_the_schedule_written_out(tiny_data, tmp_path, name):
    """--lr-schedule, --warmup-epochs, --lr-steps over 3 epochs of 3 steps: the rate each step used (TensorBoard's
    train/step_lr) is lr x the schedule's multiple written out above, and the weights are plain SGD's at those
    rates; at the full rate throughout they would be far."""
    flags, factors = SCHEDULES[name]
    out, flags = tmp_path / "run", [*flags, "--epochs", "3"]
    run_recipe("ddp", [tiny_data, *REFERENCE, *flags, "--out", out], nproc=2)
    args = recipe_args("ddp", tiny_data, *flags)
    lr = args.lr * 16 / 256
    assert step_values(out, "train/step_lr") == pytest.approx([lr * f for f in factors], rel=1e-6)
    plain = plain_steps(args, 2, lr_factor_at=factors.__getitem__)
    assert len(plain) == 9 and distance(saved(out), plain[-1]) < 1e-5
    assert distance(saved(out), plain_steps(args, 2)[-1]) > 1e-3


def test_the_ema_after_the_first_and_the_kth_update_is_the_average_written_out(tiny_data, tmp_path):
    """--ema-decay 0.75: after one update the EMA is the weights (the first update copies); after 6 (2 epochs of
    3) it is 0.75^5 w_1 + sum_k 0.25 x 0.75^(6-k) w_k over plain SGD's weights w_k; n_averaged counts the
    updates."""
    decay = 0.75  # (not 0.5: decay and 1 - decay swapped must show)
    for name, flags, updates in (("first", ["-b", "24"], 1), ("kth", ["--epochs", "2"], 6)):
        out, flags = tmp_path / name, ["--ema-decay", str(decay), *flags]
        run_recipe("ddp", [tiny_data, *REFERENCE, *flags, "--out", out], nproc=2)
        weights = plain_steps(recipe_args("ddp", tiny_data, *flags), 2)
        assert len(weights) == updates
        expected = {name: decay ** (updates - 1) * weights[0][name] + sum(
            (1 - decay) * decay ** (updates - 1 - k) * weights[k][name] for k in range(1, updates))
            for name in weights[0]}
        ema = saved(out, "ema")
        assert ema["n_averaged"] == updates
        assert distance({name: ema[f"module.{name}"] for name in expected}, expected) < 1e-5
        assert distance(saved(out), weights[-1]) < 1e-5
    assert distance(saved(tmp_path / "kth"), {n: ema[f"module.{n}"] for n in expected}) > 1e-3


def mixed_draws(flags, count, seed=0):
    """count batches of 8 through the recipe's training transform (what run.to_device does to each batch) beside
    the same batches unmixed; labels 0 1 2 0 1 2 0 1: each image's partner (the previous one) has another class."""
    args = recipe_args("ddp", "unused", *flags)
    mix, plain = (data.device_transform(args, torch.device("cpu"), 3, train=train) for train in (True, False))
    torch.manual_seed(seed)
    labels = torch.arange(8) % 3
    for _ in range(count):
        images = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8)
        yield plain(images, labels)[0], labels, *mix(images, labels)


def mixed_as_written(x, labels, mixed, target):
    """(kind, lambda) when mixed and target are a mixup or a cutmix of x with its partners written out, else None:
    mixup: lambda x + (1 - lambda) partner everywhere; cutmix: the partner inside one rectangle, x outside, lambda
    one minus the rectangle's share; the target lambda one_hot(y) + (1 - lambda) one_hot(partner's y) either way."""
    partner, one_hot = x.roll(1, 0), torch.nn.functional.one_hot(labels, 3).float()
    lam = target[0, labels[0]].item()
    if not torch.allclose(target, lam * one_hot + (1 - lam) * one_hot.roll(1, 0), atol=1e-6):
        return None
    inside = (mixed == partner).all(0).all(0)  # (a mixup, lambda < 1, has no pixel of the partner's)
    rows, cols = inside.any(1).nonzero().flatten(), inside.any(0).nonzero().flatten()
    if len(rows):
        box = torch.zeros_like(inside)
        box[rows.min():rows.max() + 1, cols.min():cols.max() + 1] = True
        if torch.equal(inside, box) and torch.equal(torch.where(box, partner, x), mixed):
            return ("cutmix", lam) if lam == pytest.approx(1 - box.sum().item() / box.numel(), abs=1e-6) else None
        return None
    if lam == 1 and torch.equal(mixed, x):
        return "cutmix", lam  # (a rectangle clipped away entirely)
    if torch.allclose(mixed, lam * x + (1 - lam) * partner, atol=1e-5):
        return "mixup", lam
    return None


def test_mixup_and_cutmix_mix_each_batch_and_its_targets_as_written_out():
    """--mixup-alpha 0.4: each batch is lambda x + (1 - lambda) its partners and so is the target, lambda drawn from
    Beta(0.4, 0.4) (over 400 batches: its mean 1/2 and variance 1 / (4 (2 alpha + 1)) within 5 and 20 %);
    --cutmix-alpha 1: the partners' pixels in one rectangle, lambda the share left; both: one or the other, about
    half the batches each."""
    draws = [mixed_as_written(*draw) for draw in mixed_draws(["--mixup-alpha", "0.4"], 400)]
    assert all(draw is not None and draw[0] == "mixup" for draw in draws)
    lams = torch.tensor([lam for _, lam in draws])
    assert lams.mean().item() == pytest.approx(0.5, abs=0.05)
    assert lams.var().item() == pytest.approx(1 / (4 * (2 * 0.4 + 1)), rel=0.2)
    draws = [mixed_as_written(*draw) for draw in mixed_draws(["--cutmix-alpha", "1"], 100)]
    assert all(draw is not None and draw[0] == "cutmix" for draw in draws)
    assert sum(lam < 1 for _, lam in draws) > 50  # (lambda 1: a rectangle clipped away entirely)
    kinds = [mixed_as_written(*draw) for draw in mixed_draws(["--mixup-alpha", "0.4", "--cutmix-alpha", "1"], 200)]
    assert 60 < sum(kind == "mixup" for kind, _ in kinds) < 140 and None not in kinds


def test_channels_last_trains_nhwc_weights_to_the_plain_steps(tiny_data, tmp_path):
    """apex --opt-level O0 --channels-last (fp32): the weights the recipe saved are NHWC and equal plain SGD's (in
    NCHW) after 3 steps; the batches reach the model NHWC."""
    out, flags = tmp_path / "run", ["--opt-level", "O0", "--channels-last"]
    run_recipe("apex", [tiny_data, *REFERENCE, *flags, "--out", out], nproc=2)
    args = recipe_args("apex", tiny_data, *flags)
    weights = saved(out)
    assert weights["0.weight"].is_contiguous(memory_format=torch.channels_last)  # lenet's first convolution
    assert not weights["0.weight"].is_contiguous()
    assert distance(weights, plain_steps(args, 2)[-1]) < 1e-5
    images, _ = data.device_transform(args, torch.device("cpu"), 3)(torch.zeros(2, 3, 16, 16, dtype=torch.uint8),
                                                                    torch.zeros(2, dtype=torch.long))
    assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()


def test_compile_trains_the_plain_steps_with_inductors_kernels(tiny_data, tmp_path):
    """nd --compile: the weights after 3 steps of 16 equal plain SGD's to 1e-5, and TorchInductor wrote the
    kernels it ran (its cache, here a folder of the test's) for the forward and the backward."""
    out, flags = tmp_path / "run", ["-b", "16", "--compile"]
    run_recipe("nd", [tiny_data, *REFERENCE, *flags, "--out", out], env={"TORCHINDUCTOR_CACHE_DIR": tmp_path / "ind"})
    assert distance(saved(out), plain_steps(recipe_args("nd", tiny_data, *flags), 1)[-1]) < 1e-5
    kernels = list((tmp_path / "ind").rglob("*.py"))
    assert len(kernels) >= 2, kernels


def test_sync_bn_on_a_cpu_keeps_each_ranks_statistics_as_written_out(tiny_data, tmp_path):
    """--sync-bn where SyncBatchNorm cannot run (a CPU): one warning line, and after one step resnet18's first
    BatchNorm holds 0.1 x the mean of rank 0's own batch through conv1 (momentum 0.1 from 0), not the global
    batch's; on CUDA the same flag converts the model (make gpu-smoke)."""
    out, flags = tmp_path / "run", ["-a", "resnet18", "-b", "24", "--sync-bn"]
    result = run_recipe("ddp", [tiny_data, *REFERENCE, *flags, "--out", out], nproc=2)
    assert "warning: --sync-bn ignored: SyncBatchNorm runs only on CUDA" in result.stdout
    args = recipe_args("ddp", tiny_data, *flags)
    train_set, _, _ = data.build_datasets(args)
    batches = [next(iter(data.train_loader(train_set, args, DistributedSampler(train_set, 2, rank, seed=args.seed))))
               for rank in range(2)]
    data.set_seed(args.seed)
    conv1 = models.build_model("resnet18", 3).conv1
    normalise = data.device_transform(args, torch.device("cpu"), 3, train=False)
    with torch.no_grad():
        means = [conv1(normalise(*batch)[0]).mean((0, 2, 3)) for batch in batches]
    running_mean = saved(out)["bn1.running_mean"]
    torch.testing.assert_close(running_mean, 0.1 * means[0], rtol=1e-4, atol=1e-6)
    assert (running_mean - 0.1 * (means[0] + means[1]) / 2).abs().max() > 1e-4
