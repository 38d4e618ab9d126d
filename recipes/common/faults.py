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

Divergence: a non-finite loss stops the run; and every save first checks that the
weights are finite, so no checkpoint holds NaNs.
"""

import collections
import signal

import torch
import torch.distributed as dist

from recipes.common import RunFailed

EXIT_PREEMPTED = 75  # EX_TEMPFAIL in sysexits.h: a temporary failure, run it again

_sigterm_received = False


class Preempted(Exception):
    """Raised by the loop once the preemption checkpoint is saved; the run then exits with EXIT_PREEMPTED."""

    def __init__(self, out, epoch, step):
        super().__init__(f"preempted: SIGTERM received; saved {out}/checkpoint.pt at epoch {epoch + 1} step {step}. "
                         f"Run the same command with --auto-resume to continue from there "
                         f"(exit code {EXIT_PREEMPTED})")


def catch_sigterm():
    """From now on SIGTERM asks the loop to stop at the next step boundary instead of killing.

    (Data-loader workers ignore SIGTERM, see workers.leave_sigterm_to_the_trainer.)
    """
    def request_stop(signum, frame):
        global _sigterm_received
        _sigterm_received = True

    signal.signal(signal.SIGTERM, request_stop)


class StopCheck:
    """The ranks' agreement on stopping, one step behind, with no host synchronisation.

    after_step(loss, epoch, step) after every step (every rank of the group at the same steps): True when a
    rank had received SIGTERM by the previous check, so that every rank stops after this step; raises RunFailed
    when a rank's loss was NaN or infinite. at_epoch_end(epoch) where the ranks meet at an epoch's end: the
    same, for everything not yet agreed on. group: a gloo group (CPU tensors); None without a process group.
    """

    def __init__(self, steps_per_epoch, group=None):
        self.steps_per_epoch, self.group = steps_per_epoch, group
        self.losses = collections.deque()  # (epoch, step, is the loss non-finite: on the host, or on its way)
        self.pending = None  # (the allreduce under way, its flags): started at the last check

    def after_step(self, loss, epoch, step):
        self._note(loss, epoch, step)
        stop = self._agreed()
        if not stop:
            self.pending = self._start(arrived_only=True)
        return stop

    def at_epoch_end(self, epoch):
        """The last flags of the epoch, waited for: every rank of the group calls it (a collective)."""
        stop = self._agreed()
        work, flags = self._start(arrived_only=False)
        if work is not None:
            work.wait()
        self.pending = None
        return self._read(flags) or stop

    def _note(self, loss, epoch, step):
        nonfinite = (~torch.isfinite(loss.detach())).any()
        arrived = None
        if nonfinite.device.type == "cuda":  # copy to pinned memory without waiting; an event says when it is there
            nonfinite = nonfinite.to("cpu", non_blocking=True)
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
