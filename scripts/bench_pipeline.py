"""Pipelined replicas on the digits: each sync method at 2, 4 and 8 replicas, with and without
stragglers, beside the expected-maximum model; and the bubble.

    python scripts/bench_pipeline.py     # figures/data/pipeline.csv and pipeline_curves.csv
    python scripts/bench_pipeline.py --quick --seeds 0 --epochs 1   # a few rows at 16 px, for QUICK=1

sync    R = 2, 4 and 8 replicas of one stage, and 4 replicas x 2 stages (hetpipe: and its servers),
        lenet at 28 px (scripts/measuring.py's ACCURACY), -b 8 per replica (2 microbatches under
        1f1b with 2 stages), EPOCHS epochs; allreduce, preduce, adpsgd and hetpipe, each without
        stragglers and with SD-PIPE's (--hetero 0.1: a process sleeps 0.1 s with probability 0.1
        before each forward and each backward slot), for every seed (3 by default): updates/s, the
        seconds to reach TARGET % top-1, the final top-1, group sizes. A step computes for a few
        milliseconds, a tenth of the sleep or less, so the sleeps, not the 2 cores, set the pace.
bubble  one replica of 2 stages, -b 256, --microbatches 1, 2, 4, 8, 16 under gpipe and 1f1b (which
        needs M >= S), one epoch of seed 0: images/s beside the model's bubble (S - 1) / (M + S - 1).

The model of what stragglers cost (expected_delay, slowdown): a replica's step computes for c
seconds (measured: the run without stragglers) and sleeps X for each of its n = 2 M S slots that
draws a straggler (probability q), so its delay is X x Binomial(n, q). A method that waits for the
slowest of k replicas at every step takes c + E[max of k delays] per step: allreduce k = R,
adpsgd k = 2 (a partner; the chain of partners makes it a lower bound). Partial reduce waits for
nobody but at its connectivity syncs: c + E[delay] + (E[max of R] - E[delay]) / 10. HetPipe, as
SD-PIPE runs it (no staleness bound), waits only at the epoch's end, for the slowest replica's whole
epoch of T steps: c + E[delay] + (E[max of R sums of T delays] - T E[delay]) / T.
Runs go to runs/figures/pipeline/<name>-seed<S>; a run whose summary.json is complete is not
trained again. The processes are forked as scripts/measuring.py's run_forked forks them.
"""

import argparse
import csv
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import measuring  # noqa: E402

LAYOUTS = [(1, 2), (1, 4), (1, 8), (2, 4)]  # (stages, replicas)
SYNCS = ["allreduce", "preduce", "adpsgd", "hetpipe"]
HETERO, HETERO_PROB = 0.1, 0.1  # SD-PIPE's straggler: X seconds, with this probability before each slot
WAVE = 10  # hetpipe's minibatches between pulls (the recipe's default, SD-PIPE's)
CHECK_EVERY = 10  # preduce's connectivity sync: every 10 R updates (recipes/pipeline/preduce.py)
TARGET = 90.0  # % top-1: the time-to-accuracy column
EPOCHS = 1
MICROBATCHES = [1, 2, 4, 8, 16]
FIELDS = ["part", "sync", "hetero", "schedule", "microbatches", "batch", "stages", "replicas", "processes", "seed",
          "epochs", "top1", "images_per_s", "updates_per_s", "step_s", "train_s", "seconds_to_target", "target",
          "waits", "full_syncs", "partial_syncs", "connectivity_syncs", "mean_group_size",
          "longest_unconnected_updates", "disagreement", "max_applied_staleness", "cpu", "cores", "gpu", "torch"]
BATCH = {"sync": 8, "bubble": 256}  # per replica
CURVE_FIELDS = ["sync", "hetero", "stages", "replicas", "seed", "epoch", "seconds", "top1"]


def plan(seeds, quick=False):
    """Every run: (part, sync, hetero, stages, replicas, schedule, microbatches, seed), seed by seed, then the
    bubble sweep."""
    layouts, syncs, microbatches = ([(1, 2), (2, 2)], ["allreduce", "preduce"], [1, 4]) if quick else \
        (LAYOUTS, SYNCS, MICROBATCHES)
    runs = [("sync", sync, hetero, stages, replicas, "1f1b", stages, seed) for seed in seeds
            for stages, replicas in layouts for hetero in (0.0, HETERO) for sync in syncs]
    runs += [("bubble", "allreduce", 0.0, 2, 1, schedule, m, seeds[0]) for m in microbatches
             for schedule in ("gpipe", "1f1b") if schedule == "gpipe" or m >= 2]  # (1f1b needs M >= S)
    return runs


def flags_of(part, sync, hetero, stages, replicas, schedule, microbatches, seed, args):
    """The processes and flags of one run."""
    model = measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY
    epochs = args.epochs if part == "sync" else 1
    flags = [args.data, *model, "--epochs", str(epochs), "--seed", str(seed), "-p", "1000", "--dist-timeout", "120",
             "--stages", str(stages), "--microbatches", str(microbatches), "--schedule", schedule, "--sync", sync,
             "--hetero", str(hetero), "--hetero-prob", str(HETERO_PROB), "--wave", str(WAVE),
             "-b", str(BATCH[part]), "--warmup-epochs", "0"]
    return stages * (replicas + (sync == "hetpipe")), flags


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


# ---- the expected-maximum model --------------------------------------------------------------------------

def binomial_cdf(n, q):
    """[P(B <= k) for k = 0..n] of B ~ Binomial(n, q)."""
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(q) +
                    (n - k) * math.log1p(-q)) for k in range(n + 1)]  # (in logs: an epoch's slots overflow comb)
    return [sum(pmf[:k + 1]) for k in range(n + 1)]


def expected_max(k, n, q, x):
    """E[max of k independent X x Binomial(n, q)]: the sum over j >= 1 of X P(max >= j)."""
    cdf = binomial_cdf(n, q)
    return x * sum(1 - cdf[j - 1] ** k for j in range(1, n + 1))


def expected_delay(sync, replicas, stages, microbatches, steps, x=HETERO, q=HETERO_PROB):
    """The model's seconds per step that stragglers add to a replica, for one sync method (steps: a replica's
    steps per epoch)."""
    slots = 2 * microbatches * stages  # a replica's slots per step, over its stages' processes
    own = slots * q * x
    if sync == "allreduce":
        return expected_max(replicas, slots, q, x)
    if sync == "adpsgd":
        return expected_max(min(2, replicas), slots, q, x)
    if sync == "preduce":
        return own + (expected_max(replicas, slots, q, x) - own) / CHECK_EVERY
    return own + (expected_max(replicas, slots * steps, q, x) - own * steps) / steps  # hetpipe


def steps_of(rows):
    """A replica's steps per epoch in these rows of pipeline.csv (updates of all replicas over the epochs)."""
    return round(sum(float(r["updates_per_s"]) * float(r["train_s"]) / int(r["replicas"]) / int(r["epochs"])
                     for r in rows) / len(rows))


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--quick", action="store_true", help="a few rows of lenet at 16 px, for tests and QUICK=1")
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--runs", default="runs/figures/pipeline", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where the CSV files go")
    args = parser.parse_args()
    measuring.require_digits(args.data)
    machine, rows, curves = measuring.hardware(), [], []
    for part, sync, hetero, stages, replicas, schedule, microbatches, seed in plan(args.seeds, args.quick):
        name = f"{part}-{sync}-hetero{hetero:g}-{stages}x{replicas}-{schedule}-m{microbatches}"
        out = Path(args.runs) / f"{name}-seed{seed}"
        processes, flags = flags_of(part, sync, hetero, stages, replicas, schedule, microbatches, seed, args)
        summary = measuring.train("pipeline", processes, flags, out, threads=1, forked=True)
        points = curve(out)
        reached = [seconds for _, seconds, top1 in points if top1 >= TARGET]
        train_s = measuring.train_seconds(out)
        updates = sum(summary["updates_per_replica"])
        rows.append({"part": part, "sync": sync, "hetero": hetero, "schedule": schedule, "microbatches": microbatches,
                     "batch": BATCH[part], "stages": stages, "replicas": summary["replicas"],
                     "processes": processes, "seed": seed, "epochs": summary["epochs"],
                     "top1": round(summary["top1"], 2), "images_per_s": round(summary["images_per_s"], 1),
                     "updates_per_s": round(updates / train_s, 2), "step_s": round(train_s * replicas / updates, 5),
                     "train_s": round(train_s, 2), "seconds_to_target": reached[0] if reached else "",
                     "target": TARGET, **{key: round(summary[key], 6) for key in FIELDS[18:26]}, **machine})
        if part == "sync":
            curves += [{"sync": sync, "hetero": hetero, "stages": stages, "replicas": replicas, "seed": seed,
                        "epoch": epoch, "seconds": seconds, "top1": top1} for epoch, seconds, top1 in points]
        print(f"{name} seed {seed}: top-1 {summary['top1']:.2f} %, {updates / train_s:.1f} updates/s, "
              f"waits {summary['waits']:g}", flush=True)
        measuring.write_csv(Path(args.figures_data) / "pipeline.csv", FIELDS, rows)
        measuring.write_csv(Path(args.figures_data) / "pipeline_curves.csv", CURVE_FIELDS, curves)
    measuring.record_part(args.figures_data, "pipeline", started)


if __name__ == "__main__":
    main()
