"""Shared fixtures: a tiny learnable image folder and a helper that runs a recipe."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import forkserver

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
# (scripts/gpu/nccl_rules.py: a call NCCL would refuse ends the run with one line naming it)
UNDER_NCCL_RULES = ("ps", "pipeline")


def recipe_command(recipe, args, nproc=None):
    script = [str(ROOT / "recipes" / recipe / "train.py")]
    if recipe in UNDER_NCCL_RULES:
        script.insert(0, str(ROOT / "scripts" / "gpu" / "nccl_rules.py"))
    if nproc is None:
        return [sys.executable, *script, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            *script, *args]


def run_recipe(recipe, args, nproc=None, expect_ok=True, env=None, timeout=300, torchrun=False):
    """Run recipes/<recipe>/train.py: one process, or nproc of them as torchrun's workers (torchrun: under
    torchrun itself), each forked from the suite's fork server unless torchrun."""
    args = [str(a) for a in args]
    if nproc is not None and not torchrun:
        result = launch_ranks(recipe_command(recipe, args), nproc, child_env(env), timeout)
    elif nproc is None:
        result = run_python(recipe_command(recipe, args), env=env, timeout=timeout)
    else:
        result = subprocess.run(recipe_command(recipe, args, nproc), cwd=ROOT, env=child_env(env),
                                capture_output=True, text=True, timeout=timeout)
    if expect_ok and result.returncode != 0:
        raise AssertionError(f"{recipe} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-5000:]}")
    return result


def run_python(command, cwd=ROOT, env=None, timeout=300):
    """subprocess.run(command, capture_output=True, text=True) with the suite's environment (and env's
    variables): forked from the fork server when command is `python SCRIPT ...` with this Python."""
    if forkserver.forkable(command):
        return forkserver.run(command, cwd, child_env(env), timeout, child_env())
    return subprocess.run(command, cwd=cwd, env=child_env(env), capture_output=True, text=True, timeout=timeout)


def torchrun_env(rank, nproc, port, run_id, errors):
    """What torchrun --standalone --nproc_per_node=nproc adds to rank's environment (test_forked.py compares)."""
    return {"RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank), "ROLE_NAME": "default",
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(nproc),
            "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "localhost",
            "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCHELASTIC_ERROR_FILE": str(errors / str(rank) / "error.json"),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(signal.Signals(number).name for number in HANDLED)}


# the signals torchrun handles (its TORCHELASTIC_SIGNALS_TO_HANDLE): its workers start with them at their default,
# where an ignored signal is otherwise inherited (the tests under nohup, or started in a shell's background)
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def default_handled_signals():
    for number in HANDLED:
        signal.signal(number, signal.SIG_DFL)


def launch_ranks(command, nproc, env, timeout, grace=10):
    """nproc processes of command as torchrun --standalone starts its workers, without its agent: the
    environment it gives them (torchrun_env), its store (held here, as the agent holds it) and a session each;
    `python SCRIPT` forked from the fork server. The agent's start-up costs about a second a run, a fresh
    interpreter's imports 2.5 s a rank; the tests of torchrun's own behaviour launch torchrun. As its agent
    does, the first rank to fail has the others' process groups sent SIGTERM, then SIGKILL after `grace`
    seconds, and the exit code is 1 when any rank failed. The output: every rank's stdout (then stderr), rank
    by rank."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    run_id, errors = str(uuid.uuid4()), Path(tempfile.mkdtemp(prefix="torchelastic-"))
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(nproc)]
    envs = [{**env, **torchrun_env(rank, nproc, store.port, run_id, errors)} for rank in range(nproc)]
    deadline, stop_at, ranks = time.monotonic() + timeout, None, []
    try:
        for rank_env, (out, err) in zip(envs, files):
            if forkserver.forkable(command):
                ranks.append(forkserver.Forked(command, ROOT, rank_env, out, err, child_env(), handled=HANDLED))
            else:
                ranks.append(subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err, text=True, env=rank_env,
                                              start_new_session=True, preexec_fn=default_handled_signals))
        while None in [rank.poll() for rank in ranks]:  # (each one polled)
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(command, timeout)
            if stop_at is None and any(rank.returncode for rank in ranks):
                stop_at = time.monotonic() + grace
                for rank in ranks:
                    forkserver.signal_group(rank, signal.SIGTERM)
            if stop_at is not None and time.monotonic() > stop_at:
                for rank in ranks:
                    forkserver.signal_group(rank, signal.SIGKILL)
            time.sleep(0.02)
    finally:
        for rank in ranks:
            forkserver.signal_group(rank, signal.SIGKILL)
            rank.wait()
        shutil.rmtree(errors, ignore_errors=True)
    outputs = []
    for out, err in files:
        out.seek(0), err.seek(0)
        outputs.append((out.read(), err.read()))
        out.close(), err.close()
    return subprocess.CompletedProcess(command, int(any(rank.returncode for rank in ranks)),
                                       "".join(out for out, _ in outputs), "".join(err for _, err in outputs))


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
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in pngs:
        with Image.open(Path(figures) / f"{name}.png") as image:
            assert image.format == "PNG" and image.size[0] > 300
    return Path(results).read_text()
