"""The device command: what a lent GPU runs, in one command of at most 9 minutes, from a clone.

    make gpu-check PY=python3            # on the GPU node, with .wheels/ (make gpu-wheels) carried beside it
    make gpu-check STAND_IN=1 PY=...     # the rehearsal on a CPU (make test-compat runs it under torch 2.11)
    python scripts/gpu_check.py [--stand-in] [--minutes 9] [--archive FILE] [--plan]

1. Preflight: the wheels in .wheels/ installed into runs/gpu-check/site (pip, no index, no
   dependencies) for this run's processes; then Python, torch, torchvision, CUDA, the driver
   and the GPU, and each package the checks need and this Python lacks, one line each.
2. gpu-smoke (scripts/gpu_smoke.py), each check cut at --check-timeout seconds; the checks
   figures/data/gpu/smoke.json already holds as passed on this GPU and torch are left out
   (--smoke runs them all again), so that a smoke cut at the deadline goes on in the next
   lease.
3. The figures-gpu runs not yet in figures/data/gpu/ that fit in the minutes left, by the
   model of bench_gpu.py --list (data/imagenet-like-gpu written first on every core, once),
   the sweep cut at the deadline whatever the model said; then, in the minutes still left,
   the precision part's next runs (bench_precision.py, at 1 GPU).
Everything goes under runs/gpu-check/ (preflight.json, the runs), then into
figures/data/gpu/ and RESULTS.md's GPU section (plot_results.py). --archive FILE packs
those into one .tar.gz, for a machine whose results come back as files. --plan prints,
without running anything, what each lease measures by the model.

--stand-in: the same steps on a CPU, as CI rehearses them: gpu_smoke.py --stand-in, and
two of the sweep's planned runs and two of the precision part's made with lenet at 16 px on
the CPU; everything is written under runs/gpu-check/ (its figures/data/gpu/ and RESULTS.md),
never into the committed ones.
Exits 1 when a check failed, 2 when the preflight found something missing.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import check_python, measuring  # noqa: E402

OUT = ROOT / "runs" / "gpu-check"
WHEELS = ROOT / ".wheels"
GPU_DATA = ROOT / "figures" / "data" / "gpu"
JPEG = ROOT / "data" / "imagenet-like-gpu"
STAND_IN_RUNS = ["-a", "lenet", "--image-size", "16", "-b", "64", "--min-steps", "2", "--max-runs", "2"]
STAND_IN_PRECISION = ["--quick", "--max-runs", "2"]
# a gpu-smoke check's seconds on one GPU where smoke.json holds none measured: each check's start-up (a CUDA
# context, imports, cuDNN's autotuning) and a few steps, two runs for the resumed ones
SMOKE_CHECK_S = 15


def parse_args(argv=None):
    parser = measuring.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, help="the command's wall time in all (default: 9; --stand-in: 30, "
                                                      "a CPU being slower)")
    parser.add_argument("--check-timeout", type=float, default=90, help="seconds a smoke check may take "
                                                                         "(default: 90)")
    parser.add_argument("--smoke", action="store_true", help="run every gpu-smoke check, passed already or not")
    parser.add_argument("--stand-in", action="store_true", help="rehearse on a CPU, into runs/gpu-check/ only")
    parser.add_argument("--archive", help="pack what was measured into this .tar.gz")
    parser.add_argument("--plan", action="store_true", help="print what each lease measures, by the model")
    args = parser.parse_args(argv)
    args.minutes = args.minutes or (30 if args.stand_in else 9)
    if args.minutes <= 0 or args.check_timeout <= 0:
        parser.error("--minutes and --check-timeout must be above 0")
    return args


def install_wheels(site):
    """pip install --no-index --no-deps the carried wheels into site; site then heads this run's import path."""
    wheels = sorted(WHEELS.glob("*.whl"))
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", str(site), *map(str, wheels)], check=True)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return [wheel.name for wheel in wheels]


def preflight(args, wheels):
    """What this node has, as a dict; exits 2 with one line for a package missing (check_python)."""
    check_python.require("gpu-check", gpu=not args.stand_in)
    import torch
    import torchvision

    found = {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
             "cuda": torch.version.cuda, "wheels": wheels, "stand_in": args.stand_in, **measuring.hardware()}
    if torch.cuda.is_available() and not args.stand_in:
        found["gpu"] = torch.cuda.get_device_name(0)
        found["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        try:
            found["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=30).stdout.split()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            found["driver"] = None
    else:
        found["gpu"] = "none (a CPU standing in)"
    return found


def run_limited(command, seconds):
    """Run command (its own process group) for at most `seconds`; its exit code, None when cut."""
    process = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
    try:
        return process.wait(timeout=max(1, seconds))
    except subprocess.TimeoutExpired:
        measuring.kill_tree(process)  # (with the check or run under way, each in a session of its own)
        return None


def lease_plan():
    """What each lease of --minutes measures by the model: the smoke first, then the planned runs in order."""
    from scripts import bench_gpu, gpu_plan

    args = bench_gpu.parse_args(["--gpus", "1"])
    args.jpeg, args.parts = str(JPEG), gpu_plan.PARTS
    if not (JPEG / "train").is_dir():  # (the folder gpu-check writes: 20,000 + 5,000 JPEGs)
        gpu_plan.train_images = lambda a, data, split="train": {"synthetic": gpu_plan.SYNTHETIC_TRAIN_IMAGES}.get(
            data, 20000 if split == "train" else 5000)
    runs, _ = gpu_plan.plan(args, [1])
    from scripts.gpu_smoke import checks

    try:  # the checks passed already are left out; the others take as long as those did on average
        passed = [c for c in json.loads((GPU_DATA / "smoke.json").read_text())["checks"] if c["ok"]]
    except (OSError, ValueError, KeyError):
        passed = []
    check_s = sum(c["seconds"] for c in passed) / len(passed) if passed else SMOKE_CHECK_S
    to_run = len(checks()) - len(passed)
    smoke = to_run * check_s / 60
    leases = [(smoke, [f"preflight and gpu-smoke ({to_run} checks of {len(checks())} to run, {check_s:.0f} s "
                       f"each, {smoke:.1f} min)"])]
    measured = {bench_gpu.key(r) for name in ("throughput.csv", "compression.csv")  # (what --skip-measured skips)
                for r in bench_gpu.kept_rows(GPU_DATA / name, [1], gpu_plan.PARTS, every=True)}
    for part in gpu_plan.PARTS:
        for planned in runs.get(part, []):
            if bench_gpu.planned_key(part, *planned[1:7]) in measured:
                continue
            needed = gpu_plan.estimated_minutes(args, [planned], cores=16)  # (the lent machine's)
            if leases[-1][0] + needed > 9:
                leases.append((0.0, []))
            leases[-1] = (leases[-1][0] + needed, [*leases[-1][1], planned[0]])
    from scripts import bench_precision

    warm = False  # (a lease's machine starts with no TorchInductor cache)
    done = {(r["setup"], int(r["processes"]), int(r["round"]))
            for r in (measuring.read_csv(GPU_DATA / "precision.csv") if (GPU_DATA / "precision.csv").exists() else [])}
    for run in bench_precision.planned(False, True, True, [1], 3):  # (an H100: fp16 and bf16)
        if (run[2][0], run[1], run[0]) in done:
            continue
        needed = bench_precision.estimated_minutes(bench_precision.GPU, run, warm)
        if leases[-1][0] + needed > 9:
            leases.append((0.0, []))
            needed, warm = bench_precision.estimated_minutes(bench_precision.GPU, run, False), False
        warm = warm or run[2][5]
        name = f"precision-{bench_precision.run_name(run[2][0], 1)}-r{run[0]}"
        leases[-1] = (leases[-1][0] + needed, [*leases[-1][1], name])
    return leases


def main(argv=None):
    args = parse_args(argv)
    if args.plan:
        for i, (minutes, names) in enumerate(lease_plan(), 1):
            print(f"lease {i}: {' '.join(names)} (about {minutes:.1f} min by the model)")
        return
    started = time.monotonic()
    deadline = started + 60 * args.minutes
    shutil.rmtree(OUT / "smoke", ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "preflight.json").unlink(missing_ok=True)  # (an earlier command's)
    gpu_data = OUT / "figures" / "data" / "gpu" if args.stand_in else GPU_DATA
    results = OUT / "RESULTS.md" if args.stand_in else ROOT / "RESULTS.md"
    if args.stand_in:  # a copy of the committed data and RESULTS.md, drawn on afresh
        shutil.rmtree(OUT / "figures", ignore_errors=True)
        shutil.copytree(ROOT / "figures" / "data", OUT / "figures" / "data")
        shutil.rmtree(gpu_data, ignore_errors=True)
        gpu_data.mkdir(parents=True)
        shutil.copy(ROOT / "RESULTS.md", results)
    gpu_data.mkdir(parents=True, exist_ok=True)
    found = preflight(args, install_wheels(OUT / "site"))
    (OUT / "preflight.json").write_text(json.dumps(found, indent=2) + "\n")
    print("gpu-check: " + ", ".join(f"{k} {v}" for k, v in found.items() if k not in ("wheels", "stand_in")),
          flush=True)
    smoke = [sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), "--json", str(gpu_data / "smoke.json"),
             "--out", str(OUT / "smoke"), "--timeout", str(args.check_timeout),
             *([] if args.smoke else ["--keep-passed"]), *(["--stand-in"] if args.stand_in else [])]
    code = run_limited(smoke, deadline - time.monotonic())
    failed = code != 0
    if code is None:
        print(f"gpu-check: gpu-smoke cut at the command's {args.minutes:g} minutes", flush=True)
    shutil.copy(OUT / "preflight.json", gpu_data / "preflight.json")
    left = (deadline - time.monotonic()) / 60
    if left > 1:
        if not (JPEG / ".complete").exists() and not args.stand_in:  # (seconds on the node's cores)
            shutil.rmtree(JPEG, ignore_errors=True)
            subprocess.run([sys.executable, str(ROOT / "scripts" / "make_demo_data.py"), "--imagenet-like",
                            str(JPEG), "--classes", "100", "--images", "250", "--jobs", "0"], check=True)
            (JPEG / ".complete").touch()
        jpeg = OUT / "smoke" / "jpeg" if args.stand_in else JPEG
        sweep = [sys.executable, str(ROOT / "scripts" / "bench_gpu.py"), "--jpeg", str(jpeg), "--gpus", "1",
                 "--skip-measured", "--minutes", f"{(deadline - time.monotonic()) / 60 - 0.5:.2f}",
                 "--figures-data", str(gpu_data), "--runs", str(OUT / "runs"),
                 *(["--stand-in", *STAND_IN_RUNS] if args.stand_in else [])]
        code = run_limited(sweep, deadline - time.monotonic() - 20)
        if code is None:
            print("gpu-check: the sweep was cut at the deadline; what it measured before is kept", flush=True)
        elif code:
            print(f"gpu-check: the sweep failed (exit {code}); what it measured before is kept", flush=True)
            failed = True
    left = (deadline - time.monotonic()) / 60
    if left > 1:
        precision = [sys.executable, str(ROOT / "scripts" / "bench_precision.py"), "--processes", "1",
                     "--skip-measured", "--minutes", f"{left - 0.5:.2f}", "--csv", str(gpu_data / "precision.csv"),
                     "--runs", str(OUT / "runs" / "precision"), *(STAND_IN_PRECISION if args.stand_in else [])]
        code = run_limited(precision, deadline - time.monotonic() - 20)
        if code is None:
            print("gpu-check: the precision part was cut at the deadline; what it measured before is kept",
                  flush=True)
        elif code:
            print(f"gpu-check: the precision part failed (exit {code}); what it measured before is kept", flush=True)
            failed = True
    drawn = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_results.py"), "--data", str(gpu_data.parent),
                            "--figures", str(OUT / "figures" if args.stand_in else ROOT / "figures"), "--results",
                            str(results)], stdout=subprocess.DEVNULL, timeout=300)
    failed |= drawn.returncode != 0
    if args.archive:
        with tarfile.open(args.archive, "w:gz") as archive:
            for path in (OUT / "preflight.json", gpu_data, results):
                if path.exists():
                    archive.add(path, arcname=str(path.relative_to(ROOT)))
    print(f"gpu-check: done in {(time.monotonic() - started) / 60:.1f} min; {gpu_data.relative_to(ROOT)}/, "
          f"{results.relative_to(ROOT)}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
