"""scaling on a cluster: DDP on the virtual cluster (scripts/figures/scaling/cluster.py) beside the model of its
step, and beside the seed tutorial's published points (render_seed.py).

    reads    figures/data/scaling_cluster.csv, scaling_cluster_training.csv, scaling_cluster_curves.csv; the seed's
             (render_seed.py)
    draws    figures/scaling_cluster.png; render_seed.py's
    writes   sections scaling-cluster and (render_seed.py) scaling-seed (docs/results/scaling.md); headline()
"""

from scripts.figures.cluster import links
from scripts.figures.compression.render_cluster import times_to
from scripts.figures.rendering import plt, read_csv, save, spread, table, with_range
from scripts.figures.scaling.render_seed import modelled, plot_seed, seed_rows, seed_table


def trusted(row):
    """Whether a stand-in row measures the link: the all-reduce with the wire unpriced (this machine's CPU alone)
    takes at most links.TRUSTED of the wire's modelled time. (One node has no wire: trusted.)"""
    wire = float(row["model_s"]) - float(row["compute_s"])
    return not wire or not links.paced_by_cpu(float(row["unpriced_s"]) - float(row["compute_s"]), wire)


def efficiency(row, column="step_s"):
    return float(row["compute_s"]) / float(row[column])


def efficiency_plot(data, figures, stand_in):
    """Images/s a node over one node's: the seed's published runs (a node: 4 GPUs), the model on each real link,
    and the virtual cluster's stand-in on the links sized after them (hollow where the CPU, not the link, set it)."""
    fig, ax = plt.subplots(figsize=(9.5, 4))
    node = {int(r["gpus"]) // links.GPUS_PER_NODE: float(r["images_per_s"]) for r in seed_rows(data)
            if r["batch_per_gpu"] == "208" and int(r["gpus"]) >= links.GPUS_PER_NODE}
    ax.plot(list(node), [rate / nodes / node[1] for nodes, rate in node.items()], "o", color="black",
            label="the seed's runs on HAL (published)")
    gradient_bytes, node_step = links.seed_gradient_bytes(), links.seed_node_step()
    for (name, bits), color in zip(links.REAL_LINKS, ("black", "tab:blue", "tab:orange")):
        nodes = list(node)
        ax.plot(nodes, [1 / (1 + links.real_ratio(bits, n, gradient_bytes, node_step)) if n > 1 else 1 for n in nodes],
                "-", color=color, alpha=0.6, label=f"model: {name}")
        measured = sorted((int(r["nodes"]), efficiency(r), trusted(r)) for r in stand_in if r["link"] == name)
        if measured:
            ax.plot([m[0] for m in measured], [m[1] for m in measured], "--", color=color)
            for held, fill in ((True, color), (False, "none")):
                points = [m for m in measured if m[2] == held]
                if points:
                    ax.plot([m[0] for m in points], [m[1] for m in points], "s", color=color, markerfacecolor=fill,
                            label=f"virtual cluster, sized as {name.split(' (')[0]}" +
                            ("" if held else " (the CPU's pace)"))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set(xlabel="nodes (the seed's: 4 V100s a node)", ylabel="images/s a node, over one node's", ylim=(0, 1.1),
           xticks=list(node), xticklabels=list(node), title="DDP's scaling on a cluster")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # (beside the axes: the points fill them)
    save(fig, figures / "scaling_cluster.png")


def cluster_section(stand_in, training, curves):
    body = [[r["link"], r["nodes"], f"{float(r['rate_bits']) / 1e6:.1f}" if r["rate_bits"] else "(one node)",
             f"{float(r['ratio']):.1%}", f"{float(r['step_s']) * 1e3:.1f}", f"{float(r['model_s']) * 1e3:.1f}",
             f"{float(r['unpriced_s']) * 1e3:.1f}", f"{efficiency(r):.0%}" + ("" if trusted(r) else " (CPU)"),
             f"{efficiency(r, 'model_s'):.0%}"] for r in stand_in]
    text = table(["link it is sized after", "nodes", "Mbit/s here", "wire / a node's step there", "step (ms)",
                  "model (ms)", "step, wire unpriced (ms)", "efficiency", "model's"], body)
    r = stand_in[0]
    text += (f"\n\nThe stand-in: a node's step alone, {float(r['compute_s']) * 1e3:.1f} ms (the ddp recipe's, lenet "
             f"on the digits, one core, no one to talk to), slept, then the model's {int(r['bytes_per_step']):,} "
             f"bytes of fp32 gradients all-reduced; the median of {r['steps']} steps. Efficiency: a node's step "
             f"alone over the step, images/s a node over one node's. The model: the step alone plus the ring "
             f"all-reduce's bytes over the link's rate. With the wire unpriced (the links unshaped), the step is "
             f"what this machine's CPU takes to all-reduce these bytes among that many nodes: where that takes more "
             f"than {links.TRUSTED:.0%} of the wire's modelled time, the row measures the CPU, not the link, and "
             f"says so (CPU).")
    cpu = [x for x in stand_in if not trusted(x)]
    if cpu:
        text += " Here: " + "; ".join(
            f"{x['link']} at {x['nodes']} nodes, the wire unpriced "
            f"{(float(x['unpriced_s']) - float(x['compute_s'])) * 1e3:.1f} ms against its modelled "
            f"{(float(x['model_s']) - float(x['compute_s'])) * 1e3:.1f} ms" for x in cpu) + "."
    if training:
        target = 97.0
        reached = times_to([dict(c, method="none", error_feedback="0") for c in curves], target)
        rows = []
        for nodes in dict.fromkeys(int(t["nodes"]) for t in training):
            runs = [t for t in training if int(t["nodes"]) == nodes]
            times = [reached.get((runs[0]["link"], nodes, "none", t["seed"])) for t in runs]
            rows.append([nodes, runs[0]["global_batch"],
                         with_range(spread([float(t["images_per_s"]) for t in runs]), 0),
                         with_range(spread(times), 1) if None not in times else
                         f"not reached ({times.count(None)} of {len(times)})",
                         with_range(spread([float(t["top1"]) for t in runs]))])
        t = training[0]
        text += ("\n\n" + table(["nodes", "global batch", "images/s", f"seconds to {target:g} %", "final top-1 (%)"],
                                  rows) +
                 f"\n\nThe ddp recipe itself on links sized after {t['link']}, its computation real: the nodes share "
                 f"the machine's {t['cores']} cores, so beyond {t['cores']} nodes each computes more slowly than alone "
                 f"and the images/s measure the machine as much as the wire. -b "
                 f"{int(t['global_batch']) // int(t['nodes'])} a node, the learning rate scaled to the global batch, "
                 f"{t['epochs']} epochs, {len({x['seed'] for x in training})} seeds: the mean, in brackets the lowest "
                 f"and highest.")
    return text


def render(data, figures):
    sections = {}
    if seed_rows(data):
        plot_seed(data, figures)
        sections["scaling-seed"] = seed_table(data)
    if (data / "scaling_cluster.csv").exists():
        stand_in = read_csv(data / "scaling_cluster.csv")
        training = read_csv(data / "scaling_cluster_training.csv")
        efficiency_plot(data, figures, stand_in)
        sections["scaling-cluster"] = cluster_section(stand_in, training,
                                                      read_csv(data / "scaling_cluster_curves.csv"))
    return sections


def headline(data):
    """The seed's efficiency at its most GPUs, and the virtual cluster's at its most nodes whose row measures the
    link (trusted()) against the model's."""
    if not seed_rows(data) or not (data / "scaling_cluster.csv").exists():
        return None
    points = modelled(data)
    gpus, published, _ = max(points)
    base = next(rate for n, rate, _ in points if n == links.GPUS_PER_NODE)
    said = [f"the seed tutorial's HAL at {gpus} V100s: {published / gpus / (base / links.GPUS_PER_NODE):.0%} of one "
            f"node's images/s a GPU (published)"]
    stand_in, paced = read_csv(data / "scaling_cluster.csv"), []
    for name, _ in links.REAL_LINKS:
        rows = [r for r in stand_in if r["link"] == name and int(r["nodes"]) > 1]
        held = [r for r in rows if trusted(r)]
        if held:
            nodes, measured = ", ".join(r["nodes"] for r in held), ", ".join(f"{efficiency(r):.0%}" for r in held)
            model = ", ".join(f"{efficiency(r, 'model_s'):.0%}" for r in held)
            said.append(f"on the virtual cluster, links sized as {name}, at {nodes} nodes: {measured} efficiency "
                        f"(model {model}; a node's computation stood in for)")
        elif rows:
            paced.append(name)
    if paced:
        said.append(f"links sized as {' and '.join(paced)} are paced by this machine, not the link (the all-reduce "
                    f"unpriced takes more than {links.TRUSTED:.0%} of the wire's time)")
    return "; ".join(said)
