"""compile: epoch times, eager against torch.compile (scripts/figures/compile/measure.py).

    reads    figures/data/compile.csv
    draws    none
    writes   sections compile
"""

import statistics

from scripts.figures.rendering import read_csv, table


COMPILE_MODES = {"eager": "eager (no --compile)", "cold": "--compile, empty Inductor cache",
                 "warm": "--compile, warm Inductor cache"}


def compile_table(rows):
    """Per mode: the first epoch, a steady epoch (median of the others), and what --compile adds or gains."""
    first, steady, rate = {}, {}, {}
    for mode in COMPILE_MODES:
        runs = [r for r in rows if r["mode"] == mode]
        first[mode] = float(runs[0]["epoch_s"])
        steady[mode] = statistics.median(float(r["epoch_s"]) for r in runs[1:])
        rate[mode] = statistics.median(float(r["images_per_s"]) for r in runs[1:])
    startup = {mode: (first[mode] - steady[mode]) - (first["eager"] - steady["eager"]) for mode in COMPILE_MODES}
    body = [[label, f"{first[mode]:.1f}", f"{steady[mode]:.1f}", f"{rate[mode]:.1f}",
             f"{rate[mode] / rate['eager']:.2f}x", f"{startup[mode]:+.1f}" if mode != "eager" else ""]
            for mode, label in COMPILE_MODES.items()]
    r = rows[0]
    return (table(["run", "first epoch (s)", "steady epoch (s)", "steady images/s", "vs eager",
                   "start-up cost (s)"], body) +
            f"\n\nnd recipe, {r['arch']}, one process of {r['threads']} thread(s), {len(rows) // 3} epochs per run. "
            f"Start-up cost: the first epoch's extra time over a steady epoch, minus eager's. --compile costs "
            f"{startup['cold']:.1f} s at start-up with an empty cache ({startup['warm']:.1f} s with a warm one) and "
            f"runs at {rate['cold'] / rate['eager']:.2f}x eager's images/s in steady state.")


def render(data, figures, missing):
    if not (data / "compile.csv").exists():
        missing.append("compile.csv (scripts/figures/compile/measure.py)")
        return {}
    return {"compile": compile_table(read_csv(data / "compile.csv"))}


def headline(data):
    """The table's steady state: each mode's median images/s over the epochs after its first."""
    rows = read_csv(data / "compile.csv") if (data / "compile.csv").exists() else []
    rate = {mode: statistics.median(float(r["images_per_s"]) for r in runs[1:])
            for mode in ("eager", "cold") for runs in [[r for r in rows if r["mode"] == mode]] if len(runs) > 1}
    if len(rate) < 2:
        return None
    return f"torch.compile at {rate['cold'] / rate['eager']:.2f}x eager's images/s in steady state"
