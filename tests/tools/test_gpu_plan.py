"""The GPU table's plan, its measuring and the one-GPU check, on a machine without a GPU: what they would run,
what they write, and one line where they cannot."""

import json
import statistics
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import ROOT, child_env, run_python

sys.path.insert(0, str(ROOT))
from scripts.figures.gpu import measure as gpu_measure
from scripts.gpu import check as gpu_check
from scripts.figures.gpu import plan as gpu_plan
from scripts.gpu import smoke as gpu_smoke
from scripts.figures import measuring
from scripts.figures.gpu import step_times

DECODE = {"tensor": 1000.0, "pil": 800.0}


@pytest.mark.parametrize("script, flags, message", [
    ("scripts/gpu/count_syncs.py", ["--json", "x.json", "recipes/ddp/train.py"],
     "counts CUDA synchronisations, and no CUDA GPU"),
    ("scripts/figures/examples/measure.py", ["data/none", "--examples", "main.py"], "data/none has no train/ folder"),
    ("scripts/figures/examples/measure.py", ["{tiny}", "--examples", "no/main.py"],
     "--examples no/main.py is not a file")])
def test_the_gpu_and_parity_tools_refuse_in_one_line(tiny_data, script, flags, message):
    flags = [flag.replace("{tiny}", str(tiny_data)) for flag in flags]
    result = run_python([sys.executable, script, *flags], timeout=120)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr


def test_gpu_smoke_plans_every_recipe_s_one_gpu_path_and_refuses_without_cuda():
    listed = run_python([sys.executable, "scripts/gpu/smoke.py", "--list"], timeout=120)
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
    ema = plan["syncs-per-step-apex-fp16-ema"]
    assert "--amp-dtype fp16" in ema and "--ema-decay" in ema
    result = run_python([sys.executable, "scripts/gpu/smoke.py"], timeout=120)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "no CUDA GPU here" in result.stderr


def test_the_smoke_s_passes_hold_on_a_gpu_of_the_same_compute_capability_and_torch(tmp_path):
    """An H100's passes hold on an H200 (both 9.0) with the same torch: the smoke is not run again there; another
    capability or another torch runs it all."""
    report = tmp_path / "smoke.json"
    report.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "capability": "9.0", "torch": "2.11.0+cu130",
                                  "checks": [{"check": "nd", "ok": True}, {"check": "dp", "ok": False}]}))
    names = {"nd", "dp"}
    assert [c["check"] for c in gpu_smoke.passed_before(report, "9.0", "2.11.0+cu130", names)] == ["nd"]
    assert gpu_smoke.passed_before(report, "8.0", "2.11.0+cu130", names) == []  # an A100
    assert gpu_smoke.passed_before(report, "9.0", "2.14.1+cu130", names) == []
    assert gpu_smoke.passed_before(tmp_path / "none.json", "9.0", "2.11.0+cu130", names) == []


def test_the_gpu_table_plans_every_set_up_a_user_chooses_between_in_one_command(tmp_path, monkeypatch):
    """At 1 GPU: ddp fp32; apex O0 + channels_last; O1 fp16 and bf16 with channels_last, fp16 also with
    --compile; O2 fp16 with channels_last; the bare loop in fp32 and at the fastest set-up (not an O2
    one); that set-up on JPEGs under each --decoder. On a GPU not measured yet, with the smoke's passes carried
    over, all of it fits one command of 9 minutes by the model, which counts a compile cold once and warm after
    it."""
    runs = gpu_plan.table_plan(16, DECODE, (20000, 5000))
    planned = {name: (setup, seconds) for setup, name, seconds in runs}
    flags = {name: gpu_plan.recipe_flags(setup) for name, (setup, _) in planned.items()}
    assert list(planned) == ["ddp fp32", "apex O0 fp32 + channels_last", "apex O1 fp16 + channels_last",
                             "apex O1 fp16 + channels_last + compile", "apex O1 bf16 + channels_last",
                             "apex O2 fp16 + channels_last",
                             "bare loop fp32",
                             "bare loop at the fastest set-up", "the fastest set-up, JPEGs, --decoder tensor",
                             "the fastest set-up, JPEGs, --decoder pil", "the fastest set-up, JPEGs, --decoder gpu"]
    assert flags["ddp fp32"] == [] and flags["apex O0 fp32 + channels_last"] == ["--opt-level", "O0",
                                                                                 "--channels-last"]
    assert flags["apex O1 fp16 + channels_last + compile"] == ["--opt-level", "O1", "--amp-dtype", "fp16",
                                                               "--channels-last", "--compile"]
    assert flags["apex O2 fp16 + channels_last"] == ["--opt-level", "O2", "--amp-dtype", "fp16", "--channels-last"]
    fastest = gpu_plan.assumed_fastest()
    assert fastest == gpu_plan.Setup("recipe", "apex", "", "fp16", True, True, "O1")  # (the model's; measured on a GPU)
    assert planned["bare loop at the fastest set-up"][0] == fastest._replace(kind="bare", recipe="", opt_level="")
    assert [planned[f"the fastest set-up, JPEGs, --decoder {d}"][0] for d in ("tensor", "pil", "gpu")] == [
        fastest._replace(decoder=d) for d in ("tensor", "pil", "gpu")]
    seconds = {name: s for name, (_, s) in planned.items()}
    compile_s = gpu_plan.MODEL_COMPILE_S
    assert seconds["apex O1 fp16 + channels_last + compile"] - seconds["apex O1 fp16 + channels_last"] > \
        compile_s["cold"] - 5  # cold, then warm for the same graph on JPEGs
    assert seconds["the fastest set-up, JPEGs, --decoder gpu"] < 2 * compile_s["cold"]
    # each set-up once per GPU and torch: what a GPU measured is left out of its next command's plan
    assert [name for _, name, _ in gpu_plan.table_plan(16, DECODE, (20000, 5000), measured={"ddp fp32"})] == \
        list(planned)[1:]
    smoke = {"capability": "9.0", "torch": "2.11.0", "checks": [{"check": c[0], "ok": True, "seconds": 15}
                                                                for c in gpu_smoke.checks()]}
    (tmp_path / "smoke.json").write_text(json.dumps(smoke))
    monkeypatch.setattr(gpu_check, "GPU_DATA", tmp_path)
    commands = gpu_check.command_plan(9)
    (total, lines) = commands[0]
    profiles = [line for _, lines in commands for line in lines if "the profile of" in line]
    assert total <= 9 * 60 - gpu_check.MARGIN_S and "0 of 35 checks to run" in lines[1]
    assert [line.split(" s  ", 1)[1] for line in lines[2:] if "the profile of" not in line] == list(planned)  # the
    # whole table in one command, then the profiles where a target misses
    assert len(profiles) == 2 and all(len(lines) == 2 for _, lines in commands[1:])
    smoke["checks"] = smoke["checks"][:10]  # a new torch: the smoke's 25 other checks first, then the rest
    (tmp_path / "smoke.json").write_text(json.dumps(smoke))
    again = gpu_check.command_plan(9)
    assert sum(seconds for seconds, _ in again) > sum(seconds for seconds, _ in commands) + 300
    assert all(seconds <= 9 * 60 - gpu_check.MARGIN_S for seconds, _ in again)
    assert [line.split(" s  ", 1)[1] for _, lines in again for line in lines[2 if lines is again[0][1] else 1:]
            if "profile" not in line] == list(planned)
    result = run_python([sys.executable, "scripts/gpu/check.py", "--plan"], timeout=120)
    assert result.returncode == 0 and "command 1: about" in result.stdout and "ddp fp32" in result.stdout


def test_the_bare_loop_is_plain_pytorch_in_the_set_up_it_is_given(tmp_path):
    """scripts/figures/bare_loop.py imports nothing of the recipes but the model, and runs the precision and layout it
    is asked for: each timed step a mark."""
    for flags, precision, channels_last in ((["--precision", "bf16", "--channels-last"], "bfloat16", True),
                                            ([], "float32", False)):
        out = tmp_path / f"{precision}.json"
        result = subprocess.run([sys.executable, "scripts/figures/bare_loop.py", "-a", "lenet", "--image-size", "16",
                                 "-b", "4",
                                 "--warmup", "1", "--steps", "3", *flags, "--json", str(out)], cwd=ROOT,
                                env=child_env(), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        found = json.loads(out.read_text())
        assert len(found["steps"]) == 3 and all(s > 0 for s in found["steps"])
        assert found["ran"]["modules"] == ["recipes", "recipes.common", "recipes.common.models"]
        assert found["ran"]["precision"] == precision and found["ran"]["channels_last"] == channels_last


def test_step_times_marks_each_step_of_a_recipe_and_profiles_its_last_epoch(tmp_path):
    """The launcher times every step after the first of each epoch, and moves --profile into the middle of the last
    epoch; the trace's summary names where a step's time went."""
    out = tmp_path / "run"
    result = run_python([sys.executable, "scripts/figures/gpu/step_times.py", "--epoch-images", "96",
                         "--val-images", "8", "--profile-last-epoch", "recipes/apex/train.py", "--synthetic",
                         "-a", "lenet", "--image-size", "16", "-b", "8", "-j", "0", "--epochs", "2", "-p", "1000",
                         "--profile", "3", "--out", str(out)], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads((out / "steps.json").read_text())
    assert found["device"] == "cpu" and [len(e) for e in found["epochs"]] == [11, 11]
    trace = json.loads(next((out / "profile").glob("*.json")).read_text())
    profiled = sorted(int(e["name"].split("#")[1]) for e in trace["traceEvents"] if e.get("name", "").startswith(
        "ProfilerStep#"))
    assert profiled == [16, 17, 18]  # (counted from 0) steps 17 to 19 of 24: the 5th to 7th of the second epoch
    summary = step_times.summarize(out / "profile", 3)
    assert summary["step_ms"] > 0 and summary["busy_ms"] is None and summary["top"]
    assert any(item["name"].startswith("aten::conv2d") for item in summary["top"])
    assert sum(item["share"] for item in summary["top"]) <= 1
    assert step_times.stats([0.010, 0.012, 0.011], 8) == {"steps": 3, "step_ms": 11.0, "step_ms_p10": 10.2,
                                                          "step_ms_p90": 11.8, "images_per_s": 727.3}


def fake_runs(monkeypatch, rates, launched):
    """measuring.train and measuring.run without a recipe: each set-up steps at rates[its name] images/s (a batch of
    more than 64 runs out of GPU memory), and the files they would write; each run takes 30 s of bench_gpu's
    clock."""
    clock = [0.0]
    monkeypatch.setattr(gpu_measure, "STARTED", 0.0)
    monkeypatch.setattr(gpu_measure, "time", types.SimpleNamespace(time=lambda: clock[0],
                                                                   perf_counter=lambda: clock[0]))

    def steps_of(batch, name):
        clock[0] += 30
        return [batch / rates[name] * f for f in (0.9, 1.0, 1.0, 1.1)]

    def fake_train(recipe, processes, flags, out, threads, env=None, check=True, echo=None, launcher=None):
        batch = int(flags[flags.index("-b") + 1])
        launched.append((echo, recipe, processes, [str(f) for f in flags], [str(f) for f in launcher], env))
        out.mkdir(parents=True, exist_ok=True)
        if batch > 64:
            (out / "failed.log").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
            return None
        (out / "steps.json").write_text(json.dumps({"epochs": [[1.0], steps_of(batch * processes, echo)]}))
        (out / "metrics.csv").write_text("epoch,split,loss,top1,top5,images_per_s,data_s,epoch_s,lr\n"
                                         "1,train,1,1,1,1,0,9,0.1\n2,train,1,1,1,1,0.5,2,0.1\n")
        (out / "launch_seconds").write_text("30.0\n")
        (out / "checkpoint.pt").write_bytes(b"weights")
        if "--profile" in flags:
            (out / "profile").mkdir()
            (out / "profile" / "trace.json").write_text(json.dumps({"traceEvents": [
                {"ph": "X", "cat": "kernel", "name": "sm90_conv", "ts": 0, "dur": 3000},
                {"ph": "X", "cat": "kernel", "name": "elementwise", "ts": 4000, "dur": 1000},
                {"ph": "X", "cat": "cpu_op", "name": "enumerate(DataLoader)#_Iter.__next__", "ts": 0, "dur": 500}]}))
        return {"top1": 1.0}

    def fake_run(processes, script_and_flags, threads, env=None, check=True, echo=None):
        flags = script_and_flags
        launched.append((echo, "bare", processes, flags, [], env))
        batch = int(flags[flags.index("-b") + 1])
        out = flags[flags.index("--json") + 1]
        steps = steps_of(batch, echo) if batch <= 64 else []
        if steps:
            Path(out).write_text(json.dumps({"steps": steps, "ran": {"loss": 1.0}}))
        return subprocess.CompletedProcess(flags, 0 if steps else 1, "CUDA out of memory" if not steps else "", "")

    monkeypatch.setattr(measuring, "train", fake_train)
    monkeypatch.setattr(measuring, "run", fake_run)


def test_bench_gpu_measures_each_set_up_once_per_gpu_and_torch_and_profiles_the_targets_it_misses(tmp_path,
                                                                                               monkeypatch, capsys):
    """The table at 1 GPU through fakes: the batch halved until it fits; the fastest set-up measured drives the
    bare loop and the JPEG rows; a row per set-up with the median step and its spread; a profile for each target
    that misses; --minutes leaves runs for the next command, and --skip-measured goes on with them, keeping the
    rows of another GPU."""
    jpeg = tmp_path / "jpeg"
    for split in ("train", "val"):
        (jpeg / split / "c").mkdir(parents=True)
        for i in range(3):
            (jpeg / split / "c" / f"{i}.jpg").write_bytes(b"\xff\xd8\xff")
    rates = {"ddp fp32": 1000, "apex O0 fp32 + channels_last": 1300, "apex O1 fp16 + channels_last": 2500,
             "apex O1 fp16 + channels_last + compile": 2400, "apex O1 bf16 + channels_last": 2600,
             "apex O2 fp16 + channels_last": 2200, "bare loop fp32": 1100,
             "bare loop bf16 + channels_last": 2700, **{f"apex O1 bf16 + channels_last, JPEGs, --decoder {d}": r
                                                        for d, r in (("tensor", 2000), ("pil", 1000), ("gpu", 2550))}}
    launched = []
    fake_runs(monkeypatch, rates, launched)
    monkeypatch.setattr(measuring, "usable_cores", lambda: 16)
    monkeypatch.setattr(gpu_measure, "machine", lambda stand_in: {"cpu": "Test CPU", "cores": 16, "gpu": "Test GPU",
                                                                "capability": "9.0", "torch": "2.11.0"})
    data = tmp_path / "gpu"
    data.mkdir()
    other = {field: "" for field in gpu_measure.TABLE_FIELDS}
    measuring.write_csv(data / "table.csv", gpu_measure.TABLE_FIELDS, [dict(other, planned="ddp fp32", gpu="Other GPU",
                                                                          gpus="1", torch="2.11.0")])
    common = ["--jpeg", str(jpeg), "--figures-data", str(data), "--runs", str(tmp_path / "runs"), "--stand-in",
              "--parts", "table", "-b", "128"]
    gpu_measure.main([*common, "--minutes", "2.5"])  # the model's 30 s runs: the first few
    rows = measuring.read_csv(data / "table.csv")
    assert rows[0]["gpu"] == "Other GPU" and 2 <= len(rows) - 1 < 11
    said = capsys.readouterr().out
    assert "left for the next command" in said and "bare loop at the fastest set-up" in said.splitlines()[-1]
    assert json.loads((data / "profiles.json").read_text()) == []  # (no target is read off part of the table)
    gpu_measure.main([*common, "--skip-measured"])
    rows = {r["planned"]: r for r in measuring.read_csv(data / "table.csv") if r["gpu"] == "Test GPU"}
    assert sorted(rows) == sorted(gpu_plan.setup_name(s) for s in gpu_plan.TABLE)
    bf16 = rows["apex O1 bf16 + channels_last"]
    assert bf16["batch_size"] == "64" and bf16["steps"] == "4"  # 128 ran out of memory
    assert float(bf16["images_per_s"]) == pytest.approx(2600) and float(bf16["step_ms"]) == pytest.approx(
        1000 * 64 / 2600, rel=1e-3)
    p10 = statistics.quantiles([0.9, 1, 1, 1.1], n=10, method="inclusive")[0] * 1000 * 64 / 2600
    assert float(bf16["step_ms_p10"]) == pytest.approx(p10, rel=1e-3) and bf16["data_wait_share"] == "0.25"
    assert rows["bare loop at the fastest set-up"]["setup"] == "bare loop bf16 + channels_last"
    bare = [flags for echo, kind, _, flags, _, _ in launched if kind == "bare" and "--channels-last" in flags][-1]
    assert bare[bare.index("--precision") + 1] == "bf16" and "--compile" not in bare and str(
        ROOT / "scripts" / "figures" / "bare_loop.py") in bare
    jpeg_runs = [(flags, env) for echo, kind, _, flags, _, env in launched if "--decoder" in flags]
    assert {flags[flags.index("--decoder") + 1] for flags, _ in jpeg_runs} == {"tensor", "pil"}  # gpu: tensor here
    assert all(flags[flags.index("-j") + 1] == "15" and "--amp-dtype" in flags for flags, _ in jpeg_runs)
    assert not list((tmp_path / "runs").rglob("*.pt"))  # the table keeps the step times, not the checkpoints
    # the targets: 2600 < 6000 and 2600 / 2700 < 0.97 (one profile, of the fastest), and 2550 / 2600 >= 0.9 (met;
    # --stand-in profiles it too)
    profiles = json.loads((data / "profiles.json").read_text())
    assert [(p["setup"], p["target"]) for p in profiles] == [("apex O1 bf16 + channels_last", "speed"), (
        "apex O1 bf16 + channels_last, JPEGs, --decoder gpu", "jpeg")]
    # the fake trace's 5 ms over its 5 steps: 1 ms a step on the GPU, 0.8 of it busy, 0.6 in the convolution
    assert profiles[0]["step_ms"] == 1.0 and profiles[0]["busy_ms"] == 0.8 and profiles[0]["idle_ms"] == 0.2
    assert profiles[0]["top"][0] == {"name": "sm90_conv", "ms": 0.6, "share": 0.6}
    assert profiles[0]["loader_wait_ms"] == 0.1
    assert [(name, met) for name, _, met, _ in gpu_plan.targets_of(list(rows.values()))] == [
        ("speed", False), ("recipe", False), ("jpeg", True)]
    launched.clear()
    gpu_measure.main([*common, "--skip-measured"])  # all measured: nothing runs again
    assert launched == []


def test_the_precision_part_on_gpus_runs_fp16_and_bf16_and_a_process_per_gpu(tmp_path, monkeypatch):
    """scripts/figures/precision/measure.py (make figures' precision part) on (a stand-in for) 2 GPUs: one process per
    GPU on the first N of those the scheduler gave, ResNet-50 at 224 px with loader workers, fp16 and bf16 at each
    level,
    --compile at one GPU only."""
    from scripts.figures.precision import measure as precision_measure

    launched = []

    def fake_train(recipe, processes, flags, out, threads, env=None, launcher=None, forked=False):
        assert not forked  # (a timed run starts fresh interpreters; --quick's alone are forked)
        launched.append((recipe, processes, [str(f) for f in flags], env["CUDA_VISIBLE_DEVICES"], launcher))
        out.mkdir(parents=True)
        (out / "metrics.csv").write_text("epoch,split,loss,top1,top5,images_per_s,data_s,epoch_s,lr\n"
                                         f"1,train,1,1,1,{100 * len(launched)},0,5,0.1\n")
        level = flags[flags.index("--opt-level") + 1] if "--opt-level" in flags else None
        dtype = flags[flags.index("--amp-dtype") + 1] if "--amp-dtype" in flags else "bf16"
        return {"opt_level": level, "precision": "fp32" if level in (None, "O0") else dtype} if level else {}

    monkeypatch.setattr(precision_measure.measuring, "train", fake_train)
    monkeypatch.setattr(precision_measure.measuring, "hardware", lambda: {"cpu": "Test CPU", "cores": 16,
                                                                        "gpu": "2 x Test GPU", "torch": "2.11.0"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    out = tmp_path / "gpu" / "precision.csv"
    monkeypatch.setattr(sys, "argv", ["scripts/figures/precision/measure.py", "--csv", str(out), "--runs",
                                      str(tmp_path / "runs"),
                                      "--repeats", "1"])
    precision_measure.main()
    assert [(recipe, processes, gpus) for recipe, processes, _, gpus, _ in launched[:2]] == [("ddp", 1, "6"),
                                                                                             ("apex", 1, "6")]
    flags = launched[1][2]
    assert flags[flags.index("-a") + 1] == "resnet50" and flags[flags.index("--image-size") + 1] == "224"
    assert flags[flags.index("-b") + 1] == "256" and flags[flags.index("-j") + 1] == "4"
    assert launched[0][4][2:] == [20 * 256, 256]  # 20 steps of 256, one validation batch
    at = {gpus: [r["setup"] for r in measuring.read_csv(out) if r["processes"] == str(gpus)] for gpus in (1, 2)}
    assert len(at[1]) == 17 and len(at[2]) == 11
    assert {"O1 fp16 + channels_last + compile", "O3 bf16 + channels_last"} <= set(at[1])
    assert not [name for name in at[2] if "compile" in name] and "O1 fp16 + channels_last" in at[2]
    two = [(recipe, processes, gpus, launcher) for recipe, processes, _, gpus, launcher in launched if processes == 2]
    assert two[0][:3] == ("ddp", 2, "6,7") and two[0][3][2:] == [20 * 256 * 2, 256 * 2]
    info = json.loads(out.with_suffix(".json").read_text())
    assert info["native_fp16"] and info["native_bf16"] and info["left_out"] == []
