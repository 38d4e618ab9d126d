"""The GPU sweep's plan and the one-GPU check, on a machine without a GPU: what they would run, and one line
where they cannot."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, child_env

sys.path.insert(0, str(ROOT))
from scripts import bench_gpu, gpu_plan, measuring  # noqa: E402


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
    runs, skipped = gpu_plan.plan(args, [1, 2])
    assert {gpus for _, _, gpus, *_ in runs["compression"]} == {2} and "compression" in skipped
    # each part within 9 minutes on one H100 by --list's model, with make figures-gpu's 20,000 + 5,000 JPEGs
    monkeypatch.setattr(gpu_plan, "train_images", lambda args, data, split="train": {"synthetic": 12800}.get(
        data, 20000 if split == "train" else 5000))
    runs, _ = gpu_plan.plan(args, [1])
    minutes = {part: gpu_plan.estimated_minutes(args, runs[part], cores=16) for part in ("synthetic", "jpeg")}
    assert all(3 < m < 9 for m in minutes.values()), minutes
    # a part measured again replaces its own rows and keeps the others' (a resumed make figures-gpu ONLY=jpeg)
    data = tmp_path / "throughput.csv"
    measuring.write_csv(data, bench_gpu.THROUGHPUT_FIELDS, [{"data": d, "gpus": 1} for d in ("synthetic", "jpeg")])
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
    assert gpu_plan.gpu_counts(1) == [1] and gpu_plan.gpu_counts(8) == [1, 2, 4, 8]
    assert gpu_plan.gpu_counts(6) == [1, 2, 4, 6] and gpu_plan.gpu_counts(8, [4, 2, 4]) == [2, 4]
    with pytest.raises(SystemExit) as stopped:
        gpu_plan.gpu_counts(2, [4])
    assert stopped.value.code == 2
    runs = [(data, *run) for data in ("synthetic", "jpeg") for run in gpu_plan.precision_runs(2, data)]
    assert len(runs) == len({name for _, name, *_ in runs}) == 2 * (2 + 3 * 2) + 1
    flags = {(recipe, data, decoder, precision, channels_last): extra
             for data, _, recipe, decoder, precision, channels_last, extra in runs}
    assert flags["dp", "jpeg", "tensor", "fp32", False] == [] and flags["ddp", "synthetic", "", "fp32", False] == []
    assert flags["apex", "synthetic", "", "fp32", True] == ["--opt-level", "O0", "--channels-last"]
    assert flags["apex", "jpeg", "tensor", "fp16", False] == ["--opt-level", "O1", "--amp-dtype", "fp16"]
    assert flags["apex", "jpeg", "tensor", "bf16", True] == ["--opt-level", "O1", "--amp-dtype", "bf16",
                                                             "--channels-last"]
    assert flags["apex", "jpeg", "gpu", "fp16", True][-2:] == ["--decoder", "gpu"]  # nvjpeg, the best set-up once
    for gpus in gpu_plan.gpu_counts(8):  # each GPU count of an 8-GPU node: the same layouts, each run named apart
        for data in ("synthetic", "jpeg"):
            layouts = [run[1:] for run in gpu_plan.precision_runs(gpus, data)]
            assert layouts == [run[1:] for run in gpu_plan.precision_runs(2, data)], (gpus, data)
    names = [r[0] for gpus in gpu_plan.gpu_counts(8) for data in ("synthetic", "jpeg")
             for r in gpu_plan.precision_runs(gpus, data)]
    assert len(names) == len(set(names)) == 4 * (2 * (2 + 3 * 2) + 1)
    compression = gpu_plan.compression_runs(4)
    assert [(method, ef) for _, method, ef, _ in compression] == gpu_plan.COMPRESSION
    assert compression[-1][3] == ["--compress", "powersgd", "--error-feedback"]
    assert gpu_plan.epochs_for(12800, 1, 256, 40) == (2, 50)  # one warm-up epoch, then 50 timed steps
    assert gpu_plan.epochs_for(12800, 8, 256, 40) == (8, 6)  # 7 epochs of 6 steps after the warm-up


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


def test_the_precision_part_on_gpus_runs_fp16_and_bf16_per_gpu_and_goes_on_where_a_lease_stopped(tmp_path,
                                                                                                   monkeypatch):
    """bench_precision.py on (a stand-in for) 2 GPUs: one process per GPU on the first N of those the scheduler
    gave, ResNet-50 at 224 px with loader workers, fp16 and bf16 at each level, --compile at one GPU only; the
    CSV written after every run; --max-runs and --minutes leave runs for the next command, which
    --skip-measured goes on with."""
    from scripts import bench_precision

    launched = []

    def fake_train(recipe, processes, flags, out, threads, env=None, launcher=None):
        launched.append((recipe, processes, [str(f) for f in flags], env["CUDA_VISIBLE_DEVICES"], launcher))
        out.mkdir(parents=True)
        (out / "metrics.csv").write_text("epoch,split,loss,top1,top5,images_per_s,data_s,epoch_s,lr\n"
                                         f"1,train,1,1,1,{100 * len(launched)},0,5,0.1\n")
        level = flags[flags.index("--opt-level") + 1] if "--opt-level" in flags else None
        dtype = flags[flags.index("--amp-dtype") + 1] if "--amp-dtype" in flags else "bf16"
        return {"opt_level": level, "precision": "fp32" if level in (None, "O0") else dtype} if level else {}

    monkeypatch.setattr(bench_precision.measuring, "train", fake_train)
    monkeypatch.setattr(bench_precision.measuring, "hardware", lambda: {"cpu": "Test CPU", "cores": 16,
                                                                        "gpu": "2 x Test GPU", "torch": "2.11.0"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    out = tmp_path / "gpu" / "precision.csv"

    def bench(*flags):
        monkeypatch.setattr(sys, "argv", ["bench_precision.py", "--csv", str(out), "--runs", str(tmp_path / "runs"),
                                          *flags])
        bench_precision.main()

    bench("--max-runs", "3")
    assert [(recipe, processes, gpus) for recipe, processes, _, gpus, _ in launched] == [
        ("ddp", 1, "6"), ("apex", 1, "6"), ("apex", 1, "6")]
    flags = launched[1][2]
    assert flags[flags.index("-a") + 1] == "resnet50" and flags[flags.index("--image-size") + 1] == "224"
    assert flags[flags.index("-b") + 1] == "256" and flags[flags.index("-j") + 1] == "4"
    assert launched[0][4][2:] == [20 * 256, 256]  # 20 steps of 256, one validation batch
    assert [r["setup"] for r in measuring.read_csv(out)] == ["ddp", "O0", "O0 + compile"]
    info = json.loads(out.with_suffix(".json").read_text())
    assert info["native_fp16"] and info["native_bf16"] and info["left_out"] == []
    runs = bench_precision.planned(False, True, True, [1, 2], 3)
    at = {gpus: [setup[0] for round_, p, setup in runs if p == gpus and round_ == 1] for gpus in (1, 2)}
    assert len(at[1]) == 17 and len(at[2]) == 11 and len(runs) == 3 * 28
    assert {"O1 fp16 + channels_last + compile", "O3 bf16 + channels_last"} <= set(at[1])
    assert not [name for name in at[2] if "compile" in name] and "O1 fp16 + channels_last" in at[2]
    assert [round_ for round_, *_ in runs] == sorted(round_ for round_, *_ in runs)  # round by round
    launched.clear()
    bench("--skip-measured", "--max-runs", "2", "--repeats", "1")  # the next lease goes on where this one stopped
    assert [flags[-2:] for _, _, flags, _, _ in launched] == [["O0", "--channels-last"],
                                                              ["--channels-last", "--compile"]]
    assert len(measuring.read_csv(out)) == 5
    launched.clear()
    bench("--skip-measured", "--minutes", "0.1")  # no run fits: nothing launched, nothing lost
    assert launched == [] and len(measuring.read_csv(out)) == 5
    from scripts.results import gpu

    text = gpu.gpu_sections(tmp_path / "gpu", tmp_path)["gpu-precision"]
    assert "| set-up | 1 GPU: images/s | vs O0 |" in text and "On 2 x Test GPU, one process per GPU" in text
    assert "| O0 + compile | 300.0 (300.0–300.0) | 1.50x |" in text
    launched.clear()
    bench("--skip-measured", "--processes", "2", "--max-runs", "1")  # 2 GPUs: a process on each of the two given
    assert [(recipe, processes, gpus) for recipe, processes, _, gpus, _ in launched] == [("ddp", 2, "6,7")]
    assert launched[0][4][2:] == [20 * 256 * 2, 256 * 2]
