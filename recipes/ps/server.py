"""The servers' work around their loops (train.py): an update applied to a shard, whose statistics each
keeps, the counts of the summary, the goodbye after training, the whole model put together for
evaluation and checkpoints, and a server's share of a resumed checkpoint."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector

from recipes.common import pushpull


def apply(args, shard, optimizer, update, tally):
    """One update of this server's chunks, a new version: an SGD step along a gradient, or (local steps) the
    weights moved by the workers' change of them."""
    if args.local_steps == 1:
        shard.grad = update
        optimizer.step()
    else:
        shard.data -= update
    tally["version"] += 1


def record(run, message, sender, senders, tally):
    """Each sender's training statistics and update counts are kept by one server (sender i by server i mod S),
    so that the servers' sums count each once. Returns the batch loss, or None when another server keeps it."""
    servers = dist.get_world_size(run.group)
    if senders.index(sender) % servers != dist.get_rank(run.group):
        return None
    stats = message[pushpull.STATS]
    run.meter.add(stats[:3], int(stats[3]))
    # the workers' wait for data (a server's own is none): the summary divides by the servers, so that it
    # reports the mean per worker
    run.meter.data_s += float(stats[4]) * servers / tally["workers"]
    tally["counts"] += message[pushpull.COUNTS]
    return float(stats[0] / stats[3])


def drain(clients, tally, shard, optimizer):
    """Once trained (or at --desired-acc): answer each pull with stop, until every client has left (clients
    that send nothing within --dist-timeout are taken for dead); a push now is not applied."""
    while len(tally["left"]) < len(clients):
        try:
            message, sender, _ = pushpull.serve(shard.detach(), tally["version"], optimizer.param_groups[0]["lr"],
                                                stop=True)
        except RuntimeError:
            return
        if message[pushpull.KIND] == pushpull.BYE:
            tally["left"].add(sender)


def gather(model, view, shard, optimizer, chunks, servers_control):
    """Every server puts together the whole model (on its device), and the checkpoint's optimizer (view) its
    momentum, from all servers' shards (on their CPUs): for evaluation and the checkpoint."""
    longest = max(pushpull.shard_size(server_chunks) for server_chunks in chunks)

    def whole(values):  # every server's shard of a flat vector, put together (shards padded to one length)
        every = [torch.zeros(longest) for _ in chunks]
        dist.all_gather(every, nn.functional.pad(values, (0, longest - values.numel())), group=servers_control)
        vector = torch.empty(sum(pushpull.shard_size(server_chunks) for server_chunks in chunks))
        for server_chunks, values_of in zip(chunks, every):
            pushpull.put(vector, server_chunks, values_of)
        return vector

    pushpull.copy_into(model.parameters(), whole(shard.detach()))
    momentum = optimizer.state[shard].get("momentum_buffer")  # (none before the first step)
    if momentum is not None:
        for p, buffer in zip(model.parameters(), whole(momentum).split([p.numel() for p in model.parameters()])):
            view.state[p]["momentum_buffer"] = buffer.view_as(p).to(p.device, copy=True)
    view.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"]


def counts_of_every_server(tally, run):
    """The summary's update counts, added up (or the most) over the servers: CPU numbers, over their gloo group
    (run.control; run.group, on the device, is NCCL's on GPUs)."""
    dist.all_reduce(tally["counts"], group=run.control)
    counts = {}  # by pushes (rejected: shares of pushes), by tensors, by parameters (attacks.counts)
    for by, values in zip(("", "_tensors", "_params"), tally["counts"].split(4)):
        honest_pushed, byzantine_pushed, honest_rejected, byzantine_rejected = values.tolist()
        counts.update({f"honest{by}_pushed": round(honest_pushed), f"byzantine{by}_pushed": round(byzantine_pushed),
                       f"honest{by}_rejected": round(honest_rejected, 3),
                       f"byzantine{by}_rejected": round(byzantine_rejected, 3)})
    most = torch.tensor([tally["stale"], tally["oldest"]])  # (every server drops and applies on its own)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=run.control)
    stale, oldest = most.tolist()
    return dict(**counts, stale_dropped=stale, max_applied_staleness=oldest)


def log_validators(run, tally, epoch):
    """The validators' work in the epoch, one line (rank 0): pushes and parameters rejected, honest and poisoned,
    added up over the servers (a collective of their gloo group). A push counts the share of its tensors that were
    rejected, so pushes can be fractional."""
    done = tally["counts"].clone()
    dist.all_reduce(done, group=run.control)
    epoch_counts, tally["logged"] = (done - tally["logged"]).tolist(), done
    pushes, parameters = epoch_counts[:4], epoch_counts[8:]  # (attacks.counts: pushed and rejected, by what)
    run.log.print(f"epoch {epoch} validators: pushes rejected {round(pushes[2], 3):g} of {pushes[0]:.0f} honest, "
                  f"{round(pushes[3], 3):g} of {pushes[1]:.0f} poisoned; parameters rejected {parameters[2]:,.0f} "
                  f"of {parameters[0]:,.0f} honest, {parameters[3]:,.0f} of {parameters[1]:,.0f} poisoned")


def server_state(model, view, shard, optimizer, server_chunks):
    """A server's shard of the (resumed) weights, and of the momentum when the checkpoint has it."""
    shard.data = pushpull.take(parameters_to_vector(model.parameters()).detach().cpu(), server_chunks)
    buffers = [view.state.get(p, {}).get("momentum_buffer") for p in model.parameters()]
    if all(buffer is not None for buffer in buffers):
        momentum = torch.cat([buffer.reshape(-1) for buffer in buffers]).cpu()
        optimizer.state[shard]["momentum_buffer"] = pushpull.take(momentum, server_chunks)
