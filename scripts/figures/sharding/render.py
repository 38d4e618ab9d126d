"""sharding: bytes per rank and images/s of each --shard mode against processes (scripts/figures/sharding/measure.py).

    reads    figures/data/sharding.csv
    draws    figures/sharding.png
    writes   sections sharding
"""

from scripts.figures.rendering import plt, read_csv, save, table


SHARD_MODES = ["none", "optimizer", "grad-op", "full"]


MIB = 2 ** 20


def sharding_rows(rows):
    """{(shard, processes): row} of sharding.csv, and the process counts measured."""
    by_run = {(r["shard"], int(r["processes"])): r for r in rows}
    return by_run, sorted({n for _, n in by_run})


def sharding_table(rows):
    """RESULTS.md's sharding section: bytes per rank against the ZeRO model, images/s relative to ddp."""
    by_run, counts = sharding_rows(rows)
    body, ratios = [], {}
    for n in counts:
        for shard in SHARD_MODES:
            r = by_run.get((shard, n))
            if r is None:
                continue
            ddp = by_run.get(("none", n))
            relative = f"{float(r['images_per_s']) / float(ddp['images_per_s']):.2f}" if ddp else ""
            ratios.setdefault(shard, []).append(int(r["state_bytes"]) / float(r["model_bytes"]))
            cuda = f" / {int(r['peak_cuda_bytes']) / MIB:.0f}" if r["peak_cuda_bytes"] else ""
            body.append([f"`{shard}` ({r['zero']})", n, *(f"{int(r[name]) / MIB:.1f}" for name in
                         ("param_bytes", "grad_bytes", "optimizer_bytes", "state_bytes")),
                         f"{float(r['model_bytes']) / MIB:.1f}", f"{int(r['peak_rss_bytes']) / MIB:.0f}{cuda}",
                         f"{float(r['images_per_s']):.1f}", relative, f"{float(r['comm_bytes_model']) / MIB:.0f}"])
    first = rows[0]
    measured_over_model = "; ".join(f"`{shard}` {min(v):.2f}-{max(v):.2f}" for shard, v in ratios.items())
    peak = "peak resident (/ peak CUDA) MiB" if any(r["peak_cuda_bytes"] for r in rows) else "peak resident MiB"
    return (table(["--shard", "processes", "weights MiB", "gradients MiB", "optimizer MiB", "sum MiB",
                   "ZeRO model MiB", peak, "train images/s", "relative to ddp", "sent per step MiB (model)"], body) +
            f"\n\n{first['arch']} ({int(first['parameters']) / 1e6:.1f} M parameters) at {first['image_size']} px, "
            f"-b {first['batch']} per process, one epoch, fp32, SGD with momentum; each byte count is the largest "
            f"rank's, measured from its tensors (weights: the most held when a forward ends). The ZeRO model for this set-up, "
            f"with P parameters and N processes: `none` 12 P, `optimizer` 8 P + 4 P / N, `grad-op` 4 P + 8 P / N, "
            f"`full` 12 P / N bytes. Measured sum over the model: {measured_over_model}. Sent per step: what the "
            f"ring algorithms of each mode send per rank, from P and N (not measured). On {first['cores']} cores "
            f"({first['cpu']}); more processes than cores share them.")


def plot_sharding(rows, figures):
    """Bytes per rank against processes per mode, beside the ZeRO model; images/s relative to ddp."""
    by_run, counts = sharding_rows(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, shard in enumerate(SHARD_MODES):
        points = [(n, by_run[shard, n]) for n in counts if (shard, n) in by_run]
        if not points:
            continue
        ns = [n for n, _ in points]
        left.plot(ns, [int(r["state_bytes"]) / MIB for _, r in points], marker="o", color=f"C{i}",
                  label=f"{shard} ({points[0][1]['zero']}), measured")
        left.plot(ns, [float(r["model_bytes"]) / MIB for _, r in points], linestyle=":", color=f"C{i}",
                  label=f"{shard}, ZeRO model")
        relative = [(n, float(r["images_per_s"]) / float(by_run["none", n]["images_per_s"]))
                    for n, r in points if ("none", n) in by_run]
        if relative:
            right.plot(*zip(*relative), marker="o", color=f"C{i}", label=shard)
    left.set(xlabel="processes", ylabel="MiB per rank (weights + gradients + optimizer)", xticks=counts,
             title=f"Bytes per rank, {rows[0]['arch']}")
    right.set(xlabel="processes", ylabel="train images/s relative to ddp", xticks=counts,
              title="Speed of each mode relative to ddp")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, figures / "sharding.png")


def render(data, figures, missing):
    if not (data / "sharding.csv").exists():
        missing.append("sharding.csv (scripts/figures/sharding/measure.py)")
        return {}
    sharding = read_csv(data / "sharding.csv")
    plot_sharding(sharding, figures)
    return {"sharding": sharding_table(sharding)}


def headline(data):
    if not (data / "sharding.csv").exists():
        return None
    rows = read_csv(data / "sharding.csv")
    most = max(int(r["processes"]) for r in rows)
    state = {r["shard"]: float(r["model_bytes"]) for r in rows if int(r["processes"]) == most}
    if not {"full", "none"} <= set(state):
        return None
    return f"FSDP (full) keeps {state['full'] / state['none']:.2f} of DDP's model state per rank on {most} processes"
