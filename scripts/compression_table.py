"""Serial, data-parallel and compressed data-parallel training on the digits: time, accuracy and bytes.

    python scripts/compression_table.py     # figures/data/compression.csv, figures/compression.png, RESULTS.md

On data/mnist5k, with the same seed, epochs and global batch, it trains
  nd                   serial: one process
  compression          at 2 and 4 processes (gloo): --compress none (DDP's fp32
                       allreduce), fp16, bf16, fp8-e4m3, fp8-e5m2 and powersgd, and
                       the fp8s and PowerSGD again with --error-feedback
and keeps each run's training time (the train epochs' seconds summed), final
validation top-1, bytes per step and compression ratio in compression.csv. Each
process gets cores / processes threads (at least 1). Then plot_results.py
redraws the figures and RESULTS.md.
"""

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.measuring import DEMO_MODEL, QUICK_MODEL, hardware, run, write_csv  # noqa: E402

METHODS = [("none", False), ("fp16", False), ("bf16", False), ("fp8-e4m3", False), ("fp8-e4m3", True),
           ("fp8-e5m2", False), ("fp8-e5m2", True), ("powersgd", False), ("powersgd", True)]
DEMO = [*DEMO_MODEL, "--lr", "0.05", "-j", "0", "--seed", "0"]
QUICK = [*QUICK_MODEL, "--lr", "0.05", "-j", "0", "--seed", "0"]
FIELDS = ["method", "error_feedback", "processes", "threads", "arch", "epochs", "global_batch", "train_s", "wall_s",
          "top1", "top5", "bytes_per_step", "compression_ratio", "cpu", "cores", "gpu", "torch"]


def train(recipe, processes, flags, out):
    """One run under torchrun (or plain python for one process); returns its summary and train seconds."""
    threads = max(1, (os.cpu_count() or 1) // processes)
    shutil.rmtree(out, ignore_errors=True)
    run(processes, [str(ROOT / "recipes" / recipe / "train.py"), *flags, "--out", str(out)], threads)
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "metrics.csv", newline="") as f:
        train_s = sum(float(row["epoch_s"]) for row in csv.DictReader(f) if row["split"] == "train")
    return summary, train_s, threads


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=64, help="split evenly between the processes")
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--methods", nargs="+", help="a subset of the --compress values (default: all, and the "
                                                     "fp8s and powersgd with --error-feedback too)")
    parser.add_argument("--quick", action="store_true", help="lenet at 16 px instead of ResNet-18 at 28 px")
    parser.add_argument("--runs", default="runs/compression", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where compression.csv goes")
    parser.add_argument("--figures", default="figures")
    parser.add_argument("--results", default="RESULTS.md")
    args = parser.parse_args()
    if not (Path(args.data) / "train").is_dir():
        sys.exit(f"error: {args.data} has no train/ folder; run `python scripts/make_demo_data.py` first")
    bad = [p for p in args.processes if p < 2 or args.global_batch % p]
    if bad:
        sys.exit(f"error: --processes {bad}: each must be 2 or more and divide --global-batch {args.global_batch}")
    methods = [(m, ef) for m, ef in METHODS if args.methods is None or m in args.methods]
    common = [args.data, *(QUICK if args.quick else DEMO), "--epochs", str(args.epochs)]
    machine, rows = hardware(), []

    def record(method, error_feedback, processes, summary, train_s, threads):
        rows.append({"method": method, "error_feedback": int(error_feedback), "processes": processes,
                     "threads": threads, "arch": summary["arch"], "epochs": summary["epochs"],
                     "global_batch": summary["global_batch"], "train_s": round(train_s, 2),
                     "wall_s": round(summary["wall_s"], 2), "top1": round(summary["top1"], 2),
                     "top5": round(summary["top5"], 2),
                     "bytes_per_step": round(summary.get("bytes_per_step") or 0) or "",  # (none for serial)
                     "compression_ratio": round(summary.get("compression_ratio") or 0, 3) or "", **machine})
        print(f"{method:>9}{' +EF' if error_feedback else '    '} {processes} process(es): "
              f"top-1 {summary['top1']:6.2f} %, training {train_s:6.1f} s", flush=True)

    runs = Path(args.runs)
    record("serial", False, 1, *train("nd", 1, [*common, "-b", str(args.global_batch)], runs / "serial"))
    for processes in args.processes:
        for method, error_feedback in methods:
            name = f"{method}{'-ef' if error_feedback else ''}-{processes}"
            flags = [*common, "-b", str(args.global_batch // processes), "--compress", method,
                     *(["--error-feedback"] if error_feedback else [])]
            record(method, error_feedback, processes, *train("compression", processes, flags, runs / name))
    out = Path(args.figures_data) / "compression.csv"
    write_csv(out, FIELDS, rows)
    print(f"wrote {out}")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_results.py"), "--data", args.figures_data,
                    "--figures", args.figures, "--results", args.results], check=True)


if __name__ == "__main__":
    main()
