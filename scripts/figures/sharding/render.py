"""sharding: bytes per rank and images/s of each --shard mode against processes (scripts/figures/sharding/measure.py).

    reads    figures/data/sharding.csv
    draws    figures/sharding.png
    writes   sections sharding (RESULTS.md: the most processes), sharding-all (every run)
"""

from scripts.figures.rendering import plt, read_csv, save, table


SHARD_MODES = ["none", "optimizer", "grad-op", "full"]


MIB = 2 ** 20


def sharding_rows(rows):
    """{arch: ({(shard, processes): row}, the process counts measured)} of sharding.csv, in the order measured."""
    by_arch = {}
    for r in rows:
        by_arch.setdefault(r["arch"], {})[r["shard"], int(r["processes"])] = r
    return {arch: (by_run, sorted({n for _, n in by_run})) for arch, by_run in by_arch.items()}


def models_line(rows):
    """Each model measured, its parameters and image size: "resnet50 (23.5 M parameters) at 32 px; ..."."""
    firsts = [next(iter(by_run.values())) for by_run, _ in sharding_rows(rows).values()]
    return "; ".join(f"{r['arch']} ({int(r['parameters']) / 1e6:.1f} M parameters) at {r['image_size']} px"
                     for r in firsts)


def sharding_summary(rows):
    """RESULTS.md's sharding section: at the most processes measured, each model's bytes per rank in each mode
    against ddp's, measured and in the ZeRO model, and its speed against ddp's."""
    body = []
    for arch, (by_run, counts) in sharding_rows(rows).items():
        n, ddp = counts[-1], by_run.get(("none", counts[-1]))
        for shard in SHARD_MODES:
            r = by_run.get((shard, n))
            if r is None or ddp is None:
                continue
            body.append([arch, f"`{shard}` ({r['zero']})", n, f"{int(r['state_bytes']) / MIB:.1f}",
                         f"{int(r['state_bytes']) / int(ddp['state_bytes']):.2f}",
                         f"{float(r['model_bytes']) / float(ddp['model_bytes']):.2f}",
                         f"{float(r['images_per_s']) / float(ddp['images_per_s']):.2f}"])
    first = rows[0]
    return (table(["model", "--shard", "processes", "weights + gradients + momentum MiB per rank",
                   "of ddp's, measured", "of ddp's, ZeRO model", "train images/s relative to ddp"], body) +
            f"\n\n{models_line(rows)}" +
            f", -b {first['batch']} per process, one epoch, fp32, SGD with momentum; each byte count is the largest "
            f"rank's, measured from its tensors. On {first['cores']} cores ({first['cpu']}).")


def sharding_table(rows):
    """The long form's table: bytes per rank against the ZeRO model, images/s relative to ddp, every model and
    process count measured."""
    body, ratios = [], {}
    for arch, (by_run, counts) in sharding_rows(rows).items():
        for n in counts:
            for shard in SHARD_MODES:
                r = by_run.get((shard, n))
                if r is None:
                    continue
                ddp = by_run.get(("none", n))
                relative = f"{float(r['images_per_s']) / float(ddp['images_per_s']):.2f}" if ddp else ""
                ratios.setdefault(shard, []).append(int(r["state_bytes"]) / float(r["model_bytes"]))
                cuda = f" / {int(r['peak_cuda_bytes']) / MIB:.0f}" if r["peak_cuda_bytes"] else ""
                body.append([arch, f"`{shard}` ({r['zero']})", n, *(f"{int(r[name]) / MIB:.1f}" for name in
                             ("param_bytes", "grad_bytes", "optimizer_bytes", "state_bytes")),
                             f"{float(r['model_bytes']) / MIB:.1f}", f"{int(r['peak_rss_bytes']) / MIB:.0f}{cuda}",
                             f"{float(r['images_per_s']):.1f}", relative, f"{float(r['comm_bytes_model']) / MIB:.0f}"])
    first = rows[0]
    measured_over_model = "; ".join(f"`{shard}` {min(v):.2f}-{max(v):.2f}" for shard, v in ratios.items())
    peak = "peak resident (/ peak CUDA) MiB" if any(r["peak_cuda_bytes"] for r in rows) else "peak resident MiB"
    return (table(["model", "--shard", "processes", "weights MiB", "gradients MiB", "optimizer MiB", "sum MiB",
                   "ZeRO model MiB", peak, "train images/s", "relative to ddp", "sent per step MiB (model)"], body) +
            f"\n\n{models_line(rows)}, -b {first['batch']} per process, one epoch, fp32, SGD with momentum; each "
            f"byte count is the largest rank's, measured from its tensors (weights: the most held when a forward "
            f"ends). The ZeRO model for this set-up, with P parameters and N processes: `none` 12 P, `optimizer` "
            f"8 P + 4 P / N, `grad-op` 4 P + 8 P / N, `full` 12 P / N bytes. Measured sum over the model: "
            f"{measured_over_model}. Sent per step: what the ring algorithms of each mode send per rank, from P and N "
            f"(not measured). On {first['cores']} cores ({first['cpu']}); more processes than cores share them.")


def plot_sharding(rows, figures):
    """For each model: bytes per rank against processes per mode, beside the ZeRO model; images/s relative to
    ddp."""
    models = sharding_rows(rows)
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4.5 * len(models)), squeeze=False)
    for (arch, (by_run, counts)), (left, right) in zip(models.items(), axes):
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
                 title=f"Bytes per rank, {arch}")
        right.set(xlabel="processes", ylabel="train images/s relative to ddp", xticks=counts,
                  title=f"Speed of each mode relative to ddp, {arch}")
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
    return {"sharding": sharding_summary(sharding), "sharding-all": sharding_table(sharding)}


def headline(data):
    """FSDP's (full) measured bytes per rank against DDP's at the most processes, each model."""
    if not (data / "sharding.csv").exists():
        return None
    found = []
    for arch, (by_run, counts) in sharding_rows(read_csv(data / "sharding.csv")).items():
        full, ddp = by_run.get(("full", counts[-1])), by_run.get(("none", counts[-1]))
        if full and ddp:
            found.append(f"{int(full['state_bytes']) / int(ddp['state_bytes']):.2f} ({arch}, {counts[-1]} processes)")
    if not found:
        return None
    return f"FSDP (full) keeps {' and '.join(found)} of DDP's weights, gradients and momentum per rank, measured"
