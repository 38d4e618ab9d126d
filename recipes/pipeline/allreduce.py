"""allreduce: the replicas of a stage average their gradients before each update, as DDP does (a DDP-wrapped stage
does not run under the pipelining schedules), so every update is a synchronisation of all of them and each waits
for the slowest."""

import torch
import torch.distributed as dist

from recipes.common import faults
from recipes.pipeline.sync import STOP_CHECKS_EVERY, Sync, flagged


def average_gradients(params, group, replicas, straggled):
    """The mean of the replicas' gradients, as DDP computes it. Returns whether another replica's straggling held
    this one up (every replica waits for the last), as a tensor on the device."""
    flat = flagged(torch.cat([p.grad.reshape(-1) for p in params]), straggled)
    with faults.waiting_for("the stage's other replicas (allreduce)"):  # (every wait on a peer is marked: faults,
        # and on the CPU: an NCCL collective only queues, and the device waits in its place)
        dist.all_reduce(flat, group=group)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p) / replicas)
        offset += p.numel()
    return flat[-1] > float(straggled)


class AllReduce(Sync):
    stop_checks_every = STOP_CHECKS_EVERY

    def before_step(self, params, straggled, tally):
        waited = average_gradients(params, self.replicas.stage_group, self.replicas.count, straggled)
        tally.connected()
        return waited
