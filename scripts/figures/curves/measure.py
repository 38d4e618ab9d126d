"""Train nd, ddp and apex on the digits, 3 seeds each, and keep their per-epoch metrics for the figures.

    python scripts/figures/curves/measure.py                  # data/mnist5k, lenet, 15 epochs, seeds 0 1 2
    python scripts/figures/curves/measure.py --data DIR --quick --figures-data OUT   # lenet at 16 px, for tests

nd trains with batch 64 in one process; ddp and apex with 2 processes of 32 (on a
machine with one GPU, one process), so they all see the same global batch and
learning rate; ddp-vit is ddp with the small vision transformer (-a vit_tiny) in
lenet's place, the same flags otherwise; each process gets cores / processes threads. apex runs twice: at
--opt-level O0 (fp32: the recipe's plumbing, with ddp's arithmetic), at O1 in
low precision (apex-low: bf16 on a CPU, fp16 on a GPU) and at O2 (apex-O2: the
weights in that precision, fp32 master copies), the last two only where
the machine runs it natively (a CPU with AVX512-BF16 or AMX-BF16; any CUDA GPU);
where it does not, curves/left_out.json says why. The set-up is
scripts/figures/measuring.py's ACCURACY. Each run directory is
runs/figures/curves/<name>-seed<S>; its metrics.csv and summary.json are copied to
<figures-data>/curves/<name>-seed<S>.csv and .json, and the machine (its CPU's
precision flags too) to curves/hardware.json. A run whose summary.json is complete
is not trained again.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from recipes.common import amp  # noqa: E402
from scripts.figures import measuring  # noqa: E402

LOW = ("apex-low", "apex-O2")  # the runs in low precision: where the machine runs it natively
RUNS = [("nd", "nd", 1, []), ("ddp", "ddp", 2, []), ("apex", "apex", 2, ["--opt-level", "O0"]),
        ("apex-low", "apex", 2, ["--opt-level", "O1"]), ("apex-O2", "apex", 2, ["--opt-level", "O2"]),
        ("ddp-vit", "ddp", 2, ["-a", "vit_tiny"])]  # (name, recipe, processes, flags)
VIT_QUICK_SIZE = ["--image-size", "14"]  # (--quick trains at 16 px, which vit_tiny's 7 x 7 patches do not divide)


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=measuring.ACCURACY_EPOCHS)
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--global-batch", type=int, default=64, help="split evenly between the processes")
    parser.add_argument("--quick", action="store_true",
                        help="lenet at 16 px, the processes forked (measuring.run_forked), for tests and QUICK=1")
    parser.add_argument("--runs", default="runs/figures/curves", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where the metrics are copied")
    args = parser.parse_args()
    measuring.require_digits(args.data)
    copies = Path(args.figures_data) / "curves"
    shutil.rmtree(copies, ignore_errors=True)  # only this run's seeds and recipes are drawn
    copies.mkdir(parents=True)
    import torch
    gpus = torch.cuda.device_count()
    flags_found = measuring.cpu_flags()
    machine = {**measuring.hardware(), "cpu_flags": flags_found}
    (copies / "hardware.json").write_text(json.dumps(machine, indent=2) + "\n")
    low = gpus or amp.cpu_has_native_bf16()  # (where the recipe's own default is O1 too)
    if not low:  # (autocast in bf16 runs 9x to 16x slower than fp32 there: recipes/common/amp.py)
        why = (f"this CPU has no native bf16 (/proc/cpuinfo lists {flags_found or 'none'} of "
               f"{' '.join(measuring.PRECISION_FLAGS)})")
        (copies / "left_out.json").write_text(json.dumps(dict.fromkeys(LOW, why), indent=2) + "\n")
    for name, recipe, processes, recipe_flags in RUNS:
        if name in LOW and not low:
            continue
        processes = min(processes, gpus) if gpus else processes  # one process per GPU
        for seed in args.seeds:
            out = Path(args.runs) / f"{name}-seed{seed}"
            flags = [args.data, *(measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY), *recipe_flags,
                     *(VIT_QUICK_SIZE if args.quick and "vit_tiny" in recipe_flags else []),
                     "-b", str(args.global_batch // processes), "--epochs", str(args.epochs), "--seed", str(seed)]
            threads = max(1, measuring.usable_cores() // processes)
            summary = measuring.train(recipe, processes, flags, out, threads, forked=args.quick)
            print(f"{name} seed {seed}: {processes} process(es), {args.epochs} epochs, top-1 "
                  f"{summary['top1']:.2f} %", flush=True)
            shutil.copy(out / "metrics.csv", copies / f"{name}-seed{seed}.csv")
            shutil.copy(out / "summary.json", copies / f"{name}-seed{seed}.json")
    measuring.record_part(args.figures_data, "curves", started)


if __name__ == "__main__":
    main()
