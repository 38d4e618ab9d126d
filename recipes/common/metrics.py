"""Top-k accuracy, per-epoch meters summed across ranks, and exact evaluation."""

import contextlib
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from recipes.common import data, sharding


def correct_counts(output, target, topk=(1, 5)):
    """How many samples have the target among the top k scores, for each k."""
    maxk = min(max(topk), output.size(1))
    top = output.topk(maxk, dim=1).indices
    hits = top.eq(target.unsqueeze(1))
    return [hits[:, :min(k, maxk)].any(dim=1).sum() for k in topk]


def batch_sums(loss, output, target):
    """(loss x n, top-1 hits, top-5 hits) of a batch of n images, and n: what an EpochMeter adds up. A masked
    language model's batch of n sequences (output: sequences x vocabulary x positions) counts its hits on the
    scored positions as a share of each sequence's: exact per-token sums when every sequence has as many (as
    data.MaskedTokens makes them), with no copy to the host."""
    if target.is_floating_point():  # mixup/cutmix soft targets: count hits on each image's larger share
        target = target.argmax(dim=1)
    top1, top5 = correct_counts(output.detach(), target)  # (a label IGNORED is never among the top k)
    n = target.size(0)
    if output.ndim == 3:
        per_sequence = n / target.ne(data.IGNORED).sum().clamp(min=1)
        top1, top5 = top1 * per_sequence, top5 * per_sequence
    return torch.stack([loss.detach().double() * n, top1.double(), top5.double()]), n


class EpochMeter:
    """Sums over one epoch: loss, top-1/top-5 hits, images, time waiting for data.

    Sums stay on the device (no sync per step). summary() adds them up across
    ranks (of group, default all), so every rank reports the metrics of the whole
    epoch, not its shard. Throughput skips the first step, which pays for loader start-up:
    in training, the first optimizer step (optimizer_step()), with all its micro-batches or,
    on a parameter server, its burst of pushes; in evaluation, the first batch.
    """

    def __init__(self, device, group=None):
        self.device, self.group = device, group
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss * n, top-1 hits, top-5 hits
        self.steps, self.optimizer_steps, self.images, self.timed_images, self.data_s = 0, 0, 0, 0, 0.0
        self.skipped = 0  # optimizer steps the loss scaler skipped (a device tensor once counted; None: unknown)
        self.reads = None  # (bytes, read calls) of loading this epoch's batches (data.StorageReads); None: not counted
        self.start = self.last = time.perf_counter()
        self.timed_start = None

    def waiting(self):
        """A batch is asked for: data_ready() counts the wait from here (a rank that updates no statistics, such
        as a pipeline's first stages, calls it too)."""
        self.last = time.perf_counter()

    def data_ready(self):
        self.data_s += time.perf_counter() - self.last

    def update(self, loss, output, target):
        self.add(*batch_sums(loss, output, target))

    def add(self, sums, n):
        """Count a step of n images whose (loss x n, top-1 hits, top-5 hits) are sums (computed elsewhere)."""
        self.sums += sums.to(self.sums)
        self.steps += 1
        self.images += n
        if self.steps == 1:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.timed_start = time.perf_counter()
        else:
            self.timed_images += n
        self.last = time.perf_counter()

    def optimizer_step(self, skipped=False):
        """Training: after each optimizer step. The throughput counts from the end of the first. skipped: whether
        the loss scaler skipped this step (a bool tensor on the device, read at summary(); None: not known)."""
        self.optimizer_steps += 1
        self.skipped = None if skipped is None or self.skipped is None else self.skipped + skipped
        if self.optimizer_steps == 1:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # (once an epoch)
            self.timed_start, self.timed_images = time.perf_counter(), 0

    def images_per_s(self):
        """This rank's training throughput so far in the epoch (first step excluded), or None after one step."""
        return self.timed_images / (time.perf_counter() - self.timed_start) if self.timed_images else None

    def summary(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        end = time.perf_counter()
        timed_s = end - self.timed_start if self.timed_start is not None else 0.0
        reads = [0, 0] if self.reads is None else self.reads.tolist()
        totals = torch.cat([self.sums, torch.tensor([self.images, self.timed_images, self.data_s, *reads],
                                                    dtype=torch.float64, device=self.device)])
        longest = torch.tensor([end - self.start, timed_s, 0, self.reads is None], dtype=torch.float64,
                               device=self.device)  # (the last: a rank that did not count its loading)
        if self.skipped is not None:
            longest[2] += self.skipped  # (every rank of a DDP job skips the same steps: the most is the count)
        world_size = processes = 1
        if dist.is_initialized():
            dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=self.group)
            dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=self.group)  # as long as its slowest rank
            world_size, processes = dist.get_world_size(self.group), dist.get_world_size()
        loss_sum, top1, top5, images, timed_images, data_s, read_bytes, read_calls = totals.tolist()
        epoch_s, timed_s, skipped, uncounted = longest.tolist()
        images_per_s = timed_images / timed_s if timed_images else images / max(epoch_s, 1e-9)
        n = max(images, 1)
        return {"loss": loss_sum / n, "top1": 100 * top1 / n, "top5": 100 * top5 / n,
                "images": int(images), "top1_correct": int(top1), "images_per_s": images_per_s,
                "process_images_per_s": images_per_s / processes,  # (every process of the run, whatever its role)
                "data_s": data_s / world_size, "epoch_s": epoch_s,
                "skipped_steps": None if self.skipped is None else int(skipped),
                "read_mb": None if uncounted else read_bytes / 1e6,  # every rank's loading, added up
                "read_calls": None if uncounted else int(read_calls)}


@torch.no_grad()
def evaluate(model, loader, criterion, device, log, autocast=contextlib.nullcontext, group=None, to_device=None):
    """Exact evaluation: each rank (of group, default all) scores its shard, then the counts are summed.
    to_device: (images, target) -> on the device, as data.device_transform(train=False) makes it.

    Pass the unwrapped model: shards may differ by one batch, and a DDP
    wrapper must not be called a different number of times on different ranks.
    A sharded model (fully_shard) gathers each block's weights from every rank in
    every forward, so there every rank runs as many batches as the longest shard,
    the extra ones empty.
    """
    model.eval()
    meter = EpochMeter(device, group)
    read = data.reads_from_now(loader)
    batches = log.progress(loader, "validate")
    if any(isinstance(p, DTensor) for p in model.parameters()):
        batches = _in_lockstep(batches, len(loader), loader.dataset, device, group)
    for images, target in batches:
        meter.data_ready()
        images, target = to_device(images, target)
        with autocast():
            output = model(images)
            loss = criterion(output, target)
        if len(target):
            meter.update(loss.float(), output.float(), target)
    sharding.reshard(model)  # (a no-op unless sharded)
    meter.reads = read()
    return meter.summary()


def _in_lockstep(batches, length, dataset, device, group):
    """The batches, then empty ones until every rank has run as many as the longest shard's."""
    longest = torch.tensor(length, device=device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
    images = None
    for images, target in batches:
        yield images, target
    if images is None:  # an empty shard (fewer images than ranks): the shape of one image of the set
        image, label = dataset.dataset[0] if isinstance(dataset, torch.utils.data.Subset) else dataset[0]
        images = [image] if image.ndim == 1 else image.unsqueeze(0)  # (--decoder gpu: a list of files' bytes)
        target = torch.tensor([label])
    for _ in range(int(longest) - length):
        yield images[:0], target[:0]


def evaluate_ema(ema, loader, criterion, device, log, autocast=contextlib.nullcontext, group=None, to_device=None):
    """--ema-decay: the averaged model's exact evaluation; None without it."""
    return None if ema is None else evaluate(ema.module, loader, criterion, device, log, autocast, group, to_device)
