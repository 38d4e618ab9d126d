"""The GPU table's plan (scripts/figures/gpu/measure.py): its set-ups, the flags each runs with, the speed targets,
and the model of the seconds each takes on one H100, from which scripts/gpu/check.py --plan fits a lease.

The table, at 1 GPU, in the order it is measured: the set-ups a user chooses between on --synthetic images
(ddp in fp32; apex at O0 with channels_last; O1 fp16 and O1 bf16 with channels_last, fp16 also with --compile;
O2 fp16 with channels_last, the seed tutorial's set-up, beside O1); the bare loop
(scripts/figures/bare_loop.py: plain PyTorch, no recipe) in fp32 and at the fastest of those set-ups but O2 (the
bare loop has no master weights); and that fastest set-up once more on a folder of JPEGs under each --decoder.
Beyond 1 GPU (a node with more), the scaling part runs ddp fp32 and the fastest set-up on 2, 4, ... GPUs, and the
compression part the compression recipe's hooks over NCCL.
"""

import json
from pathlib import Path
from typing import NamedTuple

from scripts.figures import measuring

PARTS = ["table", "scaling", "compression"]
ONE_GPU = "one GPU has no peer to scale to, nor to send gradients to; it runs on 2 GPUs or more"
FASTEST = None  # a set-up's field taken from the fastest set-up measured above it


class Setup(NamedTuple):
    kind: str  # "recipe", or "bare" for scripts/figures/bare_loop.py
    recipe: str  # ddp or apex ("" for the bare loop)
    decoder: str  # "" on --synthetic images, else the --decoder of the JPEG folder
    precision: str  # fp32, fp16 or bf16
    channels_last: bool
    compile: bool
    opt_level: str = ""  # apex's --opt-level (O0, O1, O2); "" for ddp and the bare loop


TABLE = [Setup("recipe", "ddp", "", "fp32", False, False),
         Setup("recipe", "apex", "", "fp32", True, False, "O0"),
         Setup("recipe", "apex", "", "fp16", True, False, "O1"),
         Setup("recipe", "apex", "", "fp16", True, True, "O1"),
         Setup("recipe", "apex", "", "bf16", True, False, "O1"),
         Setup("recipe", "apex", "", "fp16", True, False, "O2"),
         Setup("bare", "", "", "fp32", False, False),
         Setup("bare", "", "", FASTEST, FASTEST, FASTEST),
         *(Setup("recipe", FASTEST, decoder, FASTEST, FASTEST, FASTEST) for decoder in ("tensor", "pil", "gpu"))]
COMPRESSION = [("none", False), ("fp16", False), ("bf16", False), ("fp8-e4m3", False), ("fp8-e4m3", True),
               ("fp8-e5m2", False), ("fp8-e5m2", True), ("powersgd", False), ("powersgd", True)]
# (name, what it asks, the least it asks for): ResNet-50 at 224 px, -b 256, one GPU
TARGETS = [("speed", "the fastest set-up's images/s on --synthetic images (O2 aside: the bare loop has no masters)",
            6000),
           ("recipe", "the recipe's images/s over the bare loop's, at the fastest set-up", 0.97),
           ("jpeg", "the fastest --decoder's images/s on JPEGs over the same set-up's on --synthetic images", 0.9)]
SYNTHETIC_STEPS = 30  # steps of each --synthetic epoch (a run: a warm-up epoch, then the one it times)
BARE_STEPS = {"warmup": 10, "timed": 30}  # the bare loop's
PROFILE_STEPS = 5  # the steps a target's profile records, in the middle of its run's last epoch


def compressed(method, error_feedback):
    """A run of the compression part, by name: 'compression fp8-e4m3 + error feedback'."""
    return f"compression {method}{' + error feedback' if error_feedback else ''}"


def setup_name(setup):
    """'apex O1 fp16 + channels_last + compile', 'bare loop fp32', and ', JPEGs, --decoder pil' on JPEGs."""
    if setup.precision is FASTEST:
        head = "bare loop" if setup.kind == "bare" else "the fastest set-up"
        return f"{head} at the fastest set-up" if setup.kind == "bare" else f"{head}, JPEGs, --decoder {setup.decoder}"
    level = f"{setup.opt_level} " if setup.opt_level else ""
    name = " ".join(filter(None, ["bare loop" if setup.kind == "bare" else setup.recipe, level + setup.precision,
                                  "+ channels_last" if setup.channels_last else "", "+ compile" if setup.compile
                                  else ""]))
    return name + (f", JPEGs, --decoder {setup.decoder}" if setup.decoder else "")


def resolve(setup, fastest):
    """The set-up with its FASTEST fields taken from `fastest` (a measured recipe set-up), or None without one."""
    if setup.precision is not FASTEST:
        return setup
    if fastest is None:
        return None
    return setup._replace(recipe="" if setup.kind == "bare" else fastest.recipe, precision=fastest.precision,
                          channels_last=fastest.channels_last, compile=fastest.compile,
                          opt_level="" if setup.kind == "bare" else fastest.opt_level)


def recipe_flags(setup):
    """The recipe's flags for the set-up's precision and layout (not its data); the bare loop's for a bare one."""
    flags = ["--precision", setup.precision] if setup.kind == "bare" else []
    if setup.recipe == "apex":
        flags += ["--opt-level", setup.opt_level] + (["--amp-dtype", setup.precision] if setup.precision != "fp32"
                                                       else [])
    return flags + (["--channels-last"] if setup.channels_last else []) + (["--compile"] if setup.compile else [])


def gpu_counts(available, asked=None):
    """2, 4, ... up to the GPUs there are, and all of them (the scaling and compression parts); or those asked."""
    if asked:
        too_many = [n for n in asked if n > available]
        if too_many:
            measuring.bad_input(f"--gpus {' '.join(map(str, too_many))}: this machine has {available} GPU(s)")
        return sorted(set(asked))
    return sorted({2 ** k for k in range(1, available.bit_length()) if 2 ** k <= available} |
                  ({available} if available > 1 else set()))


# The model, not a measurement: seconds on one H100 (an H200 is taken as no slower), each constant from what
# was measured: images/s per precision and layout (the H100's sweep, figures/data/gpu/earlier/; bf16 +
# channels_last was not measured: fp16's, less the 18 % bf16 trailed fp16 by without channels_last);
# --compile's speed-up (the H100: O0 + compile at 1.40x O0); a process's start to its first step (the H100's
# smoke: 11.7 s for its shortest checks, whole short runs); the first step (cuDNN's autotuning and the
# loader's start: the H100's O0 epoch of 20 steps took 9.05 s, 2.9 s of it the 19 after the first); a compile
# (the H100: 58 s more than eager for O0 with an empty Inductor cache; with the cache an earlier run of the
# same graph filled, 0.08 of that, as this project's CPU measured it in figures/data/compile.csv); an epoch's
# end (evaluation at 3x the training rate, a checkpoint of 200 MB).
# (O2 was not measured: taken as O1's rate)
MODEL_IMAGES_PER_S = {("fp32", False): 1800, ("fp32", True): 2400, ("fp16", True): 4600, ("bf16", True): 3800}
MODEL_COMPILE_SPEEDUP, MODEL_START_S, MODEL_FIRST_STEP_S, MODEL_EPOCH_END_S = 1.4, 10, 6.5, 2
MODEL_COMPILE_S = {"cold": 60, "warm": 10}
MODEL_NVJPEG_PER_S = 4000  # --decoder gpu: torchvision's nvjpeg on the GPU, per second (not measured here)
MODEL_PROFILE_S = 15  # a profile's extra: the trace of PROFILE_STEPS steps written and read


def decode_per_worker(io_csv):
    """{decoder: images/s of one loader worker} from the input-pipeline part's io.csv (this project's CPU: the
    GPU node's own cores are not measured), else 1000 and 800."""
    rates = {"tensor": 1000.0, "pil": 800.0}
    try:
        for row in measuring.read_csv(io_csv):
            if row["workers"] == "1" and row["batches"] == "uint8":
                rates[row["decoder"]] = float(row["images_per_s"])
    except (OSError, KeyError, ValueError):
        pass
    return rates


def model_seconds(setup, images, cores, decode, warm, profile=False):
    """The model's seconds for one run of the set-up. images: (per epoch, validation) images; cores: the
    node's; decode: decode_per_worker(); warm: whether the Inductor cache holds this compile already."""
    rate = MODEL_IMAGES_PER_S[setup.precision, setup.channels_last] * (MODEL_COMPILE_SPEEDUP if setup.compile
                                                                       else 1)
    if setup.decoder in decode:
        rate = min(rate, decode[setup.decoder] * max(1, cores - 1))
    elif setup.decoder == "gpu":
        rate = min(rate, MODEL_NVJPEG_PER_S)
    seconds = MODEL_START_S + MODEL_FIRST_STEP_S + (MODEL_COMPILE_S["warm" if warm else "cold"] if setup.compile
                                                    else 0)
    if setup.kind == "bare":
        return seconds + (BARE_STEPS["warmup"] + BARE_STEPS["timed"]) * 256 / rate
    epoch, val = images
    return seconds + 2 * (epoch / rate + val / (3 * rate) + MODEL_EPOCH_END_S) + (MODEL_PROFILE_S if profile else 0)


def assumed_fastest():
    """The set-up the model finds fastest, standing in for the measured one in a plan."""
    recipes = [s for s in TABLE if s.kind == "recipe" and s.precision is not FASTEST and s.opt_level != "O2"]
    return max(recipes, key=lambda s: MODEL_IMAGES_PER_S[s.precision, s.channels_last] *
               (MODEL_COMPILE_SPEEDUP if s.compile else 1))


def jpeg_images(folder, batch_size=256, default=(20000, 5000)):
    """(train images, val images) of the JPEG folder (a folder not written yet: gpu-check's 20,000 + 5,000);
    train counted in whole batches, as the loader drops the last one."""
    folder = Path(folder)
    if not (folder / "train").is_dir():
        train, val = default
    else:
        train, val = (sum(1 for p in (folder / split).rglob("*") if p.is_file()) for split in ("train", "val"))
    return train // batch_size * batch_size, val


def images_of(setup, jpeg, batch_size=256):
    """(images per epoch, validation images) a run of the set-up trains and evaluates: the JPEG folder's (jpeg:
    jpeg_images()), or the --synthetic sets step_times.py cuts to SYNTHETIC_STEPS steps and one batch."""
    return jpeg if setup.decoder else (SYNTHETIC_STEPS * batch_size, batch_size)


def table_plan(cores, decode, jpeg, measured=(), warm=()):
    """[(set-up as it would run, its name, model seconds)] of the table's set-ups not in `measured` (set-up
    names), the fastest taken as the model's; warm: the compiles the Inductor cache holds already."""
    fastest, warm, runs = assumed_fastest(), set(warm), []
    for setup in TABLE:
        name, resolved = setup_name(setup), resolve(setup, fastest)
        if name in measured:
            continue
        runs.append((resolved, name, model_seconds(resolved, images_of(setup, jpeg), cores, decode,
                                                   graph(resolved) in warm)))
        if resolved.compile:
            warm.add(graph(resolved))
    return runs


def print_plan(cores, decode, jpeg, counts):
    """scripts/figures/gpu/measure.py --list: the table's runs as planned, each with the model's seconds; then the
    parts beyond one GPU, on `counts` GPUs."""
    runs = table_plan(cores, decode, jpeg)
    print(f"table, about {sum(seconds for *_, seconds in runs) / 60:.1f} min by the model (an H100), the fastest set-up"
          f" the model's ({setup_name(assumed_fastest())}); then the profiles of the targets missed:")
    print("\n".join(f"  {name:60s} {seconds:4.0f} s  {' '.join(recipe_flags(s))}" for s, name, seconds in runs))
    print("\n".join(f"{part}: on {', '.join(map(str, counts))} GPUs" if counts else f"{part}: skipped: {ONE_GPU}"
                    for part in ("scaling", "compression")))


def setup_of(row):
    """The Setup a row of table.csv measured (a row from before O2 was planned: apex's level by its precision)."""
    level = row.get("opt_level") or ("" if row["recipe"] != "apex" else "O0" if row["precision"] == "fp32" else "O1")
    return Setup(row["kind"], row["recipe"], row["decoder"], row["precision"], str(row["channels_last"]) == "1",
                 str(row["compile"]) == "1", level)


def fastest_of(rows):
    """The fastest recipe set-up on --synthetic images at 1 GPU among rows (one GPU and torch's), or None; not an
    O2 one, which the bare loop (autocast, fp32 weights) cannot run beside."""
    candidates = [r for r in rows if r["kind"] == "recipe" and not r["decoder"] and str(r["gpus"]) == "1"
                  and setup_of(r).opt_level != "O2"]
    return setup_of(max(candidates, key=lambda r: float(r["images_per_s"]))) if candidates else None


def targets_of(rows):
    """[(target, its value or None, met, the set-up its profile looks at)] from one GPU and torch's rows."""
    fastest = fastest_of(rows)
    if fastest is None:
        return [(name, None, False, None) for name, _, _ in TARGETS]
    rate = {setup_of(r): float(r["images_per_s"]) for r in rows if str(r["gpus"]) == "1"}
    bare = rate.get(fastest._replace(kind="bare", recipe="", opt_level=""))
    jpegs = {setup: images for setup, images in rate.items() if setup.decoder and setup._replace(decoder="") == fastest}
    best = max(jpegs, key=jpegs.get, default=None)
    values = {"speed": rate[fastest], "recipe": rate[fastest] / bare if bare else None,
              "jpeg": jpegs[best] / rate[fastest] if best else None}
    looks_at = {"speed": fastest, "recipe": fastest, "jpeg": best}
    return [(name, values[name], values[name] is not None and values[name] >= least, looks_at[name])
            for name, _, least in TARGETS]


def mine(rows, here):
    """The rows measured on this GPU and torch."""
    return [r for r in rows if (r.get("gpu"), r.get("torch")) == (here["gpu"], here["torch"])]


def graph(setup):
    """What one compile of the set-up compiles (an Inductor cache holds it for the next run of the same graph)."""
    return setup.kind, setup.precision, setup.channels_last


def read_json(path, default):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default
