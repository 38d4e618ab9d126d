"""Run a recipe with NCCL's rules checked at every collective and point-to-point call, whatever the backend.

    torchrun --nproc_per_node=4 scripts/harness/nccl_rules.py -- recipes/pipeline/train.py DIR --sync adpsgd ...

The recipes send the model's tensors over device groups (NCCL on CUDA) and everything
else over gloo groups made for it (recipes/common/distributed.py: new_control_group,
whose groups are described as "control"). A recipe tested on CPU runs both kinds on
gloo, which takes what NCCL refuses; this wrapper refuses it too, so a CPU run shows
what would fail on GPUs:
  on a device group   no receive from any source (NCCL has none); no object collective
                      made by recipes/ (this project's rule, not NCCL's, which runs them by
                      copying the objects through the GPU: control traffic is the control
                      group's); every tensor on this
                      process's device (CUDA when there is one); recipes/'s isend and
                      irecv only grouped by batch_isend_irecv (posted one by one, two peers
                      that both send first wait for ever once a message outgrows NCCL's
                      buffers)
  on a control group  every tensor on the CPU (gloo sends and receives no CUDA tensor)
A call that breaks a rule ends the run with one line naming the rule and the line of
recipes/ that made the call. On CPU the device rules cannot tell the device from the
CPU; make gpu-smoke runs this wrapper on a GPU, where they can.

--collectives-per-step FILE: each rank appends one JSON line to FILE as it exits, {"rank": r,
"per_step": [n, ...]}: for each optimizer step (Run.step_done), the collectives over every
rank of the job (a group as large as the world) made since the step before, the step's own
included (the first step's count holds the set-up's; a step after an epoch's end, that end's).
"""

import argparse
import atexit
import functools
import inspect
import json
import os
import runpy
import sys
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

COLLECTIVES = ["broadcast", "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "gather",
               "scatter", "reduce", "all_to_all_single", "barrier"]
POINT_TO_POINT = ["send", "recv", "isend", "irecv"]
OBJECTS = ["all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list", "send_object_list",
           "recv_object_list"]
_inside = threading.local()  # in batch_isend_irecv: its isends and irecvs are grouped
_script = None  # the recipe this wrapper runs
_job_wide = [0]  # --collectives-per-step: the collectives over every rank since the last step (then each step's)


class RuleBroken(Exception):
    pass


def where():
    """The innermost line of this repository's recipes/ in the calling stack (else the caller's)."""
    stack = [frame for frame in traceback.extract_stack()[:-2] if "nccl_rules.py" not in frame.filename]
    frame = ([frame for frame in stack if ours(frame.filename)] or stack)[-1]
    path = Path(frame.filename).resolve()
    return f"{path.relative_to(ROOT) if ROOT in path.parents else path}:{frame.lineno} ({frame.line})"


def ours(filename):
    """Whether a file is the recipe this wrapper runs or one of recipes/."""
    path = Path(filename).resolve()
    return path == _script or (ROOT / "recipes") in path.parents


def called_from_recipes():
    """Whether the checked call was made by the recipes themselves (not by torch on their behalf)."""
    frame = sys._getframe()
    while frame is not None and Path(frame.f_code.co_filename).resolve() == Path(__file__).resolve():
        frame = frame.f_back
    return frame is not None and ours(frame.f_code.co_filename)


def is_control(group):
    return group is not None and getattr(group, "group_desc", "") == "control"


def tensors_of(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_of(item)]
    return []


def device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def broken(rule, name):
    message = f"nccl-rules: rank {dist.get_rank() if dist.is_initialized() else 0}: {name}: {rule}, at {where()}"
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    raise RuleBroken(message)


def check(name, group, tensors, any_source=False):
    if is_control(group):
        if any(t.device.type != "cpu" for t in tensors):
            broken("a tensor on the device over a control (gloo) group", name)
        return
    if any_source:
        broken("a receive from any source on a device group", name)
    if name in OBJECTS and called_from_recipes():  # (torch.distributed.pipelining sends its shapes this way)
        broken("an object collective on a device group (control traffic goes over the control group)", name)
    here = device()
    if any(t.device != here and not (t.device.type == here.type == "cpu") for t in tensors):
        broken(f"a tensor on {[str(t.device) for t in tensors]} over a device group (this process's device: "
               f"{here})", name)
    if name in ("isend", "irecv") and not getattr(_inside, "batch", False) and called_from_recipes():
        broken("an isend or irecv not grouped by batch_isend_irecv on a device group", name)


def watched(name, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args, **kwargs):
        if getattr(_inside, "call", False):  # a call inside a checked one (send calls isend, say): checked already
            return original(*args, **kwargs)
        bound = signature.bind_partial(*args, **kwargs).arguments
        group = bound.get("group")
        # (an object list travels pickled, as bytes on the device: the tensors in it may be anywhere, meta too,
        # as torch 2.11's pipelining sends its shapes)
        values = [bound.get(key) for key in ("tensor", "tensor_list", "output_tensor", "input_tensor",
                                             "output_tensor_list", "input_tensor_list")]
        any_source = name in ("recv", "irecv") and bound.get("src") is None and bound.get("group_src") is None
        check(name, group, [t for value in values for t in tensors_of(value)], any_source)
        if "send" not in name and "recv" not in name and dist.get_world_size(group) == dist.get_world_size():
            _job_wide[-1] += 1
        _inside.call = True
        try:
            return original(*args, **kwargs)
        finally:
            _inside.call = False
    return call


def watched_batch(original):
    @functools.wraps(original)
    def call(p2p_op_list):
        _inside.batch = True
        try:
            return original(p2p_op_list)
        finally:
            _inside.batch = False
    return call


def count_per_step(path):
    """Close each step's count of collectives over every rank at Run.step_done; write them at the exit."""
    from recipes.common import bookkeeping

    step_done = bookkeeping.Run.step_done

    @functools.wraps(step_done)
    def counted(*args, **kwargs):
        try:
            return step_done(*args, **kwargs)
        finally:
            _job_wide.append(0)
    bookkeeping.Run.step_done = counted

    def write():
        with open(path, "a") as f:
            f.write(json.dumps({"rank": int(os.environ.get("RANK", 0)), "per_step": _job_wide[:-1]}) + "\n")
    atexit.register(write)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collectives-per-step", metavar="FILE",
                        help="append each rank's count of collectives over every rank at each step to FILE")
    parser.add_argument("script", help="the recipe, e.g. recipes/ps/train.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's arguments")
    args = parser.parse_args()
    c10d = dist.distributed_c10d  # (batch_isend_irecv checks its ops against the functions there)
    for name in COLLECTIVES + POINT_TO_POINT + OBJECTS:
        if hasattr(c10d, name):
            wrapper = watched(name, getattr(c10d, name))
            setattr(c10d, name, wrapper)
            setattr(dist, name, wrapper)
    dist.batch_isend_irecv = c10d.batch_isend_irecv = watched_batch(c10d.batch_isend_irecv)
    if args.collectives_per_step:
        count_per_step(args.collectives_per_step)
    global _script
    _script = Path(args.script).resolve()
    sys.argv = [args.script, *(a for a in args.args if a != "--")]
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
