"""Process-group set-up for the three launch styles, and what each process needs to know.

1. torchrun (and `python -m torch.distributed.launch`, which also passes
   --local-rank): RANK, WORLD_SIZE and LOCAL_RANK come from the environment.
2. --dist-url tcp://HOST:PORT --world-size N --rank R: one process per command,
   or with --multiprocessing-distributed one spawned process per local device,
   N nodes and R the node rank (as in pytorch/examples imagenet; common/launch.py
   spawns them).
3. plain `python train.py`: a process group of one, so the same code runs.

Two groups join every rank. The default group (NCCL on CUDA, gloo on CPU) carries
the model's tensors: gradients, weights, activations, the meters' sums, all on
the device. Beside it, one gloo group (`control`) carries everything else, on CPU
tensors: stop flags, counts, headers, the checkpoint's small agreements, and the
parameter servers' pushes and pulls. NCCL has no receive from any source and
takes no CPU tensor; gloo has both, and no send or receive of a CUDA tensor.
A recipe with groups of its own makes them of either kind (new_group, new_control_group).
"""

import contextlib
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
    control: object = None  # the gloo group of every rank, for CPU tensors (None before a process group exists)

    @property
    def is_main(self):
        return self.rank == 0


def local_device_count():
    return torch.cuda.device_count() if torch.cuda.is_available() else 1


@dataclass(frozen=True)
class Launch:
    """What `dist.init_process_group` needs, as the launcher gave it: where rank 0 is (an address to meet at, or
    the store itself), how many processes there are, which one this is, and this process's device."""
    init_method: str | None  # env:// (MASTER_ADDR and MASTER_PORT) or tcp://HOST:PORT; None when a store is given
    store: object
    world_size: int
    rank: int
    local_rank: int
    device: torch.device
    backend: str  # nccl on CUDA, gloo on CPU, unless --dist-backend says otherwise
    timeout: datetime.timedelta  # --dist-timeout
    where: str  # the address, for the line a failure prints

    @property
    def device_id(self):
        """The GPU that NCCL binds this process's communicators to at once (None under gloo)."""
        return self.device if self.backend == "nccl" else None


def launch_facts(args):
    """The four facts, from whichever of the three launch styles started this process; sets this process's GPU."""
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

    backend = args.dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        if local_rank >= gpus and backend == "nccl":
            raise RecipeError(f"local rank {local_rank} has no GPU: {gpus} visible (NCCL takes one GPU per "
                              f"process; with --dist-backend gloo, processes share them)")
        device = torch.device("cuda", local_rank % gpus)  # (gloo: local rank r on GPU r mod the GPUs)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        if local_world_size > 1 and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))  # don't oversubscribe
    if backend == "nccl" and device.type != "cuda":
        raise RecipeError("--dist-backend nccl needs CUDA devices; use gloo on CPU")
    if backend == "nccl":
        raise_nccl_errors(os.environ)
    return Launch(init_method, store, world_size, rank, local_rank, device, backend,
                  datetime.timedelta(seconds=args.dist_timeout), where)


@contextlib.contextmanager
def joining(launch):
    """Around init_process_group: ranks that do not meet within --dist-timeout end in one line naming where."""
    try:
        yield
    except (RuntimeError, ValueError) as error:  # DistStoreError and friends are RuntimeErrors
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RecipeError(
            f"rank {launch.rank} could not form a process group of {launch.world_size} at {launch.where} within "
            f"--dist-timeout={launch.timeout.total_seconds():g}s ({reason}); check that every rank was started "
            f"with the same address, port and world size") from None


def context(launch):
    """After init_process_group: what the rest of the run asks of it, and the gloo group for CPU tensors beside
    the default one."""
    global _timeout, _control
    _timeout = launch.timeout
    _control = new_control_group(range(launch.world_size))
    return DistContext(launch.rank, launch.local_rank, launch.world_size, launch.device, launch.backend, _control)


def init_distributed_mode(args):
    """All of the above in one call, for the recipes whose lesson lies elsewhere (ps, pipeline)."""
    launch = launch_facts(args)
    with joining(launch):
        dist.init_process_group(launch.backend, init_method=launch.init_method, store=launch.store,
                                world_size=launch.world_size, rank=launch.rank, device_id=launch.device_id,
                                timeout=launch.timeout)
    return context(launch)


_timeout, _control = None, None


def raise_nccl_errors(environ):
    """A timed-out or failed NCCL collective raises in the training process (then the lost-peer line names the
    cause) instead of the watchdog ending the process: TORCH_NCCL_ASYNC_ERROR_HANDLING=2. torchrun sets 1 where
    it is unset, so 1 is taken for its default; any other value (0, 3) is the user's and kept."""
    if environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1") == "1":
        environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"


def control_group():
    """The gloo group of every rank (None when this process has no process group)."""
    return _control if dist.is_initialized() else None


def new_control_group(ranks):
    """A gloo group of these ranks, for CPU tensors, with --dist-timeout (every rank of the world calls it)."""
    return dist.new_group(list(ranks), timeout=_timeout, backend="gloo", group_desc="control")


def new_group(ranks):
    """A group of these ranks on the default backend, for tensors on the device, with --dist-timeout (every rank
    of the world calls it)."""
    return dist.new_group(list(ranks), timeout=_timeout)


def members_group(ranks):
    """A group of these ranks on the default backend, made by them alone: the other ranks need not call this, and
    its members need not make their groups in the same order (dist.new_group asks both), so groups can form as
    a run goes (the pipeline's partial reduce). Its connections are set up over the store, under its ranks. It
    is a backend that torch's registry does not know: call its collectives on it (group.allreduce([t]).wait()),
    and shut it down (group.shutdown()) before cleanup()."""
    ranks = sorted(ranks)
    store = dist.PrefixStore(f"members/{'_'.join(map(str, ranks))}", dist.distributed_c10d._get_default_store())
    index = ranks.index(dist.get_rank())
    if dist.get_backend() == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = _timeout
        return dist.ProcessGroupNCCL(store, index, len(ranks), options)
    return dist.ProcessGroupGloo(store, index, len(ranks), _timeout)


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


_destroyed = []  # the process groups cleanup() destroyed, each held here until the process exits


def cleanup():
    """destroy_process_group(), each group it destroys held here: DDP's reducer holds its group too, and a gloo
    group freed last by it (as the run's objects are freed, the GIL held) joins its threads while one of them
    waits for the GIL to free a finished collective's tensor: the process hung now and then under torch 2.11.
    Freed from Python, a group lets the GIL go first; held here, it is never freed before the exit."""
    if dist.is_initialized():
        _destroyed.extend(dist.distributed_c10d._world.pg_map)
        dist.destroy_process_group()


def broadcast_buffers(model, group=None, control=None):
    """Rank 0's buffers (BatchNorm's running statistics) to every rank, as DDP does before each forward: after
    the last step each rank has updated them from its own batch, and evaluation and the checkpoint must agree.
    A buffer kept on the CPU (AveragedModel's n_averaged, with the model on a GPU) goes over the control group."""
    if dist.is_initialized():
        source = dist.get_global_rank(group, 0) if group is not None else 0
        for buffer in model.buffers():
            on_cpu = buffer.device.type == "cpu"
            dist.broadcast(buffer, src=source, group=(control or control_group()) if on_cpu else group)


def sync_batchnorm(model, device, log):
    """--sync-bn: BatchNorm statistics over the global batch rather than each rank's share.
    SyncBatchNorm runs only on CUDA; elsewhere say so and keep BatchNorm."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    log.print("warning: --sync-bn ignored: SyncBatchNorm runs only on CUDA; each process keeps its own "
              "BatchNorm statistics")
    return model
