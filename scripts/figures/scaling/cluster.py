"""DDP's scaling on the virtual cluster (scripts/cluster/): 1, 2, 4 and 8 nodes, one process a node, each link
sized by scripts/figures/cluster/links.py after a real cluster's (10 and 1 Gbit/s Ethernet; HAL's EDR InfiniBand
is beyond the emulation), beside the model of a DDP step.

    sudo python scripts/figures/scaling/measure.py --parts cluster     # figures/data/scaling_cluster*.csv

Two measurements, each said for what it is:
  stand-in   a node's computation stood in for by its measured duration (stand_in.py: sleep, then all-reduce the
             model's gradients), so that 8 nodes on 2 cores each step as they would alone: the step against the
             model's (a node's step alone + the ring all-reduce on the wire), --cluster-steps timed steps; and
             once with the links unshaped, the emulation's floor: where the all-reduce then takes more than
             links.TRUSTED of the wire's modelled time, the row measures this machine's CPU, not the link;
  training   the ddp recipe itself on 10 Gbit/s Ethernet's links, its computation real and the nodes sharing the
             machine's cores (at 4 and 8 nodes on 2 cores a node computes at a half or a quarter of its speed
             alone), each link sized from that shared step: images/s and the seconds to 97 % top-1, 3 seeds.
A node is one core (at one node, the cluster is given one core): the node's step alone is the recipe's on one
core with no one to talk to (scripts/figures/cluster/links.py's alone_step at 2 nodes).
The set-up: lenet on the digits (scripts/figures/measuring.py's ACCURACY, with TRAINING's learning rate and
WARMUP_EPOCHS), -b 32 a node (the batch a GPU, fixed, as the seed tutorial's 208), the learning rate scaled to the
global batch (the recipes' rule). Runs go to runs/figures/scaling/cluster/.
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.cluster import network  # noqa: E402
from scripts.figures import measuring  # noqa: E402
from scripts.figures.cluster import links  # noqa: E402

ETHERNET = [link for link in links.REAL_LINKS if "Ethernet" in link[0]]  # (EDR's rate is beyond the emulation)
STAND_IN_FIELDS = ["link", "link_bits", "nodes", "ratio", "rate_bits", "compute_s", "bytes_per_step", "steps", "step_s",
                   "unpriced_s", "model_s", "cpu", "cores", "gpu", "torch"]
TRAINING_FIELDS = ["link", "link_bits", "nodes", "seed", "ratio", "rate_bits", "alone_step_s", "step_s",
                   "images_per_s", "train_s", "epochs", "global_batch", "top1", "cpu", "cores", "gpu", "torch"]
CURVE_FIELDS = ["link", "nodes", "seed", "epoch", "train_s", "top1"]
# the global batch grows with the nodes (32 to 256): at the accuracy part's lr 0.1 for 256, lenet diverged at 8
# nodes (top-1 10 % in 2 of 3 seeds); at 0.05 with 2 epochs of warm-up (Goyal et al.'s gradual warm-up for large
# batches) the nd recipe at a batch of 256 reached 97 % by epoch 6 to 8 in 3 of 3 seeds
TRAINING, WARMUP_EPOCHS = ["--lr", "0.05"], 2


def measure(args, figures_data):
    """Both measurements; writes scaling_cluster.csv, scaling_cluster_training.csv and its curves."""
    problem = network.require()
    if problem:
        print(f"scaling on the cluster: not measured ({problem}); the scaling_cluster CSVs kept as they are",
              file=sys.stderr)
        return
    measuring.require_digits(args.cluster_data)
    runs, machine = Path(args.runs) / "cluster", measuring.hardware()
    gradient_bytes, node_step = links.seed_gradient_bytes(), links.seed_node_step()
    flags = [args.cluster_data, *measuring.ACCURACY, "--seed", "0"]
    bytes_per_step = links.fp32_gradient_bytes(args.cluster_data, measuring.ACCURACY)
    stand_in, training, curves = [], [], []
    # a node's step alone, at 1 node as at 2 (one core a copy): measured once for both
    measured_alone = {n: links.alone_step("ddp", flags, n, args.cluster_batch, runs / f"alone-{n}")
                      for n in sorted({max(2, nodes) for nodes in args.cluster_nodes})}
    alone = {nodes: measured_alone[max(2, nodes)] for nodes in args.cluster_nodes}
    one = alone[min(args.cluster_nodes)]
    # the emulation's floor: the stand-in with the links unshaped, where only this machine's CPU sets the pace of
    # an all-reduce of these bytes (at lenet's 324 kB it is slower than the ceiling's 64 MiB messages say)
    unpriced = {nodes: stand_in_step(nodes, None, one, bytes_per_step, args.cluster_steps)
                for nodes in args.cluster_nodes}
    for name, link_bits in ETHERNET:
        for nodes in args.cluster_nodes:
            ratio = links.real_ratio(link_bits, nodes, gradient_bytes, node_step) if nodes > 1 else 0.0
            rate = links.emulated_rate(ratio, nodes, bytes_per_step, one) if nodes > 1 else None
            step = stand_in_step(nodes, rate, one, bytes_per_step, args.cluster_steps) if rate else unpriced[nodes]
            wire = links.wire_seconds(nodes, bytes_per_step, rate) if rate else 0.0
            stand_in.append({"link": name, "link_bits": link_bits, "nodes": nodes, "ratio": f"{ratio:.4f}",
                             "rate_bits": round(rate) if rate else "", "compute_s": f"{one:.5f}",
                             "bytes_per_step": bytes_per_step, "steps": args.cluster_steps, "step_s": f"{step:.5f}",
                             "unpriced_s": f"{unpriced[nodes]:.5f}", "model_s": f"{one + wire:.5f}", **machine})
            print(f"stand-in, {name} x {nodes} nodes: {step * 1e3:.1f} ms a step (model {(one + wire) * 1e3:.1f}, "
                  f"the wire unpriced {unpriced[nodes] * 1e3:.1f})", flush=True)
    name, link_bits = ETHERNET[0]
    for nodes in args.cluster_nodes:
        ratio = links.real_ratio(link_bits, nodes, gradient_bytes, node_step) if nodes > 1 else 0.0
        rate = links.emulated_rate(ratio, nodes, bytes_per_step, alone[nodes]) if nodes > 1 else None
        for seed in args.seeds:
            out = runs / f"training-{nodes}" / f"seed{seed}"
            train_flags = [args.cluster_data, *measuring.ACCURACY, *TRAINING, "-b", str(args.cluster_batch),
                           "--epochs", str(args.cluster_epochs), "--seed", str(seed), "--warmup-epochs",
                           str(min(WARMUP_EPOCHS, args.cluster_epochs - 1))]  # (fewer epochs, as QUICK's: less)
            launcher = links.launcher(nodes, rate, cores=1 if nodes == 1 else None)
            summary = measuring.train("ddp", 1, train_flags, out, 1, launcher=launcher)
            rates = [float(r["images_per_s"]) for r in measuring.read_csv(out / "metrics.csv") if r["split"] == "train"]
            training.append({"link": name, "link_bits": link_bits, "nodes": nodes, "seed": seed,
                             "ratio": f"{ratio:.4f}", "rate_bits": round(rate) if rate else "",
                             "alone_step_s": f"{alone[nodes]:.5f}",
                             "step_s": f"{summary['global_batch'] / statistics.median(rates):.5f}",
                             "images_per_s": f"{statistics.median(rates):.1f}",
                             "train_s": f"{measuring.train_seconds(out):.2f}",
                             "epochs": summary["epochs"], "global_batch": summary["global_batch"],
                             "top1": summary["top1"], **machine})
            curves += [{"link": name, "nodes": nodes, "seed": seed, "epoch": epoch, "train_s": f"{elapsed:.2f}",
                        "top1": top1} for epoch, elapsed, top1 in measuring.training_curve(out)]
            print(f"training, {name} x {nodes} nodes, seed {seed}: {statistics.median(rates):.0f} images/s, "
                  f"top-1 {summary['top1']:.2f}", flush=True)
    data = Path(figures_data)
    measuring.write_csv(data / "scaling_cluster.csv", STAND_IN_FIELDS, stand_in)
    measuring.write_csv(data / "scaling_cluster_training.csv", TRAINING_FIELDS, training)
    measuring.write_csv(data / "scaling_cluster_curves.csv", CURVE_FIELDS, curves)


def stand_in_step(nodes, rate, compute_s, bytes_per_step, steps):
    """The median step of stand_in.py on `nodes` nodes linked at rate (unshaped at one node: no wire)."""
    command = [sys.executable, *links.launcher(nodes, rate, cores=1 if nodes == 1 else None),
               str(ROOT / "scripts" / "figures" / "scaling" / "stand_in.py"),
               "--compute-s", f"{compute_s:.5f}", "--bytes", str(bytes_per_step), "--steps", str(steps)]
    result = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        sys.exit(f"error: the stand-in on {nodes} nodes failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return json.loads(lines[0])["step_s"]
