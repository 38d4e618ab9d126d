"""End-to-end runs of the recipes on tiny data (gloo on CPU)."""

import csv
import shutil
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, TINY, assert_complete_run_dir, child_env, free_port, read_summary, recipe_command, run_recipe

from recipes import RECIPES
from recipes import recipe as catalogue
from recipes.common import models

ARCH = {"nd": "lenet", "dp": "resnet18", "ddp": "lenet"}  # the others: vit_tiny


@pytest.mark.parametrize("recipe", [entry.name for entry in RECIPES])
def test_recipe_writes_complete_run_directory(tiny_data, tmp_path, recipe):
    """The run directory is whole and true: summary.json's world size (every process, whatever its role) and
    global batch as the run's first line says, each epoch's data wait within the epoch; and its best.pt,
    evaluated by nd as the READMEs write it (no other flag), scores the run's best top-1. Five of the recipes
    train the small vision transformer (at 14 px: 7 x 7 patches of 2 px), which each takes as it takes lenet."""
    nproc, arch = catalogue(recipe).processes, ARCH.get(recipe, "vit_tiny")
    world_size = nproc or 1  # (as the summary counts it: ps's servers too, the pipeline's every stage)
    out = tmp_path / recipe
    size = ["--image-size", "14"] if arch == "vit_tiny" else []
    result = run_recipe(recipe, [tiny_data, *TINY, "-a", arch, *size, "--epochs", "1", "--out", out], nproc=nproc)
    summary = assert_complete_run_dir(out, recipe, world_size)
    assert "done: top1" in result.stdout
    # only rank 0 prints: one start line, not one per rank
    starts = [line for line in result.stdout.splitlines() if line.startswith(f"{recipe}: ")]
    assert len(starts) == 1, result.stdout
    assert f"global batch {summary['global_batch']}," in starts[0], (summary["global_batch"], starts[0])
    with open(out / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            assert 0 <= float(row["data_s"]) <= float(row["epoch_s"]), row
            # the loader's wait where images are decoded (-j 0: in the training process, 1 ms or more for the
            # 24 or 48 images of a process): on every stage, and on a parameter server's workers, not its servers
            assert row["split"] != "train" or float(row["data_s"]) >= 5e-4, row
    best = torch.load(out / "best.pt", weights_only=True)
    if recipe in ("apex", "fsdp"):  # the precision the run computed in, as its checkpoint records it
        assert (summary["opt_level"], summary["precision"]) == (
            best["opt_level"], "fp32" if best["opt_level"] == "O0" else best["amp_dtype"]), summary
    else:
        assert "opt_level" not in summary and "precision" not in summary, summary
    # (-b 8: a step of the tiny train/, which -e loads too)
    run_recipe("nd", [tiny_data, "-e", "--resume", out / "best.pt", "-b", "8", "-j", "0", "--out", tmp_path / "e"])
    top1 = read_summary(tmp_path / "e")["top1"]
    if best["opt_level"] == "O0":  # the same arithmetic: the same images right
        assert top1 == pytest.approx(best["best_top1"]), (top1, best["best_top1"])
    else:  # trained (and scored) in bf16 autocast, scored by nd in fp32: at most one image of 23 apart
        assert abs(top1 - best["best_top1"]) <= 100 / 23 + 1e-6, (top1, best["best_top1"], best["opt_level"])


def test_dp_says_it_runs_on_one_device_without_cuda(tiny_data, tmp_path):
    result = run_recipe("dp", [tiny_data, *TINY, "--epochs", "1", "--out", tmp_path / "dp"])
    assert "it runs on one device (cpu)" in result.stdout


def test_legacy_launcher_passes_local_rank(tiny_data, tmp_path):
    """torch.distributed.launch passes --local-rank=N to each process. A wrapper prints what the recipe's parser
    reads from it, then takes LOCAL_RANK out of the environment (as launchers before torchrun set none), so the
    flag is all the recipe has."""
    out, wrapper = tmp_path / "legacy", tmp_path / "legacy_wrapper.py"
    recipe = ROOT / "recipes/ddp/train.py"
    wrapper.write_text(f"""import os, runpy, sys
sys.path.insert(0, {str(ROOT)!r})  # (the clone's recipes, installed or not, as the recipes put it first)
from recipes.ddp.train import parse_args
print(f"parsed local rank {{parse_args(sys.argv[1:]).local_rank}}, LOCAL_RANK {{os.environ.pop('LOCAL_RANK')}}")
sys.argv[0] = {str(recipe)!r}
runpy.run_path(sys.argv[0], run_name="__main__")
""")
    command = [str(a) for a in (
        "-m", "torch.distributed.launch", "--nproc_per_node=2", f"--master_port={free_port()}",
        wrapper, tiny_data, *TINY, "--epochs", "1", "--out", out)]
    result = subprocess.run([sys.executable, *command], cwd=ROOT, env=child_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = sorted(line for line in result.stdout.splitlines() if line.startswith("parsed local rank"))
    assert parsed == ["parsed local rank 0, LOCAL_RANK 0", "parsed local rank 1, LOCAL_RANK 1"], result.stdout
    assert_complete_run_dir(out, "ddp", 2)


def test_dist_url_with_multiprocessing_distributed(tiny_data, tmp_path):
    """Two 'nodes' of one CPU process each, as pytorch/examples imagenet launches them."""
    out, url = tmp_path / "dist-url", f"tcp://127.0.0.1:{free_port()}"
    common = [tiny_data, *TINY, "--epochs", "1", "--out", out, "--dist-url", url, "--world-size", "2",
              "--multiprocessing-distributed"]
    nodes = [subprocess.Popen(recipe_command("ddp", [str(a) for a in common + ["--rank", str(r)]]), cwd=ROOT,
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert_complete_run_dir(out, "ddp", 2)
    assert "done: top1" in outputs[0][0] and "done: top1" not in outputs[1][0]


def test_ddp_two_processes_match_nd_with_double_batch(tiny_data, tmp_path):
    """DDP 2 x batch 8 and nd with batch 16 see the same images per step: same weights."""
    nd_out, ddp_out = tmp_path / "nd", tmp_path / "ddp"  # (2 epochs: each reshuffles, in both recipes alike)
    run_recipe("nd", [tiny_data, *TINY, "-b", "16", "--epochs", "2", "--out", nd_out])
    run_recipe("ddp", [tiny_data, *TINY, "-b", "8", "--epochs", "2", "--out", ddp_out], nproc=2)
    nd_state = torch.load(nd_out / "checkpoint.pt", weights_only=True)["model"]
    ddp_state = torch.load(ddp_out / "checkpoint.pt", weights_only=True)["model"]
    assert nd_state.keys() == ddp_state.keys()
    for key in nd_state:
        torch.testing.assert_close(ddp_state[key], nd_state[key], atol=1e-5, rtol=0, msg=key)
    torch.manual_seed(0)  # what --seed 0 initialises: the 3 steps must have moved every weight away from it
    initial = models.build_model("lenet", 3).state_dict()
    assert all((nd_state[key] - initial[key]).abs().max() > 1e-4 for key in initial)
    assert read_summary(nd_out)["global_batch"] == read_summary(ddp_out)["global_batch"] == 16


@pytest.fixture(scope="module")
def trained_checkpoint(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "nd"
    run_recipe("nd", [tiny_data, *TINY, "--epochs", "2", "--out", out])
    return out / "checkpoint.pt"


def test_evaluation_counts_every_image_once_for_any_world_size(tiny_data, tmp_path, trained_checkpoint):
    counts = {}
    for nproc in (1, 2, 3):
        out = tmp_path / f"eval{nproc}"
        run_recipe("ddp", [tiny_data, *TINY, "-b", "4", "-e", "--resume", trained_checkpoint, "--out", out],
                   nproc=nproc)
        summary = read_summary(out)
        assert summary["world_size"] == nproc and summary["val_images"] == 23
        counts[nproc] = summary["top1_correct"]
    out = tmp_path / "eval-nd"  # and the single-device recipe agrees
    run_recipe("nd", [tiny_data, *TINY, "-e", "--resume", trained_checkpoint, "--out", out])
    counts["nd"] = read_summary(out)["top1_correct"]
    assert len(set(counts.values())) == 1, counts


def test_ddp_checkpoint_evaluates_in_nd_and_apex(tiny_data, tmp_path):
    train = tmp_path / "ddp"
    run_recipe("ddp", [tiny_data, *TINY, "--epochs", "1", "--out", train], nproc=2)
    expected = read_summary(train)["top1_correct"]
    for recipe in ("nd", "apex"):
        out = tmp_path / f"eval-{recipe}"
        result = run_recipe(recipe, [tiny_data, *TINY, "-e", "--resume", train / "checkpoint.pt", "--out", out])
        assert read_summary(out)["top1_correct"] == expected
        assert "in fp32" not in result.stdout  # (an fp32 run: nothing differs to say)


def test_resume_matches_an_uninterrupted_run(tiny_data, tmp_path):
    """Also: a best top-1 that no later epoch beats survives the resume. The tiny set reaches 100 % at once, so
    a copy of the checkpoint is marked with a best of 101 % first, which only the resumed run's bookkeeping can
    keep."""
    full, split, marked = tmp_path / "full", tmp_path / "split", tmp_path / "marked"
    flags = [tiny_data, *TINY, "--lr", "2"]
    run_recipe("ddp", [*flags, "--epochs", "3", "--out", full], nproc=2)
    run_recipe("ddp", [*flags, "--epochs", "2", "--out", split], nproc=2)
    shutil.copytree(split, marked)
    state = torch.load(marked / "checkpoint.pt", weights_only=True)
    torch.save({**state, "best_top1": 101.0}, marked / "checkpoint.pt")
    best_before = (marked / "best.pt").read_bytes()
    for out in (split, marked):
        run_recipe("ddp", [*flags, "--epochs", "3", "--out", out, "--resume", out / "checkpoint.pt"], nproc=2)
    assert read_summary(marked)["best_top1"] == 101.0  # kept across the resume ...
    assert (marked / "best.pt").read_bytes() == best_before  # ... and best.pt with it: epoch 3 did not beat it

    a, b = read_summary(full), read_summary(split)
    assert (a["top1"], a["top5"], a["loss"], a["best_top1"]) == (b["top1"], b["top5"], b["loss"], b["best_top1"])
    state_a = torch.load(full / "checkpoint.pt", weights_only=True)
    state_b = torch.load(split / "checkpoint.pt", weights_only=True)
    for key in state_a["model"]:
        assert torch.equal(state_a["model"][key], state_b["model"][key]), key
    with open(split / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    val_top1 = [float(r["top1"]) for r in rows if r["split"] == "val"]
    assert len(val_top1) == 3  # the resumed run kept epochs 1-2 and added epoch 3
    assert b["best_top1"] == pytest.approx(max(val_top1), abs=1e-3)


def test_sync_bn_on_cpu_is_a_clear_message_not_a_crash(tiny_data, tmp_path):
    result = run_recipe("ddp", [tiny_data, *TINY, "--epochs", "1", "--sync-bn", "--out", tmp_path / "bn"])
    assert "--sync-bn ignored: SyncBatchNorm runs only on CUDA" in result.stdout


def test_desired_acc_stops_early(tiny_data, tmp_path):
    out = tmp_path / "early"
    result = run_recipe("nd", [tiny_data, *TINY, "--lr", "2", "--epochs", "20", "--desired-acc", "0.5",
                               "--out", out])
    assert "reached --desired-acc 0.5" in result.stdout
    summary = read_summary(out)
    assert summary["epochs"] < 20 and summary["top1"] >= 50


def test_a_peer_that_never_joins_ends_in_a_clear_error(tiny_data, tmp_path):
    """Rank 1 of 2 waits for a rank 0 that never starts: it fails after --dist-timeout."""
    url = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    result = run_recipe("ddp", [tiny_data, *TINY, "--dist-url", url, "--world-size", "2", "--rank", "1",
                                "--dist-timeout", "5", "--out", tmp_path / "alone"], expect_ok=False, timeout=120)
    elapsed = time.monotonic() - start
    assert result.returncode == 2, result.stderr[-2000:]
    # c10d's C++ logger reports the socket time-out too (TORCH_CPP_LOG_LEVEL=FATAL hides it);
    # the run's own line comes last, once, with no Python traceback
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "could not form a process group of 2" in lines[-1] and "--dist-timeout=5s" in lines[-1]
    assert sum(line.startswith("error:") for line in lines) == 1 and "Traceback" not in result.stderr
    assert elapsed < 60
