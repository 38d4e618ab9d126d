"""Parameter server: servers hold the model, workers pull its weights and push updates; then, against
Byzantine workers, Zeno validators between them that drop the updates that would hurt.

    torchrun --nproc_per_node=9 recipes/ps/train.py data/mnist5k -a lenet --image-size 28 -b 8 --epochs 4

Roles by rank (roles.py): 0..S-1 are servers (--servers S), the next V validators (--validators V), the
rest workers. The parameters are cut into chunks of about --partition-bytes, dealt to the servers; each
applies its updates to its chunks, a version per update. Workers pull the chunks that changed, compute
an update on their shard of train/ and push it: a gradient, which the servers' SGD applies (sync with
mean trains ddp's model), or with --local-steps H the change of their weights over H steps (ZenoPS's).

--mode sync: each round applies the aggregate of every worker's push (--lr scaled to all workers' batch);
--mode async: each push as it arrives (--lr scaled to one worker's batch), --max-staleness D drops one
more than D versions old. Against --byzantine K or --attack-prob q liars (attacks.py, worker.py), the
servers can aggregate robustly (rules.py), or --validators V judge the pushes on held-out data
(validators.py). A lost process ends a torchrun job within about a second (exit 75; README.md).
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

from recipes.common import cli, data, distributed, faults, launch, models, pushpull, runlog
from recipes.ps import attacks, roles, steps, validators, worker
from recipes.ps.server import (apply, combine, describe, drain, log_validators, new_tally, record, server_run,
                               summary_of)


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
    server its chunks, or whole to this worker's validator. Sync: for `rounds` rounds; async: until a pull says
    stop. first_round: the rounds the run trained before this start (a resume), for the draws of who pushes
    (--worker-subsample) and who lies."""
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = steps.local_optimizer(args, model)  # (its local steps')
    vector = parameters_to_vector(model.parameters()).detach().cpu()  # this worker's copy of the weights
    versions = [-1] * args.servers  # of this worker's copy of each server's chunks: none yet
    to_device = data.device_transform(args, device, num_classes)
    index, validator = layout.worker_index(rank), layout.validator_of(rank)
    residual, pulls = torch.zeros_like(vector), True  # residual: what it trained and did not push (worker.py)
    model.train()
    for round_ in itertools.count(first_round) if rounds is None else range(first_round, first_round + rounds):
        if pulls:
            stop, lr = pushpull.pull(vector, chunks, versions)
            if stop:  # the servers have trained enough (async), or reached --desired-acc
                break
        pushes, lies = worker.draws(args, attacker, index, round_)  # (which tensors lie)
        u, stats = steps.local_update(model, optimizer, criterion, vector - residual, batches, args.local_steps, lr,
                                      to_device, attacker.relabel(lies, num_classes))
        u, counts, residual = worker.prepare_push(args, attacker, index, round_, u, residual, pushes, lies)
        pulls = pushes or args.mode == "sync"  # (async: after a round sat out it trains on from its own weights)
        if not pushes:
            for peer in [validator] if validator is not None else range(args.servers):
                pushpull.send(pushpull.header(pushpull.SKIP, stats=stats), peer)
        elif validator is not None:  # it forwards u, or not (which tensors lie: for its counts)
            pushpull.push_candidate(validator, pushpull.header(pushpull.PUSH, stats=stats, counts=counts), versions,
                                    torch.cat([u, torch.tensor(lies, dtype=u.dtype)]))
        else:
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
        pushpull.answer_pull(request, client, shard.detach(), tally.version, lr)
    accepted_counts = len(tally.sizes) if args.validators else 0  # (validators: per tensor, how many passed)
    received = []
    for sender in layout.senders:  # (a worker that sits the round out sends no update: a skip)
        message, _ = pushpull.recv_header(sender)
        pushed = message[pushpull.KIND] == pushpull.PUSH
        received.append((message, pushpull.recv_payload(sender, shard.numel() + accepted_counts) if pushed else None))
    updates = [u for _, u in received if u is not None]
    if updates:  # (none: every worker sat the round out, and no validator; a validator forwards zeros)
        apply(args, shard, optimizer, combine(args, updates, shard.numel(), tally), tally)
    losses = [record(run, message, sender, layout.senders, tally) for (message, _), sender in
              zip(received, layout.senders)]
    return [loss for loss in losses if loss is not None]


def async_step(args, run, shard, optimizer, layout, tally):
    """Answer pulls until the next worker's push arrives (or a validator's skip); apply it unless it was
    computed more than --max-staleness versions ago. Returns the losses this server records."""
    kind = pushpull.PULL
    while kind in (pushpull.PULL, pushpull.BYE):
        message, sender, u = pushpull.serve(shard.detach(), tally.version, optimizer.param_groups[0]["lr"])
        kind = int(message[pushpull.KIND])
        if kind == pushpull.BYE:  # (or died)
            tally.left.add(sender)
    if kind == pushpull.PUSH:
        staleness = tally.version - int(message[pushpull.VERSION])  # updates since its weights were pulled
        if args.max_staleness is not None and staleness > args.max_staleness:
            tally.stale += 1
        else:
            apply(args, shard, optimizer, combine(args, [u], shard.numel(), tally), tally)
            tally.oldest = max(tally.oldest, staleness)
    loss = record(run, message, sender, layout.senders, tally)
    return [] if loss is None else [loss]


def run_server(args, layout, run, shard, optimizer, val_loader, sizes, server_chunks):
    """Per round, sync: answer every client's pull, take every push, apply their aggregate; async: answer
    pulls until the next push arrives, apply it unless it is too stale. At each epoch's end, evaluate and
    save. Then tell every client to stop, and write the counts into summary.json."""
    tally = new_tally(args, layout, sizes, server_chunks)
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
    run.finish(val_loader, **summary_of(args, layout, tally, run))


def main(args):
    ctx = distributed.init_distributed_mode(args)
    layout = roles.check_world(args, ctx.world_size)
    device, rank, role = ctx.device, ctx.rank, layout.role(ctx.rank)
    log = runlog.RunLog(args, enabled=ctx.is_main)
    groups = roles.process_groups(args, layout)  # the servers', the validators', the liars'

    train_set, val_set, num_classes = data.build_datasets(args)
    # the validators' own data: a part of train/ that no worker sees
    train_set, held_out = data.hold_out(train_set, args.validation_split, args.seed) if args.validation_split \
        else (train_set, None)
    worker_sampler = DistributedSampler(train_set, num_replicas=layout.workers,
                                        rank=max(layout.worker_index(rank), 0), seed=args.seed or 0)
    rounds_per_epoch = len(worker_sampler) // args.batch_size // args.local_steps  # (ddp's rank i's shard)
    roles.check_data(args, layout, len(worker_sampler), held_out)

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes, args.image_size, args.weights).to(device)
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
        run = server_run(args, log, device, model, shard, optimizer, chunks, num_classes, global_batch, update_steps,
                         groups)  # (resumed: this server's chunks of the weights and momentum)
        start = [run.checkpoint.epoch, run.checkpoint.step // (1 if sync else layout.workers)]  # in rounds
        val_loader = data.val_loader(val_set, args, rank, args.servers)
        where = f"{device} ({ctx.backend})"
        log.print(f"ps: {describe(args, layout, chunks, where)}; {run.describe(train_set, val_set)}")
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
        validators.run_validator(args, layout, rank, model, batches, chunks, remaining_rounds, lr, groups.validators,
                                 data.device_transform(args, device, num_classes))
        steps.stopped_for_sigterm(args)
    else:
        loader = data.train_loader(train_set, args, worker_sampler)
        faults.catch_sigterm(args.out, rank)
        batches = steps.forever(loader, worker_sampler, start[0], args.seed, layout.worker_index(rank),
                                start[1] * args.local_steps, rounds_per_epoch * args.local_steps)
        attacker = attacks.Attacker(args, layout.worker_index(rank), sizes, args.clean_epochs * rounds_per_epoch,
                                    groups.liars)
        run_worker(args, layout, rank, model, batches, chunks, remaining_rounds if sync else None, num_classes, device,
                   start[0] * rounds_per_epoch + start[1], attacker)
        steps.stopped_for_sigterm(args)
    distributed.cleanup()


if __name__ == "__main__":
    launch.start(main, parse_args)
