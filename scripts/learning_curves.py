"""Train nd, ddp and apex on the digits and keep their per-epoch metrics for the figures.

    python scripts/learning_curves.py                  # data/mnist5k, 4 epochs each
    python scripts/learning_curves.py --data DIR --quick --figures-data OUT   # lenet, for tests

nd trains with batch 64 in one process; ddp and apex with 2 processes of 32 (on a
machine with one GPU, one process), so the three see the same global batch and
learning rate. (On a CPU the apex recipe
runs in fp32, as it does by default where there is no fast low precision; on a
GPU it is fp16.) Each run directory is runs/curves/<recipe>; its metrics.csv and
summary.json are copied to figures/data/curves/<recipe>.csv and .json.
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.measuring import DEMO_MODEL, QUICK_MODEL, python_command  # noqa: E402

RECIPES = {"nd": 1, "ddp": 2, "apex": 2}  # processes
DEMO = [*DEMO_MODEL, "--lr", "0.05", "-j", "1", "--seed", "0"]
QUICK = [*QUICK_MODEL, "--lr", "0.05", "-j", "0", "--seed", "0"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=64, help="split evenly between the processes")
    parser.add_argument("--quick", action="store_true", help="lenet at 16 px instead of ResNet-18")
    parser.add_argument("--runs", default="runs/curves", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where the metrics are copied")
    args = parser.parse_args()
    if not (Path(args.data) / "train").is_dir():
        sys.exit(f"error: {args.data} has no train/ folder; run `python scripts/make_demo_data.py` first")
    copies = Path(args.figures_data) / "curves"
    copies.mkdir(parents=True, exist_ok=True)
    import torch
    gpus = torch.cuda.device_count()
    for recipe, processes in RECIPES.items():
        processes = min(processes, gpus) if gpus else processes  # one process per GPU
        out = Path(args.runs) / recipe
        shutil.rmtree(out, ignore_errors=True)
        script = str(ROOT / "recipes" / recipe / "train.py")
        flags = [args.data, *(QUICK if args.quick else DEMO), "-b", str(args.global_batch // processes),
                 "--epochs", str(args.epochs), "--out", str(out)]
        print(f"{recipe}: {processes} process(es), {args.epochs} epochs", flush=True)
        result = subprocess.run([*python_command(processes), script, *flags], cwd=ROOT)  # its output shows
        if result.returncode != 0:
            sys.exit(f"error: the {recipe} run failed (exit code {result.returncode})")
        shutil.copy(out / "metrics.csv", copies / f"{recipe}.csv")
        shutil.copy(out / "summary.json", copies / f"{recipe}.json")


if __name__ == "__main__":
    main()
