"""Run a recipe and inject a fault after a given training step, to test recovery.

    torchrun --standalone --nproc_per_node=2 --max-restarts=1 scripts/inject_fault.py \\
        --fault kill --step 7 --rank 1 -- recipes/ddp/train.py data/mnist5k --auto-resume ...

Faults, each after the optimizer step numbered --step (counted from 1 in this process):
  kill         SIGKILL this process (a crash, an out-of-memory kill)
  term         SIGTERM this process (a scheduler's preemption notice)
  term-parent  SIGTERM the parent, i.e. torchrun's agent, which forwards it to every worker
  term-group   SIGTERM the whole process group, loader workers included (as SLURM does)
  stop         SIGSTOP this process (a hung worker: alive, connected, silent)
  nan          make this step's loss NaN (divergence)
  hang-init    never join the process group (a worker that never arrives)

--rank limits the fault to one rank, --attempt to one torchrun attempt (default 0,
so the restarted workers run clean). --times FILE appends one JSON line with the
time of the fault and, in later attempts, of the first completed step.
"""

import argparse
import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recipes.common import distributed, faults  # noqa: E402

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}


def record(path, event, **fields):
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", required=True, choices=[*SIGNALS, "term-parent", "term-group", "nan", "hang-init"])
    parser.add_argument("--step", type=int, default=1, help="inject after this training step (from 1)")
    parser.add_argument("--rank", type=int, help="only this rank (default: every rank)")
    parser.add_argument("--attempt", type=int, default=0, help="only this torchrun attempt (default: 0)")
    parser.add_argument("--times", help="append JSON lines with event times to this file")
    parser.add_argument("script", help="the recipe, e.g. recipes/ddp/train.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's arguments")
    args = parser.parse_args()

    rank = int(os.environ.get("RANK", 0))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    armed = attempt == args.attempt and (args.rank is None or args.rank == rank)
    steps = 0

    should_stop = faults.should_stop

    def should_stop_with_fault(loss, epoch, step):
        nonlocal steps
        steps += 1
        if attempt != args.attempt and steps == 1:
            record(args.times, "first_step", attempt=attempt, rank=rank)
        if armed and steps == args.step:
            record(args.times, "fault", fault=args.fault, rank=rank, epoch=epoch, step=step)
            if args.fault == "nan":
                loss = loss * float("nan")
            elif args.fault == "term-parent":
                os.kill(os.getppid(), signal.SIGTERM)
                time.sleep(2)  # let the agent's SIGTERM reach this process before the next step
            elif args.fault == "term-group":
                os.killpg(os.getpgid(0), signal.SIGTERM)
            else:
                os.kill(os.getpid(), SIGNALS[args.fault])
        return should_stop(loss, epoch, step)

    faults.should_stop = should_stop_with_fault
    if armed and args.fault == "hang-init":
        distributed.init_distributed_mode = lambda _: time.sleep(3600)

    sys.argv = [args.script, *(a for a in args.args if a != "--")]
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
