"""Measure what fault tolerance costs and how fast a run recovers, on the demo set-up.

    python scripts/figures/recovery/measure.py                  # ResNet-18 on data/mnist5k, 2 processes
    python scripts/figures/recovery/measure.py --quick DIR      # lenet on a tiny folder (for tests)

1. Seconds per checkpoint save: the recipes' own checkpoint.save on the demo
   model with its optimizer state, repeated, median taken.
2. A 2-process ddp run under `torchrun --max-restarts=1 ... --auto-resume` whose
   rank 1 is SIGKILLed in epoch 2 (scripts/harness/inject_fault.py): the time from the
   kill to the first training step of the restarted workers, the epoch time, and
   whether the run then finished.
3. What the per-step stop check costs (faults.StopCheck.after_step: did any rank
   get SIGTERM, is any loss non-finite? agreed without waiting, read a step later):
   microseconds per call on 2 processes, and its share of one training step of the
   run in 2.
4. The same restart for every recipe that trains on several processes (lenet on the
   digits, 3 epochs, the kill a third into epoch 2): ddp; fsdp in each --shard mode,
   with and without --sharded-checkpoint (from which --auto-resume then resumes); ps
   sync and async, a worker killed and a server killed; the pipeline under each
   --sync, a stage killed. Per row: the seconds from the kill to the first step after
   the restart, the steps redone (rank 0's, from its position at the kill back to the
   checkpoint resumed from), and the final top-1 against uninterrupted runs: the same
   seed where the method is deterministic (it must be equal), else seeds 0, 1 and 2
   (it should lie within their range).
Writes figures/data/recovery.json and recovery_recipes.csv (with the hardware) and
prints them. The runs go to runs/figures/recovery/; once one has finished, a new
start reads it again instead of training it again.
"""

import argparse
import csv
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from recipes.common import checkpoint, faults, models  # noqa: E402
from scripts.figures import measuring  # noqa: E402
from scripts.figures.measuring import DEMO_MODEL, QUICK_MODEL, hardware  # noqa: E402

DEMO = [*DEMO_MODEL, "-b", "32", "--lr", "0.05", "-j", "1", "--seed", "0"]
QUICK = [*QUICK_MODEL, "-b", "4", "-j", "0", "--seed", "0"]
# the per-recipe rows: lenet on the digits (the ps and pipeline tables' model), -b 16 per process, print every step
RECIPES = ["-a", "lenet", "--image-size", "28", "-b", "16", "--lr", "0.1", "-j", "0", "-p", "1", "--epochs", "3"]
QUICK_RECIPES = [*QUICK_MODEL, "-b", "4", "-j", "0", "-p", "1", "--epochs", "3"]
PIPELINE = ["--stages", "2", "--microbatches", "2"]
# (row, recipe, processes, flags, the rank killed, deterministic: a resumed run ends exactly as an uninterrupted one;
# not async ps, partial reduce and HetPipe, which depend on arrival order, nor AD-PSGD, whose replicas stay apart
# while its checkpoint holds replica 0's weights, so that a resume starts every replica from those)
CASES = [("ddp", "ddp", 2, [], 1, True)] + [
    (f"fsdp {shard}{' sharded checkpoint' if dcp else ''}", "fsdp", 2, ["--shard", shard, *dcp], 1, True)
    for shard in ("none", "optimizer", "grad-op", "full") for dcp in ([], ["--sharded-checkpoint"])
    if not (shard == "optimizer" and dcp)] + [
    (f"ps {mode}, {what} killed", "ps", 4, ["--mode", mode, "--servers", str(servers)], victim, mode == "sync")
    for mode in ("sync", "async") for what, servers, victim in (("a worker", 1, 3), ("a server", 2, 1))] + [
    (f"pipeline {sync}", "pipeline", 6 if sync == "hetpipe" else 4, [*PIPELINE, "--sync", sync], 3,
     sync == "allreduce") for sync in ("allreduce", "preduce", "adpsgd", "hetpipe")]
RECIPE_FIELDS = ["row", "recipe", "processes", "killed_rank", "deterministic", "finished", "kill_to_first_step_s",
                 "steps_redone", "steps_per_epoch", "top1", "reference_top1", "reference_min", "reference_max",
                 "as_uninterrupted", "cpu", "cores", "gpu", "torch"]


def seconds_per_save(arch, num_classes, repeats):
    """The recipes' save(): check the weights, build the state, write it atomically (one process)."""
    size = 28 if arch != "lenet" else 16
    model = models.build_model(arch, num_classes, size)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    model(torch.randn(2, 3, size, size)).sum().backward()
    optimizer.step()  # the momentum buffers exist, as in a real checkpoint
    times = []
    with tempfile.TemporaryDirectory(dir=ROOT / "runs") as out:
        for _ in range(repeats):
            start = time.perf_counter()
            faults.check_finite(model, 1, 0)
            state = {"arch": arch, "num_classes": num_classes, "epoch": 1, "step": 0, "model": model.state_dict(),
                     "optimizer": optimizer.state_dict(), "rng": checkpoint.rng_states()}
            checkpoint.save(state, out, is_best=False)
            times.append(time.perf_counter() - start)
        size_mb = (Path(out) / "checkpoint.pt").stat().st_size / 1e6
    return statistics.median(times), size_mb


def _time_stop_checks(rank, port, calls, result):
    device = f"cuda:{rank}" if torch.cuda.device_count() >= 2 else "cpu"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    check = faults.StopCheck(steps_per_epoch=calls, group=dist.new_group(backend="gloo"))  # (the control group)
    loss = torch.tensor(1.0, device=device)
    for step in range(calls // 10):  # warm up
        check.after_step(loss, 0, step)
    check.at_epoch_end(0)
    dist.barrier()
    start = time.perf_counter()
    for step in range(calls):
        check.after_step(loss, 0, step)
    check.at_epoch_end(0)
    if rank == 0:
        Path(result).write_text(str((time.perf_counter() - start) / calls))
    dist.destroy_process_group()


def seconds_per_stop_check(calls):
    """faults.StopCheck.after_step as every rank calls it after each step: an allreduce of two numbers over gloo,
    started without waiting, and the last one's result read."""
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(_time_stop_checks, args=(port, calls, f"{tmp}/seconds"), nprocs=2)
        return float(Path(f"{tmp}/seconds").read_text())


def killed_run(data, flags, out, steps_per_epoch, into_epoch_2):
    times = out / "times.jsonl"
    command = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "--max-restarts=1", str(ROOT / "scripts" / "harness" / "inject_fault.py"), "--fault", "kill",
               "--step", str(steps_per_epoch + into_epoch_2), "--rank", "1", "--times", str(times), "--",
               str(ROOT / "recipes" / "ddp" / "train.py"), str(data), *flags, "--epochs", "2", "--auto-resume",
               "--out", str(out / "run")]
    launch = measuring.launch_of("ddp", 2, command, threads=1)
    finished = measuring.finished_summary(out, launch) is not None  # (from an earlier start)
    if finished:
        measuring.note_reused(out)
    else:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        (out / "launch.json").write_text(json.dumps(launch, indent=2) + "\n")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if torch.cuda.device_count() == 1:
            env["CUDA_VISIBLE_DEVICES"] = ""  # two processes need two GPUs: on one, measure on the CPU
        started = time.perf_counter()
        result = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, env=env)
        measuring.note_trained(out, time.perf_counter() - started)
        finished = result.returncode == 0 and (out / "run" / "summary.json").exists()
        if finished:
            shutil.copy(out / "run" / "summary.json", out / "summary.json")  # what a new start looks for
    events = [json.loads(line) for line in times.read_text().splitlines()] if times.exists() else []
    fault = next((e["time"] for e in events if e["event"] == "fault"), None)
    resumed = min((e["time"] for e in events if e["event"] == "first_step"), default=None)
    with open(out / "run" / "metrics.csv", newline="") as f:
        epoch_s = next(float(row["epoch_s"]) for row in csv.DictReader(f) if row["split"] == "train")
    return {"finished": finished, "kill_to_first_step_s": resumed - fault if fault and resumed else None,
            "train_epoch_s": epoch_s, "steps_redone": into_epoch_2}


def position(line):
    """(epoch, step) done, from a progress line 'epoch E step S/N ...' (counting from 1) or a resume line
    'resuming ...: E epoch(s) and S step(s) done'; and N (or None)."""
    found = re.search(r"epoch (\d+) step (\d+)/(\d+)", line)
    if found:
        epoch, step, steps = map(int, found.groups())
        return (epoch - 1, step), steps
    found = re.search(r"(\d+) epoch\(s\) and (\d+) step\(s\) done", line)
    return (tuple(map(int, found.groups())), None) if found else (None, None)


def steps_redone(output):
    """Rank 0's steps between its last progress line before the restart and the checkpoint resumed from."""
    lines = output.splitlines()
    resumed = next(i for i, line in enumerate(lines) if line.startswith("resuming ") and "done" in line)
    last = [found for found in (position(line) for line in lines[:resumed] if line.startswith("epoch "))
            if found[0] is not None][-1]  # (the last progress line: not an epoch's train or val line)
    (epoch, step), steps = last
    (resumed_epoch, resumed_step), _ = position(lines[resumed])
    return (epoch - resumed_epoch) * steps + step - resumed_step, steps


def victim_steps(case, train_images, batch):
    """The steps per epoch of the rank a case kills, as it counts them (a sync parameter-server worker its pushes;
    async, the server's updates, as a worker's pulls see them: faster workers may take a slow one's share)."""
    _, recipe, processes, extra, victim, _ = case
    if recipe == "ps":
        servers = int(extra[extra.index("--servers") + 1])
        workers = processes - servers
        steps = -(-train_images // workers) // batch
        return steps * workers if "async" in extra else steps
    shards = processes // 2 - ("hetpipe" in extra) if recipe == "pipeline" else processes  # replicas
    return -(-train_images // shards) // batch


def killed_recipe(data, flags, case, out, victim_steps_per_epoch):
    """One row's recipe under torchrun --max-restarts=1 --auto-resume, rank `victim` SIGKILLed a third into epoch 2
    (counted as victim_steps counts them): the row's measurements."""
    row, recipe, processes, extra, victim, _ = case
    times = out / "times.jsonl"
    fault = ["--fault", "kill", "--step", str(victim_steps_per_epoch + victim_steps_per_epoch // 3), "--rank",
             str(victim), "--times", str(times), *(["--by-version"] if recipe == "ps" and "async" in extra else [])]
    command = [*measuring.python_command(processes)[1:], "--max-restarts=1",
               str(ROOT / "scripts" / "harness" / "inject_fault.py"),
               *fault, "--", str(ROOT / "recipes" / recipe / "train.py"), str(data), *flags, *extra, "--auto-resume",
               "--out", str(out / "run")]
    launch = measuring.launch_of(recipe, processes, command, threads=1)
    if measuring.finished_summary(out, launch) is not None:
        measuring.note_reused(out)
    else:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        (out / "launch.json").write_text(json.dumps(launch, indent=2) + "\n")
        started = time.perf_counter()
        result = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""))
        measuring.note_trained(out, time.perf_counter() - started)
        (out / "output.log").write_text(result.stdout + result.stderr)
        if result.returncode == 0 and (out / "run" / "summary.json").exists():
            shutil.copy(out / "run" / "summary.json", out / "summary.json")  # what a new start looks for
    events = [json.loads(line) for line in times.read_text().splitlines()] if times.exists() else []
    killed = next((e["time"] for e in events if e["event"] == "fault"), None)
    resumed = min((e["time"] for e in events if e["event"] == "first_step"), default=None)
    finished = (out / "summary.json").exists()
    redone, steps = steps_redone((out / "output.log").read_text()) if finished else (None, None)
    return {"row": row, "recipe": recipe, "processes": processes, "killed_rank": victim, "finished": finished,
            "kill_to_first_step_s": round(resumed - killed, 1) if killed and resumed else None,
            "steps_redone": redone, "steps_per_epoch": steps,
            "top1": json.loads((out / "summary.json").read_text())["top1"] if finished else None}


def slug(row):
    return re.sub(r"[^a-z0-9]+", "-", row).strip("-")


def recipe_rows(data, flags, runs, train_images, quick, only=None):
    """Every case (only: those whose slug() is in it) killed and restarted, beside its uninterrupted runs (seed 0;
    and 1, 2 where not deterministic)."""
    rows, batch = [], int(flags[flags.index("-b") + 1])
    for case in CASES:
        row, recipe, processes, extra, _, deterministic = case
        name = slug(row)
        if only and name not in only:
            continue
        measured = killed_recipe(data, [*flags, "--seed", "0"], case, runs / name / "killed",
                                 victim_steps(case, train_images, batch))
        seeds = [0] if deterministic or quick else measuring.SEEDS
        references = [measuring.train(recipe, processes, [data, *flags, *extra, "--seed", seed],
                                      runs / name / f"seed{seed}", threads=1, env={"CUDA_VISIBLE_DEVICES": ""})["top1"]
                      for seed in seeds]
        top1 = measured["top1"]
        same = top1 is not None and (top1 == references[0] if deterministic else
                                     min(references) <= top1 <= max(references))
        rows.append({**measured, "deterministic": deterministic, "reference_top1": references[0],
                     "reference_min": min(references), "reference_max": max(references), "as_uninterrupted": same,
                     **hardware()})
        print(f"{row:36s} {measured['kill_to_first_step_s']} s to the first step after the restart, "
              f"{measured['steps_redone']} steps redone, top-1 {top1} (uninterrupted: {references})", flush=True)
    return rows


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k", help="the demo digits (make demo writes them)")
    parser.add_argument("--quick", metavar="DIR", help="lenet on this tiny folder instead, for tests")
    parser.add_argument("--json", default="figures/data/recovery.json", help="where to write the results")
    parser.add_argument("--runs", default="runs/figures/recovery", help="where the killed run goes")
    parser.add_argument("--cases", nargs="+", choices=[slug(case[0]) for case in CASES],
                        help="the per-recipe rows to measure (default: all)")
    args = parser.parse_args()
    data, flags, arch = (args.quick, QUICK, "lenet") if args.quick else (args.data, DEMO, "resnet18")
    if not (Path(data) / "train").is_dir():
        sys.exit(f"error: {data} has no train/ folder; run `python scripts/make_demo_data.py` first")
    num_classes = len([d for d in (Path(data) / "train").iterdir() if d.is_dir()])
    train_images = sum(1 for _ in (Path(data) / "train").rglob("*.*"))
    batch = int(flags[flags.index("-b") + 1])
    steps_per_epoch = -(-train_images // 2) // batch  # the sampler pads to an even split, the loader drops

    (ROOT / "runs").mkdir(exist_ok=True)
    save_s, size_mb = seconds_per_save(arch, num_classes, repeats=3 if args.quick else 10)
    recovery = killed_run(data, flags, Path(args.runs), steps_per_epoch, into_epoch_2=steps_per_epoch // 3)
    check_s = seconds_per_stop_check(calls=200 if args.quick else 5000)
    step_s = recovery["train_epoch_s"] / steps_per_epoch
    results = {"arch": arch, "data": str(data), "processes": 2, "global_batch": 2 * batch,
               "checkpoint_mb": round(size_mb, 2), "seconds_per_save": round(save_s, 4),
               "save_share_of_epoch": round(save_s / recovery["train_epoch_s"], 5), **recovery,
               "stop_check_us": round(1e6 * check_s, 1), "stop_check_share_of_step": round(check_s / step_s, 6),
               "hardware": hardware(), "command": " ".join(["python", "scripts/figures/recovery/measure.py",
                                                            *sys.argv[1:]])}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    rows = recipe_rows(data, QUICK_RECIPES if args.quick else RECIPES, Path(args.runs) / "recipes", train_images,
                       args.quick, args.cases)
    measuring.write_csv(Path(args.json).with_name("recovery_recipes.csv"), RECIPE_FIELDS, rows)
    measuring.record_part(Path(args.json).parent, "recovery", started)
    unfinished = [row["row"] for row in rows if not row["finished"]] + ([] if recovery["finished"] else ["ddp demo"])
    if unfinished:
        sys.exit(f"error: killed runs that did not finish after their restart: {', '.join(unfinished)}")


if __name__ == "__main__":
    main()
