"""Running a recipe's main: in this process, or once per local device with
--multiprocessing-distributed; and every early end of a run as one line and an exit code.

Exit codes: 0 done, 1 the run could not go on (a peer died, training diverged),
2 bad input, 75 preempted (a checkpoint was saved: run the same command again).
"""

import atexit
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from recipes.common import RecipeError, RunFailed, distributed, faults, workers

EXIT_BAD_INPUT = 2


def start(main, parse_args):
    """main(parse_args()) here, or in one spawned process per local device (--multiprocessing-distributed); then
    the process ends (end())."""
    rank = int(os.environ.get("RANK", 0))
    try:
        try:
            args = parse_args()
        except RecipeError as error:
            fail(error, rank)
        if not getattr(args, "multiprocessing_distributed", False):
            if args.workers:  # the loader workers' fork server: a fork of this process, before it has threads
                workers.fork_server()
            run_main(main, args, rank)
            return end(0)
        try:
            mp.spawn(_spawned, args=(main, args), nprocs=distributed.local_device_count())
        except mp.ProcessExitedException as error:  # the child already said why
            sys.exit(error.exit_code or 1)
    except SystemExit as stop:
        end(stop.code if isinstance(stop.code, int) else 1)
    end(0)


def _spawned(local_rank, main, args):
    args.spawned_local_rank = local_rank
    try:
        if args.workers:
            workers.fork_server()
        run_main(main, args, rank=args.rank * distributed.local_device_count() + local_rank)
    except SystemExit as stop:
        end(stop.code if isinstance(stop.code, int) else 1)
    end(0)


def end(code):
    """End the process now: the exit handlers (which stop the loader workers), then the fork server and the
    resource tracker, waited for, so that no process of the run outlives it; then exit without tearing down
    every module the interpreter loaded, which takes about a second with torch's and does nothing for a run."""
    workers.stop_helpers()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def run_main(main, args, rank=0):
    """main(args), with each way a run can end early turned into one line and an exit code. rank: the rank the
    launcher says (its environment), until the process group says (--dist-url sets no environment)."""
    torch.backends.cudnn.benchmark = args.seed is None  # the fastest kernels, unless --seed asks to repeat
    torch.backends.cudnn.deterministic = args.seed is not None
    try:
        main(args)
        release()
    except RecipeError as error:
        fail(error, _rank(rank))
    except faults.Preempted as stop:  # the checkpoint is saved: say where, and exit for a relaunch
        rank = _rank(rank)
        release(stop)
        checkpoint_written(rank)
        distributed.cleanup()
        if rank == 0:
            print(stop, flush=True)
        sys.exit(faults.EXIT_PREEMPTED)
    except RuntimeError as error:
        rank = _rank(rank)
        explained = _lost_peer(error, rank, args)
        if explained is None:
            raise  # a bug: keep the traceback
        release(error)
        if faults.sigterm_received():  # the job is being stopped, and a peer went first: nothing to save with it
            explained = faults.preempted_without_saving(args.out, _detail(error))
        fail(explained, rank)


def _rank(launched):
    """This process's rank: the process group's once it exists, else the launcher's."""
    return dist.get_rank() if dist.is_initialized() else launched


def checkpoint_written(rank):
    """No rank exits before rank 0 has written the preemption checkpoint (a scheduler may kill the whole job once
    one has): rank 0, done writing, tells each rank so. A rank that is gone is passed over (the checkpoint is
    whole or absent, never half); one that is stopped holds rank 0 no longer than a wait's grace (faults)."""
    group = distributed.control_group()
    if group is None:
        return
    written = torch.zeros(1)
    if rank != 0:
        try:
            dist.recv(written, 0, group=group)
        except RuntimeError:
            pass  # rank 0 is gone
        return
    requests = [dist.isend(written, peer, group=group) for peer in range(1, dist.get_world_size())]
    with faults.waiting_for("the other ranks, told that the checkpoint is written"):
        for request in requests:
            try:
                request.wait()
            except RuntimeError:
                pass


def _lost_peer(error, rank, args):
    """A collective that failed because a peer died or hung, as one line naming the likely cause."""
    text = str(error)
    if not (isinstance(error, dist.DistError) or "gloo" in text or "NCCL" in text):
        return None
    detail = _detail(error)
    if "timed out" in text.lower() or "timeout" in text.lower():
        timeout = getattr(args, "dist_timeout", 0)
        cause = (f"a peer did not answer within --dist-timeout={timeout:g}s: a process of this job "
                 f"hangs (stuck data loading, a deadlock, a stopped node) or died without closing its connections")
    else:
        cause = ("a peer process died or its node went down: look above for its own error, or in the "
                 "system log for an out-of-memory kill")
    return RunFailed(f"rank {rank} lost contact with the other ranks during training ({detail}); {cause}")


def _detail(error):
    """The first sentence of a gloo or NCCL error, without gloo's source path."""
    return str(error).strip().splitlines()[0].split("] ", 1)[-1].split(". ")[0]


def release(error=None):
    """Free the run's objects now (with an error: the frames its traceback holds). A sharded model's hooks keep it
    in reference cycles, and freed while the interpreter shuts down it aborts the process now and then
    ("terminate called without an active exception")."""
    if error is not None:
        error.__traceback__ = None
    gc.collect()


def fail(error, rank=0):
    """One line on stderr, then exit with the error's code (2 for bad input). The line goes first: once one rank
    exits, torchrun stops the others, and a rank still freeing its objects would go without a word."""
    message = str(error).strip()
    if "Original Traceback" in message:  # re-raised from a DataLoader worker: keep our own line
        message = message.splitlines()[-1].split(": ", 1)[-1]
    prefix = f"[rank {rank}] " if rank else ""
    sys.stderr.write(f"{prefix}error: {message}\n")  # one write: ranks sharing a pipe never splice lines
    sys.stderr.flush()
    release(error)
    distributed.cleanup()
    sys.exit(getattr(error, "exit_code", EXIT_BAD_INPUT))
