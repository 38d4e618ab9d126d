"""Pipelined data parallel: each replica of the model is a pipeline of --stages processes, and the
replicas keep each stage's weights in agreement by allreduce, partial reduce, AD-PSGD or a
parameter server, with or without stragglers.

    torchrun --nproc_per_node=4 recipes/pipeline/train.py data/mnist5k -a lenet -b 32 \\
        --stages 2 --microbatches 4 --schedule 1f1b --sync preduce

Ranks: with W processes and S stages there are R = W / S replicas, and rank r is stage r mod S
of replica r div S (--sync hetpipe: the last replica's S ranks are the parameter servers, one
per stage, and R - 1 replicas train). The model is cut at layer boundaries into S stages of
about equal forward FLOPs (the split is printed). Each stage is a torch.distributed.pipelining
PipelineStage, and ScheduleGPipe or Schedule1F1B runs the --microbatches M pieces of each batch
through the replica's pipeline. Each replica trains on its own shard of train/ with -b images
per step, so the global batch is -b x R.

The replicas of a stage synchronise over a process group of their own (a DDP-wrapped stage does
not work under the pipelining schedules):
  allreduce  average the stage's gradients over all replicas before each step (what DDP does).
  preduce    partial reduce (SD-PIPE, Miao et al., PVLDB 16(9), 2023): after its local step a
             replica queues as ready (a counter in the c10d store); the first --preduce-size P
             ready ones, or those that came within --preduce-wait-ms of the first, average their
             weights. Every --sync-bound T steps, and at each epoch's end, all replicas average.
  adpsgd     AD-PSGD (Lian et al., ICML 2018): after each step the replicas average their
             weights in random pairs, drawn from a seed every rank shares.
  hetpipe    HetPipe (Park et al., USENIX ATC 2020): after each step a replica pushes its update
             of each stage to that stage's server and pulls the global weights; a pull waits
             while the replica is more than --staleness D steps ahead of the slowest one
             (wave-synchronous), and at each epoch's end until every replica has pushed it all.
Stragglers: --hetero X makes a process sleep X seconds with probability --hetero-prob at each
step (SD-PIPE's model); --slow-rank R --slow-factor F makes rank R sleep F - 1 times its pipeline
step's time after each step (about F times as slow; not a hetpipe server).
Both are drawn from --seed.
"""

import copy
import random
import time
import types

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DistributedSampler
from torch.utils.flop_counter import FlopCounterMode

from recipes.common import (RecipeError, bookkeeping, cli, data, distributed, faults, launch, metrics, models,
                            pushpull, runlog, schedule)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def parse_args(argv=None):
    parser = cli.build_parser("pipeline", __doc__)
    cli.add_distributed_args(parser)
    group = parser.add_argument_group("pipeline")
    group.add_argument("--stages", type=int, default=2, metavar="S", help="processes per replica (default: 2)")
    group.add_argument("--microbatches", type=int, default=4, metavar="M",
                       help="pieces of each batch in flight in the pipeline; must divide -b (default: 4)")
    group.add_argument("--schedule", choices=list(SCHEDULES), default="1f1b")
    group.add_argument("--sync", choices=["allreduce", "preduce", "adpsgd", "hetpipe"], default="allreduce",
                       help="how the replicas of a stage agree (default: allreduce)")
    group.add_argument("--preduce-size", type=int, default=2, metavar="P",
                       help="preduce: replicas that average together (default: 2)")
    group.add_argument("--preduce-wait-ms", type=float, default=50.0,
                       help="preduce: how long the first ready replica waits for the others (default: 50)")
    group.add_argument("--sync-bound", type=int, default=8, metavar="T",
                       help="preduce: all replicas average every T steps (default: 8)")
    group.add_argument("--staleness", type=int, default=2, metavar="D",
                       help="hetpipe: steps a replica may run ahead of the slowest (default: 2)")
    group.add_argument("--hetero", type=float, default=0.0, metavar="X",
                       help="a process sleeps X seconds with probability --hetero-prob per step (default: 0)")
    group.add_argument("--hetero-prob", type=float, default=0.1)
    group.add_argument("--slow-rank", type=int, metavar="R", help="this rank is --slow-factor times slower")
    group.add_argument("--slow-factor", type=float, default=2.0, metavar="F")
    args = cli.parse_args(parser, argv)
    check_args(args)
    return args


def check_args(args, world_size=None):
    """The flags that cannot work together, as one line each (world size: known once launched)."""
    for flag in ("ema_decay", "compile", "sync_bn", "mixup_alpha", "cutmix_alpha"):  # (mixing: the first and the
        if getattr(args, flag):                                                    # last stage would mix apart)
            raise RecipeError(f"--{flag.replace('_', '-')} is not supported by the pipeline recipe")
    if args.accum_steps != 1:
        raise RecipeError("--accum-steps: the pipeline recipe cuts each batch into --microbatches instead")
    cli.check_ranges(args, {"--stages": (lambda v: v >= 1, "must be at least 1"),
                            "--microbatches": (lambda v: v >= 1, "must be at least 1"),
                            "--preduce-wait-ms": (lambda v: v >= 0, "must be 0 or more"),
                            "--sync-bound": (lambda v: v >= 1, "must be at least 1"),
                            "--staleness": (lambda v: v >= 0, "must be 0 or more"),
                            "--hetero": (lambda v: v >= 0, "must be 0 (off) or a number of seconds"),
                            "--hetero-prob": (lambda v: 0 <= v <= 1, "is a probability in [0, 1]"),
                            "--slow-factor": (lambda v: v >= 1, "must be at least 1")})
    units = len(weighted_units(models.sequential_layers(models.build_model(args.arch, 10), args.arch)))
    if args.stages > units:
        raise RecipeError(f"--stages {args.stages}: --arch {args.arch} has only {units} layers with weights to "
                          f"split into stages")
    if args.schedule == "1f1b" and args.microbatches < args.stages:
        raise RecipeError(f"--schedule 1f1b needs at least as many --microbatches as --stages: "
                          f"{args.microbatches} < {args.stages}")
    if args.batch_size % args.microbatches:
        raise RecipeError(f"--microbatches {args.microbatches} must divide --batch-size {args.batch_size}")
    if world_size is None:
        return
    if world_size % args.stages:
        raise RecipeError(f"the world size {world_size} is not a multiple of --stages {args.stages}")
    replicas = world_size // args.stages - (args.sync == "hetpipe")
    if replicas < 1:
        raise RecipeError(f"--sync hetpipe needs the {args.stages} servers and at least one replica: "
                          f"{2 * args.stages} processes or more, not {world_size}")
    if args.sync == "preduce" and not 2 <= args.preduce_size <= replicas:
        raise RecipeError(f"--preduce-size {args.preduce_size} must be at least 2 and at most the "
                          f"{replicas} replica(s)")
    if args.slow_rank is not None and not 0 <= args.slow_rank < replicas * args.stages:
        raise RecipeError(f"--slow-rank {args.slow_rank} is not a rank of the {replicas} replica(s) x {args.stages} "
                          f"stage(s)")
    if args.sync == "hetpipe" and args.save_every:
        raise RecipeError("--save-every is not supported with --sync hetpipe (its servers save at epoch ends only)")


# ---- the model, cut into stages -------------------------------------------------------------------------

def balanced_split(costs, stages):
    """Cut a sequence of layer costs into `stages` consecutive non-empty parts whose largest total is as
    small as it can be. Returns the parts' first indices (and len(costs) at the end)."""
    n = len(costs)
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    # best[s][i]: (largest part, cuts) for the first i layers in s parts
    best = [[(float("inf"), [])] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, [0])
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                largest = max(best[s - 1][j][0], prefix[i] - prefix[j])
                if largest < best[s][i][0]:
                    best[s][i] = (largest, best[s - 1][j][1] + [i])
    return best[stages][n][1]


def weighted_units(layers):
    """The layers grouped so that each group starts with a layer that has weights (one without them, such as
    a ReLU, goes with the layer before it): a stage starts only at such a group."""
    units = []
    for layer in layers:
        if units and not (any(True for _ in layer.parameters()) and any(True for _ in units[-1].parameters())):
            units[-1].append(layer)
        else:
            units.append(nn.Sequential(layer))
    return units


def unit_flops(units, image_size):
    """Forward FLOPs of each unit for one image (torch.utils.flop_counter), in the order they run."""
    flops, x = [], torch.zeros(1, 3, image_size, image_size)
    with torch.no_grad():
        for unit in units:
            counter = FlopCounterMode(display=False)
            with counter:
                x = unit.eval()(x)
            unit.train()
            flops.append(counter.get_total_flops())
    return flops


def split_model(model, args, log):
    """The model's layers cut into --stages parts of about equal forward FLOPs: [[layer, ...] per stage]."""
    units = weighted_units(models.sequential_layers(model, args.arch))
    flops = unit_flops(units, args.image_size)
    cuts = balanced_split(flops, args.stages)
    parts = [[layer for unit in units[a:b] for layer in unit] for a, b in zip(cuts[:-1], cuts[1:])]
    for s, part in enumerate(parts):
        names = ", ".join(type(layer).__name__ for layer in part)
        params = sum(p.numel() for layer in part for p in layer.parameters())
        log.print(f"stage {s}: {names}; {params:,} parameters, {sum(flops[cuts[s]:cuts[s + 1]]) / 1e6:.2f} MFLOPs "
                  f"per image")
    return parts


def state_names(model, part):
    """The model's state_dict keys of the layers in part (the layers are the model's own modules)."""
    prefixes = {id(module): name for name, module in model.named_modules()}
    return [f"{prefixes[id(layer)]}.{key}" for layer in part if id(layer) in prefixes for key in layer.state_dict()]


# ---- stragglers -----------------------------------------------------------------------------------------

def straggles(args, rank, epoch, step):
    """Whether --hetero makes this rank sleep at this step (the same answer on every rank that asks)."""
    return args.hetero > 0 and random.Random(f"{args.seed}/{rank}/{epoch}/{step}").random() < args.hetero_prob


def pipeline_straggles(args, replica, epoch, step):
    """Whether any process of the replica's pipeline is slow at this step (its stages wait for one another)."""
    ranks = range(replica * args.stages, (replica + 1) * args.stages)
    return args.slow_rank in ranks or any(straggles(args, r, epoch, step) for r in ranks)


def slow_rank_clock(args, rank, device):
    """--slow-rank: the time, once this rank's device has done its work (a GPU runs behind the host's queue, so
    the slow rank waits for it: what it sleeps is then F - 1 times its step's real time). Others: None."""
    if rank != args.slow_rank:
        return None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


# ---- how the replicas of a stage agree --------------------------------------------------------------------

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


def average_weights(params, group, replicas, straggled):
    """A full synchronisation: every replica of the stage gets the mean of their weights."""
    flat = flagged(parameters_to_vector(params).detach(), straggled)
    with faults.waiting_for("the stage's other replicas (a full synchronisation)"):
        dist.all_reduce(flat, group=group)
    vector_to_parameters(flat[:-1] / replicas, params)
    return flat[-1] > float(straggled)


def partial_reduce(params, store, stage, args, straggled):
    """preduce: queue as ready, then average weights with the group this replica falls into.

    Arrivals are numbered by a counter in the store. Arrival n learns its part from the key member/n: the
    first arrival of a group leads it (member/1 is set at the start), waits until P - 1 more have arrived or
    --preduce-wait-ms has passed, then closes the group (arrivals n .. n+k-1) by telling each member who
    leads, and makes arrival n+k the next leader. The members send their weights to the leader, which sends
    back the mean. Returns (whether a straggler that arrived later held this replica up, as a tensor on the
    device; the group's size for its leader and 0 for the others, so that each group is counted once)."""
    with faults.waiting_for("the partial reduce's group"):  # (every wait on a peer is marked: faults)
        replica = dist.get_rank() // args.stages
        n = store.add("arrivals", 1)
        store.set(f"who/{n}", str(replica))
        role = store.get(f"member/{n}").decode()
        flat = flagged(parameters_to_vector(params).detach(), straggled)
        if role != "lead":  # a member: to the leader and back
            leader = int(store.get(f"who/{role}")) * args.stages + stage
            dist.send(flat, leader)
            dist.recv(flat, leader)
            vector_to_parameters(flat[:-1], params)
            return flat[-1] > 0, 0
        deadline = time.perf_counter() + args.preduce_wait_ms / 1000
        while not store.check([f"who/{n + args.preduce_size - 1}"]) and time.perf_counter() < deadline:
            time.sleep(0.001)
        size = min(args.preduce_size, store.add("arrivals", 0) - n + 1)
        for k in range(n + 1, n + size):
            store.set(f"member/{k}", str(n))
        store.set(f"member/{n + size}", "lead")
        members = [int(store.get(f"who/{k}")) * args.stages + stage for k in range(n + 1, n + size)]
        received = [flat]
        for member in members:  # in order of arrival
            received.append(torch.empty_like(flat))
            dist.recv(received[-1], member)
        mean = sum(received)[:-1] / size
        flags = torch.stack([r[-1] for r in received] + [flat.new_zeros(())])  # (the last: none arrived later)
        for i, member in enumerate(members, start=1):  # held up: a later arrival in the group straggled
            dist.send(flagged(mean, flags[i + 1:].amax() > 0), member)
        vector_to_parameters(mean, params)
        return flags[1:].amax() > 0, size


def pairwise_average(params, replicas, args, epoch, step, straggled):
    """adpsgd: the replicas average in random pairs (an odd one out keeps its weights). Returns whether the
    partner's straggling held this replica up, and whether it had a partner."""
    draw = (args.seed or 0) * 1_000_003 + epoch * 10_007 + step  # the same on every rank, with or without --seed
    order = torch.randperm(replicas, generator=torch.Generator().manual_seed(draw))
    replica = dist.get_rank() // args.stages
    position = order.tolist().index(replica)
    if position == replicas - 1 and replicas % 2:
        return False, False
    partner = int(order[position ^ 1]) * args.stages + dist.get_rank() % args.stages
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


# ---- hetpipe's parameter servers ----------------------------------------------------------------------

def server(args, run, weights, clients, steps_per_epoch, val_loader, tally):
    """A stage's parameter server: add each pushed update to the stage's global weights; answer a pull once
    the puller is at most --staleness steps ahead of the slowest replica, and at an epoch's end once every
    replica has pushed the whole epoch. Evaluates and saves with the others at each epoch's end."""
    start = run.checkpoint.epoch * steps_per_epoch + run.checkpoint.step
    clock = dict.fromkeys(clients, start)  # the steps each replica has pushed
    seen = dict(clock)  # the slowest replica's clock when each replica last pulled
    version = 0
    for epoch in run.epochs():
        end = (epoch + 1) * steps_per_epoch
        pending, held, done = {}, set(), set()  # pulls not yet answered; those counted as waits; at the end
        while len(done) < len(clients):
            message, sender = pushpull.recv_header_from_any()
            if message[pushpull.KIND] == pushpull.PUSH:
                weights += pushpull.recv_payload(sender, weights.numel(), weights.dtype)
                version += 1
                tally["oldest"] = max(tally["oldest"], clock[sender] - seen[sender])  # its staleness
                clock[sender] += 1
            else:
                pending[sender] = message
            slowest = min(clock.values())
            for client, request in list(pending.items()):
                if clock[client] - slowest <= (0 if clock[client] == end else args.staleness):
                    pushpull.answer_pull(request, client, weights, version, 0.0)
                    seen[client] = slowest
                    del pending[client]
                    held.discard(client)
                    if clock[client] == end:
                        done.add(client)
                elif client not in held:
                    held.add(client)
                    tally["waits"] += 1
        run.meter = metrics.EpochMeter(run.device)  # (a server trains on nothing itself)
        if run.end_epoch(run.meter.summary(), val_loader):  # (with the replicas: a SIGTERM is acted on here)
            break


def disagreement(params, pipe):
    """The replicas' mean distance (L2, over the whole model) from their average weights."""
    mine = parameters_to_vector(params).detach()
    mean = mine.clone()
    with faults.waiting_for("the other replicas at the epoch's end"):
        dist.all_reduce(mean, group=pipe.stage_group)
        squared = (mine - mean / pipe.replicas).square().sum().reshape(1)
        dist.all_reduce(squared, group=pipe.pipe_group)  # this replica's stages together
        distance = squared.sqrt()
        dist.all_reduce(distance, group=pipe.stage_group)
    return distance.item() / pipe.replicas


# ---- the replicas: run the pipeline, step, agree ---------------------------------------------------------

def connected(tally):
    """Count a synchronisation of all replicas, and how many steps the replicas went without one."""
    tally["full_syncs"] += 1
    tally["longest_gap"], tally["gap"] = max(tally["longest_gap"], tally["gap"]), 0


def all_average(args, step):
    """preduce: whether this step is one of --sync-bound's, where all replicas average (and all ranks meet)."""
    return args.sync == "preduce" and (step + 1) % args.sync_bound == 0


def pull_global_weights(pipe):
    """hetpipe: the stage's global weights from its server (on the CPU) into this replica's copy of them, and
    into the stage's weights (on the device)."""
    pushpull.pull(pipe.vector, [[(0, pipe.vector.numel())]], pipe.versions, ranks=[pipe.server])
    pushpull.copy_into(pipe.params, pipe.vector)


def agree(args, pipe, tally, epoch, step, straggled):
    """After the local step: the stage's weights and the other replicas' (allreduce agreed on gradients)."""
    params = pipe.params
    if all_average(args, step):
        tally["waits"] += average_weights(params, pipe.stage_group, pipe.replicas, straggled)
        connected(tally)
    elif args.sync == "preduce":
        waited, size = partial_reduce(params, pipe.store, pipe.stage, args, straggled)
        tally["waits"] += waited
        tally["partial_syncs"] += size > 1  # (counted by the group's leader)
    elif args.sync == "adpsgd":
        waited, paired = pairwise_average(params, pipe.replicas, args, epoch, step, straggled)
        tally["waits"] += waited
        tally["partial_syncs"] += paired / 2  # (each pair counted by both)
    elif args.sync == "hetpipe":  # this step's update, which the server adds to the global weights
        pushpull.send(pushpull.header(pushpull.PUSH, pipe.versions[0]), pipe.server,
                      parameters_to_vector(params).detach().cpu() - pipe.vector)
        tally["partial_syncs"] += 1


def train_one_epoch(args, pipe, optimizer, loader, run, tally):
    """One epoch of this replica's pipeline; after each step its stage agrees with the other replicas'."""
    rank, params = dist.get_rank(), pipe.params
    for images, target in run.batches(loader):  # (every stage loads the batch: the first stage needs the
        epoch, step = run.epoch, run.step       # images, the last one the targets)
        straggled = pipeline_straggles(args, pipe.replica, epoch, step)
        if straggles(args, rank, epoch, step):
            time.sleep(args.hetero)
        if args.sync == "hetpipe":  # the global weights, once this replica is not too far ahead
            pull_global_weights(pipe)
        started = slow_rank_clock(args, rank, run.device)
        optimizer.zero_grad(set_to_none=False)
        images, target = run.to_device(images, target)
        losses = []
        if pipe.is_last:  # (with --stages 1 also the first)
            output = pipe.schedule.step(*[images][:pipe.is_first], target=target, losses=losses)
        elif pipe.is_first:
            pipe.schedule.step(images)
        else:
            pipe.schedule.step()
        if rank == args.slow_rank:  # --slow-factor F: this process takes about F times as long
            time.sleep((args.slow_factor - 1) * (slow_rank_clock(args, rank, run.device) - started))
        loss = torch.stack(losses).mean().detach() if pipe.is_last else torch.zeros((), device=run.device)
        if pipe.is_last:
            run.meter.update(loss, output, target)
        dist.broadcast(loss, pipe.last_rank, group=pipe.pipe_group)  # for the progress line and the checks
        if args.sync == "allreduce":
            tally["waits"] += average_gradients(params, pipe.stage_group, pipe.replicas, straggled)
            connected(tally)
        optimizer.step()
        tally["gap"] += 1
        agree(args, pipe, tally, epoch, step, straggled)
        # the stop checks (SIGTERM, a non-finite loss) are a collective of all ranks: at every step where the
        # replicas move in lockstep; preduce: at the steps where all of them average; hetpipe: at epoch ends
        run.step_done(loss, check_stop=args.sync in ("allreduce", "adpsgd") or all_average(args, step))

    tally["disagreement"] = disagreement(params, pipe)  # before preduce's and hetpipe's epoch end brings them
    # together (adpsgd's replicas stay apart: evaluation and checkpoints take replica 0's weights)
    if args.sync == "preduce" and tally["gap"]:  # every epoch ends with all replicas connected
        tally["waits"] += average_weights(params, pipe.stage_group, pipe.replicas, False)
        connected(tally)
    elif args.sync == "hetpipe":  # the pull waits until every replica has pushed the whole epoch
        pull_global_weights(pipe)
        connected(tally)
    return run.meter.summary()


def counts_of_every_rank(tally, stages):
    """The summary's sync counts, added up (or the most) over every rank: CPU numbers, over the control group."""
    sums = torch.tensor([float(tally["waits"]), float(tally["partial_syncs"])], dtype=torch.float64)
    most = torch.tensor([max(tally["longest_gap"], tally["gap"]), tally["oldest"]], dtype=torch.float64)
    dist.all_reduce(sums, group=distributed.control_group())
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=distributed.control_group())
    return dict(full_syncs=tally["full_syncs"], partial_syncs=sums[1].item() / stages, waits=sums[0].item() / stages,
                longest_without_full_sync=int(most[0]), max_applied_staleness=int(most[1]),
                disagreement=tally["disagreement"])


# ---- the whole model, put together ------------------------------------------------------------------------

def gather(model, optimizer, whole, view, stage_keys):
    """Before each evaluation and save, on every rank: the whole model and its momentum, stage s from rank s
    (replica 0's stage s), into `whole` and the checkpoint's optimizer `view`."""
    whole_params = dict(whole.named_parameters())
    for s, keys in enumerate(stage_keys):
        payload = [None]
        if dist.get_rank() == s:
            state, named = model.state_dict(), dict(model.named_parameters())
            momentum = {key: optimizer.state[named[key]]["momentum_buffer"].cpu() for key in keys
                        if key in named and "momentum_buffer" in optimizer.state.get(named[key], {})}
            payload = [({key: state[key].cpu() for key in keys}, momentum)]
        dist.broadcast_object_list(payload, src=s, group=distributed.control_group())
        weights, momentum = payload[0]
        whole.load_state_dict(weights, strict=False)
        for key, buffer in momentum.items():
            view.state[whole_params[key]]["momentum_buffer"] = buffer.to(whole_params[key].device)
    view.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"]


def main(args):
    ctx = distributed.init_distributed_mode(args)
    check_args(args, ctx.world_size)
    device = ctx.device
    log = runlog.RunLog(args, enabled=ctx.is_main)
    stages = args.stages
    stage, replica = ctx.rank % stages, ctx.rank // stages  # rank r: stage r mod S of replica r div S
    replicas = ctx.world_size // stages - (args.sync == "hetpipe")  # those that train
    pipe_groups = [distributed.new_group(range(r * stages, (r + 1) * stages)) for r in range(ctx.world_size // stages)]
    stage_groups = [distributed.new_group([s + stages * r for r in range(replicas)]) for s in range(stages)]

    train_set, val_set, num_classes = data.build_datasets(args)
    train_sampler = DistributedSampler(train_set, num_replicas=replicas, rank=min(replica, replicas - 1),
                                       seed=args.seed or 0)  # replica r: the shard of ddp's rank r
    train_loader = data.train_loader(train_set, args, train_sampler)
    val_loader = data.val_loader(val_set, args, ctx.rank, ctx.world_size)  # every rank evaluates a shard

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes)
    parts = split_model(model, args, log)
    model.to(device)
    for tensor in model.state_dict().values():  # every replica starts from rank 0's weights, as with DDP
        dist.broadcast(tensor, 0)
    whole = copy.deepcopy(model)  # the model put together, for evaluation and checkpoints
    params = [p for layer in parts[stage] for p in layer.parameters()]  # this stage's weights
    global_batch = args.batch_size * replicas
    lr = args.lr * (args.batch_size if args.sync == "hetpipe" else global_batch) / 256  # hetpipe: each push
    optimizer = torch.optim.SGD(params, lr, momentum=args.momentum, weight_decay=args.weight_decay)
    view = torch.optim.SGD(whole.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay)
    view.param_groups[0]["initial_lr"] = lr  # the checkpoint's optimizer, as the other recipes save it
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=len(train_loader))
    stage_keys = [state_names(model, part) for part in parts]
    run = bookkeeping.Run(args, log, device, whole, view, scheduler, None, num_classes, global_batch,
                          steps_per_epoch=len(train_loader),
                          gather=lambda: gather(model, optimizer, whole, view, stage_keys))
    run.resume()  # --resume, or <out>/checkpoint.pt with --auto-resume: then this stage's share of it
    model.load_state_dict(whole.state_dict())
    for p, q in zip(model.parameters(), whole.parameters()):
        if "momentum_buffer" in view.state.get(q, {}) and any(p is mine for mine in params):
            optimizer.state[p]["momentum_buffer"] = view.state[q]["momentum_buffer"].clone()

    log.print(f"pipeline: {replicas} replica(s) x {stages} stage(s) on {device} ({ctx.backend}), "
              f"{args.schedule} with {args.microbatches} microbatches, --sync {args.sync}"
              f"{f' ({stages} servers)' if args.sync == 'hetpipe' else ''}; {run.describe(train_set, val_set)}")
    tally = dict.fromkeys(["waits", "full_syncs", "partial_syncs", "gap", "longest_gap", "disagreement", "oldest"], 0)
    if replica == replicas:  # hetpipe's servers: the last S ranks, their stage's weights on the CPU (as BytePS's)
        weights = parameters_to_vector(params).detach().cpu()
        clients = [stage + stages * r for r in range(replicas)]
        server(args, run, weights, clients, len(train_loader), val_loader, tally)
    else:
        criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)  # (validation: plain)
        pipeline_stage = PipelineStage(nn.Sequential(*parts[stage]), stage, stages, device,
                                       group=pipe_groups[replica])
        store = dist.PrefixStore(f"preduce/{stage}/", dist.distributed_c10d._get_default_store())  # control
        if replica == 0 and args.sync == "preduce":
            store.set("member/1", "lead")  # the first replica ready leads the first group
        pipe = types.SimpleNamespace(
            schedule=SCHEDULES[args.schedule](pipeline_stage, args.microbatches, loss_fn=criterion),
            params=params, stage=stage, replica=replica, replicas=replicas, store=store,
            is_first=stage == 0, is_last=stage == stages - 1, last_rank=replica * stages + stages - 1,
            pipe_group=pipe_groups[replica], stage_group=stage_groups[stage],
            server=replicas * stages + stage, vector=parameters_to_vector(params).detach().cpu(),
            versions=[-1])  # hetpipe: the server of this stage, the weights last pulled, their version
        for epoch in run.epochs():  # from where a checkpoint stopped, to --epochs (none with --evaluate)
            train_sampler.set_epoch(epoch)
            train_stats = train_one_epoch(args, pipe, optimizer, train_loader, run, tally)
            if run.end_epoch(train_stats, val_loader):  # evaluate, log, save; True at --desired-acc
                break

    run.finish(val_loader, stages=stages, replicas=replicas, microbatches=args.microbatches, schedule=args.schedule,
               sync=args.sync, hetero=args.hetero, hetero_prob=args.hetero_prob, slow_rank=args.slow_rank,
               slow_factor=args.slow_factor, global_batch=global_batch, **counts_of_every_rank(tally, stages))
    distributed.cleanup()


if __name__ == "__main__":
    launch.start(main, parse_args)
