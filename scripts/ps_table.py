"""The parameter server against Byzantine workers, on the digits: accuracy, rejections and speed.

    python scripts/ps_table.py     # figures/data/ps.csv (then plot_results.py draws it)
    python scripts/ps_table.py --quick --seeds 0 --epochs 1   # a few rows at 16 px, for QUICK=1

On data/mnist5k, 8 workers and 1 server (and 2 validators for the Zeno rules), each row for
every seed (3 by default):
  sync    every aggregation (mean, median, trimmed-mean, krum, centered-clipping, phocas,
          zeno, zenops) with no Byzantine worker, and with 2 under every attack
  async   mean, zenops and zeno++ with none, and with 2 under every attack
  eta     ZenoPS's eta sweep (zenops, async, 2 sign-flipping workers, --zeno-eta 0.1 ...
          -0.1), beside "validation data only": nd trained on the validators' held-out
          share of train/ alone (the split of the same seed), at the same global batch
          for about as many steps (10x the epochs, and of the warm-up, on a tenth of the data)
  speed   ddp on 8 processes, the throughput the ps sync rows are compared with
The robust rules are set for b = 2 Byzantine workers in every row (--zeno-b 2), so the
rows without an attack show what robustness costs. The set-up is scripts/measuring.py's
ACCURACY (lenet, 28 px) at a batch of 8 per worker, for 2 epochs (124 steps of 64
images; 112 with validators, which hold out a tenth of train/): 225 runs, most of 9 to
11 processes, fit in under an hour of 2 cores only so. Their
processes are forked from a server that has imported torch once (measuring.run_forked):
started by torchrun, each run would spend about 25 s importing. Each run keeps its final
top-1, the update counts and images/s in ps.csv, one row per run; a run that diverges
(a non-finite loss: mean under gaussian noise, say) is a row with diverged = 1 and no top-1. Run directories go to
runs/figures/ps/<name>-seed<S>; a run whose summary.json is complete is not trained again.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import measuring  # noqa: E402

WORKERS, BYZANTINE, VALIDATORS = 8, 2, 2
SYNC = ["mean", "median", "trimmed-mean", "krum", "centered-clipping", "phocas", "zeno", "zenops"]
ASYNC = ["mean", "zenops", "zeno++"]
ATTACKS = ["signflip", "gaussian", "labelflip", "alie", "ipm"]
ETAS = [0.1, 0.01, 0.001, 0, -0.001, -0.01, -0.1]
VALIDATED = {"zeno", "zenops", "zeno++"}
HELD_OUT = 0.1  # the recipe's --validation-split: the validators' share of train/
FIELDS = ["part", "mode", "aggregate", "attack", "byzantine", "zeno_eta", "seed", "processes", "epochs", "top1",
          "diverged", "honest_pushed", "honest_rejected", "byzantine_pushed", "byzantine_rejected", "stale_dropped",
          "images_per_s", "train_s", "cpu", "cores", "gpu", "torch"]


def plan(seeds, quick=False):
    """Every run of the table: (part, mode, aggregate, attack, byzantine, zeno_eta, seed), seed by seed so that a
    stopped table leaves whole seeds of every row behind it. quick: a few of each part."""
    sync, asynchronous, attacks, etas = (["mean", "median", "zeno"], ["mean", "zeno++"], ["signflip"], [0.1, 0]) \
        if quick else (SYNC, ASYNC, ATTACKS, ETAS)
    runs = []
    for seed in seeds:
        for aggregate in sync:
            runs += [("sync", "sync", aggregate, "none", 0, None, seed)]
            runs += [("sync", "sync", aggregate, attack, BYZANTINE, None, seed) for attack in attacks]
        for aggregate in asynchronous:
            runs += [("async", "async", aggregate, "none", 0, None, seed)]
            runs += [("async", "async", aggregate, attack, BYZANTINE, None, seed) for attack in attacks]
        runs += [("eta", "async", "zenops", "signflip", BYZANTINE, eta, seed) for eta in etas]
        runs += [("eta", "nd", "validation data only", "none", 0, None, seed), ("speed", "ddp", "ddp", "none", 0,
                                                                               None, seed)]
    return runs


def flags_of(mode, aggregate, attack, byzantine, zeno_eta, seed, args):
    """The recipe, its processes and its flags for one run."""
    model = measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY
    common = [*model, "--epochs", str(args.epochs), "--seed", str(seed), "-b", "8", "-p", "1000",
              "--dist-timeout", "120"]
    if mode == "ddp":
        return "ddp", WORKERS, [args.data, *common]
    if mode == "nd":  # the validators' share (a tenth) alone, at the workers' global batch for as many steps
        folder = validation_only_data(args.data, seed, HELD_OUT, Path(args.runs) / f"validation-data-seed{seed}")
        model = [str(round(float(flag) / HELD_OUT)) if previous == "--warmup-epochs" else flag
                 for previous, flag in zip(["", *model], model)]
        return "nd", 1, [folder, *model, "--epochs", str(round(args.epochs / HELD_OUT)), "--seed", str(seed),
                         "-b", str(8 * WORKERS), "-p", "1000"]
    validators = VALIDATORS if aggregate in VALIDATED else 0
    flags = [args.data, *common, "--mode", mode, "--aggregate", aggregate, "--validators", str(validators),
             "--zeno-b", str(BYZANTINE), "--byzantine", str(byzantine), "--attack", attack]
    if zeno_eta is not None:
        flags += ["--zeno-eta", str(zeno_eta)]
    return "ps", 1 + validators + WORKERS, flags


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
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a few rows of lenet at 16 px, for tests and QUICK=1")
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--runs", default="runs/figures/ps", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where ps.csv goes")
    args = parser.parse_args()
    if not (Path(args.data) / "train").is_dir():
        sys.exit(f"error: {args.data} has no train/ folder; run `python scripts/make_demo_data.py` first")
    machine, rows, runs = measuring.hardware(), [], Path(args.runs)
    for part, mode, aggregate, attack, byzantine, zeno_eta, seed in plan(args.seeds, args.quick):
        name = f"{part}-{mode}-{aggregate}-{attack}-{byzantine}" + (f"-eta{zeno_eta:g}" if zeno_eta is not None else "")
        out = runs / f"{name.replace(' ', '_')}-seed{seed}"
        recipe, processes, flags = flags_of(mode, aggregate, attack, byzantine, zeno_eta, seed, args)
        summary = measuring.train(recipe, processes, flags, out, threads=1, forked=True, check=False)
        row = {"part": part, "mode": mode, "aggregate": aggregate, "attack": attack, "byzantine": byzantine,
               "zeno_eta": "" if zeno_eta is None else zeno_eta, "seed": seed, "processes": processes, **machine}
        if summary is None:  # an attack may make training diverge: a result of the table, not an error of it
            failure = (out / "failed.log").read_text()
            if "non-finite loss" not in failure:
                sys.exit(f"error: {name} seed {seed} failed:\n{failure[-3000:]}")
            rows.append({**row, "diverged": 1, "epochs": args.epochs})
            print(f"{name} seed {seed}: diverged (non-finite loss)", flush=True)
        else:
            rows.append({**row, "diverged": 0, "epochs": summary["epochs"], "top1": round(summary["top1"], 2),
                         **{key: summary.get(key, "") for key in FIELDS[11:16]},
                         "images_per_s": round(summary["images_per_s"], 1),
                         "train_s": round(measuring.train_seconds(out), 2)})
            print(f"{name} seed {seed}: top-1 {summary['top1']:.2f} %  " + json.dumps(
                {key: summary.get(key) for key in FIELDS[11:16]}), flush=True)
        measuring.write_csv(Path(args.figures_data) / "ps.csv", FIELDS, rows)
    measuring.record_part(args.figures_data, "ps", started)


if __name__ == "__main__":
    main()
