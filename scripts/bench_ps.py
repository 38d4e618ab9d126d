"""The parameter server against Byzantine workers, on the digits: accuracy, rejections and speed.

    python scripts/bench_ps.py     # figures/data/ps.csv (then plot_results.py draws it)
    python scripts/bench_ps.py --quick --seeds 0 --epochs 1   # a few rows at 16 px, for QUICK=1

On data/mnist5k, 8 workers and 1 server (and 2 validators for the Zeno rules, holding out 2 % of
train/), each row for every seed (3 by default), in the papers' regimes scaled down:
  sync    mean and the robust rules (median, trimmed-mean, phocas) and zenops, the workers
          taking 8 local steps a push (ZenoPS's --sync-interval 8), and mean and zeno on one
          gradient a push (Zeno's), under: no attack; 2 of 8 workers flipping their sign x 4;
          ZenoPS's poisoning, each push with probability 0.2, sign flip x 6 or N(0, 1)
  async   mean and zeno++ on gradients with SGD without momentum (Zeno++'s servers; --lr 1.0,
          10 times the others, for the momentum's missing 1 / (1 - 0.9)), zenops on 8 local steps,
          under sign flip x 10 with probability 0, 0.2 and 0.4 per push (Zeno++'s)
  eta     ZenoPS's eta sweep (its Figure 7: sync zenops, N(0, 1) at 0.2, --zeno-eta 0.1 ...
          -0.1), beside "validation data only": nd trained on the validators' held-out share
          alone (the split of the same seed), at one worker's batch for as many steps as one
          worker takes (6 times the epochs, and of the warm-up, on a 49th of the data)
  speed   ddp on 8 processes, the throughput the ps sync rows are compared with
Then, in the same part, scripts/bench_ps_byzfl.py: ByzFL's own benchmark on the same digits, into
figures/data/ps_byzfl.csv. The robust rules are set for b = 2 Byzantine workers in every row (--zeno-b
2). The set-up is scripts/measuring.py's ACCURACY (lenet, 28 px, cosine schedule) at a batch of 8
per worker, for 5 epochs. Run processes are forked from a server that has imported torch once
(measuring.run_forked): started by torchrun, each run would spend about 25 s importing. Each run
keeps its final top-1, the update counts (rejections are shares of pushes: zenops judges tensor by
tensor) and images/s in ps.csv, one row per run; a run that diverges (a non-finite loss: mean under
N(0, 1), say) is a row with diverged = 1 and no top-1. Run directories go to runs/figures/ps/<name>-seed<S>; a run whose
summary.json is complete is not trained again.
"""

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import bench_ps_byzfl, measuring  # noqa: E402

WORKERS, BYZANTINE, VALIDATORS = 8, 2, 2
HELD_OUT = 0.02  # the validators' share of train/ (--validation-split): small, so that it alone is a weak baseline
LOCAL_STEPS = 8  # ZenoPS's workers' steps a push
# (aggregation label, its flags): zeno and zeno++ judge gradients, as their authors ran them
SYNC = [("mean", ["--aggregate", "mean", "--local-steps", "8"]),
        ("median", ["--aggregate", "median", "--local-steps", "8"]),
        ("trimmed-mean", ["--aggregate", "trimmed-mean", "--local-steps", "8"]),
        ("phocas", ["--aggregate", "phocas", "--local-steps", "8"]),
        ("zenops", ["--aggregate", "zenops", "--local-steps", "8"]),
        ("mean, 1 step", ["--aggregate", "mean"]),
        ("zeno, 1 step", ["--aggregate", "zeno"])]
# Zeno++'s servers run SGD without momentum: its rows and their mean, at 10 times --lr (1 / (1 - 0.9))
ASYNC = [("mean, 1 step", ["--aggregate", "mean", "--momentum", "0", "--lr", "1.0"]),
         ("zeno++, 1 step", ["--aggregate", "zeno++", "--momentum", "0", "--lr", "1.0"]),
         ("zenops", ["--aggregate", "zenops", "--local-steps", "8"])]
SIGNFLIP_4 = ["--byzantine", "2", "--attack", "signflip", "--attack-scale", "4"]
SYNC_ATTACKS = [("none", []), ("signflip x4, 2 of 8", SIGNFLIP_4),
                ("signflip x6, p 0.2", ["--attack-prob", "0.2", "--attack", "signflip", "--attack-scale", "6",
                                        "--attack-draw", "push"]),
                ("N(0,1), p 0.2", ["--attack-prob", "0.2", "--attack", "gaussian", "--attack-scale", "1",
                                   "--attack-draw", "push"])]
ASYNC_ATTACKS = [("none", []),
                 ("signflip x10, p 0.2", ["--attack-prob", "0.2", "--attack", "signflip", "--attack-scale", "10",
                                          "--attack-draw", "push"]),
                 ("signflip x10, p 0.4", ["--attack-prob", "0.4", "--attack", "signflip", "--attack-scale", "10",
                                          "--attack-draw", "push"])]
ETAS = [0.1, 0.01, 0.001, 0, -0.001, -0.01, -0.1]
ETA_ATTACK = SYNC_ATTACKS[3]
FIELDS = ["part", "mode", "aggregate", "attack", "zeno_eta", "seed", "processes", "epochs", "top1", "diverged",
          "honest_pushed", "honest_rejected", "byzantine_pushed", "byzantine_rejected", "stale_dropped",
          "images_per_s", "train_s", "cpu", "cores", "gpu", "torch"]


def plan(seeds, quick=False):
    """Every run of the table: (part, mode, aggregate label, attack label, zeno_eta, seed), seed by seed so that a
    stopped table leaves whole seeds of every row behind it. quick: a few of each part."""
    sync, asynchronous = (SYNC, ASYNC) if not quick else ([SYNC[0], SYNC[4], SYNC[6]], [ASYNC[1]])
    sync_attacks, async_attacks, etas = (SYNC_ATTACKS, ASYNC_ATTACKS, ETAS) if not quick else \
        (SYNC_ATTACKS[:2], ASYNC_ATTACKS[::2], [0.1, 0])
    runs = []
    for seed in seeds:
        runs += [("sync", "sync", aggregate, attack, None, seed) for aggregate, _ in sync for attack, _ in sync_attacks]
        runs += [("async", "async", aggregate, attack, None, seed) for aggregate, _ in asynchronous
                 for attack, _ in async_attacks]
        runs += [("eta", "sync", "zenops", ETA_ATTACK[0], eta, seed) for eta in etas]
        runs += [("eta", "nd", "validation data only", "none", None, seed), ("speed", "ddp", "ddp", "none", None, seed)]
    return runs


def flags_of(mode, aggregate, attack, zeno_eta, seed, args):
    """The recipe, its processes and its flags for one run."""
    model = measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY
    common = [*model, "--epochs", str(args.epochs), "--seed", str(seed), "-b", "8", "-p", "1000",
              "--dist-timeout", "120"]
    if mode == "ddp":
        return "ddp", WORKERS, [args.data, *common]
    if mode == "nd":  # the validators' share alone, at one worker's batch, for as many steps as one worker takes
        folder = validation_only_data(args.data, seed, HELD_OUT, Path(args.runs) / f"validation-data-seed{seed}")
        scale = (1 - HELD_OUT) / (WORKERS * HELD_OUT)  # a worker's steps an epoch / nd's on the held-out share
        model = [str(round(float(flag) * scale)) if previous == "--warmup-epochs" else flag
                 for previous, flag in zip(["", *model], model)]
        return "nd", 1, [folder, *model, "--epochs", str(round(args.epochs * scale)), "--seed", str(seed), "-b", "8",
                         "-p", "1000"]
    rules = dict(SYNC if mode == "sync" else ASYNC)[aggregate]
    validated = rules[1] in ("zeno", "zenops", "zeno++")
    flags = [args.data, *common, "--mode", mode, *rules, "--zeno-b", str(BYZANTINE),
             *dict(SYNC_ATTACKS + ASYNC_ATTACKS)[attack]]
    if validated:
        flags += ["--validators", str(VALIDATORS), "--validation-split", str(HELD_OUT)]
    if zeno_eta is not None:
        flags += ["--zeno-eta", str(zeno_eta)]
    return "ps", 1 + (VALIDATORS if validated else 0) + WORKERS, flags


def validation_only_data(data, seed, split, folder):
    """A folder whose train/ is the validators' held-out share of data/train (for this seed), val/ the same."""
    from recipes.common.data import hold_out
    from torchvision.datasets import ImageFolder

    if (folder / ".complete").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    train = ImageFolder(Path(data) / "train")
    _, held = hold_out(train, split, seed)
    for index in held.indices:
        path, label = train.samples[index]
        target = folder / "train" / train.classes[label] / Path(path).name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(Path(path).resolve())
    (folder / "val").symlink_to((Path(data) / "val").resolve())
    (folder / ".complete").touch()
    return folder


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a few rows of lenet at 16 px, for tests and QUICK=1")
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--runs", default="runs/figures/ps", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where ps.csv goes")
    args = parser.parse_args()
    measuring.require_digits(args.data)
    machine, rows, runs = measuring.hardware(), [], Path(args.runs)
    for part, mode, aggregate, attack, zeno_eta, seed in plan(args.seeds, args.quick):
        name = f"{part}-{mode}-{aggregate}-{attack}" + (f"-eta{zeno_eta:g}" if zeno_eta is not None else "")
        out = runs / f"{re.sub(r'[^A-Za-z0-9.+-]+', '_', name)}-seed{seed}"
        recipe, processes, flags = flags_of(mode, aggregate, attack, zeno_eta, seed, args)
        summary = measuring.train(recipe, processes, flags, out, threads=1, forked=True, check=False)
        row = {"part": part, "mode": mode, "aggregate": aggregate, "attack": attack,
               "zeno_eta": "" if zeno_eta is None else zeno_eta, "seed": seed, "processes": processes, **machine}
        if summary is None:  # an attack may make training diverge: a result of the table, not an error of it
            failure = (out / "failed.log").read_text()
            if "non-finite loss" not in failure:
                sys.exit(f"error: {name} seed {seed} failed:\n{failure[-3000:]}")
            rows.append({**row, "diverged": 1, "epochs": args.epochs})
            print(f"{name} seed {seed}: diverged (non-finite loss)", flush=True)
        else:
            rows.append({**row, "diverged": 0, "epochs": summary["epochs"], "top1": round(summary["top1"], 2),
                         **{key: summary.get(key, "") for key in FIELDS[10:15]},
                         "images_per_s": round(summary["images_per_s"], 1),
                         "train_s": round(measuring.train_seconds(out), 2)})
            print(f"{name} seed {seed}: top-1 {summary['top1']:.2f} %  " + json.dumps(
                {key: summary.get(key) for key in FIELDS[10:15]}), flush=True)
        measuring.write_csv(Path(args.figures_data) / "ps.csv", FIELDS, rows)
    # the outside reference, in the same part (its time counts in the part's)
    bench_ps_byzfl.run(args.data, Path(args.runs).parent / "byzfl", args.figures_data, quick=args.quick)
    measuring.record_part(args.figures_data, "ps", started)


if __name__ == "__main__":
    main()
