"""Pipelined data parallel: each replica of the model is a pipeline of --stages processes, and the
replicas keep each stage's weights in agreement by allreduce, partial reduce, AD-PSGD or a
parameter server, with or without stragglers.

    torchrun --nproc_per_node=4 recipes/pipeline/train.py data/mnist5k -a lenet --image-size 28 \\
        -b 32 --epochs 3 --stages 2 --microbatches 4 --schedule 1f1b --sync preduce

Ranks: with W processes and S stages there are R = W / S replicas; rank r is stage r mod S of
replica r div S (hetpipe: the last S ranks are the stages' servers, R - 1 replicas train). The
model is cut into S stages of about equal forward FLOPs (printed). Each is a PipelineStage, and
ScheduleGPipe or Schedule1F1B runs the --microbatches M pieces of each batch through the
replica's pipeline: a flush and one update per batch. --schedule pipedream runs asynchronous
PipeDream as SD-PIPE does (pipedream.py): S - s minibatches in flight at stage s, an update per
minibatch, each backward on its forward's weights (stashed). Replica r trains on ddp's rank r's shard
(--replica-data stream: SD-PIPE's stream of the whole set) and augmentations, -b images per step: a global
batch of -b x R, and --lr scales to it as in every recipe (SD-PIPE keeps its lr whatever R; deviations.py
lists each departure from the authors' code).

The replicas of a stage agree over a process group of their own (a DDP-wrapped stage does not
work under the pipelining schedules), after SD-PIPE (Miao et al., PVLDB 16(9), 2023):
  allreduce  average the stage's gradients over all replicas before each update (as DDP).
  preduce    SD-PIPE's partial reduce: after its step a replica queues as ready, and the replicas
             that come before an adaptive deadline (at most 10 ms) average their weights; at each
             multiple of 10 R updates the groups must connect every replica; an epoch is R x (one shard's
             steps) updates of all replicas together, so a fast replica does more of it.
  adpsgd     AD-PSGD (Lian et al., ICML 2018) as SD-PIPE runs it: synchronous random matching,
             the replicas average in random pairs after each step.
  hetpipe    HetPipe (Park et al., USENIX ATC 2020) as SD-PIPE's baseline: each stage's server
             holds its global weights on the CPU; a replica steps locally, pushes each update / R,
             and every --wave W minibatches pulls (unbounded; --staleness D: HetPipe's bound).
Stragglers (SD-PIPE's model): --hetero X makes a process sleep X seconds with probability
--hetero-prob before the forward and the backward of each minibatch, drawn from --seed;
--slow-rank R --slow-factor F makes rank R about F times slower (not a hetpipe server).
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: `recipes` imports uninstalled

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.nn.utils import parameters_to_vector

from recipes.common import bookkeeping, cli, data, distributed, launch, models, runlog, schedule
from recipes.pipeline import hetpipe, pipedream, replica_data, snapshots, stages, stragglers, sync
from recipes.pipeline.layout import SYNCS, Layout, Replicas, Stage, add_args, check_args, check_world

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def parse_args(argv=None):
    parser = cli.build_parser("pipeline", __doc__)
    cli.add_distributed_args(parser)
    add_args(parser)
    args = cli.parse_args(parser, argv)
    check_args(args)
    return args


def build_optimizer(params, lr, args):
    """--optimizer: SGD with momentum, as every recipe; or AdamW as SD-PIPE trains BERT (train_bert 72)."""
    if args.optimizer == "adamw":
        return torch.optim.AdamW(params, lr, betas=(0.9, 0.999), eps=1e-7, weight_decay=args.weight_decay)
    return torch.optim.SGD(params, lr, momentum=args.momentum, weight_decay=args.weight_decay)


def update(stage, replicas, optimizer, tally, epoch, step, straggled):
    """The stage's update and the replicas' agreement, the same under every schedule and --sync method (sync.py):
    allreduce averages the gradients before the step (as DDP); the others agree on the weights after it. Counts
    whether a straggling replica held this one up where it waited (a tensor on the device, read once at the end)."""
    stage.snapshots.before_update()  # --snapshot-every: the weights until now, if a multiple of T passed
    waited = replicas.sync.before_step(stage.params, straggled, tally)
    optimizer.step()
    tally.updates += 1  # (a new version of the weights: PipeDream's next forward copies them)
    tally.gap += 1
    waited |= replicas.sync.after_step(stage.params, epoch, step, straggled, tally)
    tally.waits += waited


def train_one_epoch(stage, replicas, optimizer, loader, run, tally):
    """One epoch of this replica's pipeline (gpipe, 1f1b): a flush and one update per batch."""
    rank, delays = dist.get_rank(), stage.delays  # (--hetero, --slow-rank)
    for images, target in run.batches(replicas.sync.shard(loader, run)):  # (every stage loads the batch: the first
        epoch, step = run.epoch, run.step                                   # needs the images, the last the targets)
        if not replicas.sync.claim(epoch, run.steps_per_epoch):
            break  # (preduce) the epoch's updates are all taken
        straggled = stragglers.replica_straggles(delays, replicas.layout, replicas.replica, epoch, step)
        stragglers.plan(stage.slots, delays, rank, epoch, step)  # --hetero: where this process sleeps
        started = stragglers.slow_rank_clock(delays, rank, run.device)
        optimizer.zero_grad(set_to_none=False)
        images, target = run.to_device(images, target)
        inputs = (images,) if stage.is_first else ()  # (the first stage's input is the images)
        losses = []
        if stage.is_last:
            output = stage.schedule.step(*inputs, target=target, losses=losses)
        else:
            stage.schedule.step(*inputs)
        stragglers.slow_down(delays, rank, run.device, started)  # --slow-rank: F - 1 times the step's time
        loss = torch.stack(losses).mean().detach() if stage.is_last else torch.zeros((), device=run.device)
        if stage.is_last:
            run.meter.update(loss, output, target)
        dist.broadcast(loss, stage.last_rank, group=stage.pipe_group)  # for the progress line and the checks
        update(stage, replicas, optimizer, tally, epoch, step, straggled)
        # the stop checks (SIGTERM, a non-finite loss) are a collective of all ranks: allreduce and adpsgd every
        # 10th step (sync.STOP_CHECKS_EVERY); preduce and hetpipe at the epoch's end, where they meet
        run.step_done(loss, replicas.sync.stop_checks_every)
    return end_of_epoch(stage, replicas, run, tally)


def end_of_epoch(stage, replicas, run, tally):
    """Where the replicas meet: how far apart they drifted, and (preduce) the average of all replicas (adpsgd's
    stay apart: each replica scores its own weights on its share of val/, and checkpoints hold replica 0's)."""
    stage.snapshots.close()  # (--snapshot-every: the weights since the last update, before preduce's average)
    tally.disagreement = sync.disagreement(stage.params, replicas, stage.pipe_group)
    replicas.sync.end_epoch(stage.params, run, tally)
    return run.meter.summary()


def train_one_epoch_pipedream(stage, replicas, dream, optimizer, loader, run, tally):
    """Asynchronous PipeDream (SD-PIPE's): S - s minibatches in flight at stage s, each backward on the weights
    its forward used (stashed), an update per minibatch at each stage, the pipeline filled once and drained at
    the epoch's end; the replicas agree inside each backward, before its gradient goes on to the stage before."""
    rank, delays, link, counted = dist.get_rank(), stage.delays, dream.link, replicas.sync.counts_updates
    dream.end.step = sys.maxsize if counted and run.first_step < run.steps_per_epoch else run.steps_per_epoch
    batches = run.batches(replicas.sync.shard(loader, run))
    order = pipedream.operations(stage.index, stage.layout.stages, dream.end, run.first_step)  # (reads the end as
    x, target, operation = pipedream.next_input(stage, dream, replicas.sync, order, batches, run)  # preduce moves it)
    while operation is not None:
        kind, i = operation
        started = stragglers.before_slot(delays, rank, run.epoch, i, kind, run.device)  # --hetero, --slow-rank
        if kind == "forward":
            output, weights = pipedream.forward(stage, dream, x)
            if stage.is_last:
                loss = dream.criterion(output, target)
                run.meter.update(loss, output.detach(), target)
                output = loss  # (its backward starts from the loss)
            else:
                link.send_forward(output.detach().contiguous())  # (NCCL sends the memory as it lies)
            dream.in_flight[i] = (x, output, weights)
        else:
            x, output, weights = dream.in_flight.pop(i)
            gradient, loss = (None, output.detach()) if stage.is_last else link.receive_gradient(output.shape)
            inputs = [] if stage.is_first else [x]
            grads = torch.autograd.grad(output, [*inputs, *weights.values()], gradient)
            if not stage.is_first:
                link.send_backward(grads[0].contiguous(), loss)  # (sent after the update and the agreement)
            for p, grad in zip(stage.params, grads[len(inputs):]):
                p.grad = grad  # the gradient at the stashed weights updates the newest ones
            straggled = stragglers.replica_straggles(delays, replicas.layout, replicas.replica, run.epoch, i)
            update(stage, replicas, optimizer, tally, run.epoch, i, straggled)
        stragglers.slow_down(delays, rank, run.device, started)
        x, target, following = pipedream.next_input(stage, dream, replicas.sync, order, batches, run)
        if kind == "backward":
            run.step = i  # (the batches are loaded S - s ahead of the updates)
            run.step_done(loss, replicas.sync.stop_checks_every)  # (as in train_one_epoch)
        operation = following
    batches.close()  # (the epoch's progress bar ends)
    return end_of_epoch(stage, replicas, run, tally)


def main(args):
    ctx = distributed.init_distributed_mode(args)
    check_world(args, ctx.world_size)
    device = ctx.device
    log = runlog.RunLog(args, enabled=ctx.is_main)
    method = SYNCS[args.sync]  # how the replicas of a stage agree: a --sync method (sync.py)
    layout = Layout(args.stages, ctx.world_size, method.has_servers)
    stage, replica, replicas = layout.stage(ctx.rank), layout.replica(ctx.rank), layout.replicas
    pipe_groups = [distributed.new_group(layout.pipeline_ranks(r)) for r in range(ctx.world_size // args.stages)]
    stage_groups = [distributed.new_group(layout.stage_ranks(s)) for s in range(args.stages)]
    # whose stages a rank puts together to evaluate (and rank 0 to save): its replica's, over a gloo group of that
    # replica's ranks; hetpipe: replica 0's, over every rank's (after the last pull of an epoch: the servers')
    pipe_controls = [] if layout.has_servers else [distributed.new_control_group(layout.pipeline_ranks(r))
                                                   for r in range(replicas)]
    scored, scoring = ((layout.pipeline_ranks(0), distributed.control_group()) if layout.has_servers else
                       (layout.pipeline_ranks(replica), pipe_controls[replica]))

    train_set, val_set, num_classes = data.build_datasets(args)
    shard = min(replica, replicas - 1)  # replica r: the shard of ddp's rank r (hetpipe's servers: any)
    train_sampler = replica_data.train_sampler(train_set, args, replicas, shard)
    train_loader = data.train_loader(train_set, args, train_sampler)
    val_loader = data.val_loader(val_set, args, ctx.rank, ctx.world_size)  # every rank evaluates a shard

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes, args.image_size, args.weights)
    parts, shapes, costs = stages.split_model(model, args, log, data.example_input(val_set, args.image_size))
    model.to(device)
    for tensor in model.state_dict().values():  # every replica starts from rank 0's weights, as with DDP
        dist.broadcast(tensor, 0)
    whole = copy.deepcopy(model)  # the model put together, for evaluation and checkpoints
    params = [p for layer in parts[stage] for p in layer.parameters()]  # this stage's weights
    global_batch = args.batch_size * replicas
    lr = args.lr * global_batch / 256
    optimizer, view = build_optimizer(params, lr, args), build_optimizer(whole.parameters(), lr, args)
    view.param_groups[0]["initial_lr"] = lr  # the checkpoint's optimizer, as the other recipes save it
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=len(train_loader))
    stage_keys = [stages.state_names(model, part) for part in parts]
    run = bookkeeping.Run(args, log, device, whole, view, scheduler, None, num_classes, global_batch,
                          steps_per_epoch=len(train_loader), seed_rank=shard,
                          gather=lambda: stages.gather(model, optimizer, whole, view, stage_keys, scored, scoring))
    run.resume()  # --resume, or <out>/checkpoint.pt with --auto-resume: then this stage's share of it
    stages.resume_stage(model, whole, view, optimizer, params)

    log.print(f"pipeline: {replicas} replica(s) x {args.stages} stage(s) on {device} ({ctx.backend}), "
              f"{args.schedule} with {args.microbatches} microbatches, --sync {args.sync}"
              f"{f' ({args.stages} servers)' if layout.has_servers else ''}; {run.describe(train_set, val_set)}")
    tally = sync.Tally()
    if layout.is_server(ctx.rank):  # hetpipe's servers: their stage's weights on the CPU (as BytePS's)
        weights = parameters_to_vector(params).detach().cpu()
        hetpipe.run_server(args, run, weights, layout.stage_ranks(stage), len(train_loader), val_loader, tally)
    else:
        criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)  # (validation: plain)
        module = nn.Sequential(*parts[stage], stages.Contiguous())  # (what it sends: dense)
        synchronous = args.schedule in SCHEDULES  # (pipedream: train_one_epoch_pipedream, without one)
        flushing = SCHEDULES[args.schedule](PipelineStage(module, stage, args.stages, device, group=pipe_groups[
            replica]), args.microbatches, loss_fn=criterion) if synchronous else None
        delays = stragglers.Delays(args.hetero, args.hetero_prob, args.seed, args.slow_rank, args.slow_factor)
        this_stage = Stage(layout, ctx.rank, module, params, pipe_groups[replica], flushing, delays,
                           slots=stragglers.inject(module, delays),
                           snapshots=snapshots.Snapshots(args.snapshot_every, [*params, *module.buffers()], device))
        its_replicas = Replicas(layout, stage, replica, replicas, stage_groups[stage], len(train_loader),
                                pipe_control=scoring)
        its_replicas.sync = method.join(args, its_replicas, params)  # this rank's side of the --sync method
        dream = None if synchronous else pipedream.state(this_stage, its_replicas, device, shapes[stage], criterion,
                                                         tally, args.batch_size)
        for epoch in run.epochs():  # from where a checkpoint stopped, to --epochs (none with --evaluate)
            train_sampler.set_epoch(epoch)
            this_stage.snapshots.begin()  # (--snapshot-every: the epoch's clock)
            if synchronous:
                train_stats = train_one_epoch(this_stage, its_replicas, optimizer, train_loader, run, tally)
            else:
                train_stats = train_one_epoch_pipedream(this_stage, its_replicas, dream, optimizer, train_loader, run,
                                                        tally)
            snapshots.score(this_stage.snapshots, run, val_loader)  # --snapshot-every: the epoch's copies
            if run.end_epoch(train_stats, val_loader):  # evaluate, log, save; True at --desired-acc
                break
        its_replicas.sync.end_training(tally)

    run.finish(val_loader, stages=args.stages, replicas=replicas, microbatches=args.microbatches,
               schedule=args.schedule, sync=args.sync, stop_checks_every=method.stop_checks_every,
               hetero=args.hetero, hetero_prob=args.hetero_prob,
               slow_rank=args.slow_rank, slow_factor=args.slow_factor, **costs,
               **sync.counts_of_every_rank(tally, layout, ctx.rank))
    distributed.cleanup()


if __name__ == "__main__":
    launch.start(main, parse_args)
