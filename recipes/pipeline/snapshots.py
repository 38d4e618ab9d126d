"""--snapshot-every T: the model scored more often than once an epoch, with no meeting of the replicas mid-epoch.

SD-PIPE's measure is the time to a target accuracy; scored once an epoch, a time can only be an epoch's end.
Stopping every replica to evaluate would add waits the methods do not have (preduce's and HetPipe's replicas
meet only at an epoch's end). So each training rank keeps its stage's weights (and buffers) as they were at each
multiple of T seconds of the epoch's training, on its own clock (started as it leaves the epoch before): at its
first update after one or more multiples have passed, it copies the weights as they are before that update (to
the host, without waiting for the device), one copy that stands for all of those multiples; at the epoch's end
it copies them for the multiples since its last update, before the epoch's end changes them (preduce's average
of all replicas). Then, where every rank meets anyway, the model of each multiple k T, every stage's weights as
of that moment, is put in the stages' place and scored exactly as the epoch's model is (run.evaluate: each
replica its own pipeline's, every rank a share of val/; HetPipe: replica 0's, which pulled the global weights at
most --wave updates before), and the weights are put back; a multiple at which no rank's weights had changed
since the one before is not scored again. The scores go to <out>/snapshots.csv: epoch, seconds (k T, of that
epoch's training), loss, top1, top5. The scoring is outside the epoch's time (epoch_s), and comes before the
epoch's stop check (preduce and hetpipe act on a SIGTERM after it). A run resumed within an epoch adds the rows
of what it trains, their seconds counted from the resumption.
"""

import csv
import math
import time

import torch
import torch.distributed as dist

from recipes.common import distributed

FIELDS = ["epoch", "seconds", "loss", "top1", "top5"]
NONE_HELD = 2 ** 62  # (hetpipe's servers: a count that is no rank's fewest)


class Snapshots:
    """One rank's copies of its stage's tensors (weights and buffers) over an epoch, and which copy holds them at
    each multiple of T."""

    def __init__(self, every, tensors, device):
        self.every, self.tensors, self.pinned = every, tensors, device.type == "cuda"  # (a copy to pinned memory
        self.begin()                                                                 # does not wait for the device)

    def begin(self):
        """The epoch's clock starts."""
        self.copies, self.copy_of, self.start = [], [], time.perf_counter()  # copy_of[k - 1]: the k-th multiple's

    def before_update(self):
        """Before each update: the tensors since the last one, if a multiple of T passed since then."""
        if self.every:
            multiple = math.floor((time.perf_counter() - self.start) / self.every)
            if multiple > len(self.copy_of):
                self.copies.append([torch.empty_like(t, device="cpu", pin_memory=self.pinned).copy_(
                    t.detach(), non_blocking=True) for t in self.tensors])
                self.copy_of += [len(self.copies) - 1] * (multiple - len(self.copy_of))

    def close(self):
        """Before the epoch's end changes the weights: those since the last update, for the multiples that passed."""
        self.before_update()


def score(snapshots, run, val_loader):
    """Every rank, after the epoch's training: the model at each multiple of T that every training rank reached
    (hetpipe's servers hold no copies: snapshots None), scored as run.evaluate scores the epoch's model; rank 0
    writes snapshots.csv."""
    every = run.args.snapshot_every
    if not every:
        return
    copy_of = snapshots.copy_of if snapshots is not None else None
    control = distributed.control_group()
    fewest = torch.tensor([len(copy_of) if copy_of is not None else NONE_HELD], dtype=torch.int64)
    dist.all_reduce(fewest, op=dist.ReduceOp.MIN, group=control)
    n, rows = int(fewest), []
    if n:
        changed = torch.tensor([k == 0 or copy_of[k] != copy_of[k - 1] for k in range(n)] if copy_of is not None
                               else [False] * n, dtype=torch.int32)
        dist.all_reduce(changed, op=dist.ReduceOp.MAX, group=control)  # some rank's weights moved since the last
        tensors = snapshots.tensors if snapshots is not None else []
        now = [t.detach().clone() for t in tensors]
        for k in range(n):
            if changed[k]:
                if snapshots is not None:
                    load(tensors, snapshots.copies[copy_of[k]])
                run.evaluate(val_loader)
                rows.append({"epoch": run.epoch + 1, "seconds": f"{(k + 1) * every:.3f}",
                             **{key: f"{run.val_stats[key]:.4f}" for key in ("loss", "top1", "top5")}})
        load(tensors, now)
    if snapshots is not None:
        snapshots.copies = []
    write(run, rows)


@torch.no_grad()
def load(tensors, values):
    for tensor, value in zip(tensors, values):
        tensor.copy_(value)


def write(run, rows):
    """Rank 0: the epoch's rows after those of the epochs before, and of this one where it was resumed within it
    (or at its end: then it trains nothing, and its rows are those scored before the stop)."""
    if not run.log.enabled:
        return
    path = run.log.out / "snapshots.csv"
    kept = []
    if path.exists():
        with open(path, newline="") as f:
            kept = [row for row in csv.DictReader(f) if int(row["epoch"]) <= run.epoch + bool(run.first_step)]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(kept + rows)
