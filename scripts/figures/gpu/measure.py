"""The GPU table: ResNet-50 at 224 px in the set-ups a user chooses between, on one GPU; on a node with more,
scaling over GPUs and the compression hooks over NCCL.

    make figures-gpu [ONLY=table]           # data/imagenet-like-gpu, this script's parts, plot_results.py
    python scripts/figures/gpu/measure.py --jpeg DIR [--parts table scaling compression] [--gpus 2 4 8] [--list]
    python scripts/figures/gpu/measure.py --jpeg DIR --skip-measured --minutes 7  # as scripts/gpu/check.py runs it

  table        at 1 GPU, scripts/figures/gpu/plan.py's set-ups in turn (--list: with the model's seconds): ddp fp32,
               apex O0 + channels_last, O1 fp16 and bf16 with channels_last (fp16 also with --compile), O2 fp16
               with channels_last, on --synthetic images; the bare loop (scripts/figures/bare_loop.py) in fp32 and
               at the fastest of those but O2;
               that fastest on the JPEG folder under --decoder tensor and pil (every core but one decoding)
               and gpu (nvjpeg)
  scaling      ddp fp32 and the table's fastest set-up on 2, 4, ... and all GPUs (--synthetic)
  compression  the compression recipe on 2, 4, ... GPUs (--synthetic): none, fp16, bf16, fp8-e4m3, fp8-e5m2,
               powersgd, the fp8s and powersgd with --error-feedback too (on one GPU, it and scaling say in
               one line that there is nothing to measure)

A recipe run trains 2 epochs through scripts/figures/gpu/step_times.py, which times each step on the GPU: the first
warms up (cuDNN's autotuning, compiling, the loader's start), the row is the second's steps after its first
(--synthetic epochs: 30 steps per GPU; the JPEG folder: all of it). The bare loop times 30 steps after 10.
A row: the median step and its 10th and 90th percentiles, images/s from the median step (all GPUs), the
share of the timed epoch the host waited for the loader, the run's seconds beside the model's. Batch 256
per GPU, halved while a run runs out of GPU memory (down to 16); no --seed (it would select slower
deterministic kernels); --lr 0.01 for 256 (the synthetic labels must not make a run diverge).

Once the table is measured, the speed targets (gpu_plan.TARGETS): where one misses (--stand-in: each, to
rehearse), its set-up runs again with the recipe's --profile, 5 steps in the middle of the last epoch, and
the trace's summary (step_times.summarize) goes to profiles.json. The files are written after every run,
other GPUs' and torch versions' rows kept (with --skip-measured this one's too, their runs left out).
--minutes M (from this process's start) starts a run only while the model ends it within M minutes; the
runs left are named, for the next command. --stand-in rehearses on a CPU (--decoder gpu as tensor).
Without CUDA, or without a package it needs: one line, exit 2.
"""

import time

STARTED = time.time()  # (--minutes counts from here, before torch is imported)

import argparse, json, os, re, shutil, sys  # noqa: E401,E402 (after the clock)
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.checks import check_python  # noqa: E402
from scripts.figures.gpu import plan as gpu_plan  # noqa: E402
from scripts.figures import measuring  # noqa: E402
from scripts.figures.gpu import step_times  # noqa: E402
from scripts.figures.gpu.plan import (BARE_STEPS, COMPRESSION, PARTS, PROFILE_STEPS,  # noqa: E402
                              SYNTHETIC_STEPS, Setup, compressed, graph, mine)

SYNTHETIC_WORKERS = 4  # enough to collate in-memory images; they decode nothing
OUT_OF_MEMORY = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED")
COMPRESSED = Setup("recipe", "compression", "", "fp32", False, False)  # (its hooks: --compress METHOD)
MACHINE = ["cpu", "cores", "gpu", "capability", "torch"]
MEASURED = ["batch_size", "workers", "steps", "step_ms", "step_ms_p10", "step_ms_p90", "images_per_s",
            "data_wait_share", "seconds", "model_seconds", "arch", "image_size"]
TABLE_FIELDS = ["planned", "setup", "kind", "recipe", "opt_level", "decoder", "precision", "channels_last",
                "compile", "gpus", *MEASURED, *MACHINE]
COMPRESSION_FIELDS = ["method", "error_feedback", "gpus", "bytes_per_step", "compression_ratio", *MEASURED, *MACHINE]


def parse_args(argv=None):
    parser = measuring.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jpeg", help="an ImageNet-style JPEG folder (make figures-gpu writes data/imagenet-like-gpu)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    parser.add_argument("--gpus", type=int, nargs="+", help="scaling and compression: numbers of GPUs (default: "
                                                            "2, 4, ... and all)")
    parser.add_argument("-a", "--arch", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("-b", "--batch-size", type=int, default=256, help="per GPU (default: 256)")
    parser.add_argument("--figures-data", default="figures/data/gpu", help="where the CSVs go")
    parser.add_argument("--runs", default="runs/figures-gpu", help="where the run directories go")
    parser.add_argument("--list", action="store_true", help="print each part's runs and the model's seconds")
    parser.add_argument("--skip-measured", action="store_true", help="leave out what this GPU and torch measured")
    parser.add_argument("--minutes", type=float, help="start a run only if the model ends it within these minutes")
    parser.add_argument("--stand-in", action="store_true", help="rehearse on a CPU: no CUDA needed")
    args = parser.parse_args(argv)
    for flag, value, low in (("--batch-size", args.batch_size, 1), ("--image-size", args.image_size, 8),
                             *(("--gpus", n, 2) for n in args.gpus or [])):
        if value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    if args.jpeg and not (Path(args.jpeg) / "train").is_dir():
        parser.error(f"--jpeg {args.jpeg} has no train/ folder (make figures-gpu writes data/imagenet-like-gpu)")
    if "table" in args.parts and not args.jpeg and not args.list:
        parser.error("the table needs --jpeg DIR for its JPEG rows (make figures-gpu writes data/imagenet-like-gpu)")
    return args


def machine(stand_in):
    import torch

    found = {key: value for key, value in measuring.hardware().items() if key in MACHINE}
    if stand_in or not torch.cuda.is_available():
        return {**found, "gpu": "none (a CPU standing in)", "capability": "cpu"}
    return {**found, "gpu": torch.cuda.get_device_name(0),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0)))}


def visible_gpus(count):
    """CUDA_VISIBLE_DEVICES for the first `count` GPUs this process may use (a scheduler may have chosen them)."""
    allowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in allowed.split(",") if i.strip()] if allowed else [str(i) for i in range(count)]
    return ",".join(ids[:count])


def run_setup(args, name, setup, gpus, cores, extra=(), profile=False, batch=None):
    """One run of a set-up at batch 256 per GPU (or `batch`) or the largest half of it that fits: the row's measured
    fields and the run directory."""
    batch, env = batch or args.batch_size, {"CUDA_VISIBLE_DEVICES": "" if args.stand_in else visible_gpus(gpus)}
    workers = SYNTHETIC_WORKERS if not setup.decoder else max(1, cores // gpus - 1)
    while True:
        out = Path(args.runs) / re.sub(r"[^\w.]+", "-", f"{'profile ' if profile else ''}{name} {gpus}gpu b{batch}")
        shutil.rmtree(out, ignore_errors=True)  # (a run of another GPU or torch is no row of this one's)
        if setup.kind == "bare":
            flags = ["-a", args.arch, "--image-size", args.image_size, "-b", batch, *gpu_plan.recipe_flags(setup),
                     "--warmup", BARE_STEPS["warmup"], "--steps", BARE_STEPS["timed"], "--json", out / "steps.json"]
            out.mkdir(parents=True)
            started = time.perf_counter()
            result = measuring.run(1, [str(ROOT / "scripts" / "figures" / "bare_loop.py"), *map(str, flags)], cores,
                                   env,
                                   check=False, echo=name)
            measuring.note_trained(out, time.perf_counter() - started)
            if result.returncode:
                (out / "failed.log").write_text(result.stdout)
            ok = result.returncode == 0
        else:
            decoder = "tensor" if args.stand_in and setup.decoder == "gpu" else setup.decoder  # (no nvjpeg there)
            data = [args.jpeg, "--decoder", decoder] if decoder else ["--synthetic"]
            flags = [*data, "-j", workers, "-a", args.arch, "--image-size", args.image_size, "-b", batch, "--lr",
                     0.01, "--epochs", 2, "-p", 1000, *gpu_plan.recipe_flags(setup), *extra,
                     *(["--profile", PROFILE_STEPS] if profile else [])]
            launcher = [ROOT / "scripts" / "figures" / "gpu" / "step_times.py", "--epoch-images",
                        SYNTHETIC_STEPS * batch * gpus, "--val-images", batch * gpus,
                        *(["--profile-last-epoch"] if profile else [])]
            ok = measuring.train(setup.recipe, gpus, flags, out, max(1, cores // gpus), env, check=False, echo=name,
                                 launcher=launcher) is not None
        if ok:
            break
        log = (out / "failed.log").read_text()
        if not any(oom in log for oom in OUT_OF_MEMORY) or batch <= 16:
            sys.exit(f"error: {name} failed:\n{log[-3000:]}")
        print(f"{name}: out of GPU memory at batch {batch} per GPU; trying {batch // 2}", flush=True)
        batch //= 2
    for checkpoint in out.glob("*.pt"):  # 200 MB each for ResNet-50; the table needs only the step times
        checkpoint.unlink()
    found = json.loads((out / "steps.json").read_text())
    seconds = found["steps"] if setup.kind == "bare" else found["epochs"][-1]
    if len(seconds) < 2:
        sys.exit(f"error: {name} timed {len(seconds)} step(s): an epoch needs 3 steps or more (a larger folder or -b)")
    if setup.kind == "bare":  # (a recipe stops by itself when its loss is not finite)
        wait = 0.0
        if not abs(found["ran"]["loss"]) < float("inf"):
            sys.exit(f"error: {name}: the bare loop's loss is {found['ran']['loss']}")
    else:
        last = [r for r in measuring.read_csv(out / "metrics.csv") if r["split"] == "train"][-1]
        wait = float(last["data_s"]) / float(last["epoch_s"])
    return {"batch_size": batch, "workers": 0 if setup.kind == "bare" else workers,
            **step_times.stats(seconds, batch * gpus), "data_wait_share": round(wait, 4),
            "seconds": float((out / "launch_seconds").read_text()),
            "arch": args.arch, "image_size": args.image_size}, out


def table_row(planned, name, setup, gpus, row):
    """A row of table.csv: the set-up as the plan names it and as it ran, and what it measured."""
    return {"planned": planned, "setup": name, **setup._asdict(), "channels_last": int(setup.channels_last),
            "compile": int(setup.compile), "gpus": str(gpus), **row}


def measure_table(args, found, here, cores, decode, images_of, fits, compiled):
    """The table's set-ups at 1 GPU not measured yet, in turn; once all are, a profile for each target missed.
    compiled: the graphs this command compiled already (what its Inductor cache holds: a later lease's machine
    starts with none)."""
    for setup in gpu_plan.TABLE:
        planned, rows = gpu_plan.setup_name(setup), mine(found["table"], here)
        done = {r["planned"] for r in rows if r["gpus"] == "1"}
        complete = all(gpu_plan.setup_name(s) in done for s in gpu_plan.TABLE if s.kind == "recipe" and
                       s.precision is not gpu_plan.FASTEST)  # (the fastest is known once each of them is measured)
        resolved = gpu_plan.resolve(setup, gpu_plan.fastest_of(rows) if complete else None)
        if planned in done:
            continue
        model = resolved and gpu_plan.model_seconds(resolved, images_of(setup), cores, decode,
                                                    graph(resolved) in compiled)
        if not fits(planned, model):
            continue
        name = gpu_plan.setup_name(resolved)
        row, _ = run_setup(args, name, resolved, 1, cores)
        compiled |= {graph(resolved)} if resolved.compile else set()
        found["table"].append(table_row(planned, name, resolved, 1, {**row, "model_seconds": round(model, 1), **here}))
        save(args, found)
        print(f"{name:>60}: {row['images_per_s']:8.1f} images/s (median step {row['step_ms']:.1f} ms, data wait "
              f"{100 * row['data_wait_share']:.0f} %)", flush=True)
    rows = [r for r in mine(found["table"], here) if r["gpus"] == "1"]
    if {r["planned"] for r in rows} < {gpu_plan.setup_name(s) for s in gpu_plan.TABLE}:
        return  # (a target read off part of the table could be another's once it is all measured)
    for target, value, met, setup in gpu_plan.targets_of(rows):
        name = setup and gpu_plan.setup_name(setup)
        if setup is None or met and not args.stand_in or name in {p["setup"] for p in mine(found["profiles"], here)}:
            continue
        if not fits(f"the profile of {name}", gpu_plan.model_seconds(
                setup, images_of(setup), cores, decode, graph(setup) in compiled, profile=True)):
            continue
        batch = next(int(r["batch_size"]) for r in rows if r["setup"] == name)
        _, out = run_setup(args, name, setup, 1, cores, profile=True, batch=batch)
        compiled |= {graph(setup)} if setup.compile else set()
        found["profiles"].append({"setup": name, "target": target, "value": value, **here,
                                  **step_times.summarize(out / "profile", PROFILE_STEPS)})
        save(args, found)
        print(f"{name}: profiled, its {target} target {'met' if met else 'missed'}", flush=True)


def measure_beyond_one(args, part, found, here, counts, cores, decode, images_of, fits, compiled):
    """scaling: ddp fp32 and the fastest set-up on 2, 4, ... GPUs; compression: each method of the hooks."""
    if part == "scaling":
        fastest = gpu_plan.fastest_of(mine(found["table"], here)) or gpu_plan.assumed_fastest()
        runs = [(gpu_plan.setup_name(setup), setup, []) for setup in (gpu_plan.TABLE[0], fastest)]
    else:
        runs = [(compressed(method, ef), COMPRESSED, ["--compress", method, *(["--error-feedback"] if ef else [])])
                for method, ef in COMPRESSION]
    done = {(r["setup"], r["gpus"]) for r in mine(found["table"], here)} | {
        (compressed(r["method"], r["error_feedback"] == "1"), r["gpus"]) for r in mine(found["compression"], here)}
    for gpus in counts:
        for name, setup, extra in runs:
            model = gpu_plan.model_seconds(setup, images_of(setup), cores, decode, graph(setup) in compiled)
            if (name, str(gpus)) in done or not fits(f"{name} on {gpus} GPUs", model):
                continue
            row, out = run_setup(args, name, setup, gpus, cores, extra)
            compiled |= {graph(setup)} if setup.compile else set()
            row.update(model_seconds=round(model, 1), **here)
            if part == "scaling":
                found["table"].append(table_row(name, name, setup, gpus, row))
            else:
                summary = json.loads((out / "summary.json").read_text())
                found["compression"].append({"method": extra[1], "error_feedback": int(len(extra) > 2), "gpus": gpus,
                                             "bytes_per_step": round(summary.get("bytes_per_step") or 0),
                                             "compression_ratio": round(summary.get("compression_ratio") or 0, 3),
                                             **row})
            save(args, found)


def save(args, found):
    """table.csv, compression.csv (once it has rows) and profiles.json, as they stand."""
    figures_data = Path(args.figures_data)
    measuring.write_csv(figures_data / "table.csv", TABLE_FIELDS, found["table"])
    if found["compression"]:
        measuring.write_csv(figures_data / "compression.csv", COMPRESSION_FIELDS, found["compression"])
    (figures_data / "profiles.json").write_text(json.dumps(found["profiles"], indent=2) + "\n")


def main(argv=None):
    args = parse_args(argv)
    cores, decode = measuring.usable_cores(), gpu_plan.decode_per_worker(ROOT / "figures" / "data" / "io.csv")
    jpeg = gpu_plan.jpeg_images(args.jpeg or "", args.batch_size)
    if args.list:
        import torch

        return gpu_plan.print_plan(cores, decode, jpeg, gpu_plan.gpu_counts(torch.cuda.device_count(), args.gpus))
    check_python.require("figures-gpu", gpu=not args.stand_in)  # (one line and exit 2 without CUDA or a package)
    import torch

    here, figures_data = machine(args.stand_in), Path(args.figures_data)
    counts = gpu_plan.gpu_counts(1 if args.stand_in else torch.cuda.device_count(), args.gpus)
    found = {name: measuring.read_csv(figures_data / f"{name}.csv") if (figures_data / f"{name}.csv").exists()
             else [] for name in ("table", "compression")}
    found["profiles"] = gpu_plan.read_json(figures_data / "profiles.json", [])
    if not args.skip_measured:  # what this GPU and torch measured, measured afresh
        again = {"table": lambda r: r["gpus"] == "1", "scaling": lambda r: r["gpus"] != "1"}
        found["table"] = [r for r in found["table"] if r not in mine(found["table"], here) or
                          not any(again[part](r) for part in args.parts if part in again)]
        if "compression" in args.parts:
            found["compression"] = [r for r in found["compression"] if r not in mine(found["compression"], here)]
        if "table" in args.parts:
            found["profiles"] = [p for p in found["profiles"] if p not in mine(found["profiles"], here)]
    begun, left, compiled = STARTED, [], set()  # compiled: the graphs this command compiled (its Inductor cache)
    images_of = lambda setup: gpu_plan.images_of(setup, jpeg, args.batch_size)  # noqa: E731

    def fits(name, seconds):
        """Whether the model ends a run of `seconds` within --minutes (None: it cannot run yet); if not, it is left
        for the next command."""
        if seconds is None or args.minutes is not None and time.time() - begun + seconds > 60 * args.minutes:
            left.append(name)
            return False
        return True

    for part in args.parts:
        started = time.time()
        measuring.counts.update(trained=0, reused=0, reused_s=0.0)
        if part == "table":
            measure_table(args, found, here, cores, decode, images_of, fits, compiled)
        elif counts:
            measure_beyond_one(args, part, found, here, counts, cores, decode, images_of, fits, compiled)
        else:
            print(f"{part}: skipped: {gpu_plan.ONE_GPU}", flush=True)
        if measuring.counts["trained"] + measuring.counts["reused"]:
            measuring.record_part(figures_data, f"gpu-{part}", started)
    print(f"wrote {figures_data}/" + (f"; left for the next command ({len(left)}): {'; '.join(left)}" if left else
                                      "; every planned run is measured"), flush=True)


if __name__ == "__main__":
    main()
