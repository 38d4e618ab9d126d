"""Which rank is which stage of which replica (and what its loop works with), the pipeline's flags, and the flags
that cannot work together.

Rank r is stage r mod S of replica r div S (--stages S). With --sync hetpipe the last S ranks
are the stages' parameter servers: one object says it, so that no part computes it again.
"""

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torch.nn.utils import parameters_to_vector

from recipes.common import RecipeError, cli, models
from recipes.pipeline import stragglers
from recipes.pipeline.preduce import PartialReduce
from recipes.pipeline.stages import weighted_units

SYNCS = ["allreduce", "preduce", "adpsgd", "hetpipe"]


@dataclass(frozen=True)
class Layout:
    stages: int
    world_size: int
    hetpipe: bool = False

    @property
    def replicas(self):
        """The replicas that train (hetpipe: all but the servers' ranks)."""
        return self.world_size // self.stages - self.hetpipe

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
        return self.hetpipe and self.replica(rank) == self.replicas

    def stage_of(self, args, rank, module, params, schedule, pipe_group):
        """This rank's stage in its replica's pipeline (Stage)."""
        stage, replica = self.stage(rank), self.replica(rank)
        return Stage(index=stage, module=module, params=params, schedule=schedule, is_first=stage == 0,
                     is_last=stage == self.stages - 1, last_rank=self.rank(replica, self.stages - 1),
                     pipe_group=pipe_group, slots=stragglers.inject(module, args))

    def replicas_of(self, args, rank, params, stage_group, claim_groups, steps_per_epoch):
        """This stage among its replicas, and the state of the --sync method that keeps them in agreement
        (Replicas)."""
        stage, replica = self.stage(rank), self.replica(rank)
        preduce = PartialReduce(args, self, stage, replica, claim_groups[replica],
                                dist.distributed_c10d._get_default_store()) if args.sync == "preduce" else None
        server = HetPipeClient(self.server(stage), parameters_to_vector(params).detach().cpu()) \
            if args.sync == "hetpipe" else None
        return Replicas(layout=self, replica=replica, count=self.replicas, stage_group=stage_group,
                        steps_per_epoch=steps_per_epoch, preduce=preduce, hetpipe=server)


@dataclass
class Stage:
    """This rank's stage of its replica's pipeline: its layers and their weights, where it sits, and the
    flushing schedule that runs it (gpipe, 1f1b; None under pipedream); slots: --hetero's sleeps (gpipe, 1f1b)."""
    index: int
    module: Any
    params: list
    schedule: Any
    is_first: bool
    is_last: bool
    last_rank: int
    pipe_group: Any
    slots: Any


@dataclass
class HetPipeClient:
    """hetpipe, a replica's side: its stage's server, the weights it last pushed or pulled (on the CPU) and
    their version."""
    server: int
    vector: Any
    versions: list = field(default_factory=lambda: [-1])


@dataclass
class Replicas:
    """This stage among the replicas of it: which one is this rank's, their group, and how they agree (preduce's
    queue, hetpipe's server: None under the other methods)."""
    layout: Layout
    replica: int
    count: int
    stage_group: Any
    steps_per_epoch: int
    preduce: Any = None
    hetpipe: Any = None


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
    group.add_argument("--sync", choices=SYNCS, default="allreduce",
                       help="how the replicas of a stage agree (default: allreduce)")
    group.add_argument("--preduce-size", type=int, metavar="P",
                       help="preduce: at most P replicas in a group (default: no cap, SD-PIPE's)")
    group.add_argument("--wave", type=int, default=10, metavar="W",
                       help="hetpipe: minibatches between a replica's pulls (it pushes after each; default: 10, "
                            "SD-PIPE's)")
    group.add_argument("--staleness", type=int, metavar="D",
                       help="hetpipe: waves a replica may run ahead of the slowest when it pulls (default: no "
                            "bound, SD-PIPE's)")
    group.add_argument("--hetero", type=float, default=0.0, metavar="X",
                       help="a process sleeps X seconds with probability --hetero-prob before the forward "
                            "and the backward of each minibatch (default: 0)")
    group.add_argument("--hetero-prob", type=float, default=0.1, help="the probability of each --hetero sleep")
    group.add_argument("--slow-rank", type=int, metavar="R", help="this rank is --slow-factor times slower")
    group.add_argument("--slow-factor", type=float, default=2.0, metavar="F",
                       help="--slow-rank's steps take F times as long")


def check_args(args, world_size=None):
    """The flags that cannot work together, as one line each (world size: known once launched)."""
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
                            "--slow-factor": (lambda v: v >= 1, "must be at least 1")})
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
    if args.save_every and args.sync in ("preduce", "hetpipe"):
        raise RecipeError(f"--save-every is not supported with --sync {args.sync} (its replicas meet at epoch "
                          f"ends only)")
    if world_size is None:
        return
    if world_size % args.stages:
        servers = args.sync == "hetpipe"  # (a server per stage)
        raise RecipeError(f"the world size {world_size} is not a multiple of --stages {args.stages}: for 2 replicas"
                          f"{' and the servers' if servers else ''}, torchrun --nproc_per_node="
                          f"{(2 + servers) * args.stages} recipes/pipeline/train.py ...")
    layout = Layout(args.stages, world_size, args.sync == "hetpipe")
    if layout.replicas < 1:
        raise RecipeError(f"--sync hetpipe needs the {args.stages} servers and at least one replica: "
                          f"{2 * args.stages} processes or more, not {world_size}")
    if args.slow_rank is not None and not 0 <= args.slow_rank < layout.replicas * args.stages:
        raise RecipeError(f"--slow-rank {args.slow_rank} is not a rank of the {layout.replicas} replica(s) x "
                          f"{args.stages} stage(s)")
