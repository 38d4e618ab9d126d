"""Shared fixtures: a tiny learnable image folder, a tiny text, and a helper that runs a recipe."""

import csv
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from recipes import RECIPES
from scripts.harness import launch

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("red", "green", "blue")
TRAIN_PER_CLASS, VAL_SIZES = 16, (8, 8, 7)  # 48 train images; 23 val images: no multiple of 2 or 3
# small, fast and free of batch-norm statistics and dropout; every flag is a real recipe flag
TINY = ["-a", "lenet", "-b", "8", "--image-size", "16", "-j", "0", "--seed", "0", "-p", "1",
        "--scale", "1", "1", "--hflip", "0"]


def write_tiny_folder(root, seed=0):
    rng = np.random.default_rng(seed)
    for split, sizes in (("train", (TRAIN_PER_CLASS,) * 3), ("val", VAL_SIZES)):
        for c, (name, n) in enumerate(zip(CLASSES, sizes)):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                pixels = rng.integers(0, 120, (16, 16, 3))
                pixels[..., c] += 100  # the class is the dominant colour, under noise
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i:03d}.png")
    return root


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    return write_tiny_folder(tmp_path_factory.mktemp("tiny"))


TEXT_VOCABULARY = ["[PAD]", "[UNK]", "[MASK]", *"abcdefgh"]


def write_tiny_text(root, seed=0):
    """A text that can be learnt (as data.MaskedTokens reads it): 48 train and 23 val sequences of 16 tokens,
    each one of the 8 letters over and over, so a masked letter is the one around it."""
    generator = torch.Generator().manual_seed(seed)
    for split, n in (("train", 48), ("val", 23)):
        letters = torch.randint(8, (n, 1), generator=generator)
        (root / split).mkdir(parents=True, exist_ok=True)
        torch.save({"sequences": 3 + letters.expand(n, 16), "vocabulary": TEXT_VOCABULARY}, root / split / "tokens.pt")
    return root


@pytest.fixture(scope="session")
def tiny_text(tmp_path_factory):
    return write_tiny_text(tmp_path_factory.mktemp("text"))


def pytest_collection_modifyitems(config, items):
    """On pytest-xdist's workers (make test: 2), the tests of an xdist_group run on one worker one after another,
    minutes in all: sent first, they run beside the others rather than after them."""
    if getattr(config.option, "dist", "no") != "no":
        items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra=None):
    # the suite tests the CPU/gloo paths, whatever the machine has
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
    extra = dict(extra or {})
    if "PYTHONPATH" in extra and env.get("PYTHONPATH"):  # (keep the caller's: a mutated copy of the tree, say)
        extra["PYTHONPATH"] += os.pathsep + env["PYTHONPATH"]
    env.update(extra)
    return env


# recipes whose many groups and point-to-point messages run under NCCL's rules in every test, on gloo as on NCCL
# (scripts/harness/nccl_rules.py: a call NCCL would refuse ends the run with one line naming it), as the catalogue
# says
UNDER_NCCL_RULES = {entry.name for entry in RECIPES if entry.tested_under_nccl_rules}


def recipe_command(recipe, args, nproc=None):
    script = [str(ROOT / "recipes" / recipe / "train.py")]
    if recipe in UNDER_NCCL_RULES:
        script.insert(0, str(ROOT / "scripts" / "harness" / "nccl_rules.py"))
    return [*launch.python_command(nproc), *script, *args]


def run_recipe(recipe, args, nproc=None, expect_ok=True, env=None, timeout=300, torchrun=False):
    """Run recipes/<recipe>/train.py: one process, or nproc of them as torchrun's workers (torchrun: under
    torchrun itself), each forked from the suite's fork server unless torchrun."""
    args = [str(a) for a in args]
    if nproc is not None and not torchrun:
        result = launch_ranks(recipe_command(recipe, args), nproc, child_env(env), timeout)
    else:
        result = run_python(recipe_command(recipe, args, nproc), env=env, timeout=timeout)
    if expect_ok and result.returncode != 0:
        raise AssertionError(f"{recipe} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-5000:]}")
    return result


def run_python(command, cwd=ROOT, env=None, timeout=300):
    """subprocess.run(command, capture_output=True, text=True) with the suite's environment (and env's
    variables): forked from the suite's fork server when command is `python SCRIPT ...` with this Python
    (scripts/harness/launch.py)."""
    return launch.run(command, child_env(env), cwd, timeout, server_env=child_env())


def start_python(command, output, cwd=ROOT):
    """subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT) with the suite's environment, in a
    session of its own: forked from the suite's fork server where run_python forks (scripts/harness/launch.py)."""
    return launch.start(command, child_env(), output, output, cwd, server_env=child_env())


def wait_for_line(output, text, running=()):
    """Until text is in the output file (at most 240 s), asserting meanwhile that the processes in running run."""
    deadline = time.monotonic() + 240
    while text not in output.read_text() and time.monotonic() < deadline:
        assert all(process.poll() is None for process in running), output.read_text()[-3000:]
        time.sleep(0.05)


def launch_ranks(command, nproc, env, timeout, cwd=ROOT):
    """nproc ranks of command as torchrun starts its workers, forked from the suite's fork server
    (scripts/harness/launch.py)."""
    return launch.launch_ranks(command, nproc, env, timeout, cwd=cwd, server_env=child_env())


SUMMARY_KEYS = {"recipe", "arch", "epochs", "world_size", "device", "top1", "top5", "loss",
                "images_per_s", "wall_s", "torch"}
CSV_FIELDS = ["epoch", "split", "loss", "top1", "top5", "images_per_s", "data_s", "epoch_s", "lr",
              "process_images_per_s", "skipped_steps", "read_mb", "read_calls"]


def assert_complete_run_dir(out, recipe, world_size, epochs=1):
    for name in ("args.json", "metrics.csv", "checkpoint.pt", "best.pt", "summary.json"):
        assert (out / name).is_file(), f"{name} missing from {out}"
    assert list(out.glob("events.out.tfevents.*")), "no TensorBoard event file"
    with open(out / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == CSV_FIELDS
        rows = list(reader)
    assert [(int(r["epoch"]), r["split"]) for r in rows] == [
        (e, s) for e in range(1, epochs + 1) for s in ("train", "val")]
    for row in rows:  # images/s a process: the run's, shared among all its processes (whatever their role)
        assert float(row["process_images_per_s"]) * world_size == pytest.approx(float(row["images_per_s"]),
                                                                                 rel=1e-3, abs=0.01 * world_size)
    summary = read_summary(out)
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["recipe"] == recipe and summary["world_size"] == world_size
    assert summary["epochs"] == epochs and summary["val_images"] == 23
    assert summary["images_per_s"] > 0 and 0 <= summary["top1"] <= 100
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == epochs and state["num_classes"] == 3
    return summary


def assert_one_clear_line(result, *phrases):
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def injected(recipe, args, fault, step, nproc=None, torchrun_args=(), inject_args=(), timeout=300,
             torchrun=("-m", "torch.distributed.run"), **popen):
    """Run a recipe under scripts/harness/inject_fault.py (under torchrun when nproc is given)."""
    command = injected_command(recipe, args, fault, step, nproc, torchrun_args, inject_args, torchrun)
    if nproc is None and not popen:
        return run_python(command, timeout=timeout)  # (forked: no launcher in the test)
    return subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout,
                          **popen)


def injected_command(recipe, args, fault, step, nproc=None, torchrun_args=(), inject_args=(),
                     torchrun=("-m", "torch.distributed.run")):
    """The command that runs a recipe under scripts/harness/inject_fault.py (under torchrun when nproc is given)."""
    inject = [str(ROOT / "scripts" / "harness" / "inject_fault.py"), "--fault", fault, "--step", str(step),
              *inject_args, "--", str(ROOT / "recipes" / recipe / "train.py"), *map(str, args)]
    if nproc is None:
        return [sys.executable, *inject]
    return [sys.executable, *torchrun, "--standalone", f"--nproc_per_node={nproc}", *torchrun_args, *inject]


def spawn(function, args, nprocs):
    """function(rank, *args) in nprocs forked processes (scripts/harness/launch.py's spawn), in the suite's
    environment, where the test module that holds function imports conftest as pytest's own process does."""
    launch.spawn(function, args, nprocs, child_env({"PYTHONPATH": str(Path(__file__).resolve().parent)}))


def read_summary(out):
    return json.loads((Path(out) / "summary.json").read_text())


def alive(pid):
    """Whether process pid is running (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def plot_results(data, figures, results, pngs):
    """Run plot_results.py on data; check that it drew the figures named; return RESULTS.md's text."""
    command = [sys.executable, "scripts/figures/plot_results.py", "--data", data, "--figures", figures, "--results",
               results]
    result = run_python(command, timeout=120)  # (forked)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in pngs:
        with Image.open(Path(figures) / f"{name}.png") as image:
            assert image.format == "PNG" and image.size[0] > 300
    return Path(results).read_text()
