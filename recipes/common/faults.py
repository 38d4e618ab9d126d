"""What the training loop checks after every step: a preemption notice, and divergence.

Preemption: SLURM, Kubernetes and cloud schedulers send SIGTERM some seconds
before they kill a job (torchrun forwards it to every worker). The handler only
raises a flag. After every step each rank starts an allreduce of its flags (did
SIGTERM arrive, was a loss non-finite) over the control group, without waiting,
and reads the one it started a step earlier: all ranks read the same answer at
the same step, so all of them stop after the same step, the one after the
signal, however long a step takes; rank 0 then saves a checkpoint and every
rank exits with EXIT_PREEMPTED. Relaunching the same command with --auto-resume
continues from that step.

On a GPU the check never waits for the device: the loss's finiteness is copied to
the host without blocking, and taken into the flags once it has arrived (one step
later, or a few when the CPU runs ahead), so the CPU can queue the next steps while
the GPU works. RESULTS.md measures what the check costs.

A rank that waits on another (a parameter server's message, the partial reduce's
ready queue, an AD-PSGD partner) cannot act on SIGTERM while it waits: the handler
runs only once the wait returns, and a dead or stopped peer never answers. Those
waits are marked (waiting_for), and a watch thread that wakes at every signal ends
the process when a SIGTERM finds it in one for longer than its grace (1 s, or three
times the longest of the rank's recent waits): exit 75, after one line saying
whether the preemption checkpoint had been saved.

Divergence: a non-finite loss stops the run; and every save first checks that the
weights are finite, so no checkpoint holds NaNs.
"""

import collections
import contextlib
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from recipes.common import RunFailed

EXIT_PREEMPTED = 75  # EX_TEMPFAIL in sysexits.h: a temporary failure, run it again

_sigterm_received = False


class Preempted(Exception):
    """Raised once the ranks have agreed to stop after a SIGTERM (and, where the run has a checkpoint to write,
    once it is saved); the run then exits with EXIT_PREEMPTED."""


def preempted_after_saving(out, epoch, step):
    """The Preempted of a run whose checkpoint this process has just saved (or, on ranks > 0, seen saved)."""
    global _saved
    _saved = f"{out}/checkpoint.pt at epoch {epoch + 1} step {step}"
    return Preempted(f"preempted: SIGTERM received; saved {_saved}. Run the same command with --auto-resume to "
                     f"continue from there (exit code {EXIT_PREEMPTED})")


def preempted_without_saving(out, detail):
    """The error that ends a rank whose peer went away after a SIGTERM, before the ranks agreed to stop and save:
    exit 75 (a relaunch resumes). detail: what the lost connection said."""
    error = RunFailed(f"preempted: SIGTERM received, and a peer went away ({detail}) before the ranks agreed to "
                      f"save: exiting without saving; --auto-resume continues from the last checkpoint in {out}")
    error.exit_code = EXIT_PREEMPTED
    return error


def catch_sigterm(out, rank=0):
    """From now on SIGTERM asks the loop to stop at the next step boundary instead of killing, and a wait on a peer
    that outlasts its grace after it ends the process (waiting_for). out: the run directory, for the line that
    says where a resume continues from. Call it once the data loaders exist (they start their fork server with
    SIGTERM ignored for a moment).

    (Data-loader workers ignore SIGTERM, see workers.leave_sigterm_to_the_trainer.)
    """
    global _watching, _wake
    signal.signal(signal.SIGTERM, lambda signum, frame: request_stop())
    if _watching is None:
        read_fd, _wake = os.pipe()  # the C-level handler writes each signal's number here, even while the main
        os.set_blocking(_wake, False)  # thread is stuck in a wait that runs no Python handler
        signal.set_wakeup_fd(_wake, warn_on_full_buffer=False)
        os.register_at_fork(after_in_child=_forget_watch)  # (a forked child's signals are its own)
        threading.Thread(target=_watch, args=(read_fd,), name="sigterm-watch", daemon=True).start()
    _watching = (out, rank)


def request_stop():
    """What SIGTERM does: the next stop check stops every rank, and the watch starts timing waits on peers. Also
    called for a peer's SIGTERM, learnt from its message (the parameter servers and their clients)."""
    global _sigterm_received
    if not _sigterm_received and _wake is not None:
        try:
            os.write(_wake, bytes([signal.SIGTERM]))  # (a real SIGTERM has written it already: one more is harmless)
        except OSError:
            pass
    _sigterm_received = True


def sigterm_received():
    return _sigterm_received


# ---- a wait on a peer, under SIGTERM --------------------------------------------------------------------

# How long a wait on another rank may go on after a SIGTERM before this process gives up on it: 1 s, or three
# times the longest of its last 50 waits (a healthy run whose peers compute for seconds is not cut short); the
# first waits after catch_sigterm, which absorb the ranks' different start-up times, are not counted
PEER_WAIT_GRACE_S, GRACE_TIMES_RECENT, RECENT_WAITS, START_WAITS = 1.0, 3, 50, 3
_waiting = None  # (what, since): the main thread's wait on another rank, while it is in one
_recent = collections.deque(maxlen=RECENT_WAITS)  # how long the last waits took (seconds)
_started_waits = 0  # waits since catch_sigterm, up to START_WAITS
_lock = threading.Lock()  # the main thread leaves a wait, or the watch gives up on it: never both
_watching = _wake = None  # (the run directory, this rank) and the pipe's write end, once catch_sigterm ran
_saved = None  # where this process saved the preemption checkpoint, once it has


@contextlib.contextmanager
def waiting_for(what):
    """Mark a wait on another rank (`what` names it, for the line). SIGTERM cannot interrupt it: Python runs the
    handler only once the wait returns, and a dead or stopped peer never answers. A SIGTERM that finds the main
    thread in it for grace() seconds therefore ends the process from the watch thread, exit 75. Mark waits, not
    computation: a step that computes for longer should end normally and save."""
    global _waiting, _started_waits
    outer, _waiting = _waiting, (what, time.monotonic())
    try:
        yield
    finally:
        with _lock:
            if _watching is not None and _started_waits >= START_WAITS:
                _recent.append(time.monotonic() - _waiting[1])
            _started_waits += _watching is not None
            _waiting = (outer[0], time.monotonic()) if outer else None  # (the outer wait's clock starts again)


def grace():
    return max(PEER_WAIT_GRACE_S, GRACE_TIMES_RECENT * max(_recent, default=0.0))


def _watch(read_fd):
    """The watch thread: wakes at each signal; after a SIGTERM, gives up on a marked wait that has gone on for
    grace() seconds since it started or since the SIGTERM, whichever came later."""
    while signal.SIGTERM not in os.read(read_fd, 512):
        pass
    signalled = time.monotonic()
    while True:
        with _lock:
            if _waiting is not None and time.monotonic() - max(_waiting[1], signalled) >= grace():
                _give_up(_waiting[0])  # (holding the lock: the main thread cannot leave the wait meanwhile)
        time.sleep(0.05)


def _give_up(what):
    """One line, then exit 75 from the watch thread: the main thread is stuck, so no exit handlers run; the loader
    workers and their fork server die with this process (workers.die_with_parent)."""
    out, rank = _watching
    done = (f"saved {_saved} first" if _saved else
            f"exiting without saving; --auto-resume continues from the last checkpoint in {out}")
    sys.stderr.write(f"{f'[rank {rank}] ' if rank else ''}preempted: SIGTERM received, and {what} did not come "
                     f"within {grace():.3g} s (a peer stopped or is gone): {done} "
                     f"(exit code {EXIT_PREEMPTED})\n")  # (one write: ranks sharing a pipe never splice lines)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(EXIT_PREEMPTED)


def _forget_watch():
    """In a child forked from a process with the watch: no wakeup fd, no watch, no SIGTERM handler of the parent's."""
    global _watching, _wake
    _watching = _wake = None
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # (forked from a thread other than the main one)
        pass


class StopCheck:
    """The ranks' agreement on stopping, one check behind, with no host synchronisation.

    after_step(loss, epoch, step, every) after every step (every rank of the group at the same steps), checking at
    every `every`-th step of an epoch (1: each step): True when a rank had received SIGTERM by the previous check,
    so that every rank stops after this step; raises RunFailed when a rank's loss was NaN or infinite. A check
    waits only for a rank that has not yet reached the check before it: `every` steps behind. at_epoch_end(epoch)
    where the ranks meet at an epoch's end: the same, for everything not yet agreed on. group: a gloo group (CPU
    tensors); None without a process group.
    """

    def __init__(self, steps_per_epoch, group=None):
        self.steps_per_epoch, self.group = steps_per_epoch, group
        self.losses = collections.deque()  # (epoch, step, is the loss non-finite: on the host, or on its way)
        self.pending = None  # (the allreduce under way, its flags): started at the last check

    def after_step(self, loss, epoch, step, every=1):
        self._note(loss, epoch, step)
        if (step + 1) % every:  # (no check at this step)
            return False
        stop = self._agreed()
        if not stop:
            self.pending = self._start(arrived_only=True)
        return stop

    def at_epoch_end(self, epoch):
        """The last flags of the epoch, waited for: every rank of the group calls it (a collective)."""
        stop = self._agreed()
        work, flags = self._start(arrived_only=False)
        if work is not None:
            with waiting_for("the other ranks' stop checks at the epoch's end"):
                work.wait()
        self.pending = None
        return self._read(flags) or stop

    def _note(self, loss, epoch, step):
        # to the host without waiting (on CUDA, into pinned memory; an event says when it is there)
        nonfinite = (~torch.isfinite(loss.detach())).any().to("cpu", non_blocking=True)
        arrived = None
        if loss.device.type == "cuda":
            arrived = torch.cuda.Event()
            arrived.record()
        self.losses.append((epoch, step, nonfinite, arrived))

    def _start(self, arrived_only):
        """Start the allreduce of [SIGTERM here, the position + 1 of the first non-finite loss seen, or 0]."""
        bad = 0
        while self.losses:
            epoch, step, nonfinite, arrived = self.losses[0]
            if arrived is not None and not arrived.query():
                if arrived_only:
                    break
                arrived.synchronize()  # (at an epoch's end, where the meter synchronises anyway)
            self.losses.popleft()
            if nonfinite and not bad:
                bad = epoch * self.steps_per_epoch + step + 1
        flags = torch.tensor([float(_sigterm_received), float(bad)], dtype=torch.float64)
        work = None
        if self.group is not None:
            work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return work, flags

    def _agreed(self):
        """The flags started at the last check, as every rank reads them (False when none was started)."""
        if self.pending is None:
            return False
        work, flags = self.pending
        self.pending = None
        if work is not None:
            with waiting_for("the other ranks' stop checks"):
                work.wait()
        return self._read(flags)

    def _read(self, flags):
        sigterm, bad = flags.tolist()
        if bad:
            epoch, step = divmod(int(bad) - 1, self.steps_per_epoch)
            raise RunFailed(f"non-finite loss at epoch {epoch + 1} step {step + 1}: {_DIVERGED}")
        return bool(sigterm)


def check_finite(model, epoch, step):
    """Raise RunFailed instead of saving NaN or infinite weights (every rank calls it before a save)."""
    finite = torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()
    if not finite:
        raise RunFailed(f"non-finite weights after {epoch} epoch(s) and {step} step(s): {_DIVERGED}")


_DIVERGED = ("training diverged. The run stops without saving, so the last checkpoint holds finite weights; "
             "lower --lr before resuming")
