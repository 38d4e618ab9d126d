"""Which rank is which stage of which replica (and what its loop works with), the pipeline's flags and its --sync
methods by name, and the flags that cannot work together.

Rank r is stage r mod S of replica r div S (--stages S). Under a method with servers (--sync hetpipe)
the last S ranks are the stages' parameter servers: one object says it, so that no part computes it again.
"""

from dataclasses import dataclass
from typing import Any

from recipes.common import RecipeError, cli, models
from recipes.pipeline.adpsgd import AdPsgd
from recipes.pipeline.allreduce import AllReduce
from recipes.pipeline.hetpipe import HetPipe
from recipes.pipeline.preduce import PartialReduce
from recipes.pipeline.stages import weighted_units

SYNCS = {"allreduce": AllReduce, "preduce": PartialReduce, "adpsgd": AdPsgd, "hetpipe": HetPipe}  # --sync's choices


@dataclass(frozen=True)
class Layout:
    stages: int
    world_size: int
    has_servers: bool = False

    @property
    def replicas(self):
        """The replicas that train (hetpipe: all but the servers' ranks)."""
        return self.world_size // self.stages - self.has_servers

    def stage(self, rank):
        return rank % self.stages

    def replica(self, rank):
        return rank // self.stages

    def rank(self, replica, stage):
        return replica * self.stages + stage

    def pipeline_ranks(self, replica):
        """The ranks of one replica's pipeline, stage 0 first (or of the servers: replica R)."""
        return [self.rank(replica, s) for s in range(self.stages)]

    def stage_ranks(self, stage):
        """The ranks that hold this stage, one per replica that trains."""
        return [self.rank(r, stage) for r in range(self.replicas)]

    def server(self, stage):
        """hetpipe: the rank of this stage's parameter server."""
        return self.rank(self.replicas, stage)

    def is_server(self, rank):
        return self.has_servers and self.replica(rank) == self.replicas


@dataclass
class Stage:
    """This rank's stage of its replica's pipeline: where it sits, its layers and their weights, the group of the
    replica's stages, the flushing schedule that runs it (gpipe, 1f1b; None under pipedream), and what makes it
    straggle (stragglers.py: delays; slots, where --hetero's sleeps go under gpipe and 1f1b), and its weights kept
    over the epoch (snapshots.py)."""
    layout: Layout
    rank: int
    module: Any
    params: list
    pipe_group: Any
    schedule: Any
    delays: Any
    slots: Any
    snapshots: Any  # --snapshot-every: copies of the stage's weights over the epoch (snapshots.py)

    @property
    def index(self):
        return self.layout.stage(self.rank)

    @property
    def is_first(self):
        return self.index == 0

    @property
    def is_last(self):
        return self.index == self.layout.stages - 1

    @property
    def last_rank(self):
        return self.layout.rank(self.layout.replica(self.rank), self.layout.stages - 1)


@dataclass
class Replicas:
    """This stage among the replicas of it: which one is this rank's, their group, and how they agree (sync: the
    --sync method at this rank, sync.py, which joins them once they are known)."""
    layout: Layout
    stage: int
    replica: int
    count: int
    stage_group: Any
    steps_per_epoch: int
    sync: Any = None
    pipe_control: Any = None  # the gloo group its model is gathered over: its replica's stages (hetpipe: all ranks)


def add_args(parser):
    group = parser.add_argument_group("pipeline")
    group.add_argument("--stages", type=int, default=2, metavar="S", help="processes per replica (default: 2)")
    group.add_argument("--microbatches", type=int, metavar="M",
                       help="gpipe and 1f1b: pieces of each batch in flight in the pipeline; must divide -b "
                            "(default: 4); pipedream sends whole minibatches")
    group.add_argument("--schedule", choices=["gpipe", "1f1b", "pipedream"], default="1f1b",
                       help="torch.distributed.pipelining's ScheduleGPipe or Schedule1F1B (synchronous: a "
                            "flush and one update per batch), or asynchronous PipeDream as SD-PIPE runs it (an "
                            "update per minibatch at each stage, weights stashed)")
    group.add_argument("--sync", choices=list(SYNCS), default="allreduce",
                       help="how the replicas of a stage agree (default: allreduce)")
    group.add_argument("--preduce-size", type=int, metavar="P",
                       help="preduce: at most P replicas in a group (default: no cap, SD-PIPE's)")
    group.add_argument("--wave", type=int, default=10, metavar="W",
                       help="hetpipe: minibatches between a replica's pulls (it pushes after each; default: 10, "
                            "SD-PIPE's)")
    group.add_argument("--staleness", type=int, metavar="D",
                       help="hetpipe: waves a replica may run ahead of the slowest when it pulls (default: no "
                            "bound, SD-PIPE's)")
    group.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                       help="SGD with --momentum, or AdamW (betas 0.9 and 0.999: SD-PIPE's BERT; with -a "
                            "bert_tiny); both with --weight-decay")
    group.add_argument("--hetero", type=float, default=0.0, metavar="X",
                       help="a process sleeps X seconds with probability --hetero-prob before the forward "
                            "and the backward of each minibatch (default: 0)")
    group.add_argument("--hetero-prob", type=float, default=0.1, help="the probability of each --hetero sleep")
    group.add_argument("--replica-data", choices=["shard", "stream"], default="shard",
                       help="what each replica reads: ddp's rank r's shard (default), or the whole set as a "
                            "stream shuffled by its own seed, as SD-PIPE's pipelines read it (replica_data.py)")
    group.add_argument("--snapshot-every", type=float, metavar="T",
                       help="also score the model as it was every T seconds of each epoch's training, at the "
                            "epoch's end (<out>/snapshots.csv; default: at the epoch's end only)")
    group.add_argument("--slow-rank", type=int, metavar="R", help="this rank is --slow-factor times slower")
    group.add_argument("--slow-factor", type=float, default=2.0, metavar="F",
                       help="--slow-rank's steps take F times as long")


def check_args(args):
    """The flags that cannot work together, as one line each."""
    for flag in ("ema_decay", "compile", "sync_bn", "mixup_alpha", "cutmix_alpha"):  # (mixing: the first and the
        if getattr(args, flag):                                                    # last stage would mix apart)
            raise RecipeError(f"--{flag.replace('_', '-')} is not supported by the pipeline recipe")
    if args.schedule == "pipedream":
        if args.microbatches not in (None, 1):
            raise RecipeError("--microbatches: --schedule pipedream sends whole minibatches, each one update")
    if args.microbatches is None:
        args.microbatches = 1 if args.schedule == "pipedream" else 4
    if args.accum_steps != 1:
        raise RecipeError("--accum-steps: the pipeline recipe cuts each batch into --microbatches instead")
    cli.check_ranges(args, {"--stages": (lambda v: v >= 1, "must be at least 1"),
                            "--microbatches": (lambda v: v >= 1, "must be at least 1"),
                            "--preduce-size": (lambda v: v is None or v >= 2, "must be at least 2"),
                            "--wave": (lambda v: v >= 1, "must be at least 1"),
                            "--staleness": (lambda v: v is None or v >= 0, "must be 0 or more"),
                            "--hetero": (lambda v: v >= 0, "must be 0 (off) or a number of seconds"),
                            "--hetero-prob": (lambda v: 0 <= v <= 1, "is a probability in [0, 1]"),
                            "--slow-factor": (lambda v: v >= 1, "must be at least 1"),
                            "--snapshot-every": (lambda v: v is None or v > 0, "must be a number of seconds")})
    model = models.build_model(args.arch, 10, args.image_size)
    units = len(weighted_units(models.sequential_layers(model, args.arch)))
    if args.stages > units:
        raise RecipeError(f"--stages {args.stages}: --arch {args.arch} has only {units} layers with weights to "
                          f"split into stages")
    if args.schedule == "1f1b" and args.microbatches < args.stages:
        raise RecipeError(f"--schedule 1f1b needs at least as many --microbatches as --stages: "
                          f"{args.microbatches} < {args.stages}")
    if args.batch_size % args.microbatches and not args.evaluate:  # (-e evaluates whole batches)
        raise RecipeError(f"--microbatches {args.microbatches} must divide --batch-size {args.batch_size}")
    if args.save_every and SYNCS[args.sync].stop_checks_every is None:
        raise RecipeError(f"--save-every is not supported with --sync {args.sync} (its replicas meet at epoch "
                          f"ends only)")


def check_world(args, world_size):
    """The flags that cannot work with this many processes, as one line each."""
    servers = SYNCS[args.sync].has_servers  # (a server per stage)
    if world_size % args.stages:
        raise RecipeError(f"the world size {world_size} is not a multiple of --stages {args.stages}: for 2 replicas"
                          f"{' and the servers' if servers else ''}, torchrun --nproc_per_node="
                          f"{(2 + servers) * args.stages} recipes/pipeline/train.py ...")
    layout = Layout(args.stages, world_size, servers)
    if layout.replicas < 1:
        raise RecipeError(f"--sync {args.sync} needs the {args.stages} servers and at least one replica: "
                          f"{2 * args.stages} processes or more, not {world_size}")
    if args.slow_rank is not None and not 0 <= args.slow_rank < layout.replicas * args.stages:
        raise RecipeError(f"--slow-rank {args.slow_rank} is not a rank of the {layout.replicas} replica(s) x "
                          f"{args.stages} stage(s)")
