"""Parameter server: servers hold the model, workers pull its weights and push updates; then, against
Byzantine workers, Zeno validators between them that drop the updates that would hurt.

    torchrun --nproc_per_node=9 recipes/ps/train.py data/mnist5k -a lenet --image-size 28 -b 8 --epochs 4

Roles by rank (layout.py): 0..S-1 are servers (--servers S), the next V validators (--validators V), the
rest workers; one command on each node, as for ddp. The parameters are cut into chunks of about
--partition-bytes, dealt to the servers by bytes; each applies its updates to its chunks, a version per
update. Workers pull the chunks that changed, compute an update on their shard of train/ and push it.

--local-steps 1 (default): the update is a gradient, and the servers apply SGD to it (momentum, weight
decay, the schedule flags): sync with mean trains ddp's model. --local-steps H: each worker takes H SGD
steps of its own (its momentum kept) and pushes the change of its weights (ZenoPS's workers: H = 8).

--mode sync: each round waits for every worker's push and applies their aggregate (--lr is scaled
to the batch of all workers). --mode async: each push is applied as it arrives (--lr is scaled to
one worker's batch); --max-staleness D drops an update more than D versions old.

Byzantine workers (attacks.py): --byzantine K makes workers 0..K-1 lie at every push, --attack-prob
q every worker with probability q, per tensor of a push. Without validators the servers can aggregate
robustly (rules.py; sync: median, trimmed-mean, krum, centered-clipping, phocas; async: ZenoPS's
naive-async). With --validators V and --aggregate zenops|zeno|zeno++, the validators hold out
--validation-split of train/ and judge their workers' pushes against what they compute on it
(validators.py).

A lost process ends a torchrun job within about a second (exit 75; --max-restarts N with --auto-resume
starts it again); launched with --dist-url, async goes on without a dead worker (README.md).
"""

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: `recipes` imports uninstalled

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DistributedSampler

from recipes.common import bookkeeping, cli, data, distributed, faults, launch, models, pushpull, runlog, schedule
from recipes.ps import attacks, layout as roles, rules, steps, validators
from recipes.ps.server import apply, counts_of_every_server, drain, gather, log_validators, record, server_state


def parse_args(argv=None):
    parser = cli.build_parser("ps", __doc__)
    cli.add_distributed_args(parser)
    roles.add_args(parser)
    args = cli.parse_args(parser, argv)
    roles.check_flags(args)
    return args


# ---- workers: pull, compute an update, push ------------------------------------------------------------

def run_worker(args, layout, rank, model, batches, chunks, rounds, num_classes, device, first_round, attacker):
    """Pull the weights that changed, compute an update from the next --local-steps batches, push it: to every
    server its chunks, or whole to this worker's validator. Sync: for `rounds` rounds; both: until a pull says
    stop. first_round: the rounds the run trained before this start (a resume), for the draws of who pushes
    (--worker-subsample) and who lies (the attacker's)."""
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = steps.local_optimizer(args, model)  # (its local steps')
    vector = parameters_to_vector(model.parameters()).detach().cpu()  # this worker's copy of the weights
    versions = [-1] * args.servers  # of this worker's copy of each server's chunks: none yet
    to_device = data.device_transform(args, device, num_classes)
    sizes, index, validator = attacker.sizes, layout.worker_index(rank), layout.validator_of(rank)
    residual, pulls = torch.zeros_like(vector), True  # residual: what it trained and did not push (--worker-subsample)
    model.train()
    for round_ in itertools.count() if rounds is None else range(rounds):
        if pulls:
            stop, lr = pushpull.pull(vector, chunks, versions)
            if stop:  # the servers have trained enough (async), or reached --desired-acc
                break
        pushes = steps.joins(args, index, first_round + round_)  # (counted from the run's start: a resume too)
        lies = attacker.next_push(first_round + round_) if pushes else [False] * len(sizes)  # (which tensors)
        relabel = (lambda target: attacker.labels(target, num_classes, lies)) if any(lies) else None
        start = vector - residual
        u, stats = steps.local_update(model, optimizer, criterion, start, batches, args.local_steps, lr, to_device,
                                      relabel)
        # after a round it sat out, as ZenoPS's (zeno_ps byteps/mxnet/__init__.py): sync, the new weights plus that
        # round's change, pushing the next alone (413-425); async, no pull, all it trained since its last (824-871)
        u = u + residual if args.mode == "async" else u
        residual = torch.zeros_like(vector) if pushes or args.local_steps == 1 else u
        pulls = pushes or args.mode == "sync"
        if not pushes:
            for peer in [validator] if validator is not None else range(args.servers):
                pushpull.send(pushpull.header(pushpull.SKIP, stats=stats), peer)
            continue
        u, counts = attacker.poison(u, lies), attacks.counts(lies, sizes)  # (the counts: for the summary)
        if validator is not None:  # the validator forwards it, or not (which tensors lie: for its counts)
            pushpull.push_candidate(validator, pushpull.header(pushpull.PUSH, stats=stats, counts=counts), versions,
                                    torch.cat([u, torch.tensor(lies, dtype=u.dtype)]))
            continue
        for server, server_chunks in enumerate(chunks):
            message = pushpull.header(pushpull.PUSH, versions[server], stats, counts)
            pushpull.send(message, server, pushpull.take(u, server_chunks))
    # leaving: the servers (and an async validator, which waits for any of its workers) stop waiting for it
    for peer in [*range(args.servers), *([validator] if validator is not None and args.mode == "async" else [])]:
        pushpull.send(pushpull.header(pushpull.BYE), peer)


# ---- servers: apply the updates to their chunks; evaluate and save at each epoch's end -----------------

def sync_step(args, run, shard, optimizer, layout, tally):
    """Every client pulls this round's weights, every sender pushes; apply the aggregate (validators: tensor by
    tensor, the mean of what they accepted). Returns the losses this server records."""
    lr = optimizer.param_groups[0]["lr"]
    for client in layout.clients:
        request, _ = pushpull.recv_header(client)
        pushpull.answer_pull(request, client, shard.detach(), tally["version"], lr)
    accepted_counts = len(tally["sizes"]) if args.validators else 0  # (validators: per tensor, how many passed)
    received = []
    for sender in layout.senders:  # (a worker that sits the round out sends no update: a skip)
        message, _ = pushpull.recv_header(sender)
        pushed = message[pushpull.KIND] == pushpull.PUSH
        received.append((message, pushpull.recv_payload(sender, shard.numel() + accepted_counts) if pushed else None))
    updates = [u for _, u in received if u is not None]
    if args.validators:  # (tensor by tensor, the mean of the pushes they accepted)
        apply(args, shard, optimizer, validators.accepted_mean(updates, shard.numel(), tally["tensor_of"]), tally)
    elif updates:
        update = rules.aggregate(args.aggregate, updates, args.zeno_b, tally["clipping"], args.trim_ratio)
        apply(args, shard, optimizer, update, tally)
    losses = [record(run, message, sender, layout.senders, tally) for (message, _), sender in
              zip(received, layout.senders)]
    return [loss for loss in losses if loss is not None]


def async_step(args, run, shard, optimizer, layout, tally):
    """Answer pulls until the next worker's push arrives (or a validator's skip); apply it unless it was
    computed more than --max-staleness versions ago. Returns the losses this server records."""
    kind = pushpull.PULL
    while kind in (pushpull.PULL, pushpull.BYE):
        message, sender, u = pushpull.serve(shard.detach(), tally["version"], optimizer.param_groups[0]["lr"])
        kind = int(message[pushpull.KIND])
        if kind == pushpull.BYE:  # (or died)
            tally["left"].add(sender)
    if kind == pushpull.PUSH:
        staleness = tally["version"] - int(message[pushpull.VERSION])  # updates since its weights were pulled
        if args.max_staleness is not None and staleness > args.max_staleness:
            tally["stale"] += 1
        else:
            apply(args, shard, optimizer, args.zeno_alpha * u if args.aggregate == "naive-async" else u, tally)
            tally["oldest"] = max(tally["oldest"], staleness)
    loss = record(run, message, sender, layout.senders, tally)
    return [] if loss is None else [loss]


def run_server(args, layout, run, shard, optimizer, val_loader, sizes, server_chunks):
    """Per round, sync: answer every client's pull, take every push, apply their aggregate; async: answer
    pulls until the next push arrives, apply it unless it is too stale. At each epoch's end, evaluate and
    save. Then tell every client to stop, and write the counts into summary.json."""
    tally = {"version": 0, "stale": 0, "oldest": 0, "left": set(), "counts": torch.zeros(12, dtype=torch.float64),
             "logged": torch.zeros(12, dtype=torch.float64),
             "workers": layout.workers, "clipping": rules.clipping(args.aggregate), "sizes": sizes,
             "tensor_of": validators.tensor_of(sizes, server_chunks) if args.validators else None}
    step = sync_step if args.mode == "sync" else async_step
    try:
        for epoch in run.epochs():
            for _ in run.batches(range(run.steps_per_epoch)):
                losses = step(args, run, shard, optimizer, layout, tally)
                run.step_done(torch.tensor(sum(losses) / len(losses) if losses else 0.0))
            if args.validators:
                log_validators(run, tally, epoch + 1)
            if run.end_epoch(run.meter.summary(), val_loader):
                break
    except faults.Preempted:  # saved after a SIGTERM: tell every client to stop, then exit for a relaunch
        drain(layout.clients, tally, shard, optimizer)
        raise
    drain(layout.clients, tally, shard, optimizer)
    run.finish(val_loader, mode=args.mode, aggregate=args.aggregate, attack=args.attack, byzantine=args.byzantine,
               attack_prob=args.attack_prob, local_steps=args.local_steps, servers=args.servers,
               validators=args.validators, workers=layout.workers, **counts_of_every_server(tally, run))


def main(args):
    ctx = distributed.init_distributed_mode(args)
    layout = roles.check_world(args, ctx.world_size)
    device, rank, role = ctx.device, ctx.rank, layout.role(ctx.rank)
    log = runlog.RunLog(args, enabled=ctx.is_main)
    # the servers' groups: their device group evaluates, the gloo one carries the shards (on the CPU, as BytePS's)
    servers_group = distributed.new_group(range(args.servers))  # (every rank takes part in making each group)
    servers_control = distributed.new_control_group(range(args.servers))
    validators_control = distributed.new_control_group(range(args.servers, layout.first_worker)) \
        if args.validators else None

    train_set, val_set, num_classes = data.build_datasets(args)
    # the validators' own data: a part of train/ that no worker sees
    train_set, held_out = data.hold_out(train_set, args.validation_split, args.seed) if args.validation_split \
        else (train_set, None)
    worker_sampler = DistributedSampler(train_set, num_replicas=layout.workers,
                                        rank=max(layout.worker_index(rank), 0), seed=args.seed or 0)
    rounds_per_epoch = len(worker_sampler) // args.batch_size // args.local_steps  # (ddp's rank i's shard)
    roles.check_data(args, layout, len(worker_sampler), held_out)

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes, args.image_size).to(device)
    sync = args.mode == "sync"
    global_batch = args.batch_size * (layout.workers if sync else 1)  # what one update averages over
    lr = args.lr * global_batch / 256  # linear scaling rule: --lr is for a global batch of 256
    sizes = [p.numel() for p in model.parameters()]
    chunks = pushpull.partition(sizes, args.partition_bytes, args.servers)
    update_steps = rounds_per_epoch * (1 if sync else layout.workers)  # server updates per epoch (async: pushes)

    start = [0, 0]
    if role == "server":
        shard = nn.Parameter(pushpull.take(parameters_to_vector(model.parameters()).detach().cpu(), chunks[rank]))
        optimizer = torch.optim.SGD([shard], lr, momentum=args.momentum, weight_decay=args.weight_decay)
        view = torch.optim.SGD(model.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay)
        view.param_groups[0]["initial_lr"] = lr  # the checkpoint's optimizer, as the other recipes save it
        scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=update_steps)
        run = bookkeeping.Run(args, log, device, model, view, scheduler, None, num_classes, global_batch,
                              steps_per_epoch=update_steps, group=servers_group, control=servers_control,
                              gather=lambda: gather(model, view, shard, optimizer, chunks, servers_control))
        run.resume()  # --resume, or <out>/checkpoint.pt with --auto-resume: then take this server's chunks
        server_state(model, view, shard, optimizer, chunks[rank])  # (resumed: this server's chunks)
        start = [run.checkpoint.epoch, run.checkpoint.step // (1 if sync else layout.workers)]  # in rounds
        val_loader = data.val_loader(val_set, args, rank, args.servers)
        log.print(f"ps: {args.servers} server(s), {args.validators} validator(s), {layout.workers} worker(s) on "
                  f"{device} ({ctx.backend}), {args.mode}, {args.local_steps} local step(s) a push, --aggregate "
                  f"{args.aggregate}, {attacks.describe(args)}; chunks per server {[len(c) for c in chunks]}, "
                  f"{[pushpull.shard_size(c) for c in chunks]} parameters; {run.describe(train_set, val_set)}")
    if role == "server" and args.aggregate in roles.BYZFL_RULES:
        import byzfl  # noqa: F401 (seconds to import: before the start, so that no client waits on it)
    positions = [start]
    dist.broadcast_object_list(positions, src=0, group=ctx.control)  # where a resumed run starts, for the clients
    start = positions[0]
    remaining_rounds = (args.epochs - start[0]) * rounds_per_epoch - start[1]  # (sync: a worker's and validator's)
    if args.evaluate:
        if role == "server":
            run.finish(val_loader)
    elif role == "server":
        run_server(args, layout, run, shard, optimizer, val_loader, sizes, chunks[rank])
    elif role == "validator":
        batches = validators.held_out_batches(args, held_out, rank, start[0], ctx.world_size)
        faults.catch_sigterm(args.out, rank)  # (a SIGTERM travels with its messages: the servers save, stop)
        validators.run_validator(args, layout, rank, model, batches, chunks, remaining_rounds, lr, validators_control,
                                 data.device_transform(args, device, num_classes))
        steps.stopped_for_sigterm(args)
    else:
        loader = data.train_loader(train_set, args, worker_sampler)
        faults.catch_sigterm(args.out, rank)
        batches = steps.forever(loader, worker_sampler, start[0], args.seed, layout.worker_index(rank),
                                start[1] * args.local_steps, rounds_per_epoch * args.local_steps)
        attacker = attacks.Attacker(args, layout.worker_index(rank), sizes, args.clean_epochs * rounds_per_epoch)
        run_worker(args, layout, rank, model, batches, chunks, remaining_rounds if sync else None, num_classes, device,
                   start[0] * rounds_per_epoch + start[1], attacker)
        steps.stopped_for_sigterm(args)
    distributed.cleanup()


if __name__ == "__main__":
    launch.start(main, parse_args)
