"""What every part's renderer shares: reading the data, markdown tables, spreads over seeds, saving figures."""

import csv
import json
import math
import statistics

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # (the parts draw with it)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def spread(values):
    """Mean and min-max range of one result over seeds."""
    return {"mean": statistics.mean(values), "low": min(values), "high": max(values), "n": len(values)}


def with_range(result, digits=2):
    """'98.53 (98.20-98.90)'; a single seed has no range."""
    if result["n"] == 1:
        return f"{result['mean']:.{digits}f}"
    return f"{result['mean']:.{digits}f} ({result['low']:.{digits}f}\u2013{result['high']:.{digits}f})"


def beyond_spread(a, b):
    """True when two results' ranges over seeds do not overlap: their difference exceeds the spread."""
    return a["n"] > 1 and b["n"] > 1 and (a["low"] > b["high"] or b["low"] > a["high"])


def records_of(data, part, timings=None):
    """What a part's files in the data folder record of the machine they were measured on (timings.csv's row
    where they record nothing): a list of dicts with cpu, cores, gpu and torch."""
    records = [r for path in sorted(data.glob(f"{part}*.csv")) for r in read_csv(path) if r.get("cpu")]
    for path in sorted(data.glob(f"{part}*.json")):
        record = json.loads(path.read_text())
        record = record.get("hardware", record) if isinstance(record, dict) else {}
        records += [record] if record.get("cpu") else []
    if timings is None:
        timings = {r["part"]: r for r in read_csv(data / "timings.csv")} if (data / "timings.csv").exists() else {}
    return records or ([timings[part]] if part in timings else [])


def measured_on(data, part):
    """'AMD EPYC, 2 cores, torch 2.14.1': the machine a part ran on, for the headline's column (with the CPU's
    flags where the part records them: whether it computes bf16 natively)."""
    records = records_of(data, part)
    machines = sorted({f"{r['cpu']}, {r['cores']} cores" + (f" ({r['cpu_flags']})" if r.get("cpu_flags") else "") +
                       (f", {r['gpu']}" if r.get("gpu") else "") for r in records})
    torches = sorted({r["torch"] for r in records if r.get("torch")})
    return "; ".join(machines) + (f", torch {', '.join(torches)}" if torches else "")


def hardware_line(data):
    """Where the CPU parts ran, from what each part's files in the data folder record (timings.csv's row where
    they record nothing): one line, naming each machine's parts where they ran on more than one."""
    from scripts.figures import PARTS

    timings = {r["part"]: r for r in read_csv(data / "timings.csv")} if (data / "timings.csv").exists() else {}
    machines, torches, gpus = {}, set(), set()
    for part in PARTS:
        records = records_of(data, part, timings)
        if records:
            machines[part] = sorted({f"{r['cpu']} ({r['cores']} cores)" for r in records})
            torches |= {r["torch"] for r in records if r.get("torch")}
            gpus |= {r["gpu"] for r in records if r.get("gpu")}
    every = sorted({machine for found in machines.values() for machine in found})
    gpu = ", ".join(sorted(gpus)) or "none: make figures' parts ran CPU-only (the GPU rows name their GPU)"
    if len(every) == 1:
        return f"CPU {every[0]}, GPU {gpu}, torch {', '.join(sorted(torches))}."
    return (f"The parts ran on {len(every)} machines (GPU {gpu}; torch {', '.join(sorted(torches))}), as each part's "
            f"data records it: " + "; ".join(f"{machine}: " + ", ".join(
                part + ("" if len(found) == 1 else " (in part)") for part, found in machines.items()
                if machine in found) for machine in every) + ".")


def mean_of(runs, field):
    return statistics.mean(float(r[field]) for r in runs)


def targets_held(text):
    """(rows whose last cell is yes, rows whose last cell is yes or no) of a targets table."""
    last = [line.rstrip(" |").rsplit("|", 1)[-1].strip().lower() for line in text.splitlines() if line.startswith("|")]
    return last.count("yes"), last.count("yes") + last.count("no")


def fisher(a, n, b, m):
    """Two-sided Fisher's exact test: the chance of a split of the a + b events over samples of n and m as unlikely
    as this one's, or less, were they the same."""
    def chance(x):
        return math.comb(n, x) * math.comb(m, a + b - x) / math.comb(n + m, a + b)
    seen = chance(a)
    return sum(chance(x) for x in range(max(0, a + b - m), min(n, a + b) + 1) if chance(x) <= seen * (1 + 1e-9))
