"""How the replicas of a stage agree, beside the partial reduce (preduce.py): allreduce, a full average,
AD-PSGD's random pairs and HetPipe's push and pull; and the counts the summary reports.

AD-PSGD (Lian et al., ICML 2018) runs here as SD-PIPE runs it: synchronous random matching, every
replica averaging with a partner drawn each step from a seed all ranks share, one grouped send and
receive per pair (the paper's asynchronous version needs a wait-free partner, which SD-PIPE does
not build either); with an odd number of replicas one sits out (SD-PIPE asks for an even one:
preduce.py 121).
HetPipe (Park et al., USENIX ATC 2020) as SD-PIPE runs it as its baseline (pipedream_subexecutor.py,
update_gradient_local 294-316 and the ParameterServerCommunicate branch 464-473): each stage's
parameter server holds the stage's global weights on the CPU; a replica applies each update to its
own weights, and pushes it, divided by R, to the server after every minibatch; every --wave W
minibatches (their batch_id % 10, and the epoch's last) it pulls the global weights in place of its
own. The push is the local step's change / R: with --momentum the momentum step, as the authors push
it (their optimizer writes the momentum step into the gradient it pushes: python/hetu/optimizer.py
306-315, src/ops/Optimizers.cu 81-89; pipedream_subexecutor.py 299-316). No bound on how far a
replica runs ahead, as in their ResNet script (train_resnet.py 84-85); HetPipe's own wave-synchronous
bound is --staleness D: a pull waits until the puller is at most D waves ahead of the slowest replica
(their BERT script's is 0: train_bert.py 76, bsp = 0). The push copies the stage's weights to the CPU
after every minibatch (on a GPU the host waits for them: a parameter server's push does). Where the
rules depart from the authors' code, with their files and lines: deviations.py.
"""

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from recipes.common import distributed, faults, pushpull


def flagged(vector, straggled):
    """The vector with one more element: whether this replica straggled at this step (for the waits; a Python
    bool, or a tensor on the vector's device: the waits are counted there, read once at the end)."""
    flag = straggled.reshape(1).to(vector.dtype) if torch.is_tensor(straggled) else vector.new_full((1,),
                                                                                                 float(straggled))
    return torch.cat([vector, flag])


def average_gradients(params, group, replicas, straggled):
    """allreduce: the mean of the replicas' gradients, as DDP computes it. Returns whether another replica's
    straggling held this one up (every replica waits for the last), as a tensor on the device."""
    flat = flagged(torch.cat([p.grad.reshape(-1) for p in params]), straggled)
    with faults.waiting_for("the stage's other replicas (allreduce)"):  # (every wait on a peer is marked: faults,
        # and on the CPU: an NCCL collective only queues, and the device waits in its place)
        dist.all_reduce(flat, group=group)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p) / replicas)
        offset += p.numel()
    return flat[-1] > float(straggled)


def average_weights(params, group, replicas, straggled=False):
    """A full synchronisation: every replica of the stage gets the mean of their weights."""
    flat = flagged(parameters_to_vector(params).detach(), straggled)
    with faults.waiting_for("the stage's other replicas (a full synchronisation)"):
        dist.all_reduce(flat, group=group)
    vector_to_parameters(flat[:-1] / replicas, params)
    return flat[-1] > float(straggled)


def pairwise_average(params, layout, args, epoch, step, straggled):
    """adpsgd: the replicas average in random pairs (an odd one out keeps its weights). Returns whether the
    partner's straggling held this replica up, and whether it had a partner."""
    draw = (args.seed or 0) * 1_000_003 + epoch * 10_007 + step  # the same on every rank, with or without --seed
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


def wave_ends(args, step, steps_per_epoch):
    """hetpipe: whether a replica pulls after this step (every --wave steps, and the epoch's last)."""
    return (step + 1) % args.wave == 0 or step + 1 == steps_per_epoch


def push_and_pull(params, replicas, pull):
    """hetpipe, after each local update: push it (its change over the weights after the last push or pull, on
    the CPU), divided by R, to the stage's server; with `pull`, then take the global weights into this replica's
    copy of them (client.vector) and into the stage's weights on the device."""
    client = replicas.hetpipe
    current = parameters_to_vector(params).detach().cpu()
    pushpull.send(pushpull.header(pushpull.PUSH, client.versions[0]), client.server,
                  (current - client.vector) / replicas.count)
    client.vector.copy_(current)
    if pull:
        pushpull.pull(client.vector, [[(0, client.vector.numel())]], client.versions, ranks=[client.server])
        pushpull.copy_into(params, client.vector)


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


def new_tally():
    """What a rank counts as it trains, for the summary."""
    return dict.fromkeys(["waits", "full_syncs", "partial_syncs", "gap", "longest_gap", "disagreement", "oldest",
                          "groups", "updates", "unconnected", "connections", "versions"], 0)


def connected(tally):
    """Count a synchronisation of all replicas, and how many steps the replicas went without one."""
    tally["full_syncs"] += 1
    tally["longest_gap"], tally["gap"] = max(tally["longest_gap"], tally["gap"]), 0


def counts_of_every_rank(tally, layout, rank):
    """The summary's sync counts, added up (or the most) over every rank: CPU numbers, over the control group."""
    world = layout.world_size
    sums = torch.zeros(4 + world, dtype=torch.float64)
    sums[:4] = torch.tensor([float(tally[key]) for key in ("waits", "partial_syncs", "groups", "connections")])
    sums[4 + rank] = tally["updates"]
    most = torch.zeros(3 + layout.stages, dtype=torch.float64)  # (the most weight versions a stage held: PipeDream)
    most[:3] = torch.tensor([max(tally["longest_gap"], tally["gap"]), tally["oldest"], tally["unconnected"]])
    most[3 + layout.stage(rank)] = tally["versions"]
    dist.all_reduce(sums, group=distributed.control_group())
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=distributed.control_group())
    updates = [int(sums[4 + layout.rank(r, 0)]) for r in range(layout.replicas)]
    stages = layout.stages
    return dict(full_syncs=tally["full_syncs"], partial_syncs=sums[1].item() / stages, waits=sums[0].item() / stages,
                mean_group_size=sum(updates) / (sums[2].item() / stages) if sums[2] else 0.0,
                updates_per_replica=updates, updates_per_rank=[int(u) for u in sums[4:]],
                connectivity_syncs=sums[3].item() / stages,
                longest_without_full_sync=int(most[0]),
                longest_unconnected_updates=int(most[2]), max_applied_staleness=int(most[1]),
                weight_versions_per_stage=[int(v) for v in most[3:]] if most[3:].any() else None,
                disagreement=tally["disagreement"])
