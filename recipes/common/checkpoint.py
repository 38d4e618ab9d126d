"""Checkpoints: written atomically by rank 0, loaded safely onto every rank's device.

One schema for every recipe, a dict of tensors and plain values:

    recipe, arch, num_classes   who wrote it, and the model it holds
    image_size, normalize,      what evaluating it must repeat: the training crop (validation resizes
    opt_level, amp_dtype        to image_size / 0.875), the per-channel mean and std of the inputs,
                                the precision it trained in (O0 and None: fp32);
                                -e --resume takes them from it (settings_from)
    model                       the unwrapped model's state dict (no "module." prefixes), so any
                                recipe resumes or evaluates any other recipe's checkpoint
    optimizer, scaler, ema      their state dicts (scaler: GradScaler or apex.amp, else None;
                                ema: the --ema-decay model, else None)
    epoch, step, global_batch   where training stands: "epoch" epochs done, then "step" steps of
                                "global_batch" images into the next one (0 at an epoch's end)
    best_top1                   the best validation top-1 so far, in percent
    rng                         each rank's random state, so a run stopped mid-epoch continues
                                with the same random draws

A sharded model (fully_shard) or optimizer (ZeroRedundancyOptimizer) is gathered into
the same schema (common/sharding), so its checkpoint is like any other. With
--sharded-checkpoint, each save also writes <out>/checkpoint_dcp: a
torch.distributed.checkpoint directory into which every rank writes its own shard
(the model and optimizer; the rest, but the random state, in meta.json), which
loads without gathering the model. --resume DIRECTORY loads one, resharded when the
world size changed; no code in it runs (common/safe_dcp).

The learning-rate schedule is a function of the position, so it is not saved: a
resume puts it there (checkpoints of earlier versions hold a "scheduler" entry,
which is ignored).
"""

import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from recipes.common import RecipeError, data, distributed, faults, first_line, safe_dcp, sharding


class Checkpoint:
    """A run's training objects, handed over once; save() and resume() are one call each.

    epoch, step and best_top1 say where training stands: set by resume(), moved by save().
    """

    def __init__(self, args, model, optimizer, scheduler=None, ema=None, scaler=None, *, num_classes, global_batch,
                 steps_per_epoch, device, group=None):
        """group: the ranks that save and resume together (default: all of them)."""
        self.args, self.model, self.optimizer, self.scheduler, self.group = args, model, optimizer, scheduler, group
        self.ema, self.scaler, self.device = ema, scaler, device
        self.num_classes, self.global_batch, self.steps_per_epoch = num_classes, global_batch, steps_per_epoch
        self.epoch, self.step, self.best_top1 = 0, 0, 0.0

    def state_dict(self):
        """The schema above. A collective: every rank gathers the random states."""
        return {"recipe": self.args.recipe, "arch": self.args.arch, "num_classes": self.num_classes,
                "image_size": getattr(self.args, "image_size", None), "normalize": data.normalization(),
                "opt_level": getattr(self.args, "opt_level", None) or "O0",
                "amp_dtype": getattr(self.args, "amp_dtype", None),
                "epoch": self.epoch, "step": self.step, "global_batch": self.global_batch,
                "best_top1": self.best_top1, "model": sharding.model_state(self.model),
                "optimizer": sharding.optimizer_state(self.model, self.optimizer),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "ema": self.ema.state_dict() if self.ema is not None else None, "rng": rng_states(self.group)}

    def save(self, epoch, step, is_best=False):
        """Every rank calls it at the same point; rank 0 writes checkpoint.pt, and best.pt when is_best.

        A diverged run stops here (RunFailed) rather than save NaN weights.
        """
        faults.check_finite(self.model, epoch, step)
        self.epoch, self.step = epoch, step
        state = self.state_dict()
        if not dist.is_initialized() or dist.get_rank() == 0:  # (rank 0 of the world)
            save(state, self.args.out, is_best)
        if getattr(self.args, "sharded_checkpoint", False):
            meta = {key: value for key, value in state.items() if key not in ("model", "optimizer", "rng")}
            save_sharded(Path(self.args.out) / "checkpoint_dcp", self.model, self.optimizer, meta, state["rng"],
                         self.group)

    def resume(self, log):
        """Load --resume, or <out>/checkpoint.pt with --auto-resume, when there is one, and say so.

        Every rank loads it onto its own device (a collective: every rank calls it).
        """
        path = resume_path(self.args, self.group)
        if not path:
            return
        if Path(path).is_dir():
            state = load_sharded(path, self.model, self.optimizer, self.args.arch, self.num_classes, log, self.group)
        else:
            state = load(path, self.device)
        self.epoch, self.step, self.best_top1 = restore(
            state, path, self.args.arch, self.num_classes, self.model, self.optimizer, self.scheduler, self.scaler,
            self.global_batch, self.ema, self.steps_per_epoch, self.group)
        log.print(f"resuming {path} (saved by recipes/{state.get('recipe', '?')}): {self.epoch} epoch(s) and "
                  f"{self.step} step(s) done, best top-1 {self.best_top1:.2f} %")


def _replace_atomically(path, write):
    """write(file) into a temporary file beside path, then rename it over path.

    A crash at any point leaves either the old file or the new one, never half.
    """
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a writer killed mid-save
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def rng_states(group=None):
    """Every rank's random state, gathered on all ranks of group (a collective: every rank of it calls it).

    torchvision's transforms and dropout draw from torch's generators, not Python's.
    """
    state = {"cpu": torch.get_rng_state(),
             "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}
    if not dist.is_initialized():
        return [state]
    states = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, state, group=group)
    return states


def save(state, out_dir, is_best):
    """Call on rank 0 only. Writes checkpoint.pt, and best.pt when is_best."""
    path = Path(out_dir) / "checkpoint.pt"
    path.parent.mkdir(parents=True, exist_ok=True)  # (a role that saves before rank 0 has written into it)
    _replace_atomically(path, lambda f: torch.save(state, f))
    if is_best:
        with open(path, "rb") as src:
            _replace_atomically(path.with_name("best.pt"), lambda f: shutil.copyfileobj(src, f))


def save_sharded(path, model, optimizer, meta, rng, group=None):
    """--sharded-checkpoint: every rank writes its own shard of the model and optimizer into a DCP directory
    (on a file system that every node sees); rank 0 adds meta.json (the checkpoint's other entries and the
    world size) and rng.pt (every rank's random state). Written beside path, then renamed over it: a crash leaves
    the old one (or path.old). group: the gloo group of the ranks that save it (DCP plans over it)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    _barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)  # DTensors: each rank's shard
    # (a str: a Path would be pickled into .metadata, as a class that differs between Python versions)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(tmp), process_group=group)
    if rank == 0:
        world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        torch.save(rng, tmp / "rng.pt")
        (tmp / "meta.json").write_text(json.dumps({**meta, "world_size": world_size}, indent=2) + "\n")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()


def load_sharded(path, model, optimizer, arch, num_classes, log, group=None):
    """Load a --sharded-checkpoint directory: each rank reads the parts of the tensors its shards need, so a
    checkpoint saved by another number of ranks is resharded. group: the gloo group of the ranks that load it
    (DCP plans over it). Returns the checkpoint's other entries."""
    path = Path(path)
    if not (path / ".metadata").is_file() or not (path / "meta.json").is_file():
        raise RecipeError(f"{path} is a directory but not a --sharded-checkpoint of these recipes (it needs "
                          f".metadata and meta.json)")
    try:
        meta = json.loads((path / "meta.json").read_text())
        missing = {"arch", "num_classes", "epoch", "step", "best_top1", "world_size"} - set(meta)
        if missing:
            raise ValueError(f"meta.json lacks {', '.join(sorted(missing))}")
        _check_model(meta, path, arch, num_classes)  # before loading: a clearer line than a shape mismatch
        safe_dcp.read_metadata(path / ".metadata")  # refused here, on every rank, before DCP reads anything
        model_state, optimizer_state = get_state_dict(model, optimizer)  # what this rank holds: the shapes to fill
        with warnings.catch_warnings():  # (one process: DCP warns that it assumes one process)
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load({"model": model_state, "optimizer": optimizer_state}, storage_reader=safe_dcp.SafeReader(path),
                     planner=safe_dcp.WeightsOnlyPlanner(path), process_group=group,
                     no_dist=not dist.is_initialized())
    except RecipeError:
        raise
    except (Exception, dcp.CheckpointException) as error:  # a damaged meta.json or shard
        # (CheckpointException, a BaseException, holds each rank's failure: say the first)
        cause = next((failure for failure, _ in getattr(error, "failures", {}).values()), error)
        if isinstance(cause, RecipeError):
            raise cause from None
        raise RecipeError(f"sharded checkpoint {path} is corrupt or does not fit this model and optimizer: "
                          f"{first_line(cause)}") from None
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
    world_size = dist.get_world_size(group) if dist.is_initialized() else 1
    if meta["world_size"] != world_size:
        log.print(f"resharding {path}: saved by {meta['world_size']} rank(s), loaded by {world_size}")
    return {**meta, "model": None, "optimizer": None, "rng": _load_rng(path / "rng.pt")}


def _load_rng(path):
    """A sharded checkpoint's random states (none in one saved before they were kept there)."""
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # (weights_only refuses code; a cut-off file fails to unpickle)
        raise RecipeError(f"{path} is corrupt or not the random states of a sharded checkpoint: "
                          f"{first_line(error)}") from None


def _barrier():
    if dist.is_initialized():
        dist.barrier(group=distributed.control_group())


def load(path, device, mmap=False):
    """torch.load with weights_only=True: tensors and plain containers, never code (mmap: read from the file
    as needed, for a look at its small entries)."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"checkpoint {path} does not exist")
    try:
        with warnings.catch_warnings():  # torch's warnings about odd files: our one line says it
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        if "Weights only load failed" in str(error):
            raise RecipeError(f"refusing to load {path}: it holds Python objects other than tensors and "
                              f"plain containers (possibly code), which weights_only loading blocks") from None
        raise RecipeError(f"checkpoint {path} is corrupt or truncated ({first_line(error)})") from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise RecipeError(f"checkpoint {path} is corrupt or truncated ({first_line(error)})") from None
    if not isinstance(state, dict) or "model" not in state or "arch" not in state:
        raise RecipeError(f"{path} is not a checkpoint of these recipes (no 'model' and 'arch' entries)")
    return state


# what -e --resume takes from the checkpoint: its entry -> the flag that sets it
SETTINGS = {"arch": "--arch", "image_size": "--image-size", "opt_level": "--opt-level", "amp_dtype": "--amp-dtype"}


def settings_from(path):
    """The settings a checkpoint (a file, or a --sharded-checkpoint directory) was trained with, as far as it
    records them (earlier checkpoints record only arch): {entry: value}, plus normalize."""
    path = Path(path)
    if path.is_dir():
        try:
            state = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError):
            return {}  # (resume says what is wrong with it)
    else:
        state = load(path, "cpu", mmap=True)
    return {key: state[key] for key in (*SETTINGS, "normalize") if state.get(key) is not None}


def resume_path(args, group=None):
    """<out>/checkpoint.pt with --auto-resume when it exists (a relaunch continues), else --resume; with
    --sharded-checkpoint, <out>/checkpoint_dcp instead when it is at least as new (saved after checkpoint.pt at
    every save: each rank then reads only its shard).

    -e with --resume evaluates that checkpoint. Every rank must see the same
    answer (a collective: every rank calls it).
    """
    own, sharded = Path(args.out) / "checkpoint.pt", Path(args.out) / "checkpoint_dcp"
    if not getattr(args, "auto_resume", False) or (args.evaluate and args.resume):
        return args.resume
    newer = getattr(args, "sharded_checkpoint", False) and (sharded / "meta.json").exists() and (
        not own.exists() or (sharded / "meta.json").stat().st_mtime >= own.stat().st_mtime)
    mine = (own.exists() or newer, newer)  # (a checkpoint to resume, and is it the sharded one)
    found = [mine]
    if dist.is_initialized():
        found = [None] * dist.get_world_size(group)
        dist.all_gather_object(found, mine, group=group)
    own = sharded if found[0][1] else own  # (rank 0's choice: file times may differ between nodes)
    if any(exists for exists, _ in found) and not all(exists for exists, _ in found):
        missing = [rank for rank, (seen, _) in enumerate(found) if not seen]
        raise RecipeError(f"{own} exists for some ranks but not for ranks {missing}: with --auto-resume, --out "
                          f"must be on a file system that every node sees")
    return own if all(exists for exists, _ in found) else args.resume


def resume(path, device, arch, num_classes, model, optimizer=None, scheduler=None, scaler=None, global_batch=None,
           ema=None, steps_per_epoch=None):
    """restore() the checkpoint at path."""
    return restore(load(path, device), path, arch, num_classes, model, optimizer, scheduler, scaler, global_batch,
                   ema, steps_per_epoch)


def restore(state, path, arch, num_classes, model, optimizer=None, scheduler=None, scaler=None, global_batch=None,
            ema=None, steps_per_epoch=None, group=None):
    """Load a checkpoint's state into the unwrapped model (and the training state, when given).

    Returns (epochs done, steps of global_batch done in the next epoch, best top-1 so far).
    A checkpoint saved mid-epoch also restores this rank's random state when the
    world size is the one it was saved with. Resumed with another global batch,
    the learning rate follows the linear scaling rule again, and the per-step
    schedule (a LambdaLR of common/schedule, with steps_per_epoch of this run)
    continues from the same point of the run in this run's steps.
    An EMA the checkpoint lacks starts from the model's weights.
    """
    _check_model(state, path, arch, num_classes)
    try:
        if state["model"] is not None:  # (None: a sharded checkpoint, loaded already)
            sharding.load_model_state(model, state["model"])
        if optimizer is not None and state.get("optimizer"):
            sharding.load_optimizer_state(model, optimizer, state["optimizer"])
        if scaler is not None and state.get("scaler"):  # a full-precision run saved none
            scaler.load_state_dict(state["scaler"])
        if ema is not None and state.get("ema"):
            ema.load_state_dict(state["ema"])
        elif ema is not None and state["model"] is not None:
            ema.module.load_state_dict(state["model"])
    except (RuntimeError, KeyError, ValueError) as error:
        raise RecipeError(f"checkpoint {path} does not fit this model: {first_line(error)}") from None
    step, saved_batch = state.get("step", 0), state.get("global_batch")
    if global_batch and saved_batch and saved_batch != global_batch:
        if step:  # the same images done, counted in this run's global batch (rounded down)
            step = step * saved_batch // global_batch
        _rescale_lr(optimizer, global_batch / saved_batch)
    if scheduler is not None:  # the schedule is a function of the run's position: put it there, in this run's steps
        scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        scheduler.last_epoch = state["epoch"] * steps_per_epoch + step - 1
        scheduler.step()  # (no optimizer.step() before it: schedule.build_scheduler silences torch's warning)
    _check_every_rank_agrees(path, state["epoch"], step, group)
    rng = state.get("rng")
    rank, world_size = (dist.get_rank(group), dist.get_world_size(group)) if dist.is_initialized() else (0, 1)
    if step and rng and len(rng) == world_size:
        torch.set_rng_state(rng[rank]["cpu"].cpu())
        if rng[rank]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng[rank]["cuda"].cpu())
    return state["epoch"], step, state["best_top1"]


def _check_model(state, path, arch, num_classes):
    if "arch" not in state or "num_classes" not in state:
        raise RecipeError(f"{path} is not a checkpoint of these recipes (no 'arch' and 'num_classes' entries)")
    if state["arch"] != arch:
        raise RecipeError(f"checkpoint {path} holds a {state['arch']} model, not --arch {arch}")
    if state["num_classes"] != num_classes:
        raise RecipeError(f"checkpoint {path} was trained on {state['num_classes']} classes, "
                          f"but the data has {num_classes}")


def _rescale_lr(optimizer, factor):
    if optimizer is not None:
        for group in optimizer.param_groups:
            group["lr"] *= factor
            if "initial_lr" in group:
                group["initial_lr"] *= factor


def _check_every_rank_agrees(path, epoch, step, group=None):
    """Ranks that loaded different checkpoints would run different numbers of steps and hang."""
    if not dist.is_initialized():
        return
    positions = [None] * dist.get_world_size(group)
    dist.all_gather_object(positions, (epoch, step), group=group)
    if len(set(positions)) > 1:
        raise RecipeError(f"the ranks loaded {path} at different points (epoch, step): {positions}; is --out on a "
                          f"file system that every node sees, with no stale cached copy?")
