"""Sharded data parallel: the bytes each rank holds, and images/s, of every --shard mode against processes.

    python scripts/figures/sharding/measure.py --data data/imagenet-like     # figures/data/sharding.csv

ResNet-50 at 32 px, and the small vision transformer (vit_tiny, each encoder block its own fully_shard
unit) at 28 px (-a and --image-size, paired) on the JPEG folder, -b 16 per process, one epoch (plus
evaluation) of seed 0, fp32, in each --shard mode (none = DDP, optimizer = ZeRO-1, grad-op =
ZeRO-2, full = ZeRO-3) at 1, 2 and 4 processes; on CPU one thread each (4 processes share this
machine's cores: their images/s say what the cores give, their bytes what each rank holds).
From each run's summary.json, the largest rank's measured bytes of parameters (the most held when a
forward ends: grad-op holds every block gathered until its backward), gradients and optimizer
state, its peak resident memory (and peak CUDA memory on CUDA), and the training images/s. Beside
them, for the model's P parameters, what the ZeRO paper's model says a rank holds (Rajbhandari et
al., SC 2020: (2 + 2 + K) P bytes in mixed precision with Adam, K = 12; here fp32 weights and
gradients with SGD's momentum, (4 + 4 + 4) P), each sharded part divided by N, and the bytes each
rank sends per step in the ring algorithms the mode runs (fp32; a = (N - 1) / N x 4 P):
  none 2a (allreduce)   optimizer 3a (allreduce, then each owner broadcasts its updated tensors)
  grad-op 2a (all-gather once, reduce-scatter)   full 3a (all-gather for forward and again for backward).
Runs go to runs/figures/sharding/<arch>-<mode>-n<N>; a run whose summary.json is complete is not trained again.
"""

import argparse
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from scripts.figures import measuring  # noqa: E402

MODES = ["none", "optimizer", "grad-op", "full"]
ZERO = {"none": "DDP", "optimizer": "ZeRO-1", "grad-op": "ZeRO-2", "full": "ZeRO-3"}
FIELDS = ["shard", "zero", "processes", "arch", "image_size", "batch", "parameters", "param_bytes", "grad_bytes",
          "optimizer_bytes", "state_bytes", "model_bytes", "peak_rss_bytes", "peak_cuda_bytes", "images_per_s",
          "comm_bytes_model", "top1", "cpu", "cores", "gpu", "torch"]


def model_bytes(shard, parameters, processes):
    """Bytes per rank of weights + gradients + optimizer state (fp32, SGD's momentum) in the ZeRO model."""
    whole = 4 * parameters
    return {"none": 3 * whole, "optimizer": 2 * whole + whole / processes,
            "grad-op": whole + 2 * whole / processes, "full": 3 * whole / processes}[shard]


def comm_bytes(shard, parameters, processes):
    """Bytes each rank sends per step in the ring algorithms of the mode (fp32)."""
    a = (processes - 1) / processes * 4 * parameters
    return {"none": 2 * a, "optimizer": 3 * a, "grad-op": 2 * a, "full": 3 * a}[shard]


def count_parameters(arch, num_classes, image_size):
    from recipes.common import models
    return sum(p.numel() for p in models.build_model(arch, num_classes, image_size).parameters())


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/imagenet-like")
    parser.add_argument("-a", "--arch", nargs="+", default=["resnet50", "vit_tiny"])
    parser.add_argument("--image-size", type=int, nargs="+", default=[32, 28], help="one for each -a, in order")
    parser.add_argument("-b", "--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    parser.add_argument("--runs", default="runs/figures/sharding", help="where the run directories go")
    parser.add_argument("--csv", default="figures/data/sharding.csv")
    args = parser.parse_args()
    if not (Path(args.data) / "train").is_dir():
        measuring.bad_input(f"{args.data} has no train/ folder; run `python scripts/make_demo_data.py "
                            f"--imagenet-like {args.data}` first")
    cuda = torch.cuda.is_available()
    if cuda and max(args.processes) > torch.cuda.device_count():
        measuring.bad_input(f"--processes {max(args.processes)} needs as many GPUs; this machine has "
                            f"{torch.cuda.device_count()}")
    if len(args.image_size) != len(args.arch):
        measuring.bad_input(f"--image-size takes one size for each -a: {len(args.arch)} models, "
                            f"{len(args.image_size)} sizes")
    num_classes = sum(1 for path in (Path(args.data) / "train").iterdir() if path.is_dir())
    machine, rows = measuring.hardware(), []
    parameters = {arch: count_parameters(arch, num_classes, size) for arch, size in zip(args.arch, args.image_size)}
    for (arch, image_size), processes, shard in itertools.product(zip(args.arch, args.image_size), args.processes,
                                                                  args.modes):
        flags = [args.data, "-a", arch, "--image-size", str(image_size), "-b", str(args.batch_size),
                 "--epochs", "1", "--seed", "0", "-j", "0", "-p", "1000", "--shard", shard, "--opt-level", "O0"]
        out = Path(args.runs) / f"{arch}-{shard}-n{processes}"
        summary = measuring.train("fsdp", processes, flags, out, threads=4 if cuda else 1, forked=not cuda)
        for checkpoint in out.glob("*.pt"):  # 190 MB each for ResNet-50; the table needs only summary.json
            checkpoint.unlink()
        largest = {name: max(summary[name]) for name in ("param_bytes", "grad_bytes", "optimizer_bytes",
                                                           "peak_rss_bytes")}
        rows.append({"shard": shard, "zero": ZERO[shard], "processes": processes, "arch": arch,
                     "image_size": image_size, "batch": args.batch_size, "parameters": parameters[arch],
                     **largest, "state_bytes": max(p + g + o for p, g, o in zip(
                         summary["param_bytes"], summary["grad_bytes"], summary["optimizer_bytes"])),
                     "model_bytes": round(model_bytes(shard, parameters[arch], processes)),
                     "peak_cuda_bytes": max(summary["peak_cuda_bytes"]) if "peak_cuda_bytes" in summary else "",
                     "images_per_s": round(summary["images_per_s"], 1),
                     "comm_bytes_model": round(comm_bytes(shard, parameters[arch], processes)),
                     "top1": round(summary["top1"], 2), **machine})
        print(f"{arch}, {shard} at {processes}: {largest['param_bytes'] / 2**20:.1f} + "
              f"{largest['grad_bytes'] / 2**20:.1f} + {largest['optimizer_bytes'] / 2**20:.1f} MiB per rank, "
              f"{summary['images_per_s']:.1f} images/s", flush=True)
        measuring.write_csv(Path(args.csv), FIELDS, rows)
    measuring.record_part(Path(args.csv).parent, "sharding", started)


if __name__ == "__main__":
    main()
