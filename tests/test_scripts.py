"""scripts/: the data sets it writes, the benchmarks, and the figures and tables drawn from their data."""

import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, child_env
from PIL import Image

sys.path.insert(0, str(ROOT))
from scripts import (bench_compile, bench_gpu, bench_io, bench_scaling, bench_sharding, byzfl_reference,  # noqa: E402
                     compression_table, list_tests, measuring, mutations, pipeline_table, ps_table)


def test_digits_folder(tmp_path):
    out = tmp_path / "mnist5k"
    subprocess.run([sys.executable, ROOT / "scripts/make_demo_data.py", "--out", out], check=True,
                   capture_output=True)
    for split, per_class in (("train", 400), ("val", 100)):
        folders = sorted(p.name for p in (out / split).iterdir())
        assert folders == [str(d) for d in range(10)]
        assert all(len(list((out / split / d).glob("*.png"))) == per_class for d in folders)
    train = {p.name for p in out.glob("train/*/*.png")}
    assert not train & {p.name for p in out.glob("val/*/*.png")}  # no digit in both splits
    image = Image.open(next(out.glob("val/7/*.png")))
    assert image.size == (28, 28) and image.mode == "L"


def test_imagenet_like_folder(tmp_path):
    out = tmp_path / "imagenet-like"
    subprocess.run([sys.executable, ROOT / "scripts/make_demo_data.py", "--imagenet-like", out,
                    "--classes", "3", "--images", "5"], check=True, capture_output=True)
    for split, n in (("train", 4), ("val", 1)):
        assert sorted(p.name for p in (out / split).iterdir()) == ["class0000", "class0001", "class0002"]
        jpegs = list((out / split).glob("*/*.jpg"))
        assert len(jpegs) == 3 * n
        for path in jpegs:
            with Image.open(path) as image:
                assert image.format == "JPEG" and all(256 <= side <= 500 for side in image.size)


def test_bench_recovery_measures_a_save_and_a_restart(tiny_data, tmp_path):
    out = tmp_path / "recovery.json"
    command = [sys.executable, "scripts/bench_recovery.py", "--quick", str(tiny_data), "--json", str(out), "--runs",
               str(tmp_path / "runs"), "--cases", "fsdp-full-sharded-checkpoint", "ps-async-a-worker-killed"]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(out.read_text())
    assert measured["finished"] and measured["arch"] == "lenet"
    assert 0 < measured["seconds_per_save"] < measured["train_epoch_s"]
    assert 0 < measured["stop_check_us"] and 0 < measured["stop_check_share_of_step"] < 1
    assert measured["kill_to_first_step_s"] > 0 and measured["checkpoint_mb"] > 0
    rows = {row["row"]: row for row in measuring.read_csv(tmp_path / "recovery_recipes.csv")}
    fsdp, ps = rows["fsdp full sharded checkpoint"], rows["ps async, a worker killed"]
    assert fsdp["deterministic"] == "True" and fsdp["as_uninterrupted"] == "True"  # equal to seed 0's top-1
    assert fsdp["top1"] == fsdp["reference_top1"] and ps["deterministic"] == "False"
    for row in (fsdp, ps):  # (a worker counts its pushes; rank 0, an async server, every worker's)
        assert row["finished"] == "True" and float(row["kill_to_first_step_s"]) > 0
        assert 0 <= int(row["steps_redone"]) <= 2 * int(row["steps_per_epoch"])
    from scripts.results.recovery import recovery_recipes_table  # the script's own output, in RESULTS.md's table

    text = recovery_recipes_table(list(rows.values()))
    assert f"| fsdp full sharded checkpoint | 2 | 1 | {fsdp['kill_to_first_step_s']} |" in text
    assert f"equal to seed 0's {fsdp['top1']}" in text and "2 of 2 killed runs finished" in text


def write_figures_data(data):
    """Measured-data files as the benchmark scripts write them, with round numbers to check the tables by."""
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    (data / "curves").mkdir(parents=True)
    for recipe, world_size, offset in (("nd", 1, 0), ("ddp", 2, 0.5), ("apex", 2, 5)):
        for seed in (0, 1, 2):  # final val top-1: nd 60, 61, 62; ddp 60.5, 61.5, 62.5; apex 65, 66, 67
            rows = ["epoch,split,loss,top1,top5,images_per_s,data_s,epoch_s,lr"]
            rows += [f"{e},{split},1.0,{40 + 10 * e + seed + offset},{80 + 5 * e},100,0.1,2.0,0.05" for e in (1, 2)
                     for split in ("train", "val")]
            (data / "curves" / f"{recipe}-seed{seed}.csv").write_text("\n".join(rows) + "\n")
            (data / "curves" / f"{recipe}-seed{seed}.json").write_text(json.dumps(
                {"world_size": world_size, "images_per_s": 120 + seed, "wall_s": 55.0 + seed, "arch": "lenet",
                 "global_batch": 64}))
    header = "kind,recipe,data,processes,threads,arch,image_size,batch_size,images_per_s,epoch_s,cpu,cores,gpu,torch"
    assert header.split(",") == bench_scaling.FIELDS  # (each header here is the script's own, checked)
    rows = [("recipe", "nd", "synthetic", 1, 97, 10), ("recipe", "ddp", "synthetic", 1, 100, 10),
            ("recipe", "ddp", "jpeg", 1, 50, 2), ("recipe", "ddp", "synthetic", 2, 180, 6),
            ("recipe", "ddp", "jpeg", 2, 80, 1.5), ("bare", "nd", "memory", 1, 100, ""),
            ("bare", "ddp", "memory", 1, 100, ""), ("bare", "ddp", "memory", 2, 200, ""),
            ("bare", "independent", "memory", 2, 150, "")]
    (data / "scaling.csv").write_text("\n".join([header] + [
        f"{k},{r},{d},{p},1,resnet18,32,32,{rate},{epoch_s},{','.join(map(str, machine.values()))}"
        for k, r, d, p, rate, epoch_s in rows]) + "\n")
    header = ("decoder,batches,workers,batch_size,image_size,images,seconds,images_per_s,mb_per_s,"
              "images_per_s_per_worker,cpu,cores,gpu,torch")
    assert header.split(",") == bench_io.FIELDS
    rows = [("pil", "uint8", 0, 100), ("pil", "uint8", 2, 200), ("tensor", "uint8", 0, 150),
            ("tensor", "uint8", 2, 300), ("tensor", "float32", 0, 125), ("tensor", "float32", 2, 240)]
    (data / "io.csv").write_text("\n".join([header] + [
        f"{d},{b},{w},32,224,320,1,{rate},{rate / 10},{rate / max(w, 1)},{','.join(map(str, machine.values()))}"
        for d, b, w, rate in rows]) + "\n")
    (data / "io_loader.json").write_text(json.dumps(
        {"batch_size": 32, "image_size": 224, "normalise_ms_per_batch": 12.5, "uint8_batch_bytes": 4816896,
         "float32_batch_bytes": 19267584, "first_batch_workers": 2, "first_batch_s_fresh_workers": 0.9,
         "first_batch_s_persistent_workers": 0.2}))
    (data / "examples.json").write_text(json.dumps(
        {"flags": "-a resnet18 -b 32 -j 2 --epochs 1 -p 1000", "images": 800, "repeats": 3,
         "recipe": {"wall_s": 37.0, "cpu_s": 70.0, "left_running": 0},
         "examples": {"wall_s": 40.0, "cpu_s": 75.0, "left_running": 0}, "wall_ratio": 0.925, "cpu_ratio": 0.9333,
         **machine}))
    (data / "recovery.json").write_text(json.dumps(
        {"arch": "resnet18", "processes": 2, "checkpoint_mb": 89.5, "seconds_per_save": 0.3,
         "save_share_of_epoch": 0.01, "kill_to_first_step_s": 14.0, "steps_redone": 20, "stop_check_us": 150.0,
         "stop_check_share_of_step": 0.0015}))
    header = ("method,error_feedback,processes,seed,threads,arch,epochs,global_batch,train_s,wall_s,top1,top5,"
              "bytes_per_step,compression_ratio,cpu,cores,gpu,torch")
    assert header.split(",") == compression_table.FIELDS
    rows = [("serial", 0, 1, 60, (95.0, 95.5, 96.0), "", ""), ("none", 0, 2, 40, (94.5, 94.0, 95.0), 4000, 1.0),
            ("fp8-e4m3", 0, 2, 45, (93.25, 93.0, 93.5), 1004, 3.984),  # below none's range: beyond the spread
            ("fp8-e4m3", 1, 2, 46, (94.0, 94.75, 94.25), 1004, 3.984)]  # inside it
    (data / "compression.csv").write_text("\n".join([header] + [
        f"{m},{ef},{p},{seed},1,lenet,15,64,{t + seed},{t + 5},{top1[seed]},99,{b},{r},"
        f"{','.join(map(str, machine.values()))}" for seed in (0, 1, 2) for m, ef, p, t, top1, b, r in rows]) + "\n")
    assert "part,seconds,runs_trained,runs_reused,date,cpu,cores,gpu,torch".split(",") == measuring.TIMING_FIELDS
    (data / "timings.csv").write_text("part,seconds,runs_trained,runs_reused,date,cpu,cores,gpu,torch\n" + "".join(
        f"{part},{seconds},{trained},0,2026-11-24,{','.join(map(str, machine.values()))}\n"
        for part, seconds, trained in (("io", 60, 0), ("curves", 600, 9), ("compression", 3000, 57))))
    rows = [("eager", (12, 10, 10), 100), ("cold", (70, 5, 5), 200), ("warm", (20, 5, 5), 200)]
    assert "mode,epoch,epoch_s,images_per_s,arch,threads,cpu,cores,gpu,torch".split(",") == bench_compile.FIELDS
    (data / "compile.csv").write_text("\n".join(["mode,epoch,epoch_s,images_per_s,arch,threads,cpu,cores,gpu,torch"] + [
        f"{mode},{e + 1},{t},{rate},resnet18,2,{','.join(map(str, machine.values()))}"
        for mode, times, rate in rows for e, t in enumerate(times)]) + "\n")


def plot_results(data, figures, results, pngs):
    """Run plot_results.py on data; check that it drew the figures named; return RESULTS.md's text."""
    command = [sys.executable, "scripts/plot_results.py", "--data", data, "--figures", figures, "--results", results]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in pngs:
        with Image.open(Path(figures) / f"{name}.png") as image:
            assert image.format == "PNG" and image.size[0] > 300
    return Path(results).read_text()


def test_the_committed_data_redraws_results_md_and_every_figure_as_committed(tmp_path):
    """RESULTS.md byte for byte and each figure pixel for pixel, from figures/data/ alone."""
    import matplotlib.image

    results = tmp_path / "RESULTS.md"
    shutil.copy(ROOT / "RESULTS.md", results)
    subprocess.run([sys.executable, "scripts/plot_results.py", "--figures", tmp_path, "--results", results], cwd=ROOT,
                   check=True, capture_output=True)
    assert results.read_bytes() == (ROOT / "RESULTS.md").read_bytes()
    drawn = sorted(tmp_path.glob("*.png"))
    assert {png.name for png in drawn} == {png.name for png in (ROOT / "figures").glob("*.png")}
    for png in drawn:
        assert (matplotlib.image.imread(png) == matplotlib.image.imread(ROOT / "figures" / png.name)).all(), png.name


def test_each_part_of_make_figures_has_its_renderer():
    """The Makefile's parts are scripts/results' index, in the same order; each module renders, in 200 lines."""
    import importlib

    from scripts import results

    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^PARTS := (.*)$", makefile, re.M)[1].split() == results.PARTS
    for part in results.PARTS + results.OTHERS:
        assert callable(importlib.import_module(f"scripts.results.{part}").render), part
    for module in (ROOT / "scripts" / "results").glob("*.py"):
        assert len(module.read_text().splitlines()) <= 200, module.name


def test_plot_results_draws_every_figure_and_rewrites_only_the_tables(tmp_path):
    data, figures, results = tmp_path / "data", tmp_path / "figures", tmp_path / "RESULTS.md"
    write_figures_data(data)
    results.write_text("# Prose stays\n\n<!-- BEGIN scaling -->\nstale table\n<!-- END scaling -->\n\nMore prose.\n")
    text = plot_results(data, figures, results, ("top1_train", "top1_val", "top5_train", "top5_val",
                                                 "training_throughput", "training_time", "IO", "compression"))
    assert text.startswith("# Prose stays") and "More prose." in text and "stale table" not in text
    assert "| ddp | synthetic | 2 | 180.0 | 6.0 | 1.80x | 90 % |" in text  # 180 / (2 x 100)
    assert "| nd | 1 | 1 | 97.0 | 100.0 | 97.0 % |" in text and "| ddp | 2 | 1 | 180.0 | 200.0 | 90.0 % |" in text
    assert "| unconnected bare loops | memory | 2 | 150.0 |  | 1.50x | 75 % |" in text  # against nd's bare loop
    assert "tensor / PIL images/s: 0 worker(s): 1.50x, 2 worker(s): 1.50x." in text
    assert "uint8 / float32 batches, images/s of the tensor decoder: 0 worker(s): 1.20x, 2 worker(s): 1.25x." in text
    assert "12.50 ms to convert and normalise a batch of 32 at 224 px" in text and "4.8 MB as uint8 and 19.3" in text
    assert "0.900 s when they start anew each epoch (with --seed), 0.200 s when they persist" in text
    assert "| recipes/nd/train.py | 37.00 | 70.00 | 0 |" in text
    assert "| pytorch/examples imagenet/main.py | 40.00 | 75.00 | 0 |" in text
    assert "recipe / examples: wall 0.925x, CPU 0.933x; the medians of 3 runs of each" in text
    assert ("| nd | 1 | 3 | 2 | 61.00 (60.00\u201362.00) | 90.00 (90.00\u201390.00) | 61.00 (60.00\u201362.00) | 121.0 "
            "| 56 |") in text
    assert "| apex | 2 | 3 | 2 | 66.00 (65.00\u201367.00) |" in text
    assert "spread of the final top-1 (points): nd 2.00, ddp 2.00, apex 2.00." in text
    assert "beyond the spread (ranges that do not overlap): nd and apex (-5.00); ddp and apex (-4.50)." in text
    assert "so not told apart from noise: nd and ddp (-0.50)." in text
    assert "CPU Test CPU (2 cores), GPU none: these results are CPU-only" in text
    assert "Not measured yet: no GPU was available." in text  # the GPU section, without gpu/*.csv
    assert "| resnet18 | 2 | 89.5 | 0.3 | 1.00 % | 14.0 | 20 | 150 | 0.15 % |" in text
    assert "| serial | 1 | 3 | 61.0 | 95.50 (95.00\u201396.00) |  |  |  |  |" in text
    assert "| none | 2 | 3 | 41.0 | 94.50 (94.00\u201395.00) |  |  | 4,000 | 1.00 |" in text
    assert "| fp8-e4m3 | 2 | 3 | 46.0 | 93.25 (93.00\u201393.50) | -1.25 | yes | 1,004 | 3.98 |" in text
    assert "| fp8-e4m3 + error feedback | 2 | 3 | 47.0 | 94.33 (94.00\u201394.75) | -0.17 | no | 1,004 | 3.98 |" in text
    assert "Uncompressed DDP's top-1 spreads over 1.00 points at 2 processes from seed to seed." in text
    assert ("Beyond the spread: fp8-e4m3 at 2 (-1.25). Within it (not told apart from noise): fp8-e4m3 + error "
            "feedback at 2 (-0.17).") in text
    assert "| `make figures ONLY=compression` | 50.0 | 57 | 0 | 2026-11-24 |" in text
    assert "| `make figures` (the parts summed), without scaling, recovery, compile, ps, pipeline, sharding | 61.0 |" in text
    assert "| eager (no --compile) | 12.0 | 10.0 | 100.0 | 1.00x |  |" in text
    assert "| --compile, empty Inductor cache | 70.0 | 5.0 | 200.0 | 2.00x | +63.0 |" in text  # (70 - 5) - (12 - 10)
    assert "| --compile, warm Inductor cache | 20.0 | 5.0 | 200.0 | 2.00x | +13.0 |" in text
    assert "costs 63.0 s at start-up with an empty cache (13.0 s with a warm one) and runs at 2.00x" in text


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "clang++")),
                    reason="torch.compile on CPU needs a C++ compiler (g++ or clang++) for TorchInductor")
def test_bench_compile_runs_eager_cold_and_warm(tiny_data, tmp_path):
    out = tmp_path / "compile.csv"
    command = [sys.executable, "scripts/bench_compile.py", str(tiny_data), "--quick", "--epochs", "2", "--threads",
               "1", "--csv", str(out), "--runs", str(tmp_path / "runs")]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["epoch"]) for r in rows] == [(m, e) for m in ("eager", "cold", "warm") for e in "12"]
    assert all(float(r["epoch_s"]) > 0 and r["arch"] == "lenet" and r["torch"] for r in rows)
    assert "cold : first epoch" in result.stdout
    assert list((tmp_path / "runs" / "inductor-cache").rglob("*.py")), "TorchInductor generated no code"
    text = plot_results(tmp_path, tmp_path / "figures", tmp_path / "RESULTS.md", ())  # the script's own output
    assert f"| eager (no --compile) | {float(rows[0]['epoch_s']):.1f} |" in text
    assert f"| --compile, warm Inductor cache | {float(rows[4]['epoch_s']):.1f} |" in text


def test_bench_io_measures_both_decoders(tmp_path):
    jpegs, out = tmp_path / "jpegs", tmp_path / "io.csv"
    subprocess.run([sys.executable, ROOT / "scripts/make_demo_data.py", "--imagenet-like", jpegs,
                    "--classes", "2", "--images", "40"], check=True, capture_output=True)
    command = [sys.executable, "scripts/bench_io.py", str(jpegs), "--workers", "0", "1", "--repeats", "1",
               "-b", "8", "--image-size", "64", "--csv", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert sorted((r["decoder"], r["batches"], r["workers"]) for r in rows) == [
        ("pil", "uint8", "0"), ("pil", "uint8", "1"), ("tensor", "float32", "0"), ("tensor", "float32", "1"),
        ("tensor", "uint8", "0"), ("tensor", "uint8", "1")]
    files = {p.name: p.stat().st_size for p in (jpegs / "train").rglob("*.jpg")}
    mean_bytes = sum(files.values()) / len(files)
    for r in rows:  # 64 train images; one batch of 8 per worker (at least one) is the warm-up
        assert int(r["images"]) == 64 - 8 * max(int(r["workers"]), 1)
        bytes_per_image = float(r["mb_per_s"]) * 1e6 / float(r["images_per_s"])
        assert 0.5 * mean_bytes < bytes_per_image < 2 * mean_bytes  # MB/s counts the files actually read
    loader = json.loads((tmp_path / "io_loader.json").read_text())
    assert loader["float32_batch_bytes"] == 4 * loader["uint8_batch_bytes"] == 4 * 8 * 3 * 64 * 64
    assert loader["normalise_ms_per_batch"] > 0 and loader["first_batch_s_fresh_workers"] > 0
    assert 0 < loader["first_batch_s_persistent_workers"]
    text = plot_results(tmp_path, tmp_path / "figures", tmp_path / "RESULTS.md", ("IO",))  # the script's own output
    for r in rows:
        assert f"| {r['decoder']} | {r['batches']} | {r['workers']} | {float(r['images_per_s']):.1f} |" in text
    assert f"{loader['normalise_ms_per_batch']:.2f} ms to convert and normalise a batch of 8 at 64 px" in text


def test_bench_scaling_measures_recipes_and_the_bare_loop_side_by_side(tmp_path):
    out = tmp_path / "scaling.csv"
    command = [sys.executable, "scripts/bench_scaling.py", "-a", "lenet", "--image-size", "16", "-b", "128",
               "--processes", "1", "--steps", "5", "--warmup", "1", "--csv", str(out), "--runs", str(tmp_path / "runs")]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert sorted((r["kind"], r["recipe"], r["data"]) for r in rows) == [
        ("bare", "ddp", "memory"), ("bare", "nd", "memory"), ("recipe", "ddp", "synthetic"),
        ("recipe", "nd", "synthetic")]
    assert all(float(r["images_per_s"]) > 0 and r["cores"] and r["torch"] for r in rows)
    text = plot_results(tmp_path, tmp_path / "figures", tmp_path / "RESULTS.md", ("training_throughput",))
    ddp = next(r for r in rows if (r["kind"], r["recipe"]) == ("recipe", "ddp"))  # the script's own output, drawn
    assert f"| ddp | synthetic | 1 | {float(ddp['images_per_s']):.1f} | {float(ddp['epoch_s']):.1f} | 1.00x |" in text


def test_compression_table_trains_serial_and_ddp_and_a_restart_trains_only_what_is_missing(tiny_data, tmp_path):
    runs, data = tmp_path / "runs", tmp_path / "data"
    command = [sys.executable, "scripts/compression_table.py", "--data", str(tiny_data), "--quick", "--epochs", "1",
               "--global-batch", "16", "--processes", "2", "--methods", "fp8-e5m2", "--seeds", "0", "--runs", runs,
               "--figures-data", data]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(3 run(s) trained now, 0 kept from an earlier start)" in result.stdout
    with open(data / "compression.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["error_feedback"], r["processes"], r["seed"]) for r in rows] == [
        ("serial", "0", "1", "0"), ("fp8-e5m2", "0", "2", "0"), ("fp8-e5m2", "1", "2", "0")]
    assert all(3.9 < float(r["compression_ratio"]) <= 4 for r in rows[1:])  # (rounded to 3 decimals)
    first_top1 = [r["top1"] for r in rows]

    # a stop cut the serial run short: its summary.json is gone; a new start trains it alone again
    (runs / "serial-seed0" / "summary.json").unlink()
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(1 run(s) trained now, 2 kept from an earlier start)" in result.stdout
    with open(data / "compression.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["top1"] for r in rows] == first_top1  # the same seed trains to the same accuracy
    timings = {r["part"]: r for r in csv.DictReader(open(data / "timings.csv"))}
    assert timings["compression"]["runs_trained"] == "1" and timings["compression"]["runs_reused"] == "2"

    text = plot_results(data, tmp_path, tmp_path / "RESULTS.md", ("compression",))
    assert "| fp8-e5m2 + error feedback | 2 | 1 |" in text


def test_learning_curves_keep_each_recipe_and_seed_and_only_this_runs(tiny_data, tmp_path):
    data = tmp_path / "data"
    (data / "curves").mkdir(parents=True)
    (data / "curves" / "nd.csv").write_text("stale\n")  # an earlier layout: not drawn beside the new runs
    command = [sys.executable, "scripts/learning_curves.py", "--data", tiny_data, "--quick", "--epochs", "2",
               "--global-batch", "16", "--seeds", "3", "--runs", tmp_path / "runs", "--figures-data", data]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (data / "curves").iterdir()) == [
        f"{recipe}-seed3.{suffix}" for recipe in ("apex", "ddp", "nd") for suffix in ("csv", "json")]
    for recipe, processes in (("nd", 1), ("ddp", 2), ("apex", 2)):
        summary = json.loads((data / "curves" / f"{recipe}-seed3.json").read_text())
        assert summary["world_size"] == processes and summary["global_batch"] == 16 and summary["epochs"] == 2
        assert json.loads((tmp_path / "runs" / f"{recipe}-seed3" / "args.json").read_text())["seed"] == 3
    text = plot_results(data, tmp_path / "figures", tmp_path / "RESULTS.md", ("top1_val",))  # the script's output
    with open(data / "curves" / "ddp-seed3.csv", newline="") as f:
        final = float([r for r in csv.DictReader(f) if r["split"] == "val"][-1]["top1"])
    assert f"| ddp | 2 | 1 | 2 | {final:.2f} | " in text, text[:1500]  # (one seed: no range)


def test_a_run_is_finished_only_with_a_whole_summary_and_the_same_launch(tmp_path):
    launch = measuring.launch_of("ddp", 2, ["data", "--seed", 0])
    assert measuring.finished_summary(tmp_path, launch) is None  # nothing there
    (tmp_path / "launch.json").write_text(json.dumps(launch))
    assert measuring.finished_summary(tmp_path, launch) is None  # started, never finished
    (tmp_path / "summary.json").write_text('{"top1": 9')
    assert measuring.finished_summary(tmp_path, launch) is None  # cut off while written
    (tmp_path / "summary.json").write_text('{"top1": 91.5}')
    assert measuring.finished_summary(tmp_path, launch) == {"top1": 91.5}
    assert measuring.finished_summary(tmp_path, measuring.launch_of("ddp", 2, ["data", "--seed", 1])) is None
    assert measuring.finished_summary(tmp_path, measuring.launch_of("ddp", 4, ["data", "--seed", 0])) is None


def make(*targets, env=None):
    env = child_env(env)
    for name in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS"):  # under `make test`: a make of its own, not a sub-make
        env.pop(name, None)
    return subprocess.run(["make", *targets], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_make_figures_measures_only_the_parts_asked_for():
    commands = make("-n", "figures", "ONLY=compression curves").stdout
    assert "learning_curves.py" in commands and "compression_table.py" in commands and "plot_results.py" in commands
    assert not any(script in commands for script in ("bench_io", "bench_scaling", "bench_recovery", "bench_compile"))
    assert commands.index("learning_curves.py") < commands.index("compression_table.py") < commands.index(
        "plot_results.py")  # make figures' own order, whatever ONLY's
    every_part = make("-n", "figures").stdout
    assert all(script in every_part for script in ("bench_io", "bench_scaling", "learning_curves", "bench_recovery",
                                                   "bench_compile", "compression_table", "ps_table",
                                                   "pipeline_table", "bench_sharding"))
    assert every_part.index("compression_table.py") < every_part.index("ps_table.py") < every_part.index(
        "pipeline_table.py") < every_part.index("bench_sharding.py")
    assert "--quick" not in every_part and "--runs runs/figures/compression" in every_part
    assert "--quick" not in make("-n", "figures", "QUICK=0").stdout  # QUICK=0 means not quick
    quick = make("-n", "figures", "QUICK=1", "ONLY=compression").stdout
    assert "--quick" in quick and "runs/figures-quick/runs/compression" in quick
    result = make("figures", "ONLY=compression bogus")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "ONLY=bogus is not a part" in result.stderr


@pytest.mark.parametrize("target", ["figures-gpu", "gpu-smoke"])
def test_make_gpu_targets_without_cuda_say_so_in_one_line(target):
    result = make(target, env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no CUDA GPU here" in result.stderr
    assert f"make {target} needs one" in result.stderr
    result = make("figures-gpu", "ONLY=jpeg bogus")
    assert result.returncode == 2 and "ONLY=bogus is not a part of make figures-gpu" in result.stderr


@pytest.mark.parametrize("target, lacking", [("gpu-smoke", "byzfl"), ("figures-gpu", "matplotlib")])
def test_a_python_without_a_package_a_gpu_target_needs_is_told_in_one_line(monkeypatch, capsys, target, lacking):
    """GPU nodes often have torch and torchvision and no package index (PY=python3 make gpu-smoke)."""
    from scripts import check_python

    find_spec = check_python.importlib.util.find_spec
    monkeypatch.setattr(check_python.importlib.util, "find_spec", lambda name: None if name == lacking else
                        find_spec(name))
    with pytest.raises(SystemExit) as stopped:
        check_python.require(target, gpu=True)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"lacks {lacking} (" in error and f"which make {target} needs" in error


def test_a_torch_older_than_the_recipes_is_told_in_one_line(monkeypatch, capsys):
    import importlib.metadata

    from scripts import check_python

    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"torch": "2.9.1+cu128"}.get(name, "0.26.0"))
    with pytest.raises(SystemExit) as stopped:
        check_python.require("gpu-smoke", gpu=True)
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and error.count("\n") == 1 and "has torch 2.9.1+cu128 (at least 2.11)" in error
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"torch": "2.11.0"}.get(name, "0.26.0"))
    assert check_python.too_old() == []


@pytest.mark.parametrize("script, flags, message", [
    ("count_syncs.py", ["--json", "x.json", "recipes/ddp/train.py"], "counts CUDA synchronisations, and no CUDA GPU"),
    ("bench_examples.py", ["data/none", "--examples", "main.py"], "data/none has no train/ folder"),
    ("bench_examples.py", ["{tiny}", "--examples", "no/main.py"], "--examples no/main.py is not a file")])
def test_the_gpu_and_parity_tools_refuse_in_one_line(tiny_data, script, flags, message):
    flags = [flag.replace("{tiny}", str(tiny_data)) for flag in flags]
    result = subprocess.run([sys.executable, f"scripts/{script}", *flags], cwd=ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr


def test_gpu_smoke_plans_every_recipe_s_one_gpu_path_and_refuses_without_cuda():
    listed = subprocess.run([sys.executable, "scripts/gpu_smoke.py", "--list"], cwd=ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    plan = dict(line.split(None, 1) for line in listed.stdout.splitlines())
    assert {"nd", "dp", "ddp-decoder-pil", "ddp-decoder-gpu", "pipeline-stages-1"} <= set(plan)
    assert len([name for name in plan if name.startswith("apex-")]) == 8  # O0-O3, with and without channels_last
    assert len([name for name in plan if name.startswith("compression-")]) == 7
    assert len([name for name in plan if name.startswith("fsdp-")]) == 9  # 4 modes x O0/O1, and the DCP resume
    assert all("--channels-last" in plan[f"fsdp-{shard}-O1"] for shard in ("none", "optimizer", "grad-op", "full"))
    assert "--sync-bn" in plan["ddp-ema-syncbn-accum-mix"] and "--ema-decay" in plan["ddp-ema-syncbn-accum-mix"]
    assert "--nproc_per_node=3" in plan["ps-1-server-2-workers"] and "gloo" in plan["ps-1-server-2-workers"]
    faults = plan["faults-sigterm-then-resume"]
    assert "--fault term" in faults and "--auto-resume" in faults
    assert "count_syncs.py" in plan["syncs-per-step-ddp"]
    assert "--amp-dtype fp16" in plan["syncs-per-step-apex-fp16-ema"] and "--ema-decay" in plan["syncs-per-step-apex-fp16-ema"]
    result = subprocess.run([sys.executable, "scripts/gpu_smoke.py"], cwd=ROOT, env=child_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "no CUDA GPU here" in result.stderr


def test_figures_gpu_comes_in_parts_and_skips_compression_on_one_gpu(tmp_path, monkeypatch):
    jpegs = tmp_path / "jpegs"
    (jpegs / "train").mkdir(parents=True)
    listed = subprocess.run([sys.executable, "scripts/bench_gpu.py", "--jpeg", str(jpegs), "--list"], cwd=ROOT,
                            env=child_env(), capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    parts = [line for line in listed.stdout.splitlines() if not line.startswith(" ")]
    assert parts[0].startswith("synthetic: 8 run(s), about ") and parts[1].startswith("jpeg: 9 run(s), about ")
    assert parts[2].startswith("compression: 0 run(s), about 0.0 min by the model of --list (H100s); compression at "
                               "1 GPU: skipped, one GPU sends no gradients")
    assert "--decoder gpu" in listed.stdout
    args = bench_gpu.parse_args(["--jpeg", str(jpegs), "--gpus", "1", "2", "--list"])
    runs, skipped = bench_gpu.plan(args, [1, 2])
    assert {gpus for _, _, gpus, *_ in runs["compression"]} == {2} and "compression" in skipped
    # each part within 9 minutes on one H100 by --list's model, with make figures-gpu's 20,000 + 5,000 JPEGs
    monkeypatch.setattr(bench_gpu, "train_images", lambda args, data, split="train": {"synthetic": 12800}.get(
        data, 20000 if split == "train" else 5000))
    runs, _ = bench_gpu.plan(args, [1])
    minutes = {part: bench_gpu.estimated_minutes(args, runs[part], cores=16) for part in ("synthetic", "jpeg")}
    assert all(3 < m < 9 for m in minutes.values()), minutes
    # a part measured again replaces its own rows and keeps the others' (a resumed make figures-gpu ONLY=jpeg)
    data = tmp_path / "precision.csv"
    measuring.write_csv(data, bench_gpu.PRECISION_FIELDS, [{"data": d, "gpus": 1} for d in ("synthetic", "jpeg")])
    assert [r["data"] for r in bench_gpu.kept_rows(data, [1], ["jpeg"])] == ["synthetic"]
    assert [r["data"] for r in bench_gpu.kept_rows(data, [2], ["jpeg"])] == ["synthetic", "jpeg"]


@pytest.mark.parametrize("flags, message", [
    ([], "no CUDA GPU here"),
    (["--gpus", "0"], "--gpus must be at least 1"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--jpeg", "no/such/folder"], "has no train/ folder"),
    (["--parts", "jpeg"], "the jpeg part needs --jpeg DIR"),
    (["--parts", "speed"], "invalid choice: 'speed'")])
def test_bench_gpu_bad_input_and_no_cuda_are_one_line_and_exit_2(flags, message):
    result = subprocess.run([sys.executable, "scripts/bench_gpu.py", *flags], cwd=ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr


def test_bench_gpu_sweeps_every_recipe_precision_and_layout():
    assert bench_gpu.gpu_counts(1) == [1] and bench_gpu.gpu_counts(8) == [1, 2, 4, 8]
    assert bench_gpu.gpu_counts(6) == [1, 2, 4, 6] and bench_gpu.gpu_counts(8, [4, 2, 4]) == [2, 4]
    with pytest.raises(SystemExit) as stopped:
        bench_gpu.gpu_counts(2, [4])
    assert stopped.value.code == 2
    runs = [(data, *run) for data in ("synthetic", "jpeg") for run in bench_gpu.precision_runs(2, data)]
    assert len(runs) == len({name for _, name, *_ in runs}) == 2 * (2 + 3 * 2) + 1
    flags = {(recipe, data, decoder, precision, channels_last): extra
             for data, _, recipe, decoder, precision, channels_last, extra in runs}
    assert flags["dp", "jpeg", "tensor", "fp32", False] == [] and flags["ddp", "synthetic", "", "fp32", False] == []
    assert flags["apex", "synthetic", "", "fp32", True] == ["--opt-level", "O0", "--channels-last"]
    assert flags["apex", "jpeg", "tensor", "fp16", False] == ["--opt-level", "O1", "--amp-dtype", "fp16"]
    assert flags["apex", "jpeg", "tensor", "bf16", True] == ["--opt-level", "O1", "--amp-dtype", "bf16",
                                                             "--channels-last"]
    assert flags["apex", "jpeg", "gpu", "fp16", True][-2:] == ["--decoder", "gpu"]  # nvjpeg, the best set-up once
    for gpus in bench_gpu.gpu_counts(8):  # each GPU count of an 8-GPU node: the same layouts, each run named apart
        for data in ("synthetic", "jpeg"):
            layouts = [run[1:] for run in bench_gpu.precision_runs(gpus, data)]
            assert layouts == [run[1:] for run in bench_gpu.precision_runs(2, data)], (gpus, data)
    names = [r[0] for gpus in bench_gpu.gpu_counts(8) for data in ("synthetic", "jpeg")
             for r in bench_gpu.precision_runs(gpus, data)]
    assert len(names) == len(set(names)) == 4 * (2 * (2 + 3 * 2) + 1)
    compression = bench_gpu.compression_runs(4)
    assert [(method, ef) for _, method, ef, _ in compression] == bench_gpu.COMPRESSION
    assert compression[-1][3] == ["--compress", "powersgd", "--error-feedback"]
    assert bench_gpu.epochs_for(12800, 1, 256, 40) == (2, 50)  # one warm-up epoch, then 50 timed steps
    assert bench_gpu.epochs_for(12800, 8, 256, 40) == (8, 6)  # 7 epochs of 6 steps after the warm-up


def test_bench_gpu_halves_the_batch_until_it_fits_and_a_restart_skips_what_did_not(tmp_path, monkeypatch):
    launched = []

    def fake_train(recipe, processes, flags, out, threads, env=None, check=True, echo=None):
        """measuring.train's files, without a recipe: a run that does not fit 64 images per GPU runs out of memory."""
        batch, workers = int(flags[flags.index("-b") + 1]), int(flags[flags.index("-j") + 1])
        launched.append((recipe, processes, batch, workers, env["CUDA_VISIBLE_DEVICES"]))
        out.mkdir(parents=True, exist_ok=True)
        (out / "launch.json").write_text(json.dumps(measuring.launch_of(recipe, processes, flags, env, threads)))
        if batch // (2 if recipe == "dp" else 1) > 64:
            (out / "failed.log").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
            return None
        (out / "metrics.csv").write_text("epoch,split,loss,top1,top5,images_per_s,data_s,epoch_s,lr\n"
                                         "1,train,1,1,1,50,1,30,0.1\n2,train,1,1,1,1400,2,10,0.1\n")
        (out / "checkpoint.pt").write_bytes(b"weights")
        return {"top1": 1.0}

    monkeypatch.setattr(bench_gpu.measuring, "train", fake_train)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # the GPUs a scheduler gave this job
    args = bench_gpu.parse_args(["--runs", str(tmp_path), "--parts", "synthetic"])
    measured = bench_gpu.train(args, "dp-fp32-synthetic-2", "dp", 2, "synthetic", [], cores=16)
    # DataParallel: one process, one batch and the loader workers of both GPUs; 256, then 128 per GPU did not fit
    assert launched == [("dp", 1, 512, 8, "4,5"), ("dp", 1, 256, 8, "4,5"), ("dp", 1, 128, 8, "4,5")]
    assert measured["batch_size"] == 64 and measured["epochs"] == 2 and measured["workers"] == 8
    # 12800 images on 2 GPUs at 64 each: 100 steps of 128 images in epoch 2's 10 s
    assert measured["images_per_s"] == 1400.0 and measured["whole_epoch_images_per_s"] == 1280.0
    assert measured["data_wait_share"] == 0.2
    assert not list(tmp_path.rglob("*.pt"))  # a finished run keeps its metrics, not its checkpoints

    launched.clear()  # a restart: the batches that ran out of memory are not tried again
    bench_gpu.train(args, "dp-fp32-synthetic-2", "dp", 2, "synthetic", [], cores=16)
    assert launched == [("dp", 1, 128, 8, "4,5")]
    launched.clear()
    bench_gpu.train(args, "ddp-fp32-jpeg-2", "ddp", 2, "synthetic", [], cores=16)
    assert launched[-1] == ("ddp", 2, 64, 4, "4,5")  # DDP: one process per GPU, batch and workers per process
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert bench_gpu.visible_gpus(3) == "0,1,2"


def write_gpu_data(data):
    machine = "Test CPU,16,1 x Test GPU,2.14.1"
    header = ("recipe,data,decoder,precision,channels_last,gpus,batch_size,epochs,images_per_s,"
              "whole_epoch_images_per_s,data_wait_share,arch,image_size,workers,cpu,cores,gpu,torch")
    assert header.split(",") == bench_gpu.PRECISION_FIELDS  # (each header here is the script's own, checked)
    rows = [("ddp", "synthetic", "", "fp32", 0, 1, 1000, 0.01), ("ddp", "jpeg", "tensor", "fp32", 0, 1, 800, 0.25),
            ("apex", "synthetic", "", "fp16", 1, 1, 2500, 0.02), ("apex", "jpeg", "tensor", "fp16", 1, 1, 900, 0.6),
            ("apex", "jpeg", "gpu", "fp16", 1, 1, 2100, 0.1),
            ("ddp", "synthetic", "", "fp32", 0, 2, 1900, 0), ("apex", "synthetic", "", "fp16", 1, 2, 4500, 0)]
    (data / "gpu").mkdir(parents=True)
    (data / "gpu" / "precision.csv").write_text("\n".join([header] + [
        f"{recipe},{d},{decoder},{precision},{cl},{gpus},256,2,{rate},{rate - 100},{wait},resnet50,224,16,{machine}"
        for recipe, d, decoder, precision, cl, gpus, rate, wait in rows]) + "\n")
    header = ("method,error_feedback,gpus,batch_size,epochs,images_per_s,whole_epoch_images_per_s,data_wait_share,"
              "bytes_per_step,compression_ratio,arch,image_size,workers,cpu,cores,gpu,torch")
    assert header.split(",") == bench_gpu.COMPRESSION_FIELDS
    (data / "gpu" / "compression.csv").write_text("\n".join([header] + [
        f"{method},{ef},1,256,2,{rate},{rate},0,{sent},{ratio},resnet50,224,4,{machine}"
        for method, ef, rate, sent, ratio in (("none", 0, 1000, 100000, 1.0), ("powersgd", 1, 950, 1000, 100.0))])
        + "\n")
    (data / "gpu" / "timings.csv").write_text("part,seconds,runs_trained,runs_reused,date,cpu,cores,gpu,torch\n"
                                              f"gpu-synthetic,420,8,0,2026-11-24,{machine}\n"
                                              f"gpu-jpeg,300,8,1,2026-11-24,{machine}\n")


def test_plot_results_writes_the_gpu_section_from_the_sweep_data(tmp_path):
    data, figures, results = tmp_path / "data", tmp_path / "figures", tmp_path / "RESULTS.md"
    write_gpu_data(data)
    results.write_text("# Results\n")
    text = plot_results(data, figures, results, ("gpu_throughput", "gpu_scaling"))
    assert "| ddp fp32 | 1 | 256 | 1000 | 1.00x | 100 % | 1 % | 800 | 700 | 25 % |" in text
    assert "| apex O1 fp16, channels_last | 1 | 256 | 2500 | 2.50x | 100 % | 2 % | 900 | 800 | 60 % |" in text
    assert "| apex O1 fp16, channels_last | 2 | 256 | 4500 | 2.37x | 90 % | 0 % |  |  |  |" in text  # 4500 / (2 x 2500)
    assert "| powersgd + error feedback | 1 | 256 | 950 | 0.95x | 1,000 | 100.00 |" in text
    assert "| none | 1 | 256 | 1000 | 1.00x | 100,000 | 1.00 |" in text
    assert "| apex O1 fp16, channels_last, --decoder gpu | 1 | 256 |  |  |  |  | 2100 | 2000 | 10 % |" in text
    assert ("GPU 1 x Test GPU, CPU Test CPU (16 cores), torch 2.14.1. The sweep took 12.0 minutes (synthetic 7.0, "
            "jpeg 5.0): 16 runs trained, 1 kept from an earlier start." in text)


def test_ps_table_plans_every_attack_and_rule_for_each_seed(tiny_data, tmp_path):
    runs = ps_table.plan([0, 1, 2])
    assert len(runs) == 3 * (7 * 4 + 3 * 3 + 7 + 2) and len(set(runs)) == len(runs)
    sync = {(aggregate, attack) for part, _, aggregate, attack, _, seed in runs if part == "sync"}
    assert len(sync) == 7 * 4 and ("zeno, 1 step", "N(0,1), p 0.2") in sync and ("phocas", "none") in sync
    assert {seed for *_, seed in runs} == {0, 1, 2}
    args = ps_table.argparse.Namespace(data=tiny_data, epochs=3, quick=False, runs=tmp_path / "runs")

    def value(flags, flag):
        return flags[flags.index(flag) + 1]
    recipe, processes, flags = ps_table.flags_of("sync", "zenops", "signflip x4, 2 of 8", None, 0, args)
    assert (recipe, processes) == ("ps", 11) and value(flags, "--validators") == "2"
    assert value(flags, "--local-steps") == "8" and value(flags, "--byzantine") == "2"
    assert value(flags, "--attack-scale") == "4" and value(flags, "--validation-split") == "0.02"
    recipe, processes, flags = ps_table.flags_of("sync", "zeno, 1 step", "signflip x6, p 0.2", None, 0, args)
    assert "--local-steps" not in flags and value(flags, "--attack-prob") == "0.2"
    recipe, processes, flags = ps_table.flags_of("async", "zeno++, 1 step", "signflip x10, p 0.4", None, 1, args)
    assert (recipe, processes) == ("ps", 11) and value(flags, "--attack-prob") == "0.4"
    assert value(flags, "--attack-scale") == "10" and value(flags, "--mode") == "async"
    recipe, processes, flags = ps_table.flags_of("sync", "zenops", "N(0,1), p 0.2", -0.01, 1, args)
    assert value(flags, "--zeno-eta") == "-0.01" and value(flags, "--attack") == "gaussian"
    assert ps_table.flags_of("sync", "median", "none", None, 0, args)[:2] == ("ps", 9)
    assert ps_table.flags_of("ddp", "ddp", "none", None, 0, args)[:2] == ("ddp", 8)
    recipe, processes, flags = ps_table.flags_of("nd", "validation data only", "none", None, 0, args)
    assert (recipe, processes) == ("nd", 1) and value(flags, "-b") == "8"  # one worker's batch
    assert value(flags, "--epochs") == "18"  # 6 times the epochs on a 49th of the data: a worker's steps
    assert value(flags, "--warmup-epochs") == "6"  # and 6 times the warm-up
    assert len(list((flags[0] / "train").rglob("*.png"))) == 1  # 2 % of the 48 train images
    quick = ps_table.plan([0], quick=True)
    assert {part for part, *_ in quick} == {"sync", "async", "eta", "speed"} and len(quick) < 20
    folder = ps_table.validation_only_data(tiny_data, 0, 0.5, tmp_path / "held")
    assert len(list((folder / "train").rglob("*.png"))) == 24  # half of the 48 train images
    assert sorted(p.name for p in (folder / "val").iterdir()) == ["blue", "green", "red"]


def test_forked_runs_get_torchruns_environment_and_a_failing_rank_fails_the_run(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text("import os, sys\nrank = int(os.environ['RANK'])\n"
                      "print(f\"rank {rank} of {os.environ['WORLD_SIZE']} local {os.environ['LOCAL_RANK']} "
                      "at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} args {sys.argv[1:]}\")\n"
                      "if rank == int(sys.argv[1]):\n    sys.exit(3)\n"
                      "if rank == int(sys.argv[2]):\n    raise RuntimeError('a bug in rank 2')\n")
    program = ("import sys\nfrom scripts import measuring\nif __name__ == '__main__':\n"
               "    for failing in (('-1', '-1'), ('1', '-1'), ('-1', '2')):\n"
               f"        result = measuring.run_forked(3, [{str(script)!r}, *failing], 1)\n"
               "        print('returncode', result.returncode)\n        print(result.stdout)\n")
    result = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    fine, exited, raised = result.stdout.split("returncode ")[1:]
    assert fine.startswith("0\n") and exited.startswith("3\n") and raised.startswith("1\n")
    assert all(f"rank {rank} of 3 local {rank} at 127.0.0.1:" in fine for rank in range(3))
    assert "args ['-1', '-1']" in fine
    assert "RuntimeError: a bug in rank 2" in raised  # the traceback reaches the run's output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_no_forked_rank_outlives_the_script_that_forked_it(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(f"import os, time\nopen({str(tmp_path)!r} + f'/pid{{os.environ[\"RANK\"]}}', 'w')"
                      ".write(str(os.getpid()))\ntime.sleep(300)\n")
    program = ("from scripts import measuring\nif __name__ == '__main__':\n"
               f"    measuring.run_forked(2, [{str(script)!r}], 1)\n")
    measuring_script = subprocess.Popen([sys.executable, "-c", program], cwd=ROOT, env=child_env())
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    ranks = [int(path.read_text() or 0) for path in tmp_path.glob("pid*")]
    assert len(ranks) == 2
    measuring_script.kill()  # SIGKILL: no clean-up runs
    measuring_script.wait()
    deadline = time.monotonic() + 30
    while any(map(alive, ranks)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in ranks if alive(pid)]


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_plot_results_writes_the_ps_tables_and_figures_from_the_table_data(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    rows = []
    flip = "signflip x4, 2 of 8"

    def add(part, mode, aggregate, attack, top1s, eta="", counts=(800, 0, 0, 0), rate=1000.0):
        for seed, top1 in enumerate(top1s):
            rows.append({"part": part, "mode": mode, "aggregate": aggregate, "attack": attack, "zeno_eta": eta,
                         "seed": seed, "processes": 9, "epochs": 6, "top1": top1, "honest_pushed": counts[0],
                         "honest_rejected": counts[1], "byzantine_pushed": counts[2], "byzantine_rejected": counts[3],
                         "stale_dropped": 0, "images_per_s": rate, "train_s": 10, **machine})
    add("sync", "sync", "mean", "none", (96, 97, 98), rate=1200.0)
    add("sync", "sync", "mean", flip, (90, 91, 92), counts=(600, 0, 200, 0))
    add("sync", "sync", "median", "none", (95, 95, 95))
    add("sync", "sync", "median", flip, (94, 94.5, 95), counts=(600, 0, 200, 0))  # above mean's range
    add("sync", "sync", "mean, 1 step", "none", (80, 81, 82), rate=1100.0)
    add("sync", "sync", "zeno, 1 step", "none", (81, 81, 81), counts=(800, 200, 0, 0))  # inside its mean's range
    add("sync", "sync", "zeno, 1 step", flip, (80, 81, 82), counts=(600, 60.5, 200, 150))  # no mean to compare
    add("async", "async", "mean, 1 step", "none", (90, 90, 90), rate=900.0)
    add("async", "async", "zeno++, 1 step", "signflip x10, p 0.2", (87, 87, 87), counts=(600, 30, 200, 180))
    add("async", "async", "mean, 1 step", "signflip x10, p 0.2", ("", "", ""), counts=(600, 0, 200, 0))
    for eta, top1s in (("0.1", (70, 71, 72)), ("0", (80, 80, 80)), ("-0.1", (60, 60, 60))):
        add("eta", "sync", "zenops", "N(0,1), p 0.2", top1s, eta=eta, counts=(600, 120, 200, 100))
    add("eta", "nd", "validation data only", "none", (85, 86, 87), counts=("", "", "", ""))
    add("speed", "ddp", "ddp", "none", (97, 97, 97), counts=("", "", "", ""))
    add("async", "async", "mean, 1 step", "signflip x10, p 0.4", (10, "", ""), counts=(600, 0, 200, 0))
    add("async", "async", "zeno++, 1 step", "signflip x10, p 0.4", ("", "", ""), counts=(600, 0, 200, 0))
    for row in rows:  # a run that diverged has no top-1 and no counts
        row["diverged"] = int(row["top1"] == "")
        if row["diverged"]:
            row.update(honest_pushed="", honest_rejected="", byzantine_pushed="", byzantine_rejected="")
    with open(data / "ps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=ps_table.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    theirs = []  # ByzFL's benchmark: mean and median, no attack and sign flip, 3 seeds
    for rule, attack, top1s in (("mean", "none", (96, 96, 96)), ("median", "none", (95, 95, 95)),
                                ("mean", "signflip", (93, 93.5, 94)), ("median", "signflip", (93, 93.5, 94))):
        theirs += [{"aggregator": rule.title(), "attack": attack, "aggregate": rule, "ps_attack": attack,
                    "byzantine": 2, "honest": 6, "workers": 8, "tolerated_f": 2, "seed": seed, "steps": 150,
                    "batch": 25, "lr": 0.1, "momentum": 0.9, "top1": top1, "diverged": 0, "train_s": 1,
                    "byzfl": "0.0.11", **machine} for seed, top1 in enumerate(top1s)]
    with open(data / "byzfl.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=byzfl_reference.FIELDS)
        writer.writeheader()
        writer.writerows(theirs)
    text = plot_results(data, tmp_path, tmp_path / "RESULTS.md", ("ps", "ps_eta"))
    assert f"| rule | ByzFL: none | ours: none | ByzFL: signflip | ours: {flip} |" in text
    assert ("| `median` | 95.0 (95.0\u201395.0) | 95.0 (95.0\u201395.0) | 93.5 (93.0\u201394.0) | "
            "94.5 (94.0\u201395.0) |") in text
    # ours: median beats mean beyond the spread under the flip; ByzFL's cannot tell them apart
    assert "0 not told apart; a run that diverged counts as chance, 10 %): median under signflip (ByzFL +0, " \
           "ours +1)." in text
    assert f"| aggregation | none | {flip} |" in text
    assert "| `mean` | 97.0 (96.0\u201398.0) | 91.0 (90.0\u201392.0) |" in text
    assert "| `zeno, 1 step` | 81.0 (81.0\u201381.0) | 81.0 (80.0\u201382.0) |" in text
    assert (f"Beyond the spread of `mean` (of the same local steps) under the same attack, better: median under "
            f"{flip} (+3.5). Worse: median under none (-2.0).") in text
    assert "| `zeno++, 1 step` |  | 87.0 (87.0\u201387.0) | diverged |" in text  # async: no row without an attack
    assert "| `mean, 1 step` | 90.0 (90.0\u201390.0) | diverged | 10.0 (2 of 3 diverged) |" in text
    assert "better: zeno++, 1 step under signflip x10, p 0.2 (the mean diverged). Worse: none." in text
    assert "| sync | `zeno, 1 step` | 25 (25\u201325) | 10 (10\u201310) / 75 (75\u201375) |" in text
    assert "| async | `zeno++, 1 step` |  | 5 (5\u20135) / 90 (90\u201390) |" in text
    assert f"| mode | rule | none | {flip} / signflip x10, p 0.2 | signflip x10, p 0.4 |" in text
    assert "| 0 | 80.0 (80.0\u201380.0) | 20 (20\u201320) | 50 (50\u201350) |" in text
    assert "| validation data only (nd) | 86.0 (85.0\u201387.0) |  |  |" in text
    assert "The best eta: 0 (80.0 (80.0\u201380.0) %); within its spread (not told apart from it): none." in text
    assert "| ps sync, `mean` | 3 | 1200 (1200\u20131200) | 1.20 (1.20\u20131.20) |" in text
    assert "| ps sync, `mean, 1 step` | 3 | 1100 (1100\u20131100) | 1.10 (1.10\u20131.10) |" in text
    assert "| ps async, `mean, 1 step` | 3 | 900 (900\u2013900) | 0.90 (0.90\u20130.90) |" in text
    assert "| ddp | 3 | 1000 (1000\u20131000) | 1.00 (1.00\u20131.00) |" in text


def test_pipeline_table_plans_each_sync_and_layout_with_and_without_stragglers(tiny_data):
    runs = pipeline_table.plan([0, 1, 2])
    sync = [run for run in runs if run[0] == "sync"]
    assert len(sync) == 3 * 4 * 4 * 2 and len(set(runs)) == len(runs)
    assert {(s, hetero, stages, replicas) for _, s, hetero, stages, replicas, *_ in sync} == {
        (s, h, stages, replicas) for s in pipeline_table.SYNCS for h in (0.0, 0.1)
        for stages, replicas in ((1, 2), (1, 4), (1, 8), (2, 4))}
    bubble = [(schedule, m) for part, _, _, _, _, schedule, m, _ in runs if part == "bubble"]
    assert ("gpipe", 1) in bubble and ("1f1b", 1) not in bubble and len(bubble) == 5 + 4  # 1f1b needs M >= S
    args = pipeline_table.argparse.Namespace(data=tiny_data, epochs=1, quick=False)
    processes, flags = pipeline_table.flags_of("sync", "hetpipe", 0.1, 2, 4, "1f1b", 2, 1, args)
    assert processes == 10 and flags[flags.index("--hetero") + 1] == "0.1"  # 4 replicas x 2 stages, 2 servers
    assert flags[flags.index("-b") + 1] == "8" and flags[flags.index("--microbatches") + 1] == "2"
    processes, flags = pipeline_table.flags_of("sync", "preduce", 0.0, 1, 8, "1f1b", 1, 1, args)
    assert processes == 8 and flags[flags.index("--stages") + 1] == "1"
    processes, flags = pipeline_table.flags_of("bubble", "allreduce", 0.0, 2, 1, "gpipe", 16, 0, args)
    assert processes == 2 and flags[flags.index("-b") + 1] == "256" and flags[flags.index("--epochs") + 1] == "1"
    assert len(pipeline_table.plan([0], quick=True)) < 12


def test_the_expected_maximum_model_of_stragglers():
    # one replica, 2 slots at q 0.1: E[delay] = 2 x 0.1 x X; two: 1 - 0.81^2 (one sleep or more) + 1 - 0.99^2 (two)
    assert abs(pipeline_table.expected_max(1, 2, 0.1, 1.0) - 0.2) < 1e-12
    assert abs(pipeline_table.expected_max(2, 2, 0.1, 1.0) - (1 - 0.81 ** 2 + 1 - 0.99 ** 2)) < 1e-12
    delays = {sync: pipeline_table.expected_delay(sync, 8, 1, 1) for sync in pipeline_table.SYNCS}
    assert delays["preduce"] < delays["adpsgd"] < delays["allreduce"] and delays["hetpipe"] < delays["allreduce"]
    assert pipeline_table.expected_delay("allreduce", 8, 1, 1) > pipeline_table.expected_delay("allreduce", 2, 1, 1)


def test_plot_results_writes_the_pipeline_tables_and_figure(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    rows, curves = [], []

    def add(replicas, sync, hetero, top1s, rates, reached=("", "", ""), waits=0, step_s=0.01):
        for seed, (top1, rate, seconds) in enumerate(zip(top1s, rates, reached)):
            rows.append({"part": "sync", "sync": sync, "hetero": hetero, "schedule": "1f1b", "microbatches": 1,
                         "batch": 8, "stages": 1, "replicas": replicas, "processes": replicas, "seed": seed,
                         "epochs": 1, "top1": top1, "images_per_s": 8 * rate, "updates_per_s": rate,
                         "step_s": step_s, "train_s": 10, "seconds_to_target": seconds, "target": 90.0,
                         "waits": waits, "full_syncs": 10, "partial_syncs": 50, "connectivity_syncs": 2,
                         "mean_group_size": 2.5, "longest_unconnected_updates": 90, "disagreement": 0.01,
                         "max_applied_staleness": 0, **machine})
            curves.append({"sync": sync, "hetero": hetero, "stages": 1, "replicas": replicas, "seed": seed,
                           "epoch": 1, "seconds": 10, "top1": top1})
    add(8, "allreduce", 0.0, (92, 92.5, 93), (100, 100, 100), (10, 12, 14))
    add(8, "allreduce", 0.1, (92, 92.5, 93), (20, 30, 25), (20, "", 30), waits=30)
    add(8, "preduce", 0.0, (91, 91.5, 92), (100, 95, 90), (10, 10, 10))
    add(8, "preduce", 0.1, (92, 92, 92), (80, 76, 72), (12, 12, 12), waits=3)
    add(2, "allreduce", 0.0, (95, 95, 95), (200, 200, 200), (5, 5, 5))
    add(2, "allreduce", 0.1, (95, 95, 95), (40, 40, 40), (25, 25, 25))
    for schedule, rates in (("gpipe", {1: 500, 2: 800, 4: 1000}), ("1f1b", {2: 900, 4: 1000})):
        for m, rate in rates.items():
            rows.append({**rows[0], "part": "bubble", "schedule": schedule, "microbatches": m, "batch": 256,
                         "stages": 2, "replicas": 1, "processes": 2, "images_per_s": rate, "seconds_to_target": ""})
    for name, fields, table_rows in (("pipeline.csv", pipeline_table.FIELDS, rows),
                                     ("pipeline_curves.csv", pipeline_table.CURVE_FIELDS, curves)):
        with open(data / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(table_rows)
    text = plot_results(data, tmp_path, tmp_path / "RESULTS.md", ("pipeline",))
    assert ("| 8 x 1 | `allreduce` | none | 3 | 100 (100–100) | 12.0 (10.0–14.0) | 92.50 (92.00–93.00) "
            "|  | 0.0 | 0.0100 |") in text
    assert "| 8 x 1 | `allreduce` | 0.1 s | 3 | 25 (20–30) | 25.0 (20.0–30.0) (2 of 3) |" in text
    assert "| 8 x 1 | `preduce` | 0.1 s | 3 | 76 (72–80) | 12.0 (12.0–12.0) | 92.00 (92.00–92.00) | 2.50 |" \
        in text
    allreduce = 0.01 / (0.01 + pipeline_table.expected_delay("allreduce", 8, 1, 1))
    assert f"| 8 x 1 | `allreduce` | 0.0100 | {allreduce:.2f} | 0.25 (0.20–0.30) |" in text
    assert "| R = 8, stragglers: `preduce` at least 2x `allreduce`'s updates/s | 3.14 (2.53–4.00) | yes |" in text
    assert "| R = 8, stragglers: `preduce` no slower to the target top-1 | 12.0 s vs 25.0 s | yes |" in text
    assert "| 8 x 1, no stragglers: `preduce` within 10 % of `allreduce` | 0.95 (0.90–1.00) | yes |" in text
    assert "R = 2: `allreduce`'s slowdown within 15 % of the model | 0.20 vs" in text
    assert "| 1 | 0.50 | 0.62 | 500 (0.50) |  |" in text  # (1/2) / (4/5)
    assert "| 2 | 0.33 | 0.83 | 800 (0.80) | 900 (0.90) |" in text
    assert (tmp_path / "pipeline.png").exists()
    assert ("| [pipeline](#pipelined-replicas-allreduce-partial-reduce-ad-psgd-hetpipe) | 8 replicas with stragglers: "
            "partial reduce at 3.14x allreduce's updates/s; ") in text  # (RESULTS.md's headline)


def test_the_zero_model_divides_what_each_mode_shards():
    p, n = 1000, 4  # parameters, processes: 4 bytes each for weights, gradients and momentum
    assert [bench_sharding.model_bytes(mode, p, n) for mode in bench_sharding.MODES] == [12000, 9000, 6000, 3000]
    assert all(bench_sharding.model_bytes(mode, p, 1) == 12000 for mode in bench_sharding.MODES)
    assert [bench_sharding.comm_bytes(mode, p, n) for mode in bench_sharding.MODES] == [6000, 9000, 6000, 9000]
    assert all(bench_sharding.comm_bytes(mode, p, 1) == 0 for mode in bench_sharding.MODES)


def test_bench_sharding_without_data_says_so_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "scripts/bench_sharding.py", "--data", tmp_path / "none"], cwd=ROOT,
                            env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "has no train/ folder" in result.stderr


def test_plot_results_writes_the_sharding_table_and_figure(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    p, rows = 2 ** 20, []
    for n, rates in ((1, (100, 99, 98, 97)), (2, (180, 150, 160, 90))):
        for mode, rate in zip(bench_sharding.MODES, rates):
            model = bench_sharding.model_bytes(mode, p, n)
            rows.append({"shard": mode, "zero": bench_sharding.ZERO[mode], "processes": n, "arch": "resnet50",
                         "image_size": 32, "batch": 16, "parameters": p, "param_bytes": int(model) // 3,
                         "grad_bytes": int(model) // 3, "optimizer_bytes": int(model) // 3,
                         "state_bytes": 3 * (int(model) // 3), "model_bytes": model,
                         "peak_rss_bytes": 700 * 2 ** 20, "peak_cuda_bytes": "", "images_per_s": rate,
                         "comm_bytes_model": bench_sharding.comm_bytes(mode, p, n), "top1": 10.0, **machine})
    with open(data / "sharding.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=bench_sharding.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    text = plot_results(data, tmp_path, tmp_path / "RESULTS.md", ("sharding",))
    assert "| `none` (DDP) | 1 | 4.0 | 4.0 | 4.0 | 12.0 | 12.0 | 700 | 100.0 | 1.00 | 0 |" in text
    assert "| `full` (ZeRO-3) | 2 | 2.0 | 2.0 | 2.0 | 6.0 | 6.0 | 700 | 90.0 | 0.50 | 6 |" in text
    assert "| `optimizer` (ZeRO-1) | 2 | 3.3 | 3.3 | 3.3 | 10.0 | 10.0 | 700 | 150.0 | 0.83 | 6 |" in text
    assert "resnet50 (1.0 M parameters) at 32 px, -b 16 per process" in text
    assert "Measured sum over the model: `none` 1.00-1.00; `optimizer` 1.00-1.00" in text


def test_every_break_of_the_mutation_check_applies_and_names_tests_that_exist():
    """scripts/mutations.py's list kept in step with the code: each break's text occurs once where it says, and
    each test it names is a test of that file (the whole check runs outside make test: make test-mutations)."""
    assert len({brk["name"] for brk in mutations.BREAKS}) == len(mutations.BREAKS)
    for brk in mutations.BREAKS:
        assert (ROOT / brk["file"]).read_text().count(brk["old"]) == 1, brk["name"]
        for test in brk["tests"]:
            path, name = test.split("::")
            assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), (brk["name"], test)


def test_the_mutation_check_catches_a_break_and_tells_a_missed_one():
    """In small: two breaks, caught by their tests after a control run with nothing broken; and a break no test can
    see (a comment changed) reported as missed."""
    command = [sys.executable, "scripts/mutations.py", "--only", "checkpoint-written-in-place", "scaler-not-restored"]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "control: the 2 tests pass with no break in" in result.stdout
    assert [line.split()[:2] for line in result.stdout.splitlines()[1:3]] == [
        ["caught", "scaler-not-restored"], ["caught", "checkpoint-written-in-place"]]
    assert "2 of 2 breaks caught" in result.stdout and "FAILED tests/test_common.py::test_checkpoint_write_is_atomic" in \
        result.stdout  # (each caught break names the test that failed)
    unseen = dict(name="a-comment", file="recipes/common/schedule.py", old="#", new="# (changed)",
                  tests=["tests/test_training.py::test_warmup_then_cosine"])
    unseen["old"] = next(line for line in (ROOT / unseen["file"]).read_text().splitlines() if "#" in line)
    unseen["new"] = unseen["old"] + " (a comment changed)"
    assert mutations.check(unseen)[0] == "missed"


def test_the_page_of_what_the_tests_show_is_current():
    """docs/tests.md, which the README points to for what the suite shows, is what tests/ says now."""
    assert list_tests.main(["--check"]) == 0, "run python scripts/list_tests.py"
    assert "- a crash between write and rename leaves the old checkpoint (for each of its cases)" in list_tests.page()
