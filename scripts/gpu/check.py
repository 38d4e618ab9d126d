"""The device command: what a lent GPU runs, in one command of at most 9 minutes, from a clone.

    make gpu-check PY=python3            # on the GPU node, with .wheels/ (make gpu-wheels) carried beside it
    make gpu-check STAND_IN=1 PY=...     # the rehearsal on a CPU (make test-compat runs it under torch 2.11)
    python scripts/gpu/check.py [--stand-in] [--minutes 9] [--archive FILE] [--plan]

1. Preflight: the wheels in .wheels/ installed into runs/gpu-check/site (pip, no index, no
   dependencies) for this run's processes; then Python, torch, torchvision, CUDA, the driver
   and the GPU (its compute capability too), and each package the checks need and this
   Python lacks, one line each.
2. gpu-smoke (scripts/gpu/smoke.py), each check cut at --check-timeout seconds; the checks
   figures/data/gpu/smoke.json holds as passed on a GPU of the same compute capability and
   the same torch are left out (--smoke runs them all again): an H100's passes hold on an
   H200, and a smoke cut at the deadline goes on in the next command.
3. The GPU table (scripts/figures/gpu/measure.py --parts table): its set-ups not yet measured on this
   GPU and torch that the model says fit in the minutes left (data/imagenet-like-gpu written
   first on every core, once), then, once all are measured, a profile of each speed target
   that missed, in the minutes left; the whole cut at the deadline whatever the model said.
   What is left is named; the next command goes on with it.
Everything goes under runs/gpu-check/ (preflight.json, the runs), then into
figures/data/gpu/, RESULTS.md and docs/results/ (plot_results.py). --archive FILE packs those into one
.tar.gz, for a machine whose results come back as files. --plan prints, without running
anything, what the command runs on a GPU whose table is not measured yet, by the model, and
the seconds a GPU measured for each set-up where one did.

--stand-in: the same steps on a CPU, as CI rehearses them: scripts/gpu/smoke.py --stand-in, then the
whole table with lenet at 16 px on a small JPEG folder (and a profile of every target, met or
not); everything is written under runs/gpu-check/ (its figures/data/gpu/, RESULTS.md, docs/results/),
never into the committed ones.
Exits 1 when a check or a run failed, 2 when the preflight found something missing.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.checks import check_python  # noqa: E402
from scripts.figures.gpu import plan as gpu_plan  # noqa: E402
from scripts.figures import measuring  # noqa: E402

OUT = ROOT / "runs" / "gpu-check"
WHEELS = ROOT / ".wheels"
GPU_DATA = ROOT / "figures" / "data" / "gpu"
JPEG = ROOT / "data" / "imagenet-like-gpu"
JPEG_SIZE = {"gpu": ["--classes", "100", "--images", "250"], "stand-in": ["--classes", "4", "--images", "40"]}
STAND_IN_RUNS = ["-a", "lenet", "--image-size", "16", "-b", "8"]
# the model's seconds of what is not a set-up: a smoke check where smoke.json holds none measured (a CUDA
# context, imports, cuDNN's autotuning and a few steps; two runs for the resumed ones); the preflight with its
# wheels, the smoke's start with nothing to run, the JPEG folder (25,000 files at 2 ms each on 16 cores) and
# the figures (4 s here); the deadline's margin, in which the figures are drawn and the archive packed
SMOKE_CHECK_S, FIXED_S, MARGIN_S = 15, 30, 20


def parse_args(argv=None):
    parser = measuring.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, help="the command's wall time in all (default: 9; --stand-in: 30, "
                                                      "a CPU being slower)")
    parser.add_argument("--check-timeout", type=float, default=90, help="seconds a smoke check may take "
                                                                         "(default: 90)")
    parser.add_argument("--smoke", action="store_true", help="run every gpu-smoke check, passed already or not")
    parser.add_argument("--stand-in", action="store_true", help="rehearse on a CPU, into runs/gpu-check/ only")
    parser.add_argument("--archive", help="pack what was measured into this .tar.gz")
    parser.add_argument("--plan", action="store_true", help="print what the command runs, by the model")
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
        found["gpu"], found["capability"] = "none (a CPU standing in)", "cpu"
    return found


def run_limited(command, seconds):
    """Run command (its own process group) for at most `seconds`; its exit code, None when cut."""
    process = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
    try:
        return process.wait(timeout=max(1, seconds))
    except subprocess.TimeoutExpired:
        measuring.kill_tree(process)  # (with the check or run under way, each in a session of its own)
        return None


def command_plan(minutes=9):
    """[(seconds, [line, ...])]: the commands of --minutes that a GPU whose table is not measured yet needs, by the
    model; its smoke's checks those smoke.json does not hold as passed on the last lease's capability and torch.
    Each command starts on a machine of its own, its Inductor cache empty."""
    from scripts.gpu.smoke import checks

    smoke = gpu_plan.read_json(GPU_DATA / "smoke.json", {})
    passed = [c for c in smoke.get("checks", []) if c["ok"]]
    check_s = sum(c["seconds"] for c in passed) / len(passed) if passed else SMOKE_CHECK_S
    to_run = len(checks()) - len(passed)
    measured = {}
    for row in measuring.read_csv(GPU_DATA / "table.csv") if (GPU_DATA / "table.csv").exists() else []:
        measured.setdefault(row["planned"], []).append(f"{row['gpu']} {float(row['seconds']):.0f} s")
    decode, jpeg = gpu_plan.decode_per_worker(ROOT / "figures" / "data" / "io.csv"), gpu_plan.jpeg_images(JPEG)
    commands, compiled = [(FIXED_S + to_run * check_s, [
        f"{FIXED_S:5.0f} s  the preflight, the JPEG folder (25,000 files), the figures",
        f"{to_run * check_s:5.0f} s  gpu-smoke: {to_run} of {len(checks())} checks to run ({len(passed)} passed "
        f"already on compute capability {smoke.get('capability')} and torch {smoke.get('torch')}: an H100's or an "
        f"H200's; {check_s:.0f} s each)"])], set()
    plan = gpu_plan.table_plan(16, decode, jpeg)  # (a lent node's 16 cores)
    fastest = gpu_plan.assumed_fastest()  # (the model's; and its JPEG row with nvjpeg, the model's fastest decoder)
    profiles = [(setup, f"the profile of {name}, if its target misses") for setup, name in (
        (fastest, "the fastest set-up"), (fastest._replace(decoder="gpu"), "the fastest --decoder"))]
    for setup, name in [(setup, name) for setup, name, _ in plan] + profiles:
        while True:
            seconds = gpu_plan.model_seconds(setup, gpu_plan.images_of(setup, jpeg), 16, decode,
                                             gpu_plan.graph(setup) in compiled,
                                             profile=name.startswith("the profile"))
            if commands[-1][0] + seconds <= 60 * minutes - MARGIN_S or len(commands[-1][1]) == 1:
                break
            commands.append((FIXED_S, [f"{FIXED_S:5.0f} s  the preflight and the figures"]))
            compiled = set()  # (another machine)
        compiled |= {gpu_plan.graph(setup)} if setup.compile else set()
        was = f"   (measured: {', '.join(measured[name])})" if name in measured else ""
        commands[-1] = (commands[-1][0] + seconds, [*commands[-1][1], f"{seconds:5.0f} s  {name}{was}"])
    return commands


def rehearsed_in_full(gpu_data):
    """Whether a rehearsal measured every set-up of the table and profiled every target; if not, says what not."""
    from scripts.figures.gpu.measure import machine

    here = machine(stand_in=True)
    table = gpu_data / "table.csv"
    rows = gpu_plan.mine(measuring.read_csv(table), here) if table.exists() else []
    measured = {r["planned"] for r in rows}
    left = [gpu_plan.setup_name(s) for s in gpu_plan.TABLE if gpu_plan.setup_name(s) not in measured]
    profiled = {p["target"] for p in gpu_plan.mine(gpu_plan.read_json(gpu_data / "profiles.json", []), here)}
    left += [f"a profile for the {name} target" for name, _, _ in gpu_plan.TARGETS if name not in profiled and
             name != "recipe"]  # (the recipe target's set-up is the speed target's: one profile for both)
    if left:
        print(f"gpu-check: the rehearsal did not run the whole plan; left: {'; '.join(left)}", flush=True)
    return not left


def main(argv=None):
    args = parse_args(argv)
    if args.plan:
        print("the device command on a GPU whose table is not measured yet, by the model (an H100's seconds; each "
              "command on a machine of its own):")
        for i, (seconds, lines) in enumerate(command_plan(args.minutes), 1):
            print(f"command {i}: about {seconds / 60:.1f} min of {args.minutes:g}")
            print("\n".join(f"  {line}" for line in lines))
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
        shutil.copytree(ROOT / "docs" / "results", OUT / "docs" / "results", dirs_exist_ok=True)
    gpu_data.mkdir(parents=True, exist_ok=True)
    found = preflight(args, install_wheels(OUT / "site"))
    (OUT / "preflight.json").write_text(json.dumps(found, indent=2) + "\n")
    print("gpu-check: " + ", ".join(f"{k} {v}" for k, v in found.items() if k not in ("wheels", "stand_in")),
          flush=True)
    smoke = [sys.executable, str(ROOT / "scripts" / "gpu" / "smoke.py"), "--json", str(gpu_data / "smoke.json"),
             "--out", str(OUT / "smoke"), "--timeout", str(args.check_timeout),
             *([] if args.smoke else ["--keep-passed"]), *(["--stand-in"] if args.stand_in else [])]
    code = run_limited(smoke, deadline - time.monotonic())
    failed = code != 0
    if code is None:
        print(f"gpu-check: gpu-smoke cut at the command's {args.minutes:g} minutes", flush=True)
    shutil.copy(OUT / "preflight.json", gpu_data / "preflight.json")
    jpeg = OUT / "jpeg" if args.stand_in else JPEG
    if (deadline - time.monotonic()) / 60 > 1:
        if not (jpeg / ".complete").exists():  # (seconds on the node's cores)
            shutil.rmtree(jpeg, ignore_errors=True)
            subprocess.run([sys.executable, str(ROOT / "scripts" / "make_demo_data.py"), "--imagenet-like", str(jpeg),
                            *JPEG_SIZE["stand-in" if args.stand_in else "gpu"], "--jobs", "0"], check=True)
            (jpeg / ".complete").touch()
        table = [sys.executable, str(ROOT / "scripts" / "figures" / "gpu" / "measure.py"), "--parts", "table",
                 "--jpeg", str(jpeg), "--skip-measured",
                 "--minutes", f"{(deadline - time.monotonic() - MARGIN_S) / 60:.2f}",
                 "--figures-data", str(gpu_data), "--runs", str(OUT / "runs"),
                 *(["--stand-in", *STAND_IN_RUNS] if args.stand_in else [])]
        code = run_limited(table, deadline - time.monotonic() - MARGIN_S)
        if code is None:
            print("gpu-check: the table was cut at the deadline; what it measured before is kept", flush=True)
        elif code:
            print(f"gpu-check: the table failed (exit {code}); what it measured before is kept", flush=True)
            failed = True
        if args.stand_in:  # the rehearsal runs the whole plan: every set-up, and a profile for every target
            failed |= not rehearsed_in_full(gpu_data)
    drawn = subprocess.run([sys.executable, str(ROOT / "scripts" / "figures" / "plot_results.py"), "--data",
                            str(gpu_data.parent),
                            "--figures", str(OUT / "figures" if args.stand_in else ROOT / "figures"), "--results",
                            str(results)], stdout=subprocess.DEVNULL, timeout=300)
    failed |= drawn.returncode != 0
    if args.archive:
        with tarfile.open(args.archive, "w:gz") as archive:
            for path in (OUT / "preflight.json", gpu_data, results, results.parent / "docs" / "results"):
                if path.exists():
                    archive.add(path, arcname=str(path.relative_to(ROOT)))
    print(f"gpu-check: done in {(time.monotonic() - started) / 60:.1f} min; {gpu_data.relative_to(ROOT)}/, "
          f"{results.relative_to(ROOT)}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
