"""Single device: no data parallelism, the baseline the other recipes build on.

    python recipes/nd/train.py data/mnist5k -a resnet18 -b 64

Runs on the first GPU when there is one, else on the CPU.
"""

import torch
from torch import nn

from recipes.common import checkpoint, cli, data, metrics, models, runlog


def parse_args(argv=None):
    parser = cli.build_parser("nd", __doc__)
    return cli.parse_args(parser, argv)


def train_one_epoch(model, loader, criterion, optimizer, device, epoch, log, args):
    model.train()
    meter = metrics.EpochMeter(device)
    for step, (images, target) in enumerate(log.progress(loader, f"epoch {epoch + 1}/{args.epochs}")):
        meter.data_ready()
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        meter.update(loss, output, target)
        if step % args.print_freq == 0:
            log.step(epoch * len(loader) + step, loss)
    return meter.summary()


def main(args):
    device = cli.default_device()
    log = runlog.RunLog(args)

    train_set, val_set, num_classes = data.build_datasets(args)
    train_sampler = data.shuffle_sampler(train_set, args.seed)
    train_loader = data.train_loader(train_set, args, train_sampler)
    val_loader = data.val_loader(val_set, args)

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes).to(device)
    global_batch = args.batch_size
    lr = args.lr * global_batch / 256  # linear scaling rule: --lr is for a global batch of 256
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    start_epoch, best_top1 = 0, 0.0
    if args.resume:
        start_epoch, best_top1 = checkpoint.resume(args.resume, device, args.arch, num_classes,
                                                   model, optimizer, scheduler)
    if args.evaluate:
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log)
        log.finish(args, val_stats, start_epoch, 1, device, best_top1)
        return

    log.start_metrics(start_epoch)
    log.print(f"nd: 1 process on {device}, {args.arch}, "
              f"{len(train_set)} train / {len(val_set)} val images, global batch {global_batch}, lr {lr:g}")
    epoch, val_stats = start_epoch - 1, None
    for epoch in range(start_epoch, args.epochs):
        data.set_seed(args.seed, epoch)
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch
        epoch_lr = optimizer.param_groups[0]["lr"]
        train_stats = train_one_epoch(model, train_loader, criterion, optimizer, device, epoch, log, args)
        scheduler.step()
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log)
        log.epoch(epoch + 1, "train", train_stats, epoch_lr)
        log.epoch(epoch + 1, "val", val_stats, epoch_lr)

        is_best = val_stats["top1"] > best_top1
        best_top1 = max(best_top1, val_stats["top1"])
        state = {"recipe": args.recipe, "arch": args.arch, "num_classes": num_classes, "epoch": epoch + 1,
                 "best_top1": best_top1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "scaler": None}
        checkpoint.save(state, args.out, is_best)
        if args.desired_acc is not None and val_stats["top1"] >= 100 * args.desired_acc:
            log.print(f"reached --desired-acc {args.desired_acc:g}: top-1 {val_stats['top1']:.2f} %")
            break
    if val_stats is None:  # resumed a run that had already finished
        val_stats = metrics.evaluate(model, val_loader, criterion, device, log)
    log.finish(args, val_stats, epoch + 1, 1, device, best_top1)


if __name__ == "__main__":
    cli.run(main, parse_args)
