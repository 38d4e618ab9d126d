"""What sharded training needs and does not teach: whole state dicts in torch's own format, bytes per rank.

A model sharded by FSDP2's fully_shard holds DTensors: each rank keeps 1/N of every
tensor. Checkpoints stay portable by gathering the whole model and optimizer state
(torch.distributed.checkpoint.state_dict, every rank taking part) and by keying the
optimizer state by parameter index, as torch.optim does, not by name, as DCP does.
ZeroRedundancyOptimizer (ZeRO-1) consolidates its shards on rank 0 instead.
"""

import resource
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from recipes.common import RecipeError, distributed

GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU only
SCATTER = StateDictOptions(full_state_dict=True)  # every rank passes the whole state and keeps its shard


def check_args(args):
    """The sharded recipe's flags that its --shard mode cannot take: one line each."""
    fsdp = args.shard in ("grad-op", "full")
    if fsdp and args.sync_bn:
        raise RecipeError(f"--sync-bn with --shard {args.shard}: the recipe runs SyncBatchNorm only under DDP; "
                          f"use --shard none or optimizer")
    if fsdp and args.ema_decay is not None:
        raise RecipeError(f"--ema-decay with --shard {args.shard}: the average would be a whole copy of the "
                          f"weights on every rank, the memory sharding saves; use --shard none or optimizer")
    if fsdp and args.amp_backend == "apex":
        raise RecipeError(f"--amp-backend apex with --shard {args.shard}: fully_shard casts by its "
                          f"MixedPrecisionPolicy; use --amp-backend native")
    if args.shard == "optimizer" and args.opt_level == "O2" and args.amp_backend == "native":
        raise RecipeError("--opt-level O2 with --shard optimizer: ZeroRedundancyOptimizer partitions the weights it "
                          "was given, which O2's fp32 master copies would replace; use O1, or --shard grad-op or "
                          "full (fully_shard keeps the sharded weights in fp32 as the master copy)")
    zero1 = "ZeroRedundancyOptimizer has no sharded state dict (its state is consolidated on rank 0 for checkpoint.pt)"
    if args.shard == "optimizer" and args.sharded_checkpoint:
        raise RecipeError(f"--sharded-checkpoint with --shard optimizer: {zero1}; use grad-op or full")
    if args.shard == "optimizer" and args.resume and Path(args.resume).is_dir():
        raise RecipeError(f"--resume {args.resume} (a --sharded-checkpoint directory) with --shard optimizer: "
                          f"{zero1}; resume its checkpoint.pt, or use another --shard")
    if args.sharded_checkpoint and args.ema_decay is not None:
        raise RecipeError("--sharded-checkpoint with --ema-decay: the sharded checkpoint holds no EMA model; "
                          "drop one of them (checkpoint.pt keeps the EMA)")
    return args


def is_sharded(model):
    """True for a model sharded by fully_shard (its parameters are DTensors, except while a block is gathered)."""
    return any(isinstance(module, FSDPModule) for module in model.modules())


def reshard(model):
    """Free the gathered weights: reshard_after_forward=False keeps them after a forward that no backward
    follows (evaluation), and a state dict taken then would hold them instead of the shards."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def model_state(model):
    """The whole model's state dict: gathered to rank 0 for a sharded model (other ranks get {}); every rank of
    a sharded model calls it."""
    if not is_sharded(model):
        return model.state_dict()
    reshard(model)
    return get_model_state_dict(model, options=GATHER)


def load_model_state(model, state):
    if is_sharded(model):
        set_model_state_dict(model, dict(state), options=SCATTER)  # (it turns the dict's values into DTensors)
    else:
        model.load_state_dict(state)


def optimizer_state(model, optimizer):
    """The whole optimizer state in torch.optim's format (keyed by parameter index), on rank 0; every rank
    calls it, and ranks other than 0 may get None."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)  # each rank sends the state of the parameters it owns
        return optimizer.state_dict() if dist.get_rank() == 0 else None
    if not is_sharded(model):
        return optimizer.state_dict()
    state = get_optimizer_state_dict(model, optimizer, options=GATHER)
    if not state:
        return None
    index = {name: i for i, name in enumerate(parameter_names(model, optimizer))}
    return {"state": {index[name]: value for name, value in state["state"].items()},
            "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                             for group in state["param_groups"]]}


def load_optimizer_state(model, optimizer, state):
    """Load a whole optimizer state (torch.optim's format, on every rank); each rank keeps its own shard."""
    if not is_sharded(model):  # (ZeroRedundancyOptimizer keeps the part of the parameters it owns)
        optimizer.load_state_dict(state)
        return
    names = parameter_names(model, optimizer)
    by_name = {"state": {names[i]: value for i, value in state["state"].items()},
               "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                                for group in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=SCATTER)


def parameter_names(model, optimizer):
    """The optimizer's parameters by name, in the order torch.optim numbers them (group by group)."""
    name = {param: name for name, param in model.named_parameters()}
    return [name[param] for group in optimizer.param_groups for param in group["params"]]


def local_bytes(tensors):
    """Bytes of the tensors as this rank holds them: a DTensor's local shard, a tensor seen twice once."""
    seen, total = set(), 0
    for tensor in tensors:
        if isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        if tensor.numel() and tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


_held_param_bytes = weakref.WeakKeyDictionary()  # model -> the most parameter bytes seen after a forward


def watch_parameters(model):
    """After every forward, count the parameter bytes this rank holds: its shards and the blocks still gathered
    (grad-op keeps every block gathered until its backward; full only the root's). memory_per_rank reports the
    most, so param_bytes is what a step needs, not only what rests between steps."""
    shards = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]

    def after_forward(module, inputs, output):
        held = local_bytes([*shards, *module.parameters()])
        _held_param_bytes[module] = max(held, _held_param_bytes.get(module, 0))

    model.register_forward_hook(after_forward)


def memory_of_this_rank(model, optimizer, device):
    """This rank's bytes: its parameters (the most held in a step, with watch_parameters), the gradients (the
    model's, and apex O2's fp32 masters'), what the optimizer holds beside the model (its state, and O2's fp32
    master weights), its peak resident memory, and on CUDA its peak allocated memory."""
    optimizer = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer: the local optimizer of its share
    params = list(model.parameters())
    own = {id(param) for param in params}
    masters = [param for group in optimizer.param_groups for param in group["params"] if id(param) not in own]
    state = [value for per_param in optimizer.state.values() for value in per_param.values()
             if isinstance(value, torch.Tensor) and value.ndim]  # (not SGD's or Adam's scalar step counts)
    mine = {"param_bytes": max(local_bytes(params), _held_param_bytes.get(model, 0)),
            "grad_bytes": local_bytes(p.grad for p in [*params, *masters] if p.grad is not None),
            "optimizer_bytes": local_bytes([*state, *masters]),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # (Linux: KiB)
    if device.type == "cuda":
        mine["peak_cuda_bytes"] = torch.cuda.max_memory_allocated(device)
    return mine


def memory_per_rank(model, optimizer, device):
    """memory_of_this_rank on every rank (a collective), the sharded model resharded first: {name: [rank 0's,
    rank 1's, ...]}."""
    reshard(model)
    mine = memory_of_this_rank(model, optimizer, device)
    ranks = [mine]
    if dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine, group=distributed.control_group())
    return {name: [rank[name] for rank in ranks] for name in mine}


def log_memory(log, epoch, memory):
    """memory_per_rank's bytes as TensorBoard scalars, memory/<name>/rank<r>."""
    log.scalars(epoch, {f"memory/{name}/rank{rank}": value for name, values in memory.items()
                        for rank, value in enumerate(values)})
