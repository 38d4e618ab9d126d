"""Which rank does what in the parameter-server recipe, and the flags that cannot work together.

Ranks 0..S-1 are servers (--servers S), the next V are validators (--validators V), the rest
workers: one object says it, so that no role computes it again.
"""

import argparse
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace

from recipes.common import RecipeError, cli, distributed
from recipes.ps import attacks
from recipes.ps.rules import ZENOPS_ASYNC_ETA, ZENOPS_RHO, ZENOPS_SYNC_ETA

ROBUST = ["mean", "median", "trimmed-mean", "krum", "centered-clipping", "phocas", "naive-async"]  # on the servers
# (naive-async also in validators, as ZenoPS's)
BYZFL_RULES = ["median", "trimmed-mean", "krum", "centered-clipping"]  # (rules.py imports byzfl for these)
VALIDATED = ["zenops", "zeno", "zeno++"]  # by validators
ATTACKS = ["none", "signflip", "gaussian", "random", "labelflip", "alie"]


@dataclass(frozen=True)
class Layout:
    servers: int
    validators: int
    world_size: int

    @property
    def first_worker(self):
        return self.servers + self.validators

    @property
    def workers(self):
        return self.world_size - self.first_worker

    def role(self, rank):
        return "server" if rank < self.servers else "validator" if rank < self.first_worker else "worker"

    def worker_index(self, rank):
        """Worker i (rank first_worker + i) trains on the shard of ddp's rank i."""
        return rank - self.first_worker

    def validator_of(self, rank):
        """Worker i pushes to validator i mod V (None without validators)."""
        return self.servers + self.worker_index(rank) % self.validators if self.validators else None

    def workers_of(self, rank):
        """The workers whose pushes validator `rank` scores."""
        index = rank - self.servers
        return [w for w in range(self.first_worker, self.world_size) if self.worker_index(w) % self.validators == index]

    @property
    def clients(self):
        """Everyone who pulls from the servers."""
        return list(range(self.servers, self.world_size))

    @property
    def senders(self):
        """Whose pushes reach the servers: the validators, or else the workers."""
        return self.clients[:self.validators] if self.validators else self.clients


def process_groups(args, layout):
    """The groups beside the default one (every rank takes part in making each): the servers' on the device (to
    evaluate) and on gloo (their shards, on the CPU, as BytePS's), the validators' (zeno's scores) and the liars'
    (--attack alie: their updates), on gloo."""
    return SimpleNamespace(
        servers=distributed.new_group(range(args.servers)),
        servers_control=distributed.new_control_group(range(args.servers)),
        validators=distributed.new_control_group(range(args.servers, layout.first_worker)) if args.validators else None,
        liars=distributed.new_control_group(range(layout.first_worker, layout.first_worker + args.byzantine))
        if args.attack == "alie" else None)


def add_args(parser):
    group = parser.add_argument_group("parameter server")
    group.add_argument("--servers", type=int, default=1, help="ranks 0..S-1 hold the model (default: 1)")
    group.add_argument("--validators", type=int, default=0, help="the next V ranks validate pushes (default: 0)")
    group.add_argument("--mode", choices=["sync", "async"], default="sync",
                       help="sync: the servers apply the aggregate of every worker's push each round; async: "
                            "each push as it arrives")
    group.add_argument("--local-steps", type=int, default=1, metavar="H",
                       help="SGD steps of a worker per push; above 1 it pushes the change of its weights "
                            "(default: 1, a gradient)")
    group.add_argument("--max-staleness", type=int, metavar="D",
                       help="async: drop updates computed more than D versions ago (default: apply all)")
    group.add_argument("--partition-bytes", type=int, default=4_096_000,
                       help="chunk size of the parameters on the servers (default: 4096000, BytePS's)")
    group = parser.add_argument_group("Byzantine workers and Zeno validators")
    group.add_argument("--aggregate", choices=ROBUST + VALIDATED, default="mean",
                       help="how the servers combine the pushes: a rule on the servers, or Zeno validators")
    group.add_argument("--byzantine", type=int, default=0, metavar="K", help="workers 0..K-1 lie at every push")
    group.add_argument("--attack-prob", type=float, default=0.0, metavar="Q",
                       help="every worker lies with probability Q, drawn per tensor of each push (default: 0)")
    group.add_argument("--attack-draw", choices=["tensor", "push"], default="tensor",
                       help="--attack-prob's draw: each tensor of a push on its own (ZenoPS's, default) or the "
                            "push whole (Zeno++'s)")
    group.add_argument("--attack", choices=ATTACKS, default="none",
                       help="what a lying worker pushes in place of its update u (attacks.py; alie: A Little "
                            "Is Enough from the liars' own updates, sync, --byzantine K >= 2)")
    group.add_argument("--attack-scale", type=float, metavar="S",
                       help="signflip: -S u; gaussian: N(0, S^2); random: a random direction at S ||u||; alie: "
                            "mean - S std (default: 1; alie: Baruch et al.'s z_max for the workers and liars)")
    group.add_argument("--worker-delay", type=float, default=0.0, metavar="W",
                       help="each worker sleeps a uniform draw from [0, W) seconds before each push, ZenoPS's "
                            "simulated asynchrony (worker.py; theirs: 1 s x the workers; default: 0)")
    group.add_argument("--worker-subsample", type=float, default=1.0, metavar="P",
                       help="each worker pushes in a round with probability P; after a round it sat out, sync: "
                            "it starts from the new weights plus that round's change and pushes the next round's "
                            "alone; async: it goes on from its own weights and pushes all it trained since its "
                            "last pull (--local-steps 1: a sat-out gradient is dropped) (ZenoPS's "
                            "--worker-subsample-rate; default: 1, every round)")
    group.add_argument("--zeno-b", type=int, help="pushes zeno and the trimming rules drop (default: K)")
    group.add_argument("--trim-ratio", type=float, metavar="R",
                       help="trimmed-mean and phocas: b from each round's n pushes, as ZenoPS (rules.py), in place "
                            "of --zeno-b (ZenoPS's: 0.2)")
    group.add_argument("--clean-epochs", type=int, default=0, metavar="E",
                       help="no worker lies in its first E epochs of rounds (Zeno++'s: 1; default: 0)")
    group.add_argument("--validation-split", type=float,
                       help="share of train/ held out for the validators, each validator all of it; given "
                            "without validators, held out all the same, so that the workers train on the same "
                            "shards as beside validators (default: 0.1 with validators; ZenoPS's: a worker's "
                            "share, 1 / (workers + 1))")
    group.add_argument("--validator-batch", type=int,
                       help="images per step of a validator (default: zenops and naive-async --batch-size, as "
                            "ZenoPS; zeno and zeno++ 4 x --batch-size, validators.py says why)")
    group.add_argument("--zeno-eta", type=float, help="zenops threshold (default: -0.001 sync, -0.02 async)")
    group.add_argument("--rho", type=float, help="zenops norm bound (default: 0.6); zeno++ penalty (default: "
                                                 "0.01 x the base learning rate)")
    group.add_argument("--zeno-alpha", type=float, default=0.4,
                       help="async zenops' and naive-async's step scale (default: 0.4, ZenoPS's)")
    group.add_argument("--zeno-rho-ratio", type=float, default=200.0,
                       help="zeno: its penalty is lr / ratio x mean(g^2) (default: 200)")
    group.add_argument("--zeno-delay", type=int, metavar="K",
                       help="async: pushes between refreshes of v (default: zeno++ 10 of all validators'; zenops, "
                            "a round of the validator's workers)")
    group.add_argument("--eps", type=float, default=0.0, help="zeno++ slack (default: 0)")


def check_flags(args):
    """The flags that cannot work together, as one line each; fills in the rules' defaults."""
    for flag in ("ema_decay", "compile", "sync_bn"):
        if getattr(args, flag):
            raise RecipeError(f"--{flag.replace('_', '-')} is not supported by the parameter-server recipe")
    if args.accum_steps != 1 or args.save_every or args.profile:
        raise RecipeError("--accum-steps, --save-every and --profile are not supported by the parameter-server recipe")
    if args.aggregate in BYZFL_RULES and importlib.util.find_spec("byzfl") is None:
        raise RecipeError(f"--aggregate {args.aggregate} is byzfl's: pip install byzfl (or pip install -e '.[ps]')")
    cli.check_ranges(args, {"--servers": (lambda v: v >= 1, "must be at least 1"),
                            "--validators": (lambda v: v >= 0, "must be 0 or more"),
                            "--local-steps": (lambda v: v >= 1, "must be at least 1"),
                            "--max-staleness": (lambda v: v >= 0, "must be 0 or more"),
                            "--partition-bytes": (lambda v: v >= 4, "must be at least 4"),
                            "--validation-split": (lambda v: 0 < v < 1, "is a fraction in (0, 1)"),
                            "--validator-batch": (lambda v: v >= 1, "must be at least 1"),
                            "--zeno-delay": (lambda v: v >= 1, "must be at least 1"),
                            "--zeno-rho-ratio": (lambda v: v > 0, "must be positive"),
                            "--byzantine": (lambda v: v >= 0, "must be 0 or more"),
                            "--attack-prob": (lambda v: 0 <= v <= 1, "is a probability in [0, 1]"),
                            "--attack-scale": (lambda v: v >= 0, "must be 0 or more"),
                            "--worker-delay": (lambda v: v >= 0, "must be 0 or more"),
                            "--rho": (lambda v: v >= 0, "must be 0 or more"),
                            "--zeno-alpha": (lambda v: v > 0, "must be positive"),
                            "--eps": (lambda v: v >= 0, "must be 0 or more"),
                            "--zeno-b": (lambda v: v >= 0, "must be 0 or more"),
                            "--trim-ratio": (lambda v: 0 < v < 0.5, "is a fraction in (0, 0.5)"),
                            "--clean-epochs": (lambda v: v >= 0, "must be 0 or more"),
                            "--worker-subsample": (lambda v: 0 < v <= 1, "is a probability in (0, 1]")})
    if args.attack == "labelflip" and (args.mixup_alpha or args.cutmix_alpha):
        raise RecipeError("--attack labelflip flips class labels: not with --mixup-alpha or --cutmix-alpha")
    if args.attack == "none" and (args.byzantine or args.attack_prob):
        raise RecipeError("--byzantine and --attack-prob need an --attack")
    if args.attack != "none" and not (args.byzantine or args.attack_prob):
        raise RecipeError(f"--attack {args.attack} needs --byzantine K or --attack-prob q: who lies")
    if args.validators and args.aggregate not in VALIDATED + ["naive-async"]:
        raise RecipeError(f"--validators score pushes with a Zeno rule: --aggregate {'|'.join(VALIDATED)} (or "
                          f"naive-async, which they scale, as ZenoPS's)")
    if args.attack == "alie" and (args.attack_prob or args.byzantine < 2 or args.mode != "sync"):
        raise RecipeError("--attack alie: the liars share their updates each round: --byzantine K (2 or more), "
                          "no --attack-prob, --mode sync")
    if not args.validators and args.aggregate in VALIDATED:
        raise RecipeError(f"--aggregate {args.aggregate} needs --validators (at least 1)")
    if args.mode == "async" and args.aggregate not in ("mean", "naive-async", "zenops", "zeno++"):
        raise RecipeError(f"--mode async applies each push alone: --aggregate mean, naive-async, zenops or zeno++, "
                          f"not {args.aggregate}")
    if args.mode == "sync" and args.aggregate == "naive-async":
        raise RecipeError("--aggregate naive-async is ZenoPS's asynchronous baseline: use --mode async")
    if args.mode == "sync" and args.aggregate == "zeno++":
        raise RecipeError("--aggregate zeno++ is asynchronous: use --mode async (or zeno, zenops in sync)")
    if args.mode == "async" and args.aggregate == "zeno":
        raise RecipeError("--aggregate zeno is synchronous: use --mode sync (or zeno++, zenops in async)")
    if args.aggregate == "zeno" and args.worker_subsample < 1:
        raise RecipeError("--aggregate zeno keeps the n - b best of every worker's push: not with --worker-subsample")
    if args.aggregate in ("zeno", "zeno++") and args.local_steps != 1:
        raise RecipeError(f"--aggregate {args.aggregate} judges gradients, as its authors: --local-steps 1, "
                          f"not {args.local_steps}")
    if args.trim_ratio is not None and args.aggregate not in ("trimmed-mean", "phocas"):
        raise RecipeError(f"--trim-ratio sets the trim of --aggregate trimmed-mean or phocas, not {args.aggregate}")
    if args.trim_ratio is not None and args.zeno_b is not None:
        raise RecipeError("--trim-ratio draws b from each round's pushes: not with --zeno-b")
    if args.attack_prob and args.zeno_b is None and args.trim_ratio is None and \
            args.aggregate in ("median", "trimmed-mean", "phocas", "krum", "zeno"):
        raise RecipeError(f"--attack-prob leaves the number of liars to chance: give --aggregate {args.aggregate} "
                          f"its --zeno-b b (or trimmed-mean and phocas a --trim-ratio)")
    args.zeno_b = args.byzantine if args.zeno_b is None else args.zeno_b
    if args.validation_split is None and args.validators:
        args.validation_split = 0.1
    if args.validator_batch is None:
        args.validator_batch = args.batch_size if args.aggregate in ("zenops", "naive-async") else 4 * args.batch_size
    if args.zeno_eta is None:
        args.zeno_eta = ZENOPS_SYNC_ETA if args.mode == "sync" else ZENOPS_ASYNC_ETA
    if args.rho is None and args.aggregate == "zenops":
        args.rho = ZENOPS_RHO


def check_world(args, world_size):
    """The checks that need the world size (known once launched); returns the Layout."""
    layout = Layout(args.servers, args.validators, world_size)
    workers, b = layout.workers, args.zeno_b
    if workers < 1:
        raise RecipeError(f"{args.servers} server(s) and {args.validators} validator(s) leave no worker in a "
                          f"world of {world_size} processes: launch at least {args.servers + args.validators + 1}, "
                          f"torchrun --nproc_per_node={args.servers + args.validators + 1} recipes/ps/train.py ...")
    if args.validators > workers:
        raise RecipeError(f"{args.validators} validators for {workers} worker(s): each validator needs a worker")
    if args.byzantine >= workers:
        raise RecipeError(f"--byzantine {args.byzantine} must be smaller than the {workers} worker(s)")
    if args.attack_scale is None:  # (each attack's own default)
        args.attack_scale = attacks.alie_z_max(workers, args.byzantine) if args.attack == "alie" else 1.0
    if args.aggregate in ("median", "trimmed-mean", "phocas", "krum") and args.trim_ratio is None and 2 * b >= workers:
        raise RecipeError(f"--aggregate {args.aggregate} tolerates fewer than half of the workers Byzantine: "
                          f"{b} of {workers}")
    if args.aggregate == "krum" and 2 * b + 2 >= workers:
        raise RecipeError(f"--aggregate krum needs more than 2 b + 2 workers: {workers} for b = {b}")
    if args.aggregate == "zeno" and b >= workers:
        raise RecipeError(f"--zeno-b {b} must leave at least one of the {workers} workers")
    return layout


def check_data(args, layout, per_worker, held_out):
    """Enough images for a round of every worker, and a batch for the validators (-e: trains nothing)."""
    if args.evaluate:
        return
    if per_worker // args.batch_size < args.local_steps:
        raise RecipeError(f"train/ gives {per_worker} images per worker, fewer than one round of --batch-size "
                          f"{args.batch_size} x --local-steps {args.local_steps}")
    if args.validators and len(held_out) < args.validator_batch:
        raise RecipeError(f"--validation-split {args.validation_split:g} holds out {len(held_out)} train images: "
                          f"fewer than one batch of --validator-batch {args.validator_batch}")


def with_batch(args, batch_size):
    """The flags with another --batch-size (a validator's loader)."""
    return argparse.Namespace(**{**vars(args), "batch_size": batch_size})
