"""cluster: the virtual cluster's links measured, all-reduce bus bandwidth against the rate they are set to
(scripts/figures/cluster/measure.py).

    reads    figures/data/cluster_bandwidth.csv
    draws    figures/cluster_bandwidth.png
    writes   sections cluster (RESULTS.md), cluster-bandwidth (docs/results/cluster.md)
"""

from scripts.figures.cluster import links
from scripts.figures.cluster.links import ETHERNET, IP_TCP, MTU, payload_shares
from scripts.figures.rendering import plt, read_csv, save, table

TOLERANCE = 0.10  # the bound: bus bandwidth within 10 % of the rate, where the CPU is not the limit


def by_link(rows):
    """{(nodes, rate): {size_bytes: row}}, in the order measured."""
    measured = {}
    for r in rows:
        measured.setdefault((int(r["nodes"]), r["rate"]), {})[int(r["size_bytes"])] = r
    return measured


def ceilings(measured):
    """{nodes: unshaped bus bandwidth (bits/s) at the largest size}: the emulation's own limit, the CPU's."""
    return {nodes: float(sizes[max(sizes)]["busbw_bits"]) for (nodes, rate), sizes in measured.items()
            if rate == "none"}


def shaped(measured, ceiling):
    """[(nodes, rate, rate bits/s, share of the ceiling, measured / rate at the largest size)] of shaped links."""
    found = []
    for (nodes, rate), sizes in measured.items():
        largest = sizes[max(sizes)]
        if rate != "none" and nodes in ceiling:
            bits = float(largest["rate_bits"])
            found.append((nodes, rate, bits, bits / ceiling[nodes], float(largest["busbw_bits"]) / bits))
    return found


def mbit(bits):
    return f"{float(bits) / 1e6:,.0f}"


def plot_bandwidth(measured, figures):
    counts = sorted({nodes for nodes, _ in measured})
    fig, axes = plt.subplots(1, len(counts), figsize=(4 * len(counts), 3.8), sharey=True, squeeze=False)
    for ax, nodes in zip(axes[0], counts):
        for (n, rate), sizes in measured.items():
            if n != nodes:
                continue
            points = sorted((size / 2**20, float(r["busbw_bits"]) / 1e6) for size, r in sizes.items() if size > 8)
            line, = ax.plot(*zip(*points), marker="o", label=rate if rate != "none" else "unshaped (the CPU)")
            if rate != "none":
                ax.axhline(float(next(iter(sizes.values()))["rate_bits"]) / 1e6, color=line.get_color(),
                           linestyle=":", linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel="all-reduce size (MiB)", title=f"{nodes} nodes")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("bus bandwidth (Mbit/s); dotted: the set rate")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("gloo all-reduce over the virtual cluster's links")
    save(fig, figures / "cluster_bandwidth.png")


def verdict(measured):
    """The sentence on the rates below the ceiling, and every shaped link's share, so that it does not hang on
    where the ceiling is drawn."""
    ceiling = ceilings(measured)
    found = shaped(measured, ceiling)
    below = [f for f in found if f[3] <= links.TRUSTED]
    held = [f for f in below if abs(f[4] - 1) <= TOLERANCE]
    worst = max(below, key=lambda f: abs(f[4] - 1)) if below else None
    text = ("The CPU's ceiling, the unshaped links' bus bandwidth: " +
            ", ".join(f"{mbit(bits)} Mbit/s at {nodes} nodes" for nodes, bits in sorted(ceiling.items())) + ". ")
    if below:
        text += (f"Below it (rates at most {links.TRUSTED:.0%} of the ceiling at that node count), the bus "
                 f"bandwidth at the largest size is within {TOLERANCE:.0%} of the rate in {len(held)} of "
                 f"{len(below)} links (the farthest: {worst[1]} at {worst[0]} nodes, {worst[4]:.0%} of it). ")
    alone, with_acks = payload_shares()
    ratios = [f[4] for f in below]
    if below:
        text += (f"What TCP can carry of a link is less than its rate: {MTU - IP_TCP:,} bytes of payload in a "
                 f"{MTU + ETHERNET:,}-byte frame ({alone:.1%}), {with_acks:.1%} when the ring's ACKs share the "
                 f"link; measured, {min(ratios):.0%} to {max(ratios):.0%}. ")
    text += ("Every shaped link, by its rate's share of the ceiling (measured / rate): " +
             "; ".join(f"{rate} at {nodes} nodes {share:.0%} ({ratio:.0%})"
                       for nodes, rate, _, share, ratio in sorted(found, key=lambda f: f[3])) + ".")
    return text, held, below


def bandwidth_table(rows, measured):
    sizes = sorted({int(r["size_bytes"]) for r in rows if int(r["size_bytes"]) > 8})
    body = []
    for (nodes, rate), by_size in sorted(measured.items(), key=lambda item: (item[0][0], item[0][1] == "none")):
        largest = by_size[max(by_size)]
        share = (f"{float(largest['busbw_bits']) / float(largest['rate_bits']):.0%}" if largest["rate_bits"]
                 else "(ceiling)")
        body.append([nodes, rate if rate != "none" else "unshaped", *(mbit(by_size[s]["busbw_bits"]) if s in by_size
                     else "" for s in sizes), share, f"{float(by_size[8]['seconds']) * 1e3:.2f}" if 8 in by_size
                     else ""])
    r = rows[0]
    return (table(["nodes", "link (each way)", *(f"{s / 2**20:g} MiB" for s in sizes), "largest / rate",
                   "8 bytes (ms)"], body) +
            f"\n\nBus bandwidth in Mbit/s (bytes x 2 (n - 1) / n / time, nccl-tests' definition: what each link "
            f"carries in a ring), the median of {r['repeats']} gloo all-reduces of fp32 tensors, one process a "
            f"node; the last column, the median time of an 8-byte all-reduce: the latency with nothing to carry. "
            f"On {r['cpu']} ({r['cores']} cores), torch {r['torch']}.\n\n" + verdict(measured)[0])


def links_table():
    """The real clusters' share of a step on the wire, from the seed's published step and ResNet-50's bytes."""
    gradient_bytes, node_step = links.seed_gradient_bytes(), links.seed_node_step()
    body = []
    for name, bits in links.REAL_LINKS:
        for nodes in (2, 4, 8, 16):
            gpus = links.GPUS_PER_NODE * nodes
            wire = links.ring_share(gpus) * gradient_bytes * 8 / bits
            body.append([name, f"{nodes} ({gpus} GPUs)", f"{wire * 1e3:.1f}",
                         f"{links.real_ratio(bits, nodes, gradient_bytes, node_step):.1%}"])
    return (f"ResNet-50 under apex O2 all-reduces {gradient_bytes / 1e6:.1f} MB a step (fp16 weights' gradients, "
            f"BatchNorm's in fp32); one HAL node of {links.GPUS_PER_NODE} V100s steps in {node_step:.3f} s (the "
            f"seed's {links.GPUS_PER_NODE}-GPU run, batch 208 a GPU: the median of its epochs' BatchTime_train). "
            f"A ring through N GPUs passes 2 (N - 1) / N of the bytes through each node's port.\n\n" +
            table(["link a node", "nodes", "all-reduce on the wire (ms)", "wire / node's step"], body) +
            "\n\nThe emulated link for a recipe on n nodes then runs at 2 (n - 1) / n x the recipe's bytes a step / "
            "(wire / node's step x the recipe's step on one node alone), so that its wire takes the same share "
            "of its step; each part that measures on the cluster writes the rate it used beside its rows.")


def render(data, figures, missing):
    if not (data / "cluster_bandwidth.csv").exists():
        missing.append("cluster_bandwidth.csv (scripts/figures/cluster/measure.py)")
        return {}
    rows = read_csv(data / "cluster_bandwidth.csv")
    by = by_link(rows)
    plot_bandwidth(by, figures)
    return {"cluster-bandwidth": bandwidth_table(rows, by), "cluster-links": links_table(),
            "cluster": headline(data) + "."}


def headline(data):
    if not (data / "cluster_bandwidth.csv").exists():
        return None
    links = by_link(read_csv(data / "cluster_bandwidth.csv"))
    _, held, below = verdict(links)
    ceiling = ceilings(links)
    limits = ", ".join(f"{mbit(bits)} Mbit/s at {nodes} nodes" for nodes, bits in sorted(ceiling.items()))
    return (f"gloo all-reduce bus bandwidth within {TOLERANCE:.0%} of the link's rate for {len(held)} of "
            f"{len(below)} links below the CPU's ceiling ({limits})")
