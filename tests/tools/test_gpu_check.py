"""The device command (make gpu-check) and what it stands on, rehearsed where no GPU is: the recipes launched from a
clone with no install, the sync counter's stand-in, the smoke's limits, the GPU targets' one-line preflight."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, child_env

sys.path.insert(0, str(ROOT))
from recipes import RECIPES
from scripts.checks import check_python

EPOCHS = ["-a", "lenet", "--image-size", "16", "-b", "8", "-j", "0", "--epochs", "2", "-p", "1000", "--seed", "0"]


def copy_of_the_tree(tmp_path):
    """A clone's recipes/ and scripts/, to break one line of."""
    for folder in ("recipes", "scripts"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_a_recipe_imports_the_recipes_of_its_own_clone_whatever_is_installed(tmp_path):
    """Each train.py puts its clone's root first on the path: a copy of the tree runs its own recipes/, not an
    installed one (nor fails without one), from any folder, with no PYTHONPATH."""
    clone = copy_of_the_tree(tmp_path / "clone")
    cli = clone / "recipes" / "common" / "cli.py"
    cli.write_text('raise SystemExit("error: the clone\'s own recipes")\n' + cli.read_text())
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    for recipe in (entry.name for entry in RECIPES):
        result = subprocess.run([sys.executable, str(clone / "recipes" / recipe / "train.py"), "--help"],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and "the clone's own recipes" in result.stderr, (recipe, result.stderr[-500:])


def count_syncs(tree, tiny_data, tmp_path, recipe="ddp"):
    out = tmp_path / f"run-{recipe}"
    result = subprocess.run([sys.executable, str(tree / "scripts" / "gpu" / "count_syncs.py"), "--stand-in", "--json",
                             str(tmp_path / "syncs.json"), "--", str(tree / "recipes" / recipe / "train.py"),
                             str(tiny_data), *EPOCHS, "--out", str(out)], cwd=tree, env=child_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "syncs.json").read_text())


def test_the_sync_counter_s_stand_in_names_a_per_step_item_in_a_recipe_and_stops_at_the_epoch_s_end(tiny_data,
                                                                                                   tmp_path):
    """On a CPU, count_syncs.py --stand-in counts host reads of device tensors within the training steps: none in
    the recipes as they are, one per step when ddp's loop reads its loss, named by its line. Its JSON is written
    though the recipe ends through os._exit, and the epoch's end (the meter's summary, evaluation, the
    checkpoint), which reads on purpose, is not counted: 6 steps an epoch, 3 left out at each start."""
    clean = count_syncs(ROOT, tiny_data, tmp_path / "clean")
    assert clean["stand_in"] and clean["steps"] == 2 * (6 - 3) and clean["syncs"] == 0, clean
    tree = copy_of_the_tree(tmp_path / "tree")
    train = tree / "recipes" / "ddp" / "train.py"
    step = "        run.step_done(loss)"
    assert train.read_text().count(step) == 1
    train.write_text(train.read_text().replace(step, "        print(f'{loss.item():.3f}', end='')\n" + step))
    broken = count_syncs(tree, tiny_data, tmp_path / "broken")
    assert broken["steps"] == 6 and broken["syncs"] == 6, broken
    [source] = broken["sources"]
    assert source.startswith("recipes/ddp/train.py:") and "loss.item()" in source


def test_the_smoke_cuts_a_hung_check_at_its_limit_and_goes_on(tmp_path):
    """scripts/gpu/smoke.py --stand-in: a check that hangs (SIGSTOP after its 2nd step) is cut at its limit with every
    process it started, the next check runs, and the JSON holds each line and the summary as they come."""
    report = tmp_path / "smoke.json"
    result = subprocess.run([sys.executable, "scripts/gpu/smoke.py", "--stand-in", "--only", "faults",
                             "--hang-timeout", "10", "--json", str(report), "--out", str(tmp_path / "smoke")],
                            cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    checks = {c["check"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["faults-sigterm-then-resume"]["ok"]
    hung = checks["stand-in-hung-check"]
    assert hung["ok"] and "cut at its 10 s limit" in hung["said"] and 10 <= hung["seconds"] < 40
    assert "gpu-smoke: 2 of 2 checks ok" in result.stdout.splitlines()[-1]
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "smoke")], capture_output=True, text=True)
    assert leftover.stdout == "", leftover.stdout
    # the next lease: the fault check's pass is kept, a failure (the hung check's, made one here) runs again
    kept = json.loads(report.read_text())
    kept["checks"][[c["check"] for c in kept["checks"]].index("stand-in-hung-check")]["ok"] = False
    report.write_text(json.dumps(kept))
    again = subprocess.run([sys.executable, "scripts/gpu/smoke.py", "--stand-in", "--only", "faults",
                            "--hang-timeout", "10", "--json", str(report), "--out", str(tmp_path / "smoke"),
                            "--keep-passed"], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr[-2000:]
    assert "faults-sigterm-then-resume" not in again.stdout.split("(--keep-passed):")[1].split("\n", 1)[1]
    merged = json.loads(report.read_text())
    assert [(c["check"], c.get("earlier", False)) for c in merged["checks"]] == [
        ("faults-sigterm-then-resume", True), ("stand-in-hung-check", False)] and merged["not_run"] == []
    assert "2 of 2 checks ok" in merged["summary"] and "(1 of them passed in an earlier command)" in merged["summary"]


@pytest.mark.parametrize("groups, lacking", [({"ps", "ddp"}, ["byzfl"]), ({"ddp", "apex"}, []), (None, ["byzfl"])])
def test_the_smoke_asks_for_byzfl_only_when_its_parameter_server_check_runs(monkeypatch, groups, lacking):
    find_spec = check_python.importlib.util.find_spec
    monkeypatch.setattr(check_python.importlib.util, "find_spec", lambda name: None if name == "byzfl" else
                        find_spec(name))
    assert [entry.split()[0] for entry in check_python.missing("gpu-smoke", groups)] == lacking


def test_a_warning_on_stderr_does_not_stop_a_gpu_target(tmp_path):
    """The Makefile reads check_python's exit status and its one line, not whatever else the Python prints (a
    torch warning): without CUDA the line says so, and only it."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho 'UserWarning: something torch says' >&2\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    result = subprocess.run(["make", "--no-print-directory", "gpu-smoke", f"PY={python}"], cwd=ROOT,
                            env=child_env({"CUDA_VISIBLE_DEVICES": ""}), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "no CUDA GPU here" in result.stderr, result.stderr
    assert "UserWarning" not in result.stderr and result.stderr.strip().count("\n") == 0


def test_installing_the_recipes_keeps_the_torch_that_is_there():
    """pyproject.toml states ranges: pip install -e . into a Python that has torch (2.11 on the GPU nodes) keeps
    it (a dry run; pip may fetch the other packages' metadata from the index)."""
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", "-e",
                             str(ROOT)], capture_output=True, text=True, timeout=600,
                            env={k: v for k, v in os.environ.items() if k != "PIP_CONSTRAINT"})
    if result.returncode != 0 and "No matching distribution" in result.stderr:
        pytest.skip("no package index here")
    assert result.returncode == 0, result.stderr[-2000:]
    installing = {item["metadata"]["name"].lower() for item in json.loads(result.stdout)["install"]}
    assert not installing & {"torch", "torchvision"}, installing


def test_the_gpu_section_shows_the_check_s_node_and_each_check_or_says_it_has_not_run(tmp_path):
    """The gpu-check section (docs/results/gpu.md), from preflight.json and smoke.json as scripts/gpu/check.py
    writes them."""
    from scripts.figures.gpu import render as gpu

    assert "has not run on a GPU yet" in gpu.gpu_check_section(tmp_path)
    (tmp_path / "preflight.json").write_text(json.dumps({
        "python": "3.12.3", "torch": "2.11.0+cu130", "torchvision": "0.26.0+cu130", "cuda": "13.0", "cpu": "Xeon",
        "cores": 16, "gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "driver": "580.159.04"}))
    (tmp_path / "smoke.json").write_text(json.dumps({
        "stand_in": False, "total": 2, "summary": "gpu-smoke: 1 of 2 checks ok in 1.0 min; failed: dp",
        "checks": [{"check": "nd", "ok": True, "seconds": 9.5, "said": ""},
                   {"check": "dp", "ok": False, "seconds": 3.0, "said": "exit 1, not 0: a | b"}]}))
    section = gpu.gpu_check_section(tmp_path)
    assert "NVIDIA H100 80GB HBM3 (compute capability 9.0, driver 580.159.04, CUDA 13.0)" in section
    assert ": 1 of 2 checks ok in 1.0 min; failed: dp." in section
    report = json.loads((tmp_path / "smoke.json").read_text())
    (tmp_path / "smoke.json").write_text(json.dumps(dict(report, total=4, not_run=["ps", "faults"])))
    assert "failed: dp; not run yet (the command's limit came first): ps, faults." in gpu.gpu_check_section(tmp_path)
    assert "| dp | FAILED | 3.0 | exit 1, not 0: a \\| b |" in section
