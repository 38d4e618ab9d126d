"""What the measuring scripts share: the hardware recorded beside every number, the
command that launches a run on 1 or N processes, a run that a stopped `make figures`
skips when it starts again, the set-up of the accuracy tables, and the CSVs they write."""

import argparse
import csv
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from recipes.common.cli import usable_cores  # (the cores a run may use, as the recipes count them)
from scripts.harness import launch as launching  # (`launch`, in train(), is what launch.json keeps of a run)

ROOT = Path(__file__).resolve().parents[2]
# the demo's model and augmentation (as `make demo`), and a small stand-in for tests and QUICK=1;
# each script adds its own batch size, learning rate, workers and seed
DEMO_MODEL = ["-a", "resnet18", "--image-size", "28", "--scale", "0.6", "1", "--hflip", "0"]
QUICK_MODEL = ["-a", "lenet", "--image-size", "16", "--scale", "1", "1", "--hflip", "0"]

# The tables that compare accuracy (learning curves, compression) train lenet on the digits, with a cosine
# schedule, for long enough that uncompressed DDP's final top-1 moves by less than a point from seed to seed
# (ResNet-18 would take hours for 3 seeds of every row on 2 cores). Each table reports the mean and the
# min-max range over SEEDS; each script adds the global batch (split between the processes) and the seed.
ACCURACY = ["-a", "lenet", "--image-size", "28", "--scale", "0.6", "1", "--hflip", "0", "--lr", "0.1",
            "--lr-schedule", "cosine", "--warmup-epochs", "1", "-j", "0"]
ACCURACY_EPOCHS = 15
QUICK_ACCURACY = [*QUICK_MODEL, "--lr", "0.1", "-j", "0"]
SEEDS = [0, 1, 2]


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2, as the recipes' are."""

    def error(self, message):
        bad_input(message)


def bad_input(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def require_digits(folder):
    """Exit with one line unless folder has a train/ folder (data/mnist5k, which make_demo_data.py writes)."""
    if not (Path(folder) / "train").is_dir():
        sys.exit(f"error: {folder} has no train/ folder; run `python scripts/make_demo_data.py` first")


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


PRECISION_FLAGS = ["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16"]


def cpu_flags():
    """Which of the flags that decide low precision's speed on a CPU /proc/cpuinfo lists, space-separated:
    AVX512-BF16 or AMX-BF16 run bf16 natively (recipes/common/amp.py), AVX512-FP16 or AMX-FP16 fp16."""
    try:
        listed = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return ""
    return " ".join(flag for flag in PRECISION_FLAGS if flag in listed)


def hardware():
    """CPU model and the cores this process may use, GPUs ("2 x NVIDIA H100", or None), torch version."""
    gpus = torch.cuda.device_count()
    return {"cpu": cpu_name(), "cores": usable_cores(),
            "gpu": f"{gpus} x {torch.cuda.get_device_name()}" if gpus else None, "torch": torch.__version__}


def kill_tree(process):
    """SIGKILL a Popen'd process, every process it started (stopped ones too) and its process group; then reap it."""
    for pid in [*launching.descendants(process.pid), process.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def python_command(processes):
    """python for one process, torchrun --standalone for several: prefix it to a script and its flags."""
    return launching.python_command(None if processes == 1 else processes)


def environment(threads, env=None):
    """This process's environment for a run of `threads` threads a process, with env's variables added."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1", **(env or {}))
    # the recipes import the package `recipes` from this checkout, installed (make setup) or not (PY=python3)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def run(processes, script_and_flags, threads, env=None, check=True, echo=None):
    """Run a script on `processes` processes of `threads` threads each (with env's variables added), each a
    fresh interpreter (torchrun's workers for several); exit with its error if it fails (unless check is False:
    then the caller reads the result). echo: print the run's output lines as they come, each after "[echo] "
    (its stderr then comes in its stdout)."""
    command = [*python_command(processes), *script_and_flags]
    result = launching.run(command, environment(threads, env), forked=False, echo=echo)
    if check and result.returncode != 0:
        sys.exit(f"error: {' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return result


def run_forked(processes, script_and_flags, threads, env=None):
    """run(), with each process forked as the tests fork their ranks (scripts/harness/launch.py, whose docstring
    lists what a forked rank is promised), not started by torchrun as a fresh interpreter: on 2 cores, the 9 to 11
    processes of a parameter-server run spend about 25 s importing torch and torchvision, longer than a short run
    trains. The recipe sees what torchrun gives it, a store that this process holds (as torchrun's agent does)
    included. The ranks' stdout and stderr come as one stream, in the result's stdout; its returncode is the first
    failing rank's exit code (0 when none failed). One process is forked as `python SCRIPT` starts, without
    torchrun's variables. The processes die with the fork server (one for each number of threads, which numpy's
    BLAS reads as the server imports it), and the server with this process."""
    if processes == 1:
        result = launching.run([sys.executable, *script_and_flags], environment(threads, env),
                               server_env=environment(threads))
        return subprocess.CompletedProcess(script_and_flags, result.returncode, result.stdout + result.stderr, "")
    result = launching.launch_ranks([sys.executable, *script_and_flags], processes, environment(threads, env),
                                    server_env=environment(threads), one_stream=True)
    return subprocess.CompletedProcess(script_and_flags, result.first_failure or 0, result.stdout, "")


counts = {"trained": 0, "reused": 0, "reused_s": 0.0}  # this script's runs: trained now, or kept from before


def finished_summary(out, launch):
    """out's summary.json when out holds a finished run launched as `launch` describes, else None."""
    try:
        if json.loads((out / "launch.json").read_text()) == launch:
            return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):  # absent, or cut off mid-write
        pass
    return None


def launch_of(recipe, processes, flags, env=None, threads=None, launcher=None):
    """What makes two runs the same run, as train() keeps it in launch.json."""
    return {"recipe": recipe, "processes": processes, "threads": threads, "flags": [str(flag) for flag in flags],
            "env": env or {}, **({"launcher": [str(part) for part in launcher]} if launcher else {})}


def train(recipe, processes, flags, out, threads, env=None, check=True, forked=False, echo=None, launcher=None):
    """recipes/<recipe>/train.py FLAGS --out OUT on `processes` processes, unless OUT already holds a finished
    run of the same recipe, processes, threads, flags and environment: a stopped `make figures` started again skips
    what it has. A run that did not finish starts afresh. Returns its summary (None when it failed and check
    is False: its output is then in OUT/failed.log). forked: the processes start as run_forked() starts them;
    echo: their output is printed as it comes (run()); launcher: a script and its flags that run the recipe
    (scripts/harness/inject_fault.py's way: it takes the recipe's path and flags after them)."""
    out, launch = Path(out), launch_of(recipe, processes, flags, env, threads, launcher)
    summary = finished_summary(out, launch)
    if summary is not None:
        note_reused(out)
        return summary
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "launch.json").write_text(json.dumps(launch, indent=2) + "\n")
    started = time.perf_counter()
    script_and_flags = [*launch.get("launcher", []), str(ROOT / "recipes" / recipe / "train.py"), *launch["flags"],
                        "--out", str(out)]
    if forked:
        result = run_forked(processes, script_and_flags, threads, env)
        if check and result.returncode != 0:
            sys.exit(f"error: {' '.join(script_and_flags)} failed:\n{result.stdout[-3000:]}")
    else:
        result = run(processes, script_and_flags, threads, env, check, echo)
    note_trained(out, time.perf_counter() - started)
    if result.returncode != 0:
        output = result.stdout[-20000:] + (result.stderr[-20000:] if result.stderr != result.stdout else "")
        (out / "failed.log").write_text(output)
        return None
    return json.loads((out / "summary.json").read_text())


def note_trained(out, seconds):
    counts["trained"] += 1
    (Path(out) / "launch_seconds").write_text(f"{seconds:.1f}\n")  # start-up included


def note_reused(out):
    counts["reused"] += 1
    seconds = Path(out) / "launch_seconds"
    counts["reused_s"] += float(seconds.read_text()) if seconds.exists() else 0.0


def train_seconds(out):
    """The training epochs' seconds of a run directory, summed (evaluation and start-up left out)."""
    with open(Path(out) / "metrics.csv", newline="") as f:
        return sum(float(row["epoch_s"]) for row in csv.DictReader(f) if row["split"] == "train")


def training_curve(out):
    """(epoch, training seconds so far, val top-1) of each epoch of a run directory (evaluation left out)."""
    epochs, elapsed, points = read_csv(Path(out) / "metrics.csv"), 0.0, []
    for row in (r for r in epochs if r["split"] == "train"):
        elapsed += float(row["epoch_s"])
        val = next(v for v in epochs if v["split"] == "val" and v["epoch"] == row["epoch"])
        points.append((row["epoch"], elapsed, val["top1"]))
    return points


def record_part(figures_data, part, started, adding=False, replacing=None):
    """Keep how long this part of `make figures` takes in <figures_data>/timings.csv (one row per part,
    replaced each time), for RESULTS.md: the time since `started` plus, for runs kept from an earlier
    start, the time they took then, so a resumed part still records what a whole one takes. adding (a part
    measured in pieces): the pieces' runs trained now are added to the part's row, whose time holds the rest
    (runs kept from an earlier start are in it already). replacing (runs measured again in place of earlier ones):
    (seconds and runs the new ones took, seconds and runs of the earlier ones they replace): the part's row moves
    by their difference, whatever this start trained or read back (so starting it again changes nothing)."""
    path = Path(figures_data) / "timings.csv"
    recorded = read_csv(path) if path.exists() else []
    earlier = [row for row in recorded if row["part"] == part]
    rows = [row for row in recorded if row["part"] != part]
    seconds, trained, reused = time.time() - started + counts["reused_s"], counts["trained"], counts["reused"]
    if adding and earlier:
        seconds = float(earlier[0]["seconds"]) + time.time() - started
        trained, reused = int(earlier[0]["runs_trained"]) + counts["trained"], int(earlier[0]["runs_reused"])
    if replacing and earlier:
        new_s, new_runs, old_s, old_runs = replacing
        seconds = float(earlier[0]["seconds"]) + new_s - old_s
        trained, reused = int(earlier[0]["runs_trained"]) + new_runs - old_runs, int(earlier[0]["runs_reused"])
    rows.append({"part": part, "seconds": round(seconds, 1), "runs_trained": trained,
                 "runs_reused": reused, "date": time.strftime("%Y-%m-%d"), **hardware()})
    write_csv(path, TIMING_FIELDS, rows)
    print(f"{part}: {seconds / 60:.1f} minutes ({counts['trained']} run(s) trained now, {counts['reused']} kept "
          f"from an earlier start)", flush=True)


TIMING_FIELDS = ["part", "seconds", "runs_trained", "runs_reused", "date", "cpu", "cores", "gpu", "torch"]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path, fields, rows):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
