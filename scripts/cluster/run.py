"""Run a recipe on a virtual cluster: N nodes on this machine, each a network namespace cabled to one switch
by a link of a given rate (scripts/cluster/network.py), and torchrun on every node against node 0's address,
as on real nodes.

    sudo python scripts/cluster/run.py --nodes 4 --rate 1gbit recipes/ddp/train.py data/mnist5k -a lenet -b 32
    make cluster RECIPE=ddp NODES=4 RATE=1gbit ARGS="data/mnist5k -a lenet -b 32 --epochs 1"

Each node runs `torchrun --nnodes N --node-rank i --nproc-per-node P --master-addr 10.77.0.1` with
GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) set to its interface, so every byte between two nodes crosses
two shaped links. Where the cores suffice, each node gets cores of its own (its processes pinned to them,
OMP_NUM_THREADS = its cores / P); where the nodes outnumber the cores they share them all, one thread a
process, and the line printed at the start says so. When the run ends, fails (a node's torchrun exits with
an error: the other nodes are stopped, as a job scheduler stops a job) or is interrupted (Ctrl-C, SIGTERM),
every namespace, link and process it made is removed; if this launcher itself is killed, its janitor
removes them. Exits with the first failing node's status (0 when every node succeeded).

What it emulates and what it does not: docs/cluster.md."""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.cluster import network

MASTER_PORT = 29500  # every cluster has its own network: the same port never collides
STOP_GRACE_S = 15  # how long stopped nodes get to end before their processes are killed


def node_cores(nodes, cores):
    """The cores each node is pinned to: a share of its own where they suffice, else all of them, shared."""
    if nodes > len(cores):
        return [list(cores)] * nodes
    share = len(cores) // nodes
    return [cores[i * share:(i + 1) * share] for i in range(nodes)]


def node_threads(nodes, cores, nproc_per_node):
    """OMP_NUM_THREADS for each process of a node: its cores over its processes; 1 where nodes share the cores."""
    return 1 if nodes > len(cores) else max(1, len(cores) // nodes // nproc_per_node)


def node_commands(cluster, script_and_args, nproc_per_node, port=MASTER_PORT):
    """torchrun's command on each node, run inside the node's namespace."""
    return [["ip", "netns", "exec", cluster.node(i), sys.executable, "-m", "torch.distributed.run",
             f"--nnodes={cluster.nodes}", f"--node-rank={i}", f"--nproc-per-node={nproc_per_node}",
             f"--master-addr={cluster.address(0)}", f"--master-port={port}", *script_and_args]
            for i in range(cluster.nodes)]


def layout_line(cluster, link, nproc_per_node, cores):
    rate = f"{link.rate} each way" if link.rate else "unshaped (the veth's own speed)"
    delay = f", {link.delay} one-way delay" if link.delay != "0" else ""
    if cluster.nodes > len(cores):
        placement = f"all sharing {len(cores)} core(s)"
    else:
        placement = f"{len(cores) // cluster.nodes} core(s) each"
    return (f"cluster: {cluster.nodes} nodes x {nproc_per_node} process(es) ({cluster.node(0)} ...), node 0 at "
            f"{cluster.address(0)}, links {rate}{delay}, {placement}")


def run(nodes, link, script_and_args, nproc_per_node=1, env=None, output=None, quiet=False, cores=None):
    """script_and_args under torchrun on `nodes` nodes, each linked by `link`; returns the exit status (the first
    failing node's, 128 + the signal's number if interrupted). output: a file object for every node's stdout and
    stderr (default: this process's); cores: how many of this process's cores the cluster uses (default: all).
    The cluster is gone when this returns."""
    cluster, janitor = network.make(nodes, link)
    usable = sorted(os.sched_getaffinity(0))[:cores]
    threads = node_threads(nodes, usable, nproc_per_node)
    if not quiet:
        print(layout_line(cluster, link, nproc_per_node, usable), flush=True)
    stopping = []

    def stop(signum, frame):
        if stopping:  # a second Ctrl-C or SIGTERM: no more grace, every process in the cluster is killed now
            network.remove(cluster)
        stopping.append(signum)

    handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    agents = []
    try:
        for command, pinned in zip(node_commands(cluster, script_and_args, nproc_per_node),
                                   node_cores(nodes, usable)):
            if stopping:  # (interrupted while the nodes start: start no more)
                break
            node_env = dict(os.environ, **(env or {}), GLOO_SOCKET_IFNAME=network.DEVICE,
                            NCCL_SOCKET_IFNAME=network.DEVICE, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
            agents.append(subprocess.Popen(
                command, env=node_env, stdout=output, stderr=subprocess.STDOUT if output else None,
                start_new_session=True,  # a Ctrl-C reaches this launcher, which stops the nodes in order
                preexec_fn=lambda cores=pinned: os.sched_setaffinity(0, cores)))
        status = wait(agents, stopping)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        while any(agent.poll() is None for agent in agents) and time.monotonic() < deadline:
            time.sleep(0.1)
        removed = network.release(cluster, janitor)  # what still runs in the namespaces is killed here
        for agent in agents:
            agent.wait()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if not quiet:
        print(f"cluster: removed {removed} namespaces and every process in them", flush=True)
    return status


def wait(agents, stopping):
    """Until every node's torchrun has ended (status 0), one has failed (its status) or a signal came (128 + it)."""
    while True:
        if stopping:
            return 128 + stopping[0]
        statuses = [agent.poll() for agent in agents]
        failed = [status for status in statuses if status not in (None, 0)]
        if failed:
            return failed[0] if failed[0] > 0 else 128 - failed[0]  # (negative: killed by that signal)
        if all(status == 0 for status in statuses):
            return 0
        time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--nproc-per-node", type=int, default=1, help="processes on each node (default 1)")
    parser.add_argument("--rate", default="1gbit", help="each link's rate each way, as tc writes it (200mbit, "
                                                        "10gbit), or none for the veth's own speed (default 1gbit)")
    parser.add_argument("--delay", default="0", help="one-way delay on each node's way out (50us, 1ms): needs "
                                                     "netem in the kernel (default 0)")
    parser.add_argument("--cores", type=int, help="how many of the machine's cores the cluster uses (default: all "
                                                  "this process may use)")
    parser.add_argument("script", help="the training script, e.g. recipes/ddp/train.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its flags")
    args = parser.parse_args()
    link = network.Link(None if args.rate == "none" else args.rate, args.delay)
    problem = network.require() or link.problem()
    if not problem and (args.nodes < 1 or args.nproc_per_node < 1):
        problem = f"--nodes and --nproc-per-node must be 1 or more, got {args.nodes} and {args.nproc_per_node}"
    if not problem and args.cores is not None and not 1 <= args.cores <= len(os.sched_getaffinity(0)):
        problem = f"--cores must be 1 to {len(os.sched_getaffinity(0))} (the cores this process may use), got " \
                  f"{args.cores}"
    if not problem and not Path(args.script).is_file():
        problem = f"{args.script} is not a file"
    if problem:
        sys.exit(f"error: {problem}")
    try:
        sys.exit(run(args.nodes, link, [args.script, *args.args], args.nproc_per_node, cores=args.cores))
    except RuntimeError as error:  # a step of the network's set-up failed (made namespaces are removed)
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
