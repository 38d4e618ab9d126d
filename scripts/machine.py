"""The hardware a benchmark ran on, recorded beside every measured number."""

import os
import platform
from pathlib import Path

import torch


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
