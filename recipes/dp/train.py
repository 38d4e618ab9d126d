"""torch.nn.DataParallel: one process splits each batch across all visible GPUs.

    python recipes/dp/train.py data/mnist5k -a resnet18 -b 64

Compared with recipes/nd/train.py, DataParallel adds one wrapper. Each step it
copies the model to every GPU, scatters the batch, and gathers outputs and
gradients back on the first GPU: simple, but one Python process and GPU 0 do
all the coordination, so it scales worse than DDP (recipes/ddp). Without CUDA
it runs the model on one device.
"""

import torch
from torch import nn

from recipes.common import checkpoint, cli, data, faults, metrics, models, runlog, schedule


def parse_args(argv=None):
    parser = cli.build_parser("dp", __doc__)
    return cli.parse_args(parser, argv)


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
        for micro_images, micro_target in micro_batches:
            output = model(micro_images)
            loss = criterion(output, micro_target)
            (loss / args.accum_steps).backward()  # gradients of every replica are summed onto the first GPU
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
    device = cli.default_device()
    log = runlog.RunLog(args)

    train_set, val_set, num_classes = data.build_datasets(args)
    train_sampler = data.shuffle_sampler(train_set, args.seed)
    train_loader = data.train_loader(train_set, args, train_sampler, num_classes)
    val_loader = data.val_loader(val_set, args)

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes).to(device)
    ema = models.build_ema(model, args.ema_decay)  # None without --ema-decay
    global_batch = args.batch_size * args.accum_steps  # DataParallel splits it across the GPUs
    lr = args.lr * global_batch / 256  # linear scaling rule: --lr is for a global batch of 256
    criterion = nn.CrossEntropyLoss()  # validation
    train_criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=len(train_loader))

    def save(epoch, step, is_best=False):  # at epoch ends, and mid-epoch from the loop
        faults.check_finite(model, epoch, step)  # a diverged run stops here rather than save NaN weights
        state = {"recipe": args.recipe, "arch": args.arch, "num_classes": num_classes, "epoch": epoch,
                 "step": step, "global_batch": global_batch, "best_top1": best_top1, "model": model.state_dict(),
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "scaler": None, "ema": ema.state_dict() if ema else None,
                 "rng": checkpoint.rng_states()}
        checkpoint.save(state, args.out, is_best)

    start_epoch, start_step, best_top1 = 0, 0, 0.0
    resume_from = checkpoint.resume_path(args)  # --resume, or <out>/checkpoint.pt with --auto-resume
    if resume_from:
        start_epoch, start_step, best_top1 = checkpoint.resume(resume_from, device, args.arch, num_classes, model,
                                                               optimizer, scheduler, global_batch=global_batch,
                                                               ema=ema, steps_per_epoch=len(train_loader))
        log.print(f"resuming {resume_from}: {start_epoch} epoch(s) and {start_step} step(s) done, "
                  f"best top-1 {best_top1:.2f} %")
    if args.evaluate:
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log)
        ema_stats = metrics.evaluate_ema(ema, val_loader, criterion, device, log)
        log.finish(args, val_stats, start_epoch, 1, device, best_top1, ema_stats)
        return
    dp_model = nn.DataParallel(model)  # all visible GPUs
    train_model = models.compile_model(dp_model, device, args.compile)  # --compile: the training forward and backward
    if torch.cuda.device_count() < 2:
        log.print(f"note: DataParallel sees {torch.cuda.device_count()} GPU(s): it runs on one device ({device})")

    log.start_metrics(start_epoch)
    log.start_profiler(args.profile, device)
    log.print(f"dp: 1 process, {max(torch.cuda.device_count(), 1)} device(s), {args.arch}, "
              f"{len(train_set)} train / {len(val_set)} val images, global batch {global_batch}, lr {lr:g}, "
              f"{schedule.describe(args)}")
    faults.catch_sigterm()  # from here on, SIGTERM means: save after the current step, then exit
    epoch, val_stats = start_epoch - 1, None
    for epoch in range(start_epoch, args.epochs):
        first_step = start_step if epoch == start_epoch else 0
        if not first_step:  # (resumed mid-epoch, the checkpoint restored the random state)
            data.set_seed(args.seed, epoch)
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch
        epoch_lr = optimizer.param_groups[0]["lr"]
        train_stats = train_one_epoch(train_model, train_loader, train_criterion, optimizer, scheduler, ema, device,
                                      epoch, first_step, save, log, args)
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
    log.finish(args, val_stats, epoch + 1, 1, device, best_top1, ema_stats)


if __name__ == "__main__":
    cli.run(main, parse_args)
