"""Gradient compression: DDP that sends fewer bytes per gradient, through a communication hook.

    torchrun --nproc_per_node=2 recipes/compression/train.py data/mnist5k -a resnet18 -b 32 --compress fp8-e4m3

Compared with recipes/ddp/train.py, it registers one DDP communication hook
(--compress, see hooks.py: compress, communicate, decompress, average) and logs
what the hook sent: bytes per step, and the compression ratio against fp32.
"""

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from recipes.common import RecipeError, checkpoint, cli, data, distributed, faults, metrics, models, runlog, schedule
from recipes.compression import hooks


def parse_args(argv=None):
    parser = cli.build_parser("compression", __doc__)
    cli.add_distributed_args(parser)
    group = parser.add_argument_group("gradient compression")
    group.add_argument("--compress", choices=hooks.METHODS, default="none",
                       help="how gradients travel (default: none, DDP's fp32 allreduce)")
    group.add_argument("--powersgd-rank", type=int, default=2, help="rank r of PowerSGD's P and Q (default: 2)")
    group.add_argument("--error-feedback", action="store_true",
                       help="add what compression lost in one step to the next step's gradient")
    args = cli.parse_args(parser, argv)
    if args.powersgd_rank < 1:
        raise RecipeError(f"--powersgd-rank must be at least 1, got {args.powersgd_rank}")
    if args.error_feedback and args.compress == "none":
        raise RecipeError("--error-feedback needs --compress: uncompressed gradients lose nothing to feed back")
    return args


def train_one_epoch(model, loader, criterion, optimizer, scheduler, ema, device, epoch, first_step, save, log, args):
    model.train()
    meter = metrics.EpochMeter(device)
    batches = data.skip_batches(loader, first_step)  # resumed mid-epoch: only the batches not yet trained on
    for step, (images, target) in enumerate(log.progress(batches, f"epoch {epoch + 1}/{args.epochs}"), first_step):
        meter.data_ready()
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)  # class indices, or mixup/cutmix soft targets
        optimizer.zero_grad(set_to_none=True)
        micro_batches = zip(images.chunk(args.accum_steps), target.chunk(args.accum_steps))  # --accum-steps
        for i, (micro_images, micro_target) in enumerate(micro_batches):
            # DDP allreduces in a backward pass; no_sync skips it, so only the step's last micro-batch communicates
            with model.no_sync() if i < args.accum_steps - 1 else contextlib.nullcontext():
                output = model(micro_images)
                loss = criterion(output, micro_target)
                (loss / args.accum_steps).backward()  # DDP averages gradients across ranks here, during backward
            meter.update(loss, output, micro_target)
        optimizer.step()
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

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes).to(device)
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
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=len(train_loader))

    def save(epoch, step, is_best=False):  # every rank calls it (it gathers random states); rank 0 writes
        faults.check_finite(model, epoch, step)  # a diverged run stops here rather than save NaN weights
        state = {"recipe": args.recipe, "arch": args.arch, "num_classes": num_classes, "epoch": epoch,
                 "step": step, "global_batch": global_batch, "best_top1": best_top1, "model": model.state_dict(),
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "scaler": None, "ema": ema.state_dict() if ema else None,
                 "rng": checkpoint.rng_states()}
        if ctx.is_main:
            checkpoint.save(state, args.out, is_best)

    start_epoch, start_step, best_top1 = 0, 0, 0.0
    resume_from = checkpoint.resume_path(args)  # --resume, or <out>/checkpoint.pt with --auto-resume
    if resume_from:  # every rank loads the checkpoint onto its own device
        start_epoch, start_step, best_top1 = checkpoint.resume(resume_from, device, args.arch, num_classes, model,
                                                               optimizer, scheduler, global_batch=global_batch,
                                                               ema=ema, steps_per_epoch=len(train_loader))
        log.print(f"resuming {resume_from}: {start_epoch} epoch(s) and {start_step} step(s) done, "
                  f"best top-1 {best_top1:.2f} %")
    if args.evaluate:
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log)
        ema_stats = metrics.evaluate_ema(ema, val_loader, criterion, device, log)
        log.finish(args, val_stats, start_epoch, ctx.world_size, device, best_top1, ema_stats)
        distributed.cleanup()
        return
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if device.type == "cuda" else None)
    traffic = hooks.register(ddp_model, args.compress, args.powersgd_rank, args.error_feedback)
    train_model = models.compile_model(ddp_model, device, args.compile)  # --compile: the training forward and backward

    log.start_metrics(start_epoch)
    log.start_profiler(args.profile, device)
    log.print(f"compression: {ctx.world_size} process(es) on {device} ({ctx.backend}), {args.arch}, "
              f"{len(train_set)} train / {len(val_set)} val images, global batch {global_batch}, lr {lr:g}, "
              f"{schedule.describe(args)}, "
              f"--compress {args.compress}{' with error feedback' if args.error_feedback else ''}")
    faults.catch_sigterm()  # from here on, SIGTERM means: save after the current step, then exit
    epoch, val_stats = start_epoch - 1, None
    bytes_per_step = compression_ratio = None  # (resumed a finished run: nothing sent)
    for epoch in range(start_epoch, args.epochs):
        first_step = start_step if epoch == start_epoch else 0
        if not first_step:  # (resumed mid-epoch, the checkpoint restored the random state)
            data.set_seed(args.seed, epoch, ctx.rank)
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        epoch_lr = optimizer.param_groups[0]["lr"]
        sent_before = traffic.snapshot()
        train_stats = train_one_epoch(train_model, train_loader, train_criterion, optimizer, scheduler, ema, device,
                                      epoch, first_step, save, log, args)
        bytes_per_step, compression_ratio = traffic.since(sent_before)
        log.scalars(epoch + 1, {"comm/bytes_per_step": bytes_per_step, "comm/compression_ratio": compression_ratio})
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log)
        ema_stats = metrics.evaluate_ema(ema, val_loader, criterion, device, log)
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
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log)
        ema_stats = metrics.evaluate_ema(ema, val_loader, criterion, device, log)
    log.finish(args, val_stats, epoch + 1, ctx.world_size, device, best_top1, ema_stats,
               bytes_per_step=bytes_per_step, compression_ratio=compression_ratio)
    distributed.cleanup()


if __name__ == "__main__":
    distributed.launch(main, parse_args)
