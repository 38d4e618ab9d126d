"""What workers and validators both compute: an update from some batches, and its statistics."""

import itertools
import random
import time

import torch
from torch.nn.utils import parameters_to_vector

from recipes.common import data, faults, metrics, pushpull


def local_update(model, optimizer, criterion, vector, batches, steps, lr, to_device, relabel=None):
    """The update u of `steps` batches from the weights `vector`, as a flat vector on the CPU (what a push
    sends): one step, the gradient; more, the change of the weights over that many local SGD steps (ZenoPS),
    x - x_local, with the momentum of this process's own optimizer kept from round to round. Also returns the
    batches' (loss x n, top-1 hits, top-5 hits, n, seconds waited for them): the loss it trained on (relabel:
    the labels it trains on, a label-flipping liar's), the hits on the true labels."""
    pushpull.copy_into(model.parameters(), vector)  # (to the GPU, if there)
    sums, seen, waited = 0, 0, 0.0  # (added up on the device: one copy to the CPU after the steps, not one a step)
    for group in optimizer.param_groups:
        group["lr"] = lr  # the servers' current learning rate
    asked = time.perf_counter()
    for images, target in itertools.islice(batches, steps):
        waited += time.perf_counter() - asked
        images, target = to_device(images, target)
        model.zero_grad(set_to_none=False)
        output = model(images)
        loss = criterion(output, target if relabel is None else relabel(target))
        loss.backward()
        batch_sums, n = metrics.batch_sums(loss, output, target)
        sums, seen = sums + batch_sums, seen + n
        if steps == 1:
            return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu(), stats_of(sums, seen, waited)
        optimizer.step()
        asked = time.perf_counter()
    return vector - parameters_to_vector(model.parameters()).detach().cpu(), stats_of(sums, seen, waited)


def joins(args, index, round_):
    """Whether worker `index` pushes in this round (--worker-subsample p: with probability p, drawn from --seed,
    as ZenoPS's workers draw each round, zeno_ps byteps/mxnet/__init__.py 381 sync, 824 async)."""
    return args.worker_subsample >= 1 or random.Random(f"{args.seed}/{index}/{round_}").random() < args.worker_subsample


def stats_of(sums, seen, waited):
    """(loss x n, top-1 hits, top-5 hits, n, seconds waited for data) on the CPU, for a push's header."""
    return torch.cat([sums.detach().cpu().double(), torch.tensor([seen, waited], dtype=torch.float64)])


def local_optimizer(args, model):
    """The SGD of a worker's or validator's local steps, its momentum kept from round to round (lr: each
    round's, from the servers)."""
    return torch.optim.SGD(model.parameters(), 0.0, momentum=args.momentum, weight_decay=args.weight_decay)


def forever(loader, sampler, first_epoch, seed, rank, first_step=0, per_epoch=None):
    """A worker's or validator's batches, epoch after epoch of its shard (a new shuffle each); per_epoch: the
    first that many of each epoch (a whole number of rounds of local steps)."""
    for epoch in itertools.count(first_epoch):
        sampler.set_epoch(epoch)
        data.set_seed(seed, epoch, rank)
        skipped = first_step if epoch == first_epoch else 0
        batches = data.skip_batches(loader, skipped)
        yield from batches if per_epoch is None else itertools.islice(batches, per_epoch - skipped)


def stopped_for_sigterm(args):
    """A client told to stop after a SIGTERM (its own, or a peer's): the servers have saved; exit 75 as they do."""
    if faults.sigterm_received():
        raise faults.Preempted(f"preempted: SIGTERM received; the servers saved {args.out}/checkpoint.pt")
