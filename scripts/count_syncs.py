"""Run a recipe on CUDA and count the host synchronisations of its training steps, by where they come from.

    python scripts/count_syncs.py --json syncs.json -- recipes/ddp/train.py DIR -a resnet18 ...

A synchronisation makes the CPU wait for the GPU (`loss.item()`, a copy to the host, a
CUDA tensor turned into a Python number): while it waits, it queues no work, and the GPU
then idles until it does. torch.cuda.set_sync_debug_mode("warn") warns at each one; this
wrapper counts the warnings raised in the training process's main thread between one
optimizer step and the next (Run.step_done), leaving out each epoch's first --skip steps
(the loader's start, the meter's one timed synchronisation, the first progress line), and
names the line of recipes/ (else of torch) that asked for each. Give the recipe a
--print-freq above its steps per epoch: a progress line reads the loss, once per line.
Writes --json: the steps counted, the synchronisations, per step, and by source.
"""

import argparse
import collections
import json
import runpy
import sys
import threading
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from recipes.common import bookkeeping  # noqa: E402

SYNC_WARNING = "synchronizing CUDA operation"


def source_of(stack):
    """The innermost frame of this repository's recipes/, else the innermost outside Python's own library."""
    frames = [frame for frame in stack if "count_syncs.py" not in frame.filename and "warnings" not in frame.filename]
    ours = [frame for frame in frames if f"{Path(frame.filename).parent.parent.name}" == "recipes"
            or "/recipes/" in frame.filename]
    frame = (ours or frames or stack)[-1]
    path = Path(frame.filename)
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    return f"{name}:{frame.lineno} ({frame.line or frame.name})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where the counts go")
    parser.add_argument("--skip", type=int, default=3, help="steps left out at each epoch's start (default: 3)")
    parser.add_argument("script", help="the recipe, e.g. recipes/ddp/train.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's arguments")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: count_syncs.py counts CUDA synchronisations, and no CUDA GPU is visible here")

    state = {"counting": False, "steps": 0, "syncs": 0}
    sources = collections.Counter()
    main_thread = threading.main_thread()
    show = warnings.showwarning

    def count(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING not in str(message):
            return show(message, category, filename, lineno, file, line)
        if state["counting"] and threading.current_thread() is main_thread:
            state["syncs"] += 1
            sources[source_of(traceback.extract_stack()[:-1])] += 1
        return None

    step_done = bookkeeping.Run.step_done

    def counted_step_done(run, *step_args, **step_kwargs):
        if state["counting"]:
            state["steps"] += 1  # the step that ends here was counted whole
        try:
            return step_done(run, *step_args, **step_kwargs)
        finally:  # count from here to the next step's end, unless it is one of the epoch's first
            state["counting"] = run.step + 1 >= run.first_step + args.skip

    end_epoch = bookkeeping.Run.end_epoch

    def uncounted_end_epoch(run, *end_args, **end_kwargs):
        state["counting"] = False  # (the epoch's end synchronises on purpose)
        return end_epoch(run, *end_args, **end_kwargs)

    warnings.showwarning = count
    warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
    bookkeeping.Run.step_done = counted_step_done
    bookkeeping.Run.end_epoch = uncounted_end_epoch
    torch.cuda.set_sync_debug_mode("warn")

    def write():
        steps = state["steps"]
        result = {"steps": steps, "syncs": state["syncs"], "per_step": state["syncs"] / steps if steps else None,
                  "sources": dict(sources.most_common())}
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")

    sys.argv = [args.script, *(a for a in args.args if a != "--")]
    try:
        runpy.run_path(args.script, run_name="__main__")
    finally:
        write()


if __name__ == "__main__":
    main()
