"""SD-PIPE's claim where the wire costs time: the time part's race (PipeDream with stragglers, every sync method,
time to a target) on the virtual cluster (scripts/cluster/), every replica on a node of its own and HetPipe's
servers on one more, over links sized by scripts/figures/cluster/links.py's principle.

    sudo python scripts/figures/pipeline/measure.py --parts cluster     # figures/data/pipeline_cluster*.csv

SD-PIPE's case against HetPipe is the central parameter server's link: every replica pushes and pulls through
it, where partial reduce spreads the bytes over the replicas' own links. On one machine's loopback no link has a
price, so the local time part cannot show it. Here, at R x S = 4 x 1 and 8 x 1 (one stage: a replica is one
process, so a node): nodes = R (+1 for HetPipe's servers, the last S ranks, whole on the last node), one
process a node. The link is the one sized after 1 Gbit/s Ethernet: at lenet's few hundred kB, 10 Gbit/s
Ethernet's sizing is paced by this machine's CPU, not the link (the scaling part's floor, docs/results/
scaling.md), and EDR's is beyond the emulation. Its rate: links.emulated_rate from a replica's step alone
(allreduce's flags, no one to talk to, R copies at once as the nodes are placed on the cores). X, the
straggler's sleep: that step alone / C_OVER_X (SD-PIPE's c / X, with c a minibatch's computation, as its
estimate is), where the local time part sizes it from allreduce's loopback step. T, the seconds between the
scores within an epoch (--snapshot-every): SNAPSHOTS to the epoch a replica takes computing alone (that step alone x
its minibatches of an epoch), where the local part takes allreduce's loopback epoch. Everything else is the local
time part's: lenet on the digits, -b 8 a replica, TIME_EPOCHS epochs, every seed. Runs go to
runs/figures/pipeline/cluster/<R>x<S>/<sync>-seed<S>; pipeline_cluster.csv keeps a run a row,
pipeline_cluster_time.csv each score's seconds of training and top-1 (as pipeline_time.csv). --quick: R x S =
2 x 1, allreduce and hetpipe.
"""

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.cluster import network  # noqa: E402
from scripts.figures import measuring  # noqa: E402
from scripts.figures.cluster import links  # noqa: E402

LAYOUTS = [(1, 4), (1, 8)]  # (stages S, replicas R): SD-PIPE's R = 4 and 8
BATCH = 8  # a replica's -b: the local time part's
LINK = next(link for link in links.REAL_LINKS if link[0].startswith("1 Gbit/s"))
FIELDS = ["sync", "stages", "replicas", "nodes", "seed", "link", "link_bits", "ratio", "rate_bits", "alone_step_s",
          "hetero", "snapshot_every", "epochs", "top1", "updates_per_s", "train_s", "cpu", "cores", "gpu", "torch"]
TIME_FIELDS = ["sync", "hetero", "schedule", "stages", "replicas", "seed", "epoch", "seconds", "top1", "snapshot",
               "cpu", "cores", "gpu", "torch"]  # (as the local time part's pipeline_time.csv)


def measure(args, flags_of, timeline, snapshot_every, syncs, c_over_x):
    """Every run; flags_of, timeline, snapshot_every: measure.py's (the local time part's flags, a run's scores
    and T from an epoch's seconds)."""
    problem = network.require()
    if problem:
        print(f"the pipeline on the cluster: not measured ({problem}); the pipeline_cluster CSVs kept as they are",
              file=sys.stderr)
        return
    runs, machine = Path(args.runs) / "cluster", measuring.hardware()
    gradient_bytes, node_step = links.seed_gradient_bytes(), links.seed_node_step()
    bytes_per_step = links.fp32_gradient_bytes(args.data, measuring.ACCURACY)  # what allreduce all-reduces
    name, link_bits = LINK
    images = sum(1 for path in (Path(args.data) / "train").rglob("*") if path.is_file())
    rows, times = [], []
    for stages, replicas in [(1, 2)] if args.quick else LAYOUTS:
        _, alone_flags = flags_of("time", "allreduce", 0.0, stages, 1, "pipedream", 1, 0, args)
        alone = links.alone_step("pipeline", alone_flags, replicas, BATCH, runs / f"alone-{replicas}x{stages}")
        ratio = links.real_ratio(link_bits, replicas, gradient_bytes, node_step)
        rate = links.emulated_rate(ratio, replicas, bytes_per_step, alone)
        hetero = round(alone / c_over_x, 4)
        every = snapshot_every(alone * math.ceil(images / replicas / BATCH))  # (a replica's epoch alone)
        for seed in args.seeds:
            for sync in ["allreduce", "hetpipe"] if args.quick else syncs:
                processes, flags = flags_of("time", sync, hetero, stages, replicas, "pipedream", 1, seed, args,
                                           every)
                nodes = processes // stages
                launcher = links.launcher(nodes, rate, nproc_per_node=stages)
                out = runs / f"{replicas}x{stages}" / f"{sync}-seed{seed}"
                summary = measuring.train("pipeline", 1, flags, out, 1, launcher=launcher)
                train_s = measuring.train_seconds(out)
                updates = sum(summary["updates_per_replica"])
                rows.append({"sync": sync, "stages": stages, "replicas": replicas, "nodes": nodes, "seed": seed,
                             "link": name, "link_bits": link_bits, "ratio": f"{ratio:.4f}", "rate_bits": round(rate),
                             "alone_step_s": f"{alone:.5f}", "hetero": hetero, "snapshot_every": every,
                             "epochs": summary["epochs"], "top1": round(summary["top1"], 2),
                             "updates_per_s": round(updates / train_s, 2), "train_s": round(train_s, 2), **machine})
                times += [{"sync": sync, "hetero": hetero, "schedule": "pipedream", "stages": stages,
                           "replicas": replicas, "seed": seed, "epoch": epoch, "seconds": seconds, "top1": top1,
                           "snapshot": snapshot, **machine} for epoch, seconds, top1, snapshot in timeline(out)]
                print(f"{name} ({rate / 1e6:.1f} Mbit/s here), {replicas} x {stages}, {sync}, seed {seed}: top-1 "
                      f"{summary['top1']:.2f} %, {updates / train_s:.1f} updates/s, X {hetero:g} s", flush=True)
    data = Path(args.figures_data)
    measuring.write_csv(data / "pipeline_cluster.csv", FIELDS, rows)
    measuring.write_csv(data / "pipeline_cluster_time.csv", TIME_FIELDS, times)
    print(f"wrote {data / 'pipeline_cluster.csv'} ({len(rows)} runs)")
