"""Parameter server with Zeno validators: servers hold the model, workers push gradients and pull
weights, and validators between them drop the updates that would hurt (Byzantine workers).

    torchrun --nproc_per_node=11 recipes/ps/train.py data/mnist5k -a lenet -b 8 --servers 1 \\
        --validators 2 --aggregate zenops --byzantine 2 --attack signflip

Roles by rank: 0..S-1 are servers (--servers S), the next V are validators (--validators V),
the rest are workers; one command on each node, as for ddp. The flat vector of the model's
parameters is cut into chunks of about --partition-bytes, dealt to the servers balanced by
bytes; each server applies SGD (momentum, weight decay, the schedule flags) to its chunks and
bumps a version per update. Workers pull the chunks that changed, compute a gradient on their
shard of train/ and push it. Messages are point-to-point send/recv (recipes/common/pushpull.py).

--mode sync: each step waits for every worker's push and applies the aggregate of them (--lr is
scaled to the batch of all workers). --mode async: each push is applied as it arrives (--lr is
scaled to one worker's batch), to the version it was computed on or a later one; with
--max-staleness D a gradient more than D versions old is dropped and counted.

A lost process: under torchrun, any death ends the job (torchrun SIGTERMs the others: the
servers save after their step when the workers still push and tell them to stop, and a rank
left waiting on a dead peer gives up within about a second, exit 75); --max-restarts N with
--auto-resume starts it again.
Launched with --dist-url, one command per process, async goes on when a worker dies (the others
train its share); sync ends with the lost-peer line, as does every rank when a server dies.

Validators hold out --validation-split of train/ (never val/), compute their own gradient v on
it, score each candidate gradient g of the workers assigned to them (worker i to validator
i mod V) and forward what passes. mean(.) is over the coordinates:
  zenops  (ZenoPS, Xie et al., Algorithms 15(7), 2022; what this recipe follows). sync: accept g
          when mean(g v) > eta mean(v^2) and mean(g^2) < (1 + rho) mean(v^2); the servers apply
          the mean of what was accepted. async: clip g to ||v||, s = cos(g, v); s >= eta applies
          alpha g, otherwise alpha s g (counted as rejected). --zeno-eta, --rho, --zeno-alpha.
  zeno    (Zeno, Xie et al., ICML 2019; sync). score(g) = f(x) - f(x - lr g) - rho ||g||^2 on the
          validator's batch; the mean of the n - b highest-scoring candidates (--zeno-b b).
  zeno++  (Zeno++, Xie et al., ICML 2020; async). v is refreshed every --zeno-delay k versions;
          g is rescaled to ||v|| and accepted when lr <v, g> - rho ||g||^2 + lr eps >= 0 (--eps).
Without validators the servers aggregate (sync): mean, median, trimmed-mean, krum and
centered-clipping from byzfl, and phocas (ZenoPS's trimmed-mean variant, recipes/ps/zeno.py);
krum and centered-clipping see each server's chunks on their own (exact with one server).

--byzantine K --attack signflip|gaussian|labelflip|alie|ipm --attack-scale s: workers 0..K-1
push -s g, N(0, s^2) noise, the gradient of flipped labels (class c -> C-1-c), or byzfl's ALIE
(mean + s std) and IPM (-s mean), estimated from four quarters of their own batch.
"""

import itertools

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DistributedSampler

from recipes.common import (RecipeError, bookkeeping, cli, data, distributed, faults, launch, metrics, models, pushpull,
                            runlog, schedule)
from recipes.ps import zeno

ROBUST = ["mean", "median", "trimmed-mean", "krum", "centered-clipping", "phocas"]  # on the servers
VALIDATED = ["zenops", "zeno", "zeno++"]  # by validators
ATTACKS = ["none", "signflip", "gaussian", "labelflip", "alie", "ipm"]
# rho: ZenoPS's code uses 0.6 (a bound on the norm); for zeno and zeno++ rho is a small penalty on ||g||^2, which
# against lr <v, g> must stay well below the learning rate (zeno++ accepts when cos(v, g) >= rho / lr - eps / ||v||^2)
RHO = {"zenops": 0.6, "zeno": 5e-4, "zeno++": 5e-5}


def parse_args(argv=None):
    parser = cli.build_parser("ps", __doc__)
    cli.add_distributed_args(parser)
    group = parser.add_argument_group("parameter server")
    group.add_argument("--servers", type=int, default=1, help="ranks 0..S-1 hold the model (default: 1)")
    group.add_argument("--validators", type=int, default=0, help="the next V ranks validate pushes (default: 0)")
    group.add_argument("--mode", choices=["sync", "async"], default="sync")
    group.add_argument("--max-staleness", type=int, metavar="D",
                       help="async: drop gradients computed more than D versions ago (default: apply all)")
    group.add_argument("--partition-bytes", type=int, default=4_096_000,
                       help="chunk size of the parameters on the servers (default: 4096000, BytePS's)")
    group.add_argument("--validation-split", type=float, default=0.1,
                       help="share of train/ held out for the validators (default: 0.1)")
    group.add_argument("--aggregate", choices=ROBUST + VALIDATED, default="mean")
    group.add_argument("--zeno-eta", type=float, default=-0.001, help="zenops threshold (default: -0.001)")
    group.add_argument("--rho", type=float, help=f"Zeno rules' rho (default: {RHO})")
    group.add_argument("--zeno-alpha", type=float, default=0.8, help="zenops async step scale (default: 0.8)")
    group.add_argument("--zeno-b", type=int, help="zeno (and trimming rules): candidates dropped (default: K)")
    group.add_argument("--zeno-delay", type=int, default=1, help="zeno++: versions between refreshes of v")
    group.add_argument("--eps", type=float, default=0.1, help="zeno++ slack (default: 0.1)")
    group.add_argument("--byzantine", type=int, default=0, metavar="K", help="workers 0..K-1 misbehave")
    group.add_argument("--attack", choices=ATTACKS, default="none")
    group.add_argument("--attack-scale", type=float, default=1.0, metavar="S")
    args = cli.parse_args(parser, argv)
    check_roles(args)
    return args


def check_roles(args, world_size=None):
    """The flags that cannot work together, as one line each (world size: known once launched)."""
    for flag in ("ema_decay", "compile", "sync_bn"):
        if getattr(args, flag):
            raise RecipeError(f"--{flag.replace('_', '-')} is not supported by the parameter-server recipe")
    if args.accum_steps != 1 or args.save_every or args.profile:
        raise RecipeError("--accum-steps, --save-every and --profile are not supported by the parameter-server recipe")
    cli.check_ranges(args, {"--servers": (lambda v: v >= 1, "must be at least 1"),
                            "--validators": (lambda v: v >= 0, "must be 0 or more"),
                            "--max-staleness": (lambda v: v >= 0, "must be 0 or more"),
                            "--partition-bytes": (lambda v: v >= 4, "must be at least 4"),
                            "--validation-split": (lambda v: 0 < v < 1, "is a fraction in (0, 1)"),
                            "--zeno-delay": (lambda v: v >= 1, "must be at least 1"),
                            "--byzantine": (lambda v: v >= 0, "must be 0 or more"),
                            "--zeno-b": (lambda v: v >= 0, "must be 0 or more")})
    if args.attack == "labelflip" and (args.mixup_alpha or args.cutmix_alpha):
        raise RecipeError("--attack labelflip flips class labels: not with --mixup-alpha or --cutmix-alpha")
    if args.attack == "none" and args.byzantine:
        raise RecipeError(f"--byzantine {args.byzantine} needs an --attack")
    if args.validators and args.aggregate not in VALIDATED:
        raise RecipeError(f"--validators score pushes with a Zeno rule: --aggregate {'|'.join(VALIDATED)}")
    if not args.validators and args.aggregate in VALIDATED:
        raise RecipeError(f"--aggregate {args.aggregate} needs --validators (at least 1)")
    if args.mode == "async" and args.aggregate not in ("mean", "zenops", "zeno++"):
        raise RecipeError(f"--mode async applies each push alone: --aggregate mean, zenops or zeno++, "
                          f"not {args.aggregate}")
    if args.mode == "sync" and args.aggregate == "zeno++":
        raise RecipeError("--aggregate zeno++ is asynchronous: use --mode async (or zeno, zenops in sync)")
    if args.mode == "async" and args.aggregate == "zeno":
        raise RecipeError("--aggregate zeno is synchronous: use --mode sync (or zeno++, zenops in async)")
    args.rho = RHO.get(args.aggregate, 0.0) if args.rho is None else args.rho
    args.zeno_b = args.byzantine if args.zeno_b is None else args.zeno_b
    if world_size is None:
        return
    workers = world_size - args.servers - args.validators
    if workers < 1:
        raise RecipeError(f"{args.servers} server(s) and {args.validators} validator(s) leave no worker in a "
                          f"world of {world_size} processes")
    if args.validators > workers:
        raise RecipeError(f"{args.validators} validators for {workers} worker(s): each validator needs a worker")
    if args.byzantine >= workers:
        raise RecipeError(f"--byzantine {args.byzantine} must be smaller than the {workers} worker(s)")
    b = args.zeno_b
    if args.aggregate in ("median", "trimmed-mean", "phocas", "krum") and 2 * b >= workers:
        raise RecipeError(f"--aggregate {args.aggregate} tolerates fewer than half of the workers Byzantine: "
                          f"{b} of {workers}")
    if args.aggregate == "krum" and 2 * b + 2 >= workers:
        raise RecipeError(f"--aggregate krum needs more than 2 b + 2 workers: {workers} for b = {b}")
    if args.aggregate == "zeno" and b >= workers:
        raise RecipeError(f"--zeno-b {b} must leave at least one of the {workers} workers")


# ---- what every role shares ---------------------------------------------------------------------------

def flat_gradient(model, criterion, images, target):
    """The gradient of the batch's loss as one flat vector on the CPU (what a push sends), and the (loss,
    output) of the batch."""
    model.zero_grad(set_to_none=False)
    output = model(images)
    loss = criterion(output, target)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu(), loss, output


def batch_stats(loss, output, target):
    """(loss x n, top-1 hits, top-5 hits, n) of a batch, for a header: what the servers' meters add up."""
    sums, n = metrics.batch_sums(loss, output, target)
    return torch.cat([sums.cpu(), torch.tensor([n], dtype=torch.float64)])


def forever(loader, sampler, first_epoch, seed, rank, first_step=0):
    """A worker's or validator's batches, epoch after epoch of its shard (a new shuffle each)."""
    for epoch in itertools.count(first_epoch):
        sampler.set_epoch(epoch)
        data.set_seed(seed, epoch, rank)
        yield from data.skip_batches(loader, first_step if epoch == first_epoch else 0)


# ---- workers: pull, compute a gradient, push ----------------------------------------------------------

def attack_gradient(args, model, criterion, images, target, num_classes):
    """A Byzantine worker's push (recipes docstring); also returns its batch's (loss, output)."""
    import byzfl  # only Byzantine workers need it (and it takes seconds to import)

    if args.attack == "labelflip":
        return flat_gradient(model, criterion, images, num_classes - 1 - target)
    g, loss, output = flat_gradient(model, criterion, images, target)
    s = args.attack_scale
    if args.attack == "signflip":
        return s * byzfl.SignFlipping()([g]), loss, output
    if args.attack == "gaussian":
        return byzfl.Gaussian(mu=0.0, sigma=float(s))([g]).float(), loss, output
    quarters = [flat_gradient(model, criterion, i, t)[0] for i, t in zip(images.chunk(4), target.chunk(4))]
    attack = byzfl.ALittleIsEnough(tau=float(s)) if args.attack == "alie" else byzfl.InnerProductManipulation(float(s))
    return attack(quarters).float(), loss, output


def worker(args, ctx, model, batches, chunks, steps, num_classes):
    """Pull the weights that changed, compute a gradient on the next batch, push it: to every server its
    chunks, or all of it to this worker's validator. Sync: for `steps` steps; both: until a pull says stop."""
    index = ctx.rank - args.servers - args.validators
    byzantine = index < args.byzantine
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    vector = parameters_to_vector(model.parameters()).detach().cpu()  # this worker's copy of the weights
    versions = [-1] * args.servers  # of this worker's copy of each server's chunks: none yet
    to_device = data.device_transform(args, ctx.device, num_classes)
    validator = args.servers + index % args.validators if args.validators else None
    counts = torch.tensor([0, 1, 0, 0] if byzantine else [1, 0, 0, 0], dtype=torch.float64)  # (for the counts only)
    model.train()
    for images, target in itertools.islice(batches, steps):
        stop, _ = pushpull.pull(vector, chunks, versions)
        if stop:  # the servers have trained enough (async), or reached --desired-acc
            break
        pushpull.copy_into(model.parameters(), vector)  # (to the GPU, if there)
        images, target = to_device(images, target)
        if byzantine:
            g, loss, output = attack_gradient(args, model, criterion, images, target, num_classes)
        else:
            g, loss, output = flat_gradient(model, criterion, images, target)
        stats = batch_stats(loss, output, target)
        if validator is not None:  # the validator forwards it, or not
            pushpull.push_candidate(validator, pushpull.header(pushpull.PUSH, stats=stats, counts=counts), versions,
                                    g)
            continue
        for server, server_chunks in enumerate(chunks):
            message = pushpull.header(pushpull.PUSH, versions[server], stats, counts)
            pushpull.send(message, server, pushpull.take(g, server_chunks))
    # leaving: the servers (and an async validator, which waits for any of its workers) stop waiting for it
    for peer in [*range(args.servers), *([validator] if validator is not None and args.mode == "async" else [])]:
        pushpull.send(pushpull.header(pushpull.BYE), peer)
    stopped_for_sigterm(args)


def stopped_for_sigterm(args):
    """A client told to stop after a SIGTERM (its own, or a peer's): the servers have saved; exit 75 as they do."""
    if faults.sigterm_received():
        raise faults.Preempted(f"preempted: SIGTERM received; the servers saved {args.out}/checkpoint.pt")


# ---- validators: score each candidate against their own gradient, forward what passes ---------------

def own_gradient(model, criterion, vector, batches, to_device):
    """A validator's v at the weights `vector`, on its next held-out batch, and f: the loss on that batch as a
    function of the weights (zeno)."""
    pushpull.copy_into(model.parameters(), vector)
    images, target = to_device(*next(batches))

    def loss_at(weights):
        pushpull.copy_into(model.parameters(), weights)
        with torch.no_grad():
            return criterion(model(images), target).item()
    return flat_gradient(model, criterion, images, target)[0], loss_at


def validator_sync(args, model, batches, chunks, workers, steps, validators_group, to_device):
    """Each step: pull, compute v, take every assigned worker's candidate, forward the sum of those accepted."""
    index, criterion = dist.get_rank(validators_group), nn.CrossEntropyLoss()
    vector, versions = parameters_to_vector(model.parameters()).detach().cpu(), [-1] * args.servers
    model.train()
    for _ in range(steps):
        stop, lr = pushpull.pull(vector, chunks, versions)
        if stop:  # --desired-acc reached
            break
        v, loss_at = own_gradient(model, criterion, vector, batches, to_device)
        candidates = [pushpull.recv_candidate(w, args.servers, vector.numel()) for w in workers]
        gradients = [g for _, _, _, g in candidates]
        if args.aggregate == "zenops":
            accepted = [zeno.zenops_sync(g, v, args.zeno_eta, args.rho) for g in gradients]
        else:  # zeno: the n - b highest scores among all validators' candidates
            scores = zeno.zeno_scores(loss_at, vector, gradients, lr, args.rho)
            every = [None] * args.validators
            with faults.waiting_for("the other validators' scores"):
                dist.all_gather_object(every, scores, group=validators_group)
            kept = set(zeno.zeno_keep([score for scores_of in every for score in scores_of], args.zeno_b))
            offset = sum(len(scores_of) for scores_of in every[:index])
            accepted = [offset + i in kept for i in range(len(scores))]
        counts = sum(rejection_counts(message, ok) for (message, *_), ok in zip(candidates, accepted))
        stats = sum(message[pushpull.STATS] for message, *_ in candidates)
        total = sum((g for g, ok in zip(gradients, accepted) if ok), torch.zeros_like(vector))
        for server, server_chunks in enumerate(chunks):
            message = pushpull.header(pushpull.PUSH, stats=stats, counts=counts, accepted=sum(accepted))
            pushpull.send(message, server, pushpull.take(total, server_chunks))
    for server in range(args.servers):
        pushpull.send(pushpull.header(pushpull.BYE), server)
    stopped_for_sigterm(args)


def validator_async(args, model, batches, chunks, workers, to_device):
    """Score each candidate as it arrives and forward it (rejected: a skip, so that the servers count the
    worker's step); then catch up with the servers (zeno++: once they are --zeno-delay versions ahead) and
    recompute v when the weights changed. Until every assigned worker has left."""
    criterion = nn.CrossEntropyLoss()
    vector, versions = parameters_to_vector(model.parameters()).detach().cpu(), [-1] * args.servers
    age = args.zeno_delay if args.aggregate == "zeno++" else 1
    model.train()
    _, lr = pushpull.pull(vector, chunks, versions, age)
    v, _ = own_gradient(model, criterion, vector, batches, to_device)
    active = set(workers)
    while active:
        try:
            message, sender, worker_versions, g = pushpull.recv_candidate(None, args.servers, vector.numel())
        except RuntimeError:  # none of the remaining workers sent anything within --dist-timeout: all dead
            break  # (a header cut off by a dying worker is passed over by recv_candidate)
        if g is None:
            active.discard(sender)
            continue
        if args.aggregate == "zenops":
            update, accepted = zeno.zenops_async(g, v, args.zeno_eta, args.zeno_alpha)
        else:
            update, accepted = zeno.zeno_plus_plus(g, v, lr, args.rho, args.eps)
        applied = accepted or args.aggregate == "zenops"  # zenops applies alpha s g to what it rejects
        counts = rejection_counts(message, accepted)
        for server, server_chunks in enumerate(chunks):
            forward = pushpull.header(pushpull.PUSH if applied else pushpull.SKIP, worker_versions[server],
                                      message[pushpull.STATS], counts)
            pushpull.send(forward, server, pushpull.take(update, server_chunks) if applied else None)
        seen = list(versions)
        _, lr = pushpull.pull(vector, chunks, versions, age)
        if versions != seen:
            v, _ = own_gradient(model, criterion, vector, batches, to_device)
    for server in range(args.servers):
        try:
            pushpull.send(pushpull.header(pushpull.BYE), server)
        except RuntimeError:  # the server already gave up on this validator's dead workers and left
            pass
    stopped_for_sigterm(args)


def rejection_counts(message, accepted):
    """(honest pushed, byzantine pushed, honest rejected, byzantine rejected) for one candidate."""
    byzantine = bool(message[pushpull.COUNTS][1] > 0)
    return torch.tensor([not byzantine, byzantine, not (byzantine or accepted), byzantine and not accepted],
                        dtype=torch.float64)


# ---- servers: apply the updates to their chunks; evaluate and save at each epoch's end ---------------

def aggregate(args, gradients, clipping):
    """The servers' rule over the workers' pushes of this step (sync, no validators)."""
    import byzfl  # only the robust rules need it

    stacked = torch.stack(gradients)
    rule = args.aggregate
    if rule == "mean":
        return stacked.mean(dim=0)
    if rule == "phocas":
        return zeno.phocas(stacked, args.zeno_b)
    if rule == "centered-clipping":
        return clipping(stacked)
    return {"median": byzfl.Median(), "trimmed-mean": byzfl.TrMean(f=args.zeno_b),
            "krum": byzfl.Krum(f=args.zeno_b)}[rule](stacked)


def server(args, ctx, run, shard, optimizer, val_loader):
    """Per step, sync: answer every client's pull, take every push, apply their aggregate; async: answer
    pulls until the next worker step arrives, apply it unless it is too stale. At each epoch's end,
    evaluate and save. Then tell every client to stop, and write the counts into summary.json."""
    first_worker = args.servers + args.validators
    clients = list(range(args.servers, ctx.world_size))
    senders = clients[:args.validators] if args.validators else clients  # whose pushes reach the servers
    tally = {"version": 0, "stale": 0, "oldest": 0, "left": set(), "counts": torch.zeros(4, dtype=torch.float64),
             "clipping": None}
    if args.aggregate == "centered-clipping":
        import byzfl
        tally["clipping"] = byzfl.CenteredClipping(tau=10.0)
    step = sync_step if args.mode == "sync" else async_step
    try:
        for epoch in run.epochs():
            for _ in run.batches(range(run.steps_per_epoch)):
                losses = step(args, run, shard, optimizer, clients, senders, tally)
                run.step_done(torch.tensor(sum(losses) / len(losses) if losses else 0.0))
            if run.end_epoch(run.meter.summary(), val_loader):
                break
    except faults.Preempted:  # saved after a SIGTERM: tell every client to stop, then exit for a relaunch
        drain(clients, tally, shard, optimizer)
        raise
    drain(clients, tally, shard, optimizer)
    run.finish(val_loader, mode=args.mode, aggregate=args.aggregate, attack=args.attack, byzantine=args.byzantine,
               servers=args.servers, validators=args.validators, workers=ctx.world_size - first_worker,
               **counts_of_every_server(tally, run))


def counts_of_every_server(tally, run):
    """The summary's update counts, added up (or the most) over the servers: CPU numbers, over their gloo group
    (run.control; run.group, on the device, is NCCL's on GPUs)."""
    dist.all_reduce(tally["counts"], group=run.control)
    honest_pushed, byzantine_pushed, honest_rejected, byzantine_rejected = tally["counts"].long().tolist()
    most = torch.tensor([tally["stale"], tally["oldest"]])  # (every server drops and applies on its own)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=run.control)
    stale, oldest = most.tolist()
    return dict(honest_pushed=honest_pushed, honest_rejected=honest_rejected, byzantine_pushed=byzantine_pushed,
                byzantine_rejected=byzantine_rejected, stale_dropped=stale, max_applied_staleness=oldest)


def sync_step(args, run, shard, optimizer, clients, senders, tally):
    """Every client pulls this step's weights, every sender pushes; apply the aggregate (validators: the mean
    of what they accepted, nothing when they accepted nothing). Returns the losses this server records."""
    lr = optimizer.param_groups[0]["lr"]
    for client in clients:
        request, _ = pushpull.recv_header(client)
        pushpull.answer_pull(request, client, shard.detach(), tally["version"], lr)
    received = []
    for sender in senders:
        message, _ = pushpull.recv_header(sender)
        received.append((message, pushpull.recv_payload(sender, shard.numel())))
    if args.validators:
        accepted = sum(int(message[pushpull.ACCEPTED]) for message, _ in received)
        if accepted:
            apply(shard, optimizer, sum(g for _, g in received) / accepted, tally)
    else:
        apply(shard, optimizer, aggregate(args, [g for _, g in received], tally["clipping"]), tally)
    losses = [record(run, message, sender, senders, tally) for (message, _), sender in zip(received, senders)]
    return [loss for loss in losses if loss is not None]


def async_step(args, run, shard, optimizer, clients, senders, tally):
    """Answer pulls until the next worker step arrives (a push, or a validator's skip); apply a push unless it
    was computed more than --max-staleness versions ago. Returns the losses this server records."""
    kind = pushpull.PULL
    while kind in (pushpull.PULL, pushpull.BYE):
        message, sender, g = pushpull.serve(shard.detach(), tally["version"], optimizer.param_groups[0]["lr"])
        kind = int(message[pushpull.KIND])
        if kind == pushpull.BYE:  # (or died)
            tally["left"].add(sender)
    if kind == pushpull.PUSH:
        staleness = tally["version"] - int(message[pushpull.VERSION])  # updates since its weights were pulled
        if args.max_staleness is not None and staleness > args.max_staleness:
            tally["stale"] += 1
        else:
            apply(shard, optimizer, g, tally)
            tally["oldest"] = max(tally["oldest"], staleness)
    loss = record(run, message, sender, senders, tally)
    return [] if loss is None else [loss]


def apply(shard, optimizer, update, tally):
    """One SGD step of this server's chunks: a new version."""
    shard.grad = update
    optimizer.step()
    tally["version"] += 1


def record(run, message, sender, senders, tally):
    """Each sender's training statistics and update counts are kept by one server (sender i by server i mod S),
    so that the servers' sums count each once. Returns the batch loss, or None when another server keeps it."""
    if senders.index(sender) % dist.get_world_size(run.group) != dist.get_rank(run.group):
        return None
    stats = message[pushpull.STATS]
    run.meter.add(stats[:3], int(stats[3]))
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


def main(args):
    ctx = distributed.init_distributed_mode(args)
    check_roles(args, ctx.world_size)
    device = ctx.device
    log = runlog.RunLog(args, enabled=ctx.is_main)
    first_worker = args.servers + args.validators
    role = "server" if ctx.rank < args.servers else "validator" if ctx.rank < first_worker else "worker"
    # the servers' groups: their device group evaluates, the gloo one carries the shards (on the CPU, as BytePS's)
    servers_group = distributed.new_group(range(args.servers))  # (every rank takes part in making each group)
    servers_control = distributed.new_control_group(range(args.servers))
    validators_control = distributed.new_control_group(range(args.servers, first_worker)) if args.validators else None

    train_set, val_set, num_classes = data.build_datasets(args)
    held_out = None
    if args.validators:  # the validators' own data: a part of train/ that no worker sees
        train_set, held_out = data.hold_out(train_set, args.validation_split, args.seed)
    workers = ctx.world_size - first_worker
    worker_sampler = DistributedSampler(train_set, num_replicas=workers, rank=max(ctx.rank - first_worker, 0),
                                        seed=args.seed or 0)  # worker i: the shard of ddp's rank i
    steps_per_epoch = len(worker_sampler) // args.batch_size
    if steps_per_epoch == 0:
        raise RecipeError(f"train/ gives {len(worker_sampler)} images per worker, fewer than one step of "
                          f"--batch-size {args.batch_size}")

    if args.validators and len(held_out) // args.validators < args.batch_size:
        raise RecipeError(f"--validation-split {args.validation_split:g} holds out {len(held_out)} train images: "
                          f"fewer than one batch of --batch-size {args.batch_size} for each of the "
                          f"{args.validators} validator(s)")

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes).to(device)
    sync = args.mode == "sync"
    global_batch = args.batch_size * (workers if sync else 1)  # what one update averages over
    lr = args.lr * global_batch / 256  # linear scaling rule: --lr is for a global batch of 256
    chunks = pushpull.partition([p.numel() for p in model.parameters()], args.partition_bytes, args.servers)
    update_steps = steps_per_epoch * (1 if sync else workers)  # server updates per epoch (async: pushes)

    start = [0, 0]
    if role == "server":
        shard = nn.Parameter(pushpull.take(parameters_to_vector(model.parameters()).detach().cpu(), chunks[ctx.rank]))
        optimizer = torch.optim.SGD([shard], lr, momentum=args.momentum, weight_decay=args.weight_decay)
        view = torch.optim.SGD(model.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay)
        view.param_groups[0]["initial_lr"] = lr  # the checkpoint's optimizer, as the other recipes save it
        scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=update_steps)

        def gather_model():  # before each evaluation and save: the whole model, from every server's shard
            gather(model, view, shard, optimizer, chunks, servers_control)
        run = bookkeeping.Run(args, log, device, model, view, scheduler, None, num_classes, global_batch,
                              steps_per_epoch=update_steps, group=servers_group, control=servers_control,
                              gather=gather_model)
        run.resume()  # --resume, or <out>/checkpoint.pt with --auto-resume: then take this server's chunks
        vector = parameters_to_vector(model.parameters()).detach().cpu()
        shard.data = pushpull.take(vector, chunks[ctx.rank])
        buffers = [view.state.get(p, {}).get("momentum_buffer") for p in model.parameters()]
        if all(buffer is not None for buffer in buffers):  # resumed with momentum: this server's share of it
            momentum = torch.cat([buffer.reshape(-1) for buffer in buffers]).cpu()
            optimizer.state[shard]["momentum_buffer"] = pushpull.take(momentum, chunks[ctx.rank])
        start = [run.checkpoint.epoch, run.checkpoint.step // (1 if sync else workers)]  # in worker steps
        val_loader = data.val_loader(val_set, args, ctx.rank, args.servers)
        log.print(f"ps: {args.servers} server(s), {args.validators} validator(s), {workers} worker(s) on {device} "
                  f"({ctx.backend}), {args.mode}, --aggregate {args.aggregate}, {args.byzantine} Byzantine "
                  f"({args.attack}); chunks per server {[len(c) for c in chunks]}, "
                  f"{[pushpull.shard_size(c) for c in chunks]} parameters; {run.describe(train_set, val_set)}")
    byzantine_worker = role == "worker" and ctx.rank - first_worker < args.byzantine
    if byzantine_worker or (role == "server" and args.aggregate in ROBUST[1:]):
        import byzfl  # noqa: F401 (seconds to import: before the start, so that no worker starts late)
    positions = [start]
    dist.broadcast_object_list(positions, src=0, group=ctx.control)  # where a resumed run starts, for the clients
    start = positions[0]
    remaining_steps = (args.epochs - start[0]) * steps_per_epoch - start[1]  # (sync: a worker's and validator's)
    if args.evaluate:
        if role == "server":
            run.finish(val_loader)
    elif role == "server":
        server(args, ctx, run, shard, optimizer, val_loader)
    elif role == "validator":
        index = ctx.rank - args.servers
        sampler = DistributedSampler(held_out, num_replicas=args.validators, rank=index, seed=args.seed or 0)
        loader = data.train_loader(held_out, args, sampler)
        faults.catch_sigterm(args.out, ctx.rank)  # (a SIGTERM travels with its messages: the servers save, stop)
        batches = forever(loader, sampler, start[0], args.seed, ctx.world_size + index)  # (a seed of its own)
        assigned = [w for w in range(first_worker, ctx.world_size) if (w - first_worker) % args.validators == index]
        to_device = data.device_transform(args, device, num_classes)
        if sync:
            validator_sync(args, model, batches, chunks, assigned, remaining_steps, validators_control, to_device)
        else:
            validator_async(args, model, batches, chunks, assigned, to_device)
    else:
        loader = data.train_loader(train_set, args, worker_sampler)
        faults.catch_sigterm(args.out, ctx.rank)
        batches = forever(loader, worker_sampler, start[0], args.seed, ctx.rank - first_worker, start[1])
        worker(args, ctx, model, batches, chunks, remaining_steps if sync else None, num_classes)
    distributed.cleanup()


if __name__ == "__main__":
    launch.start(main, parse_args)
