"""What mixed precision buys here: the apex recipe's training images/s at each --opt-level, beside ddp.

    python scripts/figures/precision/measure.py          # ResNet-18 at 112 px: writes figures/data/precision.csv, .json
    python scripts/figures/precision/measure.py --quick  # lenet at 16 px, fewer set-ups, one round (for tests)

Set-ups, at 1 process (all the cores' threads) and at 2 (the cores shared); on CUDA, one process per GPU,
at 1 GPU and at 2 where there are 2 (the GPUs CUDA_VISIBLE_DEVICES lets it use, the first N of them):
  ddp             the ddp recipe: fp32, no GradScaler, no autocast (the recipe apex adds to)
  O0              apex in fp32 (autocast off): what the apex recipe itself costs over ddp
  O1/O2/O3 bf16   O1 autocast in bf16, O2 the weights in bf16 with fp32 master copies, O3 the weights alone in
                  bf16 (and autocast), on a CPU with native bf16 (AVX512-BF16 or AMX-BF16)
                  or a GPU that torch says runs it
  O1 fp16         on a CPU with native fp16 (AVX512-FP16 or AMX-FP16), and on every CUDA GPU
each as it is and with --channels-last, and at 1 process O0 and O1 also with --compile (and with both; at 2
processes each compiled run would compile once more, and the part would outgrow its 15 minutes). A CPU without
native bf16 (or fp16) runs the low-precision set-ups 9 to 16 times slower than fp32 (recipes/common/amp.py):
they are left out, and precision.json says why. Each run trains one epoch of --steps steps on --synthetic
images (this script launches the recipe with the synthetic epoch cut to that many batches, and the
validation set to one batch per process) and reads the steady-state images/s (every step after the first,
which warms up, autotunes and compiles) from its metrics.csv. The set-ups run in turn, --repeats rounds of all
of them, so that a slow spell on a shared machine falls on every set-up alike; the results take the median per
set-up and its ratio to O0 at the same number of processes, and each run's memory from its summary.json (rank
0's weights, gradients, optimizer state with O2's masters, and peak). --compile runs share one TorchInductor cache
(the first round compiles cold). On CUDA the runs load with 4 workers (collating 38 MB of uint8 images per
step in the training process would slow it, as in scripts/figures/gpu/measure.py), and a GPU with too little
memory for -b needs a lower one. The runs go to runs/figures/precision/<set-up>-<N>p/round<R>; a run whose summary.json
is complete is not trained again. The CSV and JSON are written after every run.

On a GPU lent for minutes, the GPU table (scripts/figures/gpu/measure.py, make gpu-check) answers the same question
in one run of each set-up, timing its steps on the GPU; docs/results/precision.md's GPU form of this table is drawn
from it.
"""

import argparse
import json
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.figures import measuring  # noqa: E402
from scripts.figures.gpu.measure import SYNTHETIC_WORKERS, visible_gpus  # noqa: E402

FIELDS = ["setup", "recipe", "opt_level", "precision", "channels_last", "compile", "processes", "threads", "round",
          "images_per_s", "epoch_s", "param_mb", "grad_mb", "optimizer_mb", "peak_mb", "arch", "image_size",
          "batch_size", "steps", "workers", "cpu", "cores", "cpu_flags", "gpu", "torch"]
FULL = {"arch": "resnet18", "image_size": 112, "batch_size": 32, "steps": 12, "workers": 0}
GPU = {"arch": "resnet50", "image_size": 224, "batch_size": 256, "steps": 20, "workers": SYNTHETIC_WORKERS}
QUICK = {"arch": "lenet", "image_size": 16, "batch_size": 8, "steps": 4, "workers": 0}


def memory_mb(summary):
    """Rank 0's memory from its summary.json, in MB: the weights, the gradients, what the optimizer holds beside
    them (its momentum, and O2's fp32 master weights), and its peak (on CUDA the allocator's, else resident)."""
    memory = summary.get("memory") or {}
    peak = memory.get("peak_cuda_bytes", memory.get("peak_rss_bytes"))
    return {field: round(memory[key] / 1e6, 2) if key in memory else "" for field, key in
            (("param_mb", "param_bytes"), ("grad_mb", "grad_bytes"), ("optimizer_mb", "optimizer_bytes"))} | {
        "peak_mb": round(peak / 1e6, 1) if peak is not None else ""}


def launch(argv):
    """--launch TRAIN VAL SCRIPT FLAGS...: run the recipe SCRIPT with --synthetic's train and val sets cut to
    TRAIN and VAL images."""
    from recipes.common import data

    data.SYNTHETIC_TRAIN_IMAGES, data.SYNTHETIC_VAL_IMAGES = int(argv[0]), int(argv[1])
    sys.argv = argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")


def native(dtype, flags, cuda):
    """Does this machine run dtype at its own speed: a CUDA GPU (bf16 where torch says it can), or a CPU whose
    flags name it."""
    if cuda:
        import torch
        return dtype == "fp16" or torch.cuda.is_bf16_supported()
    return any(f"{kind}_{dtype}" in flags.split() for kind in ("avx512", "amx"))


def setups(quick, native_bf16, native_fp16, processes):
    """(name, recipe, opt_level, dtype, channels_last, compile) of every set-up, in the order they run."""
    levels = [("O0", None)] + [(level, "bf16") for level in (["O1"] if quick else ["O1", "O2", "O3"])
                               if native_bf16] + ([("O1", "fp16")] if native_fp16 and not quick else [])
    found = [("ddp", "ddp", None, None, False, False)]
    for level, dtype in levels:
        for channels_last in (False, True):
            for compiled in (False, True) if level in ("O0", "O1") and processes == 1 and not quick else (False,):
                name = " ".join(filter(None, [level, dtype, "+ channels_last" if channels_last else "",
                                              "+ compile" if compiled else ""]))
                found.append((name, "apex", level, dtype, channels_last, compiled))
    return found


def planned(quick, native_bf16, native_fp16, counts, repeats):
    """(round, processes, set-up) of every run, in the order they run: round by round."""
    return [(round_, processes, setup) for round_ in range(1, repeats + 1) for processes in counts
            for setup in setups(quick, native_bf16, native_fp16, processes)]


def run_name(setup, processes):
    return f"{setup.replace(' + ', '-').replace(' ', '-')}-{processes}p"


def parse_args():
    parser = measuring.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="lenet at 16 px: O0, O1 bf16 and ddp, one round, the "
                        "processes forked (measuring.run_forked)")
    parser.add_argument("--steps", type=int, help="steps per run (default: 12, on CUDA 20, quick 4)")
    parser.add_argument("-b", "--batch-size", type=int, help="per process (default: 32, on CUDA 256, quick 8)")
    parser.add_argument("--repeats", type=int, help="rounds of every set-up (default: 3, quick 1)")
    parser.add_argument("--processes", type=int, nargs="+", help="default: 1 and 2 (on CUDA: the GPUs, 2 at most)")
    parser.add_argument("--csv", default="figures/data/precision.csv")
    parser.add_argument("--runs", default="runs/figures/precision", help="where the run directories go")
    args = parser.parse_args()
    for flag, value in (("--steps", args.steps), ("--batch-size", args.batch_size), ("--repeats", args.repeats),
                        *(("--processes", n) for n in args.processes or [])):
        if value is not None and value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    return args


def main():
    if sys.argv[1:2] == ["--launch"]:
        return launch(sys.argv[2:])
    started = time.time()
    args = parse_args()
    import torch

    cuda = torch.cuda.is_available()
    model = dict(QUICK if args.quick else GPU if cuda else FULL)
    model.update({key: value for key, value in (("steps", args.steps), ("batch_size", args.batch_size)) if value})
    repeats = args.repeats or (1 if args.quick else 3)
    counts = sorted(set(args.processes or ([n for n in (1, 2) if n <= torch.cuda.device_count()] if cuda else [1, 2])))
    if cuda and counts[-1] > torch.cuda.device_count():
        measuring.bad_input(f"--processes {counts[-1]}: one process per GPU, and this machine has "
                            f"{torch.cuda.device_count()} GPU(s)")
    flags_found = measuring.cpu_flags()
    native_bf16, native_fp16 = native("bf16", flags_found, cuda), native("fp16", flags_found, cuda)
    machine = {**measuring.hardware(), "cpu_flags": flags_found}
    why = "torch.cuda.is_bf16_supported() is False" if cuda else f"/proc/cpuinfo lists {flags_found or 'none'}"
    left_out = [f"{dtype}: no native {dtype} ({why})" for dtype, ok in (("bf16", native_bf16), ("fp16", native_fp16))
                if not ok]
    info = {"native_bf16": native_bf16, "native_fp16": native_fp16, "left_out": left_out, "repeats": repeats,
            **model, "hardware": machine}
    out_csv, runs = Path(args.csv), Path(args.runs)
    rows, cache = [], (runs / "inductor-cache").resolve()
    for round_, processes, (name, recipe, level, dtype, channels_last, compiled) in planned(
            args.quick, native_bf16, native_fp16, counts, repeats):
        threads = max(1, measuring.usable_cores() // processes)
        batch = model["batch_size"]
        launcher = [__file__, "--launch", model["steps"] * batch * processes, batch * processes]
        flags = ["--synthetic", "-a", model["arch"], "--image-size", model["image_size"], "-b", batch,
                 "--epochs", 1, "-j", model["workers"], "-p", 1000,
                 *(["--opt-level", level] if level else []), *(["--amp-dtype", dtype] if dtype else []),
                 *(["--channels-last"] if channels_last else []), *(["--compile"] if compiled else [])]
        env = {"TORCHINDUCTOR_CACHE_DIR": str(cache), **({"CUDA_VISIBLE_DEVICES": visible_gpus(processes)}
                                                         if cuda else {})}
        out = runs / run_name(name, processes) / f"round{round_}"
        summary = measuring.train(recipe, processes, flags, out, threads, env=env, launcher=launcher,
                                   forked=args.quick)
        train = [r for r in measuring.read_csv(out / "metrics.csv") if r["split"] == "train"][0]
        rows.append({"setup": name, "recipe": recipe, "opt_level": summary.get("opt_level", ""),
                     "precision": summary.get("precision", "fp32"), "channels_last": channels_last,
                     "compile": compiled, "processes": processes, "threads": threads, "round": round_,
                     "images_per_s": round(float(train["images_per_s"]), 2),
                     "epoch_s": round(float(train["epoch_s"]), 2), **memory_mb(summary), **model, **machine})
        measuring.write_csv(out_csv, FIELDS, rows)
        out_csv.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n")
        print(f"round {round_}, {processes} {'GPU(s)' if cuda else 'process(es)'}: {name:32s} "
              f"{rows[-1]['images_per_s']:8.1f} images/s", flush=True)
    for line in left_out:
        print(f"left out: {line}")
    print(f"wrote {out_csv}")
    measuring.record_part(out_csv.parent, "precision", started)


if __name__ == "__main__":
    main()
