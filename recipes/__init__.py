"""Data-parallel training recipes for PyTorch: one script per technique.

RECIPES is the catalogue: every recipe once, in reading order. The tests launch and check each recipe from
it, the one-GPU check runs its GPU checks (scripts/gpu/smoke.py), and scripts/checks/recipe_pages.py writes
README.md's table of recipes and its diffs, and docs/flags.md's list of who takes which flags, from it; no
other list of the recipes exists. A new recipe is its folder (train.py, whose docstring is its --help, and
README.md), its test file (tests/recipes/) and one entry here.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuCheck:
    """One run of a recipe on one GPU, a few steps long (make gpu-smoke)."""
    name: str
    flags: tuple = ()
    processes: int = 1
    nccl_rules: bool = False  # run under scripts/harness/nccl_rules.py (tensors on the group their device needs)


@dataclass(frozen=True)
class Recipe:
    name: str  # its folder: recipes/<name>/
    lesson: str  # what it teaches, in one line (README.md's table)
    read_against: str = ""  # the recipe its diff is read against ("": read it whole, then its modules)
    diff_shows: str = ""  # what that diff shows, in a few words (README.md's diff commands)
    diff_at_most: int = 0  # the most lines that diff may change, removed plus added (tests/recipes/test_shape.py)
    diff_adds: tuple = ()  # the code that diff adds, each named in the recipe's README (test_shape.py)
    processes: int | None = None  # how the tests launch it: None as one plain process, else that many processes
    evaluated_on: int | None = None  # the processes the tests evaluate its checkpoints on (another layout)
    trained_with: tuple = ()  # the flags of those tests' training run and of their evaluation
    evaluated_with: tuple = ()  # the evaluation's own flags beside them
    gpu_checks: tuple = ()  # its one-GPU checks (GpuCheck); none listed: one run at its defaults, named for it
    # its many groups and point-to-point messages run under NCCL's rules in every test, on gloo as on NCCL
    tested_under_nccl_rules: bool = False


MIXED = ("--ema-decay", "0.99", "--sync-bn", "--accum-steps", "2", "--mixup-alpha", "0.2", "--cutmix-alpha", "1.0")
OPT_LEVELS = ("O0", "O1", "O2", "O3")
COMPRESS = ("none", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "powersgd")
SHARDS = ("none", "optimizer", "grad-op", "full")

RECIPES = [
    Recipe("nd", "one device, no data parallelism: the baseline"),
    Recipe("dp", "`torch.nn.DataParallel`: one process, many GPUs", read_against="nd",
           diff_shows="one wrapper", diff_at_most=25, diff_adds=("nn.DataParallel(model)",)),
    Recipe("ddp", "`DistributedDataParallel`: one process per device", read_against="nd",
           diff_shows="process group, sampler, DDP wrapper, rank-0 output, no_sync", diff_at_most=52,
           diff_adds=("init_process_group", "DistributedSampler", "set_epoch(epoch)", "DDP(model", "ctx.is_main",
                      "no_sync()"),
           processes=2, evaluated_on=3,
           gpu_checks=(GpuCheck("ddp-ema-syncbn-accum-mix", MIXED, nccl_rules=True),
                       *(GpuCheck(f"ddp-decoder-{decoder}", ("--decoder", decoder)) for decoder in ("pil", "gpu")))),
    Recipe("apex", "DDP + mixed precision with `torch.amp` (apex's `--opt-level` names); what it buys: "
                   "[measured](RESULTS.md#mixed-precision)", read_against="ddp",
           diff_shows="autocast and GradScaler", diff_at_most=40,
           diff_adds=("amp.initialize", "autocast()", "scaler.scale(", "scaler.step(optimizer)", "scaler.update()"),
           processes=2, evaluated_on=3,
           gpu_checks=tuple(GpuCheck(f"apex-{level}{'-cl' if channels_last else ''}",
                                     ("--opt-level", level, *(["--channels-last"] if channels_last else [])))
                            for level in OPT_LEVELS for channels_last in (False, True))),
    Recipe("compression", "DDP with compressed gradients: fp16, bf16, fp8, PowerSGD communication hooks",
           read_against="ddp", diff_shows="one communication hook, and its byte count", diff_at_most=40,
           diff_adds=("register_comm_hook(state, hook)", "bytes_per_step"),
           processes=2, evaluated_on=3, trained_with=("--compress", "powersgd"),
           gpu_checks=(*(GpuCheck(f"compression-{method}", ("--compress", method)) for method in COMPRESS),
                       GpuCheck("compression-fp8-e4m3-ef", ("--compress", "fp8-e4m3", "--error-feedback")))),
    Recipe("fsdp", "sharded data parallel: ZeRO-1, ZeRO-2 and FSDP/ZeRO-3, the bytes per rank measured",
           read_against="apex", diff_shows="ZeRO-1, ZeRO-2, FSDP: what each rank shards", diff_at_most=112,
           diff_adds=("--shard", "ZeroRedundancyOptimizer", "fully_shard", "set_requires_gradient_sync"),
           processes=2, evaluated_on=3,
           gpu_checks=tuple(GpuCheck(f"fsdp-{shard}-{level}", ("--shard", shard, "--opt-level", level, "--amp-dtype",
                                                               "fp16", "--channels-last"))
                            for shard in SHARDS for level in ("O0", "O1"))),
    # 1 server and 2 workers; evaluated by 2 servers, 1 validator and 2 workers. On one GPU its three processes
    # share it: push and pull go over gloo on the CPU, and --dist-backend gloo makes the default group gloo too
    # (NCCL takes a GPU per process)
    Recipe("ps", "a parameter server: servers, Zeno validators and workers push and pull; sync and async; "
                 "Byzantine workers", processes=3, evaluated_on=5, tested_under_nccl_rules=True,
           evaluated_with=("--servers", "2", "--validators", "1", "--aggregate", "zenops"),
           gpu_checks=(GpuCheck("ps-1-server-2-workers", ("--servers", "1", "--aggregate", "median", "--dist-backend",
                                                          "gloo", "-b", "16"), processes=3, nccl_rules=True),)),
    # 2 stages of 1 replica; evaluated by 2 stages of 2 replicas
    Recipe("pipeline", "pipeline stages x data-parallel replicas: allreduce, SD-PIPE's partial reduce, AD-PSGD, "
                       "HetPipe; stragglers", processes=2, evaluated_on=4, trained_with=("--stages", "2"),
           tested_under_nccl_rules=True,
           gpu_checks=(GpuCheck("pipeline-stages-1", ("--stages", "1", "--microbatches", "2", "--snapshot-every",
                                                      "0.05"), nccl_rules=True),)),
]


def recipe(name):
    """The catalogue's entry for a recipe's name."""
    return next(entry for entry in RECIPES if entry.name == name)


def gpu_checks(entry):
    """A recipe's one-GPU checks: those listed, else one run at its defaults."""
    return entry.gpu_checks or (GpuCheck(entry.name),)
