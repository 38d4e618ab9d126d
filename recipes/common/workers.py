"""DataLoader worker processes: how they start, how they take SIGTERM, how they end.

The training process has threads (gloo's, TensorBoard's). Python 3.11 can
deadlock a child forked while one of them creates or ends a thread state. So
workers start from a fork server, a process with no threads (Python 3.14 makes
it the default start method on Linux). multiprocessing starts its server as a
fresh interpreter, which imports torch and the recipes again: about 2 s on a
CPU core before the first batch can load. The recipes instead fork their server
from the training process as it starts (fork_server, from launch.start), before
any thread of theirs exists, so that it has every module already. The server
ignores and blocks SIGTERM, and so the workers it forks start with SIGTERM
blocked, and each one ignores it: a scheduler's SIGTERM to the whole job must
leave them to the trainer, which stops them after the current step.

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
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import socket
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
    # A server started here, not by fork_server, imports torch and the recipes' modules once, and a worker
    # forked from it starts in milliseconds. Each worker still runs the recipe script's top (its imports, all
    # loaded) to find __main__; the server's own preload of __main__ never happens before Python 3.13
    # (CPython gh-137996).
    start_server(sorted(name for name in sys.modules if name.startswith("recipes.")))
    return multiprocessing.get_context("forkserver")


def fork_server():
    """Start this process's fork server as a fork of this process, which must have no thread of its own yet: the
    server has every module this process imported, and its first worker starts at once. It serves as the one
    multiprocessing would start (its socket and "alive" pipe are made as multiprocessing makes them); where that
    fails (a Python whose multiprocessing differs), context() starts multiprocessing's own."""
    server = multiprocessing.forkserver._forkserver
    try:
        with server._lock:
            if server._forkserver_pid is not None:
                return
            multiprocessing.resource_tracker.ensure_running()  # (its pipe goes to the server and the workers)
            with socket.socket(socket.AF_UNIX) as listener:
                address = multiprocessing.connection.arbitrary_address("AF_UNIX")
                listener.bind(address)
                if not multiprocessing.util.is_abstract_socket_namespace(address):
                    os.chmod(address, 0o600)
                listener.listen()
                alive_r, alive_w = os.pipe()  # when the trainer ends, the server reads EOF and ends
                trainer = os.getpid()
                # Blocked across the fork: a SIGTERM to the new server before it ignores SIGTERM would end it,
                # and every later loader with it (here one waits, pending, until the mask is restored).
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                pid = os.fork()
                if pid == 0:
                    _serve(listener.fileno(), alive_r, alive_w, trainer)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(alive_r)
            server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    except (AttributeError, TypeError, OSError):
        return


def _serve(listener_fd, alive_r, alive_w, trainer):
    """The forked server's life: as multiprocessing's server (forkserver.main), with SIGTERM ignored and blocked,
    dying with the trainer; it ends with os._exit (nothing of the trainer's to tear down)."""
    global _SERVER_PID
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (and blocked since the fork: it stays so)
        os.close(alive_w)
        _SERVER_PID = os.getpid()
        die_with_parent(trainer)
        multiprocessing.forkserver.main(listener_fd, alive_r, [])
    finally:
        os._exit(0)


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


def stop_helpers():
    """At the end of a run: stop the loader workers, this process's fork server and multiprocessing's resource
    tracker, and wait for them (else the last two end a moment after the run, on their own). The server is
    killed: asked to stop, it would spend a second tearing down the torch it imported."""
    _kill_loader_workers()
    server = multiprocessing.forkserver._forkserver
    if server._forkserver_pid is not None:  # (started by this process)
        os.kill(server._forkserver_pid, signal.SIGKILL)
        server._stop()  # (closes its pipe, waits for it, removes its socket)
    tracker = multiprocessing.resource_tracker._resource_tracker
    if getattr(tracker, "_pid", None) is not None:  # (started by this process, not inherited from its parent)
        tracker._stop()


@atexit.register  # runs before multiprocessing's exit handler, which would SIGTERM them and wait forever
def _kill_loader_workers():
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the loader's handler would report them as failed
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
            child.join()
