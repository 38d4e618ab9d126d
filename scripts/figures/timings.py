"""timings: how long each part of make figures took (every measuring script records its part).

    reads    figures/data/timings.csv
    draws    none
    writes   RESULTS.md's timings
"""

from scripts.figures import PARTS
from scripts.figures.rendering import read_csv, table


def timings_table(rows):
    """How long each part of make figures takes, and all of them."""
    by_part = {r["part"]: r for r in rows}
    body = [[f"`make figures ONLY={part}`", f"{float(by_part[part]['seconds']) / 60:.1f}",
             by_part[part]["runs_trained"], by_part[part]["runs_reused"], by_part[part]["date"]]
            for part in PARTS if part in by_part]
    total = sum(float(by_part[part]["seconds"]) for part in PARTS if part in by_part)
    missing = [part for part in PARTS if part not in by_part]
    body.append(["`make figures` (the parts summed)" + (f", without {', '.join(missing)}" if missing else ""),
                 f"{total / 60:.1f}", "", "", ""])
    r = rows[0]
    return (table(["command", "minutes", "runs trained", "runs kept from an earlier start", "measured on"], body) +
            f"\n\nOn CPU {r['cpu']} ({r['cores']} cores). A part resumed after a stop counts its kept runs at the "
            f"time they took when they were trained.")


def render(data, figures, missing):
    return {"timings": timings_table(read_csv(data / "timings.csv"))} if (data / "timings.csv").exists() else {}
