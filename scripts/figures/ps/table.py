"""The parameter server against Byzantine workers, on the digits, each figure in its authors' regime scaled
down: accuracy, rejections and speed: what each row runs, and run(), which trains them (measure.py).

On data/mnist5k, 8 workers (ZenoPS: 16 sync, 8 async; Zeno: 20; Zeno++: 10), 1 server (async-2v: 2), each row for every
seed (3 by default). Every poisoning probability is 0.2 and drawn per tensor of a push as ZenoPS draws it
(zeno_ps byteps/mxnet/__init__.py 406, 850), unless the row says per push (Zeno++'s, AsyncByzGrad
train_cifar10.py 259-265). Every accuracy row holds out a worker's share of train/, 1 / 9 (ZenoPS's
1 / (W + 1), train_cifar10_byteps_zeno_validator.py 210-220), so that the rows without validators train
on the same shards as those with them; each validator holds all of it.
  sync-1v   ZenoPS's sync runs with one validator (launcher/experiments_sync_single_validator.sh): each
            worker sits a round out with probability 0.5 (--worker-subsample, __init__.py 381), 8 local
            steps a push; mean, trimmed-mean and phocas (b from each round's pushes at ZenoPS's ratio 0.2,
            validator.py 66-90) and zenops; attacks: none, sign flip x 6, N(0, 1), a random direction at
            8 x each tensor's norm (ZenoPS's, each tensor poisoned with probability 0.2); and two built to
            slip past it: 4 of 8 workers flipping every push x 1.2 (1.44 < 1.6: the norm test passes it where
            the update is no longer than v), and 4 of 8 pushing ALIE (Baruch et al.'s mean - z std, z = z_max
            = 1.15 for 4 of 8, of the 4 liars' own updates: within their spread, coordinate by coordinate).
  sync-2v   ZenoPS's sync runs with two validators (experiments_sync_two_validators.sh): every worker
            every round; the same rules and attacks.
  eta       ZenoPS's eta sweep (experiments_sync_tune_rho.sh, its Figure 7): sync-2v's zenops under N(0, 1),
            --zeno-eta 0.1 ... -0.1, beside "validation data only" (train_cifar10_serveronly.py): nd trained
            on the held-out share alone (the split of the same seed), at one worker's batch for as many steps
            as one worker takes, at half the workers' per-step learning rate (the script's default 0.1, its
            line 56, against the workers' 0.2).
  async-1v  ZenoPS's async runs (experiments_async_single_validator.sh): one validator, each worker sitting
            a round out with probability 0.5, 8 local steps; naive-async (alpha 0.4, its baseline) on the
            server and, where ZenoPS runs it, in the validator (the hop adds staleness), and zenops;
            attacks: none, sign flip x 2, N(0, 1), random x 8.
  async-2v  ZenoPS's async runs with two validators and two servers (experiments_async_two_validators.sh,
            its Figure 6): every worker every round; naive-async (on the servers, in the validators) and
            zenops; async-1v's attacks. No --worker-delay: here the asynchrony is the 9-12 processes' on 2
            cores.
  async-delay  async-1v's naive-async in the validator and zenops with ZenoPS's simulated asynchrony: each
            worker sleeps a uniform draw from [0, 0.1 s x the workers) before each push (ZenoPS's: 1 s x the
            workers, __init__.py 821; a tenth, so that a run takes seconds, not minutes, more).
  batch     sync-1v's zenops without an attack at a batch of 16 and 32 (ZenoPS's), for as many rounds as at 8,
            at the same learning rate a step (--lr x 8 / batch; the epochs and the warm-up scaled to the
            rounds; so every row labelled ", batch B" but zeno++'s, which keeps its authors' rate an image):
            its honest rejections against the batch, that is, against the noise of u and v.
  zeno      Zeno (icml2019_zeno test_zeno_1.sh: 8 of 20 lie, b = 12): 3 of 8 workers flip their gradient
            x 4 at every push, b = 5; mean and zeno on one gradient a push, zeno scoring on 4 x the workers'
            batch and on Zeno's own 4 images; and mean and zeno at a batch of 32 (Zeno's: 100; as the batch
            part scales it). (x 4,
            where Zeno's liars push -1 x a gradient, so that the mean fails: 3 of 8 flipped x 1 leave it
            (5 - 3) / 8 of the honest mean, Zeno's 8 of 20 (12 - 8) / 20.)
  zeno++    Zeno++ (AsyncByzGrad exp_*.sh): one gradient a push, SGD without momentum on the servers at its
            authors' rate an image (--lr 0.2 for 256: their 0.1 for 128), mean and zeno++ with one validator, under
            sign flip x 10 per push with probability 0.2 and 0.4 (its nbyz / 10 for 2 and 4 liars), nobody
            lying in the first epoch (its clean first epoch, train_cifar10.py 259; 1 of 5 here, 1 of 200 there);
            and both at a batch of 32 (v then on 128, Zeno++'s batch), for as many rounds, at the same rate an
            image.
  speed     ddp on 8 processes, beside ps sync mean on one gradient a push (a push every step, as ddp's
            allreduce) and on 8 local steps (an eighth of the pushes).
Scaled, not copied (docs/results/ps.md lists each with the authors' file and line): a batch of 8 (theirs: 32 sync,
64 async, 100 Zeno, 128 Zeno++); the recipe's learning rate (--lr 0.1 for 256 images, scaled to the
update's batch) and cosine schedule after a warm-up epoch, where ZenoPS steps 0.2 (sync) down x 0.1 and
0.4 x (1 / 9)^1/2 (async) down x 0.2 at epochs 100 and 150 of 200, and halves async alpha at 100; 5 epochs.
sync-2v runs 1 server where ZenoPS's two-validator runs have 2: in sync, 2 servers apply the same updates.
The set-up is scripts/figures/measuring.py's ACCURACY (lenet, 28 px, cosine schedule) at a batch of 8 per worker, for
5 epochs. Run processes are forked from a server that has imported torch once (measuring.run_forked). Each
run keeps its final top-1, the update counts by pushes, tensors and parameters (and the parameters that failed
each of zenops' tests), the learning rate and momentum it ran at, and images/s in ps.csv, one row
per run; a run that diverges (a non-finite loss) is a row with diverged = 1 and no top-1. Run directories go to
runs/figures/ps/<name>-seed<S>; a run whose summary.json is complete is not trained again.
"""

import argparse
import fnmatch
import json
import math
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.figures import measuring  # noqa: E402

WORKERS = 8
HELD_OUT = round(1 / (WORKERS + 1), 4)  # the validators' share of train/: a worker's (ZenoPS's)
LOCAL = ["--local-steps", "8"]  # ZenoPS's workers' steps a push (--sync-interval 8)
SUBSAMPLE = ["--worker-subsample", "0.5"]  # ZenoPS's one-validator runs
TWO_SERVERS = ["--servers", "2"]  # ZenoPS's two-validator async runs
DELAY = ["--worker-delay", str(0.1 * WORKERS)]  # ZenoPS's sleep before a push, up to 1 s x the workers: a tenth
TRIM = ["--trim-ratio", "0.2"]  # ZenoPS's trimmed mean's and phocas' b, from each round's pushes


def attack(kind, scale, draw="tensor", prob=0.2):
    return ["--attack-prob", str(prob), "--attack", kind, "--attack-scale", str(scale), "--attack-draw", draw]


ZENOPS_SYNC_ATTACKS = [("none", []), ("signflip x6", attack("signflip", 6)), ("N(0,1)", attack("gaussian", 1)),
                       ("random x8", attack("random", 8))]
ZENOPS_ASYNC_ATTACKS = [("none", []), ("signflip x2", attack("signflip", 2)), ("N(0,1)", attack("gaussian", 1)),
                        ("random x8", attack("random", 8))]
ZENO_LIARS, ZENO_B = 3, 5  # of 8: Zeno's 8 liars and b = 12 of 20, scaled
ZENO_ATTACKS = [("none", []), ("3 of 8 flip x4", ["--byzantine", str(ZENO_LIARS), "--attack", "signflip",
                                                   "--attack-scale", "4"])]
INBOUND_ATTACKS = [("4 of 8 flip x1.2", ["--byzantine", "4", "--attack", "signflip", "--attack-scale", "1.2"]),
                   ("ALIE, 4 of 8", ["--byzantine", "4", "--attack", "alie"])]  # (z: the paper's z_max, 1.15)
ZENO_PP_ATTACKS = [("none", []), ("signflip x10, p 0.2 per push", attack("signflip", 10, "push", 0.2)),
                   ("signflip x10, p 0.4 per push", attack("signflip", 10, "push", 0.4))]
ZENO_PP_LR = 0.2  # AsyncByzGrad exp_*.sh: 0.1 for a batch of 128, the same an image as 0.2 for 256
NO_MOMENTUM = ["--momentum", "0", "--lr", str(ZENO_PP_LR), "--clean-epochs", "1"]  # Zeno++'s servers, clean 1st epoch
# part: (the mode, its rules: (label, flags, validators), its attacks)
PARTS = {
    "sync-1v": ("sync", [("mean", [*LOCAL, *SUBSAMPLE], 0),
                         ("trimmed-mean", ["--aggregate", "trimmed-mean", *TRIM, *LOCAL, *SUBSAMPLE], 0),
                         ("phocas", ["--aggregate", "phocas", *TRIM, *LOCAL, *SUBSAMPLE], 0),
                         ("zenops", ["--aggregate", "zenops", *LOCAL, *SUBSAMPLE], 1)],
                ZENOPS_SYNC_ATTACKS + INBOUND_ATTACKS),
    "sync-2v": ("sync", [("mean", LOCAL, 0), ("trimmed-mean", ["--aggregate", "trimmed-mean", *TRIM, *LOCAL], 0),
                         ("phocas", ["--aggregate", "phocas", *TRIM, *LOCAL], 0),
                         ("zenops", ["--aggregate", "zenops", *LOCAL], 2)], ZENOPS_SYNC_ATTACKS + INBOUND_ATTACKS),
    "async-1v": ("async", [("naive-async", ["--aggregate", "naive-async", *LOCAL, *SUBSAMPLE], 0),
                           ("naive-async, in the validator", ["--aggregate", "naive-async", *LOCAL, *SUBSAMPLE], 1),
                           ("zenops", ["--aggregate", "zenops", *LOCAL, *SUBSAMPLE], 1)], ZENOPS_ASYNC_ATTACKS),
    "async-2v": ("async", [("naive-async", ["--aggregate", "naive-async", *LOCAL, *TWO_SERVERS], 0),
                           ("naive-async, in the validators", ["--aggregate", "naive-async", *LOCAL, *TWO_SERVERS], 2),
                           ("zenops", ["--aggregate", "zenops", *LOCAL, *TWO_SERVERS], 2)], ZENOPS_ASYNC_ATTACKS),
    "async-delay": ("async", [("naive-async, in the validator", ["--aggregate", "naive-async", *LOCAL, *SUBSAMPLE,
                                                                  *DELAY], 1),
                              ("zenops", ["--aggregate", "zenops", *LOCAL, *SUBSAMPLE, *DELAY], 1)],
                    ZENOPS_ASYNC_ATTACKS),
    "zeno": ("sync", [("mean, 1 step", [], 0), ("zeno, 1 step", ["--aggregate", "zeno", "--zeno-b", str(ZENO_B)], 2),
                      ("zeno, 1 step, scoring batch 4", ["--aggregate", "zeno", "--zeno-b", str(ZENO_B),
                                                         "--validator-batch", "4"], 2),
                      ("mean, 1 step, batch 32", [], 0),
                      ("zeno, 1 step, batch 32", ["--aggregate", "zeno", "--zeno-b", str(ZENO_B)], 2)],
             ZENO_ATTACKS),
    "zeno++": ("async", [("mean, 1 step", NO_MOMENTUM, 0),
                         ("zeno++, 1 step", ["--aggregate", "zeno++", *NO_MOMENTUM], 1),
                         ("mean, 1 step, batch 32", NO_MOMENTUM, 0),
                         ("zeno++, 1 step, batch 32", ["--aggregate", "zeno++", *NO_MOMENTUM], 1)],
               ZENO_PP_ATTACKS),
}
BATCHES = [16, 32]  # sync-1v's zenops without an attack at larger batches (ZenoPS's: 32), for as many rounds
ETAS = [0.1, 0.01, 0.001, 0, -0.001, -0.01, -0.1]
ETA_ATTACK = ZENOPS_SYNC_ATTACKS[2]  # N(0, 1), as experiments_sync_tune_rho.sh
SPEED = [("ps sync, mean, 1 step", "sync", []), ("ps sync, mean, 8 local steps", "sync", LOCAL)]
FIELDS = ["part", "mode", "aggregate", "attack", "zeno_eta", "seed", "processes", "epochs", "top1", "diverged",
          *(f"{who}{by}_{what}" for by in ("", "_tensors", "_params") for who in ("honest", "byzantine")
            for what in ("pushed", "rejected")),
          "stale_dropped",
          *(f"{who}_params_failed_{test}" for who in ("honest", "byzantine") for test in ("norm", "sign")),
          "lr", "momentum", "images_per_s", "train_s", "cpu", "cores", "gpu", "torch"]
COUNTS = FIELDS[10:27]  # (the update counts, stale_dropped and which of zenops' tests failed, from summary.json)
CURVE_FIELDS = ["part", "mode", "aggregate", "attack", "zeno_eta", "seed", "epoch", "seconds", "top1", "cpu", "cores",
                "gpu", "torch"]  # ps_curves.csv: each run's val top-1 after each epoch, at its training seconds


def plan(seeds, quick=False):
    """Every run of the table: (part, mode, aggregate label, attack label, zeno_eta, seed), seed by seed so that a
    stopped table leaves whole seeds of every row behind it. quick: a few of each part."""
    parts = PARTS if not quick else {
        "sync-1v": (PARTS["sync-1v"][0], PARTS["sync-1v"][1][::3], ZENOPS_SYNC_ATTACKS[:2]),
        "zeno++": (PARTS["zeno++"][0], PARTS["zeno++"][1][1:2], ZENO_PP_ATTACKS[::2])}
    etas = ETAS if not quick else [0.1, 0]
    runs = []
    for seed in seeds:
        for part, (mode, rules, attacks) in parts.items():
            runs += [(part, mode, label, name, None, seed) for label, *_ in rules for name, _ in attacks]
        runs += [("eta", "sync", "zenops", ETA_ATTACK[0], eta, seed) for eta in etas]
        runs += [("eta", "nd", "validation data only", "none", None, seed)]
        runs += [("batch", "sync", f"zenops, batch {b}", "none", None, seed) for b in ([] if quick else BATCHES)]
        runs += [("speed", mode, label, "none", None, seed) for label, mode, _ in SPEED[:1 if quick else 2]]
        runs += [("speed", "ddp", "ddp", "none", None, seed)]
    return runs


def flags_of(part, mode, aggregate, attack_label, zeno_eta, seed, args):
    """The recipe, its processes and its flags for one run."""
    model = measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY
    common = [*model, "--epochs", str(args.epochs), "--seed", str(seed), "-b", "8", "-p", "1000",
              "--dist-timeout", "120"]
    if mode == "ddp":
        return "ddp", WORKERS, [args.data, *common]
    if mode == "nd":  # the validators' share alone, at one worker's batch, for as many steps as one worker takes
        folder = validation_only_data(args.data, seed, HELD_OUT, Path(args.runs) / f"validation-data-seed{seed}")
        scale = (1 - HELD_OUT) / (WORKERS * HELD_OUT)  # a worker's steps an epoch / nd's on the held-out share
        scaled = {"--warmup-epochs": lambda flag: str(round(float(flag) * scale)),
                  "--lr": lambda flag: str(4 * float(flag))}  # (nd scales --lr to 8 images; a worker's step: to 64)
        model = [scaled[previous](flag) if previous in scaled else flag for previous, flag in zip(["", *model], model)]
        return "nd", 1, [folder, *model, "--epochs", str(round(args.epochs * scale)), "--seed", str(seed), "-b", "8",
                         "-p", "1000"]
    if part == "speed":
        return "ps", 1 + WORKERS, [args.data, *common, "--mode", mode, *dict((label, flags) for label, _, flags
                                                                          in SPEED)[aggregate]]
    if part == "batch":  # sync-1v's zenops at a larger batch
        return flags_of("sync-1v", mode, aggregate, attack_label, None, seed, args)
    if part == "eta":
        part = "sync-2v"
    _, rules, attacks = PARTS[part]
    flags, validators = next((flags, v) for label, flags, v in rules if label == aggregate.split(", batch ")[0]
                             or label == aggregate)
    flags = [args.data, *common, "--mode", mode, *flags, *dict(attacks + [ETA_ATTACK])[attack_label]]
    flags += ["--validation-split", str(HELD_OUT)]  # (every row: the same workers' shards beside validators or not)
    if validators:
        flags += ["--validators", str(validators)]
    if zeno_eta is not None:
        flags += ["--zeno-eta", str(zeno_eta)]
    if ", batch " in aggregate:  # as many steps as at 8, at the same lr a step (the last flags win); zeno++ at its
        # authors' rate an image, as at 8
        batch, local = int(aggregate.split()[-1]), 8 if "--local-steps" in flags else 1
        more = rounds_per_epoch(args.data, 8, local) / rounds_per_epoch(args.data, batch, local)
        lr = float(last_flag(flags, "--lr"))
        flags += ["-b", str(batch), "--epochs", str(math.ceil(args.epochs * more)), "--warmup-epochs", str(round(more)),
                  "--lr", str(lr if part == "zeno++" else lr * 8 / batch)]
    servers = int(flags[flags.index("--servers") + 1]) if "--servers" in flags else 1
    return "ps", servers + validators + WORKERS, flags


def rounds_per_epoch(data, batch, local=8):
    """A worker's rounds of `local` steps an epoch at this batch, as the recipe counts them (its shard: train/
    less the held-out share, split in 8 and padded)."""
    images = sum(1 for path in (Path(data) / "train").rglob("*") if path.is_file())
    per_worker = math.ceil((images - max(1, round(HELD_OUT * images))) / WORKERS)
    return max(1, per_worker // batch // local)


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


def require_diverged(out, name, seed):
    """A run that failed must have diverged (a non-finite loss); any other failure ends the bench with its output."""
    failure = (out / "failed.log").read_text()
    if "non-finite loss" not in failure:
        sys.exit(f"error: {name} seed {seed} failed:\n{failure[-3000:]}")


def last_flag(flags, name, default=""):
    """The value a recipe takes for `name`: its last occurrence in the flags (argparse's), else the default."""
    return flags[len(flags) - flags[::-1].index(name)] if name in flags else default


def key_of(part, mode, aggregate, attack, zeno_eta, seed):
    """A run's key in ps.csv, as its row spells it."""
    return part, mode, aggregate, attack, "" if zeno_eta is None else str(zeno_eta), str(seed)


def run(data, runs, figures_data, seeds, epochs, quick=False, only=None):
    """Every row of the table, seed by seed, into <figures_data>/ps.csv, and each run's top-1 after each epoch
    against its training seconds (evaluation left out) into ps_curves.csv; a run already finished is read back.
    only: patterns of part/aggregate/attack (fnmatch): only the runs that match are measured, every other run's
    row is kept from ps.csv as it is (a run with no row there stays out). Returns, for the part's time, what the
    measured runs replace: (their seconds, start-up included, and number; the replaced rows' training seconds,
    their start-up unknown, and number), counting only runs whose row in ps.csv was another run's."""
    args = argparse.Namespace(data=data, runs=runs, figures_data=figures_data, seeds=seeds, epochs=epochs, quick=quick)
    machine, rows, runs, csv_path = measuring.hardware(), [], Path(args.runs), Path(args.figures_data) / "ps.csv"
    curves_path, curves = Path(args.figures_data) / "ps_curves.csv", []
    kept_curves = {}  # (only) the curves of the runs not measured again, by key
    for r in measuring.read_csv(curves_path) if only and curves_path.exists() else []:
        kept_curves.setdefault(key_of(*(r[k] for k in ("part", "mode", "aggregate", "attack", "zeno_eta", "seed"))),
                               []).append(r)
    measured = {}  # (only) the measured runs' keys: (their run directory, their row)
    kept = {key_of(*(r[k] for k in ("part", "mode", "aggregate", "attack", "zeno_eta", "seed"))): r
            for r in (measuring.read_csv(csv_path) if only and csv_path.exists() else [])}
    for part, mode, aggregate, attack, zeno_eta, seed in plan(args.seeds, args.quick):
        if only and not any(fnmatch.fnmatchcase(f"{part}/{aggregate}/{attack}", pattern) for pattern in only):
            key = key_of(part, mode, aggregate, attack, zeno_eta, seed)
            rows += [kept[key]] if key in kept else []
            curves += kept_curves.get(key, [])
            continue
        name = f"{part}-{mode}-{aggregate}-{attack}" + (f"-eta{zeno_eta:g}" if zeno_eta is not None else "")
        out = runs / f"{re.sub(r'[^A-Za-z0-9.+-]+', '_', name)}-seed{seed}"
        recipe, processes, flags = flags_of(part, mode, aggregate, attack, zeno_eta, seed, args)
        summary = measuring.train(recipe, processes, flags, out, threads=1, forked=True, check=False)
        row = {"part": part, "mode": mode, "aggregate": aggregate, "attack": attack,
               "zeno_eta": "" if zeno_eta is None else zeno_eta, "seed": seed, "processes": processes,
               "lr": last_flag(flags, "--lr"), "momentum": last_flag(flags, "--momentum", "0.9"), **machine}
        if summary is None:  # an attack may make training diverge: a result of the table, not an error of it
            require_diverged(out, name, seed)
            rows.append({**row, "diverged": 1, "epochs": args.epochs})
            print(f"{name} seed {seed}: diverged (non-finite loss)", flush=True)
        else:
            rows.append({**row, "diverged": 0, "epochs": summary["epochs"], "top1": round(summary["top1"], 2),
                         **{key: summary.get(key, "") for key in COUNTS},
                         "images_per_s": round(summary["images_per_s"], 1),
                         "train_s": round(measuring.train_seconds(out), 2)})
            curves += [{**{k: row[k] for k in CURVE_FIELDS[:6]}, "epoch": epoch, "seconds": round(seconds, 2),
                        "top1": top1, **machine} for epoch, seconds, top1 in measuring.training_curve(out)]
            print(f"{name} seed {seed}: top-1 {summary['top1']:.2f} %  " + json.dumps(
                {key: summary.get(key) for key in COUNTS[:4]}), flush=True)
        measured[key_of(part, mode, aggregate, attack, zeno_eta, seed)] = (out, rows[-1])
        if not only:  # (with only, ps.csv is written once at the end: a stopped run leaves it whole)
            measuring.write_csv(csv_path, FIELDS, rows)
            measuring.write_csv(curves_path, CURVE_FIELDS, curves)
    measuring.write_csv(csv_path, FIELDS, rows)
    measuring.write_csv(curves_path, CURVE_FIELDS, curves)
    new_s = new_runs = old_s = old_runs = 0
    for key, (out, row) in measured.items():
        old = kept.get(key)
        if old is not None and all(old.get(field, "") == str(row.get(field, "")) for field in ("top1", "train_s",
                                                                                               "lr")):
            continue  # (ps.csv held this very run already)
        launch = out / "launch_seconds"
        new_s, new_runs = new_s + (float(launch.read_text()) if launch.exists() else 0.0), new_runs + 1
        if old is not None:
            old_s, old_runs = old_s + float(old["train_s"] or 0), old_runs + 1
    return new_s, new_runs, old_s, old_runs
