"""Zeno validators: between the workers and the servers, each judges its workers' pushes (worker i goes
to validator i mod V) against what it computes itself on data no worker sees, and forwards what passes.

  zenops  v is the validator's own update, computed as a worker computes its push (--local-steps H
          steps from the same weights, --validator-batch images a step), tensor by tensor (rules.py).
          Sync: every round, before the pushes arrive. Async: every --zeno-delay pushes of its workers
          (default: as many as it has workers, one round of theirs, those that sat it out included, as
          ZenoPS's validators).
  zeno    no v: each push g is scored by the loss it removes from one scoring batch, the same batch
          for every validator in a step (the same held-out data, drawn in the same order), and the
          validators keep the n - b best together. Gradients only (--local-steps 1), as its authors.
  zeno++  v is the gradient of one --validator-batch batch at the latest weights, refreshed every
          --zeno-delay k pushes that reached any validator (default 10, its authors': their one server
          counts every arrival). Gradients only (--local-steps 1).
  naive-async  no test: alpha u forwarded, as ZenoPS's asynchronous baseline runs in its
          validators (launcher/experiments_async_*.sh --validation-type naive_async); v is computed
          as zenops' is and left unused, as ZenoPS's validator script computes it whatever the rule.
Every forwarded push says what it held: per parameter tensor, how many pushes were accepted (sync),
so the servers apply, tensor by tensor, the mean of every accepted push. What was rejected is
counted by pushes (the share of its tensors, a push rejected whole counting 1), by tensors and by
parameters, for honest and for poisoned tensors apart (the worker says which of its tensors lie), and
zenops counts the parameters that failed each of its tests, the norm test and the sign test.

--validator-batch: zenops's v (and naive-async's, unused) is computed as a push is, on the workers' batch
(ZenoPS's); a larger one would average away more of v's noise, and lower with it the norm test's bar,
1.6 ||v||^2. zeno and zeno++ score on 4 x --batch-size (Zeno++'s authors score on the workers' batch of
128): a gradient of 8 images has 4 times the variance of one of 32. docs/results/ps.md's zeno table
measures Zeno's own scoring batch of 4.

Where this departs from the authors' code (ZenoPS, Zeno, Zeno++), and why: deviations.py, the one list,
each row with their files and lines.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DistributedSampler

from recipes.common import RunFailed, data, faults, pushpull
from recipes.ps import attacks, roles, rules, steps


def held_out_batches(args, held_out, rank, first_epoch, world_size):
    """A validator's batches: all of the held-out data, shuffled its own way (zeno: every validator the same
    way, so that they score the same batches)."""
    index = 0 if args.aggregate == "zeno" else rank - args.servers
    sampler = DistributedSampler(held_out, num_replicas=1, rank=0, seed=(args.seed or 0) + index)
    loader = data.train_loader(held_out, roles.with_batch(args, args.validator_batch), sampler)
    return steps.forever(loader, sampler, first_epoch, args.seed, world_size + index)  # (a seed of its own)


def run_validator(args, layout, rank, model, batches, chunks, rounds, base_lr, validators_control, to_device):
    sync = args.mode == "sync"
    validate = validator_sync if sync else validator_async
    validate(args, layout, rank, model, batches, chunks, rounds, base_lr, validators_control, to_device)
    for server in range(args.servers):  # leaving: the servers stop waiting for this validator
        try:
            pushpull.send(pushpull.header(pushpull.BYE), server)
        except RuntimeError:  # async: the server already gave up on this validator's dead workers and left
            if sync:
                raise


def validator_sync(args, layout, rank, model, batches, chunks, rounds, base_lr, validators_control, to_device):
    """Each round: pull, compute v (zenops), take every assigned worker's push, forward the accepted ones."""
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)  # (the workers' loss)
    sizes = [p.numel() for p in model.parameters()]
    optimizer = steps.local_optimizer(args, model)
    vector, versions = parameters_to_vector(model.parameters()).detach().cpu(), [-1] * args.servers
    for _ in range(rounds):
        stop, lr = pushpull.pull(vector, chunks, versions)
        if stop:  # --desired-acc reached
            break
        if args.aggregate == "zenops":  # (while the workers compute theirs)
            model.train()
            v, _ = steps.local_update(model, optimizer, criterion, vector, batches, args.local_steps, lr, to_device)
        candidates = [pushpull.recv_candidate(w, args.servers, vector.numel() + len(sizes))
                      for w in layout.workers_of(rank)]  # (--worker-subsample: some sit out, a skip)
        lost = [sender for message, sender, *_ in candidates if message[pushpull.KIND] == pushpull.BYE]
        if lost:  # (it died mid-message)
            raise RunFailed(f"rank {rank} lost worker rank(s) {lost} during training: sync waits for every push")
        pushed = [split_lies(g, sizes) for *_, g in candidates if g is not None]
        updates, lies = [u for u, _ in pushed], [lying for _, lying in pushed]
        if args.aggregate == "zenops":  # (per tensor: the sign test passed, the norm test passed)
            tests = [rules.zenops_sync(u, v, sizes, args.zeno_eta, args.rho) for u in updates]
            passed = [[sign and norm for sign, norm in tests_of] for tests_of in tests]
        else:
            passed = zeno_passed(args, model, criterion, vector, batches, updates, lr, validators_control,
                                 to_device, len(sizes))
            tests = [None] * len(updates)
        none = torch.zeros(attacks.COUNTS, dtype=torch.float64)  # (every worker may sit a round out)
        counts = sum((attacks.counts(lying, sizes, ok, tested) for lying, ok, tested in zip(lies, passed, tests)),
                     none)
        stats = sum(message[pushpull.STATS] for message, *_ in candidates)
        total = sum((rules.accepted_part(u, ok, sizes) for u, ok in zip(updates, passed)), torch.zeros_like(vector))
        accepted = torch.tensor([sum(ok[t] for ok in passed) for t in range(len(sizes))], dtype=torch.float32)
        for server, server_chunks in enumerate(chunks):
            message = pushpull.header(pushpull.PUSH, stats=stats, counts=counts)
            pushpull.send(message, server, torch.cat([pushpull.take(total, server_chunks), accepted]))


def zeno_passed(args, model, criterion, vector, batches, updates, lr, validators_control, to_device, tensors):
    """Zeno: score every push on this step's scoring batch, and keep the n - b best of all validators."""
    images, target = to_device(*next(batches))
    model.eval()  # (scored in inference mode, as its authors)

    def loss_at(weights):
        pushpull.copy_into(model.parameters(), weights)
        with torch.no_grad():
            return criterion(model(images), target).item()
    scores = rules.zeno_scores(loss_at, vector, updates, lr, args.zeno_rho_ratio)
    every = [None] * dist.get_world_size(validators_control)
    with faults.waiting_for("the other validators' scores"):
        dist.all_gather_object(every, scores, group=validators_control)
    kept = set(rules.zeno_keep([score for scores_of in every for score in scores_of], args.zeno_b))
    offset = sum(len(scores_of) for scores_of in every[:dist.get_rank(validators_control)])
    return [[offset + i in kept] * tensors for i in range(len(scores))]


def validator_async(args, layout, rank, model, batches, chunks, rounds, base_lr, validators_control, to_device):
    """Judge each push as it arrives and forward it (zeno++'s rejected: a skip, so that the servers count the
    worker's step); refresh v every k pushes. Until every assigned worker has left."""
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)  # (the workers' loss)
    sizes = [p.numel() for p in model.parameters()]
    optimizer = steps.local_optimizer(args, model)
    vector, versions = parameters_to_vector(model.parameters()).detach().cpu(), [-1] * args.servers
    workers = layout.workers_of(rank)
    k = args.zeno_delay or (rules.ZENO_PLUS_PLUS_K if args.aggregate == "zeno++" else len(workers))
    rho = args.rho if args.rho is not None else rules.ZENO_PLUS_PLUS_RHO_PER_LR * base_lr
    arrivals = dist.PrefixStore("zeno++", dist.distributed_c10d._get_default_store())  # (every validator's pushes)
    active, scored, v = set(workers), 0, None
    while active:
        if v is None:  # v at the latest weights: naive-async leaves it unused, and computes it all the same, as
            # ZenoPS's validator runs its held-out forward and backward whatever the rule (its script's 290-299):
            # the same pace, so that naive-async's asynchrony is zenops' (computing nothing, it ran 1.5x faster)
            _, lr = pushpull.pull(vector, chunks, versions)
            model.train()
            v, _ = steps.local_update(model, optimizer, criterion, vector, batches, args.local_steps, lr, to_device)
        try:
            message, sender, worker_versions, u = pushpull.recv_candidate(None, args.servers,
                                                                          vector.numel() + len(sizes))
        except RuntimeError:  # none of the remaining workers sent anything within --dist-timeout: all dead
            break  # (a header cut off by a dying worker is passed over by recv_candidate)
        if message[pushpull.KIND] == pushpull.BYE:
            active.discard(sender)
            continue
        u, lies = split_lies(u, sizes) if u is not None else (None, None)
        if u is None:  # it sat this round out (--worker-subsample): a skip, so that the servers count its step
            update, applied, counts, worker_versions = None, False, None, [0] * args.servers
        elif args.aggregate == "naive-async":  # ZenoPS's baseline, where ZenoPS runs it: alpha u, forwarded
            update, applied, counts = rules.naive_async(u, args.zeno_alpha), True, attacks.counts(lies, sizes)
        elif args.aggregate == "zenops":  # applies alpha s u to what it rejects (s < eta: a failed sign test)
            update, passed = rules.zenops_async(u, v, sizes, args.zeno_eta, args.zeno_alpha)
            applied, counts = True, attacks.counts(lies, sizes, passed, [(ok, True) for ok in passed])
        else:
            update, applied = rules.zeno_plus_plus(u, v, base_lr, rho, args.eps)
            counts = attacks.counts(lies, sizes, [applied] * len(sizes))
        for server, server_chunks in enumerate(chunks):
            forward = pushpull.header(pushpull.PUSH if applied else pushpull.SKIP, worker_versions[server],
                                      message[pushpull.STATS], counts)
            pushpull.send(forward, server, pushpull.take(update, server_chunks) if applied else None)
        scored, v = refresh(args, arrivals, scored, k, v)  # (ZenoPS's validators count those that sat out too)


def refresh(args, arrivals, scored, k, v):
    """After a push: v, or None when it is due to be computed again at the latest weights. zeno++: every k pushes
    that reached any validator (its authors' server counts every arrival: AsyncByzGrad train_cifar10.py 302); zenops:
    every k of this validator's own (ZenoPS's validator, a round of its workers). Returns (the count, v)."""
    if args.aggregate == "zeno++":
        counted = arrivals.add("pushes", 1)  # (this one, and every other validator's since)
        return counted, None if counted // k > scored // k else v
    return scored + 1, None if (scored + 1) % k == 0 else v


def split_lies(pushed, sizes):
    """A worker's push to its validator: (u, which of its tensors lie), the latter for the counts alone."""
    return pushed[:-len(sizes)], [bool(lie) for lie in pushed[-len(sizes):].tolist()]


def accepted_mean(payloads, numel, tensor_of):
    """The servers' side: the validators' sums of accepted pushes, divided tensor by tensor by how many were
    accepted (a tensor none accepted gets 0). tensor_of: the tensor of each element of this server's shard."""
    total = sum(payloads)
    return total[:numel] / total[numel:][tensor_of].clamp_min(1)


def tensor_of(sizes, server_chunks):
    """For each element of a server's shard, the index of the parameter tensor it belongs to."""
    ends = torch.tensor(sizes).cumsum(0)
    return torch.cat([torch.bucketize(torch.arange(start, end), ends, right=True) for start, end in server_chunks])
