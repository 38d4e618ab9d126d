"""scaling: images/s and epoch time against processes, and the bare loop (scripts/figures/scaling/measure.py).

    reads    figures/data/scaling.csv; the seed tutorial's published runs and the virtual cluster's (render_cluster.py)
    draws    figures/scaling_throughput.png, figures/scaling_time.png; render_cluster.py's
    writes   sections scaling, scaling-overhead, hardware; render_cluster.py's
"""

from scripts.figures.rendering import hardware_line, plt, read_csv, save, table
from scripts.figures.scaling import render_cluster


def scaling_points(scaling, recipe, data):
    return sorted((int(r["processes"]), float(r["images_per_s"]), r["epoch_s"]) for r in scaling
                  if r["kind"] == "recipe" and r["recipe"] == recipe and r["data"] == data)


def bare_points(scaling, name):
    return sorted((int(r["processes"]), float(r["images_per_s"])) for r in scaling
                  if r["kind"] == "bare" and r["recipe"] == name)


def plot_scaling(scaling, figures):
    main_recipe = "apex" if any(r["recipe"] == "apex" for r in scaling) else "ddp"
    fig, ax = plt.subplots(figsize=(6, 4))
    for data in ("synthetic", "jpeg"):
        points = scaling_points(scaling, main_recipe, data)
        if points:
            ax.plot([p for p, _, _ in points], [rate for _, rate, _ in points], marker="o",
                    label=f"{main_recipe}, {data} data")
    bare = sorted((int(r["processes"]), float(r["images_per_s"])) for r in scaling
                  if r["kind"] == "bare" and r["recipe"] == main_recipe)
    if bare:
        ax.plot(*zip(*bare), marker="s", linestyle=":", label="bare loop (no loader, no metrics)")
    ceiling = bare_points(scaling, "independent")
    if ceiling:
        single = bare_points(scaling, "nd")[:1] or bare[:1]
        ax.plot(*zip(*(single + ceiling)), marker="^", linestyle="-.",
                label="unconnected bare loops, summed (the machine's ceiling)")
    synthetic = scaling_points(scaling, main_recipe, "synthetic")
    if synthetic:  # the speed-up the table reports is against this line
        first, rate = synthetic[0][0], synthetic[0][1]
        processes = [p for p, _, _ in synthetic]
        ax.plot(processes, [rate * p / first for p in processes], linestyle="--", color="grey",
                label=f"ideal: {main_recipe} synthetic x processes")
    ax.set(xlabel="processes", ylabel="training throughput (images/s)", title="Training throughput")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, figures / "scaling_throughput.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for data in ("synthetic", "jpeg"):
        points = [(p, float(epoch_s)) for p, _, epoch_s in scaling_points(scaling, main_recipe, data)]
        if points:
            ax.plot(*zip(*points), marker="o", label=f"{main_recipe}, {data} data")
    ax.set(xlabel="processes", ylabel="time per epoch (s)", title="Training time per epoch")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, figures / "scaling_time.png")


def scaling_tables(scaling):
    main_recipe = "apex" if any(r["recipe"] == "apex" for r in scaling) else "ddp"
    rows = []
    for data in ("synthetic", "jpeg"):
        points = scaling_points(scaling, main_recipe, data)
        for processes, rate, epoch_s in points:
            speedup = rate / points[0][1]
            rows.append([main_recipe, data, processes, f"{rate:.1f}", f"{float(epoch_s):.1f}", f"{speedup:.2f}x",
                         f"{100 * speedup * points[0][0] / processes:.0f} %"])
    single = bare_points(scaling, "nd")[:1] or bare_points(scaling, main_recipe)[:1]
    for label, points in ((f"bare loop, {main_recipe}", bare_points(scaling, main_recipe)),
                          ("unconnected bare loops", single + bare_points(scaling, "independent"))):
        for processes, rate in points[1:] if label.startswith("unconnected") else points:
            speedup = rate / points[0][1]
            rows.append([label, "memory", processes, f"{rate:.1f}", "", f"{speedup:.2f}x",
                         f"{100 * speedup * points[0][0] / processes:.0f} %"])
    scaling_md = table(["recipe", "data", "processes", "images/s", "epoch (s)", "speed-up",
                        "scaling efficiency"], rows)
    rows = []
    for bare in (r for r in scaling if r["kind"] == "bare" and r["recipe"] != "independent"):
        for run in (r for r in scaling if r["kind"] == "recipe" and r["recipe"] == bare["recipe"]
                    and r["data"] == "synthetic" and r["processes"] == bare["processes"]):
            ratio = float(run["images_per_s"]) / float(bare["images_per_s"])
            rows.append([run["recipe"], run["processes"], run["threads"], f"{float(run['images_per_s']):.1f}",
                         f"{float(bare['images_per_s']):.1f}", f"{100 * ratio:.1f} %"])
    overhead_md = table(["recipe", "processes", "threads each", "recipe images/s (synthetic)",
                         "bare loop images/s", "recipe / bare"], rows)
    first = scaling[0]
    setup = (f"Model {first['arch']} at {first['image_size']} px, batch {first['batch_size']} per process, "
             f"{first['threads']} thread(s) per process.")
    return setup + "\n\n" + scaling_md, overhead_md


def render(data, figures, missing):
    if not (data / "scaling.csv").exists():
        missing.append("scaling.csv (scripts/figures/scaling/measure.py)")
        return {}
    scaling = read_csv(data / "scaling.csv")
    plot_scaling(scaling, figures)
    sections = dict(zip(("scaling", "scaling-overhead"), scaling_tables(scaling)))
    sections["hardware"] = hardware_line(data)
    return {**sections, **render_cluster.render(data, figures)}


def headline(data):
    if not (data / "scaling.csv").exists():
        return None
    rate = {(r["recipe"], int(r["processes"])): float(r["images_per_s"]) for r in read_csv(data / "scaling.csv")
            if r["kind"] == "recipe" and r["data"] == "synthetic"}
    if ("nd", 1) not in rate or not any(recipe == "ddp" for recipe, _ in rate):
        return None
    most = max(n for recipe, n in rate if recipe == "ddp")
    alone = rate.get(("ddp", 1))
    on_a_cluster = render_cluster.headline(data)
    return ((f"{on_a_cluster}; on this machine, " if on_a_cluster else "") + f"ddp on {most} processes: " +
            (f"{rate['ddp', most] / alone:.2f}x its images/s on 1 "
             f"({100 * rate['ddp', most] / alone / most:.0f} % scaling efficiency), " if alone else "") +
            f"{rate['ddp', most] / rate['nd', 1]:.2f}x nd's, on synthetic data")
