"""Training throughput against the number of processes, and the recipes' overhead over a bare loop.

    python scripts/figures/scaling/measure.py --jpeg data/imagenet-like     # writes figures/data/scaling.csv

For each world size (CPU: 1 and 2 processes of --threads threads each, so that
processes x threads stays within the cores; CUDA: 1 .. all GPUs, one each) it runs
  recipe   the ddp recipe (and nd, at one process) for one epoch on --synthetic
           data and on the JPEG folder (three on a CPU, where one lasts seconds,
           and the medians taken), and reads the steady-state training images/s
           (every step after the first) and the epoch time from the run
           directory's metrics.csv;
  bare     a loop of forward, backward and optimizer step on one in-memory batch
           (plain for nd, DDP-wrapped for ddp): no loader, no logging, no
           metrics, with the same model, batch and threads; run before and after
           the recipes and averaged, so a slow spell on a shared machine does
           not fall on one side only.
recipe images/s / bare images/s is the recipes' overhead, measured side by side.
With several processes it also runs that many unconnected copies of the plain
bare loop at once ("independent"): their summed images/s is what the machine
gives that many processes at all, the ceiling that DDP's scaling is judged by.
On CUDA the runs use the apex recipe's mixed precision (--opt-level O1) and
channels_last, with ResNet-50 at 224 px unless told otherwise (scripts/figures/gpu/measure.py
is the GPU table, and its scaling over GPUs). The recipe runs go to runs/figures/scaling/; a run whose
summary.json is complete is not trained again (the bare loops are always measured).

--parts cluster (make figures runs both: machine cluster) measures DDP on the virtual cluster, 1 to 8 nodes over
links sized after real clusters', beside the model of a DDP step: scripts/figures/scaling/cluster.py (it needs
root).
"""

import argparse
import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from scripts.figures import measuring  # noqa: E402
from scripts.figures.measuring import hardware, run, write_csv  # noqa: E402
from scripts.figures.scaling import cluster  # noqa: E402

FIELDS = ["kind", "recipe", "data", "processes", "threads", "arch", "image_size", "batch_size", "images_per_s",
          "epoch_s", "cpu", "cores", "gpu", "torch"]


def bare_loop(args):
    """One process of the bare loop (under torchrun when there are several): print images/s as JSON."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from recipes.common import distributed, models

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True  # as the recipes run without --seed
    model = models.build_model(args.arch, 1000, args.image_size).to(device)
    memory_format = torch.channels_last if cuda else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    if args.ddp:
        if world_size == 1:  # a group of one, as the ddp recipe forms when not launched
            dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group("nccl" if cuda else "gloo")
        model = DDP(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    images = images.contiguous(memory_format=memory_format)
    target = torch.randint(0, 1000, (args.batch_size,), device=device)

    scaler = torch.amp.GradScaler(device.type, enabled=cuda)  # the apex recipe's O1: fp16 with loss scaling

    def step():
        with torch.autocast(device.type, enabled=cuda):
            loss = criterion(model(images), target)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    if args.ddp:
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # as long as the slowest rank
        distributed.cleanup()  # (its groups held: see cleanup)
    if args.ddp and int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps({"images_per_s": world_size * args.batch_size * args.steps / seconds.item()}))
    elif not args.ddp:  # unconnected copies: each reports its own rate, the caller adds them up
        print(json.dumps({"images_per_s": args.batch_size * args.steps / seconds.item()}))


def bare(processes, threads, args, ddp):
    result = run(processes, [__file__, "--bare-worker", *(["--ddp"] if ddp else []), "-a", args.arch,
                                "--image-size", str(args.image_size), "-b", str(args.batch_size),
                                "--steps", str(args.steps), "--warmup", str(args.warmup)], threads)
    return sum(json.loads(line)["images_per_s"] for line in result.stdout.splitlines() if line.startswith("{"))


def recipe_run(recipe, processes, threads, data_args, epochs, args, out):
    """images/s and epoch seconds of a run of `epochs` epochs: the medians of its training epochs."""
    flags = [*data_args, "-a", args.arch, "--image-size", str(args.image_size), "-b", str(args.batch_size),
             "--epochs", str(epochs)]  # no --seed: it would select slower deterministic kernels
    if torch.cuda.is_available():
        flags += ["--opt-level", "O1", "--channels-last"] if recipe == "apex" else []
    measuring.train(recipe, processes, flags, out, threads)
    with open(out / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "train"]
    return (statistics.median(float(r["images_per_s"]) for r in rows),
            statistics.median(float(r["epoch_s"]) for r in rows))


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jpeg", help="an ImageNet-style JPEG folder (scripts/make_demo_data.py --imagenet-like)")
    parser.add_argument("-a", "--arch", help="default: resnet18 on CPU, resnet50 on CUDA")
    parser.add_argument("--image-size", type=int, help="default: 32 on CPU (an epoch in minutes), 224 on CUDA")
    parser.add_argument("-b", "--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--processes", type=int, nargs="+", help="world sizes (default: 1 2 on CPU, 1..GPUs)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process (default 1)")
    parser.add_argument("-j", "--workers", type=int, help="loader workers per process, JPEG runs (default: 1 on "
                                                          "CPU, the cores shared between the GPUs on CUDA)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps of the bare loop")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps of the bare loop first")
    parser.add_argument("--csv", default="figures/data/scaling.csv")
    parser.add_argument("--runs", default="runs/figures/scaling", help="where the recipes' run directories go")
    parser.add_argument("--parts", nargs="+", choices=["machine", "cluster"], default=["machine", "cluster"],
                        help="machine: the rows above, on this machine's processes; cluster: DDP on the virtual "
                             "cluster (scripts/figures/scaling/cluster.py; it needs root)")
    parser.add_argument("--cluster-data", default="data/mnist5k", help="the digits the cluster's runs train on")
    parser.add_argument("--cluster-nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--cluster-batch", type=int, default=32, help="per node, as the seed's 208 a GPU")
    parser.add_argument("--cluster-epochs", type=int, default=measuring.ACCURACY_EPOCHS)
    parser.add_argument("--cluster-steps", type=int, default=40, help="timed steps of the stand-in")
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS, help="the cluster's training runs")
    parser.add_argument("--bare-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ddp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    args.arch = args.arch or ("resnet50" if cuda else "resnet18")
    args.image_size = args.image_size or (224 if cuda else 32)
    args.workers = args.workers if args.workers is not None else (
        max(1, measuring.usable_cores() // torch.cuda.device_count()) if cuda else 1)
    if args.bare_worker:
        return bare_loop(args)

    if "machine" not in args.parts:
        cluster.measure(args, Path(args.csv).parent)
        measuring.record_part(Path(args.csv).parent, "scaling", started, adding=True)
        return
    world_sizes = args.processes or (list(range(1, torch.cuda.device_count() + 1)) if cuda else [1, 2])
    if not cuda and max(world_sizes) * args.threads > measuring.usable_cores():
        print(f"warning: {max(world_sizes)} processes x {args.threads} threads oversubscribe "
              f"{measuring.usable_cores()} cores", file=sys.stderr)
    if args.jpeg and not (Path(args.jpeg) / "train").is_dir():
        sys.exit(f"error: {args.jpeg} has no train/ folder")
    main_recipe = "apex" if cuda else "ddp"
    # (name, flags, epochs): an epoch of the JPEG folder lasts seconds on a CPU, so it runs three, for a median
    datasets = [("synthetic", ["--synthetic", "-j", "0"], 1)]
    if args.jpeg:
        datasets.append(("jpeg", [args.jpeg, "-j", str(args.workers)], 1 if cuda else 3))

    rows, machine = [], hardware()
    common = {"arch": args.arch, "image_size": args.image_size, "batch_size": args.batch_size, **machine}
    for processes in world_sizes:
        threads = args.threads
        recipes = ["nd", main_recipe] if processes == 1 and not cuda else [main_recipe]
        baselines = {recipe: recipe != "nd" for recipe in recipes}  # name: DDP-wrapped?
        if processes > 1:  # unconnected copies: what this machine gives that many processes at all
            baselines["independent"] = False
        bare_rates = {name: [bare(processes, threads, args, ddp)] for name, ddp in baselines.items()}
        for recipe in recipes:
            for data_name, data_args, epochs in datasets:
                out = Path(args.runs) / f"{recipe}-{data_name}-{processes}"
                rate, epoch_s = recipe_run(recipe, processes, threads, data_args, epochs, args, out)
                rows.append({"kind": "recipe", "recipe": recipe, "data": data_name, "processes": processes,
                             "threads": threads, "images_per_s": round(rate, 2), "epoch_s": round(epoch_s, 2),
                             **common})
                print(f"{recipe:>4} {data_name:>9} {processes} process(es): {rate:8.1f} images/s, "
                      f"epoch {epoch_s:.1f} s", flush=True)
        for name, ddp in baselines.items():
            bare_rates[name].append(bare(processes, threads, args, ddp))
            rate = sum(bare_rates[name]) / 2
            rows.append({"kind": "bare", "recipe": name, "data": "memory", "processes": processes,
                         "threads": threads, "images_per_s": round(rate, 2), "epoch_s": "", **common})
            print(f"bare loop, {name}, {processes} process(es): {rate:8.1f} images/s "
                  f"(before {bare_rates[name][0]:.1f}, after {bare_rates[name][1]:.1f})", flush=True)
    write_csv(args.csv, FIELDS, rows)
    if "cluster" in args.parts:
        cluster.measure(args, Path(args.csv).parent)
    measuring.record_part(Path(args.csv).parent, "scaling", started)


if __name__ == "__main__":
    main()
