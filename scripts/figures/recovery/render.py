"""recovery: what a checkpoint costs and how fast a killed run is back (scripts/figures/recovery/measure.py).

    reads    figures/data/recovery.json, recovery_recipes.csv
    draws    none
    writes   sections recovery, recovery-recipes
"""

import json

from scripts.figures.rendering import read_csv, table


def recovery_table(recovery):
    check = recovery.get("stop_check_us")  # (not in files written before it was measured)
    return table(["model", "processes", "checkpoint (MB)", "seconds per save", "share of a training epoch",
                  "kill to first step after restart (s)", "steps redone", "stop check per step (µs)",
                  "share of a training step"],
                 [[recovery["arch"], recovery["processes"], recovery["checkpoint_mb"], recovery["seconds_per_save"],
                   f"{100 * recovery['save_share_of_epoch']:.2f} %",
                   f"{recovery['kill_to_first_step_s']:.1f}" if recovery.get("kill_to_first_step_s") else "",
                   recovery["steps_redone"], f"{check:.0f}" if check else "",
                   f"{100 * recovery['stop_check_share_of_step']:.2f} %" if check else ""]])


def recovery_recipes_table(rows):
    """Each recipe killed and restarted under torchrun (scripts/figures/recovery/measure.py, recovery_recipes.csv)."""
    def compared(row):
        if row["top1"] == "":
            return "did not finish"
        if row["deterministic"] == "True":
            same = "equal to" if row["as_uninterrupted"] == "True" else "differs from"
            return f"{same} seed 0's {row['reference_top1']}"
        where = ("within" if row["as_uninterrupted"] == "True" else
                 "above" if float(row["top1"]) > float(row["reference_max"]) else "below")
        return f"{where} seeds 0-2's {row['reference_min']}-{row['reference_max']}"
    body = table(["recipe", "processes", "rank killed", "kill to first step after restart (s)",
                  "steps redone (of an epoch)", "final top-1", "against uninterrupted runs"],
                 [[row["row"], row["processes"], row["killed_rank"], row["kill_to_first_step_s"],
                   f"{row['steps_redone']} (of {row['steps_per_epoch']})" if row["steps_redone"] else "",
                   row["top1"], compared(row)] for row in rows])
    first = rows[0]
    unfinished = [row["row"] for row in rows if row["finished"] != "True"]
    late = [row["row"] for row in rows if row["finished"] == "True" and not row["kill_to_first_step_s"]]
    return body + (f"\n\n{len(rows) - len(unfinished)} of {len(rows)} killed runs finished after their restart"
                   f"{': not ' + ', '.join(unfinished) if unfinished else ''}; on {first['cpu']} ({first['cores']} "
                   f"cores), torch {first['torch']}." +
                   (f" Killed only once training had ended, so that the restart had no step to take: "
                    f"{', '.join(late)}." if late else ""))


def render(data, figures, missing):
    sections = {}
    if (data / "recovery.json").exists():
        sections["recovery"] = recovery_table(json.loads((data / "recovery.json").read_text()))
    else:
        missing.append("recovery.json (scripts/figures/recovery/measure.py)")
    if (data / "recovery_recipes.csv").exists():
        sections["recovery-recipes"] = recovery_recipes_table(read_csv(data / "recovery_recipes.csv"))
    else:
        missing.append("recovery_recipes.csv (scripts/figures/recovery/measure.py)")
    return sections


def headline(data):
    if not (data / "recovery_recipes.csv").exists():
        return None
    rows = read_csv(data / "recovery_recipes.csv")
    seconds = [float(r["kill_to_first_step_s"]) for r in rows if r["finished"] == "True" and r["kill_to_first_step_s"]]
    return (f"{len(seconds)} of {len(rows)} killed runs finished, training again {min(seconds):.1f} to "
            f"{max(seconds):.1f} s after the kill" if seconds else f"0 of {len(rows)} killed runs finished")
