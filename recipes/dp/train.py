"""torch.nn.DataParallel: one process splits each batch across all visible GPUs.

    python recipes/dp/train.py data/mnist5k -a lenet --image-size 28 -b 64

Compared with recipes/nd/train.py, DataParallel adds one wrapper. Each step it
copies the model to every GPU, scatters the batch, and gathers outputs and
gradients back on the first GPU: simple, but one Python process and GPU 0 do
all the coordination, so it scales worse than DDP (recipes/ddp). Without CUDA
it runs the model on one device.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: `recipes` imports uninstalled

import torch
from torch import nn

from recipes.common import bookkeeping, cli, data, launch, models, runlog, schedule


def parse_args(argv=None):
    parser = cli.build_parser("dp", __doc__)
    return cli.parse_args(parser, argv)


def train_one_epoch(model, loader, criterion, optimizer, run):
    model.train()
    for images, target in run.batches(loader):  # this epoch's batches (resumed mid-epoch: the rest of them)
        images, target = run.to_device(images, target)  # uint8 copied, then normalised (and mixed) on the device
        optimizer.zero_grad(set_to_none=True)
        micro_batches = zip(images.chunk(run.accum_steps), target.chunk(run.accum_steps))  # --accum-steps
        for micro_images, micro_target in micro_batches:
            output = model(micro_images)
            loss = criterion(output, micro_target)
            (loss / run.accum_steps).backward()  # gradients of every replica are summed onto the first GPU
            run.meter.update(loss, output, micro_target)
        optimizer.step()
        run.step_done(loss)  # lr schedule, EMA, logs, --save-every; on SIGTERM: save and stop (NaN: stop)
    return run.meter.summary()


def main(args):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log = runlog.RunLog(args)

    train_set, val_set, num_classes = data.build_datasets(args)
    train_loader = data.train_loader(train_set, args)  # shuffled anew each epoch, from --seed
    val_loader = data.val_loader(val_set, args)

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes, args.image_size, args.weights).to(device)
    global_batch = args.batch_size * args.accum_steps  # DataParallel splits it across the GPUs
    lr = args.lr * global_batch / 256  # linear scaling rule: --lr is for a global batch of 256
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)  # (validation: plain cross-entropy)
    optimizer = torch.optim.SGD(model.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay,
                                fused=device.type == "cuda")  # CUDA: one kernel steps every weight
    ema = models.build_ema(model, args.ema_decay)  # None without --ema-decay
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=len(train_loader))
    run = bookkeeping.Run(args, log, device, model, optimizer, scheduler, ema, num_classes, global_batch,
                          steps_per_epoch=len(train_loader))
    run.resume()  # --resume, or <out>/checkpoint.pt with --auto-resume

    dp_model = nn.DataParallel(model)  # all visible GPUs
    train_model = models.compile_model(dp_model, device, args)  # --compile: the training forward and backward
    if torch.cuda.device_count() < 2:
        log.print(f"note: DataParallel sees {torch.cuda.device_count()} GPU(s): it runs on one device ({device})")
    log.print(f"dp: 1 process, {max(torch.cuda.device_count(), 1)} device(s), {run.describe(train_set, val_set)}")
    for epoch in run.epochs():  # from where a checkpoint stopped, to --epochs (none with --evaluate)
        train_stats = train_one_epoch(train_model, train_loader, criterion, optimizer, run)
        if run.end_epoch(train_stats, val_loader):  # evaluate, log, save; True once --desired-acc is reached
            break
    run.finish(val_loader)  # summary.json (evaluating first when no epoch ran)


if __name__ == "__main__":
    launch.start(main, parse_args)
