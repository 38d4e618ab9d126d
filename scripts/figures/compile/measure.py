"""What --compile costs at start-up and gains in steady state: the nd recipe, eager against compiled.

    python scripts/figures/compile/measure.py                    # ResNet-18 on data/mnist5k, 3 epochs per run
    python scripts/figures/compile/measure.py --quick DIR        # lenet on a tiny folder (for tests)

Three runs of the same recipe, seed and data, one after the other:
  eager      no --compile
  cold       --compile with an empty TorchInductor cache (a first run on a machine)
  warm       --compile again, reusing the cold run's cache (a rerun, or a restart)
Each epoch's time and images/s come from the run's own metrics.csv. The start-up
cost is the first epoch's extra time over a steady epoch, compiled minus eager;
the steady-state ratio is compiled images/s over eager images/s, medians of the
epochs after the first. Writes figures/data/compile.csv (with the hardware). The
runs go to runs/figures/compile/<mode>, the Inductor cache beside them; a run whose
summary.json is complete is not trained again.
"""

import argparse
import csv
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.figures import measuring  # noqa: E402
from scripts.figures.measuring import DEMO_MODEL, QUICK_MODEL, hardware, write_csv  # noqa: E402

DEMO = [*DEMO_MODEL, "-b", "32", "--lr", "0.05", "-j", "1", "--seed", "0"]
QUICK = [*QUICK_MODEL, "-b", "8", "-j", "0", "--seed", "0"]
FIELDS = ["mode", "epoch", "epoch_s", "images_per_s", "arch", "threads", "cpu", "cores", "gpu", "torch"]


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="?", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=3, help="per run; the first one compiles (default: 3)")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the one process (default: 2)")
    parser.add_argument("--quick", action="store_true", help="lenet at 16 px instead of ResNet-18")
    parser.add_argument("--csv", default="figures/data/compile.csv")
    parser.add_argument("--runs", default="runs/figures/compile", help="where the run directories go")
    args = parser.parse_args()
    measuring.require_digits(args.data)
    if args.epochs < 2:
        sys.exit("error: --epochs must be at least 2: the first epoch compiles, the others are the steady state")
    model = QUICK if args.quick else DEMO
    machine, rows, runs = hardware(), [], Path(args.runs)
    cache = runs / "inductor-cache"  # empty for the cold run, filled by it for the warm one
    for mode in ("eager", "cold", "warm"):
        out = runs / mode
        flags = [args.data, *model, "--epochs", str(args.epochs), *([] if mode == "eager" else ["--compile"])]
        env = {"TORCHINDUCTOR_CACHE_DIR": str(cache.resolve())}
        launch = measuring.launch_of("nd", 1, flags, env, args.threads)
        if mode == "cold" and measuring.finished_summary(out, launch) is None:
            shutil.rmtree(cache, ignore_errors=True)  # a first run on a machine: nothing compiled yet
        print(f"{mode}: nd, {model[1]}, {args.epochs} epochs", flush=True)
        measuring.train("nd", 1, flags, out, args.threads, env)
        with open(out / "metrics.csv", newline="") as f:
            for row in csv.DictReader(f):
                if row["split"] == "train":
                    rows.append({"mode": mode, "epoch": row["epoch"], "epoch_s": row["epoch_s"],
                                 "images_per_s": row["images_per_s"], "arch": model[1],
                                 "threads": args.threads, **machine})
    write_csv(args.csv, FIELDS, rows)
    for mode in ("eager", "cold", "warm"):
        times = [float(r["epoch_s"]) for r in rows if r["mode"] == mode]
        print(f"{mode:5s}: first epoch {times[0]:.1f} s, then {statistics.median(times[1:]):.1f} s per epoch")
    print(f"wrote {args.csv}")
    measuring.record_part(Path(args.csv).parent, "compile", started)


if __name__ == "__main__":
    main()
