"""gpu: the GPU sweep (scripts/bench_gpu.py, make figures-gpu; not a part of make figures).

    reads    figures/data/gpu/throughput.csv, compression.csv, timings.csv; precision.csv and .json
             (scripts/bench_precision.py on CUDA); preflight.json and smoke.json (scripts/gpu_check.py);
             anchors.csv (published figures, each with its source: not measured here)
    draws    figures/gpu_throughput.png, gpu_scaling.png
    writes   RESULTS.md's gpu-hardware, gpu-check, gpu-throughput, gpu-anchors, gpu-compression, gpu-precision
"""

import json

from scripts.results.common import plt, read_csv, save, table
from scripts.results.compression import method_label
from scripts.results.precision import precision_table


PRECISION_LABELS = {"fp32": "fp32", "fp16": "O1 fp16", "bf16": "O1 bf16"}


def gpu_config(row):
    """'apex O1 fp16, channels_last' and the like (', --decoder gpu' when nvjpeg decoded the JPEGs)."""
    decoder = ", --decoder gpu" if row.get("decoder") == "gpu" else ""
    if row["recipe"] != "apex":
        return f"{row['recipe']} fp32{decoder}"
    precision = "O0 fp32" if row["precision"] == "fp32" else PRECISION_LABELS[row["precision"]]
    return f"apex {precision}" + (", channels_last" if row["channels_last"] == "1" else "") + decoder


def gpu_throughput_table(rows):
    rate = {(gpu_config(r), r["data"], int(r["gpus"])): r for r in rows}
    configs = list(dict.fromkeys(gpu_config(r) for r in rows))
    counts = sorted({int(r["gpus"]) for r in rows})
    body = []
    for config in configs:
        for gpus in counts:
            synthetic, jpeg = rate.get((config, "synthetic", gpus)), rate.get((config, "jpeg", gpus))
            if not synthetic and not jpeg:
                continue
            baseline = rate.get(("ddp fp32", "synthetic", gpus))
            first = rate.get((config, "synthetic", counts[0]))
            row = [config, gpus, (synthetic or jpeg)["batch_size"]]
            if synthetic:
                images = float(synthetic["images_per_s"])
                row += [f"{images:.0f}", f"{images / float(baseline['images_per_s']):.2f}x" if baseline else "",
                        f"{100 * images / (float(first['images_per_s']) * gpus / counts[0]):.0f} %" if first else "",
                        f"{100 * float(synthetic['data_wait_share']):.0f} %"]
            else:
                row += ["", "", "", ""]
            row += ([f"{float(jpeg['images_per_s']):.0f}", f"{float(jpeg['whole_epoch_images_per_s']):.0f}",
                     f"{100 * float(jpeg['data_wait_share']):.0f} %"] if jpeg else ["", "", ""])
            body.append(row)
    r = rows[0]
    return (table(["recipe and precision", "GPUs", "batch per GPU", "synthetic images/s", "vs ddp fp32",
                   f"scaling efficiency (vs {counts[0]} GPU)", "synthetic: waiting for data", "JPEG images/s",
                   "JPEG images/s, whole epochs", "JPEG: waiting for data"], body) +
            f"\n\n{r['arch']} at {r['image_size']} px. Images/s: all GPUs together, every step after the first of "
            f"an epoch, the median over the epochs after the first; \"whole epochs\" also counts each epoch's loader "
            f"start-up and first batch.")


def gpu_compression_table(rows):
    rate = {(method_label(r), int(r["gpus"])): float(r["images_per_s"]) for r in rows}
    body = [[method_label(r), r["gpus"], r["batch_size"], f"{float(r['images_per_s']):.0f}",
             f"{float(r['images_per_s']) / rate[('none', int(r['gpus']))]:.2f}x" if ("none", int(r["gpus"])) in rate
             else "", f"{float(r['bytes_per_step']):,.0f}",
             f"{float(r['compression_ratio']):.2f}" if float(r["compression_ratio"]) else ""] for r in rows]
    return table(["method", "GPUs", "batch per GPU", "synthetic images/s", "vs none", "bytes per step",
                  "compression ratio"], body)


def plot_gpu(rows, figures):
    """Images/s per recipe and precision on the fewest GPUs measured, synthetic and JPEG; and against the
    number of GPUs when more than one number was measured."""
    counts = sorted({int(r["gpus"]) for r in rows})
    configs = list(dict.fromkeys(gpu_config(r) for r in rows))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(configs) + 1.5))
    for i, data in enumerate(("synthetic", "jpeg")):
        rate = {gpu_config(r): float(r["images_per_s"]) for r in rows
                if r["data"] == data and int(r["gpus"]) == counts[0]}
        ys = [y + 0.4 * i for y, config in enumerate(configs) if config in rate]
        if ys:
            ax.barh(ys, [rate[c] for c in configs if c in rate], height=0.4, label=f"{data} data")
    ax.set_yticks([y + 0.2 for y in range(len(configs))], configs)
    ax.invert_yaxis()
    ax.set(xlabel="training images/s", title=f"{rows[0]['arch']} at {rows[0]['image_size']} px on {counts[0]} "
           f"x {rows[0]['gpu'].split(' x ', 1)[-1]}")
    ax.grid(axis="x", alpha=0.3)
    ax.legend()
    save(fig, figures / "gpu_throughput.png")
    if len(counts) < 2:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for config in configs:
        points = sorted((int(r["gpus"]), float(r["images_per_s"])) for r in rows
                        if gpu_config(r) == config and r["data"] == "synthetic")
        if len(points) > 1:
            ax.plot(*zip(*points), marker="o", label=config)
    ax.set(xlabel="GPUs", ylabel="training images/s (synthetic)", title="Scaling on GPUs")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, figures / "gpu_scaling.png")


def gpu_check_section(gpu_data):
    """The one-GPU check's lines (make gpu-check): the node it ran on, then one row per check."""
    if not (gpu_data / "smoke.json").exists() or not (gpu_data / "preflight.json").exists():
        return ("The one-GPU check has not run on a GPU yet: `make gpu-check PY=python3` on a machine with CUDA "
                "runs it (docs/gpus.md).")
    node = json.loads((gpu_data / "preflight.json").read_text())
    smoke = json.loads((gpu_data / "smoke.json").read_text())
    device = ("a CPU standing in for the GPU (a rehearsal)" if smoke.get("stand_in") else
              f"{node['gpu']} (compute capability {node.get('capability')}, driver {node.get('driver')}, CUDA "
              f"{node['cuda']})")
    where = (f"{device}, torch {node['torch']}, torchvision {node['torchvision']}, Python {node['python']}; CPU "
             f"{node['cpu']} ({node['cores']} cores)")
    rows = [[c["check"], "ok" if c["ok"] else "FAILED", f"{c['seconds']:.1f}", c["said"].replace("|", "\\|")]
            for c in smoke["checks"]]
    not_run = (f"; not run yet (the command's limit came first): {', '.join(smoke['not_run'])}"
               if smoke.get("not_run") else "")
    return (f"`make gpu-check` on {where}: {smoke['summary'].removeprefix('gpu-smoke: ')}{not_run}.\n\n"
            + table(["check", "result", "seconds", "what it said"], rows))


def anchors_section(gpu_data):
    """Published figures to read the measured ones against, each with its source (anchors.csv)."""
    if not (gpu_data / "anchors.csv").exists():
        return ""
    rows = [[r["source"], r["hardware"], r["gpus"], r["model"], r["data"], r["precision"], r["images_per_s"],
             r["seconds"], f"[source]({r['url']})"] for r in read_csv(gpu_data / "anchors.csv")]
    return table(["published by", "hardware", "GPUs", "model", "data", "precision", "images/s", "seconds",
                  "where"], rows) + (
        "\n\nPublished, not measured here: each row as its source gives it (DeepLearningExamples: training "
        "throughput with its own loader and settings; tczhangzhi/pytorch-distributed: the run time its figure "
        "plots, for a span its page does not state).")


def gpu_sections(gpu_data, figures):
    """The GPU section of RESULTS.md from gpu/*.csv and *.json; a line saying so where nothing has run."""
    sections = {"gpu-check": gpu_check_section(gpu_data), "gpu-throughput": "", "gpu-compression": "",
                "gpu-precision": "", "gpu-anchors": anchors_section(gpu_data)}
    measured = [name for name in ("throughput.csv", "compression.csv", "precision.csv") if (gpu_data / name).exists()]
    if not measured:
        return {**sections, "gpu-hardware": "Not measured yet: the figures-gpu runs have not run on a GPU. `make "
                                            "gpu-check` on a machine with CUDA fills this section, lease by lease "
                                            "(docs/gpus.md)."}
    if (gpu_data / "throughput.csv").exists():
        rows = read_csv(gpu_data / "throughput.csv")
        plot_gpu(rows, figures)
        charts = "![GPU throughput](figures/gpu_throughput.png)\n\n"
        if len({r["gpus"] for r in rows}) > 1:
            charts += "![GPU scaling](figures/gpu_scaling.png)\n\n"
        sections["gpu-throughput"] = charts + gpu_throughput_table(rows)
    if (gpu_data / "compression.csv").exists():
        sections["gpu-compression"] = gpu_compression_table(read_csv(gpu_data / "compression.csv"))
    if (gpu_data / "precision.csv").exists():
        sections["gpu-precision"] = precision_table(read_csv(gpu_data / "precision.csv"),
                                                    json.loads((gpu_data / "precision.json").read_text()))
    r = read_csv(gpu_data / measured[0])[0]
    line = f"GPU {r['gpu']}, CPU {r['cpu']} ({r['cores']} cores), torch {r['torch']}."
    if (gpu_data / "timings.csv").exists():
        timings = [t for t in read_csv(gpu_data / "timings.csv") if t["part"].startswith("gpu")]
        parts = "; ".join(f"{t['part'].removeprefix('gpu-')} {float(t['seconds']) / 60:.1f} min, {t['runs_trained']} "
                          f"run(s) trained and {t['runs_reused']} kept from an earlier start" for t in timings)
        # (under make gpu-check each lease runs what is left: a part's row is its last command, not all of it)
        line += f" The last command of each part: {parts}." if parts else ""
    sections["gpu-hardware"] = line
    return sections


def render(data, figures, missing):
    return gpu_sections(data / "gpu", figures)
