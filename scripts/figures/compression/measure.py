"""Serial, data-parallel and compressed data-parallel training on the digits: time, accuracy and bytes.

    python scripts/figures/compression/measure.py     # figures/data/compression.csv (then plot_results.py draws it)

On data/mnist5k, with the same epochs and global batch, for each of 3 seeds, it trains
  nd                   serial: one process
  compression          at 2 and 4 processes (gloo): --compress none (DDP's fp32
                       allreduce), fp16, bf16, fp8-e4m3, fp8-e5m2 and powersgd, and
                       the fp8s and PowerSGD again with --error-feedback
and keeps each run's training time (the train epochs' seconds summed), final
validation top-1, bytes per step and compression ratio in compression.csv, one
row per run. The set-up is scripts/figures/measuring.py's ACCURACY. Each process gets
cores / processes threads (at least 1). Run directories go to
runs/figures/compression/<method>[-ef]-<processes>-seed<S>; a run whose
summary.json is complete is not trained again.

--parts cluster (make figures runs both: accuracy cluster) trains the same methods on the virtual cluster, at 2 and 4
nodes over links sized after real clusters': scripts/figures/compression/cluster.py (it needs root).
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.figures import measuring  # noqa: E402
from scripts.figures.compression import cluster  # noqa: E402

METHODS = [("none", False), ("fp16", False), ("bf16", False), ("fp8-e4m3", False), ("fp8-e4m3", True),
           ("fp8-e5m2", False), ("fp8-e5m2", True), ("powersgd", False), ("powersgd", True)]
FIELDS = ["method", "error_feedback", "processes", "seed", "threads", "arch", "epochs", "global_batch", "train_s",
          "wall_s", "top1", "top5", "bytes_per_step", "compression_ratio", "cpu", "cores", "gpu", "torch"]


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=measuring.ACCURACY_EPOCHS)
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--global-batch", type=int, default=64, help="split evenly between the processes")
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--methods", nargs="+", help="a subset of the --compress values (default: all, and the "
                                                     "fp8s and powersgd with --error-feedback too)")
    parser.add_argument("--quick", action="store_true",
                        help="lenet at 16 px, the processes forked (measuring.run_forked), for tests and QUICK=1")
    parser.add_argument("--runs", default="runs/figures/compression", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where compression.csv goes")
    parser.add_argument("--parts", nargs="+", choices=["accuracy", "cluster"], default=["accuracy", "cluster"],
                        help="accuracy: the table above, on this machine; cluster: the rows on the virtual cluster")
    parser.add_argument("--cluster-nodes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--cluster-epochs", type=int, default=8)
    args = parser.parse_args()
    measuring.require_digits(args.data)
    bad = [p for p in args.processes if p < 2 or args.global_batch % p]
    if bad:
        sys.exit(f"error: --processes {bad}: each must be 2 or more and divide --global-batch {args.global_batch}")
    methods = [(m, ef) for m, ef in METHODS if args.methods is None or m in args.methods]
    model = measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY
    machine, rows, runs = measuring.hardware(), [], Path(args.runs)

    def train(method, error_feedback, processes, seed):
        name = "serial" if method == "serial" else f"{method}{'-ef' if error_feedback else ''}-{processes}"
        flags = [args.data, *model, "--epochs", str(args.epochs), "--seed", str(seed),
                 "-b", str(args.global_batch // processes)]
        if method != "serial":
            flags += ["--compress", method, *(["--error-feedback"] if error_feedback else [])]
        threads = max(1, measuring.usable_cores() // processes)
        out = runs / f"{name}-seed{seed}"
        summary = measuring.train("nd" if method == "serial" else "compression", processes, flags, out, threads,
                                   forked=args.quick)
        train_s = measuring.train_seconds(out)
        rows.append({"method": method, "error_feedback": int(error_feedback), "processes": processes, "seed": seed,
                     "threads": threads, "arch": summary["arch"], "epochs": summary["epochs"],
                     "global_batch": summary["global_batch"], "train_s": round(train_s, 2),
                     "wall_s": round(summary["wall_s"], 2), "top1": round(summary["top1"], 2),
                     "top5": round(summary["top5"], 2),
                     "bytes_per_step": round(summary.get("bytes_per_step") or 0) or "",  # (none for serial)
                     "compression_ratio": round(summary.get("compression_ratio") or 0, 3) or "", **machine})
        print(f"{method:>9}{' +EF' if error_feedback else '    '} {processes} process(es) seed {seed}: "
              f"top-1 {summary['top1']:6.2f} %, training {train_s:6.1f} s", flush=True)

    if "accuracy" in args.parts:
        for seed in args.seeds:  # seed by seed: a stopped run leaves whole seeds of every row behind it
            train("serial", False, 1, seed)
            for processes in args.processes:
                for method, error_feedback in methods:
                    train(method, error_feedback, processes, seed)
        out = Path(args.figures_data) / "compression.csv"
        measuring.write_csv(out, FIELDS, rows)
        print(f"wrote {out}")
    if "cluster" in args.parts:
        cluster.measure(args, model, [(m, ef) for m, ef in cluster.METHODS
                                      if args.methods is None or m in args.methods])
    measuring.record_part(args.figures_data, "compression", started, adding=args.parts != ["accuracy", "cluster"])


if __name__ == "__main__":
    main()
