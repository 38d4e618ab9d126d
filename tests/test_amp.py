"""Mixed precision: loss curves close to fp32, and the apex.amp backend's wiring."""

import csv
import textwrap

import pytest
import torch
from conftest import TINY, read_summary, run_recipe

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
    for name in ("bf16", "fp16"):
        for fp32, low in zip(curves["fp32"], curves[name]):
            assert abs(low - fp32) <= ABS_TOL + REL_TOL * fp32, (name, curves)
    scaler = torch.load(tmp_path / "fp16" / "checkpoint.pt", weights_only=True)["scaler"]
    assert scaler and scaler["scale"] > 0  # fp16 trains with a GradScaler, saved for resume
    assert not torch.load(tmp_path / "bf16" / "checkpoint.pt", weights_only=True)["scaler"]  # bf16 needs none


def test_cpu_default_is_fp32_without_native_bf16(tiny_data, tmp_path):
    from recipes.common.amp import cpu_has_native_bf16
    if torch.cuda.is_available() or cpu_has_native_bf16():
        pytest.skip("this machine runs low precision natively")
    result = run_recipe("apex", [tiny_data, *TINY, "--epochs", "1", "--out", tmp_path / "default"])
    assert "defaulting to --opt-level O0 (fp32)" in result.stdout and "opt level O0 (fp32" in result.stdout
    result = run_recipe("apex", [tiny_data, *TINY, "--epochs", "1", "--opt-level", "O3", "--out", tmp_path / "o3"])
    assert "warning: --opt-level O3 (bf16) on a CPU without native bf16" in result.stdout


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
