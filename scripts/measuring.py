"""What the measuring scripts share: the hardware recorded beside every number, the
command that launches a run on 1 or N processes, and the CSV they write."""

import csv
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

# the demo's model and augmentation (as `make demo`), and a small stand-in for tests and QUICK=1;
# each script adds its own batch size, learning rate, workers and seed
DEMO_MODEL = ["-a", "resnet18", "--image-size", "28", "--scale", "0.6", "1", "--hflip", "0"]
QUICK_MODEL = ["-a", "lenet", "--image-size", "16", "--scale", "1", "1", "--hflip", "0"]


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware():
    """CPU model and cores, GPUs ("2 x NVIDIA H100", or None), torch version."""
    gpus = torch.cuda.device_count()
    return {"cpu": cpu_name(), "cores": os.cpu_count(),
            "gpu": f"{gpus} x {torch.cuda.get_device_name()}" if gpus else None, "torch": torch.__version__}


def python_command(processes):
    """python for one process, torchrun --standalone for several: prefix it to a script and its flags."""
    if processes == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]


def run(processes, script_and_flags, threads, env=None):
    """Run a script on `processes` processes of `threads` threads each (with env's variables added);
    exit with its error if it fails."""
    command = [*python_command(processes), *script_and_flags]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1", **(env or {}))
    result = subprocess.run(command, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True,
                            text=True)
    if result.returncode != 0:
        sys.exit(f"error: {' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return result


def write_csv(path, fields, rows):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
