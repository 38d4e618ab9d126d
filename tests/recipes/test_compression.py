"""The gradient-compression hooks on chosen gradients (2 gloo processes), and the recipe end to end."""

import csv
import datetime
import json
import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from conftest import TINY, assert_complete_run_dir, free_port, read_summary, run_recipe, spawn

from recipes.common import compat
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from recipes.compression import hooks

WORLD_SIZE = 2
SHAPES = [(64, 48), (300,), (32, 3, 3, 3)]  # a matrix, a vector (PowerSGD sends it whole), a conv kernel
# |hooked average - exact average| <= BOUND x max |gradient|: one rounding of the format's relative step
# (the cast), plus one for the 16-bit sum
BOUND = {"none": 1e-6, "fp16": 2 * 2 ** -11, "bf16": 2 * 2 ** -8, "fp8-e4m3": 2 ** -4, "fp8-e5m2": 2 ** -3}
# each format named here, independently of hooks.py: a method mapped onto another format delivers other bits
SIXTEEN_BITS = {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
FP8_FORMATS = {"fp8-e4m3": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}


class GivenGradients(torch.nn.Module):
    """loss = sum(p * g): backward makes each parameter's gradient exactly the given g."""

    def __init__(self, shapes):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(shape)) for shape in shapes)

    def forward(self, grads):
        return sum((p * g).sum() for p, g in zip(self.weights, grads))


def hook_worker(rank, port, method, grads_per_step, options, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=60))  # a collective mismatch fails, not hangs
    torch.manual_seed(0)
    payloads = record_payloads()
    shapes = [g.shape for g in grads_per_step[0][0]]
    model = DDP(GivenGradients(shapes), bucket_cap_mb=options.get("bucket_cap_mb", 25))
    state, hook, traffic = hooks.build(method, options.get("rank", 2), options.get("error_feedback", False))
    model.register_comm_hook(state, hook)
    averaged, handed = [], []
    for grads in grads_per_step:
        model.zero_grad()
        payloads.clear()
        model(grads[rank]).backward()  # DDP waits for every bucket's future before backward returns
        averaged.append([p.grad.clone() for p in model.module.weights])
        handed.append(sum(payloads))
    torch.save({"averaged": averaged, "traffic": traffic.snapshot(), "handed": handed}, results / f"{rank}.pt")
    # PowerSGD's last callbacks may still be returning on gloo's threads, holding the process group; if they
    # let go of it last, gloo would join its own thread (an abort). The recipes evaluate first; here, wait.
    dist.barrier()
    del model, traffic
    dist.destroy_process_group()


def record_payloads():
    """Note the size of every tensor the hooks hand to dist.all_reduce and all_gather_single (compat's name)."""
    payloads, all_reduce, all_gather_single = [], dist.all_reduce, compat.all_gather_single

    def recorded_all_reduce(tensor, *args, **kwargs):
        payloads.append(tensor.nbytes)
        return all_reduce(tensor, *args, **kwargs)

    def recorded_all_gather_single(output, payload, *args, **kwargs):
        payloads.append(payload.nbytes)
        return all_gather_single(output, payload, *args, **kwargs)

    dist.all_reduce, compat.all_gather_single = recorded_all_reduce, recorded_all_gather_single
    return payloads


def run_hook(tmp_path, method, grads_per_step, **options):
    spawn(hook_worker, (free_port(), method, grads_per_step, options, tmp_path), WORLD_SIZE)
    return [torch.load(tmp_path / f"{rank}.pt") for rank in range(WORLD_SIZE)]


def random_gradients(seed, steps=1):
    generator = torch.Generator().manual_seed(seed)
    return [[[torch.randn(shape, generator=generator) for shape in SHAPES] for _ in range(WORLD_SIZE)]
            for _ in range(steps)]


def exact_average(grads):
    return [sum(rank_grads[i] for rank_grads in grads) / WORLD_SIZE for i in range(len(SHAPES))]


def hooked_average(method, grads):
    """What `method`'s hook delivers, bit for bit, for one step's gradients (one bucket: SHAPES fit in DDP's first).

    none, fp16, bf16 (PyTorch's hooks): each rank casts to the type and divides by the world size, the allreduce
    sums in that type, the sum is cast back. fp8: each rank scales its bucket so that its largest magnitude is the
    format's largest value and rounds to 8 bits; the ranks' decompressed buckets are averaged in fp32."""
    if method in FP8_FORMATS:
        dtype, decompressed = FP8_FORMATS[method], []
        for rank_grads in grads:
            largest = max(g.abs().max() for g in rank_grads).float().clamp(min=1e-30)
            scale = largest / torch.finfo(dtype).max
            decompressed.append([(g / scale).to(dtype).float() * scale for g in rank_grads])
        return [sum(rank[i] for rank in decompressed) / WORLD_SIZE for i in range(len(SHAPES))]
    dtype = SIXTEEN_BITS[method]
    return [sum(rank_grads[i].to(dtype) / WORLD_SIZE for rank_grads in grads).float() for i in range(len(SHAPES))]


@pytest.mark.parametrize("method", hooks.METHODS)
def test_each_hook_averages_within_its_bound_and_counts_the_bytes_it_hands_to_the_collectives(tmp_path, method):
    steps = 4  # PowerSGD allreduces in full for 2 steps, then sends P and Q
    grads = random_gradients(seed=1, steps=steps)
    results = run_hook(tmp_path, method, grads)
    for step in range(steps):
        for got, want in zip(results[1]["averaged"][step], results[0]["averaged"][step]):
            assert torch.equal(got, want)  # every rank ends with the same gradients
    if method in BOUND:  # (PowerSGD's bound is its own test)
        exact, largest = exact_average(grads[0]), max(g.abs().max() for rank in grads[0] for g in rank)
        error = max((got - want).abs().max() for got, want in zip(results[0]["averaged"][0], exact))
        assert error <= BOUND[method] * largest, f"error {error:.3g} over {BOUND[method]} x {largest:.3g}"
        if method != "none":
            assert error > 1e-6 * largest, "as exact as fp32: was the hook applied?"
        # the format exactly: a finer one (bf16 sent as fp16, e5m2 as e4m3) would pass the bound, not this
        for step in range(steps):
            for got, want in zip(results[0]["averaged"][step], hooked_average(method, grads[step])):
                assert torch.equal(got, want), (step, (got - want).abs().max())

    sent, fp32 = results[0]["traffic"]  # (bytes per optimizer step: tests/common/test_training.py's accumulation test)
    assert sent == sum(results[0]["handed"])  # the bytes of the tensors the collectives were handed
    assert fp32 == steps * sum(math.prod(shape) for shape in SHAPES) * 4
    if method in ("none", "fp16", "bf16"):
        assert fp32 / sent == {"none": 1, "fp16": 2, "bf16": 2}[method]
    elif method.startswith("fp8"):
        assert 3.99 < fp32 / sent < 4  # 1 byte per gradient and a 4-byte scale per bucket
    else:
        assert fp32 / sent > 1.5


def low_rank_gradients(seed, rank, steps=3):
    """Matrices whose average over the ranks has rank <= `rank`: PowerSGD at that rank should be exact."""
    generator = torch.Generator().manual_seed(seed)
    shared = {shape: torch.randn(shape[0], rank, generator=generator) for shape in SHAPES if len(shape) > 1}
    grads = []
    for _ in range(WORLD_SIZE):
        rank_grads = []
        for shape in SHAPES:
            if len(shape) == 1:
                rank_grads.append(torch.randn(shape, generator=generator))
            else:
                columns = math.prod(shape[1:])
                rank_grads.append((shared[shape] @ torch.randn(rank, columns, generator=generator)).view(shape))
        grads.append(rank_grads)
    return [grads] * steps


def test_powersgd_is_exact_on_gradients_of_its_rank_and_bounded_on_others(tmp_path):
    grads = low_rank_gradients(seed=3, rank=2)
    results = run_hook(tmp_path, "powersgd", grads, rank=2)
    for got, want in zip(results[0]["averaged"][2], exact_average(grads[2])):  # step 3: compressed
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * want.abs().max())
    for got, want in zip(results[1]["averaged"][2], results[0]["averaged"][2]):
        assert torch.equal(got, want)

    grads = random_gradients(seed=4, steps=3)  # full rank: no rank-2 approximation is exact
    results = run_hook(tmp_path, "powersgd", grads, rank=2)
    got, want = results[0]["averaged"][2][0], exact_average(grads[2])[0]
    singular_values = torch.linalg.svdvals(want)
    best = singular_values[2:].square().sum().sqrt()  # the best rank-2 approximation's error (Eckart-Young)
    error = torch.linalg.norm(got - want)
    assert best - 1e-4 <= error <= torch.linalg.norm(want), (best, error)
    assert torch.allclose(results[0]["averaged"][1][0], exact_average(grads[1])[0], atol=1e-6)  # step 2: full


def test_powersgd_keeps_the_ranks_in_step_with_many_buckets(tmp_path):
    """Each bucket's PowerSGD allreduces three times, the later ones chained on the earlier; with several
    buckets in flight, gloo must still see them in the same order on every rank."""
    generator = torch.Generator().manual_seed(5)
    shapes = [(256, 256)] * 12  # 3 MB of gradients: DDP makes several buckets at a 1 MB cap
    grads = [[[torch.randn(shape, generator=generator) for shape in shapes] for _ in range(WORLD_SIZE)]] * 6
    results = run_hook(tmp_path, "powersgd", grads, bucket_cap_mb=0.5)
    for step in range(6):
        for got, want in zip(results[1]["averaged"][step], results[0]["averaged"][step]):
            assert torch.equal(got, want)


def test_error_feedback_delivers_gradients_too_small_for_fp8(tmp_path):
    steps, tiny = 40, 1e-6
    grad = [torch.full(shape, tiny) for shape in SHAPES]
    grad[0][0, 0] = 1.0  # sets the bucket's scale: 1e-6 is below e4m3's smallest step (2^-9 / 448)
    grads = [[grad] * WORLD_SIZE] * steps
    quantum = 2 ** -9 / 448  # e4m3's smallest subnormal, times the scale

    without = run_hook(tmp_path, "fp8-e4m3", grads)[0]["averaged"]
    assert all(step[1].abs().max() == 0 for step in without)  # rounded to zero, every step: lost for good

    with_feedback = run_hook(tmp_path, "fp8-e4m3", grads, error_feedback=True)[0]["averaged"]
    delivered = sum(step[1] for step in with_feedback)  # what the optimizer saw over all steps
    assert delivered.min() > 0
    assert (delivered - steps * tiny).abs().max() <= quantum * 1.01  # late, but all of it
    assert all(abs(step[0][0, 0] - 1.0) < 1e-6 for step in with_feedback)  # the large gradient goes as before


@pytest.mark.parametrize("method", hooks.METHODS)
def test_a_two_process_run_writes_a_complete_run_directory(tiny_data, tmp_path, method):
    out = tmp_path / "run"
    run_recipe("compression", [tiny_data, *TINY, "--epochs", "2", "--lr", "1", "--compress", method, "--out", out],
               nproc=2)
    summary = assert_complete_run_dir(out, "compression", 2, epochs=2)
    # it learns, compressed (measured: train loss 1.03 then 0.56-0.64, top-1 100 % on the 3 classes)
    with open(out / "metrics.csv", newline="") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f) if row["split"] == "train"]
    assert losses[1] < 0.8 * losses[0] and summary["top1"] > 70, (losses, summary["top1"])
    assert json.loads((out / "args.json").read_text())["compress"] == method
    low, high = {"none": (1, 1), "fp16": (2, 2), "bf16": (2, 2), "fp8-e4m3": (3.9, 4), "fp8-e5m2": (3.9, 4),
                 "powersgd": (1.5, 100)}[method]
    assert low <= summary["compression_ratio"] <= high
    assert summary["bytes_per_step"] > 0
    events = EventAccumulator(str(out))
    events.Reload()
    ratios = [event.value for event in events.Scalars("comm/compression_ratio")]
    assert len(ratios) == 2 and ratios[-1] == pytest.approx(summary["compression_ratio"])
    assert len(events.Scalars("comm/bytes_per_step")) == 2


@pytest.mark.parametrize("method", ["fp8-e4m3", "fp8-e5m2"])
def test_fp8_runs_on_one_process_whatever_the_bucket_size(tiny_data, tmp_path, method):
    """One rank's gathered row is contiguous already; lenet's bucket (an odd number of bytes) put its scale at an
    offset that float32 cannot view ("storage_offset() must be divisible by 4")."""
    run_recipe("compression", [tiny_data, *TINY, "--epochs", "1", "--compress", method, "--out", tmp_path])
    assert read_summary(tmp_path)["compression_ratio"] > 3.9


def test_error_feedback_runs_end_to_end(tiny_data, tmp_path):
    weights = {}
    for feedback in ([], ["--error-feedback"]):
        out = tmp_path / ("feedback" if feedback else "plain")
        run_recipe("compression", [tiny_data, *TINY, "--epochs", "1", "--compress", "fp8-e5m2", *feedback,
                                   "--out", out], nproc=2)
        assert read_summary(out)["compression_ratio"] > 3.9
        weights[bool(feedback)] = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    # the runs are deterministic (one seed): the same weights, bit for bit, would mean no feedback reached a step
    assert any(not torch.equal(weights[False][key], weights[True][key]) for key in weights[False]), \
        "--error-feedback trained exactly as without it: was the error fed back?"


@pytest.mark.parametrize("flags, phrase", [
    (["--compress", "fp4"], "invalid choice: 'fp4'"),
    (["--compress", "powersgd", "--powersgd-rank", "0"], "--powersgd-rank must be at least 1"),
    (["--error-feedback"], "--error-feedback needs --compress"),
])
def test_bad_compression_flags_are_one_clear_line(tiny_data, tmp_path, flags, phrase):
    result = run_recipe("compression", [tiny_data, *TINY, *flags, "--out", tmp_path / "run"], expect_ok=False)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and phrase in lines[0], result.stderr
