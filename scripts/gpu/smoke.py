"""The one-GPU check: every recipe's single-GPU path, a few steps each, one line per check.

    make gpu-smoke                          # PY=python3 make gpu-smoke: a Python of your own
    python scripts/gpu/smoke.py [--only ddp apex ...] [--timeout S] [--json FILE] [--list]
    python scripts/gpu/smoke.py --stand-in  # the same checks rehearsed on a CPU

On the first GPU, a small JPEG folder (written once into runs/gpu-smoke/jpeg) and
ResNet-18 at 64 px, one or two short epochs per check: first each recipe's GPU checks, as the
catalogue lists them (recipes/__init__.py; a recipe that lists none runs once at its defaults;
those marked run under scripts/harness/nccl_rules.py: ddp's first, the pipeline's, ps's), then:
  fsdp                    a --sharded-checkpoint resumed by a second run
  vit                     the small vision transformer (vit_tiny at 56 px) in bf16: fsdp --shard full,
                          each encoder block its own unit; apex O1 with --channels-last (one line: only
                          its patch projection is a convolution)
  faults                  a SIGTERM ends in exit 75, and --auto-resume then finishes
  syncs                   ddp in fp32, and apex at O1 fp16 (GradScaler) with --ema-decay, under
                          torch.cuda.set_sync_debug_mode("warn"): the host synchronisations
                          per training step, by source (scripts/gpu/count_syncs.py); the check
                          fails when the recipes' own code makes one
Each run goes to <--out>/<check>/ (default runs/gpu-smoke; its output in output.log). A
check still running after --timeout seconds (default 90; the longest passing check took 35 s
on an H100) is cut there, its processes and theirs killed, and fails; the next one starts.
Prints one line per check, then a summary, and writes them to --json as they come; exits 1
when a check failed. --keep-passed leaves out the checks that the --json file already holds
as passed on a GPU of the same compute capability (an H100's passes hold for an H200: both
9.0) and torch, and keeps their lines there: a check cut short by a lease goes on in the next.
Without CUDA: one line, exit 2. A package the chosen checks need and this Python lacks: one
line naming it, exit 2.

--stand-in rehearses the check on a CPU, where no GPU is (CI does, under the GPU nodes' torch): every
check's plumbing, with lenet at 16 px on a smaller folder, the CPU and gloo where the GPU and NCCL would
be, and count_syncs.py's stand-in counter. What only a GPU runs is replaced and said on the check's line
(--sync-bn is left out, --decoder gpu becomes tensor); one more check hangs on purpose (SIGSTOP after its
2nd step) and must be cut at its limit (--hang-timeout, default 30 s).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from recipes import RECIPES, gpu_checks  # noqa: E402
from scripts.checks import check_python  # noqa: E402
from scripts.figures import measuring  # noqa: E402

OUT = ROOT / "runs" / "gpu-smoke"
SMALL = ["-a", "resnet18", "--image-size", "64", "-b", "32", "--lr", "0.01", "-p", "2", "-j", "2"]
STAND_IN_SMALL = ["-a", "lenet", "--image-size", "16", "-b", "8", "--lr", "0.01", "-p", "2", "-j", "1"]
# what only a GPU runs, and what the stand-in runs instead: {flag: replacement, None to leave it out}
STAND_IN_FLAGS = {("--sync-bn",): None, ("--decoder", "gpu"): ("--decoder", "tensor")}
HUNG = "stand-in-hung-check"


def under_nccl_rules(recipe):
    """The recipe, run under scripts/harness/nccl_rules.py: where tensors' devices differ, a CPU tensor on a device
    group or a CUDA tensor on the control group ends the run."""
    return [str(ROOT / "scripts" / "harness" / "nccl_rules.py"), str(ROOT / "recipes" / recipe / "train.py")]


def checks(data="{data}", small=SMALL, stand_in=False):
    """[(name, group, [(recipe or script, processes, flags, expected exit code), ...])]: the runs of each check,
    in order (a later run of a check may read an earlier one's output: {out} is the check's folder)."""
    def one(recipe, *flags, processes=1):
        return recipe, processes, [data, *small, "--epochs", "1", *flags], 0

    found = [(check.name, entry.name, [one(under_nccl_rules(entry.name) if check.nccl_rules else entry.name,
                                            *check.flags, processes=check.processes)])
             for entry in RECIPES for check in gpu_checks(entry)]
    found.append(("fsdp-sharded-checkpoint", "fsdp", [
        one("fsdp", "--shard", "full", "--opt-level", "O1", "--amp-dtype", "bf16", "--sharded-checkpoint",
            "--out", "{out}/first"),
        ("fsdp", 1, [data, *small, "--epochs", "2", "--shard", "full", "--opt-level", "O1", "--amp-dtype", "bf16",
                     "--resume", "{out}/first/checkpoint_dcp"], 0)]))
    vit = ["-a", "vit_tiny", "--image-size", "56", "--opt-level", "O1", "--amp-dtype", "bf16"]  # (7 x 7 of 8 px)
    found.append(("vit-tiny-fsdp-full-and-apex-bf16", "vit", [  # (each run its own --out: a second would clash)
        one("fsdp", *vit, "--shard", "full", "--out", "{out}/fsdp"),
        one("apex", *vit, "--channels-last", "--out", "{out}/apex")]))
    injected = [str(ROOT / "scripts" / "harness" / "inject_fault.py"), "--fault", "term", "--step", "3", "--",
                str(ROOT / "recipes" / "ddp" / "train.py")]
    found.append(("faults-sigterm-then-resume", "faults", [
        (injected, 1, [data, *small, "--epochs", "2", "--auto-resume", "--out", "{out}/run"], 75),
        ("ddp", 1, [data, *small, "--epochs", "2", "--auto-resume", "--out", "{out}/run"], 0)]))
    for recipe, flags in (("ddp", []), ("apex", ["--opt-level", "O1", "--amp-dtype", "fp16", "--ema-decay", "0.99"])):
        counted = [str(ROOT / "scripts" / "gpu" / "count_syncs.py"), "--json", "{out}/syncs.json",
                   *(["--stand-in"] if stand_in else []), "--", str(ROOT / "recipes" / recipe / "train.py")]
        found.append((f"syncs-per-step-{recipe}{'-fp16-ema' if flags else ''}", "syncs",
                      [(counted, 1, [data, *small, "--epochs", "2", "-p", "1000", *flags], 0)]))
    if stand_in:  # a check that hangs: the limit must cut it, and the next check start
        stopped = [str(ROOT / "scripts" / "harness" / "inject_fault.py"), "--fault", "stop", "--step", "2", "--times",
                   "{out}/times.jsonl", "--", str(ROOT / "recipes" / "ddp" / "train.py")]
        found.append((HUNG, "faults", [(stopped, 1, [data, *small, "--epochs", "1"], "cut")]))
    return found


def stand_in_flags(flags):
    """The flags with what only a GPU runs replaced (STAND_IN_FLAGS), and what was replaced."""
    flags, said = list(flags), []
    for old, new in STAND_IN_FLAGS.items():
        for i in range(len(flags) - len(old) + 1):
            if tuple(flags[i:i + len(old)]) == old:
                flags[i:i + len(old)] = new or []
                said.append(f"{' '.join(old)} -> {' '.join(new)}" if new else f"without {' '.join(old)}")
                break
    return flags, said


def parse_args(argv=None):
    groups = sorted({group for _, group, _ in checks()})
    parser = measuring.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=groups, help="these groups of checks (default: all)")
    parser.add_argument("--list", action="store_true", help="print the checks and exit")
    parser.add_argument("--timeout", type=float, default=90, help="seconds a check may take (default: 90)")
    parser.add_argument("--hang-timeout", type=float, default=30,
                        help="--stand-in: the limit of the check that hangs on purpose (default: 30)")
    parser.add_argument("--json", help="the checks' lines and the summary, written as they come")
    parser.add_argument("--keep-passed", action="store_true", help="leave out the checks --json holds as passed on "
                                                                   "this compute capability and torch")
    parser.add_argument("--out", default=str(OUT), help=f"where the runs go (default: {OUT.relative_to(ROOT)})")
    parser.add_argument("--stand-in", action="store_true", help="rehearse on a CPU: what only a GPU runs replaced")
    args = parser.parse_args(argv)
    for flag, value in (("--timeout", args.timeout), ("--hang-timeout", args.hang_timeout)):
        if value <= 0:
            parser.error(f"{flag} must be above 0, got {value:g}")
    if args.keep_passed and not args.json:
        parser.error("--keep-passed needs --json: the file that holds the checks passed already")
    return args


def passed_before(path, capability, torch_version, names):
    """The lines of the checks among `names` that the report at `path` holds as passed on a GPU of this compute
    capability (an H100 and an H200 are both 9.0: the same kernels run) and this torch."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    if (report.get("capability"), report.get("torch")) != (capability, torch_version):
        return []
    return [dict(check, on=check.get("on", report.get("device"))) for check in report.get("checks", [])
            if check["ok"] and check["check"] in names]  # (on: the GPU it passed on)


def command(run, out, data):
    """The command line of one run of a check: a recipe, or a script that wraps one (a list)."""
    target, processes, flags, _ = run
    flags = [flag.replace("{out}", str(out)).replace("{data}", str(data)) for flag in flags]
    if "--out" not in flags:
        flags += ["--out", str(out)]
    script = target if isinstance(target, list) else [str(ROOT / "recipes" / target / "train.py")]
    script = [part.replace("{out}", str(out)) for part in script]
    return [*measuring.python_command(processes), *script, *flags]


def last_error(output):
    """The line that says what went wrong: the last 'error:' line, else the output's last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no output)"])[-1][:300]


def run_one(line, env, log, timeout):
    """(exit code, or None when cut at the limit; its output). At the limit the run goes, with every process it
    started (torchrun's workers, loader workers)."""
    process = subprocess.Popen(line, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        measuring.kill_tree(process)
        output, _ = process.communicate(timeout=30)
        code = None
    log.write(output)
    return code, output


def run_check(name, runs, args, data, timeout):
    """Run a check's runs in turn; (ok, what to say)."""
    out = Path(args.out) / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="" if args.stand_in else
               os.environ.get("CUDA_VISIBLE_DEVICES", "0"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    deadline, replaced = time.monotonic() + timeout, []
    with open(out / "output.log", "w") as log:
        for run in runs:
            line = command(run, out, data)
            if args.stand_in:
                line, said = stand_in_flags(line)
                replaced += said
            log.write(f"$ {' '.join(line)}\n")
            log.flush()
            code, output = run_one(line, env, log, max(1.0, deadline - time.monotonic()))
            stand_in = f" (stand-in: {', '.join(replaced)})" if replaced else ""
            if code is None:
                cut = f"cut at its {timeout:g} s limit"
                if run[3] != "cut":
                    return False, f"{cut}: {last_error(output)}"
                hung = (out / "times.jsonl").exists() and '"fault"' in (out / "times.jsonl").read_text()
                return hung, cut + (", as it should be" if hung else ", but it never reached the step that hangs")
            if code != run[3]:
                return False, f"exit {code}, not {run[3]}: {last_error(output)}{stand_in}"
    if name.startswith("syncs"):
        counted = json.loads((out / "syncs.json").read_text())
        ours = {source: n for source, n in counted["sources"].items() if source.startswith("recipes/")}
        said = (f"{counted['per_step']:.2f} per step over {counted['steps']} steps" if counted["steps"] else
                "no step counted")
        if ours or not counted["steps"]:
            return False, f"{said}; from the recipes: {ours or 'none'}{stand_in}"
        torch_syncs = f": torch's {counted['sources']}" if counted["syncs"] else ""
        return True, f"{said}; none from the recipes{torch_syncs}{stand_in}"
    return True, stand_in.strip()


def main(argv=None):
    args = parse_args(argv)
    data = Path(args.out) / "jpeg"
    chosen = [(name, group, runs) for name, group, runs in
              checks(str(data), STAND_IN_SMALL if args.stand_in else SMALL, args.stand_in)
              if not args.only or group in args.only]
    if args.list:
        for name, group, runs in chosen:
            commands = " && ".join(" ".join(command(run, Path(args.out) / name, data)[1:]) for run in runs)
            print(f"{name:32s} {commands.replace(str(ROOT) + os.sep, '')}")
        return
    # (one line and exit 2 without CUDA or a package the chosen checks need)
    check_python.require("gpu-smoke", gpu=not args.stand_in, groups={group for _, group, _ in chosen})
    import torch

    if not (data / "train").is_dir():
        size = ["--classes", "4", "--images", "16"] if args.stand_in else ["--classes", "8", "--images", "40"]
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_demo_data.py"), "--imagenet-like", str(data),
                        *size], check=True, stdout=subprocess.DEVNULL)
    device = "a CPU standing in for the GPU" if args.stand_in else torch.cuda.get_device_name(0)
    capability = "cpu" if args.stand_in else ".".join(map(str, torch.cuda.get_device_capability(0)))
    print(f"gpu-smoke: {len(chosen)} checks on {device}, torch {torch.__version__}; output in "
          f"{os.path.relpath(args.out, ROOT)}/<check>/", flush=True)
    kept = (passed_before(args.json, capability, torch.__version__, {name for name, _, _ in chosen})
            if args.keep_passed else [])
    order, passed = [name for name, _, _ in chosen], {check["check"] for check in kept}
    report = {"device": device, "capability": capability, "torch": torch.__version__, "stand_in": args.stand_in,
              "total": len(chosen), "checks": [dict(check, earlier=True) for check in kept],
              "not_run": [name for name in order if name not in passed]}
    others = " and ".join(sorted({check["on"] for check in kept} - {device}))
    earlier = f" ({len(kept)} of them passed in an earlier command{', on ' + others if others else ''})" if kept else ""
    if kept:
        print(f"  {len(kept)} checks passed already on compute capability {capability} and this torch "
              f"(--keep-passed): {' '.join(check['check'] for check in kept)}", flush=True)
    started, failed = time.perf_counter(), []
    report["summary"] = f"gpu-smoke: {len(kept)} of {len(chosen)} checks ok{earlier}"
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    for name, _, runs in (check for check in chosen if check[0] not in passed):
        begun = time.perf_counter()
        ok, said = run_check(name, runs, args, data, args.hang_timeout if name == HUNG else args.timeout)
        seconds = time.perf_counter() - begun
        print(f"  {name:32s} {'ok    ' if ok else 'FAILED'} {seconds:6.1f} s{'  ' + said if said else ''}",
              flush=True)
        report["checks"].append({"check": name, "ok": ok, "seconds": round(seconds, 1), "said": said})
        report["checks"].sort(key=lambda check: order.index(check["check"]))
        report["not_run"].remove(name)
        if not ok:
            failed.append(name)
        report["summary"] = (f"gpu-smoke: {len(report['checks']) - len(failed)} of {len(chosen)} checks ok in "
                             f"{(time.perf_counter() - started) / 60:.1f} min{earlier}"
                             f"{'; failed: ' + ' '.join(failed) if failed else ''}")
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(report["summary"], flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
