"""The ps part of make figures: the parameter server against Byzantine workers, in three steps.

    python scripts/figures/ps/measure.py     # figures/data/ps.csv, ps_byzfl.csv, ps_why.csv (then plot_results.py)
    python scripts/figures/ps/measure.py --quick --seeds 0 --epochs 1   # a few rows at 16 px, for QUICK=1
    python scripts/figures/ps/measure.py --only 'zeno++/*/*' 'sync-*/*/ALIE*'   # these rows; ps.csv keeps the rest

The folder, study by study (each measured by <study>.py, rendered by render_<study>.py; render.py, the part's
render(), renders the table and calls the others):
  table.py            the table: each of the authors' figures in their regime, scaled down (its docstring says how);
                      render.py with table_plot.py (its figures), render_targets.py (its targets, its batch
                      part) and table_rows.py (ps.csv's rows, read by every render_*.py)
  byzfl_reference.py  ByzFL's own benchmark on the same digits, the outside reference; render_byzfl_reference.py
  why.py              why the targets that miss do: the recipe under why_probe.py; render_why.py
  cluster.py          ZenoPS's sync runs on the virtual cluster, each role on a node of its own (--parts
                      cluster; it needs root); render_cluster.py
Each step keeps what an earlier, stopped run finished; the part's time counts them all. --only PART/RULE/ATTACK
patterns (fnmatch) measure the table's runs that match and keep every other row of ps.csv, and skip the other two
steps.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.figures import measuring  # noqa: E402
from scripts.figures.ps import byzfl_reference, cluster, table, why  # noqa: E402


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a few rows of lenet at 16 px, for tests and QUICK=1")
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--runs", default="runs/figures/ps", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where ps.csv goes")
    parser.add_argument("--only", nargs="+", metavar="PART/RULE/ATTACK",
                        help="measure only the table's runs that match (fnmatch), keeping ps.csv's other rows")
    parser.add_argument("--parts", nargs="+", choices=["machine", "cluster"], default=["machine", "cluster"],
                        help="machine: the three steps above, on this machine's processes; cluster: ZenoPS on the "
                             "virtual cluster (cluster.py; it needs root)")
    args = parser.parse_args()
    measuring.require_digits(args.data)
    if "machine" not in args.parts:
        cluster.measure(args)
        measuring.record_part(args.figures_data, "ps", started, adding=True)
        return
    replacing = table.run(args.data, args.runs, args.figures_data, args.seeds, args.epochs, args.quick, args.only)
    if args.only:  # (the part's time: less the replaced rows' training, their start-up unknown, plus the new runs')
        measuring.record_part(args.figures_data, "ps", started, replacing=replacing)
        return
    # the outside reference, in the same part (its time counts in the part's)
    byzfl_reference.run(args.data, Path(args.runs).parent / "byzfl", args.figures_data, quick=args.quick)
    # why the targets that miss do: the recipe under why_probe.py
    why.run(args.data, Path(args.runs).parent / "ps-why", args.figures_data, args.seeds, args.epochs, args.quick)
    if "cluster" in args.parts:
        cluster.measure(args)
    measuring.record_part(args.figures_data, "ps", started)


if __name__ == "__main__":
    main()
