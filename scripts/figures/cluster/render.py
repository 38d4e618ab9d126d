"""cluster: the virtual cluster's links measured, all-reduce bus bandwidth against the rate they are set to
(scripts/figures/cluster/measure.py).

    reads    figures/data/cluster_bandwidth.csv
    draws    figures/cluster_bandwidth.png
    writes   sections cluster (RESULTS.md), cluster-bandwidth (docs/results/cluster.md)
"""

from scripts.figures.rendering import plt, read_csv, save, table

TOLERANCE = 0.10  # the bound: bus bandwidth within 10 % of the rate, where the CPU is not the limit
BELOW_CEILING = 0.5  # a rate counts as below the CPU's ceiling at most at this share of the unshaped bandwidth


def by_link(rows):
    """{(nodes, rate): {size_bytes: row}}, in the order measured."""
    links = {}
    for r in rows:
        links.setdefault((int(r["nodes"]), r["rate"]), {})[int(r["size_bytes"])] = r
    return links


def ceilings(links):
    """{nodes: unshaped bus bandwidth (bits/s) at the largest size}: the emulation's own limit, the CPU's."""
    return {nodes: float(sizes[max(sizes)]["busbw_bits"]) for (nodes, rate), sizes in links.items() if rate == "none"}


def shaped(links, ceiling):
    """[(nodes, rate, rate bits/s, share of the ceiling, measured / rate at the largest size)] of shaped links."""
    found = []
    for (nodes, rate), sizes in links.items():
        largest = sizes[max(sizes)]
        if rate != "none" and nodes in ceiling:
            bits = float(largest["rate_bits"])
            found.append((nodes, rate, bits, bits / ceiling[nodes], float(largest["busbw_bits"]) / bits))
    return found


# what TCP over Ethernet carries of a link (the veth's MTU, 1,500 bytes): a frame is the MTU and Ethernet's 14-byte
# header; its payload, the MTU less IP's 20 bytes and TCP's 32 (20, and 12 of timestamps); the receiver's ACK, a
# header-only frame of 66 bytes, goes out on its own link for every two frames it receives (delayed ACKs)
MTU, ETHERNET, IP_TCP = 1500, 14, 20 + 32


def payload_shares():
    """(share of a link's rate that carries payload with data alone, with the ACKs a ring node also sends)."""
    frame, payload, ack = MTU + ETHERNET, MTU - IP_TCP, ETHERNET + IP_TCP
    return payload / frame, 2 * payload / (2 * frame + ack)


def mbit(bits):
    return f"{float(bits) / 1e6:,.0f}"


def plot_bandwidth(links, figures):
    counts = sorted({nodes for nodes, _ in links})
    fig, axes = plt.subplots(1, len(counts), figsize=(4 * len(counts), 3.8), sharey=True, squeeze=False)
    for ax, nodes in zip(axes[0], counts):
        for (n, rate), sizes in links.items():
            if n != nodes:
                continue
            points = sorted((size / 2**20, float(r["busbw_bits"]) / 1e6) for size, r in sizes.items() if size > 8)
            line, = ax.plot(*zip(*points), marker="o", label=rate if rate != "none" else "unshaped (the CPU)")
            if rate != "none":
                ax.axhline(float(next(iter(sizes.values()))["rate_bits"]) / 1e6, color=line.get_color(),
                           linestyle=":", linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel="all-reduce size (MB)", title=f"{nodes} nodes")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("bus bandwidth (Mbit/s); dotted: the set rate")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("gloo all-reduce over the virtual cluster's links")
    save(fig, figures / "cluster_bandwidth.png")


def verdict(links):
    """The sentence on the rates below the ceiling, and every shaped link's share, so that it does not hang on
    where the ceiling is drawn."""
    ceiling = ceilings(links)
    found = shaped(links, ceiling)
    below = [f for f in found if f[3] <= BELOW_CEILING]
    held = [f for f in below if abs(f[4] - 1) <= TOLERANCE]
    worst = min(below, key=lambda f: -abs(f[4] - 1)) if below else None
    text = ("The CPU's ceiling, the unshaped links' bus bandwidth: " +
            ", ".join(f"{mbit(bits)} Mbit/s at {nodes} nodes" for nodes, bits in sorted(ceiling.items())) + ". ")
    if below:
        text += (f"Below it (rates at most {BELOW_CEILING:.0%} of the ceiling at that node count), the bus "
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


def bandwidth_table(rows, links):
    sizes = sorted({int(r["size_bytes"]) for r in rows if int(r["size_bytes"]) > 8})
    body = []
    for (nodes, rate), by_size in sorted(links.items(), key=lambda item: (item[0][0], item[0][1] == "none")):
        largest = by_size[max(by_size)]
        share = (f"{float(largest['busbw_bits']) / float(largest['rate_bits']):.0%}" if largest["rate_bits"]
                 else "(ceiling)")
        body.append([nodes, rate if rate != "none" else "unshaped", *(mbit(by_size[s]["busbw_bits"]) if s in by_size
                     else "" for s in sizes), share, f"{float(by_size[8]['seconds']) * 1e3:.2f}" if 8 in by_size
                     else ""])
    r = rows[0]
    return (table(["nodes", "link (each way)", *(f"{s / 2**20:g} MB" for s in sizes), "largest / rate",
                   "8 bytes (ms)"], body) +
            f"\n\nBus bandwidth in Mbit/s (bytes x 2 (n - 1) / n / time, nccl-tests' definition: what each link "
            f"carries in a ring), the median of {r['repeats']} gloo all-reduces of fp32 tensors, one process a "
            f"node; the last column, the median time of an 8-byte all-reduce: the latency with nothing to carry. "
            f"On {r['cpu']} ({r['cores']} cores), torch {r['torch']}.\n\n" + verdict(links)[0])


def render(data, figures, missing):
    if not (data / "cluster_bandwidth.csv").exists():
        missing.append("cluster_bandwidth.csv (scripts/figures/cluster/measure.py)")
        return {}
    rows = read_csv(data / "cluster_bandwidth.csv")
    links = by_link(rows)
    plot_bandwidth(links, figures)
    return {"cluster-bandwidth": bandwidth_table(rows, links), "cluster": headline(data) + "."}


def headline(data):
    if not (data / "cluster_bandwidth.csv").exists():
        return None
    links = by_link(read_csv(data / "cluster_bandwidth.csv"))
    _, held, below = verdict(links)
    ceiling = ceilings(links)
    limits = ", ".join(f"{mbit(bits)} Mbit/s at {nodes} nodes" for nodes, bits in sorted(ceiling.items()))
    return (f"gloo all-reduce bus bandwidth within {TOLERANCE:.0%} of the link's rate for {len(held)} of "
            f"{len(below)} links below the CPU's ceiling ({limits})")
