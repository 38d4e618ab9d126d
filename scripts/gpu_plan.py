"""The GPU sweep's plan (scripts/bench_gpu.py): which runs each part makes at each number of GPUs, how many
epochs each trains, and --list's estimate of the minutes they take."""

import math
from pathlib import Path

from recipes.common.data import SYNTHETIC_TRAIN_IMAGES, SYNTHETIC_VAL_IMAGES
from scripts import measuring

PARTS = ["synthetic", "jpeg", "compression"]
# apex's three precisions: (name, --opt-level, --amp-dtype)
PRECISIONS = [("fp32", "O0", None), ("fp16", "O1", "fp16"), ("bf16", "O1", "bf16")]
COMPRESSION = [("none", False), ("fp16", False), ("bf16", False), ("fp8-e4m3", False), ("fp8-e4m3", True),
               ("fp8-e5m2", False), ("fp8-e5m2", True), ("powersgd", False), ("powersgd", True)]


def gpu_counts(available, asked=None):
    """1, 2, 4, ... up to the GPUs there are, and all of them; or the counts asked for (at most all)."""
    if asked:
        too_many = [n for n in asked if n > available]
        if too_many:
            measuring.bad_input(f"--gpus {' '.join(map(str, too_many))}: this machine has {available} GPU(s)")
        return sorted(set(asked))
    return sorted({2 ** k for k in range(available.bit_length()) if 2 ** k <= available} | {available})


def precision_runs(gpus, data):
    """(name, recipe, decoder, precision, channels_last, extra flags) of the synthetic or jpeg part at this many
    GPUs."""
    decoder = "tensor" if data == "jpeg" else ""
    runs = [(f"{recipe}-fp32-{data}-{gpus}", recipe, decoder, "fp32", False, []) for recipe in ("dp", "ddp")]
    for precision, opt_level, dtype in PRECISIONS:
        for channels_last in (False, True):
            flags = ["--opt-level", opt_level, *(["--amp-dtype", dtype] if dtype else []),
                     *(["--channels-last"] if channels_last else [])]
            name = f"apex-{precision}{'-cl' if channels_last else ''}-{data}-{gpus}"
            runs.append((name, "apex", decoder, precision, channels_last, flags))
    if data == "jpeg":  # the fastest set-up once more, the JPEGs decoded on the GPU
        runs.append((f"apex-fp16-cl-jpeg-gpu-decoder-{gpus}", "apex", "gpu", "fp16", True,
                     ["--opt-level", "O1", "--amp-dtype", "fp16", "--channels-last", "--decoder", "gpu"]))
    return runs


def compression_runs(gpus):
    """(name, method, error feedback, extra flags) of the compression part at this many GPUs."""
    return [(f"compression-{method}{'-ef' if ef else ''}-{gpus}", method, ef,
             ["--compress", method, *(["--error-feedback"] if ef else [])]) for method, ef in COMPRESSION]


# --list's estimate, a model, not a measurement: ResNet-50 training images/s per H100 as published for current
# PyTorch (fp32 on TF32 tensor cores; AMP), one CPU core's JPEG decoding (RESULTS.md, "Input pipeline"), and each
# run's start-up (imports, cuDNN's autotuning, the loader workers); evaluation at three times the training rate
MODEL_IMAGES_PER_S = {"fp32": 1000, "fp16": 2500, "bf16": 2500}
MODEL_DECODE_PER_CORE, MODEL_START_S = 250, 30


def estimated_minutes(args, runs, cores):
    """--list: the minutes a part's runs take by the model above, at the batch asked for (a run that does not fit
    takes longer: it is tried again at half its batch)."""
    seconds = 0.0
    for _, _, gpus, data, decoder, variant, _, flags in runs:
        rate = MODEL_IMAGES_PER_S.get(variant, MODEL_IMAGES_PER_S["fp32"]) * gpus  # (compression: fp32)
        if data == "jpeg" and decoder != "gpu":
            rate = min(rate, MODEL_DECODE_PER_CORE * max(1, cores - gpus))
        epochs, _ = epochs_for(train_images(args, data), gpus, args.batch_size, args.min_steps)
        val = SYNTHETIC_VAL_IMAGES if data == "synthetic" else train_images(args, data, "val")
        seconds += MODEL_START_S + epochs * (train_images(args, data) / rate + val / (3 * rate))
    return seconds / 60


def epochs_for(train_images, gpus, batch_size, min_steps):
    """The first epoch warms up; enough epochs after it for min_steps steps."""
    steps = math.ceil(train_images / gpus) // batch_size  # DistributedSampler pads, the loader drops the rest
    return 1 + math.ceil(min_steps / max(steps, 1)), steps


def train_images(args, data, split="train"):
    if data == "synthetic":
        return SYNTHETIC_TRAIN_IMAGES
    return sum(1 for path in (Path(args.jpeg) / split).rglob("*") if path.is_file())


def plan(args, counts):
    """{part: [(name, recipe, gpus, data, decoder, precision or method, channels_last or error feedback, flags)]}, and
    the parts skipped, with why."""
    runs, skipped = {}, {}
    for part in args.parts:
        if part == "compression":
            for gpus in counts:
                if gpus < 2:
                    skipped[part] = ("compression at 1 GPU: skipped, one GPU sends no gradients, so the hooks would "
                                     "measure nothing; it runs on 2 GPUs or more")
                    continue
                runs.setdefault(part, []).extend((name, "compression", gpus, "synthetic", "", method, ef, flags)
                                                 for name, method, ef, flags in compression_runs(gpus))
        else:
            for gpus in counts:
                runs.setdefault(part, []).extend((name, recipe, gpus, part, decoder, precision, channels_last, flags)
                                                 for name, recipe, decoder, precision, channels_last, flags
                                                 in precision_runs(gpus, part))
    return runs, skipped
