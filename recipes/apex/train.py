"""DDP with mixed precision: native torch.amp, with apex's --opt-level names.

    torchrun --nproc_per_node=2 recipes/apex/train.py data/mnist5k -a resnet18 -b 64 --opt-level O1

Compared with recipes/ddp/train.py, mixed precision adds autocast around the
forward pass and loss (matmuls and convolutions in fp16/bf16, reductions in
fp32), and for fp16 a GradScaler, which multiplies the loss so that small
gradients do not underflow to zero, then unscales them and skips any step
whose gradients overflowed. bf16 has fp32's range and needs no scaler.

apex's --opt-level names, mapped onto torch.amp (recipes/common/amp.py):
    O0  fp32, no autocast
    O1  autocast(--amp-dtype), plus GradScaler for fp16
    O2  as O1: autocast keeps fp32 weights as apex's "master weights" and casts per op
    O3  model.to(--amp-dtype), no fp32 copy, no scaler: a speed baseline that may diverge
--amp-backend apex uses NVIDIA apex.amp itself where it is still installed.
"""

import contextlib
import functools

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from recipes.common import amp, checkpoint, cli, data, distributed, faults, metrics, models, runlog, schedule


def parse_args(argv=None):
    parser = cli.build_parser("apex", __doc__)
    cli.add_distributed_args(parser)
    cli.add_amp_args(parser)
    return cli.parse_args(parser, argv)


def train_one_epoch(model, loader, criterion, optimizer, scheduler, ema, scaler, autocast, device, epoch, first_step,
                    save, log, args):
    model.train()
    meter = metrics.EpochMeter(device)
    batches = data.skip_batches(loader, first_step)  # resumed mid-epoch: only the batches not yet trained on
    for step, (images, target) in enumerate(log.progress(batches, f"epoch {epoch + 1}/{args.epochs}"), first_step):
        meter.data_ready()
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)  # class indices, or mixup/cutmix soft targets
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad(set_to_none=True)
        micro_batches = zip(images.chunk(args.accum_steps), target.chunk(args.accum_steps))  # --accum-steps
        for i, (micro_images, micro_target) in enumerate(micro_batches):
            # DDP allreduces in a backward pass; no_sync skips it, so only the step's last micro-batch communicates
            with model.no_sync() if i < args.accum_steps - 1 else contextlib.nullcontext():
                with autocast():  # low precision where it is safe, fp32 where it is not
                    output = model(micro_images)
                    loss = criterion(output, micro_target)
                scaler.scale(loss / args.accum_steps).backward()  # DDP averages the (scaled) gradients here
            meter.update(loss, output, micro_target)
        scaler.step(optimizer)  # unscales; skips the step if a gradient is inf or NaN
        scaler.update()  # halves the scale after an overflow, doubles it after 2000 clean steps
        if step % args.print_freq == 0:
            log.step(epoch * len(loader) + step, loss, optimizer.param_groups[0]["lr"])
        scheduler.step()  # every step: warmup and cosine move within an epoch
        if ema is not None:
            ema.update_parameters(model)  # ema = d x ema + (1 - d) x weights
        log.profile_step()
        if faults.should_stop(loss, epoch, step, args.print_freq):  # SIGTERM on any rank: all stop after this step
            save(epoch, step + 1)
            raise faults.Preempted(args.out, epoch, step + 1)
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < len(loader):
            save(epoch, step + 1)
    return meter.summary()


def main(args):
    ctx = distributed.init_distributed_mode(args)
    device = ctx.device
    log = runlog.RunLog(args, enabled=ctx.is_main)  # only rank 0 prints and writes files

    train_set, val_set, num_classes = data.build_datasets(args)
    train_sampler = DistributedSampler(train_set, seed=args.seed or 0)  # rank r gets every world_size-th image
    train_loader = data.train_loader(train_set, args, train_sampler, num_classes)
    val_loader = data.val_loader(val_set, args, ctx.rank, ctx.world_size)

    opt_level, amp_dtype = amp.resolve(args, device, log)
    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if opt_level == "O3" and args.amp_backend == "native":  # pure low precision: no fp32 weights at all
        model = model.to(amp_dtype)
    if args.sync_bn and device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif args.sync_bn:
        log.print("warning: --sync-bn ignored: SyncBatchNorm runs only on CUDA; each process keeps its own "
                  "BatchNorm statistics")
    ema = models.build_ema(model, args.ema_decay)  # None without --ema-decay
    global_batch = args.batch_size * ctx.world_size * args.accum_steps
    lr = args.lr * global_batch / 256  # linear scaling rule: --lr is for a global batch of 256
    criterion = nn.CrossEntropyLoss()  # validation
    train_criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay)
    if args.amp_backend == "apex":  # the original: apex.amp patches the model and the optimizer
        apex_amp = amp.import_apex_amp()
        model, optimizer = apex_amp.initialize(model, optimizer, opt_level=opt_level)
        scaler, use_autocast = amp.ApexLossScaler(apex_amp, optimizer), False
    else:
        scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16 and opt_level in ("O1", "O2"))
        use_autocast = opt_level != "O0"
    autocast = functools.partial(torch.autocast, device.type, dtype=amp_dtype, enabled=use_autocast)
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=len(train_loader))

    def save(epoch, step, is_best=False):  # every rank calls it (it gathers random states); rank 0 writes
        faults.check_finite(model, epoch, step)  # a diverged run stops here rather than save NaN weights
        state = {"recipe": args.recipe, "arch": args.arch, "num_classes": num_classes, "epoch": epoch,
                 "step": step, "global_batch": global_batch, "best_top1": best_top1, "model": model.state_dict(),
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "scaler": scaler.state_dict(), "ema": ema.state_dict() if ema else None,
                 "rng": checkpoint.rng_states()}
        if ctx.is_main:
            checkpoint.save(state, args.out, is_best)

    start_epoch, start_step, best_top1 = 0, 0, 0.0
    resume_from = checkpoint.resume_path(args)  # --resume, or <out>/checkpoint.pt with --auto-resume
    if resume_from:  # every rank loads the checkpoint onto its own device
        start_epoch, start_step, best_top1 = checkpoint.resume(resume_from, device, args.arch, num_classes, model,
                                                               optimizer, scheduler, scaler, global_batch=global_batch,
                                                               ema=ema, steps_per_epoch=len(train_loader))
        log.print(f"resuming {resume_from}: {start_epoch} epoch(s) and {start_step} step(s) done, "
                  f"best top-1 {best_top1:.2f} %")
    if args.evaluate:
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log, autocast)
        ema_stats = metrics.evaluate_ema(ema, val_loader, criterion, device, log, autocast)
        log.finish(args, val_stats, start_epoch, ctx.world_size, device, best_top1, ema_stats)
        distributed.cleanup()
        return
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if device.type == "cuda" else None)
    train_model = models.compile_model(ddp_model, device, args.compile)  # --compile: the training forward and backward

    log.start_metrics(start_epoch)
    log.start_profiler(args.profile, device)
    log.print(f"apex: {ctx.world_size} process(es) on {device} ({ctx.backend}), {args.arch}, "
              f"opt level {opt_level} ({'fp32' if opt_level == 'O0' else amp_dtype}, {args.amp_backend}), "
              f"{len(train_set)} train / {len(val_set)} val images, global batch {global_batch}, lr {lr:g}, "
              f"{schedule.describe(args)}")
    faults.catch_sigterm()  # from here on, SIGTERM means: save after the current step, then exit
    epoch, val_stats = start_epoch - 1, None
    for epoch in range(start_epoch, args.epochs):
        first_step = start_step if epoch == start_epoch else 0
        if not first_step:  # (resumed mid-epoch, the checkpoint restored the random state)
            data.set_seed(args.seed, epoch, ctx.rank)
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        epoch_lr = optimizer.param_groups[0]["lr"]
        train_stats = train_one_epoch(train_model, train_loader, train_criterion, optimizer, scheduler, ema, scaler,
                                      autocast, device, epoch, first_step, save, log, args)
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log, autocast)
        ema_stats = metrics.evaluate_ema(ema, val_loader, criterion, device, log, autocast)
        log.epoch(epoch + 1, "train", train_stats, epoch_lr)
        log.epoch(epoch + 1, "val", val_stats, epoch_lr)
        log.epoch(epoch + 1, "val_ema", ema_stats, epoch_lr)

        is_best = val_stats["top1"] > best_top1
        best_top1 = max(best_top1, val_stats["top1"])
        save(epoch + 1, 0, is_best)
        if args.desired_acc is not None and val_stats["top1"] >= 100 * args.desired_acc:
            log.print(f"reached --desired-acc {args.desired_acc:g}: top-1 {val_stats['top1']:.2f} %")
            break
    if val_stats is None:  # resumed a run that had already finished
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log, autocast)
        ema_stats = metrics.evaluate_ema(ema, val_loader, criterion, device, log, autocast)
    log.finish(args, val_stats, epoch + 1, ctx.world_size, device, best_top1, ema_stats)
    distributed.cleanup()


if __name__ == "__main__":
    distributed.launch(main, parse_args)
