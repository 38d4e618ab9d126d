"""curves: the learning curves of nd, dp, ddp and apex over seeds (scripts/figures/curves/measure.py).

    reads    figures/data/curves/<recipe>-seed<S>.csv and .json
    draws    figures/curves_top1_train.png, curves_top1_val.png, curves_top5_train.png, curves_top5_val.png
    writes   sections curves
"""

import json
import statistics

from scripts.figures.rendering import beyond_spread, plt, read_csv, save, spread, table, with_range


CURVES = [("top1", "train"), ("top1", "val"), ("top5", "train"), ("top5", "val")]
# the rows' order (others after)
ORDER = {"nd": 0, "dp": 1, "ddp": 2, "apex": 3, "apex-low": 4, "apex-O2": 5, "ddp-vit": 6}


def by_recipe(curve_files):
    """{recipe: {seed: metrics rows}} from curves/<recipe>-seed<S>.csv (or one seed's curves/<recipe>.csv)."""
    curves = {}
    for path in sorted(curve_files):
        recipe, _, seed = path.stem.partition("-seed")
        curves.setdefault(recipe, {})[seed or "0"] = read_csv(path)
    return dict(sorted(curves.items(), key=lambda item: ORDER.get(item[0], 9)))


def per_epoch(runs, split, metric):
    """[(epoch, spread over seeds)] of one recipe."""
    values = {}
    for rows in runs.values():
        for r in rows:
            if r["split"] == split:
                values.setdefault(int(r["epoch"]), []).append(float(r[metric]))
    return sorted((epoch, spread(v)) for epoch, v in values.items())


def plot_curves(curves, figures):
    for metric, split in CURVES:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, (recipe, runs) in enumerate(curves.items()):
            points = per_epoch(runs, split, metric)
            epochs = [e for e, _ in points]
            line, = ax.plot(epochs, [p["mean"] for _, p in points], marker="o", markersize=3,
                            linestyle=("-", "--", ":", "-.")[i % 4],  # curves that coincide stay visible
                            label=f"{recipe} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
            ax.fill_between(epochs, [p["low"] for _, p in points], [p["high"] for _, p in points],
                            color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set(xlabel="epoch", ylabel=f"{metric} accuracy (%)",
               title=f"{metric} accuracy, {split} set (mean; band: min-max over seeds)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, figures / f"curves_{metric}_{split}.png")


def summaries_of(curve_files):
    """{(name, seed): summary.json} beside curves/<name>-seed<S>.csv, where there is one."""
    return {(path.stem.partition("-seed")[0], path.stem.partition("-seed")[2] or "0"):
            json.loads(path.with_suffix(".json").read_text())
            for path in curve_files if path.with_suffix(".json").exists()}


def first_summary(name, summaries):
    return next((s for (n, _), s in summaries.items() if n == name), {})


def first_row(summaries):
    """The summary of the table's first row (in ORDER): its model is the one the other rows are not named by."""
    names = sorted({name for name, _ in summaries}, key=lambda name: ORDER.get(name, 9))
    return first_summary(names[0], summaries) if names else {}


def label(name, summaries):
    """A row's name, with the precision its runs computed in where they record it (apex: "apex O1 bf16"), and its
    model where it is not the first row's (ddp-vit: "ddp vit_tiny")."""
    summary = first_summary(name, summaries)
    if summary.get("arch") and summary["arch"] != first_row(summaries).get("arch"):
        return f"{summary['recipe']} {summary['arch']}"
    if not summary.get("opt_level"):
        return name
    precision = " (fp32)" if summary["opt_level"] == "O0" else f" {summary['precision']}"
    return f"{summary['recipe']} {summary['opt_level']}{precision}"


def precision_sentences(curves, summaries, left_out):
    """What the apex rows computed in, from their summaries: O0 against ddp seed by seed, and a row left out."""
    text = ""
    same = [seed for seed in curves.get("apex", {})
            if summaries.get(("ddp", seed), {}).get("top1", "") == summaries.get(("apex", seed), {}).get("top1")]
    if "apex" in curves and "ddp" in curves and first_summary("apex", summaries).get("opt_level") == "O0":
        text += (f" {label('apex', summaries)} does ddp's arithmetic through the apex recipe's plumbing: with "
                 f"the same seed it ends at ddp's top-1 in {len(same)} of {len(curves['apex'])} seeds.")
    for name, why in left_out.items():
        text += f" No {name} row: {why}."
    return text


def curves_tables(curves, summaries, left_out=None):
    """The final and best validation accuracy of each recipe over its seeds, and what differs beyond the
    spread."""
    rows, finals = [], {}
    for recipe, runs in curves.items():
        final = {metric: spread([float([r for r in rows_of if r["split"] == "val"][-1][metric])
                                 for rows_of in runs.values()]) for metric in ("top1", "top5")}
        best = spread([max(float(r["top1"]) for r in rows_of if r["split"] == "val") for rows_of in runs.values()])
        finals[recipe] = final["top1"]
        runs_summaries = [summaries[recipe, seed] for seed in runs if (recipe, seed) in summaries]
        rate = [s["images_per_s"] for s in runs_summaries if s.get("images_per_s")]
        wall = [s["wall_s"] for s in runs_summaries if s.get("wall_s")]
        epochs = len([r for r in next(iter(runs.values())) if r["split"] == "val"])
        rows.append([label(recipe, summaries), runs_summaries[0]["world_size"] if runs_summaries else "", len(runs),
                     epochs, with_range(final["top1"]), with_range(final["top5"]), with_range(best),
                     f"{statistics.mean(rate):.1f}" if rate else "", f"{statistics.mean(wall):.0f}" if wall else ""])
    text = table(["recipe", "processes", "seeds", "epochs", "final val top-1 (%)", "final val top-5 (%)",
                  "best val top-1 (%)", "train images/s", "wall time (s)"], rows)
    first = first_row(summaries)
    others = sorted({s["arch"] for s in summaries.values() if s.get("arch", first.get("arch")) != first.get("arch")})
    text += (f"\n\n{first.get('arch', '?')}{''.join(f' ({arch} where named)' for arch in others)}, global batch "
             f"{first.get('global_batch', '?')}; top-1 and top-5: mean "
             f"over the seeds, and in brackets the lowest and highest (the min-max range).")
    spreads = [f"{label(recipe, summaries)} {result['high'] - result['low']:.2f}"
               for recipe, result in finals.items() if result["n"] > 1]
    if spreads:
        text += " Seed-to-seed spread of the final top-1 (points): " + ", ".join(spreads) + "."
    text += precision_sentences(curves, summaries, left_out or {})
    finals = {label(name, summaries): result for name, result in finals.items()}
    names = list(finals)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    beyond = [f"{a} and {b} ({finals[a]['mean'] - finals[b]['mean']:+.2f})" for a, b in pairs
              if beyond_spread(finals[a], finals[b])]
    within = [f"{a} and {b} ({finals[a]['mean'] - finals[b]['mean']:+.2f})" for a, b in pairs
              if not beyond_spread(finals[a], finals[b])]
    if beyond:
        text += " Differences beyond the spread (ranges that do not overlap): " + "; ".join(beyond) + "."
    if within and all(finals[name]["n"] > 1 for name in names):
        text += (" Within the spread (ranges that overlap), so not told apart from noise: " + "; ".join(within)
                 + ".")
    return text


def render(data, figures, missing):
    curve_files = sorted((data / "curves").glob("*.csv"))
    if not curve_files:
        missing.append("curves/*.csv (scripts/figures/curves/measure.py)")
        return {}
    curves, summaries = by_recipe(curve_files), summaries_of(curve_files)
    plot_curves(curves, figures)
    left_out = data / "curves" / "left_out.json"
    return {"curves": curves_tables(curves, summaries, json.loads(left_out.read_text()) if left_out.exists() else {})}


def headline(data):
    finals, curve_files = {}, sorted((data / "curves").glob("*.csv"))
    for path in curve_files:
        val = [r for r in read_csv(path) if r["split"] == "val"]
        if val:
            finals.setdefault(path.stem.partition("-seed")[0], []).append(float(val[-1]["top1"]))
    if not finals:
        return None
    summaries = summaries_of(curve_files)
    return "final top-1 over seeds: " + ", ".join(f"{label(name, summaries)} {statistics.mean(finals[name]):.2f}"
                                                   for name in sorted(finals, key=lambda n: ORDER.get(n, 9)))
