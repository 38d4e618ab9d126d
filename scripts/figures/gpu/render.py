"""gpu: the GPU table (scripts/figures/gpu/measure.py, make gpu-check or make figures-gpu; not a part of make figures).

    reads    figures/data/gpu/table.csv, profiles.json, timings.csv (scripts/figures/gpu/measure.py); preflight.json and
             smoke.json (scripts/gpu/check.py)
    draws    figures/gpu_throughput.png
    writes   sections gpu-hardware, gpu-check, gpu-table, gpu-targets, gpu-precision; and the headline's
             first line (headline())
"""

import json

from scripts.figures.gpu.plan import BARE_STEPS, SYNTHETIC_STEPS, TABLE, TARGETS, setup_name, targets_of
from scripts.figures.rendering import plt, read_csv, save, table
from scripts.figures.gpu.render_context import earlier_headline


def machines(rows):
    """{(gpu, torch): its rows, in the table's order}, in the order they were measured."""
    order = [setup_name(s) for s in TABLE]
    found = {}
    for r in sorted(rows, key=lambda r: (int(r["gpus"]), order.index(r["planned"]) if r["planned"] in order else 0)):
        found.setdefault((r["gpu"], r["torch"]), []).append(r)
    return {key: found[key] for key in dict.fromkeys((r["gpu"], r["torch"]) for r in rows)}


def gpu_table(rows):
    """One GPU and torch's table at 1 GPU, and what is not measured yet."""
    at_one = [r for r in rows if r["gpus"] == "1"]
    fp32 = next((float(r["images_per_s"]) for r in at_one if r["planned"] == setup_name(TABLE[0])), None)
    body = [[r["setup"], "JPEGs" if r["decoder"] else "synthetic", f"{float(r['images_per_s']):.0f}",
             f"{float(r['step_ms']):.1f}", f"{float(r['step_ms_p10']):.1f}–{float(r['step_ms_p90']):.1f}",
             f"{float(r['images_per_s']) / fp32:.2f}x" if fp32 else "", f"{100 * float(r['data_wait_share']):.0f} %",
             f"{float(r['model_seconds']):.0f} / {float(r['seconds']):.0f}"] for r in at_one]
    r = at_one[0]
    left = [setup_name(s) for s in TABLE if setup_name(s) not in {r["planned"] for r in at_one}]
    return (table(["set-up", "data", "images/s", "median step (ms)", "steps, 10th–90th percentile (ms)",
                   "vs ddp fp32", "host waiting for the loader", "seconds: model / run"], body) +
            f"\n\n{r['gpu']} (compute capability {r['capability']}), torch {r['torch']}; CPU {r['cpu']} "
            f"({r['cores']} cores). {r['arch']} at {r['image_size']} px, batch {r['batch_size']}. Images/s: the "
            f"batch over the median step. A recipe trains two epochs (of {SYNTHETIC_STEPS} steps on --synthetic "
            f"images, of the whole folder on the JPEGs) and the second's steps after its first are timed on the GPU; "
            f"the bare loop times {BARE_STEPS['timed']} steps after {BARE_STEPS['warmup']}. The last column: the "
            f"plan's model of the run's seconds (scripts/figures/gpu/plan.py), and the run's own, start-up included."
            + (f" Not measured yet: {'; '.join(left)} (the next `make gpu-check` goes on with them)." if left else ""))


def plot_table(rows, figures):
    """Images/s of each set-up of the last GPU and torch measured, the steps' 10th to 90th percentile as a bar."""
    at_one = [r for r in rows if r["gpus"] == "1"]
    rate = [float(r["images_per_s"]) for r in at_one]
    batch = [int(r["batch_size"]) for r in at_one]
    spread = [[x - b * 1000 / float(r["step_ms_p90"]) for x, b, r in zip(rate, batch, at_one)],
              [b * 1000 / float(r["step_ms_p10"]) - x for x, b, r in zip(rate, batch, at_one)]]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(at_one) + 1.5))
    ax.barh(range(len(at_one)), rate, xerr=spread, color=["gray" if r["kind"] == "bare" else "tab:blue"
                                                          for r in at_one])
    ax.set_yticks(range(len(at_one)), [r["setup"] for r in at_one], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="training images/s (the steps' 10th to 90th percentile as a bar)",
           title=f"{at_one[0]['arch']} at {at_one[0]['image_size']} px on one {at_one[0]['gpu']}")
    ax.grid(axis="x", alpha=0.3)
    save(fig, figures / "gpu_throughput.png")


def targets_section(rows, profiles):
    """Each speed target, met or not, and the profile of each that missed: where its steps' time went."""
    asked = {name: (what, least) for name, what, least in TARGETS}
    body = [[name, asked[name][0], f"at least {asked[name][1]:g}", "" if value is None else
             f"{value:.0f}" if value >= 100 else f"{value:.3f}",
             "not measured yet" if value is None else "yes" if met else "no"]
            for name, value, met, _ in targets_of(rows)]
    text = table(["target", "what", "asks", "measured", "met"], body)
    for p in profiles:
        device = (f"the GPU ran {p['busy_ms']:.1f} ms of each step's {p['step_ms']:.1f} ms and sat idle (waiting "
                  f"for the host or the loader) {p['idle_ms']:.1f} ms ({100 * p['idle_ms'] / p['step_ms']:.0f} %)"
                  if p["busy_ms"] is not None else f"a step took {p['step_ms']:.1f} ms on the CPU")
        top = [[item["name"].replace("|", "\\|"), f"{item['ms']:.2f}", f"{100 * item['share']:.1f} %"]
               for item in p["top"]]
        why = "missed" if p["value"] is None or p["value"] < asked[p["target"]][1] else "was met: a rehearsal"
        text += (f"\n\nProfile of {p['setup']} ({p['steps']} steps in the middle of its last epoch; its {p['target']} "
                 f"target {why}): {device}; the loader kept the host waiting {p['loader_wait_ms']:.2f} ms a step. "
                 f"Where the time went:\n\n" + table(["kernel" if p["busy_ms"] is not None else "operation",
                                                       "ms a step", "of the step"], top))
    return text


def precision_section(rows):
    """The mixed-precision table's GPU form: the recipe's set-ups on --synthetic images at 1 GPU, of the last GPU
    and torch measured."""
    synthetic = [r for r in rows if r["gpus"] == "1" and r["kind"] == "recipe" and not r["decoder"]]
    if not synthetic:
        return ""
    fp32 = next((float(r["images_per_s"]) for r in synthetic if r["planned"] == setup_name(TABLE[0])), None)
    body = [[r["setup"], f"{float(r['images_per_s']):.1f}", f"{float(r['step_ms']):.1f} ({float(r['step_ms_p10']):.1f}"
             f"–{float(r['step_ms_p90']):.1f})", f"{float(r['images_per_s']) / fp32:.2f}x" if fp32 else ""]
            for r in synthetic]
    r = synthetic[0]
    return (table(["set-up", "1 GPU: images/s", "median step, 10th–90th percentile (ms)", "vs ddp fp32"], body) +
            f"\n\n{r['arch']} at {r['image_size']} px, batch {r['batch_size']}, on {r['gpu']} with torch "
            f"{r['torch']}: the [GPU table](gpu.md)'s rows on --synthetic images.")


def gpu_sections(gpu_data, figures):
    """The GPU sections (RESULTS.md, docs/results/gpu.md and precision.md) from gpu/; a line saying so where
    nothing has run."""
    rows = read_csv(gpu_data / "table.csv") if (gpu_data / "table.csv").exists() else []
    profiles = json.loads((gpu_data / "profiles.json").read_text()) if (gpu_data / "profiles.json").exists() else []
    sections = {"gpu-check": gpu_check_section(gpu_data)}
    if not [r for r in rows if r["gpus"] == "1"]:
        missing = ("Not measured yet: the GPU table has not run on a GPU. `make gpu-check` on a machine with CUDA "
                   "measures it (scripts/gpu/README.md).")
        return {**sections, "gpu-hardware": "", "gpu-table": missing, "gpu-targets": "",
                "gpu-precision": "Not measured yet (the GPU table has not run on a GPU)."}
    tables = list(machines([r for r in rows if r["gpus"] == "1"]).values())
    plot_table(tables[-1], figures)
    sections["gpu-table"] = "![GPU table](figures/gpu_throughput.png)\n\n" + "\n\n".join(gpu_table(t) for t in tables)
    sections["gpu-targets"] = "\n\n".join(
        f"On {t[0]['gpu']}, torch {t[0]['torch']}:\n\n" + targets_section(t, [
            p for p in profiles if (p["gpu"], p["torch"]) == (t[0]["gpu"], t[0]["torch"])]) for t in tables)
    sections["gpu-precision"] = precision_section(tables[-1])
    timings = read_csv(gpu_data / "timings.csv") if (gpu_data / "timings.csv").exists() else []
    parts = "; ".join(f"{t['part'].removeprefix('gpu-')} {float(t['seconds']) / 60:.1f} min, {t['runs_trained']} "
                      f"run(s)" for t in timings)
    sections["gpu-hardware"] = ("Measured on " + "; ".join(f"{t[0]['gpu']} with torch {t[0]['torch']}" for t in tables)
                                + (f". The last command of each part: {parts}." if parts else "."))
    return sections


def headline(data):
    """The headline's GPU answer: for each GPU and torch measured, its fastest set-up, images/s and ratio to ddp
    fp32 (measured_on() names the GPU)."""
    gpu_data = data / "gpu"
    lines, measured = [], machines(table_rows(gpu_data))
    for t in measured.values():
        best = max(t, key=lambda r: float(r["images_per_s"]))
        fp32 = next((float(r["images_per_s"]) for r in t if r["planned"] == setup_name(TABLE[0])), None)
        lines.append((f"{t[0]['gpu']}: " if len(measured) > 1 else "") +
                     f"{best['setup']} at {float(best['images_per_s']):.0f} images/s of ResNet-50" +
                     (f", {float(best['images_per_s']) / fp32:.2f}x ddp fp32" if fp32 else ""))
    if lines:
        return "; ".join(lines)
    return earlier_headline(gpu_data)


def measured_on(data):
    """The GPUs (and torch) behind the headline's GPU answer: the table's, else the earlier sweep's."""
    gpu_data = data / "gpu"
    rows = table_rows(gpu_data) or (read_csv(gpu_data / "earlier" / "throughput.csv")
                                    if (gpu_data / "earlier" / "throughput.csv").exists() else [])
    return "; ".join(f"{gpu}, torch {torch}" for gpu, torch in dict.fromkeys((r["gpu"], r["torch"]) for r in rows))


def table_rows(gpu_data):
    """The GPU table's rows at 1 GPU on synthetic data (figures/data/gpu/table.csv), if it is measured."""
    rows = read_csv(gpu_data / "table.csv") if (gpu_data / "table.csv").exists() else []
    return [r for r in rows if r["gpus"] == "1" and r["kind"] == "recipe" and not r["decoder"]]


def gpu_check_section(gpu_data):
    """The one-GPU check's lines (make gpu-check): the node it ran on, then one row per check."""
    if not (gpu_data / "smoke.json").exists() or not (gpu_data / "preflight.json").exists():
        return ("The one-GPU check has not run on a GPU yet: `make gpu-check PY=python3` on a machine with CUDA "
                "runs it (scripts/gpu/README.md).")
    node = json.loads((gpu_data / "preflight.json").read_text())
    smoke = json.loads((gpu_data / "smoke.json").read_text())
    device = ("a CPU standing in for the GPU (a rehearsal)" if smoke.get("stand_in") else
              f"{node['gpu']} (compute capability {node.get('capability')}, driver {node.get('driver')}, CUDA "
              f"{node['cuda']})")
    where = (f"{device}, torch {node['torch']}, torchvision {node['torchvision']}, Python {node['python']}; CPU "
             f"{node['cpu']} ({node['cores']} cores)")
    rows = [[c["check"], "ok" if c["ok"] else "FAILED", f"{c['seconds']:.1f}", "; ".join(filter(None, [
        c["said"].replace("|", "\\|"), c.get("on", node["gpu"]) != node["gpu"] and f"passed on {c['on']}"]))]
        for c in smoke["checks"]]
    why = smoke.get("not_run_why", "the command's limit came first")  # (passes dropped since: what the file says)
    not_run = f"; not run yet ({why}): {', '.join(smoke['not_run'])}" if smoke.get("not_run") else ""
    return (f"`make gpu-check` on {where}: {smoke['summary'].removeprefix('gpu-smoke: ')}{not_run}.\n\n"
            + table(["check", "result", "seconds", "what it said"], rows))


def render(data, figures, missing):
    return gpu_sections(data / "gpu", figures)
