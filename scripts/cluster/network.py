"""The network of the virtual cluster: N nodes on one Linux machine, each a network namespace whose one
interface (eth0, 10.77.0.<i+1>) is cabled to a switch, a bridge in a namespace of its own. Nothing of the
host's network changes: the cables are made inside the namespaces, the addresses are the cluster's own (two
clusters at once reuse them, unconnected), and the names carry the launching process's id.

Every link is shaped in one place, shape(): a token bucket (tc tbf) at the link's rate on both ends of the
cable, so each node sends and receives at the rate, full duplex, as a NIC does; and, where the kernel has
netem, a one-way delay on the node's side. A janitor process removes every namespace (and every process in
them) when the launching process ends, however it ends: SIGKILL included.

Needs root and iproute2; require() says in one line what is missing."""

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "vcluster"
SUBNET = "10.77.0"  # inside the cluster's namespaces only; node i is SUBNET.(i + 1)
ETC_NETNS = Path("/etc/netns")  # per-namespace files that `ip netns exec` mounts over /etc
DEVICE = "eth0"  # a node's interface (GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME name it)
BUCKET_S = 4e-3  # how long a link's token bucket holds at its rate (shape())
RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class Link:
    """A node's cable to the switch: `rate` each way ("1gbit", or None for the veth's own speed) and the
    one-way `delay` a packet waits on its way out of the node ("0", "50us", "2ms")."""

    rate: str | None = "1gbit"
    delay: str = "0"

    def bits_per_s(self):
        number, unit = RATE.match(self.rate).groups()
        return float(number) * BITS[unit]

    def delay_s(self):
        if self.delay == "0":
            return 0.0
        number, unit = DELAY.match(self.delay).groups()
        return float(number) * SECONDS[unit]

    def problem(self):
        """One line if the link's flags are not tc's, else None."""
        if self.rate is not None and (not RATE.match(self.rate) or self.bits_per_s() <= 0):
            return f"rate {self.rate!r} is not a rate such as 200mbit or 1gbit (or none)"
        if self.delay != "0" and not DELAY.match(self.delay):
            return f"delay {self.delay!r} is not a delay such as 50us or 2ms (or 0)"
        return None


@dataclass(frozen=True)
class Cluster:
    """The names and addresses of one cluster: made by make(), removed by remove()."""

    tag: str  # unique on this machine: the launching process's id
    nodes: int

    @property
    def switch(self):
        return f"{PREFIX}-{self.tag}-switch"

    def node(self, i):
        return f"{PREFIX}-{self.tag}-node{i}"

    def address(self, i):
        return f"{SUBNET}.{i + 1}"

    def namespaces(self):
        return [self.switch, *(self.node(i) for i in range(self.nodes))]


def require():
    """None where this process can build a cluster, else one line saying what is missing."""
    if not sys.platform.startswith("linux"):
        return "the virtual cluster needs Linux (network namespaces)"
    if os.geteuid() != 0:
        return "the virtual cluster needs root (ip netns and tc); run it as root, e.g. with sudo"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"the virtual cluster needs iproute2 ({' and '.join(missing)} not found); e.g. apt install iproute2"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    made = ip("netns", "add", probe, check=False)
    ip("netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"this machine lets no network namespace be made here (ip netns add: {made.stderr.strip()})"
    return None


def ip(*args, namespace=None, check=True):
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")
    return result


def tc(namespace, *args, check=True):
    command = ["ip", "netns", "exec", namespace, "tc", *args]
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} in {namespace}: {result.stderr.strip()}")
    return result


made = itertools.count(1)  # the clusters this process made: each gets a tag of its own (<pid>-<count>)


def make(nodes, link):
    """The cluster's namespaces, bridge, cables, addresses and shaping; the janitor watching over them.
    Returns the Cluster and its janitor: janitor.stdin open while the cluster is in use (release() ends both)."""
    cluster = Cluster(f"{os.getpid()}-{next(made)}", nodes)
    janitor = watch(cluster)  # first: if this process dies half-way, nothing is left either
    try:
        build(cluster, link)
    except BaseException:
        release(cluster, janitor)
        raise
    return cluster, janitor


def release(cluster, janitor):
    """Remove the cluster, then close the janitor's pipe and wait for it (it finds nothing left to remove).
    Returns how many namespaces were removed."""
    removed = remove(cluster)
    janitor.stdin.close()
    janitor.wait()
    return removed


def build(cluster, link):
    for i in range(cluster.nodes):  # `ip netns exec` mounts these over /etc/hosts: a peer's address has a name
        hosts = ETC_NETNS / cluster.node(i) / "hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        names = [f"{address} node{j}\n" for j in range(cluster.nodes)
                 for address in (cluster.address(j), f"::ffff:{cluster.address(j)}")]  # (as c10d's server sees it)
        hosts.write_text("127.0.0.1 localhost\n" + "".join(names))
    ip("netns", "add", cluster.switch)
    ip("link", "add", "switch", "type", "bridge", namespace=cluster.switch)
    ip("link", "set", "switch", "up", namespace=cluster.switch)
    for i in range(cluster.nodes):
        node, port = cluster.node(i), f"port{i}"
        ip("netns", "add", node)
        # the cable: one end is the node's eth0, the other a port of the switch; nothing in the host's namespace
        ip("link", "add", DEVICE, "netns", node, "type", "veth", "peer", "name", port, "netns", cluster.switch)
        ip("link", "set", port, "master", "switch", namespace=cluster.switch)
        ip("link", "set", port, "up", namespace=cluster.switch)
        ip("addr", "add", f"{cluster.address(i)}/24", "dev", DEVICE, namespace=node)
        ip("link", "set", DEVICE, "up", namespace=node)
        ip("link", "set", "lo", "up", namespace=node)
        shape(node, DEVICE, link, delay=True)  # what the node sends
        shape(cluster.switch, port, link, delay=False)  # what it receives


def shape(namespace, device, link, delay):
    """The one place that prices the wire: a token bucket at link.rate on device's way out, and (delay) netem's
    one-way delay before it. The bucket holds 4 ms at the rate, one tick of a 250 Hz kernel (tbf's rule: at least
    rate / HZ; with 1 ms, 8 nodes sharing 2 cores reached 172 of 300 Mbit/s, with 4 ms 287), and at least 64 KiB,
    one segment of the veth's offloads; the queue holds 50 ms (TCP, not the queue, then sets the pace)."""
    parent = ["root"]
    if delay and link.delay != "0":
        if tc(namespace, "qdisc", "add", "dev", device, "root", "handle", "1:", "netem", "delay", link.delay,
              check=False).returncode != 0:
            raise RuntimeError(f"this kernel has no netem (tc qdisc netem, CONFIG_NET_SCH_NETEM), so --delay "
                               f"{link.delay} cannot be emulated; run with --delay 0")
        parent = ["parent", "1:1"]
    if link.rate is None:
        return
    rate_bytes = link.bits_per_s() / 8
    burst = max(64 * 1024, int(rate_bytes * BUCKET_S))
    limit = max(2 * burst, int(rate_bytes * 50e-3))
    tc(namespace, "qdisc", "add", "dev", device, *parent, "handle", "10:", "tbf", "rate", link.rate,
       "burst", str(burst), "limit", str(limit))


def processes_in(namespace):
    result = ip("netns", "pids", namespace, check=False)
    return [int(pid) for pid in result.stdout.split()] if result.returncode == 0 else []


def remove(cluster_or_names):
    """SIGKILL every process in the cluster's namespaces, then delete them (the cables and bridge go with them).
    Takes a Cluster or a list of namespace names; returns how many namespaces it deleted."""
    cluster_names = cluster_or_names.namespaces() if isinstance(cluster_or_names, Cluster) else list(cluster_or_names)
    existing = set(ip("netns", "list").stdout.split())  # "name (id: N)" lines: the names are first
    names = [name for name in cluster_names if name in existing]
    for _ in range(50):  # killed processes leave a namespace when they are reaped: poll, up to 5 s
        pids = [pid for name in names for pid in processes_in(name)]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    for name in names:
        ip("netns", "del", name, check=False)
    for name in cluster_names:
        shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
    return len(names)


def leftovers():
    """Namespaces (and their /etc/netns folders) of clusters whose launching process is gone (a janitor killed
    too, say): removable."""
    names = set(ip("netns", "list").stdout.split())
    names |= {folder.name for folder in ETC_NETNS.glob(f"{PREFIX}-*")} if ETC_NETNS.exists() else set()
    return sorted(name for name in names if (match := re.match(rf"^{PREFIX}-(\d+)-", name))
                  and not os.path.exists(f"/proc/{match.group(1)}"))


def watch(cluster):
    """A janitor: a process of its own session that waits on a pipe from this one and, when the pipe closes
    (this process ended, however), removes the cluster. Returns the janitor (Popen; its stdin is the pipe)."""
    return subprocess.Popen([sys.executable, __file__, "--janitor", *cluster.namespaces()], stdin=subprocess.PIPE,
                            start_new_session=True)


def janitor(names):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle, then this pipe closes
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdin.buffer.read()  # until the launcher ends
    remove(names)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--janitor"]:
        janitor(sys.argv[2:])
    elif sys.argv[1:2] == ["--require"]:  # make cluster asks before it empties runs/cluster
        problem = require()
        sys.exit(f"error: {problem}" if problem else 0)
    elif sys.argv[1:2] == ["--clean"]:  # what an earlier run left, its janitor killed too
        problem = require()
        if problem:
            sys.exit(f"error: {problem}")
        found = leftovers()
        remove(found)
        print(f"removed {len(found)} namespace(s) and /etc/netns folder(s) of clusters whose launcher is gone")
    else:
        sys.exit("usage: python scripts/cluster/network.py --clean | --require   (scripts/cluster/run.py makes "
                 "clusters)")
