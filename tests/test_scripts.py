"""scripts/: the data sets it writes, the benchmarks, and the figures and tables drawn from their data."""

import csv
import json
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, child_env
from PIL import Image


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
    command = [sys.executable, "scripts/bench_recovery.py", "--quick", str(tiny_data), "--json", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(out.read_text())
    assert measured["finished"] and measured["arch"] == "lenet"
    assert 0 < measured["seconds_per_save"] < measured["train_epoch_s"]
    assert 0 < measured["stop_check_us"] and 0 < measured["stop_check_share_of_step"] < 1
    assert measured["kill_to_first_step_s"] > 0 and measured["checkpoint_mb"] > 0


def write_figures_data(data):
    """Measured-data files as the benchmark scripts write them, with round numbers to check the tables by."""
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    (data / "curves").mkdir(parents=True)
    for recipe, world_size in (("nd", 1), ("ddp", 2), ("apex", 2)):
        rows = ["epoch,split,loss,top1,top5,images_per_s,data_s,epoch_s,lr"]
        rows += [f"{e},{split},1.0,{40 + 10 * e},{80 + 5 * e},100,0.1,2.0,0.05" for e in (1, 2) for split in
                 ("train", "val")]
        (data / "curves" / f"{recipe}.csv").write_text("\n".join(rows) + "\n")
        (data / "curves" / f"{recipe}.json").write_text(json.dumps(
            {"world_size": world_size, "images_per_s": 123.4, "wall_s": 56.0}))
    header = "kind,recipe,data,processes,threads,arch,image_size,batch_size,images_per_s,epoch_s,cpu,cores,gpu,torch"
    rows = [("recipe", "nd", "synthetic", 1, 97, 10), ("recipe", "ddp", "synthetic", 1, 100, 10),
            ("recipe", "ddp", "jpeg", 1, 50, 2), ("recipe", "ddp", "synthetic", 2, 180, 6),
            ("recipe", "ddp", "jpeg", 2, 80, 1.5), ("bare", "nd", "memory", 1, 100, ""),
            ("bare", "ddp", "memory", 1, 100, ""), ("bare", "ddp", "memory", 2, 200, ""),
            ("bare", "independent", "memory", 2, 150, "")]
    (data / "scaling.csv").write_text("\n".join([header] + [
        f"{k},{r},{d},{p},1,resnet18,32,32,{rate},{epoch_s},{','.join(map(str, machine.values()))}"
        for k, r, d, p, rate, epoch_s in rows]) + "\n")
    header = ("decoder,workers,batch_size,image_size,images,seconds,images_per_s,mb_per_s,images_per_s_per_worker,"
              "cpu,cores,gpu,torch")
    rows = [("pil", 0, 100), ("pil", 2, 200), ("tensor", 0, 150), ("tensor", 2, 300)]
    (data / "io.csv").write_text("\n".join([header] + [
        f"{d},{w},32,224,320,1,{rate},{rate / 10},{rate / max(w, 1)},{','.join(map(str, machine.values()))}"
        for d, w, rate in rows]) + "\n")
    (data / "recovery.json").write_text(json.dumps(
        {"arch": "resnet18", "processes": 2, "checkpoint_mb": 89.5, "seconds_per_save": 0.3,
         "save_share_of_epoch": 0.01, "kill_to_first_step_s": 14.0, "steps_redone": 20, "stop_check_us": 150.0,
         "stop_check_share_of_step": 0.0015}))
    header = ("method,error_feedback,processes,threads,arch,epochs,global_batch,train_s,wall_s,top1,top5,"
              "bytes_per_step,compression_ratio,cpu,cores,gpu,torch")
    rows = [("serial", 0, 1, 60, 95.0, "", ""), ("none", 0, 2, 40, 94.5, 4000, 1.0),
            ("fp8-e4m3", 0, 2, 45, 93.25, 1004, 3.984), ("fp8-e4m3", 1, 2, 46, 94.0, 1004, 3.984)]
    (data / "compression.csv").write_text("\n".join([header] + [
        f"{m},{ef},{p},1,resnet18,2,64,{t},{t + 5},{top1},99,{b},{r},{','.join(map(str, machine.values()))}"
        for m, ef, p, t, top1, b, r in rows]) + "\n")
    rows = [("eager", (12, 10, 10), 100), ("cold", (70, 5, 5), 200), ("warm", (20, 5, 5), 200)]
    (data / "compile.csv").write_text("\n".join(["mode,epoch,epoch_s,images_per_s,arch,threads,cpu,cores,gpu,torch"] + [
        f"{mode},{e + 1},{t},{rate},resnet18,2,{','.join(map(str, machine.values()))}"
        for mode, times, rate in rows for e, t in enumerate(times)]) + "\n")


def test_plot_results_draws_every_figure_and_rewrites_only_the_tables(tmp_path):
    data, figures, results = tmp_path / "data", tmp_path / "figures", tmp_path / "RESULTS.md"
    write_figures_data(data)
    results.write_text("# Prose stays\n\n<!-- BEGIN scaling -->\nstale table\n<!-- END scaling -->\n\nMore prose.\n")
    command = [sys.executable, "scripts/plot_results.py", "--data", data, "--figures", figures, "--results", results]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("top1_train", "top1_val", "top5_train", "top5_val", "training_throughput", "training_time", "IO",
                 "compression"):
        with Image.open(figures / f"{name}.png") as image:
            assert image.format == "PNG" and image.size[0] > 300
    text = results.read_text()
    assert text.startswith("# Prose stays") and "More prose." in text and "stale table" not in text
    assert "| ddp | synthetic | 2 | 180.0 | 6.0 | 1.80x | 90 % |" in text  # 180 / (2 x 100)
    assert "| nd | 1 | 1 | 97.0 | 100.0 | 97.0 % |" in text and "| ddp | 2 | 1 | 180.0 | 200.0 | 90.0 % |" in text
    assert "| unconnected bare loops | memory | 2 | 150.0 |  | 1.50x | 75 % |" in text  # against nd's bare loop
    assert "tensor / PIL images/s: 0 worker(s): 1.50x, 2 worker(s): 1.50x." in text
    assert "| apex | 2 | 2 | 60.00 | 90.00 | 60.00 | 123.4 | 56 |" in text
    assert "CPU Test CPU (2 cores), GPU none: these results are CPU-only" in text
    assert "| resnet18 | 2 | 89.5 | 0.3 | 1.00 % | 14.0 | 20 | 150 | 0.15 % |" in text
    assert "| serial | 1 | 60.0 | 95.00 |  |  |  |" in text
    assert "| fp8-e4m3 | 2 | 45.0 | 93.25 | -1.25 | 1,004 | 3.98 |" in text  # the gap against none at 2 processes
    assert "| fp8-e4m3 + error feedback | 2 | 46.0 | 94.00 | -0.50 | 1,004 | 3.98 |" in text
    assert "| eager (no --compile) | 12.0 | 10.0 | 100.0 | 1.00x |  |" in text
    assert "| --compile, empty Inductor cache | 70.0 | 5.0 | 200.0 | 2.00x | +63.0 |" in text  # (70 - 5) - (12 - 10)
    assert "| --compile, warm Inductor cache | 20.0 | 5.0 | 200.0 | 2.00x | +13.0 |" in text
    assert "costs 63.0 s at start-up with an empty cache (13.0 s with a warm one) and runs at 2.00x" in text


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "clang++")),
                    reason="torch.compile on CPU needs a C++ compiler (g++ or clang++) for TorchInductor")
def test_bench_compile_runs_eager_cold_and_warm(tiny_data, tmp_path):
    out = tmp_path / "compile.csv"
    command = [sys.executable, "scripts/bench_compile.py", str(tiny_data), "--quick", "--epochs", "2", "--threads",
               "1", "--csv", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["epoch"]) for r in rows] == [(m, e) for m in ("eager", "cold", "warm") for e in "12"]
    assert all(float(r["epoch_s"]) > 0 and r["arch"] == "lenet" and r["torch"] for r in rows)
    assert "cold : first epoch" in result.stdout


def test_bench_io_measures_both_decoders(tmp_path):
    jpegs, out = tmp_path / "jpegs", tmp_path / "io.csv"
    subprocess.run([sys.executable, ROOT / "scripts/make_demo_data.py", "--imagenet-like", jpegs,
                    "--classes", "2", "--images", "40"], check=True, capture_output=True)
    command = [sys.executable, "scripts/bench_io.py", str(jpegs), "--workers", "0", "1", "--repeats", "1",
               "-b", "8", "--image-size", "64", "--csv", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert sorted((r["decoder"], r["workers"]) for r in rows) == [("pil", "0"), ("pil", "1"), ("tensor", "0"),
                                                                  ("tensor", "1")]
    files = {p.name: p.stat().st_size for p in (jpegs / "train").rglob("*.jpg")}
    mean_bytes = sum(files.values()) / len(files)
    for r in rows:  # 64 train images; one batch of 8 per worker (at least one) is the warm-up
        assert int(r["images"]) == 64 - 8 * max(int(r["workers"]), 1)
        bytes_per_image = float(r["mb_per_s"]) * 1e6 / float(r["images_per_s"])
        assert 0.5 * mean_bytes < bytes_per_image < 2 * mean_bytes  # MB/s counts the files actually read


def test_bench_scaling_measures_recipes_and_the_bare_loop_side_by_side(tmp_path):
    out = tmp_path / "scaling.csv"
    command = [sys.executable, "scripts/bench_scaling.py", "-a", "lenet", "--image-size", "16", "-b", "128",
               "--processes", "1", "--steps", "5", "--warmup", "1", "--csv", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert sorted((r["kind"], r["recipe"], r["data"]) for r in rows) == [
        ("bare", "ddp", "memory"), ("bare", "nd", "memory"), ("recipe", "ddp", "synthetic"),
        ("recipe", "nd", "synthetic")]
    assert all(float(r["images_per_s"]) > 0 and r["cores"] and r["torch"] for r in rows)


def test_compression_table_trains_serial_and_ddp_and_writes_the_table(tiny_data, tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("prose\n")
    command = [sys.executable, "scripts/compression_table.py", "--data", str(tiny_data), "--quick", "--epochs", "1",
               "--global-batch", "16", "--processes", "2", "--methods", "fp8-e5m2", "--runs", str(tmp_path / "runs"),
               "--figures-data", str(tmp_path / "data"), "--figures", str(tmp_path), "--results", str(results)]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "data" / "compression.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["error_feedback"], r["processes"]) for r in rows] == [
        ("serial", "0", "1"), ("fp8-e5m2", "0", "2"), ("fp8-e5m2", "1", "2")]
    assert all(3.9 < float(r["compression_ratio"]) <= 4 for r in rows[1:])  # (rounded to 3 decimals)
    assert (tmp_path / "compression.png").exists()
    assert "| fp8-e5m2 + error feedback | 2 |" in results.read_text()
