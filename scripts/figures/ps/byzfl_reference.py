"""An outside reference for the parameter server's Byzantine table: byzfl's own benchmark, on the same digits.

    python scripts/figures/ps/byzfl_reference.py            # figures/data/ps_byzfl.csv (45 runs, about 8 minutes on 2
    cores) python scripts/figures/ps/byzfl_reference.py --quick    # 1 seed, 2 rules, 1 attack, 20 steps: for tests

`make figures ONLY=ps` runs it after the table (scripts/figures/ps/measure.py calls run()). scripts/figures/ps/table.py
measures recipes/ps, whose robust rules are byzfl's functions called from our own server. This script asks byzfl's
benchmark (`byzfl.benchmark.run_benchmark`, its whole training loop: clients, server, attacks) the same
question on the same data, so that a number in the recipe's table can be told apart from a bug in the
recipe: if the recipe's mean falls to 10 % under gaussian noise and the median holds, byzfl's should too.

The set-up mirrors the recipe's table where byzfl lets it: 8 workers of which f = 2 are Byzantine (byzfl
counts them apart: nb_honest_clients 6 + f 2; byzfl's nb_workers is their sum), the rules set for 2 Byzantine
workers in every row (tolerated_f 2, which byzfl hands to TrMean and Krum as their f), and a row with no
attack: 8 honest workers, f = 0 (byzfl's "NoAttack"). Rules (byzfl's names): Average (the recipe's mean),
Median, TrMean, Krum, CenteredClipping (tau 10, as recipes/ps sets it; byzfl's default is 100), no
pre-aggregator. Attacks: SignFlipping and Gaussian (mu 0, sigma 1). Data: iid over the honest clients, all of
data/mnist5k's train/ (size_train_set 1.0: byzfl's default 0.8 would hold a fifth out for its hyperparameter
search, which this script does not do), tested on val/ (byzfl's "test" set). Model: byzfl's cnn_mnist, SGD
at lr 0.1, weight decay 1e-4, batch 25 per honest client, --steps steps (150: 45 runs fit about 8 minutes of
2 cores; mean without an attack reaches 89, 94 and 96 % at steps 50, 100 and 150), seeds 0 1 2 (byzfl's
training seed; its data-distribution seed stays 0), on the CPU. Each run's top-1 is its final test accuracy.

Why the numbers may differ from the recipe's (this is a reference, not a replica):
  * byzfl's honest clients send momentum (beta 0.9, an average: m = 0.9 m + 0.1 g), one step a push; the
    recipe's table runs its robust rules on the change of 8 local steps (with the worker's momentum).
  * byzfl's attacks are omniscient: the Byzantine clients see this step's honest vectors (sign flipping sends
    minus their mean, at scale 1) and all f of them send the same vector (Gaussian included: one draw,
    repeated); the recipe's attackers flip x 4 or lie with probability 0.2 per push, so that a round may
    hold more than 2 of them.
  * cnn_mnist (two convolutions, 431k parameters) at a constant learning rate for 150 steps, not lenet for
    5 epochs under a cosine schedule.
  * byzfl's training seed moves only the batches' order and the Gaussian attack's draws: the split of the
    data between the clients and the model's initial weights are drawn under its data-distribution seed,
    0 in every run. The recipe's seed moves all of them, so its spread from seed to seed is wider.

byzfl reads MNIST through torchvision's datasets.MNIST(root, download=True). There is no download: the
script writes the folder's digits as the four uncompressed IDX files torchvision looks for (train/ as "train",
val/ as "t10k", labels in ImageFolder's order: the digit), so download=True returns at once; byzfl runs in a
child process whose network connections are refused. Each call gets its own config.json folder under --runs,
and byzfl writes its results under <runs>/steps<N>/results/. A setting whose train_time_tr_seed_<S>_dd_seed_0.txt
exists is skipped (byzfl's rule, and ours without starting byzfl): a stopped run starts again where it stopped.
ps_byzfl.csv is written again after each seed.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.figures import measuring  # noqa: E402

WORKERS, BYZANTINE = 8, 2
# byzfl's aggregator name, its extra parameters, and the recipe's --aggregate name
AGGREGATORS = [("Average", {}, "mean"), ("Median", {}, "median"), ("TrMean", {}, "trimmed-mean"),
               ("Krum", {}, "krum"), ("CenteredClipping", {"tau": 10.0}, "centered-clipping")]
# byzfl's attack name, its parameters, and the recipe's --attack name
ATTACKS = [("SignFlipping", {}, "signflip"), ("Gaussian", {"mu": 0.0, "sigma": 1.0}, "gaussian")]
NO_ATTACK = ("NoAttack", {}, "none")
LEARNING_RATE, MOMENTUM, WEIGHT_DECAY, BATCH = 0.1, 0.9, 1e-4, 25
STEPS, QUICK_STEPS = 150, 20
FIELDS = ["aggregator", "attack", "aggregate", "ps_attack", "byzantine", "honest", "workers", "tolerated_f", "seed",
          "steps", "batch", "lr", "momentum", "top1", "diverged", "train_s", "cpu", "cores", "gpu", "torch", "byzfl"]
IDX_FILES = {("train", "images"): "train-images-idx3-ubyte", ("train", "labels"): "train-labels-idx1-ubyte",
             ("val", "images"): "t10k-images-idx3-ubyte", ("val", "labels"): "t10k-labels-idx1-ubyte"}

# the child that runs byzfl's benchmark in its working directory (where config.json is): sockets refuse to
# connect, so that torchvision could not download MNIST even if it tried
BENCHMARK = """
import socket, sys
def refuse(*args, **kwargs):
    raise OSError("scripts/figures/ps/byzfl_reference.py: no network here (MNIST must come from the IDX files)")
socket.socket.connect = socket.socket.connect_ex = socket.create_connection = refuse
from byzfl.benchmark import run_benchmark
run_benchmark(nb_jobs=int(sys.argv[1]))
"""


def write_idx(path, array):
    """An IDX file (big-endian, unsigned bytes): magic 0x0000 08 <dims>, each dimension, then the bytes."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    tmp = Path(f"{path}.tmp")
    tmp.write_bytes(header + array.tobytes())
    tmp.replace(path)


def folder_arrays(folder):
    """An image folder's images (N x 28 x 28, uint8, grey) and labels (ImageFolder's class indices)."""
    from PIL import Image
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(folder)
    if len(dataset.classes) > 10:
        sys.exit(f"error: {folder} has {len(dataset.classes)} classes; byzfl's cnn_mnist has 10 outputs")
    images = np.empty((len(dataset.samples), 28, 28), dtype=np.uint8)
    for i, (path, _) in enumerate(dataset.samples):
        with Image.open(path) as image:
            if image.size != (28, 28):
                sys.exit(f"error: {path} is {image.size[0]}x{image.size[1]}; byzfl's cnn_mnist takes 28x28 digits")
            images[i] = np.asarray(image.convert("L"))
    return images, np.array(dataset.targets, dtype=np.uint8)


def write_mnist(data, root):
    """data/{train,val} as the raw MNIST files torchvision's datasets.MNIST(root) reads: returns MNIST/raw."""
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "val"):
        images, labels = folder_arrays(Path(data) / split)
        write_idx(raw / IDX_FILES[split, "images"], images)
        write_idx(raw / IDX_FILES[split, "labels"], labels)
        counts[split] = len(labels)
    processed = Path(root) / "MNIST" / "processed"  # torchvision's legacy cache would be read before raw/
    if processed.exists():
        sys.exit(f"error: {processed} exists: torchvision would read it instead of the IDX files; remove it")
    from torchvision.datasets import MNIST

    for split, train in (("train", True), ("val", False)):  # what byzfl will find: no download, as many images
        mnist = MNIST(root, train=train, download=False)
        if len(mnist) != counts[split]:
            sys.exit(f"error: torchvision reads {len(mnist)} {split} images from {raw}, not {counts[split]}")
    return raw


def plan(seeds, quick=False):
    """Every run: (part, aggregator, attack, seed), seed by seed. quick: 1 attack and 2 rules."""
    aggregators, attacks = (AGGREGATORS[:2], ATTACKS[:1]) if quick else (AGGREGATORS, ATTACKS)
    runs = []
    for seed in seeds:
        runs += [("clean", aggregator, NO_ATTACK, seed) for aggregator in aggregators]
        runs += [("attacked", aggregator, attack, seed) for aggregator in aggregators for attack in attacks]
    return runs


def config_of(part, aggregators, attacks, seed, steps, idx_root, results):
    """byzfl's config.json for one call: every aggregator x attack of one part, one training seed."""
    byzantine = BYZANTINE if part == "attacked" else 0
    return {
        "benchmark_config": {
            "device": "cpu",
            "training_seed": seed,
            "nb_training_seeds": 1,
            "nb_honest_clients": WORKERS - byzantine,
            "f": [byzantine],
            "tolerated_f": BYZANTINE,
            "size_train_set": 1.0,
            "data_distribution_seed": 0,
            "nb_data_distribution_seeds": 1,
            # null, not 1.0: byzfl names an iid result folder "iid_None" and looks for it under the name
            # built from this value when it skips finished runs (it reads null as its default, 1.0)
            "data_distribution": [{"name": "iid", "distribution_parameter": None}],
            "training_algorithm": {"name": "DSGD", "parameters": {}},
            "nb_steps": steps,
        },
        "model": {"name": "cnn_mnist", "dataset_name": "mnist", "nb_labels": 10, "loss": "NLLLoss",
                  "learning_rate": LEARNING_RATE, "learning_rate_decay": 1.0, "milestones": []},
        "aggregator": [{"name": name, "parameters": dict(parameters)} for name, parameters, _ in aggregators],
        "pre_aggregators": [],
        "honest_clients": {"momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY, "batch_size": BATCH},
        "attack": [{"name": name, "parameters": dict(parameters)} for name, parameters, _ in attacks],
        "evaluation_and_results": {"evaluation_delta": 50, "batch_size_evaluation": 128, "evaluate_on_test": True,
                                   "store_per_client_metrics": False, "store_models": False,
                                   "data_folder": str(Path(idx_root).resolve()),
                                   "results_directory": str(Path(results).resolve())},
    }


def result_folder(results, aggregator, attack, byzantine):
    """The folder byzfl's FileManager names for one setting (byzfl/benchmark/managers.py)."""
    return Path(results) / (f"mnist_cnn_mnist_n_{WORKERS}_f_{byzantine}_d_{BYZANTINE}_iid_None_{aggregator}__"
                            f"{attack}_lr_{LEARNING_RATE}_mom_{MOMENTUM}_wd_{WEIGHT_DECAY}")


def finished(results, aggregator, attack, byzantine, seed):
    folder = result_folder(results, aggregator, attack, byzantine)
    return (folder / f"train_time_tr_seed_{seed}_dd_seed_0.txt").exists()


def numbers(path):
    with open(path) as f:
        return [float(value) for value in f.read().replace("\n", ",").split(",") if value.strip()]


def run_byzfl(folder, config, jobs, threads):
    """byzfl's run_benchmark in a child whose working directory is `folder` (with config.json written there)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    with open(folder / "byzfl.log", "w") as log:
        result = subprocess.run([sys.executable, "-c", BENCHMARK, str(jobs)], cwd=folder, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = (folder / "byzfl.log").read_text()[-3000:]
        sys.exit(f"error: byzfl's benchmark failed in {folder} (see byzfl.log there):\n{tail}")


def main():
    parser = measuring.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k", help="an image folder of 28x28 digits: train/ and val/")
    parser.add_argument("--runs", default="runs/figures/byzfl", help="scratch: the IDX files, configs, byzfl's results")
    parser.add_argument("--figures-data", default="figures/data", help="where ps_byzfl.csv goes")
    parser.add_argument("--steps", type=int, help=f"byzfl's nb_steps (default {STEPS}; {QUICK_STEPS} with --quick)")
    parser.add_argument("--seeds", type=int, nargs="+", help="training seeds (default 0 1 2; 0 with --quick)")
    parser.add_argument("--jobs", type=int, default=measuring.usable_cores(),
                        help="byzfl's trainings in parallel, 1 thread each (default: the usable cores)")
    parser.add_argument("--quick", action="store_true", help="1 seed, Average and Median, SignFlipping, 20 steps")
    args = parser.parse_args()
    if (args.steps is not None and args.steps < 1) or args.jobs < 1 or min(args.seeds or [0]) < 0:
        parser.error("--steps and --jobs must be at least 1, --seeds at least 0")
    run(args.data, args.runs, args.figures_data, args.steps, args.seeds, args.jobs, args.quick)


def run(data, runs, figures_data, steps=None, seeds=None, jobs=None, quick=False):
    """Every run of byzfl's benchmark not yet finished, then ps_byzfl.csv (also called by
    scripts/figures/ps/measure.py, whose part of make figures this is)."""
    started = time.time()
    steps = steps or (QUICK_STEPS if quick else STEPS)
    seeds = list(dict.fromkeys(seeds if seeds is not None else ([0] if quick else measuring.SEEDS)))
    jobs = jobs or measuring.usable_cores()
    if not (Path(data) / "train").is_dir() or not (Path(data) / "val").is_dir():
        sys.exit(f"error: {data} has no train/ and val/ folders; run `python scripts/make_demo_data.py` first")
    try:
        import byzfl.benchmark  # noqa: F401
        from importlib.metadata import version
        byzfl_version = version("byzfl")
    except ImportError:
        sys.exit("error: the byzfl package is not installed: run make setup")

    runs = Path(runs)
    idx_root = runs / "mnist-idx"
    write_mnist(data, idx_root)
    results = runs / (f"quick-steps{steps}" if quick else f"steps{steps}") / "results"
    every = plan(seeds, quick)
    machine, rows, trained, out = measuring.hardware(), [], 0, Path(figures_data) / "ps_byzfl.csv"
    for seed in seeds:
        for part in ("clean", "attacked"):
            todo = [(aggregator, attack) for p, aggregator, attack, s in every if (p, s) == (part, seed)
                    and not finished(results, aggregator[0], attack[0], BYZANTINE if part == "attacked" else 0, seed)]
            if not todo:
                continue
            aggregators = list({a[0]: a for a, _ in todo}.values())
            attacks = list({b[0]: b for _, b in todo}.values())
            config = config_of(part, aggregators, attacks, seed, steps, idx_root, results)
            began = time.time()
            print(f"seed {seed}, {part}: {len(aggregators)} rule(s) x {len(attacks)} attack(s), {steps} steps ...",
                  flush=True)
            run_byzfl(results.parent / "configs" / f"{part}-seed{seed}", config, jobs, threads=1)
            trained += len(todo)
            print(f"  done in {time.time() - began:.0f} s", flush=True)
        # the table so far, seed by seed: a stopped script leaves whole seeds in ps_byzfl.csv
        rows += [{**row_of(results, part, aggregator, attack, seed, steps), **machine, "byzfl": byzfl_version}
                 for part, aggregator, attack, s in every if s == seed]
        measuring.write_csv(out, FIELDS, rows)
    for (aggregator, attack), top1 in mean_top1(rows).items():
        print(f"{aggregator:>16} {attack:>12}: top-1 {top1:.2f} %", flush=True)
    print(f"wrote {out}: {len(rows)} rows ({trained} run(s) trained now, {len(rows) - trained} kept from an earlier "
          f"start) in {(time.time() - started) / 60:.1f} minutes", flush=True)


def row_of(results, part, aggregator, attack, seed, steps):
    """One run's row of ps_byzfl.csv, from the files byzfl wrote: the final test accuracy is its top-1."""
    (aggregator, _, aggregate), (attack, _, ps_attack) = aggregator, attack
    byzantine = BYZANTINE if part == "attacked" else 0
    folder = result_folder(results, aggregator, attack, byzantine)
    if not finished(results, aggregator, attack, byzantine, seed):
        sys.exit(f"error: byzfl left no result for {aggregator} under {attack}, seed {seed}, in {folder}")
    accuracy = numbers(folder / f"test_accuracy_tr_seed_{seed}_dd_seed_0.txt")
    losses = numbers(folder / f"train_loss_tr_seed_{seed}_dd_seed_0.txt")
    saved = json.loads((folder / "config.json").read_text())["benchmark_config"]
    if saved["nb_steps"] != steps or len(losses) != steps:
        sys.exit(f"error: {folder} holds a run of {saved['nb_steps']} steps, not {steps}: remove it")
    return {"aggregator": aggregator, "attack": attack, "aggregate": aggregate, "ps_attack": ps_attack,
            "byzantine": byzantine, "honest": WORKERS - byzantine, "workers": WORKERS, "tolerated_f": BYZANTINE,
            "seed": seed, "steps": steps, "batch": BATCH, "lr": LEARNING_RATE, "momentum": MOMENTUM,
            "top1": round(100 * accuracy[-1], 2), "diverged": int(not all(math.isfinite(loss) for loss in losses)),
            "train_s": round(numbers(folder / f"train_time_tr_seed_{seed}_dd_seed_0.txt")[0], 1)}


def mean_top1(rows):
    """The mean top-1 over the seeds, per (aggregator, attack), in the rows' order."""
    groups = {}
    for row in rows:
        groups.setdefault((row["aggregator"], row["attack"]), []).append(row["top1"])
    return {key: sum(values) / len(values) for key, values in groups.items()}


if __name__ == "__main__":
    main()
