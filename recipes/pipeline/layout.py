"""Which rank is which stage of which replica (and what its loop works with), the pipeline's flags, and the flags
that cannot work together.

Rank r is stage r mod S of replica r div S (--stages S). With --sync hetpipe the last S ranks
are the stages' parameter servers: one object says it, so that no part computes it again.
"""

import types
from dataclasses import dataclass

import torch.distributed as dist
from torch.nn.utils import parameters_to_vector

from recipes.common import RecipeError, cli, models
from recipes.pipeline import pipedream, stragglers
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

    def pipe(self, args, rank, module, params, schedule, criterion, tally, device, sample_shape, pipe_group,
             stage_group, claim_groups, steps_per_epoch):
        """What a training rank's loop works with: its stage and the schedule that runs it, its place among the
        replicas and their groups, and each --sync method's state (preduce's queue; hetpipe's server, the
        weights last pulled and their version)."""
        stage, replica = self.stage(rank), self.replica(rank)
        fields = dict(schedule=schedule, params=params, layout=self, replica=replica, replicas=self.replicas,
                      slots=stragglers.inject(module, args), is_first=stage == 0, is_last=stage == self.stages - 1,
                      last_rank=self.rank(replica, self.stages - 1), pipe_group=pipe_group,
                      stage_group=stage_group, steps_per_epoch=steps_per_epoch,
                      preduce=PartialReduce(args, self, stage, replica, claim_groups[replica],
                                            dist.distributed_c10d._get_default_store())
                      if args.sync == "preduce" else None,
                      server=self.server(stage), vector=parameters_to_vector(params).detach().cpu(), versions=[-1],
                      **pipedream.fields(module, stage, self, replica, pipe_group, device, sample_shape, criterion,
                                         tally, claim_groups[replica] if claim_groups else None, args.batch_size))
        return types.SimpleNamespace(**fields)


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
