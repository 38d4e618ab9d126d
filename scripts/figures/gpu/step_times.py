"""A recipe's step times, and where its steps' time goes: the launcher the GPU table runs the recipes through.

    python scripts/figures/gpu/step_times.py --epoch-images 7680 --val-images 256 recipes/apex/train.py \\
        --synthetic ... --out OUT
    python scripts/figures/gpu/step_times.py --profile-last-epoch recipes/apex/train.py DIR ... --profile 5 \\
        --out OUT
    python scripts/figures/gpu/step_times.py --summarize OUT/profile     # a trace's summary, as JSON

The recipe runs unchanged, in this process, with a mark after each optimizer step (where Run.step_done calls
EpochMeter.optimizer_step): on CUDA an event recorded on the stream, which makes the host wait for nothing;
on a CPU the clock. At each training epoch's end, where the recipe's meter waits for the device anyway, the
marks become the seconds between consecutive steps (the first step, with no mark before it, left out), and
rank 0 writes them to OUT/steps.json, a list per epoch. On a GPU a step's time is then the GPU's: from the
end of one step's work to the end of the next's, any wait for the host or the loader included.

--epoch-images and --val-images cut --synthetic's sets to that many images. --profile-last-epoch moves the
recipe's own --profile N into the middle of its last epoch (it records steps 3 to N+2 of the first, whose
loader filled its queue while the first steps compiled and autotuned). summarize() says where the profiled
steps' time went: the device's kernels by name, the time it sat idle (waiting for the host or the loader),
and the loader's wait on the host; on a CPU, the step's top-level operations.
"""

import argparse
import json
import os
import runpy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # the trace's categories of what the GPU runs
LOADER_WAIT = "enumerate(DataLoader)"  # the host's wait for the next batch, as torch.profiler names it


def add_marks(out):
    """Patch the recipes' EpochMeter: a mark per optimizer step, and steps.json in out at each training epoch's
    end."""
    import torch
    import torch.distributed as dist

    from recipes.common import metrics

    epochs, optimizer_step, summary = [], metrics.EpochMeter.optimizer_step, metrics.EpochMeter.summary

    def marked_step(meter, *args):
        optimizer_step(meter, *args)
        if meter.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            meter.__dict__.setdefault("marks", []).append(event)
        else:
            meter.__dict__.setdefault("marks", []).append(time.perf_counter())

    def summary_and_steps(meter):
        result = summary(meter)  # (waits for the device first)
        marks = meter.__dict__.pop("marks", [])
        if marks:
            cuda = meter.device.type == "cuda"
            epochs.append([round(a.elapsed_time(b) / 1000 if cuda else b - a, 6) for a, b in zip(marks, marks[1:])])
            if not dist.is_initialized() or dist.get_rank() == 0:
                (out / "steps.json").write_text(json.dumps({"device": meter.device.type, "epochs": epochs}) + "\n")
        return result

    metrics.EpochMeter.optimizer_step, metrics.EpochMeter.summary = marked_step, summary_and_steps


def profile_last_epoch():
    """Make the recipe's --profile record its steps in the middle of the last epoch: the profiler's schedule waits
    through the epochs before it (Run.epochs knows them when it starts the profiler)."""
    import torch

    from recipes.common import bookkeeping

    schedule, epochs, later = torch.profiler.schedule, bookkeeping.Run.epochs, {"steps": 0}

    def later_schedule(*, wait=0, **rest):
        return schedule(wait=wait + later["steps"], **rest)

    def epochs_then_profile(run):
        steps, epochs_left = run.steps_per_epoch, run.args.epochs - run.checkpoint.epoch
        later["steps"] = (epochs_left - 1) * steps + max(0, (steps - run.args.profile) // 2 - 2)
        return epochs(run)

    torch.profiler.schedule, bookkeeping.Run.epochs = later_schedule, epochs_then_profile


def summarize(folder, steps):
    """Where the time of the `steps` profiled steps went, from the newest Chrome trace in folder (ms per step)."""
    trace = max(Path(folder).glob("*.json"), key=lambda p: p.stat().st_mtime)
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    device = [e for e in events if e.get("cat") in DEVICE_WORK]
    per_step = lambda us: round(us / 1000 / steps, 3)  # noqa: E731 (microseconds in all -> ms per step)
    found = {"trace": trace.name, "steps": steps,
             "loader_wait_ms": per_step(sum(e["dur"] for e in events if e["name"].startswith(LOADER_WAIT)))}
    if device:  # a GPU: its busy time is the union of what ran on it; the rest it sat idle
        start, end = min(e["ts"] for e in device), max(e["ts"] + e["dur"] for e in device)
        busy, reached = 0.0, start
        for e in sorted(device, key=lambda e: e["ts"]):
            busy += max(0.0, e["ts"] + e["dur"] - max(reached, e["ts"]))
            reached = max(reached, e["ts"] + e["dur"])
        found.update(step_ms=per_step(end - start), busy_ms=per_step(busy), idle_ms=per_step(end - start - busy))
        top = by_name(device)
    else:  # a CPU: the operations each profiled step ran at its top level
        spans = [e for e in events if e["name"].startswith("ProfilerStep#")]
        found.update(step_ms=per_step(sum(e["dur"] for e in spans)), busy_ms=None, idle_ms=None)
        top = by_name(top_level(events, spans))
    step_us = max(found["step_ms"] * 1000 * steps, 1e-9)
    found["top"] = [{"name": name[:90], "ms": per_step(us), "share": round(us / step_us, 4)}
                    for name, us in sorted(top.items(), key=lambda item: -item[1])[:10]]
    return found


def stats(seconds, images_per_step):
    """The median step (ms), its 10th and 90th percentiles, and images/s at the median step."""
    deciles = statistics.quantiles(seconds, n=10, method="inclusive") if len(seconds) > 1 else seconds * 9
    median = statistics.median(seconds)
    return {"steps": len(seconds), "step_ms": round(1000 * median, 3), "step_ms_p10": round(1000 * deciles[0], 3),
            "step_ms_p90": round(1000 * deciles[8], 3), "images_per_s": round(images_per_step / median, 1)}


def by_name(events):
    totals = {}
    for e in events:
        totals[e["name"]] = totals.get(e["name"], 0.0) + e["dur"]
    return totals


def top_level(events, spans):
    """The CPU operations directly within a profiled step (on its thread, in no other operation of it)."""
    found = []
    for span in spans:
        inside = sorted((e for e in events if e.get("cat") == "cpu_op" and e["tid"] == span["tid"] and
                         span["ts"] <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"]),
                        key=lambda e: (e["ts"], -e["dur"]))
        reached = span["ts"]
        for e in inside:
            if e["ts"] >= reached:
                found.append(e)
                reached = e["ts"] + e["dur"]
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epoch-images", type=int, help="--synthetic's training set, in images")
    parser.add_argument("--val-images", type=int, help="--synthetic's validation set, in images")
    parser.add_argument("--profile-last-epoch", action="store_true", help="--profile N: N steps of the last epoch")
    parser.add_argument("--summarize", metavar="FOLDER", help="print the summary of FOLDER's newest trace")
    parser.add_argument("--steps", type=int, default=1, help="--summarize: the steps the trace holds")
    parser.add_argument("recipe", nargs=argparse.REMAINDER, help="the recipe's train.py and its flags")
    args = parser.parse_args(argv)
    if args.summarize:
        return print(json.dumps(summarize(args.summarize, args.steps), indent=2))
    if not args.recipe or "--out" not in args.recipe:
        parser.error("give a recipe's train.py and its flags, --out among them")
    from recipes.common import data

    if args.epoch_images:
        data.SYNTHETIC_TRAIN_IMAGES = args.epoch_images
    if args.val_images:
        data.SYNTHETIC_VAL_IMAGES = args.val_images
    add_marks(Path(args.recipe[args.recipe.index("--out") + 1]))
    if args.profile_last_epoch:
        profile_last_epoch()
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    sys.argv = args.recipe
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
