"""The GPU sweep: ResNet-50 at 224 px through every recipe, precision and layout, on 1 to all GPUs.

    make figures-gpu                        # every part: data/imagenet-like-gpu, this script, bench_precision.py,
                                            # plot_results.py
    make figures-gpu ONLY=jpeg              # one part: synthetic, jpeg, compression or precision
    python scripts/bench_gpu.py --jpeg DIR [--gpus 1 2 4 8] [--parts synthetic jpeg compression] [--list]
    python scripts/bench_gpu.py --skip-measured --minutes 5 ...   # a lease's share (scripts/gpu_check.py)

Three parts here (make figures-gpu's fourth, precision, is scripts/bench_precision.py on
CUDA: each --opt-level, --channels-last and --compile, in the CPU table's form), each
planned to finish within 9 minutes on one H100 (--list prints the runs and the
estimate), for each number of GPUs (default 1, 2, 4, ... and all of them):
  synthetic    --synthetic images (the GPUs' own speed): dp and ddp in fp32; apex at
               O0 (fp32), O1 fp16 and O1 bf16, each with and without --channels-last
  jpeg         the same on the JPEG folder (the CPU decodes: --decoder tensor, with the
               recipes' default workers), and apex O1 fp16 with --channels-last once more
               with --decoder gpu (nvjpeg decodes, the CPU only reads the files)
  compression  on --synthetic images: the compression recipe's hooks over NCCL (none,
               fp16, bf16, fp8-e4m3, fp8-e5m2, powersgd; the fp8s and powersgd with
               --error-feedback too); skipped below 2 GPUs, with one line: one GPU
               sends nothing, so its runs would measure nothing
with a batch of 256 per GPU (a run that runs out of GPU memory is tried again at
half its batch, down to 16), on the GPUs CUDA_VISIBLE_DEVICES lets it use (the
first N of them), with loader workers (the synthetic images too: collating and
pinning 38 MB of uint8 per step in the training process would slow it). Each run trains
enough epochs for --min-steps timed steps. Its images/s is the recipes' own
steady-state figure (every step after the first of each epoch, as in the CPU
tables), the median over the epochs after the first, which pays for cuDNN's
autotuning. Beside it, whole_epoch_images_per_s counts each epoch's loader start-up
and first batch too: with many workers and short epochs, the batches they prepare
while the first one loads flatter the steady figure of a run that waits for data.
Both are kept, with the share of the time spent waiting for data. No --seed: it
would select slower deterministic kernels; a small fixed --lr: throughput does not
depend on it, and the synthetic labels must not make a run diverge. fp32
convolutions run on TF32 tensor cores, as PyTorch allows by default. Each run's
progress lines are printed as they come, prefixed with its name.

Writes <figures-data>/throughput.csv and compression.csv (with the hardware) after
every run, so a stopped sweep keeps what it measured (rows this invocation does not
measure are kept); a run whose summary.json in runs/figures-gpu/ is complete is not
trained again, nor a batch that ran out of memory; checkpoints are deleted once a
run has finished; each part's minutes go into timings.csv (gpu-<part>).
plot_results.py draws them into figures/gpu_*.png and the GPU section of RESULTS.md.
Without CUDA, or without a package it needs, it says so in one line and exits 2.

A lease of a GPU is short, so the sweep can go run by run: --skip-measured leaves out the
runs that the CSVs already hold, and --minutes M starts a run only while --list's model
says it ends within M minutes of the start (the runs left are named at the end; the next
command goes on with them). --stand-in rehearses the plumbing on a CPU (scripts/gpu_check.py
--stand-in): the same plan and files, the runs made on the CPU with the flags given.
"""

import argparse
import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import check_python, measuring  # noqa: E402
from scripts.gpu_plan import PARTS, epochs_for, estimated_minutes, gpu_counts, plan, train_images  # noqa: E402

SYNTHETIC_WORKERS = 4  # enough to collate in-memory images; they decode nothing
THROUGHPUT_FIELDS = ["recipe", "data", "decoder", "precision", "channels_last", "gpus", "batch_size", "epochs",
                    "images_per_s", "whole_epoch_images_per_s", "data_wait_share", "arch", "image_size", "workers",
                    "cpu", "cores", "gpu", "torch"]
COMPRESSION_FIELDS = ["method", "error_feedback", "gpus", "batch_size", "epochs", "images_per_s",
                      "whole_epoch_images_per_s", "data_wait_share", "bytes_per_step", "compression_ratio", "arch",
                      "image_size", "workers", "cpu", "cores", "gpu", "torch"]


def parse_args(argv=None):
    parser = measuring.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jpeg", help="an ImageNet-style JPEG folder, for the jpeg part (make figures-gpu writes "
                                       "data/imagenet-like-gpu)")
    parser.add_argument("--gpus", type=int, nargs="+", help="numbers of GPUs (default: 1, 2, 4, ... and all)")
    parser.add_argument("--parts", nargs="+", choices=PARTS,
                        help="default: all of them (without --jpeg, all but jpeg)")
    parser.add_argument("-a", "--arch", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("-b", "--batch-size", type=int, default=256, help="per GPU (default: 256)")
    parser.add_argument("--min-steps", type=int, default=40,
                        help="timed steps per run at least, in the epochs after the first (default: 40)")
    parser.add_argument("-j", "--workers", type=int, help="loader workers per GPU on the JPEG folder (default: the "
                                                          "recipes' own: the cores this process may use, shared "
                                                          "between the GPUs, one left to each training process)")
    parser.add_argument("--lr", type=float, default=0.01, help="for a batch of 256, as the recipes' (default: 0.01)")
    parser.add_argument("--figures-data", default="figures/data/gpu", help="where the CSVs go")
    parser.add_argument("--runs", default="runs/figures-gpu", help="where the run directories go")
    parser.add_argument("--list", action="store_true", help="print each part's runs and estimated minutes, and exit")
    parser.add_argument("--skip-measured", action="store_true", help="leave out the runs the CSVs already hold")
    parser.add_argument("--minutes", type=float, help="start a run only if the model ends it within these minutes")
    parser.add_argument("--max-runs", type=int, help="at most this many runs")
    parser.add_argument("--stand-in", action="store_true", help="rehearse on a CPU: no CUDA needed")
    args = parser.parse_args(argv)
    for flag, value, low in (("--batch-size", args.batch_size, 1), ("--image-size", args.image_size, 8),
                             ("--min-steps", args.min_steps, 1), ("--workers", args.workers, 0)):
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    if args.gpus and min(args.gpus) < 1:
        parser.error(f"--gpus must be at least 1 each, got {args.gpus}")
    if args.jpeg and not (Path(args.jpeg) / "train").is_dir():
        parser.error(f"--jpeg {args.jpeg} has no train/ folder (make figures-gpu writes data/imagenet-like-gpu)")
    args.parts = args.parts or [part for part in PARTS if part != "jpeg" or args.jpeg]
    if "jpeg" in args.parts and not args.jpeg:
        parser.error("the jpeg part needs --jpeg DIR (make figures-gpu writes data/imagenet-like-gpu)")
    return args


def throughput(out, steps, images_per_step):
    """(the recipe's steady images/s, whole-epoch images/s, share of the time spent waiting for data), each the
    median over the epochs after the first."""
    with open(out / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["split"] == "train"][1:]
    return (statistics.median(float(r["images_per_s"]) for r in rows),
            statistics.median(steps * images_per_step / float(r["epoch_s"]) for r in rows),
            statistics.median(float(r["data_s"]) / float(r["epoch_s"]) for r in rows))


def visible_gpus(count):
    """CUDA_VISIBLE_DEVICES for the first `count` GPUs this process may use (a scheduler may have chosen them)."""
    allowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in allowed.split(",") if i.strip()] if allowed else [str(i) for i in range(count)]
    return ",".join(ids[:count])


def ran_out_of_memory(out, launch):
    """Whether out holds this very launch, failed for want of GPU memory (kept, so a restart does not retry it)."""
    try:
        return (json.loads((out / "launch.json").read_text()) == launch
                and "out of memory" in (out / "failed.log").read_text())
    except (OSError, ValueError):
        return False


def train(args, name, recipe, gpus, data, flags, cores):
    """One run, at batch 256 per GPU or the largest half of it that fits; returns what the CSV rows need."""
    batch = args.batch_size
    processes = 1 if recipe == "dp" else gpus  # DataParallel: one process drives every GPU
    threads = max(1, cores // processes)
    if data == "synthetic":
        workers_per_gpu = min(SYNTHETIC_WORKERS, max(1, cores // gpus))
    else:  # (the recipes' default on CUDA)
        workers_per_gpu = args.workers if args.workers is not None else max(1, cores // gpus - 1)
    workers = workers_per_gpu * gpus // processes  # dp's one process loads for every GPU
    data_flags = ["--synthetic"] if data == "synthetic" else [args.jpeg]
    env = {"CUDA_VISIBLE_DEVICES": "" if args.stand_in else visible_gpus(gpus)}
    while True:
        epochs, steps = epochs_for(train_images(args, data), gpus, batch, args.min_steps)
        per_process = batch * gpus if recipe == "dp" else batch  # dp splits one batch between its GPUs
        run_flags = [*data_flags, "-j", str(workers), "-a", args.arch, "--image-size", str(args.image_size),
                     "-b", str(per_process), "--lr", str(args.lr), "--epochs", str(epochs), "-p", "10", *flags]
        out = Path(args.runs) / f"{name}-b{batch}"
        launch = measuring.launch_of(recipe, processes, run_flags, env, threads)
        summary = None if ran_out_of_memory(out, launch) else measuring.train(
            recipe, processes, run_flags, out, threads, env, check=False, echo=name)
        if summary is not None:
            for checkpoint in out.glob("*.pt"):  # 200 MB each for ResNet-50; the sweep needs only the metrics
                checkpoint.unlink()
            rate, whole_epoch_rate, waiting = throughput(out, steps, batch * gpus)
            return {"summary": summary, "batch_size": batch, "epochs": epochs, "images_per_s": round(rate, 1),
                    "whole_epoch_images_per_s": round(whole_epoch_rate, 1), "data_wait_share": round(waiting, 4),
                    "workers": workers}
        log = (out / "failed.log").read_text()
        if "out of memory" not in log or batch <= 16:
            sys.exit(f"error: {recipe} {' '.join(run_flags)} failed:\n{log[-3000:]}")
        print(f"{name}: out of GPU memory at batch {batch} per GPU; trying {batch // 2}", flush=True)
        batch //= 2


def part_of(row):
    """The part that measured a row of throughput.csv or compression.csv."""
    return row.get("data", "compression")


def kept_rows(path, counts, parts, every=False):
    """The rows of an earlier sweep that this one does not measure again: other GPU counts, other parts (every:
    all of them, --skip-measured)."""
    if not path.exists():
        return []
    return [r for r in measuring.read_csv(path) if every or int(r["gpus"]) not in counts or part_of(r) not in parts]


def key(row):
    """What a row measured: (the recipe, data, decoder, precision and channels_last; or the method and error
    feedback), the GPUs."""
    if "method" in row:
        return str(row["method"]), str(row["error_feedback"]), str(row["gpus"])
    return (str(row["recipe"]), str(row["data"]), str(row["decoder"]), str(row["precision"]),
            str(row["channels_last"]), str(row["gpus"]))


def planned_key(part, recipe, gpus, data, decoder, variant, flag):
    if part == "compression":
        return str(variant), str(int(flag)), str(gpus)
    return recipe, data, decoder, variant, str(int(flag)), str(gpus)


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        import torch

        counts = gpu_counts(max(torch.cuda.device_count(), 1), args.gpus)
        runs, skipped = plan(args, counts)
        cores = measuring.usable_cores()
        for part in args.parts:
            minutes = estimated_minutes(args, runs.get(part, []), cores)
            print(f"{part}: {len(runs.get(part, []))} run(s), about {minutes:.1f} min by the model of --list (H100s)"
                  f"{'; ' + skipped[part] if part in skipped else ''}")
            for name, recipe, gpus, data, *_, flags in runs.get(part, []):
                print(f"  {name:36s} {recipe} on {gpus} GPU(s), {data}: {' '.join(flags)}")
        return
    # (one line and exit 2 without CUDA or a package it needs)
    check_python.require("figures-gpu", gpu=not args.stand_in)
    import torch

    counts = gpu_counts(1 if args.stand_in else torch.cuda.device_count(), args.gpus)
    cores = measuring.usable_cores()
    machine = measuring.hardware()
    if args.stand_in:
        machine["gpu"] = "none (a CPU standing in)"
    common = {"arch": args.arch, "image_size": args.image_size, **machine}
    figures_data = Path(args.figures_data)
    throughput_rows = kept_rows(figures_data / "throughput.csv", counts, args.parts, args.skip_measured)
    compression_rows = kept_rows(figures_data / "compression.csv", counts, args.parts, args.skip_measured)
    measured_keys = {key(r) for r in throughput_rows + compression_rows} if args.skip_measured else set()
    runs, skipped = plan(args, counts)
    begun, trained, left = time.time(), 0, []
    for part in args.parts:
        started = time.time()
        measuring.counts.update(trained=0, reused=0, reused_s=0.0)
        if part in skipped:
            print(skipped[part], flush=True)
        for planned in runs.get(part, []):
            name, recipe, gpus, data, decoder, variant, flag, flags = planned
            if planned_key(part, recipe, gpus, data, decoder, variant, flag) in measured_keys:
                continue
            minutes = estimated_minutes(args, [planned], cores)
            if (args.max_runs is not None and trained >= args.max_runs or args.minutes is not None
                    and (time.time() - begun) / 60 + minutes > args.minutes):
                left.append(name)
                continue
            trained += 1
            measured = train(args, name, recipe, gpus, data, flags, cores)
            summary = measured.pop("summary")
            if part == "compression":
                compression_rows.append({"method": variant, "error_feedback": int(flag), "gpus": gpus,
                                         "bytes_per_step": round(summary.get("bytes_per_step") or 0),
                                         "compression_ratio": round(summary.get("compression_ratio") or 0, 3),
                                         **measured, **common})
                measuring.write_csv(figures_data / "compression.csv", COMPRESSION_FIELDS, compression_rows)
            else:
                throughput_rows.append({"recipe": recipe, "data": data, "decoder": decoder, "precision": variant,
                                       "channels_last": int(flag), "gpus": gpus, **measured, **common})
                measuring.write_csv(figures_data / "throughput.csv", THROUGHPUT_FIELDS, throughput_rows)
            print(f"{name:>36}: {measured['images_per_s']:8.1f} images/s (batch {measured['batch_size']} per "
                  f"GPU, data wait {100 * measured['data_wait_share']:.0f} %)", flush=True)
        if runs.get(part) and measuring.counts["trained"] + measuring.counts["reused"]:
            measuring.record_part(figures_data, f"gpu-{part}", started)
    print(f"wrote {figures_data}/" + (f"; left for the next command ({len(left)}): {' '.join(left)}" if left else
                                      "; every planned run is measured"), flush=True)


if __name__ == "__main__":
    main()
