"""The measuring scripts of make figures, each on tiny data: what they run, what they write, and the models
beside their tables."""

import csv
import json
import shutil
import statistics
import sys

import pytest
import torch
from conftest import ROOT, plot_results, run_python

sys.path.insert(0, str(ROOT))
from recipes.common import data
from scripts.figures.sharding import measure as sharding_measure
from scripts.figures import measuring
from scripts.figures.pipeline import measure as pipeline_measure
from scripts.figures.ps import table as ps_table


def test_bench_recovery_measures_a_save_and_a_restart(tiny_data, tmp_path):
    out = tmp_path / "recovery.json"
    command = [sys.executable, "scripts/figures/recovery/measure.py", "--quick", str(tiny_data), "--json", str(out),
               "--runs", str(tmp_path / "runs"), "--cases",
               "ps-async-a-server-killed"]  # (every case: tests/common/test_faults.py)
    result = run_python(command, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(out.read_text())
    assert measured["finished"] and measured["arch"] == "lenet"
    assert 0 < measured["seconds_per_save"] < measured["train_epoch_s"]
    assert 0 < measured["stop_check_us"] and 0 < measured["stop_check_share_of_step"] < 1
    assert measured["kill_to_first_step_s"] > 0 and measured["checkpoint_mb"] > 0
    rows = {row["row"]: row for row in measuring.read_csv(tmp_path / "recovery_recipes.csv")}
    ps = rows["ps async, a server killed"]  # (a server counts every update; a worker's pushes, in a run of tenths
    assert ps["deterministic"] == "False"  # of a second, could all fall before or after the third into epoch 2)
    assert ps["finished"] == "True" and float(ps["kill_to_first_step_s"]) > 0
    assert 0 <= int(ps["steps_redone"]) <= 2 * int(ps["steps_per_epoch"])
    from scripts.figures.recovery.render import recovery_recipes_table  # the script's own output, in RESULTS.md's table

    text = recovery_recipes_table(list(rows.values()))
    assert f"| ps async, a server killed | 4 | 1 | {ps['kill_to_first_step_s']} |" in text
    assert "1 of 1 killed runs finished" in text


def test_bench_precision_runs_each_precision_it_names_and_says_what_the_cpu_has(tmp_path):
    """2 processes under torchrun, one round: each set-up's summary says the precision its name says (O1 bf16
    really in bf16), the CPU's flags are recorded, and the text follows them: the same data with a CPU that
    lacks native bf16 says so."""
    out = tmp_path / "precision.csv"
    command = [sys.executable, "scripts/figures/precision/measure.py", "--quick", "--processes", "2", "--csv", str(out),
               "--runs", str(tmp_path / "runs")]
    result = run_python(command, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    native_bf16 = bool({"avx512_bf16", "amx_bf16"} & set(measuring.cpu_flags().split()))
    rows = measuring.read_csv(out)
    assert [(r["setup"], r["precision"], r["processes"]) for r in rows] == [
        ("ddp", "fp32", "2"), ("O0", "fp32", "2"), ("O0 + channels_last", "fp32", "2")] + (
        [("O1 bf16", "bf16", "2"), ("O1 bf16 + channels_last", "bf16", "2")] if native_bf16 else [])
    assert all(float(r["images_per_s"]) > 0 and r["cpu_flags"] == measuring.cpu_flags() for r in rows)
    # fp32 weights, their gradients, SGD's momentum: the same bytes, as each run's summary.json measured them
    assert all(float(r["param_mb"]) > 0 and r["param_mb"] == r["grad_mb"] == r["optimizer_mb"] for r in rows)
    assert all(float(r["peak_mb"]) > float(r["param_mb"]) for r in rows)
    info = json.loads(out.with_suffix(".json").read_text())
    assert info["native_bf16"] == native_bf16 and info["hardware"]["cpu_flags"] == measuring.cpu_flags()
    from scripts.figures.precision import render as precision

    text = precision.render(tmp_path, tmp_path, [])["precision"]
    o0 = statistics.median(float(r["images_per_s"]) for r in rows if r["setup"] == "O0")
    assert f"| O0 | {o0:.1f} ({o0:.1f}–{o0:.1f}) | 1.00x |" in text, text
    r = next(r for r in rows if r["setup"] == "O0")  # (the memory table is of 1 process's runs)
    assert f"| O0 | {r['param_mb']} | {r['grad_mb']} | {r['optimizer_mb']} |" in precision.memory_table(
        [{**row, "processes": "1"} for row in rows], info)
    native_fp16 = bool({"avx512_fp16", "amx_fp16"} & set(measuring.cpu_flags().split()))
    assert ("this CPU runs bf16 natively" in text) == native_bf16
    assert [line.split(":")[0] for line in info["left_out"]] == [
        dtype for dtype, native in (("bf16", native_bf16), ("fp16", native_fp16)) if not native]
    assert all(f"Left out: {line}." in text for line in info["left_out"])
    flipped = {**info, "native_bf16": not native_bf16,
               "hardware": {**info["hardware"], "cpu_flags": "avx2" if native_bf16 else "avx2 avx512_bf16"}}
    out.with_suffix(".json").write_text(json.dumps(flipped))
    again = precision.render(tmp_path, tmp_path, [])["precision"]
    assert ("this CPU runs bf16 natively" in again) != native_bf16 and again != text


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "clang++")),
                    reason="torch.compile on CPU needs a C++ compiler (g++ or clang++) for TorchInductor")
def test_bench_compile_runs_eager_cold_and_warm(tiny_data, tmp_path):
    out = tmp_path / "compile.csv"
    command = [sys.executable, "scripts/figures/compile/measure.py", str(tiny_data), "--quick", "--epochs", "2",
               "--threads",
               "1", "--csv", str(out), "--runs", str(tmp_path / "runs")]
    result = run_python(command, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["epoch"]) for r in rows] == [(m, e) for m in ("eager", "cold", "warm") for e in "12"]
    assert all(float(r["epoch_s"]) > 0 and r["arch"] == "lenet" and r["torch"] for r in rows)
    assert "cold : first epoch" in result.stdout
    assert list((tmp_path / "runs" / "inductor-cache").rglob("*.py")), "TorchInductor generated no code"
    for mode in ("cold", "warm"):  # the checkpoint of a compiled model loads into a plain one: no _orig_mod. prefix
        state = torch.load(tmp_path / "runs" / mode / "checkpoint.pt", weights_only=True)
        assert not any(key.startswith("_orig_mod.") for key in state["model"]), mode
    text = plot_results(tmp_path, tmp_path / "figures", tmp_path / "RESULTS.md", ())  # the script's own output
    assert f"| eager (no --compile) | {float(rows[0]['epoch_s']):.1f} |" in text
    assert f"| --compile, warm Inductor cache | {float(rows[4]['epoch_s']):.1f} |" in text


def test_bench_io_measures_each_decoder(tmp_path):
    """PIL, TorchCodec and torchvision.io side by side (where TorchCodec is installed; else without it), and the
    tensor decoder's float32 batches."""
    jpegs, out = tmp_path / "jpegs", tmp_path / "io.csv"
    assert run_python([sys.executable, ROOT / "scripts/make_demo_data.py", "--imagenet-like", jpegs, "--classes", "2",
                       "--images", "40"]).returncode == 0
    command = [sys.executable, "scripts/figures/io/measure.py", str(jpegs), "--workers", "0", "1", "--repeats", "1",
               "-b", "8", "--image-size", "64", "--csv", str(out), "--shards", str(tmp_path / "shards"),
               "--storage-workers", "1"]
    result = run_python(command, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    tensor = "torchcodec" if data.decode_image is not None else "torchvision"
    kinds = {("pil", "uint8"), ("torchcodec", "uint8"), ("torchvision", "uint8"), (tensor, "float32")}
    if tensor == "torchvision":
        kinds.remove(("torchcodec", "uint8"))
        assert "TorchCodec is not installed here" in result.stdout
    assert sorted((r["decoder"], r["batches"], r["workers"]) for r in rows) == sorted(
        (*kind, workers) for kind in kinds for workers in ("0", "1"))
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
    text = plot_results(tmp_path, tmp_path / "figures", tmp_path / "RESULTS.md", ("io",))  # the script's own output
    for r in rows:
        assert f"| {r['decoder']} | {r['batches']} | {r['workers']} | {float(r['images_per_s']):.1f} |" in text
    rate = {(r["decoder"], r["batches"], r["workers"]): float(r["images_per_s"]) for r in rows}
    assert f"| tensor | {'TorchCodec' if tensor == 'torchcodec' else 'torchvision.io'} | uint8 | " \
           f"{rate[tensor, 'uint8', '0']:.0f} | {rate[tensor, 'uint8', '1']:.0f} |" in text
    ratio = rate[tensor, "uint8", "0"] / rate["pil", "uint8", "0"]
    assert f"--decoder tensor / PIL, images/s: 0 workers {ratio:.2f}x" in text
    storage = {(r["source"], r["cache"]): r for r in csv.DictReader((tmp_path / "io_storage.csv").open())}
    caches = {cache for _, cache in storage}
    assert caches in ({"cold", "warm"}, {"warm"}) and len(storage) == 2 * len(caches)
    train_bytes = sum(p.stat().st_size for p in (jpegs / "train").rglob("*.jpg"))
    for (source, cache), r in storage.items():  # a whole epoch: 64 train images, each file's bytes read once
        assert int(r["images"]) == 64 and int(r["workers"]) == 1
        read = float(r["read_mb_per_s"]) * 1e6 * float(r["seconds"])
        assert read == pytest.approx(train_bytes, rel=0.005), (source, cache)
        assert float(r["reads_per_image"]) == (2 if source == "folder" else 1), (source, cache)
    assert "Shards / image folder, images/s of a whole epoch on a" in text
    assert f"{loader['normalise_ms_per_batch']:.2f} ms to convert and normalise a batch of 8 at 64 px" in text


def test_bench_scaling_measures_recipes_and_the_bare_loop_side_by_side(tmp_path):
    out = tmp_path / "scaling.csv"
    command = [sys.executable, "scripts/figures/scaling/measure.py", "-a", "lenet", "--image-size", "16", "-b", "128",
               "--processes", "1", "--steps", "5", "--warmup", "1", "--csv", str(out), "--runs", str(tmp_path / "runs"),
               "--parts", "machine"]  # (the cluster's rows: tests/tools/test_cluster.py)
    result = run_python(command, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert sorted((r["kind"], r["recipe"], r["data"]) for r in rows) == [
        ("bare", "ddp", "memory"), ("bare", "nd", "memory"), ("recipe", "ddp", "synthetic"),
        ("recipe", "nd", "synthetic")]
    assert all(float(r["images_per_s"]) > 0 and r["cores"] and r["torch"] for r in rows)
    text = plot_results(tmp_path, tmp_path / "figures", tmp_path / "RESULTS.md", ("scaling_throughput",))
    ddp = next(r for r in rows if (r["kind"], r["recipe"]) == ("recipe", "ddp"))  # the script's own output, drawn
    assert f"| ddp | synthetic | 1 | {float(ddp['images_per_s']):.1f} | {float(ddp['epoch_s']):.1f} | 1.00x |" in text


def test_bench_compression_trains_serial_and_ddp_and_a_restart_trains_only_what_is_missing(tiny_data, tmp_path):
    runs, data = tmp_path / "runs", tmp_path / "data"
    command = [sys.executable, "scripts/figures/compression/measure.py", "--data", str(tiny_data), "--quick",
               "--epochs", "1",
               "--global-batch", "16", "--processes", "2", "--methods", "fp8-e5m2", "--seeds", "0", "--runs", runs,
               "--figures-data", data, "--parts", "accuracy"]  # (the cluster's rows: tests/tools/test_cluster.py)
    result = run_python(command, timeout=300)
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
    (data / "timings.csv").unlink()  # (--parts accuracy is a piece of the part: its row would add to this one)
    result = run_python(command, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(1 run(s) trained now, 2 kept from an earlier start)" in result.stdout
    with open(data / "compression.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["top1"] for r in rows] == first_top1  # the same seed trains to the same accuracy
    timings = {r["part"]: r for r in csv.DictReader(open(data / "timings.csv"))}
    assert timings["compression"]["runs_trained"] == "1" and timings["compression"]["runs_reused"] == "2"

    text = plot_results(data, tmp_path, tmp_path / "RESULTS.md", ("compression",))
    assert "| fp8-e5m2 + error feedback | 2 | 1 |" in text


def test_bench_curves_keep_each_recipe_and_seed_and_only_this_runs(tiny_data, tmp_path):
    data = tmp_path / "data"
    (data / "curves").mkdir(parents=True)
    (data / "curves" / "nd.csv").write_text("stale\n")  # an earlier layout: not drawn beside the new runs
    command = [sys.executable, "scripts/figures/curves/measure.py", "--data", tiny_data, "--quick", "--epochs", "2",
               "--global-batch", "16", "--seeds", "3", "--runs", tmp_path / "runs", "--figures-data", data]
    result = run_python(command, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    native_bf16 = bool({"avx512_bf16", "amx_bf16"} & set(measuring.cpu_flags().split()))  # (the suite: CPU only)
    names = ["apex", "ddp", "ddp-vit", "nd"] + (["apex-low", "apex-O2"] if native_bf16 else [])
    assert sorted(p.name for p in (data / "curves").iterdir()) == sorted(
        [f"{name}-seed3.{suffix}" for name in names for suffix in ("csv", "json")] + ["hardware.json"] +
        ([] if native_bf16 else ["left_out.json"]))
    precision = {"apex": ("O0", "fp32"), "apex-low": ("O1", "bf16"), "apex-O2": ("O2", "bf16")}
    for name in names:
        summary = json.loads((data / "curves" / f"{name}-seed3.json").read_text())
        assert summary["world_size"] == (1 if name == "nd" else 2) and summary["global_batch"] == 16
        assert summary["epochs"] == 2 and (summary.get("opt_level"), summary.get("precision")) == precision.get(
            name, (None, None))
        assert json.loads((tmp_path / "runs" / f"{name}-seed3" / "args.json").read_text())["seed"] == 3
        assert summary["arch"] == ("vit_tiny" if name == "ddp-vit" else "lenet"), (name, summary["arch"])
    text = plot_results(data, tmp_path / "figures", tmp_path / "RESULTS.md", ("curves_top1_val",
                                                                              ))  # the script's output
    with open(data / "curves" / "ddp-seed3.csv", newline="") as f:
        final = float([r for r in csv.DictReader(f) if r["split"] == "val"][-1]["top1"])
    assert f"| ddp | 2 | 1 | 2 | {final:.2f} | " in text, text[:1500]  # (one seed: no range)
    assert "| apex O0 (fp32) | 2 |" in text and ("| apex O1 bf16 | 2 |" in text) == native_bf16
    assert ("| apex O2 bf16 | 2 |" in text) == native_bf16
    assert "| ddp vit_tiny | 2 | 1 | 2 |" in text and "lenet (vit_tiny where named), global batch 16" in text
    assert ("no native bf16" in text) != native_bf16


def test_bench_ps_plans_each_figure_of_the_authors_in_its_regime_for_each_seed(tiny_data, tmp_path):
    runs = ps_table.plan([0, 1, 2])
    per_seed = 4 * 6 + 4 * 6 + 3 * 4 + 3 * 4 + 2 * 4 + 5 * 2 + 4 * 3 + 7 + 1 + 2 + 3  # sync-1v, sync-2v, async-1v,
    # async-2v, async-delay, zeno, zeno++, eta and its baseline, batch, speed
    assert len(runs) == 3 * per_seed and len(set(runs)) == len(runs) and {run[-1] for run in runs} == {0, 1, 2}
    args = ps_table.argparse.Namespace(data=tiny_data, epochs=3, quick=False, runs=tmp_path / "runs")

    def value(flags, flag):
        return flags[flags.index(flag) + 1]
    recipe, processes, flags = ps_table.flags_of("sync-1v", "sync", "zenops", "random x8", None, 0, args)
    assert (recipe, processes) == ("ps", 10) and value(flags, "--validators") == "1"  # ZenoPS's one validator
    assert value(flags, "--worker-subsample") == "0.5" and value(flags, "--local-steps") == "8"
    assert value(flags, "--attack") == "random" and value(flags, "--attack-scale") == "8"
    assert value(flags, "--attack-draw") == "tensor" and value(flags, "--attack-prob") == "0.2"
    assert value(flags, "--validation-split") == "0.1111"  # a worker's share, 1 / (8 + 1)
    recipe, processes, flags = ps_table.flags_of("sync-2v", "sync", "zenops", "signflip x6", None, 0, args)
    assert processes == 11 and "--worker-subsample" not in flags and value(flags, "--attack-scale") == "6"
    recipe, processes, flags = ps_table.flags_of("async-1v", "async", "naive-async", "signflip x2", None, 0, args)
    assert processes == 9 and value(flags, "--aggregate") == "naive-async" and value(flags, "--attack-scale") == "2"
    assert value(flags, "--validation-split") == "0.1111"  # no validator, the same shards as the zenops row's
    recipe, processes, flags = ps_table.flags_of("async-delay", "async", "zenops", "none", None, 0, args)
    assert processes == 10 and value(flags, "--worker-delay") == "0.8"  # (a tenth of ZenoPS's 1 s x 8 workers)
    recipe, processes, flags = ps_table.flags_of("sync-1v", "sync", "trimmed-mean", "none", None, 0, args)
    assert value(flags, "--trim-ratio") == "0.2" and "--zeno-b" not in flags  # ZenoPS's b, from each round's n
    recipe, processes, flags = ps_table.flags_of("async-2v", "async", "zenops", "N(0,1)", None, 0, args)
    assert processes == 12 and value(flags, "--servers") == "2" and value(flags, "--validators") == "2"
    recipe, processes, flags = ps_table.flags_of("batch", "sync", "zenops, batch 32", "none", None, 0, args)
    assert value(flags, "--worker-subsample") == "0.5" and processes == 10  # sync-1v's zenops
    # (the last flags win) the tiny data's 1 round an epoch at any batch: as many epochs; the same lr a step
    assert flags[-8:] == ["-b", "32", "--epochs", "3", "--warmup-epochs", "1", "--lr", "0.025"]
    for index in range(4000):  # the digits' 4000: 445 images a worker, 6 rounds of 8 steps at 8, 3 at 16, 1 at 32
        (tmp_path / "digits" / "train" / "0").mkdir(parents=True, exist_ok=True)
        (tmp_path / "digits" / "train" / "0" / f"{index}.png").touch()
    assert [ps_table.rounds_per_epoch(tmp_path / "digits", b) for b in (8, 16, 32)] == [6, 3, 1]
    recipe, processes, flags = ps_table.flags_of("zeno", "sync", "zeno, 1 step", "3 of 8 flip x4", None, 0, args)
    assert value(flags, "--zeno-b") == "5" and value(flags, "--byzantine") == "3" and "--local-steps" not in flags
    recipe, processes, flags = ps_table.flags_of("zeno++", "async", "zeno++, 1 step", "signflip x10, p 0.4 per push",
                                                 None, 1, args)
    assert processes == 10 and value(flags, "--attack-draw") == "push" and value(flags, "--momentum") == "0"
    assert value(flags, "--clean-epochs") == "1"  # Zeno++'s attack-free first epoch
    recipe, processes, flags = ps_table.flags_of("sync-1v", "sync", "phocas", "4 of 8 flip x1.2", None, 0, args)
    assert value(flags, "--byzantine") == "4" and value(flags, "--attack-scale") == "1.2" and processes == 9
    recipe, processes, flags = ps_table.flags_of("sync-2v", "sync", "mean", "ALIE, 4 of 8", None, 0, args)
    assert value(flags, "--attack") == "alie" and value(flags, "--byzantine") == "4" and "--attack-prob" not in flags
    recipe, processes, flags = ps_table.flags_of("eta", "sync", "zenops", "N(0,1)", -0.01, 1, args)
    assert value(flags, "--zeno-eta") == "-0.01" and value(flags, "--attack") == "gaussian"
    assert value(flags, "--validators") == "2" and "--worker-subsample" not in flags  # the two-validator runs
    assert ps_table.flags_of("speed", "ddp", "ddp", "none", None, 0, args)[:2] == ("ddp", 8)
    recipe, processes, flags = ps_table.flags_of("speed", "sync", "ps sync, mean, 1 step", "none", None, 0, args)
    assert (recipe, processes) == ("ps", 9) and "--local-steps" not in flags
    recipe, processes, flags = ps_table.flags_of("eta", "nd", "validation data only", "none", None, 0, args)
    assert (recipe, processes) == ("nd", 1) and value(flags, "-b") == "8"  # one worker's batch
    assert flags.count("--lr") == 1 and value(flags, "--lr") == "0.4"  # half a worker's step: 0.4 x 8 = 0.1 x 64 / 2
    assert value(flags, "--epochs") == "3"  # a ninth of the data for as many steps as a worker on its ninth
    quick = ps_table.plan([0], quick=True)
    assert {part for part, *_ in quick} == {"sync-1v", "zeno++", "eta", "speed"} and len(quick) < 15
    folder = ps_table.validation_only_data(tiny_data, 0, 0.5, tmp_path / "held")
    assert len(list((folder / "train").rglob("*.png"))) == 24  # half of the 48 train images
    assert sorted(p.name for p in (folder / "val").iterdir()) == ["blue", "green", "red"]


def test_the_ps_learning_rates_and_placements_stated_are_the_ones_the_bench_passes(tiny_data, tmp_path):
    """What the docstrings and docs/results/ps.md say of the table's learning rates and of where naive-async runs is
    what flags_of passes the recipe, and what ps.csv's rows ran at."""
    args = ps_table.argparse.Namespace(data=tiny_data, epochs=3, quick=False, runs=tmp_path / "runs")
    recipe_lr = ps_table.last_flag(measuring.ACCURACY, "--lr")
    docs, docstring = (ROOT / "docs/results/ps.md").read_text(), " ".join(ps_table.__doc__.split())
    assert f"--lr {recipe_lr} for 256 images" in docstring and f"`--lr` {recipe_lr} for 256 images" in docs
    zeno_pp = f"{ps_table.ZENO_PP_LR:g}"
    assert f"--lr {zeno_pp} for 256: their 0.1 for 128" in docstring and f"(`--lr` {zeno_pp} for 256 images" in docs
    assert ps_table.ZENO_PP_LR * 128 / 256 == 0.1  # AsyncByzGrad's 0.1 for a batch of 128, an image alike
    for label, *_ in ps_table.PARTS["zeno++"][1]:  # at 8 and at 32: its authors' rate an image, no momentum
        flags = ps_table.flags_of("zeno++", "async", label, "none", None, 0, args)[2]
        assert ps_table.last_flag(flags, "--lr") == zeno_pp and ps_table.last_flag(flags, "--momentum") == "0", label
    for part in ("async-1v", "async-2v"):  # naive-async on the servers, and where ZenoPS runs it: in the validators
        for label, *_ in ps_table.PARTS[part][1]:
            flags = ps_table.flags_of(part, "async", label, "none", None, 0, args)[2]
            in_validators = "--validators" in flags
            assert in_validators == (label != "naive-async"), label
            assert ("in the validator" in label) == (in_validators and "naive-async" in flags), label
    rows = [r for r in measuring.read_csv(ROOT / "figures/data/ps.csv") if r["part"] == "zeno++"]
    assert rows and {(r["lr"], r["momentum"]) for r in rows} == {(zeno_pp, "0")}  # what the table's runs used


def test_bench_pipeline_plans_each_sync_layout_and_schedule_with_and_without_stragglers(tiny_data):
    runs = pipeline_measure.plan([0, 1, 2])
    sync = [run for run in runs if run[0] == "sync"]
    assert len(sync) == 3 * (3 + 3 * 2) * 4 * 2 and len(set(runs)) == len(runs)  # one stage: pipedream alone
    assert {(s, stragglers, stages, replicas, schedule) for _, s, stragglers, stages, replicas, schedule, *_
            in sync} == {(s, h, stages, replicas, schedule) for s in pipeline_measure.SYNCS for h in (False, True)
                         for stages, replicas in ((1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2))
                         for schedule in (["pipedream"] if stages == 1 else ["pipedream", "1f1b"])}
    for seed in (0, 1, 2):  # X is sized from allreduce's run without stragglers: it comes first in its layout
        order = [run for run in sync if run[-1] == seed]
        for run in order:
            if run[2]:
                assert order.index(("sync", "allreduce", False, *run[3:])) < order.index(run)
    assert {run[6] for run in sync if run[5] == "1f1b"} == {2, 4}  # 1f1b: S microbatches
    time = [run for run in runs if run[0] == "time"]  # (pipedream with stragglers; X from its own allreduce first)
    layouts = ((1, 4), (1, 8), (2, 2), (2, 4), (4, 2))
    assert sorted(time) == sorted([("time", s, True, stages, replicas, "pipedream", 1, seed) for seed in (0, 1, 2)
                                   for stages, replicas in layouts for s in pipeline_measure.SYNCS] +
                                  [("time", "allreduce", False, *layout, "pipedream", 1, 0) for layout in layouts])
    assert runs.index(time[0]) > runs.index(sync[-1])
    bubble = [(schedule, m) for part, _, _, _, _, schedule, m, _ in runs if part == "bubble"]
    assert ("gpipe", 1) in bubble and ("1f1b", 1) not in bubble and len(bubble) == 5 + 4  # 1f1b needs M >= S
    args = pipeline_measure.argparse.Namespace(data=tiny_data, epochs=1, quick=False)
    processes, flags = pipeline_measure.flags_of("sync", "hetpipe", 0.0409, 2, 4, "1f1b", 2, 1, args)
    assert processes == 10 and flags[flags.index("--hetero") + 1] == "0.0409"  # 4 replicas x 2 stages, 2 servers
    assert flags[flags.index("-b") + 1] == "8" and flags[flags.index("--microbatches") + 1] == "2"
    processes, flags = pipeline_measure.flags_of("sync", "preduce", 0.0, 1, 8, "pipedream", 1, 1, args)
    assert processes == 8 and flags[flags.index("--stages") + 1] == "1" and flags[flags.index("--hetero") + 1] == "0"
    processes, flags = pipeline_measure.flags_of("time", "hetpipe", 0.03, 2, 2, "pipedream", 1, 0, args)
    assert flags[flags.index("--epochs") + 1] == str(pipeline_measure.TIME_EPOCHS) and processes == 2 * 3
    processes, flags = pipeline_measure.flags_of("bubble", "allreduce", 0.0, 2, 1, "gpipe", 16, 0, args)
    assert processes == 2 and flags[flags.index("-b") + 1] == "256" and flags[flags.index("--epochs") + 1] == "1"
    assert len(pipeline_measure.plan([0], quick=True)) == 2 * 2 + 2 * 2 * 2 + 3  # and the bubble's 3
    assert pipeline_measure.straggler_sleep(0.05) == 0.1  # c / X = 0.5


def test_the_model_of_what_stragglers_cost():
    # one replica, 2 slots at q 0.1: E[delay] = 2 x 0.1 x X; two: 1 - 0.81^2 (one sleep or more) + 1 - 0.99^2 (two)
    assert abs(pipeline_measure.expected_max(1, 2, 0.1, 1.0) - 0.2) < 1e-12
    assert abs(pipeline_measure.expected_max(2, 2, 0.1, 1.0) - (1 - 0.81 ** 2 + 1 - 0.99 ** 2)) < 1e-12
    assert pipeline_measure.expected_max(3, 4, 0.0, 1.0) == 0 and pipeline_measure.expected_max(3, 4, 1.0, 1.0) == 4
    c, x = 0.01, 0.02
    # a core per process: c + E[the largest delay] for allreduce; 2 S slots per minibatch, whatever M
    for replicas, stages in ((2, 1), (8, 1), (2, 2), (4, 2)):
        step = pipeline_measure.expected_step("allreduce", c, replicas, stages, 100, x, replicas * stages, 64)
        assert abs(step - c - pipeline_measure.expected_max(replicas, 2 * stages, 0.1, x)) < 1e-12
    steps = {sync: pipeline_measure.expected_step(sync, c, 8, 1, 62, x, 8, 8) for sync in pipeline_measure.SYNCS}
    assert steps["preduce"] < steps["adpsgd"] < steps["allreduce"] and steps["hetpipe"] < steps["allreduce"]
    # hetpipe waits at the epoch's end only: the longer the epoch, the nearer its step to c + a replica's own delay
    own = c + 2 * 0.1 * x
    assert own < pipeline_measure.expected_step("hetpipe", c, 8, 1, 1000, x, 8, 8) < steps["hetpipe"] < own + 0.002
    # 8 processes on 2 cores: one computes in c / 4 alone, so a sleep shorter than 3 c / 4 costs a method that waits
    # for nobody nothing (the others use the core), and the lockstep ones lose less than with a core each
    assert pipeline_measure.expected_step("hetpipe", c, 8, 1, 1000, 0.5 * c, 8, 2) < c * 1.02  # (the epoch's end)
    assert c < pipeline_measure.expected_step("allreduce", c, 8, 1, 62, x, 8, 2) < steps["allreduce"]


def test_the_zero_model_divides_what_each_mode_shards():
    p, n = 1000, 4  # parameters, processes: 4 bytes each for weights, gradients and momentum
    assert [sharding_measure.model_bytes(mode, p, n) for mode in sharding_measure.MODES] == [12000, 9000, 6000, 3000]
    assert all(sharding_measure.model_bytes(mode, p, 1) == 12000 for mode in sharding_measure.MODES)
    assert [sharding_measure.comm_bytes(mode, p, n) for mode in sharding_measure.MODES] == [6000, 9000, 6000, 9000]
    assert all(sharding_measure.comm_bytes(mode, p, 1) == 0 for mode in sharding_measure.MODES)


def test_bench_sharding_without_data_says_so_in_one_line(tmp_path):
    result = run_python([sys.executable, "scripts/figures/sharding/measure.py", "--data", tmp_path / "none"],
                        timeout=120)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "has no train/ folder" in result.stderr
