"""precision: the apex recipe's images/s at each --opt-level, beside ddp (scripts/figures/precision/measure.py).

    reads    figures/data/precision.csv and precision.json (the GPU form of the table:
             scripts/figures/gpu/render.py, from the GPU table)
    draws    none
    writes   sections precision, precision-memory (the long form's)
"""

import json
import statistics

from scripts.figures.rendering import read_csv, table


def medians(rows):
    """{(set-up, processes): (median, lowest, highest) images/s over the rounds}, in the order they ran."""
    found = {}
    for r in rows:
        found.setdefault((r["setup"], int(r["processes"])), []).append(float(r["images_per_s"]))
    return {key: (statistics.median(v), min(v), max(v)) for key, v in found.items()}


def units(p, info):
    """'1 process', '2 GPUs': what the columns count (one process per GPU on CUDA)."""
    unit = "GPU" if info["hardware"].get("gpu") else "process"
    return f"{p} {unit}{'' if p == 1 else 'es' if unit == 'process' else 's'}"


def ratio(rates, name, base, p):
    return f"{rates[(name, p)][0] / rates[(base, p)][0]:.2f}x" if (base, p) in rates else ""


def precision_table(rows, info):
    rates = medians(rows)
    processes = sorted({p for _, p in rates})
    setups = list(dict.fromkeys(name for name, _ in rates))
    body = []
    for name in setups:
        cells = [name]
        for p in processes:
            if (name, p) not in rates:
                cells += ["", ""]
                continue
            median, low, high = rates[(name, p)]
            cells += [f"{median:.1f} ({low:.1f}–{high:.1f})", ratio(rates, name, "O0", p)]
        body.append(cells)
    header = ["set-up"] + [h for p in processes for h in (f"{units(p, info)}: images/s", "vs O0")]
    rounds = sorted({n for n in (len([r for r in rows if (r["setup"], int(r["processes"])) == key])
                                 for key in rates)})
    rounds = f"{rounds[0]}" if len(rounds) == 1 else f"{rounds[0]} to {rounds[-1]}"
    workers = f", {info['workers']} loader workers per process" if info.get("workers") else ""
    text = (table(header, body) +
            f"\n\n{info['arch']} at {info['image_size']} px, -b {info['batch_size']} per process{workers}, one "
            f"epoch of {info['steps']} steps on --synthetic images, images/s of every step after the first; the "
            f"median of {rounds} round(s) of every set-up taken in turn, in brackets the lowest and highest; "
            f"\"vs O0\": over apex at O0 (fp32) with the same processes. {cpu_sentence(info['hardware'], info)}")
    return (text + "".join(f"\n\nLeft out: {line}." for line in info["left_out"]) + "\n\n" + findings(rates, info) +
            memory_sentence(rows))


def held_mb(row):
    """A run's weights, gradients and optimizer state together, in MB."""
    return float(row["param_mb"]) + float(row["grad_mb"]) + float(row["optimizer_mb"])


def memory_sentence(rows):
    """The memory each level holds at 1 process, in a sentence (the table: the long form's precision-memory)."""
    together = {r["setup"]: held_mb(r) for r in rows if int(r["processes"]) == 1 and r.get("param_mb")}
    said = [f"{name} {together[name]:.1f} MB" for name in ("O0", "O1 bf16", "O2 bf16", "O3 bf16") if name in together]
    return (" Weights, gradients and optimizer state at 1 process: " + ", ".join(said) +
            " (each set-up's: the long form's memory table).") if len(said) > 1 else ""


def memory_table(rows, info):
    """What each set-up holds at 1 process (rank 0, its last round): weights, gradients, the optimizer's state
    with O2's fp32 masters, and the peak; '' for rows measured before the memory was recorded."""
    last = {r["setup"]: r for r in rows if int(r["processes"]) == 1 and r.get("param_mb")}
    if not last:
        return ""
    peak = "peak CUDA memory" if info["hardware"].get("gpu") else "peak resident memory"
    body = [[name, r["param_mb"], r["grad_mb"], r["optimizer_mb"],
             f"{held_mb(r):.2f}", r["peak_mb"]]
            for name, r in last.items()]
    return (table(["set-up, 1 process", "weights (MB)", "gradients (MB)", "optimizer: state and masters (MB)",
                             "together (MB)", f"{peak} (MB)"], body) +
            "\n\nMemory as each run's summary.json gives it (rank 0, at the run's end): O2 halves the weights the "
            "model holds and keeps fp32 copies of them, and of their gradients, for the optimizer; the peak "
            "counts the activations too.")


def cpu_sentence(machine, info):
    if machine.get("gpu"):
        return (f"On {machine['gpu']}, one process per GPU (CPU {machine['cpu']}, {machine['cores']} cores), torch "
                f"{machine['torch']}.")
    flags = machine["cpu_flags"] or "none of them"
    bf16 = ("runs bf16 natively (AVX512-BF16 or AMX-BF16)" if info["native_bf16"] else
            "has no native bf16 (neither AVX512-BF16 nor AMX-BF16), so low precision runs slower than fp32 there")
    return (f"On {machine['cpu']} ({machine['cores']} cores; of the flags that decide low precision's speed "
            f"/proc/cpuinfo lists: {flags}), torch {machine['torch']}: this CPU {bf16}.")


def findings(rates, info):
    """What the table shows, in words: O0's cost over ddp, and what each dtype at O1 and O2 buys, per world
    size."""
    lines = []
    for p in sorted({p for _, p in rates}):
        if ("O0", p) not in rates:
            continue
        o0 = rates[("O0", p)][0]
        said = [f"apex at O0 runs at {ratio(rates, 'O0', 'ddp', p)} ddp's images/s (the recipe's own cost)"
                if ("ddp", p) in rates else "ddp not measured yet"]
        said += [f"{name} at {rates[(name, p)][0] / o0:.2f}x O0" for name in ("O1 bf16", "O1 fp16",
                                                                             "O1 bf16 + channels_last", "O2 bf16",
                                                                             "O2 fp16")
                 if (name, p) in rates]
        best = max((name for name, q in rates if q == p), key=lambda name: rates[(name, p)][0])
        said.append(f"the fastest, {best}, at {rates[(best, p)][0] / o0:.2f}x" +
                    (" (O3 keeps no fp32 weights: apex's speed baseline, which may not converge)"
                     if best.startswith("O3") else ""))
        lines.append(f"At {units(p, info)}: " + "; ".join(said) + ".")
    return " ".join(lines)


def render(data, figures, missing):
    if not (data / "precision.csv").exists():
        missing.append("precision.csv (scripts/figures/precision/measure.py)")
        return {}
    info, rows = json.loads((data / "precision.json").read_text()), read_csv(data / "precision.csv")
    return {"precision": precision_table(rows, info),
            "precision-memory": memory_table(rows, info) or "Not measured yet (precision.csv holds no memory)."}


def headline(data):
    if not (data / "precision.csv").exists():
        return None
    info = json.loads((data / "precision.json").read_text())
    rates = medians(read_csv(data / "precision.csv"))
    if ("O1 bf16", 1) not in rates:
        return f"no native bf16 on this CPU: apex at O0 (fp32) at {rates[('O0', 1)][0] / rates[('ddp', 1)][0]:.2f}x " \
               f"ddp's images/s, low precision left out"
    best = max((name for name, p in rates if p == 1), key=lambda name: rates[(name, 1)][0])
    return (f"mixed precision at 1 process, {info['arch']} {info['image_size']} px: O1 bf16 at "
            f"{rates[('O1 bf16', 1)][0] / rates[('O0', 1)][0]:.2f}x O0's images/s, {best} at "
            f"{rates[(best, 1)][0] / rates[('O0', 1)][0]:.2f}x")
