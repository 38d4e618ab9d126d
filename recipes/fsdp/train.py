"""Sharded data parallel: ZeRO-1, ZeRO-2 and FSDP (ZeRO-3), one flag apart.

    torchrun --nproc_per_node=2 recipes/fsdp/train.py data/mnist5k -a lenet --image-size 28 -b 64 --shard full

Compared with recipes/ddp/train.py: what each of the N ranks keeps. DDP keeps the
weights, the gradients and the optimizer state whole on every rank (with SGD and
momentum 12 bytes per parameter, whatever N). --shard says what to split N ways:
  none       nothing: DDP, as recipes/ddp.
  optimizer  the optimizer state: DDP with ZeroRedundancyOptimizer, each rank steps
             the tensors it owns (whole tensors, balanced by size) and broadcasts them (ZeRO-1).
  grad-op    and the gradients and weights at rest: fully_shard(reshard_after_forward=False)
             keeps 1/N of every tensor, all-gathers a block's weights before its forward and
             keeps them until its backward, and reduce-scatters the gradients (ZeRO-2, FSDP's
             SHARD_GRAD_OP).
  full       as grad-op, but each block's weights are freed after its forward and gathered
             again for its backward: the least memory, the most communication (ZeRO-3).
Mixed precision (--opt-level, as recipes/apex): amp.initialize's for none and optimizer (O2's
master copies: none only), FSDP's MixedPrecisionPolicy for grad-op and full. Checkpoints are
gathered whole into the common format (recipes/common/sharding.py); --sharded-checkpoint also
writes a directory each rank saves its own shard into; --resume DIRECTORY reads it, resharded.
"""

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: `recipes` imports uninstalled

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from recipes.common import amp, bookkeeping, cli, data, distributed, launch, models, runlog, schedule, \
    sharding

SHARDS = ["none", "optimizer", "grad-op", "full"]


def parse_args(argv=None):
    parser = cli.build_parser("fsdp", __doc__)
    cli.add_distributed_args(parser)
    cli.add_amp_args(parser)
    parser.add_argument("--shard", choices=SHARDS, default="full",
                        help="what each rank keeps 1/N of: none (DDP), optimizer (ZeRO-1), grad-op (ZeRO-2), "
                             "full (ZeRO-3, the default)")
    parser.add_argument("--sharded-checkpoint", action="store_true",
                        help="also write <out>/checkpoint_dcp at each save, every rank its own shard "
                             "(torch.distributed.checkpoint); --resume that directory to load it")
    return sharding.check_args(cli.parse_args(parser, argv))  # the flags each mode cannot take


def train_one_epoch(model, loader, criterion, optimizer, scaler, autocast, run):
    model.train()
    for images, target in run.batches(loader):  # this epoch's batches (resumed mid-epoch: the rest of them)
        images, target = run.to_device(images, target)  # uint8 copied, then normalised (and mixed) on the device
        optimizer.zero_grad(set_to_none=True)
        micro_batches = zip(images.chunk(run.accum_steps), target.chunk(run.accum_steps))  # --accum-steps
        for i, (micro_images, micro_target) in enumerate(micro_batches):
            with gradient_sync(model, i == run.accum_steps - 1):  # reduce only the last micro-batch's
                with autocast():  # (none and optimizer; fully_shard casts by its policy)
                    output = model(micro_images)
                    loss = criterion(output, micro_target)
                scaler.scale(loss / run.accum_steps).backward()  # allreduce (DDP) or reduce-scatter (FSDP)
            run.meter.update(loss, output, micro_target)
        scaler.step(optimizer)  # ZeRO-1: each rank steps its tensors, then broadcasts them; FSDP: 1/N of each
        scaler.update()
        run.step_done(loss)  # lr schedule, EMA, logs, --save-every; on SIGTERM: save and stop (NaN: stop)
    return run.meter.summary()


def gradient_sync(model, sync):
    """DDP's no_sync() or FSDP's set_requires_gradient_sync(False) while sync is False."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if sync else model.no_sync()


def shard_model(model, args, policy):
    """fully_shard each block (each layer with weights: lenet's layers, a ResNet's stem, residual blocks and
    classifier, a ViT's encoder blocks), then the root (the rest): a block is the unit whose weights are gathered
    together, so only one block (or two, while the next one's gather overlaps) is whole at a time."""
    for tensor in model.state_dict().values():  # DDP broadcasts rank 0's weights; fully_shard keeps each rank's
        dist.broadcast(tensor, src=0)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and policy.param_dtype is not None:
            fully_shard(module, mp_policy=amp.batchnorm_policy(policy))  # statistics in fp32
    for block in models.sequential_layers(model, args.arch):  # (a ViT's patch embedding, of several modules: root's)
        if list(block.parameters()) and block in set(model.modules()) and not isinstance(block, FSDPModule):
            fully_shard(block, mp_policy=policy, reshard_after_forward=args.shard == "full")
    return fully_shard(model, mp_policy=amp.root_policy(policy), reshard_after_forward=args.shard == "full")


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
    sgd = dict(lr=lr, momentum=args.momentum, weight_decay=args.weight_decay,  # fused on CUDA, as recipes/ddp,
               fused=device.type == "cuda" and args.shard in ("none", "optimizer"))  # but not over DTensors
    if args.shard in ("none", "optimizer"):
        if args.shard == "none":
            optimizer = torch.optim.SGD(model.parameters(), **sgd)
        else:  # each rank keeps the momentum of (and steps) only the parameters it owns
            optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, **sgd)
        model, optimizer, scaler, autocast = amp.initialize(model, optimizer, args, device, log)  # as apex.amp's
    else:
        model, policy, scaler = amp.fsdp_policy(model, args, device, log)  # --opt-level: gather and reduce dtypes
        model = shard_model(model, args, policy)  # parameters become DTensors: 1/N of each tensor per rank
        optimizer = torch.optim.SGD(model.parameters(), **sgd)  # over the shards: 1/N of the momentum
        autocast = contextlib.nullcontext
    sharding.watch_parameters(model)  # memory: the weights each rank holds between forward and backward
    ema = models.build_ema(model, args.ema_decay)  # None without --ema-decay
    scheduler = schedule.build_scheduler(optimizer, args, steps_per_epoch=len(train_loader))
    run = bookkeeping.Run(args, log, device, model, optimizer, scheduler, ema, num_classes, global_batch,
                          steps_per_epoch=len(train_loader), scaler=scaler, autocast=autocast)
    run.resume()  # --resume (a whole checkpoint, or a sharded one), resharded for this world size

    train_model = model
    if args.shard in ("none", "optimizer"):
        train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    train_model = models.compile_model(train_model, device, args)  # --compile: the training forward and backward
    log.print(f"fsdp: --shard {args.shard}, {ctx.world_size} process(es) on {device} ({ctx.backend}), "
              f"{run.describe(train_set, val_set)}")
    for epoch in run.epochs():  # from where a checkpoint stopped, to --epochs (none with --evaluate)
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch
        train_stats = train_one_epoch(train_model, train_loader, criterion, optimizer, scaler, autocast, run)
        stop = run.end_epoch(train_stats, val_loader)  # evaluate, log, save; True once --desired-acc is reached
        sharding.log_memory(log, epoch + 1, sharding.memory_per_rank(model, optimizer, device))  # TensorBoard
        if stop:
            break
    run.finish(val_loader, shard=args.shard, **sharding.memory_per_rank(model, optimizer, device))  # per rank
    distributed.cleanup()


if __name__ == "__main__":
    launch.start(main, parse_args)
