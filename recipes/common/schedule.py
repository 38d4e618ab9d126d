"""Learning-rate schedules, stepped after every optimizer step rather than every epoch."""

import functools
import math
import warnings

import torch


def lr_factor(step, steps_per_epoch, args):
    """The multiple of the base learning rate that optimizer step `step` (from 0, counted over the
    whole run) uses: linear warmup, then the step or the cosine schedule."""
    if steps_per_epoch == 0:  # (-e: no training steps, no schedule)
        return 1.0
    # past the run's last step the rate stays at that step's: a replica that takes more than its share of the
    # last epoch (the pipeline's partial reduce) must not climb back up the cosine
    step = min(step, args.epochs * steps_per_epoch - 1)
    warmup_steps = round(args.warmup_epochs * steps_per_epoch)
    if step < warmup_steps:  # lr/W, 2 lr/W, ..., lr: large-batch training starts gently (Goyal et al.)
        return (step + 1) / warmup_steps
    if args.lr_schedule == "cosine":  # half a cosine from lr just after warmup to 0 at the end of the run
        decay_steps = max(args.epochs * steps_per_epoch - warmup_steps, 1)
        return 0.5 * (1 + math.cos(math.pi * (step - warmup_steps) / decay_steps))
    epoch = step / steps_per_epoch
    return 0.1 ** sum(epoch >= milestone for milestone in args.lr_steps)


def build_scheduler(optimizer, args, steps_per_epoch):
    """A LambdaLR over lr_factor: call scheduler.step() after each optimizer.step()."""
    # GradScaler skips optimizer.step() when fp16 gradients overflow (often at the first step); torch would
    # then warn on every rank as if the schedule were stepped before the optimizer by mistake
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(lr_factor, steps_per_epoch=steps_per_epoch,
                                                                          args=args))


def describe(args):
    """The schedule in words, for a run's first line."""
    warmup = f" after {args.warmup_epochs:g} warmup epoch(s)" if args.warmup_epochs else ""
    if args.lr_schedule == "cosine":
        return f"cosine schedule{warmup}"
    return f"x0.1 at epoch(s) {' '.join(f'{m:g}' for m in args.lr_steps)}{warmup}"
