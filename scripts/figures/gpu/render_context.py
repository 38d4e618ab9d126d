"""The GPU table's context: what it is read beside (scripts/figures/gpu/render.py renders the table itself).

    reads    figures/data/gpu/table.csv and compression.csv (scripts/figures/gpu/measure.py on a node with 2 GPUs or
             more); scaling.csv (the CPU's); anchors.csv and cluster/seed_throughput.csv (published figures, each with
             its source: not measured here);
             gpu/earlier/ (the sweep the table replaced)
    draws    none
    writes   sections gpu-beyond-one, gpu-earlier, gpu-anchors
"""

from scripts.figures.rendering import read_csv, table
from scripts.figures.compression.render import method_label


def beyond_one_section(gpu_data, data, rows, compression):
    """The scaling and compression rows of a node with more GPUs, or the one line that says none were measured."""
    scaling = [r for r in rows if r["gpus"] != "1"]
    if scaling or compression:
        text = table(["set-up", "GPUs", "images/s", "median step (ms)", "seconds: model / run"],
                     [[r["setup"], r["gpus"], f"{float(r['images_per_s']):.0f}", f"{float(r['step_ms']):.1f}",
                       f"{float(r['model_seconds']):.0f} / {float(r['seconds']):.0f}"] for r in scaling])
        return text + "\n\n" + table(["method", "GPUs", "images/s", "bytes per step", "compression ratio"], [
            [method_label(r), r["gpus"], f"{float(r['images_per_s']):.0f}", f"{float(r['bytes_per_step']):,.0f}",
             f"{float(r['compression_ratio']):.2f}"] for r in compression])
    cpu = read_csv(data / "scaling.csv") if (data / "scaling.csv").exists() else []
    rate = {int(r["processes"]): float(r["images_per_s"]) for r in cpu if r["kind"] == "recipe" and
            r["recipe"] == "ddp" and r["data"] == "synthetic"}
    theirs = {r["source"].split(": ")[-1]: float(r["seconds"]) for r in read_csv(gpu_data / "anchors.csv")
              if r["seconds"]} if (gpu_data / "anchors.csv").exists() else {}
    here = (f"the CPU's: ddp on {max(rate)} processes at {rate[max(rate)] / rate[1]:.2f}x its 1-process images/s "
            f"([Scaling](../../RESULTS.md#scaling))" if len(rate) > 1 and 1 in rate else
            "the CPU's ([Scaling](../../RESULTS.md#scaling))")
    seed = data / "cluster" / "seed_throughput.csv"
    runs = {int(r["gpus"]): float(r["images_per_s"]) / int(r["gpus"]) for r in read_csv(seed)
            if r["batch_per_gpu"] == "208"} if seed.exists() else {}
    tutorial = (f", beside the seed tutorial's own V100 cluster (richardkxu/distributed-pytorch, ResNet-50 at apex "
                f"O2: {runs[min(runs)]:.0f} images/s a GPU on {min(runs)} GPUs, {runs[max(runs)]:.0f} on "
                f"{max(runs)}, [modelled](scaling.md#the-seed-tutorials-cluster))" if runs else "")
    tutorial += (f" and another tutorial's 4 x V100 figure (tczhangzhi/pytorch-distributed: torch.distributed "
                 f"in {theirs['torch.distributed']:.0f} s against nn.DataParallel's {theirs['nn.DataParallel']:.0f} s, "
                 f"{theirs['nn.DataParallel'] / theirs['torch.distributed']:.2f}x, a published figure)"
                 if {"torch.distributed", "nn.DataParallel"} <= set(theirs) else "")
    return (f"The table is measured on one GPU: scaling over GPUs and the compression hooks over NCCL need 2 GPUs "
            f"or more, so neither is measured on GPUs here, nor extrapolated; the scaling measured is "
            f"{here}{tutorial}.{seed_accuracy(data)}")


def seed_accuracy(data):
    """The seed tutorial's top-1 after its 90 epochs (cluster/seed_times.csv, from its RESULTS.md), and the set-up
    here that trains as it did; "" where the file is absent."""
    times = data / "cluster" / "seed_times.csv"
    ended = [r for r in read_csv(times) if r["top1"] and r["epochs"] == "90"] if times.exists() else []
    if not ended:
        return ""
    top1, gpus, batch = [float(r["top1"]) for r in ended], [int(r["gpus"]) for r in ended], ended[0]["batch_per_gpu"]
    return (f" The seed's ResNet-50 runs ended their 90 epochs at a validation top-1 of {min(top1):.2f} to "
            f"{max(top1):.2f} % on {min(gpus)} to {max(gpus)} GPUs, as its RESULTS.md gives them; its apex O2 in fp16 "
            f"at batch {batch} a GPU is `recipes/apex/train.py --opt-level O2 --amp-dtype fp16 -b {batch}` here.")


def earlier_section(gpu_data):
    """The sweep the table replaced (median images/s of its epochs), where its rows were kept."""
    earlier = gpu_data / "earlier"
    if not (earlier / "throughput.csv").exists():
        return ""
    rows = read_csv(earlier / "throughput.csv")
    fp32 = next(float(r["images_per_s"]) for r in rows if r["recipe"] == "ddp")
    said = [f"{r['recipe']} {level(r)}{r['precision']}{' + channels_last' if r['channels_last'] == '1' else ''} "
            f"{float(r['images_per_s']):.0f} "
            f"({float(r['images_per_s']) / fp32:.2f}x)" for r in rows]
    o0 = {r["setup"]: float(r["images_per_s"]) for r in read_csv(earlier / "precision.csv")} if (
        earlier / "precision.csv").exists() else {}
    said += [f"apex O0 + compile {o0['O0 + compile']:.0f} ({o0['O0 + compile'] / o0['O0']:.2f}x O0 in the same "
             f"round)"] if {"O0", "O0 + compile"} <= set(o0) else []
    r = rows[0]
    return (f"Before the table, its sweep measured on {r['gpu']} with torch {r['torch']} ({r['arch']} "
            f"at {r['image_size']} px, batch {r['batch_size']}, --synthetic images; images/s the median of "
            f"its epochs' steady rates, and in brackets the ratio to ddp fp32): {', '.join(said)}.")


def level(row):
    """apex's --opt-level of an earlier sweep's row, as the table names it ('O0 ', 'O1 '; '' for ddp and dp)."""
    return "" if row["recipe"] != "apex" else "O0 " if row["precision"] == "fp32" else "O1 "


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


def earlier_headline(gpu_data):
    """The headline's GPU line before the table is measured: the earlier sweep's fastest, or that nothing is."""
    if not (gpu_data / "earlier" / "throughput.csv").exists():
        return "the GPU table is not measured yet"
    earlier = read_csv(gpu_data / "earlier" / "throughput.csv")
    best, fp32 = max(earlier, key=lambda r: float(r["images_per_s"])), next(r for r in earlier if r["recipe"] == "ddp")
    return (f"{best['recipe']} {level(best)}{best['precision']}"
            f"{' + channels_last' if best['channels_last'] == '1' else ''} at "
            f"{float(best['images_per_s']):.0f} images/s of ResNet-50, "
            f"{float(best['images_per_s']) / float(fp32['images_per_s']):.2f}x ddp fp32 (the sweep before the GPU "
            f"table, which is not measured yet)")


def render(data, figures, missing):
    gpu_data = data / "gpu"
    rows = read_csv(gpu_data / "table.csv") if (gpu_data / "table.csv").exists() else []
    compression = read_csv(gpu_data / "compression.csv") if (gpu_data / "compression.csv").exists() else []
    return {"gpu-beyond-one": beyond_one_section(gpu_data, data, rows, compression),
            "gpu-earlier": earlier_section(gpu_data), "gpu-anchors": anchors_section(gpu_data)}
