"""The servers' work around their loops (train.py): one update made of a step's pushes (the rules, or the
validators' accepted pushes), applied to a shard, whose statistics each keeps, the counts of the summary,
the goodbye after training, the whole model put together for evaluation and checkpoints, and a server's
share of a resumed checkpoint."""

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector

from recipes.common import bookkeeping, pushpull, schedule
from recipes.ps import attacks, rules, validators
from recipes.ps.roles import BYZFL_RULES


def zero_counts():
    return torch.zeros(attacks.COUNTS, dtype=torch.float64)


@dataclass
class Tally:
    """What a server counts as it trains: its version, the stale pushes dropped and the oldest applied, the
    clients that left, the update counts (attacks.counts) summed and as last logged; and what its rules keep."""
    workers: int
    sizes: list  # (the size of each of the model's tensors)
    tests: bool  # (zenops sync: which test a rejected parameter failed)
    clipping: Any  # (centered clipping's centre, kept from step to step)
    tensor_of: Any  # (validators: the tensor of each element of this server's shard)
    version: int = 0
    stale: int = 0
    oldest: int = 0
    left: set = field(default_factory=set)
    counts: torch.Tensor = field(default_factory=zero_counts)
    logged: torch.Tensor = field(default_factory=zero_counts)


def new_tally(args, layout, sizes, server_chunks):
    """A server's Tally before its first round."""
    if args.aggregate in BYZFL_RULES:
        import byzfl  # noqa: F401 (seconds to import: before the first round, so that no client waits on it)
    return Tally(layout.workers, sizes, tests=args.aggregate == "zenops" and args.mode == "sync",
                 clipping=rules.clipping(args.aggregate),
                 tensor_of=validators.tensor_of(sizes, server_chunks) if args.validators else None)


def combine(args, updates, numel, tally):
    """The servers' hook: one update of this server's shard (numel elements) from a step's pushes. Sync: the
    validators' accepted pushes, tensor by tensor, or a rule (rules.py) over the workers'; async: the push,
    naive-async's scaled on the servers unless validators scaled it."""
    if args.mode == "async":
        return rules.naive_async(updates[0], args.zeno_alpha) \
            if args.aggregate == "naive-async" and not args.validators else updates[0]
    if args.validators:
        return validators.accepted_mean(updates, numel, tally.tensor_of)
    return rules.aggregate(args.aggregate, updates, args.zeno_b, tally.clipping, args.trim_ratio)


def apply(args, shard, optimizer, update, tally):
    """One update of this server's chunks, a new version: an SGD step along a gradient, or (local steps) the
    weights moved by the workers' change of them."""
    if args.local_steps == 1:
        shard.grad = update
        optimizer.step()
    else:
        shard.data -= update
    tally.version += 1


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
    run.meter.data_s += float(stats[4]) * servers / tally.workers
    tally.counts += message[pushpull.COUNTS]
    return float(stats[0] / stats[3])


def drain(clients, tally, shard, optimizer):
    """Once trained (or at --desired-acc): answer each pull with stop, until every client has left (clients
    that send nothing within --dist-timeout are taken for dead); a push now is not applied."""
    while len(tally.left) < len(clients):
        try:
            message, sender, _ = pushpull.serve(shard.detach(), tally.version, optimizer.param_groups[0]["lr"],
                                                stop=True)
        except RuntimeError:
            return
        if message[pushpull.KIND] == pushpull.BYE:
            tally.left.add(sender)


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


def describe(args, layout, chunks, where):
    """The run's set-up in words, for its first line (where: the device and backend)."""
    return (f"{args.servers} server(s), {args.validators} validator(s), {layout.workers} worker(s) on {where}, "
            f"{args.mode}, {args.local_steps} local step(s) a push, --aggregate {args.aggregate}"
            f"{' in the validators' if args.aggregate == 'naive-async' and args.validators else ''}, "
            f"{attacks.describe(args)}; chunks per server {[len(c) for c in chunks]}, "
            f"{[pushpull.shard_size(c) for c in chunks]} parameters")


def summary_of(args, layout, tally, run):
    """What summary.json adds for the parameter server: the set-up, and the update counts added up (or the most)
    over the servers: CPU numbers, over their gloo group (run.control; run.group, on the device, is NCCL's on
    GPUs)."""
    dist.all_reduce(tally.counts, group=run.control)
    counts = {}  # by pushes (rejected: shares of pushes), by tensors, by parameters (attacks.counts)
    for by, values in zip(("", "_tensors", "_params"), tally.counts[attacks.PUSHED_REJECTED].split(4)):
        honest_pushed, byzantine_pushed, honest_rejected, byzantine_rejected = values.tolist()
        counts.update({f"honest{by}_pushed": round(honest_pushed), f"byzantine{by}_pushed": round(byzantine_pushed),
                       f"honest{by}_rejected": round(honest_rejected, 3),
                       f"byzantine{by}_rejected": round(byzantine_rejected, 3)})
    most = torch.tensor([tally.stale, tally.oldest])  # (every server drops and applies on its own)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=run.control)
    stale, oldest = most.tolist()
    failed = tally.counts[attacks.FAILED_TESTS].tolist()
    tests = dict(zip(("honest_params_failed_norm", "honest_params_failed_sign", "byzantine_params_failed_norm",
                      "byzantine_params_failed_sign"), (round(n) for n in failed)))
    return dict(mode=args.mode, aggregate=args.aggregate, attack=args.attack, byzantine=args.byzantine,
                attack_prob=args.attack_prob, local_steps=args.local_steps, servers=args.servers,
                validators=args.validators, workers=layout.workers, **counts, **tests, stale_dropped=stale,
                max_applied_staleness=oldest)


def log_validators(run, tally, epoch):
    """The validators' work in the epoch, one line (rank 0): pushes and parameters rejected, honest and poisoned,
    added up over the servers (a collective of their gloo group). A push counts the share of its tensors that were
    rejected, so pushes can be fractional. zenops: which of its tests the poisoned parameters failed (one may fail
    both)."""
    done = tally.counts.clone()
    dist.all_reduce(done, group=run.control)
    epoch_counts, tally.logged = (done - tally.logged).tolist(), done
    pushes, parameters = epoch_counts[:4], epoch_counts[attacks.PARAMS]  # (attacks.counts: pushed and rejected)
    run.log.print(f"epoch {epoch} validators: pushes rejected {round(pushes[2], 3):g} of {pushes[0]:.0f} honest, "
                  f"{round(pushes[3], 3):g} of {pushes[1]:.0f} poisoned; parameters rejected {parameters[2]:,.0f} "
                  f"of {parameters[0]:,.0f} honest, {parameters[3]:,.0f} of {parameters[1]:,.0f} poisoned"
                  + ("; of the poisoned, {2:,.0f} failed the norm test, {3:,.0f} the sign test"
                     .format(*epoch_counts[attacks.FAILED_TESTS]) if tally.tests else ""))


def server_state(model, view, shard, optimizer, server_chunks):
    """A server's shard of the (resumed) weights, and of the momentum when the checkpoint has it."""
    shard.data = pushpull.take(parameters_to_vector(model.parameters()).detach().cpu(), server_chunks)
    buffers = [view.state.get(p, {}).get("momentum_buffer") for p in model.parameters()]
    if all(buffer is not None for buffer in buffers):
        momentum = torch.cat([buffer.reshape(-1) for buffer in buffers]).cpu()
        optimizer.state[shard]["momentum_buffer"] = pushpull.take(momentum, server_chunks)


def server_run(args, log, device, model, shard, optimizer, chunks, num_classes, global_batch, update_steps, groups):
    """A server's bookkeeping (common/bookkeeping.Run): its learning-rate schedule, the whole model and an optimizer
    of it (view) for evaluation and checkpoints, put together from every server's shard (gather), and --resume:
    then this server's chunks of the resumed weights and momentum."""
    lr = optimizer.param_groups[0]["lr"]
    view = torch.optim.SGD(model.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay)
    view.param_groups[0]["initial_lr"] = lr  # the checkpoint's optimizer, as the other recipes save it
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=update_steps)
    server_chunks = chunks[dist.get_rank()]
    run = bookkeeping.Run(args, log, device, model, view, scheduler, None, num_classes, global_batch,
                          steps_per_epoch=update_steps, group=groups.servers, control=groups.servers_control,
                          gather=lambda: gather(model, view, shard, optimizer, chunks, groups.servers_control))
    run.resume()  # --resume, or <out>/checkpoint.pt with --auto-resume
    server_state(model, view, shard, optimizer, server_chunks)
    return run
