"""Measure what fault tolerance costs and how fast a run recovers, on the demo set-up.

    python scripts/bench_recovery.py                  # ResNet-18 on data/mnist5k, 2 processes
    python scripts/bench_recovery.py --quick DIR      # lenet on a tiny folder (for tests)

1. Seconds per checkpoint save: the recipes' own checkpoint.save on the demo
   model with its optimizer state, repeated, median taken.
2. A 2-process ddp run under `torchrun --max-restarts=1 ... --auto-resume` whose
   rank 1 is SIGKILLed in epoch 2 (scripts/inject_fault.py): the time from the
   kill to the first training step of the restarted workers, the epoch time, and
   whether the run then finished.
3. What the per-step stop check costs (faults.StopCheck.after_step: did any rank
   get SIGTERM, is any loss non-finite? agreed without waiting, read a step later):
   microseconds per call on 2 processes, and its share of one training step of the
   run in 2.
Writes figures/data/recovery.json (with the hardware) and prints it. The killed
run goes to runs/figures/recovery/; once it has finished, a new start reads it
again instead of training it again.
"""

import argparse
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from recipes.common import checkpoint, faults, models  # noqa: E402
from scripts import measuring  # noqa: E402
from scripts.measuring import DEMO_MODEL, QUICK_MODEL, hardware  # noqa: E402

DEMO = [*DEMO_MODEL, "-b", "32", "--lr", "0.05", "-j", "1", "--seed", "0"]
QUICK = [*QUICK_MODEL, "-b", "4", "-j", "0", "--seed", "0"]


def seconds_per_save(arch, num_classes, repeats):
    """The recipes' save(): check the weights, build the state, write it atomically (one process)."""
    model = models.build_model(arch, num_classes)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    size = 28 if arch != "lenet" else 16
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
               "--max-restarts=1", str(ROOT / "scripts" / "inject_fault.py"), "--fault", "kill",
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


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k", help="the demo digits (make demo writes them)")
    parser.add_argument("--quick", metavar="DIR", help="lenet on this tiny folder instead, for tests")
    parser.add_argument("--json", default="figures/data/recovery.json", help="where to write the results")
    parser.add_argument("--runs", default="runs/figures/recovery", help="where the killed run goes")
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
               "hardware": hardware(), "command": " ".join(["python", "scripts/bench_recovery.py", *sys.argv[1:]])}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    measuring.record_part(Path(args.json).parent, "recovery", started)
    if not recovery["finished"]:
        sys.exit("error: the killed run did not finish after its restart")


if __name__ == "__main__":
    main()
