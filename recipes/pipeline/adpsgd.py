"""AD-PSGD (Lian et al., ICML 2018) as SD-PIPE runs it: synchronous random matching, every replica averaging
with a partner drawn each step from a seed all ranks share, one grouped send and receive per pair (the paper's
asynchronous version needs a wait-free partner, which SD-PIPE does not build either); with an odd number of
replicas one sits out (SD-PIPE asks for an even one: their preduce.py 121)."""

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from recipes.common import faults
from recipes.pipeline.sync import STOP_CHECKS_EVERY, Sync, flagged


def pairwise_average(params, layout, seed, epoch, step, straggled):
    """The replicas average in random pairs (an odd one out keeps its weights). Returns whether the partner's
    straggling held this replica up, and whether it had a partner."""
    draw = (seed or 0) * 1_000_003 + epoch * 10_007 + step  # the same on every rank, with or without --seed
    order = torch.randperm(layout.replicas, generator=torch.Generator().manual_seed(draw)).tolist()
    rank = dist.get_rank()
    position = order.index(layout.replica(rank))
    if position == layout.replicas - 1 and layout.replicas % 2:
        return False, False
    partner = layout.rank(order[position ^ 1], layout.stage(rank))
    mine = flagged(parameters_to_vector(params).detach(), straggled)
    theirs = torch.empty_like(mine)
    # the send and the receive as one group: posted one after the other, both partners would wait in their
    # sends on NCCL once a stage's weights outgrow its buffers
    exchange = [dist.P2POp(dist.isend, mine, partner), dist.P2POp(dist.irecv, theirs, partner)]
    with faults.waiting_for(f"rank {partner}, this step's AD-PSGD partner"):
        for request in dist.batch_isend_irecv(exchange):
            request.wait()
    vector_to_parameters((mine[:-1] + theirs[:-1]) / 2, params)
    return theirs[-1] > 0, True


class AdPsgd(Sync):
    stop_checks_every = STOP_CHECKS_EVERY

    def __init__(self, replicas, seed):
        super().__init__(replicas)
        self.seed = seed  # (--seed: every rank draws the same pairs)

    @classmethod
    def join(cls, args, replicas, params):
        return cls(replicas, args.seed)

    def after_step(self, params, epoch, step, straggled, tally):
        waited, paired = pairwise_average(params, self.replicas.layout, self.seed, epoch, step, straggled)
        tally.partial_syncs += paired / 2  # (each pair counted by both)
        return waited
