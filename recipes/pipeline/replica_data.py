"""What each replica reads of train/ (--replica-data).

shard   ddp's: replica r reads rank r's shard of R disjoint shards (DistributedSampler), reshuffled each epoch,
        so that `allreduce` trains DDP's model on DDP's data.
stream  SD-PIPE's: each pipeline streams the whole training set, shuffled by a generator seeded with its own rank,
        one permutation after another across epochs, and an epoch is N // R images of it (artifacts/pipeline/
        datasets/imagenet.py 91-97, 105-111; train_resnet 73: N // (B R) batches). Replicas may read the same
        image in one epoch, and none is held to a shard. Here the permutations are seeded with --seed and the
        replica (theirs: the rank alone), and a batch may straddle two of them (theirs drops each pass's last
        partial batch).
Under preduce a replica that ends its epoch's share before the epoch's updates are taken reads on (shard_again):
its shard again, reshuffled; or, on a stream, later permutations of it, and the next epoch starts where its
share of the stream starts (theirs reads on from where it is, so a fast replica's later epochs move along).
"""

import torch
from torch.utils.data import DistributedSampler, Sampler


class Stream(Sampler):
    """Replica `replica`'s stream of the n indices: permutation c seeded with (seed, replica, c); epoch e is its
    positions e L to (e + 1) L - 1, L = n // replicas (whole epochs of it resume anywhere)."""

    def __init__(self, n, replicas, replica, seed):
        self.n, self.length, self.replica, self.seed, self.epoch = n, n // replicas, replica, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.length

    def permutation(self, cycle):
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + self.replica) * 1_000_003 + cycle)
        return torch.randperm(self.n, generator=generator)

    def __iter__(self):
        start = self.epoch * self.length
        cycle, order = start // self.n, self.permutation(start // self.n)
        for position in range(start, start + self.length):
            if position // self.n != cycle:
                cycle, order = position // self.n, self.permutation(position // self.n)
            yield int(order[position % self.n])


def train_sampler(train_set, args, replicas, replica):
    """Replica `replica`'s sampler of train/ under --replica-data."""
    if args.replica_data == "stream":
        return Stream(len(train_set), replicas, replica, args.seed or 0)
    return DistributedSampler(train_set, num_replicas=replicas, rank=replica, seed=args.seed or 0)
