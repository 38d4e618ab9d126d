"""Links sized by a principle: an emulated link is given the rate at which communication takes the same share of
a training step here as it takes on a real cluster, for the model trained there.

    ratio(real)   = its all-reduce's seconds / its node's computing seconds
                  = [2 (N - 1) / N x gradient bytes / link rate] / step of one node alone     (N GPUs, a ring)
    rate (here)   = 2 (n - 1) / n x the recipe's bytes a step / [ratio(real) x its step on one node alone]

The real clusters are the seed tutorial's (richardkxu/distributed-pytorch on HAL: ResNet-50 at apex O2, batch 208
a GPU, 4 V100s a node, EDR InfiniBand between nodes) and the same nodes on Ethernet. What each number stands on:
  - one node's step: the seed's 4-GPU run (one whole node, its all-reduce inside the node over NVLink counted as
    computation), the median seconds a step of its published BatchTime_train (figures/data/cluster/, seed.py);
  - the gradient bytes: ResNet-50's, as apex O2 all-reduces them: the convolutions' and the classifier's in fp16,
    BatchNorm's (kept fp32 by O2) in fp32 (apex.parallel.DistributedDataParallel, one all-reduce a dtype after the
    backward: delay_allreduce=True, so no overlap);
  - the link: EDR InfiniBand carries 100 Gbit/s a port (4 lanes of 25); HAL's ports a node are not published, so
    one is assumed; a ring through N GPUs on k nodes crosses each node's port with 2 (N - 1) / N of the bytes.
Here, a node's step alone is the recipe's own, with the same flags and per-node batch, on one process with no one
to talk to (n copies at once, placed on the cores as the cluster places its nodes): its loader, forward, backward,
step and bookkeeping, and for a compression hook its compression work, but no wire.
"""

import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.cluster import run as cluster_run  # noqa: E402  (torch only inside the functions that need it)

SEED_DATA = ROOT / "figures" / "data" / "cluster"  # the seed's published numbers (seed.py), whatever --data says
TRUSTED = 0.5  # the most of the virtual cluster's ceiling (its unshaped bus bandwidth) a link is trusted with
GPUS_PER_NODE = 4  # HAL: 4 V100s a node (NCSA's user guide; the seed's ddp_apex.sb, --gres=gpu:v100:4)
# the real links a node's port may have, each way; the first is the seed tutorial's
REAL_LINKS = [("EDR InfiniBand (HAL)", 100e9), ("10 Gbit/s Ethernet", 10e9), ("1 Gbit/s Ethernet", 1e9)]


def seed_gradient_bytes():
    """ResNet-50's gradient bytes a step under apex O2: BatchNorm's weights in fp32, every other in fp16."""
    import torch
    import torchvision

    with torch.device("meta"):
        model = torchvision.models.resnet50()
    fp32 = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters())
    return 2 * (sum(p.numel() for p in model.parameters()) - fp32) + 4 * fp32


def fp32_gradient_bytes(data, model_flags):
    """What uncompressed DDP all-reduces a step for the recipes' model (-a, --image-size in model_flags) on the
    image folder `data`: its parameters' count x 4."""
    from recipes.common.models import build_model

    arch = model_flags[model_flags.index("-a") + 1]
    size = int(model_flags[model_flags.index("--image-size") + 1])
    classes = sum(1 for folder in (Path(data) / "train").iterdir() if folder.is_dir())
    return 4 * sum(p.numel() for p in build_model(arch, classes, size).parameters())


def seed_node_step():
    """The seed's one-node step (seconds): its 4-GPU run at batch 208, the median of its epochs' BatchTime."""
    with open(SEED_DATA / "seed_throughput.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return float(next(r["step_s"] for r in rows if int(r["gpus"]) == GPUS_PER_NODE and r["batch_per_gpu"] == "208"))


def ring_share(ranks):
    """What a ring all-reduce passes through each rank's link, as a share of the bytes reduced."""
    return 2 * (ranks - 1) / ranks


# what TCP over Ethernet carries of a link (the veth's MTU, 1,500 bytes): a frame is the MTU and Ethernet's 14-byte
# header; its payload, the MTU less IP's 20 bytes and TCP's 32 (20, and 12 of timestamps); the receiver's ACK, a
# header-only frame of 66 bytes, goes out on its own link for every two frames it receives (delayed ACKs)
MTU, ETHERNET, IP_TCP = 1500, 14, 20 + 32


def payload_shares():
    """(share of a link's rate that carries payload with data alone, with the ACKs a ring node also sends)."""
    frame, payload, ack = MTU + ETHERNET, MTU - IP_TCP, ETHERNET + IP_TCP
    return payload / frame, 2 * payload / (2 * frame + ack)


# the compression hooks that gather every rank's bytes instead of all-reducing them (no backend sums fp8:
# recipes/compression/hooks.py's FP8); a gather passes n - 1 times a rank's bytes through each link
GATHERED = ("fp8-e4m3", "fp8-e5m2")


def wire_seconds(nodes, bytes_per_step, rate_bits, gathered=False):
    """The model's seconds on the wire a step: a ring all-reduce (or a gather) of the bytes at the TCP payload
    rate."""
    share = nodes - 1 if gathered else ring_share(nodes)
    return share * bytes_per_step * 8 / (rate_bits * payload_shares()[1])


def real_ratio(link_bits, nodes, gradient_bytes, node_step):
    """Communication over computation for the seed's model on `nodes` real nodes linked at link_bits."""
    return ring_share(GPUS_PER_NODE * nodes) * gradient_bytes * 8 / link_bits / node_step


def paced_by_cpu(floor_s, wire_s):
    """Whether a row measures this machine rather than the link: the all-reduce with the links unshaped (the
    emulation's floor at these bytes) takes more than TRUSTED of the wire's modelled time. Any unit, both alike."""
    return floor_s > TRUSTED * wire_s


def launcher(nodes, rate_bits=None, nproc_per_node=None, cores=None):
    """scripts/cluster/run.py and its flags, for measuring.train's launcher: `nodes` nodes linked at rate_bits
    (rounded to kbit/s; None: unshaped), nproc_per_node and cores where given."""
    return [str(ROOT / "scripts" / "cluster" / "run.py"), "--nodes", str(nodes),
            *(["--nproc-per-node", str(nproc_per_node)] if nproc_per_node is not None else []),
            "--rate", f"{round(rate_bits / 1e3)}kbit" if rate_bits else "none",
            *(["--cores", str(cores)] if cores is not None else [])]


def emulated_rate(ratio, nodes, bytes_per_step, alone_step):
    """The link rate (bits/s) at which n emulated nodes spend `ratio` of their step alone on the wire (at TCP's
    payload share of it, as wire_seconds() counts it)."""
    return ring_share(nodes) * bytes_per_step * 8 / (ratio * alone_step * payload_shares()[1])


def alone_step(recipe, flags, nodes, per_node_batch, runs, threads=None):
    """Seconds a step of the recipe on one node with no one to talk to: `nodes` copies at once, each one process
    (world size 1) at the per-node batch, placed on the cores as scripts/cluster/run.py places nodes, two epochs;
    the median over the copies of batch / the second epoch's training images/s (the first one's holds the start).
    Run directories: runs/alone-<i>; copies that finished before are run again, so that all run at once."""
    from scripts.figures import measuring

    usable = sorted(os.sched_getaffinity(0))
    cores, threads_each = cluster_run.node_cores(nodes, usable), cluster_run.node_threads(nodes, usable, 1)
    launch = measuring.launch_of(recipe, 1, [*flags, "--epochs", "2", "-b", str(per_node_batch)], None, threads)
    outs = [Path(runs) / f"alone-{i}" for i in range(nodes)]
    if not all(measuring.finished_summary(out, launch) is not None for out in outs):
        copies = []
        for out, pinned in zip(outs, cores):
            subprocess.run(["rm", "-rf", str(out)], check=True)
            out.mkdir(parents=True)
            (out / "launch.json").write_text(json.dumps(launch, indent=2) + "\n")
            env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
            env.update(OMP_NUM_THREADS=str(threads_each), PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
            with open(out / "stderr.log", "w") as log:
                copies.append(subprocess.Popen(
                    [sys.executable, str(ROOT / "recipes" / recipe / "train.py"), *launch["flags"], "--out", str(out)],
                    env=env, stdout=subprocess.DEVNULL, stderr=log,
                    preexec_fn=lambda cores=pinned: os.sched_setaffinity(0, cores)))
        failed = [out for copy, out in zip(copies, outs) if copy.wait() != 0]
        if failed:
            sys.exit(f"error: a node alone failed: see {failed[0] / 'stderr.log'}")
    steps = []
    for out in outs:
        train = [r for r in measuring.read_csv(out / "metrics.csv") if r["split"] == "train"]
        steps.append(int(per_node_batch) / float(train[-1]["images_per_s"]))
    return statistics.median(steps)


def seed_images_per_s(gpus, link_bits, gradient_bytes, node_step, batch=208, storage=None):
    """The model of the seed's throughput on `gpus` GPUs: a node's step, then (beyond one node) the ring
    all-reduce on the wire, not overlapped (delay_allreduce); storage: (bytes/s it delivers, bytes an image) caps
    the images/s it can feed."""
    step = node_step + (ring_share(gpus) * gradient_bytes * 8 / link_bits if gpus > GPUS_PER_NODE else 0.0)
    rate = gpus * batch / step
    return min(rate, storage[0] / storage[1]) if storage else rate
