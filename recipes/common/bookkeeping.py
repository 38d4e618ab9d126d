"""The bookkeeping around a recipe's training loop, so that the loop shows only the lesson.

A recipe hands its training objects to a Run once, then calls it by name:

    run.resume()                                  # --resume, or --auto-resume's checkpoint
    for epoch in run.epochs():                    # where a checkpoint stopped, to --epochs
        ...
        for images, target in run.batches(loader):    # the epoch's batches; a new run.meter
            ... forward, backward, step ...
            run.step_done(loss)                       # after each optimizer step, once per batch
        ...
        if run.end_epoch(train_stats, val_loader):    # evaluate, log, save; True at --desired-acc
            break
    run.finish(val_loader)                        # summary.json

The Run holds the position (epoch and step, from checkpoint.Checkpoint), the
per-epoch meter, the learning-rate schedule, the EMA, the logs, the profiler,
and the stop checks (SIGTERM, a non-finite loss). Every rank calls every method
at the same points: some of them talk to the other ranks.
"""

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from recipes.common import checkpoint, data, distributed, faults, metrics, models, schedule, sharding


class Run:
    def __init__(self, args, log, device, model, optimizer, scheduler, ema, num_classes, global_batch,
                 steps_per_epoch, scaler=None, autocast=contextlib.nullcontext, group=None, control=None, gather=None,
                 seed_rank=None):
        """model: the unwrapped model (the one checkpoints and evaluation use); ema: None without --ema-decay;
        scaler: a GradScaler, saved with the checkpoint; autocast: what evaluation runs under; group and control:
        the ranks that run the Run together (default: all; the parameter server's servers), as a device group
        and a gloo group (distributed.new_group, new_control_group); gather: called by them before each
        evaluation and save, to put the model together (the parameter server's, from the servers' shards);
        seed_rank: the rank whose random draws (augmentations) this one makes (default: its own; the
        pipeline's replica r draws ddp's rank r's)."""
        self.args, self.log, self.device, self.autocast = args, log, device, autocast
        self.model, self.optimizer, self.scheduler, self.ema = model, optimizer, scheduler, ema
        self.scaler, self.scale = scaler, None  # (the loss scale after the last step: skipped_step)
        self.accum_steps, self.steps_per_epoch = args.accum_steps, steps_per_epoch
        self.group, self.gather = group, gather
        self.control = control if group is not None else distributed.control_group()
        self.checkpoint = checkpoint.Checkpoint(args, model, optimizer, scheduler, ema, scaler,
                                                num_classes=num_classes, global_batch=global_batch,
                                                steps_per_epoch=steps_per_epoch, device=device, group=self.control)
        self.stop_check = faults.StopCheck(steps_per_epoch, self.control)
        # (images, target) -> on the device: uint8 images to normalised float there (data.device_transform)
        self.to_device = data.device_transform(args, device, num_classes, train=True)
        self.val_to_device = data.device_transform(args, device, num_classes, train=False)
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.seed_rank = self.rank if seed_rank is None else seed_rank
        self.epoch, self.step, self.first_step, self.epoch_lr = 0, 0, 0, 0.0
        self.meter = self.val_stats = self.ema_stats = None

    def resume(self):
        """--resume, or <out>/checkpoint.pt with --auto-resume: weights, optimizer, scaler, EMA, schedule,
        epoch and step, best top-1, random state."""
        self.checkpoint.resume(self.log)

    def describe(self, train_set, val_set):
        """What this run does, for its first line."""
        decoded_by = data.decoded_by(self.args)
        classes = f"{self.checkpoint.num_classes} classes" + (f" (decoded by {decoded_by})" if decoded_by else "")
        images = "images"
        if isinstance(val_set, data.MaskedTokens):  # a text: sequences, and a vocabulary for classes
            images = f"sequences of {val_set.sequences.shape[1]} tokens ({val_set.masked} masked)"
            classes = f"a vocabulary of {self.checkpoint.num_classes}"
        shards = [len(split.shards) for split in (train_set, val_set) if isinstance(split, data.TarShards)]
        if self.args.evaluate:
            in_shards = f" in {shards[-1]} tar shards" if shards else ""
            return f"evaluating {self.args.arch} on {len(val_set)} val {images}{in_shards} of {classes}"
        in_shards = f" in {shards[0]} / {shards[1]} tar shards" if len(shards) == 2 else ""
        return (f"{self.args.arch}, {len(train_set)} train / {len(val_set)} val {images}{in_shards} of {classes}, "
                f"global batch "
                f"{self.checkpoint.global_batch}, lr {self.optimizer.param_groups[0]['initial_lr']:g}, "
                f"{schedule.describe(self.args)}")

    def epochs(self):
        """The epochs still to train, from where the checkpoint stopped; none with --evaluate.

        Starts metrics.csv (kept up to a resumed epoch), the profiler, and the SIGTERM
        handler; reseeds each epoch (a run resumed mid-epoch keeps the checkpoint's
        random state instead).
        """
        if self.args.evaluate:
            return
        start_epoch, start_step = self.checkpoint.epoch, self.checkpoint.step
        self.log.start_metrics(start_epoch)
        self.log.start_profiler(self.args.profile, self.device)
        faults.catch_sigterm(self.args.out, dist.get_rank() if dist.is_initialized() else 0)  # from here on,
        # SIGTERM means: save after the current step, then exit
        for epoch in range(start_epoch, self.args.epochs):
            self.epoch, self.first_step = epoch, start_step if epoch == start_epoch else 0
            if not self.first_step:
                data.set_seed(self.args.seed, epoch, self.seed_rank)
            self.epoch_lr = self.lr()
            yield epoch

    def lr(self):
        """The learning rate of the optimizer that steps, as its schedule set it: the pipeline's stage and the
        parameter server's shard step an optimizer of their own, beside the checkpoint's (self.optimizer)."""
        return self.scheduler.get_last_lr()[0]

    def batches(self, loader):
        """This epoch's batches of the loader (resumed mid-epoch: only those not yet trained on), behind a
        progress bar; starts a new self.meter (at once: a rank may end its epoch before it takes a batch) and
        times the wait for each batch. The step count moves on when the next batch is asked for: call step_done
        once for every batch."""
        self.meter = metrics.EpochMeter(self.device, self.group)
        self.step = self.first_step
        return self._batches(loader)

    def _batches(self, loader):
        if isinstance(getattr(loader, "sampler", None), data.EpochShuffle):  # the loader's own shuffle
            loader.sampler.set_epoch(self.epoch)
        batches = data.skip_batches(loader, self.first_step)  # the skipped images are never loaded
        read = data.reads_from_now(loader)  # (what loading them asks of the storage)
        for batch in self.log.progress(batches, f"epoch {self.epoch + 1}/{self.args.epochs}"):
            self.meter.data_ready()
            yield batch
            self.meter.waiting()  # the next batch is asked for
            self.step += 1
        self.meter.reads = read()

    def step_done(self, loss, stop_checks_every=1):
        """After each optimizer step: schedule, EMA, logs, profiler, a checkpoint every --save-every steps;
        and the stop checks: after SIGTERM on any rank, save and raise faults.Preempted; after a
        non-finite loss on any rank, raise RunFailed (both agreed at the next check, without waiting for the
        device: faults.StopCheck). The checks are a collective of every rank: stop_checks_every=k checks
        at every k-th step of an epoch (the pipeline's AD-PSGD, whose replicas meet only in pairs), None leaves
        them to the epoch's end, where ranks that meet at no step meet (the pipeline's partial reduce)."""
        args, step = self.args, self.step
        self.meter.optimizer_step(self.skipped_step())
        if step % args.print_freq == 0:
            self.log.step(self.epoch, step, self.steps_per_epoch, loss, self.lr(), self.meter.images_per_s(),
                          self.world_size)
        self.scheduler.step()  # every step: warmup and cosine move within an epoch
        if self.ema is not None:
            models.update_ema(self.ema, self.model)  # ema = d x ema + (1 - d) x weights
        self.log.profile_step()
        if stop_checks_every and self.stop_check.after_step(loss, self.epoch, step, stop_checks_every):  # SIGTERM
            self.save_mid_epoch(step + 1)
            raise faults.preempted_after_saving(args.out, self.epoch, step + 1)
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < self.steps_per_epoch:
            self.save_mid_epoch(step + 1)

    def skipped_step(self):
        """Whether the loss scaler skipped the step just taken (its gradients overflowed): GradScaler's scale, kept
        on the device, fell at update(). Read there, not on the host: no synchronisation. False without loss
        scaling; None for apex.amp's scaler, which counts its own."""
        if not isinstance(self.scaler, torch.amp.GradScaler):
            return None if self.scaler is not None else False
        if not self.scaler.is_enabled():  # (bf16, fp32)
            return False
        scale = self.scaler._scale  # (GradScaler's device tensor: get_scale() would wait for the device)
        before = self.scale if self.scale is not None else self.scaler._init_scale  # (the first: where it began)
        self.scale = scale.clone()
        return scale < before

    def save_mid_epoch(self, step):
        """checkpoint.pt after `step` steps of this epoch (the model gathered first, where it is sharded)."""
        if self.gather is not None:
            self.gather()
        self.checkpoint.save(self.epoch, step)

    def evaluate(self, val_loader):
        """Exact evaluation of the model, and of the EMA model with --ema-decay (plain cross-entropy); the
        epoch's checkpoint, saved after it, holds the model as gathered here."""
        criterion = nn.CrossEntropyLoss()
        if self.gather is not None:
            self.gather()
        else:
            distributed.broadcast_buffers(self.model, self.group, self.control)
            if self.ema is not None:
                distributed.broadcast_buffers(self.ema, self.group, self.control)
        self.val_stats = metrics.evaluate(self.model, val_loader, criterion, self.device, self.log, self.autocast,
                                          self.group, self.val_to_device)
        self.ema_stats = metrics.evaluate_ema(self.ema, val_loader, criterion, self.device, self.log, self.autocast,
                                              self.group, self.val_to_device)

    def end_epoch(self, train_stats, val_loader):
        """Evaluate, log the epoch, save checkpoint.pt (and best.pt); True once --desired-acc is reached. First the
        stop checks of the epoch's last steps, where every rank meets: after a SIGTERM, save and stop."""
        if self.stop_check.at_epoch_end(self.epoch):
            self.save_mid_epoch(self.steps_per_epoch)
            raise faults.preempted_after_saving(self.args.out, self.epoch, self.steps_per_epoch)
        epoch, lr = self.epoch + 1, self.epoch_lr  # epochs count from 1 in logs
        self.evaluate(val_loader)
        self.log.epoch(epoch, "train", train_stats, lr)
        self.log.epoch(epoch, "val", self.val_stats, lr)
        self.log.epoch(epoch, "val_ema", self.ema_stats, lr)
        top1 = self.val_stats["top1"]
        is_best = top1 > self.checkpoint.best_top1
        self.checkpoint.best_top1 = max(self.checkpoint.best_top1, top1)
        self.checkpoint.save(epoch, 0, is_best)
        desired = self.args.desired_acc
        if desired is not None and top1 >= 100 * desired:
            self.log.print(f"reached --desired-acc {desired:g}: top-1 {top1:.2f} %")
            return True
        return False

    def finish(self, val_loader, **extra):
        """summary.json, evaluating first when no epoch ran (-e, or a resumed run that had finished);
        extra: a recipe's own results."""
        if self.val_stats is None:
            self.evaluate(val_loader)
        processes = dist.get_world_size() if dist.is_initialized() else 1  # (all of them: servers, stages too)
        if self.gather is None:  # (ps' and the pipeline's model is put together from every rank's: not this rank's)
            extra = {"memory": sharding.memory_of_this_rank(self.model, self.optimizer, self.device), **extra}
        self.log.finish(self.args, self.val_stats, self.checkpoint.epoch, processes, self.checkpoint.global_batch,
                        self.device, self.checkpoint.best_top1, self.ema_stats, **extra)
