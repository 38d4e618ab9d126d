"""What the training loop checks after every step: a preemption notice, and divergence.

Preemption: SLURM, Kubernetes and cloud schedulers send SIGTERM some seconds
before they kill a job (torchrun forwards it to every worker). The handler only
raises a flag. After every step the ranks agree on the flags with one small
allreduce (two numbers), so all of them stop after the same step, however long a
step takes; rank 0 then saves a checkpoint and every rank exits with
EXIT_PREEMPTED. Relaunching the same command with --auto-resume continues from
that step. The price is one tiny collective per step and, on a GPU, waiting for
the step to finish before queueing the next one (as a per-step loss.item() would);
RESULTS.md measures it.

Divergence: a non-finite loss, seen at the same check, stops the run; and every
save first checks that the weights are finite, so no checkpoint holds NaNs.
"""

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


def should_stop(loss, epoch, step, group=None):
    """True when any rank (of group, default all) has received SIGTERM. Every rank calls this after each step.

    Raises RunFailed when the loss is NaN or infinite on any rank.
    """
    flags = torch.stack([torch.tensor(float(_sigterm_received), device=loss.device),
                         (~torch.isfinite(loss.detach())).float().reshape(())])
    if dist.is_initialized():
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)  # one rank's flag is every rank's decision
    sigterm, nonfinite = flags.tolist()
    if nonfinite:
        raise RunFailed(f"non-finite loss at epoch {epoch + 1} step {step + 1}: {_DIVERGED}")
    return bool(sigterm)


def check_finite(model, epoch, step):
    """Raise RunFailed instead of saving NaN or infinite weights (every rank calls it before a save)."""
    finite = torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()
    if not finite:
        raise RunFailed(f"non-finite weights after {epoch} epoch(s) and {step} step(s): {_DIVERGED}")


_DIVERGED = ("training diverged. The run stops without saving, so the last checkpoint holds finite weights; "
             "lower --lr before resuming")
