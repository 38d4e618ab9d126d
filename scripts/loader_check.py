"""Does the data loader limit a run? Launches a recipe's command twice, on its data and on --synthetic images (in
memory: nothing read, nothing decoded), times the same number of steps of each, and says which sets the pace.

    python scripts/loader_check.py -- torchrun --nproc_per_node=8 recipes/apex/train.py /data/imagenet \\
        -a resnet50 -b 256 --opt-level O2 --channels-last

The command is the one you would launch, run on one node (with two nodes, check one; it is the same loader).
Each run prints every step (-p 1) into a run directory of its own under --out, for as many epochs as it takes
(--epochs 10000: --synthetic's 12,800 images are few steps of a large global batch), and is stopped with SIGTERM
once --steps steps are timed (the recipe saves a checkpoint there and exits). The first --warmup steps, and each
epoch's first step (loader workers starting, an evaluation before it), are not timed. The synthetic run drops
--decoder (it decodes nothing). A run that prints no step for --timeout seconds is killed, with every process
it started. Real data at 90 % or more
of the synthetic speed: the loader keeps up; below that it limits the run, and the line says what to try.
--synthetic has ImageNet's 1000 classes: where the classifier is a large share of the model's work (lenet on 10
classes) the two runs differ in more than their input; for ResNet-50 on ImageNet they differ in nothing else.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.figures import measuring

STEP_LINE = re.compile(r"^epoch (\d+) step (\d+)/\d+ ")
GLOBAL_BATCH = re.compile(r"global batch (\d+)")
KEEPS_UP = 0.9  # real data at this share of the synthetic speed, or more: the loader is not what limits the run


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50, help="steps timed in each run (default: 50)")
    parser.add_argument("--warmup", type=int, default=10, help="steps run first, not timed (default: 10)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds a run may go without printing a step (default: 600)")
    parser.add_argument("--out", help="where the two runs' directories go (default: a temporary directory)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the recipe's launch command")
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not any(re.search(r"recipes/\w+/train\.py$", word) for word in args.command):
        parser.error("give a recipe's launch command after --, such as: -- torchrun --nproc_per_node=8 "
                     "recipes/ddp/train.py DIR -a resnet50")
    if "--synthetic" in args.command:
        parser.error("give the command that trains on your data, without --synthetic (the check adds it)")
    if args.steps < 2 or args.warmup < 0 or args.timeout <= 0:
        parser.error("--steps must be at least 2, --warmup at least 0 and --timeout more than 0")
    return args


def timed_steps(command, out, steps, warmup, timeout):
    """Run the command into `out`, printing every step; return (global batch, steps timed, seconds), or raise
    SystemExit with the run's last lines if it ends or prints no step for `timeout` seconds first."""
    process = subprocess.Popen([*command, "-p", "1", "--epochs", "10000", "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, batch, seen, timed, seconds, last = [], None, 0, 0, 0.0, None
    silence = threading.Timer(timeout, measuring.kill_tree, (process,))
    silence.start()
    try:
        for line in process.stdout:
            lines.append(line.rstrip())
            if batch is None and GLOBAL_BATCH.search(line):
                batch = int(GLOBAL_BATCH.search(line).group(1))
            step = STEP_LINE.match(line)
            if not step or timed >= steps:  # (stopping: read on to the end, so the recipe never blocks on a print)
                continue
            silence.cancel()
            silence = threading.Timer(timeout, measuring.kill_tree, (process,))
            silence.start()
            now, epoch, index = time.perf_counter(), int(step.group(1)), int(step.group(2))
            seen += 1
            if last is not None and last[0] == epoch and index == last[1] + 1 and seen > warmup:
                timed, seconds = timed + 1, seconds + now - last[2]
            last = (epoch, index, now)
            if timed >= steps:
                os.killpg(process.pid, signal.SIGTERM)  # the recipe saves and exits (75)
    finally:
        silence.cancel()
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        measuring.kill_tree(process)  # (torchrun's workers too, each in a session of its own)
    if timed < steps or batch is None:
        tail = "\n".join(lines[-5:])
        raise SystemExit(f"error: {' '.join(command)} stopped after {timed} timed step(s) (exit {process.returncode})"
                         f"; its last lines:\n{tail}")
    return batch, timed, seconds


def without_decoder(command):
    """The command without --decoder (--synthetic decodes nothing, and takes no --decoder gpu)."""
    kept, skip = [], False
    for word in command:
        if skip or word.startswith("--decoder="):
            skip = False
            continue
        skip = word == "--decoder"
        if not skip:
            kept.append(word)
    return kept


def verdict(real, synthetic):
    """The line that says whether the loader limits the run: real and synthetic are images/s."""
    share = real / synthetic
    if share >= KEEPS_UP:
        return (f"the loader keeps up: real data trains at {share * 100:.0f} % of the synthetic speed; "
                "what limits the run is the training step itself")
    return (f"the loader limits this run: real data trains at {share * 100:.0f} % of the synthetic speed. Try: "
            f"more loader workers (-j; its default takes every core this process may use, shared among the "
            f"node's training processes, less one each, and this node has {os.cpu_count()} cores), --decoder gpu "
            "(the JPEGs decoded on the GPU; CUDA only), or the data set copied to a local disk")


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="loader-check-"))
    rates = {}
    for name, command in (("real data", args.command), ("synthetic", [*without_decoder(args.command), "--synthetic"])):
        batch, steps, seconds = timed_steps(command, out / name.replace(" ", "-"), args.steps, args.warmup,
                                            args.timeout)
        rates[name] = batch * steps / seconds
        print(f"{name:<10} {rates[name]:10.1f} images/s  ({steps} steps of {batch} images in {seconds:.1f} s)",
              flush=True)
    print(verdict(rates["real data"], rates["synthetic"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
