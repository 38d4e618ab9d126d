"""The nd recipe against pytorch/examples' imagenet/main.py: whole-process wall and CPU time of one epoch.

    git clone https://github.com/pytorch/examples /tmp/examples      # (not part of this repository)
    python scripts/make_demo_data.py --imagenet-like data/jpeg800 --classes 10 --images 100
    python scripts/figures/examples/measure.py --examples /tmp/examples/imagenet/main.py data/jpeg800

Both train ResNet-18 for one epoch on the same JPEG folder with the same batch and
loader workers (-b 32 -j 2), on the CPU, evaluate once and save a checkpoint, as
their users run them: everything from the command's start to its exit counts
(imports, loader start-up, training, evaluation, saving, the interpreter's exit).
The runs alternate, --repeats of each, so that a slow moment of a shared machine
does not land on one of them; the medians are compared. CPU time is the user and
system time of the process and every descendant it waited for. After each run
ends, any process left in its process group (a fork server or a resource tracker
that outlives it) is counted. Writes --json (figures/data/examples.json), which
plot_results.py puts in RESULTS.md.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.figures import measuring  # noqa: E402

FLAGS = ["-a", "resnet18", "-b", "32", "-j", "2", "--epochs", "1", "-p", "1000"]


def left_in_group(pgid):
    """Processes still alive in the process group (zombies not counted)."""
    alive = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in "ZX" and int(fields[2]) == pgid:
            alive += 1
    return alive


def timed(command, cwd, threads):
    """(wall s, CPU s, processes of its group alive just after it ended) of one command."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    _, errors = process.communicate()
    wall = time.perf_counter() - start
    left = left_in_group(process.pid)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        sys.exit(f"error: {' '.join(command)} failed ({process.returncode}):\n{errors[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, left


def version_of(main_py):
    """Which main.py was compared: its checkout's commit (when it is in one) and the file's sha256."""
    import hashlib

    commit = subprocess.run(["git", "-C", str(Path(main_py).resolve().parent), "rev-parse", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"commit": commit or None, "sha256": hashlib.sha256(Path(main_py).read_bytes()).hexdigest()}


def main():
    parser = measuring.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="an ImageNet-style JPEG folder (train/ and val/)")
    parser.add_argument("--examples", required=True, help="pytorch/examples' imagenet/main.py")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="figures/data/examples.json")
    args = parser.parse_args()
    if not (Path(args.folder) / "train").is_dir():
        parser.error(f"{args.folder} has no train/ folder; see the usage at the top of this script")
    if not Path(args.examples).is_file():
        parser.error(f"--examples {args.examples} is not a file (pytorch/examples' imagenet/main.py)")
    threads = measuring.usable_cores()
    folder = str(Path(args.folder).resolve())
    times = {"recipe": [], "examples": []}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            out = Path(scratch) / f"recipe{repeat}"
            recipe = [sys.executable, str(ROOT / "recipes" / "nd" / "train.py"), folder, *FLAGS, "--out", str(out)]
            examples = [sys.executable, str(Path(args.examples).resolve()), folder, *FLAGS, "--no-accel"]
            cwd = Path(scratch) / f"examples{repeat}"  # (main.py writes its checkpoints where it runs)
            cwd.mkdir()
            for name, command, where in (("recipe", recipe, ROOT), ("examples", examples, cwd)):
                times[name].append(timed(command, where, threads))
                wall, cpu, left = times[name][-1]
                print(f"{name:>8}: wall {wall:6.2f} s  CPU {cpu:6.2f} s  left running {left}", flush=True)
    median = {name: {"wall_s": statistics.median(t[0] for t in runs), "cpu_s": statistics.median(t[1] for t in runs),
                     "left_running": max(t[2] for t in runs)} for name, runs in times.items()}
    command = "python scripts/figures/examples/measure.py --examples EXAMPLES/imagenet/main.py " + args.folder
    result = {"command": command,
              "flags": " ".join(FLAGS), "images": sum(1 for p in (Path(folder) / "train").rglob("*") if p.is_file()),
              "repeats": args.repeats, "examples_version": version_of(args.examples), "recipe": median["recipe"],
              "examples": median["examples"],
              "wall_ratio": median["recipe"]["wall_s"] / median["examples"]["wall_s"],
              "cpu_ratio": median["recipe"]["cpu_s"] / median["examples"]["cpu_s"],
              "runs": {name: [{"wall_s": round(w, 3), "cpu_s": round(c, 3), "left_running": n} for w, c, n in runs]
                       for name, runs in times.items()}, **measuring.hardware()}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"recipe / examples: wall {result['wall_ratio']:.3f}x, CPU {result['cpu_ratio']:.3f}x (medians of "
          f"{args.repeats}); wrote {args.json}")


if __name__ == "__main__":
    main()
