"""Mixed precision: loss curves close to fp32, and the apex.amp backend's wiring."""

import csv
import math
import textwrap
import types

import pytest
import torch
from conftest import TINY, read_summary, run_recipe
from recipes.common import RecipeError, amp, models

# Tolerance: per-epoch mean training loss within 0.05 absolute + 5 % of fp32's.
# lenet's logits under bf16 (8 mantissa bits) differ from fp32 by ~0.4 % relative;
# over 4 epochs on 48 images the measured gap stays well inside this bound.
ABS_TOL, REL_TOL = 0.05, 0.05


def train_losses(out):
    with open(out / "metrics.csv", newline="") as f:
        return [float(r["loss"]) for r in csv.DictReader(f) if r["split"] == "train"]


def test_low_precision_loss_curves_follow_fp32(tiny_data, tmp_path):
    flags = [tiny_data, *TINY, "--epochs", "4", "--lr", "1"]
    curves = {}
    for name, amp_flags in (("fp32", ["--opt-level", "O0"]), ("bf16", ["--opt-level", "O1", "--amp-dtype", "bf16"]),
                            ("fp16", ["--opt-level", "O1", "--amp-dtype", "fp16"])):
        run_recipe("apex", [*flags, *amp_flags, "--out", tmp_path / name])
        curves[name] = train_losses(tmp_path / name)
    assert curves["fp32"][-1] < curves["fp32"][0]  # it learns
    weights = {name: torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)["model"] for name in curves}
    for name in ("bf16", "fp16"):
        for fp32, low in zip(curves["fp32"], curves[name]):
            assert abs(low - fp32) <= ABS_TOL + REL_TOL * fp32, (name, curves)
        # the runs are deterministic (one seed, one process): weights equal to fp32's, bit for bit, mean that
        # the low-precision run never computed in low precision (autocast off, say)
        assert any(not torch.equal(weights["fp32"][key], weights[name][key]) for key in weights["fp32"]), \
            f"{name} trained exactly as fp32 did: did autocast run?"
    scaler = torch.load(tmp_path / "fp16" / "checkpoint.pt", weights_only=True)["scaler"]
    assert scaler and scaler["scale"] > 0  # fp16 trains with a GradScaler, saved for resume
    with open(tmp_path / "fp16" / "metrics.csv", newline="") as f:
        skipped = [int(r["skipped_steps"]) for r in csv.DictReader(f) if r["split"] == "train"]
    # (its scale halves at each skipped step, and 24 steps are too few to double it)
    assert sum(skipped) == read_summary(tmp_path / "fp16")["skipped_steps"] == math.log2(65536 / scaler["scale"])
    assert read_summary(tmp_path / "bf16")["skipped_steps"] == 0
    assert not torch.load(tmp_path / "bf16" / "checkpoint.pt", weights_only=True)["scaler"]  # bf16 needs none


def test_nd_says_it_evaluates_in_fp32_a_run_that_evaluated_in_bf16(tiny_data, tmp_path):
    """nd has no --opt-level: its -e of an O1 bf16 run evaluates in fp32, and its result line says so; apex's
    repeats the run's precision, and says nothing of fp32."""
    train = tmp_path / "bf16"
    run_recipe("apex", [tiny_data, *TINY, "--epochs", "1", "--opt-level", "O1", "--amp-dtype", "bf16", "--out", train])
    lines = {}
    for recipe in ("nd", "apex"):
        result = run_recipe(recipe, [tiny_data, *TINY, "-e", "--resume", train / "checkpoint.pt",
                                     "--out", tmp_path / recipe])
        lines[recipe] = next(line for line in result.stdout.splitlines() if line.startswith("done: top1"))
    assert "evaluation only in fp32, where the run evaluated at O1 bf16 (nd has no --opt-level" in lines["nd"], lines
    assert "evaluation only  |" in lines["apex"] and "fp32" not in lines["apex"], lines
    assert read_summary(tmp_path / "apex")["precision"] == "bf16"  # (repeated: the checkpoint's precision)


class Printed:
    """A stand-in for RunLog: what resolve() printed."""

    def __init__(self):
        self.lines = []

    def print(self, line):
        self.lines.append(line)


@pytest.mark.parametrize("native", [False, True])
def test_cpu_default_is_fp32_without_native_bf16(monkeypatch, native):
    """Both branches, whatever this machine's CPU: the default and the warning follow cpu_has_native_bf16()."""
    from recipes.common import amp
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: native)
    cpu = torch.device("cpu")

    def resolve(opt_level=None, amp_dtype=None, device=cpu):
        log = Printed()
        return (*amp.resolve(types.SimpleNamespace(opt_level=opt_level, amp_dtype=amp_dtype), device, log),
                "\n".join(log.lines))

    opt_level, dtype, printed = resolve()
    if native:
        assert (opt_level, dtype, printed) == ("O1", torch.bfloat16, "")  # low precision where it is fast
    else:
        assert (opt_level, dtype) == ("O0", torch.bfloat16) and "defaulting to --opt-level O0 (fp32)" in printed
    opt_level, dtype, printed = resolve("O3")
    assert (opt_level, dtype) == ("O3", torch.bfloat16)  # asked for: kept, with a warning where it is slow
    assert ("warning: --opt-level O3 (bf16) on a CPU without native bf16" in printed) == (not native), printed
    assert resolve("O0")[::2] == ("O0", "")  # fp32 asked for: no warning
    assert resolve("O1", "fp16")[:2] == ("O1", torch.float16)
    # a GPU (here a stand-in: no CUDA needed): fp16 and autocast by default, whatever the CPU; bf16 where it has it
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve(device=gpu) == ("O1", torch.float16, "")
    assert resolve("O2", "bf16", device=gpu) == ("O2", torch.bfloat16, "")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args, **kwargs: "an old GPU")
    with pytest.raises(RecipeError, match="bf16 is not supported by an old GPU; use fp16"):
        resolve("O1", "bf16", device=gpu)


@pytest.mark.parametrize("flags, has_it", [("flags : fpu sse avx2 avx512f", False), ("flags : avx2 avx512_bf16", True),
                                           ("flags : avx2 amx_bf16 amx_tile", True), (None, False)])
def test_cpu_has_native_bf16_reads_the_cpu_flags(monkeypatch, flags, has_it):
    from recipes.common import amp

    class CpuInfo:
        def __init__(self, path):
            assert str(path) == "/proc/cpuinfo"

        def read_text(self):
            if flags is None:
                raise OSError("no /proc here")  # not Linux
            return f"processor : 0\n{flags}\n"

    monkeypatch.setattr(amp, "Path", CpuInfo)
    assert amp.cpu_has_native_bf16() is has_it


def test_the_default_precision_of_a_run_is_what_resolve_picks_for_this_cpu(tiny_data, tmp_path):
    """The recipe's default, on this machine's CPU (the suite's runs see no GPU): fp32 or bf16, as resolve() says."""
    from recipes.common.amp import cpu_has_native_bf16
    result = run_recipe("apex", [tiny_data, *TINY, "--epochs", "1", "--out", tmp_path / "default"])
    if cpu_has_native_bf16():
        assert "opt level O1 (bf16" in result.stdout and "defaulting" not in result.stdout, result.stdout
    else:
        assert "defaulting to --opt-level O0 (fp32)" in result.stdout and "opt level O0 (fp32" in result.stdout


def test_apex_backend_drives_apex_amp(tiny_data, tmp_path):
    """With an apex.amp present (here a recording stand-in), the recipe uses its API."""
    package = tmp_path / "site" / "apex"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "amp.py").write_text(textwrap.dedent("""
        import contextlib, os

        def _record(event):
            with open(os.environ["APEX_CALLS"], "a") as f:
                f.write(event + "\\n")

        def initialize(model, optimizer, opt_level):
            _record("initialize " + opt_level)
            return model, optimizer

        @contextlib.contextmanager
        def scale_loss(loss, optimizer):
            _record("scale_loss")
            yield loss * 1.0

        def state_dict():
            return {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 3}}

        def load_state_dict(state):
            _record("load_state_dict %g" % state["loss_scaler0"]["loss_scale"])
        """))
    calls, out = tmp_path / "calls.txt", tmp_path / "run"
    env = {"PYTHONPATH": str(package.parent), "APEX_CALLS": str(calls)}
    flags = [tiny_data, *TINY, "--amp-backend", "apex", "--opt-level", "O2", "--out", out]
    run_recipe("apex", [*flags, "--epochs", "1"], env=env)
    events = calls.read_text().splitlines()
    assert events[0] == "initialize O2" and events.count("scale_loss") == 48 // 8
    assert torch.load(out / "checkpoint.pt", weights_only=True)["scaler"]["loss_scaler0"]["loss_scale"] == 1024.0
    run_recipe("apex", [*flags, "--epochs", "2", "--resume", out / "checkpoint.pt"], env=env)
    assert "load_state_dict 1024" in calls.read_text()
    assert read_summary(out)["epochs"] == 2


def test_fused_sgd_under_the_loss_scaler_steps_as_stock_sgd_after_a_skipped_first_step():
    """An fp16 overflow at the first step (routine at the start) is skipped, and the next step moves the weights
    as stock SGD's does: fused SGD would otherwise take its uninitialised momentum (empty_like) as real."""
    from recipes.common import amp
    args = types.SimpleNamespace(opt_level="O1", amp_dtype="fp16", amp_backend="native", channels_last=False)
    weights = {}
    for fused in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=fused)
        model, optimizer, scaler, _ = amp.initialize(model, optimizer, args, torch.device("cpu"), Printed())
        assert scaler.is_enabled()
        for overflow in (True, False):
            scaler.scale(model(torch.ones(2, 64)).sum()).backward()
            if overflow:
                model.weight.grad[0, 0] = float("inf")
                freed = [torch.full((64, 64), float("nan")) for _ in range(8)]  # memory empty_like may reuse
                del freed
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        weights[fused] = [p.detach().clone() for p in model.parameters()]
    assert all(torch.isfinite(w).all() for w in weights[True])
    assert all(torch.allclose(a, b) for a, b in zip(weights[False], weights[True]))


def test_channels_last_says_in_one_line_where_it_changes_one_convolution_alone():
    """A vision transformer's one convolution is its patch projection: --channels-last says so, once; a model
    of convolutions (lenet, resnet18) hears nothing, and the transformer still computes what it did."""
    lines = []
    log = types.SimpleNamespace(print=lines.append)
    for arch in ("lenet", "resnet18"):
        amp.say_channels_last(models.build_model(arch, 3, 28), log)
    assert lines == []
    vit = models.build_model("vit_tiny", 3, 28).eval()
    images = torch.randn(2, 3, 28, 28)
    before = vit(images)
    amp.say_channels_last(vit.to(memory_format=torch.channels_last), log)
    assert lines == ["note: --channels-last: this model has 1 convolution (a ViT's: its patch projection); the rest "
                     "of it runs as without the flag"]
    assert torch.allclose(vit(images.contiguous(memory_format=torch.channels_last)), before, atol=1e-5)


def o2(dtype_name):
    return types.SimpleNamespace(opt_level="O2", amp_dtype=dtype_name, amp_backend="native", channels_last=False)


def test_o2_runs_half_precision_weights_but_batchnorm_and_steps_fp32_master_copies_as_apex_did():
    """--opt-level O2 as apex.amp defined it: the weights in bf16 but BatchNorm's (weights and statistics fp32),
    the input cast in and the logits out in fp32, and the optimizer stepping fp32 copies. An update below a bf16
    step of a weight is kept in its master (O3's bf16 weights would drop it); the checkpoint's state dict holds the
    masters, which an fp32 model takes as they are and an O2 model takes back exactly."""
    torch.manual_seed(0)
    model = models.build_model("resnet18", 3, 32)
    start = {name: value.clone() for name, value in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    model, optimizer, scaler, autocast = amp.initialize(model, optimizer, o2("bf16"), torch.device("cpu"), Printed())
    batchnorm = {name for name, module in model.named_modules() if isinstance(module, torch.nn.BatchNorm2d)}
    for name, value in [*model.named_parameters(), *model.named_buffers()]:
        if value.is_floating_point():  # (not BatchNorm's count of batches)
            assert value.dtype == (torch.float32 if name.rsplit(".", 1)[0] in batchnorm else torch.bfloat16), name
    masters = [master for group in optimizer.param_groups for master in group["params"]]
    assert len(masters) == len(list(model.parameters())) and all(m.dtype == torch.float32 for m in masters)
    assert not {id(m) for m in masters} & {id(p) for p in model.parameters()}
    images, target = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            output = model(images)
            loss = torch.nn.functional.cross_entropy(output, target)
        assert output.dtype == torch.float32
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    state = model.state_dict()
    for name, param in model.named_parameters():
        assert state[name].dtype == torch.float32 and torch.equal(param, state[name].to(param.dtype)), name
    below_a_step = sum(int(((state[name] != start[name]) & (state[name].to(torch.bfloat16) ==
                                                           start[name].to(torch.bfloat16))).sum())
                       for name, param in model.named_parameters() if param.dtype == torch.bfloat16)
    assert below_a_step > 1000  # weights moved in fp32, not yet by a bf16 step: kept only in the fp32 masters
    fresh = models.build_model("resnet18", 3, 32)
    fresh.load_state_dict(state)
    assert all(torch.equal(value, state[name]) for name, value in fresh.state_dict().items())
    again = models.build_model("resnet18", 3, 32)
    sgd = torch.optim.SGD(again.parameters(), lr=1e-4)
    again, sgd, *_ = amp.initialize(again, sgd, o2("bf16"), torch.device("cpu"), Printed())
    again.load_state_dict(state)
    assert all(torch.equal(value, state[name]) for name, value in again.state_dict().items())


def test_o2_resumes_exactly_from_the_masters_its_checkpoint_holds(tiny_data, tmp_path):
    """apex O2 in bf16 on 2 processes, 2 epochs straight or 1 and a resume: the same fp32 weights, bit for bit
    (a checkpoint of the bf16 weights would resume from rounded masters); the run says what O2 keeps where."""
    # (at 32 px: at 16, layer4's first convolution sees 1 x 1 inputs, where torch 2.14's bf16 convolution on the
    # CPU leaves part of its weight gradient uninitialised, NaN at times, under autocast (O1) too)
    flags = [tiny_data, *TINY, "-a", "resnet18", "--image-size", "32", "--opt-level", "O2", "--amp-dtype", "bf16"]
    full, split = tmp_path / "full", tmp_path / "split"
    run_recipe("apex", [*flags, "--epochs", "2", "--out", full], nproc=2)
    run_recipe("apex", [*flags, "--epochs", "1", "--out", split], nproc=2)
    result = run_recipe("apex", [*flags, "--epochs", "2", "--out", split, "--resume", split / "checkpoint.pt"],
                        nproc=2)
    assert "weights bf16 but BatchNorm's, fp32 master copies in the optimizer, autocast off" in result.stdout
    a, b = (torch.load(out / "checkpoint.pt", weights_only=True)["model"] for out in (full, split))
    assert all(value.dtype == torch.float32 for value in a.values() if value.is_floating_point())
    assert all(torch.equal(a[key], b[key]) for key in a)
    # what summary.json measures O2 to hold: bf16 weights (BatchNorm's fp32), and for the optimizer fp32 masters,
    # their fp32 gradients and the momentum
    memory = read_summary(full)["memory"]
    assert memory["optimizer_bytes"] == 2 * memory["grad_bytes"]
    assert memory["grad_bytes"] / 2 < memory["param_bytes"] < memory["grad_bytes"]


def test_skipped_steps_are_counted_in_metrics_and_summary_as_the_scale_fell():
    """GradScaler halves its scale at each skipped step (and grows it only after 2,000 clean ones): the count the
    run keeps on the device, step by step, is the halvings of the scale."""
    from recipes.common import bookkeeping, metrics

    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    args = types.SimpleNamespace(opt_level="O1", amp_dtype="fp16", amp_backend="native", channels_last=False)
    model, optimizer, scaler, autocast = amp.initialize(model, optimizer, args, torch.device("cpu"), Printed())
    run = types.SimpleNamespace(scaler=scaler, scale=None)
    meter = metrics.EpochMeter(torch.device("cpu"))
    overflows = [True, False, True, True, False, False]
    for overflow in overflows:
        scaler.scale(model(torch.ones(2, 8)).sum()).backward()
        if overflow:
            model.weight.grad[0, 0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        meter.optimizer_step(bookkeeping.Run.skipped_step(run))
    assert meter.summary()["skipped_steps"] == sum(overflows) == math.log2(65536 / scaler.get_scale())
    assert bookkeeping.Run.skipped_step(types.SimpleNamespace(scaler=None)) is False  # fp32: nothing to skip
