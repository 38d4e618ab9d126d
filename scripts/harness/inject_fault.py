"""Run a recipe and inject a fault after a given training step, to test recovery.

    torchrun --standalone --nproc_per_node=2 --max-restarts=1 scripts/harness/inject_fault.py \\
        --fault kill --step 7 --rank 1 -- recipes/ddp/train.py data/mnist5k --auto-resume ...

Faults, each after the optimizer step numbered --step (counted from 1 in this process):
  kill         SIGKILL this process (a crash, an out-of-memory kill)
  term         SIGTERM this process (a scheduler's preemption notice)
  term-parent  SIGTERM the parent, i.e. torchrun's agent, which forwards it to every worker
  term-group   SIGTERM the whole process group, loader workers included (as SLURM does)
  stop         SIGSTOP this process (a hung worker: alive, connected, silent)
  slow         sleep 2 s after this step and every later one (a straggler: alive, its peers' waits the same
               each step, where the sleeps of a recipe's --slow-factor scale with a loaded machine's steps)
  nan          make this step's loss NaN (divergence)
  hang-init    never join the process group (a worker that never arrives)

--rank limits the fault to one rank (--others FAULT gives the other ranks
their own fault: a hung peer of the killed one, say), --attempt to one torchrun attempt (default 0,
so the restarted workers run clean). --times FILE appends one JSON line with the
time of the fault and, in later attempts, of the first completed step; a rank
whose fault is already in that file does not fire it again (torchrun agents on
different nodes count attempts separately, so --attempt alone can fire twice).
--by-version makes a parameter server's worker count the servers' updates as its
pulls see them instead of its own steps: async, faster workers can take so many of
the pushes that a slow worker's own count never reaches --step before training ends.
"""

import argparse
import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from recipes.common import bookkeeping, distributed, pushpull

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}
SLOW_S = 2.0


def record(path, event, **fields):
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def fired(path, rank):
    if not path or not os.path.exists(path):
        return False
    with open(path) as f:
        events = [json.loads(line) for line in f if line.strip()]
    return any(e["event"] == "fault" and e["rank"] == rank for e in events)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", required=True,
                        choices=[*SIGNALS, "term-parent", "term-group", "slow", "nan", "hang-init"])
    parser.add_argument("--step", type=int, default=1, help="inject after this training step (from 1)")
    parser.add_argument("--rank", type=int, help="only this rank (default: every rank)")
    parser.add_argument("--others", choices=[*SIGNALS, "nan"], help="with --rank: this fault on the other ranks")
    parser.add_argument("--attempt", type=int, default=0, help="only this torchrun attempt (default: 0)")
    parser.add_argument("--times", help="append JSON lines with event times to this file")
    parser.add_argument("--by-version", action="store_true",
                        help="a parameter server's worker: --step counts the servers' updates its pulls see")
    parser.add_argument("script", help="the recipe, e.g. recipes/ddp/train.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's arguments")
    args = parser.parse_args()

    rank = int(os.environ.get("RANK", 0))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    fault = args.fault if args.rank is None or args.rank == rank else args.others
    armed = fault is not None and attempt == args.attempt and not fired(args.times, rank)
    if args.fault == "term-parent" and "TORCHELASTIC_RUN_ID" not in os.environ:
        sys.exit("error: --fault term-parent signals torchrun's agent: run it under torchrun")
    steps, counted_by, slow = 0, None, False

    def stepped(by, loss, epoch=None, step=None, version=None):
        """After each step of this process: the fault, when it is due. Two hooks call it; the steps are counted
        by the one that fires first, which stays the one: Run.step_done in a rank that trains with a Run (a
        hetpipe replica pulls too, but its first step ends before its second pull), pushpull.pull in one without."""
        nonlocal steps, counted_by, armed, slow
        counted_by = counted_by or by
        if by != counted_by:
            return loss
        steps += 1
        if attempt != args.attempt and steps == 1:
            record(args.times, "first_step", attempt=attempt, rank=rank)
        if armed and (version if args.by_version and version is not None else steps) >= args.step:
            armed = False
            record(args.times, "fault", fault=fault, rank=rank, epoch=epoch, step=step)
            if fault == "nan":
                loss = loss * float("nan")
            elif fault == "term-parent":
                os.kill(os.getppid(), signal.SIGTERM)
                time.sleep(2)  # let the agent's SIGTERM reach this process before the next step
            elif fault == "term-group":
                os.killpg(os.getpgid(0), signal.SIGTERM)
            elif fault == "slow":
                slow = True
            else:
                os.kill(os.getpid(), SIGNALS[fault])
        if slow:
            time.sleep(SLOW_S)
        return loss

    # a Run's step (every recipe's training ranks, the parameter servers), before its stop check ...
    step_done = bookkeeping.Run.step_done
    bookkeeping.Run.step_done = lambda run, loss, *a, **k: step_done(run, stepped("run", loss, run.epoch, run.step),
                                                                     *a, **k)
    # ... or, in a rank without one (a parameter server's worker or validator), its pull before the next step
    pull, pulls = pushpull.pull, 0

    def pull_after_a_step(vector, chunks, versions, *a, **k):
        nonlocal pulls
        pulls += 1
        if pulls > 1:
            stepped("pull", None, version=max(versions))  # (the versions of the pull before this step)
        return pull(vector, chunks, versions, *a, **k)
    pushpull.pull = pull_after_a_step
    if armed and fault == "hang-init":
        distributed.launch_facts = lambda _: time.sleep(3600)

    sys.argv = [args.script, *(a for a in args.args if a != "--")]
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
