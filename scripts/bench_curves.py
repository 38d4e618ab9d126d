"""Train nd, ddp and apex on the digits, 3 seeds each, and keep their per-epoch metrics for the figures.

    python scripts/bench_curves.py                  # data/mnist5k, lenet, 15 epochs, seeds 0 1 2
    python scripts/bench_curves.py --data DIR --quick --figures-data OUT   # lenet at 16 px, for tests

nd trains with batch 64 in one process; ddp and apex with 2 processes of 32 (on a
machine with one GPU, one process), so the three see the same global batch and
learning rate; each process gets cores / processes threads. (On a CPU the apex
recipe runs in fp32, as it does by default where there is no fast low precision;
on a GPU it is fp16.) The set-up is scripts/measuring.py's ACCURACY. Each run
directory is runs/figures/curves/<recipe>-seed<S>; its metrics.csv and
summary.json are copied to <figures-data>/curves/<recipe>-seed<S>.csv and .json.
A run whose summary.json is complete is not trained again.
"""

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import measuring  # noqa: E402

RECIPES = {"nd": 1, "ddp": 2, "apex": 2}  # processes


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=measuring.ACCURACY_EPOCHS)
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--global-batch", type=int, default=64, help="split evenly between the processes")
    parser.add_argument("--quick", action="store_true", help="lenet at 16 px, for tests and QUICK=1")
    parser.add_argument("--runs", default="runs/figures/curves", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where the metrics are copied")
    args = parser.parse_args()
    measuring.require_digits(args.data)
    copies = Path(args.figures_data) / "curves"
    shutil.rmtree(copies, ignore_errors=True)  # only this run's seeds and recipes are drawn
    copies.mkdir(parents=True)
    import torch
    gpus = torch.cuda.device_count()
    for recipe, processes in RECIPES.items():
        processes = min(processes, gpus) if gpus else processes  # one process per GPU
        for seed in args.seeds:
            out = Path(args.runs) / f"{recipe}-seed{seed}"
            flags = [args.data, *(measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY),
                     "-b", str(args.global_batch // processes), "--epochs", str(args.epochs), "--seed", str(seed)]
            threads = max(1, measuring.usable_cores() // processes)
            summary = measuring.train(recipe, processes, flags, out, threads)
            print(f"{recipe} seed {seed}: {processes} process(es), {args.epochs} epochs, top-1 "
                  f"{summary['top1']:.2f} %", flush=True)
            shutil.copy(out / "metrics.csv", copies / f"{recipe}-seed{seed}.csv")
            shutil.copy(out / "summary.json", copies / f"{recipe}-seed{seed}.json")
    measuring.record_part(args.figures_data, "curves", started)


if __name__ == "__main__":
    main()
