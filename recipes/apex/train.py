"""DDP with mixed precision: torch.amp's autocast and GradScaler, under apex's --opt-level names.

    torchrun --nproc_per_node=2 recipes/apex/train.py data/mnist5k -a lenet --image-size 28 -b 64 --opt-level O1

Compared with recipes/ddp/train.py: autocast runs the forward pass and the loss in
fp16/bf16 where that is safe, and for fp16 a GradScaler scales the loss up so that
small gradients do not underflow, unscales them, and skips a step that overflowed.
O2 (apex's: fp16/bf16 weights but BatchNorm, fp32 master copies in the optimizer),
O0-O3, apex.amp itself and --channels-last: recipes/common/amp.py.
"""

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: `recipes` imports uninstalled

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from recipes.common import amp, bookkeeping, cli, data, distributed, launch, models, runlog, schedule


def parse_args(argv=None):
    parser = cli.build_parser("apex", __doc__)
    cli.add_distributed_args(parser)
    cli.add_amp_args(parser)
    return cli.parse_args(parser, argv)


def train_one_epoch(model, loader, criterion, optimizer, scaler, autocast, run):
    model.train()
    for images, target in run.batches(loader):  # this epoch's batches (resumed mid-epoch: the rest of them)
        images, target = run.to_device(images, target)  # uint8 copied, then normalised (and mixed) on the device
        optimizer.zero_grad(set_to_none=True)
        micro_batches = zip(images.chunk(run.accum_steps), target.chunk(run.accum_steps))  # --accum-steps
        for i, (micro_images, micro_target) in enumerate(micro_batches):
            with model.no_sync() if i < run.accum_steps - 1 else contextlib.nullcontext():
                with autocast():  # low precision where it is safe, fp32 where it is not
                    output = model(micro_images)
                    loss = criterion(output, micro_target)
                scaler.scale(loss / run.accum_steps).backward()  # DDP averages the (scaled) gradients here
            run.meter.update(loss, output, micro_target)
        scaler.step(optimizer)  # unscales; skips the step if a gradient is inf or NaN
        scaler.update()  # halves the scale after an overflow, doubles it after 2000 clean steps
        run.step_done(loss)  # lr schedule, EMA, logs, --save-every; on SIGTERM: save and stop (NaN: stop)
    return run.meter.summary()


def main(args):
    facts = distributed.launch_facts(args)  # from torchrun's environment, the legacy launcher or --dist-url
    with distributed.joining(facts):  # ranks that never meet: one line naming where, after --dist-timeout
        dist.init_process_group(facts.backend, init_method=facts.init_method, store=facts.store,  # where rank 0 is
                                world_size=facts.world_size, rank=facts.rank,  # how many, and which one this is
                                device_id=facts.device_id, timeout=facts.timeout)  # this process's GPU (NCCL)
    ctx = distributed.context(facts)  # rank, world size, device, and a gloo group beside it for CPU tensors
    device = ctx.device
    log = runlog.RunLog(args, enabled=ctx.is_main)  # only rank 0 prints and writes files

    train_set, val_set, num_classes = data.build_datasets(args)
    train_sampler = DistributedSampler(train_set, seed=args.seed or 0)  # rank r: every W-th image of one shuffle
    train_loader = data.train_loader(train_set, args, train_sampler)
    val_loader = data.val_loader(val_set, args, ctx.rank, ctx.world_size)

    data.set_seed(args.seed)
    model = models.build_model(args.arch, num_classes, args.image_size, args.weights).to(device)
    if args.sync_bn:  # BatchNorm statistics over the global batch (CUDA only)
        model = distributed.sync_batchnorm(model, device, log)
    global_batch = args.batch_size * ctx.world_size * args.accum_steps
    lr = args.lr * global_batch / 256  # linear scaling rule: --lr is for a global batch of 256
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)  # (validation: plain cross-entropy)
    optimizer = torch.optim.SGD(model.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay,
                                fused=device.type == "cuda")  # CUDA: one kernel steps every weight
    model, optimizer, scaler, autocast = amp.initialize(model, optimizer, args, device, log)  # as apex.amp's
    ema = models.build_ema(model, args.ema_decay)  # None without --ema-decay
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=len(train_loader))
    run = bookkeeping.Run(args, log, device, model, optimizer, scheduler, ema, num_classes, global_batch,
                          steps_per_epoch=len(train_loader), scaler=scaler, autocast=autocast)
    run.resume()  # --resume, or <out>/checkpoint.pt with --auto-resume

    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # training goes through it
    train_model = models.compile_model(ddp_model, device, args)  # --compile: the training forward and backward
    log.print(f"apex: {ctx.world_size} process(es) on {device} ({ctx.backend}), {run.describe(train_set, val_set)}")
    for epoch in run.epochs():  # from where a checkpoint stopped, to --epochs (none with --evaluate)
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch
        train_stats = train_one_epoch(train_model, train_loader, criterion, optimizer, scaler, autocast, run)
        if run.end_epoch(train_stats, val_loader):  # evaluate, log, save; True once --desired-acc is reached
            break
    run.finish(val_loader)  # summary.json (evaluating first when no epoch ran)
    distributed.cleanup()


if __name__ == "__main__":
    launch.start(main, parse_args)
