"""Pipelined replicas on the digits: each sync method at R x S = 2, 4 and 8 x 1, 2 x 2, 4 x 2 and 2 x 4, under
SD-PIPE's PipeDream and under 1f1b, with and without stragglers, beside a model of what stragglers cost; and the
bubble.

    python scripts/figures/pipeline/measure.py     # figures/data/pipeline.csv, pipeline_curves.csv, pipeline_time.csv
    python scripts/figures/pipeline/measure.py --quick --seeds 0 --epochs 1   # a few rows at 16 px, for QUICK=1
    python scripts/figures/pipeline/measure.py --parts vit   # one part; the CSV keeps the others' rows
    python scripts/figures/pipeline/measure.py --parts time  # time to a target
    python scripts/figures/pipeline/measure.py --parts data  # the time part's 8 x 1 on SD-PIPE's streams (after it)
    python scripts/figures/pipeline/measure.py --parts bert  # the masked language model (--text data/pydoc)

sync    lenet at 28 px (scripts/figures/measuring.py's ACCURACY), -b 8 per replica (1f1b: S microbatches), EPOCHS
        epochs, one thread per process; allreduce, preduce, adpsgd and hetpipe, each without stragglers and with
        SD-PIPE's (a process sleeps X seconds with probability 0.1 before each forward and each backward slot of a
        minibatch), for every seed (3 by default): updates/s, the seconds to reach TARGET % top-1, the final top-1,
        group sizes. One stage runs under pipedream only (no pipeline: plain SGD steps).
        X is sized so that c / X is SD-PIPE's, C_OVER_X: c is allreduce's step without stragglers in the same
        layout and schedule (the first seed's), measured first. SD-PIPE's X is 0.1 s (--hetero 0.1, its
        artifacts/README.md) on GPUs that take about 0.05 s per minibatch at each of its 4 stages (ResNet-50,
        -b 64: a GPU of its time trains some 300-400 images/s), so c / X is about 0.5; this is an estimate,
        its paper gives no step time. On this machine's cores c is a few milliseconds to a tenth of a second.
        The lr is the recipe's (scaled to -b x R, so that allreduce trains DDP's model); SD-PIPE keeps its lr
        whatever R (train_resnet.py 63-64, 76-81; 0.01 at -b 64 per pipeline: artifacts/README.md 48).
vit     as sync, with the small vision transformer (-a vit_tiny at 28 px: 8 equal blocks, the stages equal by
        construction) in lenet's place: pipedream at R x S = 2 x 2 and 2 x 4, allreduce and preduce, without
        stragglers and with them (X sized the same way, from the transformer's own c), for every seed.
time    SD-PIPE's claim, time to a target accuracy: pipedream with stragglers at R x S = 4 x 1, 8 x 1, 2 x 2,
        4 x 2 and 2 x 4 (SD-PIPE's 4 stages), each sync method, TIME_EPOCHS epochs so that staleness can show in
        the accuracy, for every seed: the val top-1 of the model as it was every T seconds of training
        (--snapshot-every T: scored at each epoch's end, recipes/pipeline/snapshots.py) and after each epoch,
        against the seconds of training (pipeline_time.csv). X is sized as in the sync part and T is SNAPSHOTS
        to an epoch, both from the part's own allreduce run without stragglers in the layout (the first seed's,
        TIME_EPOCHS epochs), so that X and T are this machine's. The renderer sets each layout's target near the
        best method's final top-1.
data    the data each replica reads: the time part's runs at R x S = 8 x 1 (DATA_LAYOUT, its X and T) with
        --replica-data stream, SD-PIPE's (each pipeline streams the whole set shuffled by its own seed) in place
        of ddp's disjoint shards, each sync method, for every seed (pipeline_data.csv, as pipeline_time.csv).
bert    SD-PIPE's BERT measure, masked-LM loss against seconds: bert_tiny (recipes/common/models.py) on the
        pydoc topics (make_demo_data.py --text), cut as SD-PIPE cuts BERT, at R x S = 2 x 4 (their 4 stages) under
        PipeDream, AdamW (--lr 0.016: 1e-3 at -b 8 x 2, weight decay 0.01), a warm-up epoch, then the sync
        part's cosine decay (their BERT keeps its lr after 2,000 warm-up steps: train_bert 70), BERT_EPOCHS
        epochs; allreduce without stragglers (for X,
        sized as in the sync part from its own c), then each sync method with them, for every seed: the training
        and validation loss after each epoch and the seconds to it (pipeline_bert.csv).
bubble  one replica of 2 stages, -b 256, --microbatches 1, 2, 4, 8, 16 under gpipe and 1f1b (which needs M >= S),
        one epoch of seed 0: images/s beside the model's bubble (S - 1) / (M + S - 1).
cluster the time part's race at R x S = 4 x 1 and 8 x 1 (scored every T as it is) on the virtual cluster, a
        node a replica and one for HetPipe's servers, over links sized after a real cluster's
        (scripts/figures/pipeline/cluster.py; it needs root; --quick: 2 x 1).

The model of what stragglers cost (expected_step): a replica's minibatch takes c without stragglers (measured:
the same method's run without them), and sleeps X for each of its 2 S slots (a forward and a backward at each
stage) that draws a straggler (probability q): a delay of d = X x Binomial(2 S, q). A method that waits for the
slowest of k replicas at every minibatch takes E[c + the largest of k delays]: allreduce k = R, adpsgd k = 2 (a
partner; the chain of partners behind it is left out). Partial reduce waits for nobody but at its connectivity
syncs, one minibatch in 10: c + E[d] + (E[the largest of R] - E[d]) / 10. HetPipe, as SD-PIPE runs it (no
staleness bound), waits only at the epoch's end, for the slowest replica's whole epoch of T minibatches.
Processes that share cores: with P processes on K < P cores, c is what a minibatch takes while all P compute;
one with a core of its own computes in c1 = c K / P. A sleeping or waiting process hands its core to the others,
so a minibatch takes c + d with a core each, and max(c, c1 + d) when cores are shared: the expectation of that
over the lockstep methods' d, and max(c, c1 + E[d]) for the others, which do not wait together.
Runs go to runs/figures/pipeline/<name>-seed<S>; a run whose summary.json is complete is not
trained again. --parts measures only the parts named and keeps the rows of the others in the CSV files as they
were measured (each row names its machine), and adds the time of the runs it trains to the part's in timings.csv.
The processes are forked as scripts/figures/measuring.py's run_forked forks them.
"""

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.figures import measuring  # noqa: E402
from scripts.figures.pipeline import cluster  # noqa: E402

LAYOUTS = [(1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2)]  # (stages S, replicas R)
SYNCS = ["allreduce", "preduce", "adpsgd", "hetpipe"]
C_OVER_X = 0.5  # a minibatch's time against the straggler's sleep: SD-PIPE's, about (see above)
HETERO_PROB = 0.1  # SD-PIPE's: the chance of a sleep before each slot
WAVE = 10  # hetpipe's minibatches between pulls (the recipe's default, SD-PIPE's)
CHECK_EVERY = 10  # preduce's connectivity sync: at each multiple of 10 R updates (recipes/pipeline/preduce.py)
TARGET = 90.0  # % top-1: the time-to-accuracy column
EPOCHS = 1
MICROBATCHES = [1, 2, 4, 8, 16]
FIELDS = ["part", "sync", "hetero", "schedule", "microbatches", "batch", "stages", "replicas", "processes", "seed",
          "epochs", "top1", "images_per_s", "updates_per_s", "step_s", "train_s", "seconds_to_target", "target",
          "waits", "full_syncs", "partial_syncs", "connectivity_syncs", "mean_group_size",
          "longest_unconnected_updates", "disagreement", "max_applied_staleness", "stop_checks_every", "cpu", "cores",
          "gpu", "torch"]
BATCH = {"sync": 8, "vit": 8, "time": 8, "data": 8, "bert": 8, "bubble": 256}  # per replica
PARTS = ["sync", "vit", "time", "data", "bert", "bubble", "cluster"]
DATA_LAYOUT = (1, 8)  # (stages S, replicas R): the data part's, the most replicas, each shard an eighth
TIME_LAYOUTS, TIME_EPOCHS = [(1, 4), (1, 8), (2, 2), (2, 4), (4, 2)], 5  # (stages S, replicas R); the time part's
SNAPSHOTS = 4  # the time part's --snapshot-every: a quarter of allreduce's straggler-free epoch
BERT_LAYOUT, BERT_EPOCHS = (4, 2), 8  # (stages S, replicas R): SD-PIPE's 4 stages; epochs of the bert part
BERT = ["-a", "bert_tiny", "--optimizer", "adamw", "--lr", "0.016", "--weight-decay", "0.01"]
VIT_LAYOUTS, VIT_SYNCS = [(2, 2), (4, 2)], ["allreduce", "preduce"]  # (stages S, replicas R): R x S = 2 x 2, 2 x 4
VIT = ["-a", "vit_tiny"]  # (in place of ACCURACY's lenet, at its 28 px)
CURVE_FIELDS = ["sync", "hetero", "schedule", "stages", "replicas", "seed", "epoch", "seconds", "top1"]
TIME_FIELDS = CURVE_FIELDS + ["snapshot", "cpu", "cores", "gpu", "torch"]  # (snapshot: 1 within an epoch, 0 its end)
BERT_FIELDS = ["sync", "hetero", "stages", "replicas", "seed", "epoch", "seconds", "train_loss", "val_loss", "top1",
               "cpu", "cores", "gpu", "torch"]


def schedules_of(stages):
    return ["pipedream"] if stages == 1 else ["pipedream", "1f1b"]


def plan(seeds, quick=False, parts=PARTS):
    """Every run: (part, sync, stragglers, stages, replicas, schedule, microbatches, seed), seed by seed, each
    layout's runs without stragglers before those with (X is sized from them); the transformer's (not in
    --quick); then the bubble sweep. Only the runs of `parts`."""
    layouts, syncs, microbatches = ([(1, 2), (2, 2)], ["allreduce", "preduce"], [1, 4]) if quick else \
        (LAYOUTS, SYNCS, MICROBATCHES)
    runs = [("sync", sync, stragglers, stages, replicas, schedule, 1 if schedule == "pipedream" else stages, seed)
            for seed in seeds for stages, replicas in layouts for schedule in schedules_of(stages)
            for stragglers in (False, True) for sync in syncs]
    runs += [("vit", sync, stragglers, stages, replicas, "pipedream", 1, seed) for seed in seeds
             for stages, replicas in ([] if quick else VIT_LAYOUTS) for stragglers in (False, True)
             for sync in VIT_SYNCS]
    runs += [("time", sync, stragglers, stages, replicas, "pipedream", 1, seed) for seed in seeds
             for stages, replicas in ([] if quick else TIME_LAYOUTS)
             for stragglers, sync in [*([(False, "allreduce")] if seed == seeds[0] else []),
                                      *((True, sync) for sync in SYNCS)]]
    runs += [("data", sync, True, *DATA_LAYOUT, "pipedream", 1, seed) for seed in ([] if quick else seeds)
             for sync in SYNCS]
    runs += [("bert", sync, stragglers, *BERT_LAYOUT, "pipedream", 1, seed) for seed in ([] if quick else seeds)
             for stragglers, sync in [(False, "allreduce"), *((True, sync) for sync in SYNCS)]]
    runs += [("bubble", "allreduce", False, 2, 1, schedule, m, seeds[0]) for m in microbatches
             for schedule in ("gpipe", "1f1b") if schedule == "gpipe" or m >= 2]  # (1f1b needs M >= S)
    return [run for run in runs if run[0] in parts]


def flags_of(part, sync, hetero, stages, replicas, schedule, microbatches, seed, args, snapshot_every=None):
    """The processes and flags of one run (hetero: X in seconds, 0 without stragglers; snapshot_every: T)."""
    model = [*(measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY), *(VIT if part == "vit" else []),
             *(BERT if part == "bert" else [])]
    epochs = {"sync": args.epochs, "vit": args.epochs, "time": TIME_EPOCHS, "data": TIME_EPOCHS,
              "bert": BERT_EPOCHS}.get(part, 1)
    flags = [args.text if part == "bert" else args.data, *model, "--epochs", str(epochs), "--seed", str(seed),
             "-p", "1000", "--dist-timeout", "120",
             "--stages", str(stages), "--microbatches", str(microbatches), "--schedule", schedule, "--sync", sync,
             "--hetero", f"{hetero:g}", "--hetero-prob", str(HETERO_PROB), "--wave", str(WAVE),
             "-b", str(BATCH[part]), "--warmup-epochs", str(int(part == "bert")),
             *(["--snapshot-every", f"{snapshot_every:g}"] if snapshot_every else []),
             *(["--replica-data", "stream"] if part == "data" else [])]
    return stages * (replicas + (sync == "hetpipe")), flags


def curve(out):
    """(epoch, seconds so far, val top-1) of each epoch of a run directory: training and evaluation, summed."""
    return [(epoch, seconds, top1) for epoch, seconds, _, _, top1 in loss_curve(out)]


def timeline(out):
    """(epoch, seconds of training so far, val top-1, 1 for a snapshot and 0 for an epoch's end) of a run directory
    trained with --snapshot-every: each epoch's snapshots (snapshots.csv), then its end; evaluation not counted."""
    rows, snapshots = measuring.read_csv(Path(out) / "metrics.csv"), measuring.read_csv(Path(out) / "snapshots.csv")
    points, before = [], 0.0  # (the training seconds of the epochs before)
    for row in rows:
        epoch = int(row["epoch"])
        if row["split"] == "train":
            points += [(epoch, round(before + float(s["seconds"]), 3), round(float(s["top1"]), 2), 1)
                       for s in snapshots if int(s["epoch"]) == epoch]
            before += float(row["epoch_s"])
        if row["split"] == "val":
            points.append((epoch, round(before, 3), round(float(row["top1"]), 2), 0))
    return points


def loss_curve(out):
    """(epoch, seconds so far, training loss, val loss, val top-1) of each epoch of a run directory (training and
    evaluation, summed)."""
    rows = measuring.read_csv(Path(out) / "metrics.csv")
    points, seconds, train_loss = [], 0.0, None
    for row in rows:
        seconds += float(row["epoch_s"])
        if row["split"] == "train":
            train_loss = round(float(row["loss"]), 4)
        if row["split"] == "val":
            points.append((int(row["epoch"]), round(seconds, 2), train_loss, round(float(row["loss"]), 4),
                           round(float(row["top1"]), 2)))
    return points


# ---- the model of what stragglers cost --------------------------------------------------------------------

def binomial_cdf(n, q):
    """[P(B <= k) for k = 0..n] of B ~ Binomial(n, q)."""
    if q <= 0 or q >= 1:  # (no draw sleeps, or every one)
        return [1.0] * (n + 1) if q <= 0 else [0.0] * n + [1.0]
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(q) +
                    (n - k) * math.log1p(-q)) for k in range(n + 1)]  # (in logs: an epoch's slots overflow comb)
    return list(itertools.accumulate(pmf))


def expected_max(k, n, q, x):
    """E[max of k independent X x Binomial(n, q)]: the sum over j >= 1 of X P(max >= j)."""
    cdf = binomial_cdf(n, q)
    return x * sum(1 - cdf[j - 1] ** k for j in range(1, n + 1))


def expected_lockstep(k, n, q, x, c, c1):
    """E[max(c, c1 + the largest of k delays X x Binomial(n, q))]: a minibatch that waits for the slowest of k."""
    cdf = binomial_cdf(n, q)
    return sum((cdf[j] ** k - (cdf[j - 1] ** k if j else 0)) * max(c, c1 + j * x) for j in range(n + 1))


def expected_step(sync, c, replicas, stages, steps, x, processes=1, cores=1, q=HETERO_PROB):
    """The model's seconds per minibatch of a replica with stragglers: c without them, steps a replica's
    minibatches per epoch, processes (the trainers) sharing cores."""
    slots, c1 = 2 * stages, c * min(1.0, cores / processes)
    free = max(c, c1 + slots * q * x)  # a replica that waits for nobody
    if sync == "allreduce":
        return expected_lockstep(replicas, slots, q, x, c, c1)
    if sync == "adpsgd":
        return expected_lockstep(min(2, replicas), slots, q, x, c, c1)
    if sync == "preduce":
        return free + (expected_lockstep(replicas, slots, q, x, c, c1) - free) / CHECK_EVERY
    steps = max(1, steps)
    return free + (expected_max(replicas, slots * steps, q, x) - slots * q * x * steps) / steps  # hetpipe


def steps_of(rows):
    """A replica's steps per epoch in these rows of pipeline.csv (updates of all replicas over the epochs)."""
    return round(sum(float(r["updates_per_s"]) * float(r["train_s"]) / int(r["replicas"]) / int(r["epochs"])
                     for r in rows) / len(rows))


def straggler_sleep(step):
    """X for a layout and schedule: C_OVER_X of allreduce's step (seconds per minibatch) without stragglers."""
    return round(step / C_OVER_X, 4)


def kept(args, name):
    """The rows of figures-data/name that --parts leaves as they were: the other parts' (pipeline_curves.csv: the
    sync part's curves, kept unless sync is measured; pipeline_time.csv: the time part's)."""
    path = Path(args.figures_data) / name
    if not path.exists() or set(args.parts) == set(PARTS):
        return []
    rows = measuring.read_csv(path)
    if name in CURVES_OF:
        return [] if CURVES_OF[name] in args.parts else rows
    return [r for r in rows if r["part"] not in args.parts]


CURVES_OF = {"pipeline_curves.csv": "sync", "pipeline_time.csv": "time", "pipeline_data.csv": "data",
             "pipeline_bert.csv": "bert"}  # (each file's part)


def time_part_sizes(rows):
    """{(stages, replicas, schedule): (X, T)} as the time part's runs in pipeline.csv slept and were scored."""
    def key(r):
        return int(r["stages"]), int(r["replicas"]), r["schedule"]
    sleeps = {key(r): float(r["hetero"]) for r in rows if r["part"] == "time" and float(r["hetero"]) > 0}
    epochs = {key(r): float(r["train_s"]) / int(r["epochs"]) for r in rows
              if r["part"] == "time" and r["sync"] == "allreduce" and float(r["hetero"]) == 0}
    return {k: (x, snapshot_every(epochs[k])) for k, x in sleeps.items() if k in epochs}


def snapshot_every(epoch_s):
    """T: SNAPSHOTS to an epoch (allreduce's without stragglers; cluster.py's, a replica's alone), in milliseconds
    at least one."""
    return max(round(epoch_s / SNAPSHOTS, 3), 0.001)


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--text", default="data/pydoc", help="the bert part's text (make_demo_data.py --text)")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--quick", action="store_true", help="a few rows of lenet at 16 px, for tests and QUICK=1")
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS,
                        help="measure only these parts, keeping the other parts' rows in the CSV files")
    parser.add_argument("--runs", default="runs/figures/pipeline", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where the CSV files go")
    args = parser.parse_args()
    measuring.require_digits(args.data)
    if "bert" in args.parts and not args.quick and not (Path(args.text) / "train" / "tokens.pt").exists():
        sys.exit(f"error: {args.text} has no train/tokens.pt; run `python scripts/make_demo_data.py --text "
                 f"{args.text}` first")
    machine, rows, curves = measuring.hardware(), kept(args, "pipeline.csv"), kept(args, "pipeline_curves.csv")
    times, berts = kept(args, "pipeline_time.csv"), kept(args, "pipeline_bert.csv")
    streams = kept(args, "pipeline_data.csv")
    sleep, every = {}, {}  # (part, stages, replicas, schedule): X, and T (the time and data parts)
    for part, sync, stragglers, stages, replicas, schedule, microbatches, seed in plan(args.seeds, args.quick,
                                                                                       args.parts):
        name = f"{part}-{sync}-{'stragglers' if stragglers else 'none'}-{stages}x{replicas}-{schedule}-m{microbatches}"
        out = Path(args.runs) / f"{name}-seed{seed}"
        layout = (part, stages, replicas, schedule)
        if part == "data" and layout not in sleep:  # the time part's X and T, measured before
            for key, (x, t) in time_part_sizes(rows).items():
                sleep[("data", *key)], every[("data", *key)] = x, t
        if stragglers and layout not in sleep:
            sys.exit(f"error: no X for {name}: measure the {'time' if part == 'data' else part} part first")
        hetero = sleep[layout] if stragglers else 0.0
        processes, flags = flags_of(part, sync, hetero, stages, replicas, schedule, microbatches, seed, args,
                                    every.get(layout) if stragglers else None)
        summary = measuring.train("pipeline", processes, flags, out, threads=1, forked=True)
        points = curve(out)
        reached = [seconds for _, seconds, top1 in points if top1 >= TARGET]
        train_s = measuring.train_seconds(out)
        updates = sum(summary["updates_per_replica"])
        if part in ("sync", "vit", "time", "bert") and sync == "allreduce" and not stragglers and layout not in sleep:
            sleep[layout] = straggler_sleep(train_s * replicas / updates)
            every[layout] = snapshot_every(train_s / summary["epochs"])
        rows.append({"part": part, "sync": sync, "hetero": hetero, "schedule": schedule, "microbatches": microbatches,
                     "batch": BATCH[part], "stages": stages, "replicas": summary["replicas"],
                     "processes": processes, "seed": seed, "epochs": summary["epochs"],
                     "top1": round(summary["top1"], 2), "images_per_s": round(summary["images_per_s"], 1),
                     "updates_per_s": round(updates / train_s, 2), "step_s": round(train_s * replicas / updates, 5),
                     "train_s": round(train_s, 2), "seconds_to_target": reached[0] if reached else "",
                     "target": TARGET, **{key: round(summary[key], 6) for key in FIELDS[18:26]},
                     "stop_checks_every": summary["stop_checks_every"] or "", **machine})
        if part in ("time", "data") and stragglers:
            (times if part == "time" else streams).extend(
                {"sync": sync, "hetero": hetero, "schedule": schedule, "stages": stages, "replicas": replicas,
                 "seed": seed, "epoch": epoch, "seconds": seconds, "top1": top1, "snapshot": snapshot, **machine}
                for epoch, seconds, top1, snapshot in timeline(out))
        if part == "bert":
            berts += [{"sync": sync, "hetero": hetero, "stages": stages, "replicas": replicas, "seed": seed,
                       "epoch": epoch, "seconds": seconds, "train_loss": train_loss, "val_loss": val_loss, "top1": top1,
                       **machine} for epoch, seconds, train_loss, val_loss, top1 in loss_curve(out)]
        if part == "sync":
            curves += [{"sync": sync, "hetero": hetero, "schedule": schedule, "stages": stages, "replicas": replicas,
                        "seed": seed, "epoch": epoch, "seconds": seconds, "top1": top1}
                       for epoch, seconds, top1 in points]
        print(f"{name} seed {seed}: top-1 {summary['top1']:.2f} %, {updates / train_s:.1f} updates/s, "
              f"waits {summary['waits']:g}" + (f", X {hetero:g} s" if stragglers else ""), flush=True)
        measuring.write_csv(Path(args.figures_data) / "pipeline.csv", FIELDS, rows)
        measuring.write_csv(Path(args.figures_data) / "pipeline_curves.csv", CURVE_FIELDS, curves)
        measuring.write_csv(Path(args.figures_data) / "pipeline_time.csv", TIME_FIELDS, times)
        measuring.write_csv(Path(args.figures_data) / "pipeline_data.csv", TIME_FIELDS, streams)
        measuring.write_csv(Path(args.figures_data) / "pipeline_bert.csv", BERT_FIELDS, berts)
    if "cluster" in args.parts:
        cluster.measure(args, flags_of, timeline, snapshot_every, SYNCS, C_OVER_X)
    measuring.record_part(args.figures_data, "pipeline", started, adding=set(args.parts) != set(PARTS))


if __name__ == "__main__":
    main()
