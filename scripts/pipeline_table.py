"""Pipelined replicas on the digits: each sync method with and without stragglers, and the bubble.

    python scripts/pipeline_table.py     # figures/data/pipeline.csv and pipeline_curves.csv
    python scripts/pipeline_table.py --quick --seeds 0 --epochs 1   # a few rows at 16 px, for QUICK=1

sync    2 stages x 2 replicas (hetpipe: and its 2 servers), lenet at 28 px (scripts/measuring.py's
        ACCURACY), -b 32 per replica in 4 microbatches under 1f1b, 3 epochs; allreduce, preduce
        (P = 2, T = 8, 50 ms), adpsgd and hetpipe (D = 2), each without stragglers and with
        --hetero 0.2 (every process sleeps 0.2 s at a step with probability 0.1), for every
        seed (3 by default): images/s, the seconds to reach TARGET % top-1 and the final top-1.
bubble  one replica of 2 stages, -b 256, --microbatches 1, 2, 4, 8, 16 under gpipe and 1f1b (which
        needs M >= S), one epoch of seed 0: images/s beside the model's bubble (S - 1) / (M + S - 1).
Lenet splits into a first stage of 1.9 and a second of 5.2 MFLOPs per image: the slower stage
bounds the pipeline, as it would on any unbalanced split. Each row is one run; the top-1 of
every epoch and the seconds to it (training and evaluation, summed) go to pipeline_curves.csv.
Runs go to runs/figures/pipeline/<name>-seed<S>; a run whose summary.json is complete is not
trained again. The processes are forked as scripts/measuring.py's run_forked forks them.
"""

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import measuring  # noqa: E402

STAGES, REPLICAS = 2, 2
SYNCS = ["allreduce", "preduce", "adpsgd", "hetpipe"]
HETERO = 0.2  # seconds; with --hetero-prob 0.1 (the recipe's default), SD-PIPE's straggler model
TARGET = 95.0  # % top-1: the time-to-accuracy column
MICROBATCHES = [1, 2, 4, 8, 16]
FIELDS = ["part", "sync", "hetero", "schedule", "microbatches", "batch", "stages", "replicas", "processes", "seed",
          "epochs", "top1", "images_per_s", "train_s", "seconds_to_target", "target", "waits", "full_syncs",
          "partial_syncs", "disagreement", "max_applied_staleness", "cpu", "cores", "gpu", "torch"]
BATCH = {"sync": 32, "bubble": 256}  # per replica
CURVE_FIELDS = ["sync", "hetero", "seed", "epoch", "seconds", "top1"]


def plan(seeds, quick=False):
    """Every run: (part, sync, hetero, schedule, microbatches, seed), seed by seed, then the bubble sweep."""
    syncs, microbatches = (["allreduce", "preduce"], [1, 4]) if quick else (SYNCS, MICROBATCHES)
    runs = [("sync", sync, hetero, "1f1b", 4, seed) for seed in seeds for hetero in (0.0, HETERO) for sync in syncs]
    runs += [("bubble", "allreduce", 0.0, schedule, m, seeds[0]) for m in microbatches for schedule in ("gpipe", "1f1b")
             if schedule == "gpipe" or m >= STAGES]  # (1f1b needs M >= S)
    return runs


def flags_of(part, sync, hetero, schedule, microbatches, seed, args):
    """The processes and flags of one run."""
    model = measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY
    replicas = REPLICAS if part == "sync" else 1
    epochs = args.epochs if part == "sync" else 1
    flags = [args.data, *model, "--epochs", str(epochs), "--seed", str(seed), "-p", "1000", "--dist-timeout", "120",
             "--stages", str(STAGES), "--microbatches", str(microbatches), "--schedule", schedule, "--sync", sync,
             "--hetero", str(hetero)]
    flags += ["-b", str(BATCH[part])] + ([] if part == "sync" else ["--warmup-epochs", "0"])  # (one epoch)
    return STAGES * (replicas + (sync == "hetpipe")), flags


def curve(out):
    """(epoch, seconds so far, val top-1) of each epoch of a run directory: training and evaluation, summed."""
    with open(Path(out) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    points, seconds = [], 0.0
    for row in rows:
        seconds += float(row["epoch_s"])
        if row["split"] == "val":
            points.append((int(row["epoch"]), round(seconds, 2), round(float(row["top1"]), 2)))
    return points


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a few rows of lenet at 16 px, for tests and QUICK=1")
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--runs", default="runs/figures/pipeline", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where the CSV files go")
    args = parser.parse_args()
    if not (Path(args.data) / "train").is_dir():
        sys.exit(f"error: {args.data} has no train/ folder; run `python scripts/make_demo_data.py` first")
    machine, rows, curves = measuring.hardware(), [], []
    for part, sync, hetero, schedule, microbatches, seed in plan(args.seeds, args.quick):
        name = f"{part}-{sync}-hetero{hetero:g}-{schedule}-m{microbatches}"
        out = Path(args.runs) / f"{name}-seed{seed}"
        processes, flags = flags_of(part, sync, hetero, schedule, microbatches, seed, args)
        summary = measuring.train("pipeline", processes, flags, out, threads=1, forked=True)
        points = curve(out)
        reached = [seconds for _, seconds, top1 in points if top1 >= TARGET]
        rows.append({"part": part, "sync": sync, "hetero": hetero, "schedule": schedule, "microbatches": microbatches,
                     "batch": BATCH[part], "stages": summary["stages"], "replicas": summary["replicas"],
                     "processes": processes, "seed": seed, "epochs": summary["epochs"],
                     "top1": round(summary["top1"], 2),
                     "images_per_s": round(summary["images_per_s"], 1),
                     "train_s": round(measuring.train_seconds(out), 2),
                     "seconds_to_target": reached[0] if reached else "", "target": TARGET,
                     **{key: round(summary[key], 6) for key in FIELDS[16:21]}, **machine})
        if part == "sync":
            curves += [{"sync": sync, "hetero": hetero, "seed": seed, "epoch": epoch, "seconds": seconds, "top1": top1}
                       for epoch, seconds, top1 in points]
        print(f"{name} seed {seed}: top-1 {summary['top1']:.2f} %, {summary['images_per_s']:.1f} images/s, "
              f"waits {summary['waits']:g}", flush=True)
        measuring.write_csv(Path(args.figures_data) / "pipeline.csv", FIELDS, rows)
        measuring.write_csv(Path(args.figures_data) / "pipeline_curves.csv", CURVE_FIELDS, curves)
    measuring.record_part(args.figures_data, "pipeline", started)


if __name__ == "__main__":
    main()
