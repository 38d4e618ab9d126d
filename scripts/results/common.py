"""What every part's renderer shares: reading the data, markdown tables, spreads over seeds, saving figures."""

import csv
import statistics

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402,F401  (the parts draw with it)


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


def hardware_line(rows):
    r = rows[0]
    return (f"CPU {r['cpu']} ({r['cores']} cores), GPU {r['gpu'] or 'none: these results are CPU-only'}, "
            f"torch {r['torch']}.")


def mean_of(runs, field):
    return statistics.mean(float(r[field]) for r in runs)


def targets_held(text):
    """(rows whose last cell is yes, rows whose last cell is yes or no) of a targets table."""
    last = [line.rstrip(" |").rsplit("|", 1)[-1].strip().lower() for line in text.splitlines() if line.startswith("|")]
    return last.count("yes"), last.count("yes") + last.count("no")
