"""DataLoader worker processes: how they start, how they take SIGTERM, how they end.

The training process has threads (gloo's, TensorBoard's). Python 3.11 can
deadlock a child forked while one of them creates or ends a thread state, and
the loaders start new workers every epoch. So workers start from a fork server,
a fresh process with no threads (Python 3.14 makes it the default start method
on Linux). The server ignores and blocks SIGTERM, and so the workers it forks
start with SIGTERM blocked, and each one ignores it: a scheduler's SIGTERM to the
whole job must leave them to the trainer, which stops them after the current step.

No worker outlives the trainer, even one killed by SIGKILL (the out-of-memory
killer, kill -9), which runs no clean-up: the server and each worker ask the
kernel to kill them when their parent dies (Linux's PR_SET_PDEATHSIG). Without
that, the server and its workers keep each other alive (each worker holds the
pipe whose closing tells the server to end), and with them the job's output
pipes and memory.
"""

import atexit
import ctypes
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys

_TRAINER_PID = "RECIPES_LOADER_TRAINER_PID"  # set by the trainer for the fork server it starts
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(parent):
    """The kernel SIGKILLs this process when its parent, pid `parent`, dies (Linux; elsewhere nothing happens)."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # Compared with the pid the parent had, not with getppid() read here: a parent that died since the fork
    # (and so before the request) leaves this process to init, and the request would then never fire.
    if os.getppid() != parent:
        os._exit(1)


_SERVER_PID = None  # set in the fork server, and so known to every worker it forks
if os.environ.get(_TRAINER_PID) == str(os.getppid()):  # this is the fork server, preloading this module
    _SERVER_PID = os.getpid()
    die_with_parent(int(os.environ[_TRAINER_PID]))
    # Blocked, SIGTERM stays blocked in the workers it forks until they ignore it (leave_sigterm_to_the_trainer):
    # torch's own worker handler, installed first, would let a SIGTERM kill a starting worker.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def context(workers):
    """The multiprocessing context for a DataLoader with `workers` workers (None for none)."""
    if not workers or "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    # The server imports torch and the recipes' modules once, and a worker forked from it starts in
    # milliseconds. Each worker still runs the recipe script's top (its imports, all preloaded) to find
    # __main__; the server's own preload of __main__ never happens before Python 3.13 (CPython gh-137996).
    start_server(sorted(name for name in sys.modules if name.startswith("recipes.")))
    return multiprocessing.get_context("forkserver")


def start_server(preload):
    """Start this process's fork server, with `preload` imported, unless it runs already. The server dies with
    this process (see die_with_parent), ignores SIGTERM and forks its children with SIGTERM blocked."""
    multiprocessing.set_forkserver_preload(preload)
    os.environ[_TRAINER_PID] = str(os.getpid())
    # The server starts ignoring SIGTERM (an ignored signal stays ignored across exec; a blocked one does not
    # here): while it imports torch, a SIGTERM would otherwise end it and every later loader would fail.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, previous)
        del os.environ[_TRAINER_PID]  # the server has its copy; no other child of this process is the server


def die_with_the_server():
    """In a process forked from the fork server: die when the server dies (and so when the process that
    started the server dies, however it ends)."""
    if _SERVER_PID is not None:
        die_with_parent(_SERVER_PID)


def leave_sigterm_to_the_trainer(worker_id):
    """worker_init_fn: loader workers ignore SIGTERM. The training process stops at a step boundary
    and shuts them down; else a scheduler's SIGTERM to the whole job kills them mid-batch.
    And they die with their parent, the fork server (which dies with the trainer)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_the_server()


@atexit.register  # runs before multiprocessing's exit handler, which would SIGTERM them and wait forever
def _kill_loader_workers():
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the loader's handler would report them as failed
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
            child.join()
