"""The command line shared by every recipe (flags follow pytorch/examples imagenet), and its checks."""

import argparse
import copy
import os

import torch

from recipes.common import RecipeError, distributed, models

CLASSIC_LR_STEPS = (30, 60, 80)  # epochs of the 90-epoch ImageNet ResNet schedule

# The ranges of the numeric flags: flag -> (is the value valid?, what the one-line error says it must be).
# A flag a recipe does not have, or one left unset (None), is skipped.
RANGES = {
    "--batch-size": (lambda v: v >= 1, "must be at least 1"),
    "--epochs": (lambda v: v >= 1, "must be at least 1"),
    "--workers": (lambda v: v >= 0, "must be 0 or more"),
    "--lr": (lambda v: v > 0, "must be positive"),
    "--save-every": (lambda v: v >= 0, "must be 0 (epoch ends only) or a number of steps"),
    "--print-freq": (lambda v: v >= 1, "must be at least 1"),
    "--image-size": (lambda v: v >= 8, "must be at least 8 pixels"),
    "--hflip": (lambda v: 0 <= v <= 1, "is a probability in [0, 1]"),
    "--desired-acc": (lambda v: 0 < v <= 1, "is a fraction in (0, 1] (0.75 means 75 %)"),
    "--accum-steps": (lambda v: v >= 1, "must be at least 1"),
    "--label-smoothing": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "--mixup-alpha": (lambda v: v >= 0, "must be 0 (off) or positive"),
    "--cutmix-alpha": (lambda v: v >= 0, "must be 0 (off) or positive"),
    "--ema-decay": (lambda v: 0 < v < 1, "must be between 0 and 1 (for example 0.9999)"),
    "--profile": (lambda v: v >= 0, "must be 0 (off) or a number of steps"),
    "--dist-timeout": (lambda v: v > 0, "must be positive"),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help: the recipe's docstring as written (the example command on its own line, the paragraphs), and
    every flag's default, where its help does not say it already."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or not action.option_strings or action.default is False or action.nargs == 0 \
                or action.default == argparse.SUPPRESS:
            return text
        return f"{text} (default: {'none' if action.default is None else '%(default)s'})".lstrip()


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block) and exit code 2."""

    def error(self, message):
        raise RecipeError(message)


def build_parser(recipe, description):
    parser = Parser(prog=f"recipes/{recipe}/train.py", description=description, formatter_class=HelpFormatter,
                    usage="%(prog)s [DIR] [flags]  (the flags are listed after the description)")  # (the lesson first)
    parser.set_defaults(recipe=recipe)
    parser.add_argument("data", metavar="DIR", nargs="?",
                        help="ImageNet-style folder with train/ and val/ (one sub-folder per class; -e reads "
                             "val/ alone)")
    parser.add_argument("-a", "--arch", default="resnet18",
                        help="torchvision model name (resnet50, vit_b_16, ...), 'lenet' or 'vit_tiny' "
                             "(default: resnet18)")
    parser.add_argument("-b", "--batch-size", type=int, default=256,
                        help="images per process and step (default: 256); -e evaluates in batches of it, "
                             "a smaller val/ shard in one batch")
    parser.add_argument("--lr", type=float, default=0.1,
                        help="learning rate for a global batch of 256, scaled linearly "
                             "to the real global batch (default: 0.1)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--wd", "--weight-decay", dest="weight_decay", type=float, default=1e-4,
                        help="weight decay (an L2 penalty, in SGD's step)")
    parser.add_argument("--epochs", type=int, default=90,
                        help="epochs to train (default: 90, the classic ImageNet recipe's, whose milestones "
                             "--lr-steps takes by default)")
    parser.add_argument("-j", "--workers", type=int,
                        help="data loader processes per training process (default: the cores this process may use "
                             "shared out among this node's training processes, one left to each of them on CUDA; "
                             "at most 4 on CPU, where training needs the cores)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--pretrained", dest="weights", action="store_const", const=models.PRETRAINED,
                       help="start from torchvision's default weights for --arch (ImageNet's), read from torch.hub's "
                            "cache ($TORCH_HOME/hub/checkpoints) or downloaded; a classifier for another number of "
                            "classes starts afresh (fine-tuning on a folder of one's own)")
    start.add_argument("--weights", metavar="FILE",
                       help="start from this state dict (saved with torch.save(model.state_dict()), or a recipe's "
                            "checkpoint.pt or best.pt), the classifier as --pretrained's")
    parser.add_argument("--resume", metavar="PATH", help="checkpoint to resume from (or evaluate with -e)")
    parser.add_argument("--auto-resume", action="store_true",
                        help="resume from <out>/checkpoint.pt when it exists, so that a relaunch or a torchrun "
                             "restart continues where the run stopped (else start fresh, or from --resume)")
    parser.add_argument("--save-every", type=int, default=0, metavar="STEPS",
                        help="also save checkpoint.pt every STEPS steps within an epoch (default: 0, at the "
                             "end of each epoch only)")
    parser.add_argument("-e", "--evaluate", action="store_true",
                        help="evaluate --resume's model on val/ and exit (train/ is not read)")
    parser.add_argument("--seed", type=int, help="make data order, augmentation and initialisation repeatable")
    parser.add_argument("-p", "--print-freq", type=int, default=10, help="steps between progress-bar updates")
    parser.add_argument("--desired-acc", type=float,
                        help="stop once validation top-1 reaches this fraction (0.75 means 75 %%)")
    parser.add_argument("--out", help="run directory (default: runs/<recipe>)")
    parser.add_argument("--synthetic", action="store_true",
                        help="random in-memory images instead of DIR, for benchmarking")
    parser.add_argument("--image-size", type=int, default=224,
                        help="training crop; validation resizes to size/0.875 and centre-crops (default: 224)")
    parser.add_argument("--scale", type=float, nargs=2, default=(0.08, 1.0), metavar=("MIN", "MAX"),
                        help="area range of RandomResizedCrop (default: 0.08 1.0)")
    parser.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability (default: 0.5)")
    parser.add_argument("--decoder", choices=["tensor", "pil", "gpu"], default="tensor",
                        help="tensor: TorchCodec decoding (torchvision.io where TorchCodec is not installed) and "
                             "transforms.v2 on uint8 tensors in the loader workers (the faster CPU one, see "
                             "RESULTS.md); pil: PIL images and the classic transforms; gpu: the workers only read "
                             "the JPEG files, decoded in batches on the GPU (nvjpeg) and cropped there")
    add_training_args(parser)
    return parser


def add_training_args(parser):
    group = parser.add_argument_group("training recipe")
    group.add_argument("--accum-steps", type=int, default=1, metavar="K",
                       help="micro-batches of --batch-size per optimizer step: the global batch is batch size x "
                            "processes x K, and --lr scales with it (default: 1)")
    group.add_argument("--lr-schedule", choices=["step", "cosine"], default="step",
                       help="step: x0.1 at each of --lr-steps; cosine: down to 0 at the last step (default: step); "
                            "either is stepped after every optimizer step")
    group.add_argument("--lr-steps", type=float, nargs="+", metavar="EPOCH",
                       help=f"epochs at which the step schedule multiplies the learning rate by 0.1 (default: "
                            f"{' '.join(map(str, CLASSIC_LR_STEPS))}, the 90-epoch ImageNet classic)")
    group.add_argument("--warmup-epochs", type=float, default=0,
                       help="W: before the schedule, the rate rises linearly over the steps of W epochs, from "
                            "lr / steps at the first step to lr at the last (default: 0, none)")
    group.add_argument("--label-smoothing", type=float, default=0.0,
                       help="train against (1 - e) x target + e / classes (default: 0)")
    group.add_argument("--mixup-alpha", type=float, default=0.0,
                       help="MixUp: blend pairs of images, mixing ratio ~ Beta(alpha, alpha) (default: 0, off)")
    group.add_argument("--cutmix-alpha", type=float, default=0.0,
                       help="CutMix: paste a box from another image, area ~ Beta(alpha, alpha) (default: 0, off)")
    group.add_argument("--ema-decay", type=float,
                       help="also keep an exponential moving average of the weights, ema = d x ema + (1 - d) x w "
                            "after each step, evaluated and saved beside the model (for example 0.9999)")
    group.add_argument("--compile", action="store_true",
                       help="torch.compile the training model (TorchInductor; the first steps compile)")
    group.add_argument("--profile", type=int, default=0, metavar="N",
                       help="record N steps (after 2 warm-up steps) with torch.profiler into <out>/profile "
                            "for TensorBoard's profiler view (default: 0, off)")


def add_distributed_args(parser):
    group = parser.add_argument_group("distributed")
    group.add_argument("--dist-url", help="tcp://HOST:PORT of rank 0, when not launched by torchrun")
    group.add_argument("--world-size", type=int, default=-1,
                       help="with --dist-url: number of nodes (with --multiprocessing-distributed) or processes")
    group.add_argument("--rank", type=int, default=-1,
                       help="with --dist-url: node rank (with --multiprocessing-distributed) or process rank")
    group.add_argument("--multiprocessing-distributed", action="store_true",
                       help="spawn one process per local device (per GPU; one on CPU)")
    group.add_argument("--dist-backend", choices=["nccl", "gloo"], help="default: nccl on CUDA, gloo on CPU")
    group.add_argument("--dist-timeout", type=float, default=300,
                       help="seconds to wait for peers before failing (default: 300)")
    group.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, default=-1,
                       help=argparse.SUPPRESS)  # passed by python -m torch.distributed.launch
    group.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across processes (CUDA only)")


def add_amp_args(parser):
    group = parser.add_argument_group("mixed precision")
    group.add_argument("--opt-level", choices=["O0", "O1", "O2", "O3"],
                       help="apex names: O0 fp32, O1 autocast, O2 low-precision weights (BatchNorm fp32) with "
                            "fp32 master copies, O1/O2 with GradScaler for fp16, O3 pure low precision "
                            "(default: O1 on CUDA and on CPUs with native bf16, else O0)")
    group.add_argument("--amp-dtype", choices=["fp16", "bf16"],
                       help="low-precision type (default: fp16 on CUDA, bf16 on CPU)")
    group.add_argument("--amp-backend", choices=["native", "apex"], default="native",
                       help="native torch.amp, or NVIDIA apex.amp where it is still installed")
    group.add_argument("--channels-last", action="store_true", help="NHWC memory format (faster tensor cores)")


def parse_args(parser, argv=None):
    """Parse the flags, check them, and fill in the defaults that depend on others."""
    args = parser.parse_args(argv)
    check_ranges(args, RANGES)
    if not 0 < args.scale[0] <= args.scale[1] <= 1:
        raise RecipeError(f"--scale needs 0 < MIN <= MAX <= 1, got {args.scale[0]} {args.scale[1]}")
    if args.lr_steps is not None and args.lr_schedule != "step":
        raise RecipeError(f"--lr-steps sets the step schedule's milestones; --lr-schedule {args.lr_schedule} has none")
    args.lr_steps = list(CLASSIC_LR_STEPS) if args.lr_steps is None else args.lr_steps
    if any(m <= 0 for m in args.lr_steps) or sorted(set(args.lr_steps)) != args.lr_steps:
        raise RecipeError(f"--lr-steps must be positive epochs in increasing order, got "
                          f"{' '.join(f'{m:g}' for m in args.lr_steps)}")
    if not 0 <= args.warmup_epochs < args.epochs:
        raise RecipeError(f"--warmup-epochs must be at least 0 and less than --epochs {args.epochs}, "
                          f"got {args.warmup_epochs:g}")
    if args.ema_decay is not None and getattr(args, "opt_level", None) in ("O2", "O3"):
        raise RecipeError(f"--ema-decay with --opt-level {args.opt_level}: the model's weights are fp16/bf16, too "
                          f"coarse to move by (1 - decay) per step; use O1, which keeps fp32 weights")
    if args.data is None and not args.synthetic:
        raise RecipeError("no data: give DIR (a folder with train/ and val/) or --synthetic")
    if args.decoder == "gpu" and not torch.cuda.is_available():
        raise RecipeError("--decoder gpu decodes the JPEG files on a CUDA GPU, and none is visible here: use "
                          "--decoder tensor")
    if args.decoder == "gpu" and args.synthetic:
        raise RecipeError("--decoder gpu decodes a folder's JPEG files; --synthetic images need no decoding")
    if args.evaluate and not args.resume:
        raise RecipeError("--evaluate needs --resume CHECKPOINT (the model to evaluate)")
    if getattr(args, "multiprocessing_distributed", False) and (args.dist_url is None or args.world_size < 1
                                                                or args.rank < 0):
        raise RecipeError("--multiprocessing-distributed needs --dist-url, --world-size "
                          "(number of nodes) and --rank (this node's rank)")
    if args.resume and (args.evaluate or not args.auto_resume):  # (a relaunch repeats its first command's flags)
        repeat_training_settings(parser, args, argv)
    if args.out is None:
        args.out = f"runs/{args.recipe}-evaluate" if args.evaluate else f"runs/{args.recipe}"
    if args.workers is None:
        args.workers = default_workers(getattr(args, "multiprocessing_distributed", False))
    return args


def repeat_training_settings(parser, args, argv):
    """--resume FILE: the settings the checkpoint was trained with (arch, image size, precision; checkpoint.
    SETTINGS) for each such flag this recipe has and the command line leaves out, so that `-e --resume FILE`
    scores the model as its run did. With -e, a flag given that contradicts the checkpoint is an error;
    resuming training, the flag given wins (a larger image size to finish with, say)."""
    from recipes.common import checkpoint, data

    recorded = checkpoint.settings_from(args.resume)
    if recorded.get("normalize", data.normalization()) != data.normalization():
        raise RecipeError(f"checkpoint {args.resume} was trained on inputs normalised with {recorded['normalize']}, "
                          f"and these recipes normalise with {data.normalization()}")
    given = given_flags(parser, argv)
    for key, flag in checkpoint.SETTINGS.items():
        dest = flag[2:].replace("-", "_")
        if key not in recorded or not hasattr(args, dest):
            continue
        if dest not in given:
            setattr(args, dest, recorded[key])
        elif args.evaluate and getattr(args, dest) != recorded[key]:
            raise RecipeError(f"checkpoint {args.resume} was trained with {flag} {recorded[key]}, and {flag} "
                              f"{getattr(args, dest)} was given: leave {flag} out to evaluate it as it trained")


def given_flags(parser, argv):
    """The dests of the flags the command line gives (a default left alone is not given)."""
    quiet = copy.deepcopy(parser)
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return set(vars(quiet.parse_args(argv)))


def default_workers(spawns_per_device):
    """The cores this process may use (under SLURM and taskset, fewer than the node has), shared out among the
    node's training processes: more workers only compete for the cores (and PyTorch warns). On CUDA the GPU
    computes, and the workers take every core but one per training process (which queues the GPU's work);
    on the CPU training needs the cores, and the workers take at most 4."""
    cores = usable_cores()
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or (distributed.local_device_count()
                                                                if spawns_per_device else 1)
    if torch.cuda.is_available():
        return max(1, cores // processes - 1)
    return min(4, max(1, cores // processes))


def usable_cores():
    """The cores this process may use: under SLURM or taskset, fewer than the machine has."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_ranges(args, ranges):
    """One line naming the first flag out of its range: '--FLAG <what it must be>, got VALUE'.

    ranges: {flag: (is the value valid?, what it must be)}, as RANGES; a recipe checks its own flags with it.
    """
    for flag, (valid, requirement) in ranges.items():
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None and not valid(value):
            raise RecipeError(f"{flag} {requirement}, got {value}")
