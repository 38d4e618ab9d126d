"""Run a recipe on CUDA and count the host synchronisations of its training steps, by where they come from.

    python scripts/gpu/count_syncs.py --json syncs.json -- recipes/ddp/train.py DIR -a resnet18 ...
    python scripts/gpu/count_syncs.py --stand-in --json syncs.json -- recipes/ddp/train.py DIR ...   # on a CPU

A synchronisation makes the CPU wait for the GPU (`loss.item()`, a copy to the host, a
CUDA tensor turned into a Python number): while it waits, it queues no work, and the GPU
then idles until it does. torch.cuda.set_sync_debug_mode("warn") warns at each one; this
wrapper counts the warnings raised in the training process's main thread within a training
step: from the end of one optimizer step (Run.step_done) to the end of the next one in the
same epoch, leaving out each epoch's first --skip steps (the loader's start, the meter's one
timed synchronisation, the first progress line). What follows an epoch's last step (the
epoch's meter, evaluation, the checkpoint) synchronises on purpose and is not counted. Each
is named by the line that asked for it: the recipes' own (a line of recipes/ that reads a
device tensor itself), else torch's (a line of torch's, called from a recipe's line, named
after "via"). Give the recipe a --print-freq above its steps per epoch: a progress line reads
the loss, once per line. Writes --json at each epoch's end and when the run ends (os._exit
included): the steps counted, the synchronisations, per step, and by source.

--stand-in: a CPU stands in for the GPU, to rehearse the check where there is none. A tensor
computed from the model's parameters or from a batch the recipe moved to its device is a
"device tensor"; reading one on the host (item, tolist, bool, int, float, numpy, a blocking
.cpu()) is counted as a synchronisation, as it would be on CUDA; a non-blocking copy to the
host is not (it becomes a host tensor). It counts the same lines a GPU would, as far as a
recipe takes the same code path on both: where it branches on the device (the fused SGD,
GradScaler's reads), torch's lines differ. What it cannot tell on a CPU: a tensor made
on the device by a factory (torch.zeros(..., device=device)) counts as a host tensor, and
a blocking .to(device) of a device tensor is no copy there, so only its later read counts.
"""

import argparse
import atexit
import collections
import json
import runpy
import sys
import threading
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402

from recipes.common import bookkeeping  # noqa: E402

SYNC_WARNING = "synchronizing CUDA operation"
TREE = ROOT  # the tree whose recipes/ the recipe run imports: its lines are the recipes' own (set in main)
# frames that are no line of anyone's: this wrapper, the warnings machinery, torch's dispatch to the stand-in
PLUMBING = ("count_syncs.py", "warnings.py", "torch/overrides.py", "torch/_tensor.py", "torch/utils/_device.py")


def source_of(stack):
    """The line that asked: a line of recipes/ when it is the innermost frame, else the innermost other frame,
    followed by the innermost line of recipes/ that led to it."""
    frames = [frame for frame in stack if not frame.filename.endswith(PLUMBING)] or stack
    ours = [frame for frame in frames if Path(frame.filename).resolve().is_relative_to(TREE / "recipes")]
    line = named(frames[-1])
    if ours and ours[-1] is not frames[-1]:
        line += f" via {named(ours[-1])}"
    return line


def named(frame):
    path = Path(frame.filename).resolve()  # recipes/...: in the recipe's tree (this one, or a copy of it)
    name = str(path.relative_to(TREE)) if path.is_relative_to(TREE) else "/".join(path.parts[-2:])
    return f"{name}:{frame.lineno} ({frame.line or frame.name})"


class HostReads(TorchFunctionMode):
    """--stand-in: a host read of a device tensor warns as CUDA's sync debug mode would."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu}
    COPIES = {torch.Tensor.to, torch.Tensor.cpu}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_device = any(is_device_tensor(leaf) for leaf in pytree.tree_leaves((args, kwargs)))
        if on_device and func in self.COPIES and kwargs.get("non_blocking") and to_host(args, kwargs):
            return func(*args, **kwargs).clone()  # a host copy taken without waiting: a host tensor
        if on_device and func in self.READS:
            warnings.warn(f"called a {SYNC_WARNING} (stand-in: {func.__name__} of a device tensor)")
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if on_device:
            for leaf in pytree.tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    mark(leaf)
        return out


def is_device_tensor(value):
    return isinstance(value, torch.nn.Parameter) or getattr(value, "_on_stand_in_device", False)


def mark(tensor):
    try:
        tensor._on_stand_in_device = True
    except (AttributeError, RuntimeError):  # (a tensor that takes no attributes stays a host tensor)
        pass
    return tensor


def to_host(args, kwargs):
    """Whether a .to(...) or .cpu() call asks for the CPU."""
    targets = [*args[1:], kwargs.get("device")]
    return all(t is None or str(t).startswith("cpu") or isinstance(t, torch.dtype) for t in targets)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where the counts go")
    parser.add_argument("--skip", type=int, default=3, help="steps left out at each epoch's start (default: 3)")
    parser.add_argument("--stand-in", action="store_true", help="count on a CPU what would synchronise on a GPU")
    parser.add_argument("script", help="the recipe, e.g. recipes/ddp/train.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's arguments")
    args = parser.parse_args()
    global TREE
    TREE = Path(args.script).resolve().parents[2]  # (recipes/<name>/train.py)
    if not args.stand_in and not torch.cuda.is_available():
        sys.exit("error: count_syncs.py counts CUDA synchronisations, and no CUDA GPU is visible here "
                 "(--stand-in rehearses it on a CPU)")

    state = {"counting": False, "steps": 0, "syncs": 0}
    sources, pending = collections.Counter(), collections.Counter()  # pending: the step under way's
    main_thread = threading.main_thread()
    show = warnings.showwarning

    def count(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING not in str(message):
            return show(message, category, filename, lineno, file, line)
        if state["counting"] and threading.current_thread() is main_thread:
            pending[source_of(traceback.extract_stack()[:-1])] += 1
        return None

    def write():
        steps = state["steps"]
        result = {"steps": steps, "syncs": state["syncs"], "per_step": state["syncs"] / steps if steps else None,
                  "sources": dict(sources.most_common()), "stand_in": args.stand_in}
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")

    step_done = bookkeeping.Run.step_done

    def counted_step_done(run, *step_args, **step_kwargs):
        try:
            return step_done(run, *step_args, **step_kwargs)
        finally:
            if state["counting"]:  # the step that ends here was counted whole
                state["steps"] += 1
                state["syncs"] += sum(pending.values())
                sources.update(pending)
            pending.clear()
            # from here to the next step's end, unless it is one of the epoch's first or there is none
            state["counting"] = run.first_step + args.skip <= run.step + 1 < run.steps_per_epoch

    end_epoch = bookkeeping.Run.end_epoch

    def uncounted_end_epoch(run, *end_args, **end_kwargs):
        state["counting"] = False  # (the epoch's end synchronises on purpose)
        pending.clear()
        write()
        return end_epoch(run, *end_args, **end_kwargs)

    warnings.showwarning = count
    warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
    bookkeeping.Run.step_done = counted_step_done
    bookkeeping.Run.end_epoch = uncounted_end_epoch
    atexit.register(write)  # (the recipes end through os._exit, after the exit handlers)
    if args.stand_in:
        device_transform = bookkeeping.data.device_transform

        def marked_transform(*transform_args, **transform_kwargs):  # the batches on "the device"
            moved = device_transform(*transform_args, **transform_kwargs)
            return lambda *batch: tuple(mark(t) for t in moved(*batch))

        bookkeeping.data.device_transform = marked_transform
        HostReads().__enter__()  # (for the rest of the process)
    else:
        torch.cuda.set_sync_debug_mode("warn")
    sys.argv = [args.script, *(a for a in args.args if a != "--")]
    try:
        runpy.run_path(args.script, run_name="__main__")
    finally:
        write()


if __name__ == "__main__":
    main()
