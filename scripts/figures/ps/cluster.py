"""ZenoPS where the wire costs time: the table's sync-1v runs (table.py) on the virtual cluster (scripts/cluster/),
the server, the validator and each of the 8 workers on a node of its own, over links sized by
scripts/figures/cluster/links.py's principle.

    sudo python scripts/figures/ps/measure.py --parts cluster     # figures/data/ps_cluster.csv

On one machine's loopback the server and the validator sit on the workers' wire, which costs nothing. Here each
role has its own link: the workers push to the validator (zenops) or to the server (mean) over theirs, and the
server's and the validator's links carry what every worker sends them. Rules and attacks: RULES x ATTACKS, the
table's flags for them (ZenoPS's one-validator regime, scaled down), every seed. The link is the one sized
after 1 Gbit/s Ethernet at 8 nodes (the workers), from a worker's step alone (the ddp recipe at the workers'
batch, no one to talk to, 8 copies at once as run.py places 8 nodes on the cores): at lenet's few hundred kB,
10 Gbit/s Ethernet's sizing is paced by this machine's CPU, not the link (the scaling part's floor,
docs/results/scaling.md). Every rule runs on the same links: the cluster is fixed, the rule is what varies.
Runs go to runs/figures/ps/cluster/<rule>-<attack>-seed<S>. --quick: zenops without an attack.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.cluster import network  # noqa: E402
from scripts.figures import measuring  # noqa: E402
from scripts.figures.cluster import links  # noqa: E402
from scripts.figures.ps import table  # noqa: E402

RULES = ["mean", "zenops"]
ATTACKS = ["none", "signflip x6"]
LINK = next(link for link in links.REAL_LINKS if link[0].startswith("1 Gbit/s"))
FIELDS = ["aggregate", "attack", "seed", "processes", "link", "link_bits", "ratio", "rate_bits", "alone_step_s",
          "epochs", "top1", "diverged", "images_per_s", "train_s", "cpu", "cores", "gpu", "torch"]


def measure(args):
    """Every run; writes ps_cluster.csv into args.figures_data."""
    problem = network.require()
    if problem:
        print(f"ZenoPS on the cluster: not measured ({problem}); ps_cluster.csv kept as it is", file=sys.stderr)
        return
    runs, machine = Path(args.runs) / "cluster", measuring.hardware()
    model = measuring.QUICK_ACCURACY if args.quick else measuring.ACCURACY
    alone = links.alone_step("ddp", [args.data, *model, "--seed", "0"], table.WORKERS, 8, runs / "alone")
    name, link_bits = LINK
    ratio = links.real_ratio(link_bits, table.WORKERS, links.seed_gradient_bytes(), links.seed_node_step())
    rate = links.emulated_rate(ratio, table.WORKERS, links.fp32_gradient_bytes(args.data, model), alone)
    rows = []
    for seed in args.seeds:
        for aggregate in ["zenops"] if args.quick else RULES:
            for attack in ["none"] if args.quick else ATTACKS:
                recipe, processes, flags = table.flags_of("sync-1v", "sync", aggregate, attack, None, seed, args)
                launcher = links.launcher(processes, rate)
                out = runs / f"{re.sub(r'[^A-Za-z0-9.+-]+', '_', f'{aggregate}-{attack}')}-seed{seed}"
                summary = measuring.train(recipe, 1, flags, out, 1, check=False, launcher=launcher)
                row = {"aggregate": aggregate, "attack": attack, "seed": seed, "processes": processes, "link": name,
                       "link_bits": link_bits, "ratio": f"{ratio:.4f}", "rate_bits": round(rate),
                       "alone_step_s": f"{alone:.5f}", "epochs": args.epochs, **machine}
                if summary is None:  # the mean under an attack may diverge: a result, not an error
                    table.require_diverged(out, out.name, seed)
                    rows.append({**row, "diverged": 1})
                    print(f"{name} ({rate / 1e6:.1f} Mbit/s here), {aggregate}, {attack}, seed {seed}: diverged",
                          flush=True)
                    continue
                rows.append({**row, "diverged": 0, "top1": round(summary["top1"], 2),
                             "images_per_s": round(summary["images_per_s"], 1),
                             "train_s": round(measuring.train_seconds(out), 2)})
                print(f"{name} ({rate / 1e6:.1f} Mbit/s here), {aggregate}, {attack}, seed {seed}: top-1 "
                      f"{summary['top1']:.2f} %, {summary['images_per_s']:.0f} images/s", flush=True)
    measuring.write_csv(Path(args.figures_data) / "ps_cluster.csv", FIELDS, rows)
    print(f"wrote {Path(args.figures_data) / 'ps_cluster.csv'} ({len(rows)} runs)")
