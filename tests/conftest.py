"""Shared fixtures: a tiny learnable image folder and a helper that runs a recipe."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

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
# (scripts/nccl_rules.py: a call NCCL would refuse ends the run with one line naming it)
UNDER_NCCL_RULES = ("ps", "pipeline")


def recipe_command(recipe, args, nproc=None):
    script = [str(ROOT / "recipes" / recipe / "train.py")]
    if recipe in UNDER_NCCL_RULES:
        script.insert(0, str(ROOT / "scripts" / "nccl_rules.py"))
    if nproc is None:
        return [sys.executable, *script, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            *script, *args]


def run_recipe(recipe, args, nproc=None, expect_ok=True, env=None, timeout=300):
    """Run recipes/<recipe>/train.py (under torchrun when nproc is given)."""
    result = subprocess.run(recipe_command(recipe, [str(a) for a in args], nproc), cwd=ROOT,
                            env=child_env(env), capture_output=True, text=True, timeout=timeout)
    if expect_ok and result.returncode != 0:
        raise AssertionError(f"{recipe} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-5000:]}")
    return result


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
    command = [sys.executable, "scripts/plot_results.py", "--data", data, "--figures", figures, "--results", results]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in pngs:
        with Image.open(Path(figures) / f"{name}.png") as image:
            assert image.format == "PNG" and image.size[0] > 300
    return Path(results).read_text()
