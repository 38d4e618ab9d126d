"""How the replicas of a stage agree: the hooks every --sync method answers (Sync), each method in a module of its
own (allreduce.py, preduce.py, adpsgd.py, hetpipe.py; layout.SYNCS names them), what they share, and the counts the
summary reports (Tally).

A method acts where the loops call it: before each update (allreduce averages the gradients), after it (the others
agree on the weights), at the epoch's end, where every replica meets, and after the last one; preduce also says
which batches an epoch takes and whether a step is one of its updates. Its class says what the rest needs to know of
it: how often the stop checks, a collective of all ranks, run (every few steps, or at epoch ends only),
whether the last S ranks are the stages' servers (hetpipe), and whether an epoch is a count of all replicas'
updates, claimed as they go (preduce). Where the rules depart from the authors' code, with their files and lines:
deviations.py.
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from recipes.common import distributed, faults

# allreduce's and adpsgd's stop checks: every 10th step, each read at the next, so a rank waits there only for
# one 10 steps behind (the methods' own waits keep them closer: a stage's replicas at each allreduce, partners at
# each AD-PSGD step, the stages of a replica at each minibatch), and a SIGTERM stops the run within 20 steps
STOP_CHECKS_EVERY = 10


class Sync:
    """A --sync method at one rank of a stage: the hooks the training loops call, each doing nothing unless the
    method overrides it."""

    stop_checks_every = None  # steps between the stop checks (None: at the epoch's end only)
    has_servers = False  # the last S ranks are the stages' servers
    counts_updates = False  # an epoch is R x (one shard's steps) updates of all replicas together
    replica_group = None  # (counts_updates: the gloo group of this replica's stages, for the claims)

    def __init__(self, replicas):
        self.replicas = replicas  # this stage among its replicas (layout.Replicas)

    @classmethod
    def join(cls, args, replicas, params):
        """The method at a training rank, once its stage's replicas are known (args: the run's flags; params: the
        stage's weights)."""
        return cls(replicas)

    def before_step(self, params, straggled, tally):
        """After the backward, before the update. Returns whether a straggling replica held this one up."""
        return False

    def after_step(self, params, epoch, step, straggled, tally):
        """After the update. Returns whether a straggling replica held this one up."""
        return False

    def shard(self, loader, run):
        """This replica's batches of the epoch."""
        return loader

    def claim(self, epoch, steps_per_epoch):
        """Before a step: whether the epoch has an update left for this replica."""
        return True

    def end_epoch(self, params, run, tally):
        """At the epoch's end, where every replica meets."""

    def end_training(self, tally):
        """After the last epoch."""


@dataclass
class Tally:
    """What a rank counts as it trains, for the summary (waits: a tensor on the device once a wait was counted, read
    once at the end)."""
    waits: Any = 0
    full_syncs: int = 0
    partial_syncs: float = 0
    gap: int = 0  # updates since the last synchronisation of all replicas
    longest_gap: int = 0
    disagreement: float = 0
    oldest: int = 0  # hetpipe's servers: the stalest push applied
    groups: float = 0
    updates: int = 0
    unconnected: int = 0  # preduce: the most updates between two connectivity syncs
    connections: int = 0
    versions: int = 0  # pipedream: the most weight versions the stage held at once

    def connected(self):
        """Count a synchronisation of all replicas, and how many steps the replicas went without one."""
        self.full_syncs += 1
        self.longest_gap, self.gap = max(self.longest_gap, self.gap), 0


def flagged(vector, straggled):
    """The vector with one more element: whether this replica straggled at this step (for the waits; a Python
    bool, or a tensor on the vector's device: the waits are counted there, read once at the end)."""
    flag = straggled.reshape(1).to(vector.dtype) if torch.is_tensor(straggled) else vector.new_full((1,),
                                                                                                 float(straggled))
    return torch.cat([vector, flag])


def average_weights(params, group, replicas, straggled=False):
    """A full synchronisation: every replica of the stage gets the mean of their weights."""
    flat = flagged(parameters_to_vector(params).detach(), straggled)
    with faults.waiting_for("the stage's other replicas (a full synchronisation)"):
        dist.all_reduce(flat, group=group)
    vector_to_parameters(flat[:-1] / replicas, params)
    return flat[-1] > float(straggled)


def disagreement(params, replicas, pipe_group):
    """The replicas' mean distance (L2, over the whole model) from their average weights."""
    mine = parameters_to_vector(params).detach()
    mean = mine.clone()
    with faults.waiting_for("the other replicas at the epoch's end"):
        dist.all_reduce(mean, group=replicas.stage_group)
        squared = (mine - mean / replicas.count).square().sum().reshape(1)
        dist.all_reduce(squared, group=pipe_group)  # this replica's stages together
        distance = squared.sqrt()
        dist.all_reduce(distance, group=replicas.stage_group)
    return distance.item() / replicas.count


def counts_of_every_rank(tally, layout, rank):
    """The summary's sync counts, added up (or the most) over every rank: CPU numbers, over the control group."""
    world = layout.world_size
    sums = torch.zeros(4 + world, dtype=torch.float64)
    sums[:4] = torch.tensor([float(tally.waits), float(tally.partial_syncs), float(tally.groups),
                             float(tally.connections)])
    sums[4 + rank] = tally.updates
    most = torch.zeros(3 + layout.stages, dtype=torch.float64)  # (the most weight versions a stage held: PipeDream)
    most[:3] = torch.tensor([max(tally.longest_gap, tally.gap), tally.oldest, tally.unconnected])
    most[3 + layout.stage(rank)] = tally.versions
    dist.all_reduce(sums, group=distributed.control_group())
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=distributed.control_group())
    updates = [int(sums[4 + layout.rank(r, 0)]) for r in range(layout.replicas)]
    stages = layout.stages
    return dict(full_syncs=tally.full_syncs, partial_syncs=sums[1].item() / stages, waits=sums[0].item() / stages,
                mean_group_size=sum(updates) / (sums[2].item() / stages) if sums[2] else 0.0,
                updates_per_replica=updates, updates_per_rank=[int(u) for u in sums[4:]],
                connectivity_syncs=sums[3].item() / stages,
                longest_without_full_sync=int(most[0]),
                longest_unconnected_updates=int(most[2]), max_applied_staleness=int(most[1]),
                weight_versions_per_stage=[int(v) for v in most[3:]] if most[3:].any() else None,
                disagreement=tally.disagreement)
