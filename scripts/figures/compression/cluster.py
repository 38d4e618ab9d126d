"""Compression where the wire costs time: the compression recipe on the virtual cluster (scripts/cluster/), one
process a node, each link sized by scripts/figures/cluster/links.py so that uncompressed DDP's wire takes the share
of its step alone that ResNet-50's takes of a node's step on a real cluster (HAL's EDR InfiniBand, 10 and 1 Gbit/s
Ethernet).

    sudo python scripts/figures/compression/measure.py --parts cluster     # figures/data/compression_cluster*.csv

For each number of nodes (2 and 4): one node's step alone is measured for every method (the recipe at the
per-node batch with no one to talk to: its compression work included, the wire left out), and uncompressed
DDP's step with the links unshaped (seed 0: what this machine's CPU alone takes to all-reduce its bytes, the
emulation's floor at them); the real link's rate here follows from uncompressed DDP's step alone; a real link
whose rate here would exceed half the virtual cluster's ceiling (figures/data/cluster_bandwidth.csv: above it the
CPU, not the link, sets the pace) is named and not run. Then
every method trains on each link for each seed, and compression_cluster.csv keeps its step (the median over the
epochs of global batch / images/s), its training time and top-1; compression_cluster_curves.csv each epoch's
cumulative training seconds and top-1, from which the time to a target is read. Runs go to
runs/figures/compression/cluster/<link>-<nodes>/<method>-seed<S>.
"""

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.cluster import network  # noqa: E402
from scripts.figures import measuring  # noqa: E402
from scripts.figures.cluster import links  # noqa: E402

METHODS = [("none", False), ("fp16", False), ("bf16", False), ("fp8-e4m3", False), ("fp8-e4m3", True),
           ("powersgd", False), ("powersgd", True)]
FIELDS = ["method", "error_feedback", "link", "link_bits", "nodes", "seed", "ratio", "rate_bits", "alone_step_s",
          "bytes_per_step", "step_s", "unpriced_step_s", "train_s", "top1", "epochs", "global_batch", "arch", "cpu",
          "cores", "gpu", "torch"]
CURVE_FIELDS = ["method", "error_feedback", "link", "nodes", "seed", "epoch", "train_s", "top1"]
SKIPPED_FIELDS = ["link", "link_bits", "nodes", "ratio", "rate_bits", "ceiling_bits"]


def run_name(method, error_feedback):
    return f"{method}{'-ef' if error_feedback else ''}"


def link_name(name):
    return name.split(" (")[0].lower().replace(" ", "-").replace("/", "")


def measure(args, model, methods):
    """Every run of the cluster rows; writes the three CSVs into args.figures_data."""
    problem = network.require()
    if problem:
        print(f"compression on the cluster: not measured ({problem}); the compression_cluster CSVs kept as they are",
              file=sys.stderr)
        return
    bandwidth = Path(args.figures_data) / "cluster_bandwidth.csv"
    if not bandwidth.exists():
        sys.exit(f"error: {bandwidth} is missing: measure the cluster's ceiling first (make figures ONLY=cluster)")
    unshaped = [r for r in measuring.read_csv(bandwidth) if r["rate"] == "none"]
    largest = max(int(r["size_bytes"]) for r in unshaped) if unshaped else None
    ceiling = {int(r["nodes"]): float(r["busbw_bits"]) for r in unshaped if int(r["size_bytes"]) == largest}
    if set(args.cluster_nodes) - set(ceiling):
        sys.exit(f"error: {bandwidth} has no unshaped row at {sorted(set(args.cluster_nodes) - set(ceiling))} "
                 f"nodes: measure the cluster's ceiling there first (scripts/figures/cluster/measure.py --nodes)")
    gradient_bytes, node_step = links.seed_gradient_bytes(), links.seed_node_step()
    runs, machine = Path(args.runs) / "cluster", measuring.hardware()
    rows, curves, skipped = [], [], []
    for nodes in args.cluster_nodes:
        batch = args.global_batch // nodes
        alone = {}
        for method, error_feedback in methods:
            flags = [args.data, *model, "--warmup-epochs", "0", "--seed", "0", "--compress", method,
                     *(["--error-feedback"] if error_feedback else [])]
            alone[method, error_feedback] = links.alone_step("compression", flags, nodes, batch,
                                                             runs / f"alone-{nodes}" / run_name(method, error_feedback))
        bytes_per_step = links.fp32_gradient_bytes(args.data, model)  # what uncompressed DDP all-reduces
        unpriced = None
        for name, link_bits in links.REAL_LINKS:
            ratio = links.real_ratio(link_bits, nodes, gradient_bytes, node_step)
            rate = links.emulated_rate(ratio, nodes, bytes_per_step, alone["none", False])
            if rate > links.TRUSTED * ceiling[nodes]:
                skipped.append({"link": name, "link_bits": link_bits, "nodes": nodes, "ratio": f"{ratio:.4f}",
                                "rate_bits": round(rate), "ceiling_bits": ceiling[nodes]})
                print(f"{name} x {nodes} nodes: {rate / 1e6:.0f} Mbit/s here, above {links.TRUSTED:.0%} of the "
                      f"cluster's ceiling ({ceiling[nodes] / 1e6:.0f} Mbit/s): not emulated", flush=True)
                continue
            unpriced = unpriced or unpriced_step(args, model, nodes, batch, runs / f"unpriced-{nodes}" / "none-seed0")
            launcher = links.launcher(nodes, rate)
            for seed in args.seeds:
                for method, error_feedback in methods:
                    out = runs / f"{link_name(name)}-{nodes}" / f"{run_name(method, error_feedback)}-seed{seed}"
                    flags = [args.data, *model, "--epochs", str(args.cluster_epochs), "--seed", str(seed), "-b",
                             str(batch), "--compress", method, *(["--error-feedback"] if error_feedback else [])]
                    summary = measuring.train("compression", 1, flags, out, 1, launcher=launcher)
                    step = median_step(out, summary)
                    rows.append({"method": method, "error_feedback": int(error_feedback), "link": name,
                                 "link_bits": link_bits, "nodes": nodes, "seed": seed, "ratio": f"{ratio:.4f}",
                                 "rate_bits": round(rate), "alone_step_s": f"{alone[method, error_feedback]:.5f}",
                                 "bytes_per_step": summary["bytes_per_step"],
                                 "step_s": f"{step:.5f}", "unpriced_step_s": f"{unpriced:.5f}",
                                 "train_s": f"{measuring.train_seconds(out):.2f}",
                                 "top1": summary["top1"], "epochs": summary["epochs"],
                                 "global_batch": summary["global_batch"], "arch": summary["arch"], **machine})
                    curves += [{"method": method, "error_feedback": int(error_feedback), "link": name,
                                "nodes": nodes, "seed": seed, "epoch": epoch, "train_s": f"{elapsed:.2f}",
                                "top1": top1} for epoch, elapsed, top1 in measuring.training_curve(out)]
                    print(f"{name} x {nodes} nodes ({rate / 1e6:.1f} Mbit/s here), {run_name(method, error_feedback)}, "
                          f"seed {seed}: {step * 1e3:.1f} ms a step (alone "
                          f"{alone[method, error_feedback] * 1e3:.1f}), top-1 {summary['top1']:.2f}", flush=True)
    data = Path(args.figures_data)
    measuring.write_csv(data / "compression_cluster.csv", FIELDS, rows)
    measuring.write_csv(data / "compression_cluster_curves.csv", CURVE_FIELDS, curves)
    measuring.write_csv(data / "compression_cluster_skipped.csv", SKIPPED_FIELDS, skipped)
    print(f"wrote {data / 'compression_cluster.csv'} ({len(rows)} runs)")


def unpriced_step(args, model, nodes, batch, out):
    """The emulation's floor: uncompressed DDP's step (the median over the epochs) with the links unshaped, where
    only this machine's CPU sets the pace of the all-reduce (at these bytes slower than the ceiling's 64 MiB
    messages say)."""
    flags = [args.data, *model, "--epochs", str(args.cluster_epochs), "--seed", "0", "-b", str(batch), "--compress",
             "none"]
    return median_step(out, measuring.train("compression", 1, flags, out, 1, launcher=links.launcher(nodes)))


def median_step(out, summary):
    """A run's step: the median over its training epochs of global batch / images/s."""
    return statistics.median(summary["global_batch"] / float(r["images_per_s"])
                             for r in measuring.read_csv(out / "metrics.csv") if r["split"] == "train")
