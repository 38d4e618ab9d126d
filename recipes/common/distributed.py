"""Process-group set-up for the three launch styles, and what each process needs to know.

1. torchrun (and `python -m torch.distributed.launch`, which also passes
   --local-rank): RANK, WORLD_SIZE and LOCAL_RANK come from the environment.
2. --dist-url tcp://HOST:PORT --world-size N --rank R: one process per command,
   or with --multiprocessing-distributed one spawned process per local device,
   N nodes and R the node rank (as in pytorch/examples imagenet; common/launch.py
   spawns them).
3. plain `python train.py`: a process group of one, so the same code runs.
"""

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from recipes.common import RecipeError


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self):
        return self.rank == 0


def local_device_count():
    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def init_distributed_mode(args):
    """Join (or form) the process group; return this process's rank and device."""
    store = None
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun or torch.distributed.launch
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", max(args.local_rank, 0)))
        init_method, where = "env://", f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's store outlives restarts
            init_method, store = None, _store_for_this_attempt(args.dist_timeout, where)
    elif args.dist_url:
        if args.world_size < 1 or args.rank < 0:
            raise RecipeError("--dist-url needs --world-size and --rank")
        if hasattr(args, "spawned_local_rank"):  # --multiprocessing-distributed: world and rank count nodes
            local_world_size = local_device_count()
            local_rank = args.spawned_local_rank
            rank, world_size = args.rank * local_world_size + local_rank, args.world_size * local_world_size
        else:
            local_world_size = 1
            rank, world_size = args.rank, args.world_size
            local_rank = args.local_rank if args.local_rank >= 0 else rank % local_device_count()
        if rank >= world_size:
            raise RecipeError(f"--rank {args.rank} is out of range for --world-size {args.world_size}")
        init_method, where = args.dist_url, args.dist_url
    else:  # not launched: a group of one keeps the recipe's code path the same
        rank, world_size, local_rank, local_world_size = 0, 1, 0, 1
        init_method, where, store = None, "this process", dist.HashStore()

    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise RecipeError(f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        if local_world_size > 1 and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))  # don't oversubscribe
    backend = args.dist_backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise RecipeError("--dist-backend nccl needs CUDA devices; use gloo on CPU")

    try:
        dist.init_process_group(
            backend, init_method=init_method, store=store, rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=args.dist_timeout),
            device_id=device if device.type == "cuda" else None)
    except (RuntimeError, ValueError) as error:  # DistStoreError and friends are RuntimeErrors
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RecipeError(
            f"rank {rank} could not form a process group of {world_size} at {where} within "
            f"--dist-timeout={args.dist_timeout:g}s ({reason}); check that every rank was started "
            f"with the same address, port and world size") from None
    return DistContext(rank, local_rank, world_size, device, backend)


def _store_for_this_attempt(timeout, where):
    """torchrun's store, with keys prefixed by the restart count.

    The agent's store outlives a restart. Without the prefix, restarted workers
    can read the previous attempt's addresses and fail with "Gloo connectFullMesh
    failed ... Connection refused" (NCCL reads a stale unique id the same way).
    The restart count is per agent, and agents on different nodes can disagree
    on it (a node that restarts because another failed does not count a retry),
    so across nodes torchrun must instead make a new store for every attempt:
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment.
    """
    restarts, nodes = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)), int(os.environ.get("GROUP_WORLD_SIZE", 1))
    if restarts > 0 and nodes > 1:
        raise RecipeError(f"torchrun --max-restarts={restarts} across {nodes} nodes needs "
                          "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment, so that every restart "
                          "gets a fresh store (export it on every node before torchrun)")
    try:
        store, _, _ = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=timeout)))
    except (RuntimeError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RecipeError(f"could not reach torchrun's store at {where} within --dist-timeout={timeout:g}s "
                          f"({reason})") from None
    return dist.PrefixStore(f"attempt{os.environ['TORCHELASTIC_RESTART_COUNT']}/", store)


def cleanup():
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_buffers(model, group=None):
    """Rank 0's buffers (BatchNorm's running statistics) to every rank, as DDP does before each forward: after
    the last step each rank has updated them from its own batch, and evaluation and the checkpoint must agree."""
    if dist.is_initialized():
        source = dist.get_global_rank(group, 0) if group is not None else 0
        for buffer in model.buffers():
            dist.broadcast(buffer, src=source, group=group)


def sync_batchnorm(model, device, log):
    """--sync-bn: BatchNorm statistics over the global batch rather than each rank's share.
    SyncBatchNorm runs only on CUDA; elsewhere say so and keep BatchNorm."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    log.print("warning: --sync-bn ignored: SyncBatchNorm runs only on CUDA; each process keeps its own "
              "BatchNorm statistics")
    return model
