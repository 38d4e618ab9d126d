"""scripts/slurm_ddp.sbatch without SLURM: its body runs under bash with SLURM's variables set, and srun,
scontrol, scancel and nvidia-smi replaced by stand-ins on PATH that record how they were called."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

from unittest import mock

import pytest
import torch
from conftest import ROOT, TINY, child_env

from recipes.common import cli

SBATCH = ROOT / "scripts" / "slurm_ddp.sbatch"
JOB_ID = 12345

# srun: records its arguments and directory, then does what STANDIN_SRUN says: "exit N", "wait" (until
# SIGTERM, then exit 75, as preempted ranks do) or "run" (the command after srun's own options)
SRUN = f"""#!{sys.executable}
import json, os, signal, sys, time
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps({{"srun": sys.argv[1:], "cwd": os.getcwd()}}) + "\\n")
mode = os.environ.get("STANDIN_SRUN", "exit 0")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
with open(os.environ["STANDIN_LOG"] + ".started", "w") as f:  # the step's pid, for scancel
    f.write(str(os.getpid()))
if mode == "wait":
    time.sleep(120)
elif mode == "run":
    command = sys.argv[1:]
    while command[0].startswith("--"):
        command.pop(0)
    os.execv(command[0], command)
sys.exit(int(mode.split()[1]))
"""
# one write per answer, as the real scontrol does: under PYTHONUNBUFFERED, print() writes the text and its
# newline apart, and `| head -n 1` may close the pipe in between (BrokenPipeError, a failed pipeline)
SCONTROL = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
if args[:2] == ["show", "hostnames"]:
    sys.stdout.write(os.environ.get("STANDIN_HOSTS", "node-a\\nnode-b") + "\\n")
elif args[:2] == ["show", "job"]:
    sys.stdout.write(f"JobId={{args[2]}} JobName=train\\n   Command={{os.environ['STANDIN_SUBMITTED']}}\\n   "
                     "WorkDir=/somewhere\\n")
elif args[0] == "requeue":
    with open(os.environ["STANDIN_LOG"], "a") as f:
        f.write(json.dumps({{"requeue": args[1]}}) + "\\n")
"""
# scancel --signal=TERM JOBID: the signal to the job's step (the process srun started), as SLURM sends it
SCANCEL = f"""#!{sys.executable}
import json, os, signal, sys
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps({{"scancel": sys.argv[1:]}}) + "\\n")
with open(os.environ["STANDIN_LOG"] + ".started") as f:
    os.kill(int(f.read()), signal.SIGTERM)
"""
NVIDIA_SMI = """#!/bin/sh
[ -n "$STANDIN_GPUS" ] || exit 9
i=0; while [ $i -lt "$STANDIN_GPUS" ]; do echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; i=$((i+1)); done
"""


@pytest.fixture
def standins(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("scancel", SCANCEL), ("nvidia-smi", NVIDIA_SMI)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def sbatch(tmp_path, standins, args=(), job_id=JOB_ID, popen=False, **env):
    """Run the script's body as SLURM would on the first node, submitted from tmp_path (not the repository)."""
    variables = {"PATH": f"{standins}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": str(job_id),
                 "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_PER_TASK": "8",
                 "SLURM_SUBMIT_DIR": str(tmp_path), "STANDIN_LOG": str(tmp_path / "calls.jsonl"),
                 "STANDIN_SUBMITTED": str(SBATCH), "PYTHON": sys.executable, **env}
    command = ["bash", str(SBATCH), *map(str, args)]
    if popen:
        return subprocess.Popen(command, cwd=tmp_path, env=child_env(variables), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    return subprocess.run(command, cwd=tmp_path, env=child_env(variables), capture_output=True, text=True,
                          timeout=300)


def default_workers(cores, processes, cuda):
    """What recipes/common/cli.py's default_workers gives a process of `processes` on `cores` cores."""
    with mock.patch.object(cli, "usable_cores", return_value=cores), \
            mock.patch.dict(os.environ, {"LOCAL_WORLD_SIZE": str(processes)}), \
            mock.patch.object(torch.cuda, "is_available", return_value=cuda):
        return cli.default_workers(spawns_per_device=False)


def calls(tmp_path):
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("slurm_gpus, node_gpus, cpus, nproc, workers, why", [
    ("", "", {"SLURM_CPUS_PER_TASK": "8"}, 1, 4, "no GPU"),  # a CPU trains: at most 4 workers
    ("", "", {"SLURM_CPUS_PER_TASK": "2"}, 1, 2, "no GPU"),
    ("4", "8", {"SLURM_CPUS_PER_TASK": "8"}, 4, 1, "GPUs allocated by SLURM"),  # 8 / 4 less one
    ("8", "8", {"SLURM_CPUS_PER_TASK": "", "SLURM_CPUS_ON_NODE": "64"}, 8, 7, "GPUs allocated by SLURM"),  # --exclusive
    ("", "2", {"SLURM_CPUS_PER_TASK": "8"}, 2, 3, "GPUs on the node, none allocated by SLURM")])
def test_one_torchrun_per_node_with_a_process_per_gpu_and_the_arguments_after_the_defaults(
        tmp_path, standins, slurm_gpus, node_gpus, cpus, nproc, workers, why):
    """The loader workers follow the recipes' own rule (cli.default_workers, checked beside it below) on the CPUs
    SLURM gives the task, which srun is told: from Slurm 22.05 to 23.02 a step does not inherit them."""
    result = sbatch(tmp_path, standins, ["-a", "lenet", "--epochs", "3"], SLURM_GPUS_ON_NODE=slurm_gpus,
                    STANDIN_GPUS=node_gpus, **cpus)
    assert result.returncode == 0, result.stderr
    given = cpus["SLURM_CPUS_PER_TASK"] or cpus["SLURM_CPUS_ON_NODE"]
    assert f"node(s) x {nproc} process(es) ({why}), {given} CPUs, -j {workers}" in result.stdout
    assert workers == default_workers(int(given), nproc, cuda=why != "no GPU")
    [srun] = calls(tmp_path)
    assert srun["cwd"] == str(ROOT)  # submitted from elsewhere, run from the repository
    command = srun["srun"]
    assert command[:4] == ["--kill-on-bad-exit=1", f"--cpus-per-task={given}", sys.executable,
                           "scripts/preemptible_torchrun.py"]
    assert "--nnodes=2" in command and f"--nproc_per_node={nproc}" in command
    port = 10000 + JOB_ID % 20000
    assert f"--rdzv_endpoint=node-a:{port}" in command and f"--rdzv_id={JOB_ID}" in command
    recipe = command.index("recipes/ddp/train.py")
    assert command[recipe + 1:] == ["/datasets/imagenet", "-a", "resnet50", "-b", "64", "--lr", "0.1", "--epochs",
                                    "90", "-j", str(workers), "--auto-resume", "--out", f"runs/ddp-{JOB_ID}",
                                    "-a", "lenet", "--epochs", "3"]  # the user's flags come last, so they win


def test_jobs_on_one_node_get_different_ports_and_recipe_picks_the_script(tmp_path, standins):
    sbatch(tmp_path, standins, job_id=JOB_ID + 1, RECIPE="apex", DATA="/data/x", OUT="runs/mine")
    command = calls(tmp_path)[0]["srun"]
    assert f"--rdzv_endpoint=node-a:{10000 + (JOB_ID + 1) % 20000}" in command
    recipe = command.index("recipes/apex/train.py")
    assert command[recipe + 1] == "/data/x" and command[-2:] == ["--out", "runs/mine"]


@pytest.mark.parametrize("out, shown", [("runs/mine", f"{ROOT}/runs/mine"), ("/shared/runs/x", "/shared/runs/x")])
def test_the_first_line_names_the_run_directory_as_it_is(tmp_path, standins, out, shown):
    result = sbatch(tmp_path, standins, OUT=out)
    assert result.stdout.splitlines()[0].endswith(f"run directory {shown}"), result.stdout


@pytest.mark.parametrize("env, message", [
    ({"RECIPE": "nope"}, "RECIPE=nope: there is no recipes/nope/train.py"),
    ({"PYTHON": "/no/python"}, "no /no/python: run 'make setup'")])
def test_a_wrong_setting_is_one_line_and_exit_2(tmp_path, standins, env, message):
    result = sbatch(tmp_path, standins, **env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"slurm_ddp.sbatch: error: {result.stderr.split('error: ')[1]}"
                                                  .strip()]
    assert message in result.stderr and not calls(tmp_path)


@pytest.mark.parametrize("srun_exit", [75, 1, 0])
def test_the_job_ends_with_the_exit_code_of_its_ranks(tmp_path, standins, srun_exit):
    result = sbatch(tmp_path, standins, STANDIN_SRUN=f"exit {srun_exit}")
    assert result.returncode == srun_exit
    assert not [call for call in calls(tmp_path) if "requeue" in call]


def started(job, tmp_path):
    marker, deadline = tmp_path / "calls.jsonl.started", time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the script waits for srun now


def test_the_time_limit_warning_stops_the_ranks_then_requeues_the_job(tmp_path, standins):
    """--signal=B:USR1@120: the script signals the step, and once the ranks exit 75, requeues the job."""
    job = sbatch(tmp_path, standins, popen=True, STANDIN_SRUN="wait")
    started(job, tmp_path)
    os.kill(job.pid, signal.SIGUSR1)  # to the batch shell alone, as SLURM sends it
    job.communicate(timeout=60)
    assert job.returncode == 0
    assert calls(tmp_path)[1:] == [{"scancel": ["--signal=TERM", str(JOB_ID)]}, {"requeue": str(JOB_ID)}]


def test_sigterm_to_the_whole_job_waits_for_the_ranks_and_does_not_requeue(tmp_path, standins):
    """scancel, a preemption or scontrol requeue signal every process, this shell too: it must outlive the
    ranks, and leave the requeueing to SLURM (a cancelled job stays cancelled)."""
    job = sbatch(tmp_path, standins, popen=True, STANDIN_SRUN="wait")
    started(job, tmp_path)
    os.killpg(job.pid, signal.SIGTERM)
    job.communicate(timeout=60)
    assert job.returncode == 75
    assert len(calls(tmp_path)) == 1  # srun only


def free_job_id():
    """A job id whose rendezvous port is free on this machine."""
    while True:
        job_id = random.randrange(100000, 200000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 10000 + job_id % 20000))
                return job_id
            except OSError:
                continue


def test_a_job_at_its_time_limit_saves_and_its_requeued_run_resumes_and_completes(tmp_path, standins, tiny_data):
    """The script's torchrun command for real, one process: the time-limit warning mid-run (torchrun passes
    the SIGTERM on to its worker), then the rerun after the requeue."""
    args = [*TINY, "-b", "4", "-p", "1000", "--epochs", "200"]
    job_id = free_job_id()
    one_node = {"STANDIN_SRUN": "run", "STANDIN_HOSTS": "127.0.0.1", "SLURM_JOB_NUM_NODES": "1",
                "DATA": str(tiny_data), "OUT": str(tmp_path / "run")}
    job = sbatch(tmp_path, standins, args, job_id, popen=True, **one_node)
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and time.monotonic() < deadline:  # after epoch 1
        time.sleep(0.2)
    os.kill(job.pid, signal.SIGUSR1)  # the time-limit warning
    stdout, stderr = job.communicate(timeout=120)
    assert job.returncode == 0, stderr[-3000:]
    assert stdout.strip().splitlines()[-1].startswith("preempted: SIGTERM received; saved ")
    assert "Traceback" not in stderr and "SignalException" not in stderr
    assert calls(tmp_path)[-1] == {"requeue": str(job_id)}

    epochs = torch.load(checkpoint, weights_only=True)["epoch"] + 1  # to the end of the preempted epoch
    rerun = sbatch(tmp_path, standins, [*args, "--epochs", epochs], job_id, SLURM_RESTART_COUNT="1", **one_node)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "(restart 1)" in rerun.stdout and "resuming " in rerun.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["epochs"] == epochs
