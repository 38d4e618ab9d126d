"""scripts/loader_check.py: a recipe's command timed on its data and on --synthetic images, and the verdict."""

import sys
import time

import pytest
from conftest import ROOT, TINY, run_python

sys.path.insert(0, str(ROOT))
from scripts import loader_check


def test_the_verdict_names_the_loader_only_below_90_percent_of_the_synthetic_speed():
    assert loader_check.verdict(95.0, 100.0).startswith("the loader keeps up: real data trains at 95 %")
    assert loader_check.verdict(90.0, 100.0).startswith("the loader keeps up")
    slow = loader_check.verdict(89.0, 100.0)
    assert slow.startswith("the loader limits this run: real data trains at 89 %")
    assert "-j" in slow and "--decoder gpu" in slow


def test_it_times_both_runs_of_a_recipe_and_stops_them(tiny_data, tmp_path):
    result = run_python([sys.executable, ROOT / "scripts" / "loader_check.py", "--steps", "3", "--warmup", "1",
                         "--out", tmp_path, "--", sys.executable, ROOT / "recipes" / "nd" / "train.py", tiny_data,
                         *TINY, "--epochs", "9"])
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["real", "synthetic"]
    assert all("(3 steps of 8 images in" in line for line in lines[:2])
    assert lines[2].startswith("the loader ")
    for run in ("real-data", "synthetic"):  # stopped by SIGTERM after its steps: the recipe saved and exited
        assert (tmp_path / run / "checkpoint.pt").exists()
        assert not (tmp_path / run / "summary.json").exists()


def test_a_command_that_is_no_recipe_is_one_clear_line(tmp_path):
    result = run_python([sys.executable, ROOT / "scripts" / "loader_check.py", "--", "python", "train.py"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("loader_check.py: error: give a recipe's launch command")


def test_a_run_that_fails_is_named_with_its_last_lines(tmp_path):
    result = run_python([sys.executable, ROOT / "scripts" / "loader_check.py", "--out", tmp_path, "--",
                         sys.executable, ROOT / "recipes" / "nd" / "train.py", tmp_path / "missing", *TINY])
    assert result.returncode == 1
    assert "stopped after 0 timed step(s)" in result.stderr and "missing" in result.stderr


def test_the_synthetic_run_drops_the_decoder_and_a_synthetic_command_is_refused():
    assert loader_check.without_decoder(["r.py", "D", "--decoder", "gpu", "-b", "8", "--decoder=pil"]) == \
        ["r.py", "D", "-b", "8"]
    result = run_python([sys.executable, ROOT / "scripts" / "loader_check.py", "--", "python",
                         "recipes/ddp/train.py", "D", "--synthetic"])
    assert result.returncode == 2 and "without --synthetic" in result.stderr.strip().splitlines()[-1]


def test_a_run_that_prints_no_step_is_killed_with_the_processes_of_sessions_of_their_own(tmp_path):
    """As torchrun starts its workers: a child in a session of its own, holding the output open."""
    script = tmp_path / "silent.py"
    script.write_text("import subprocess, sys, time\n"
                      "print('x: global batch 8', flush=True)\n"
                      "child = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
                      "subprocess.Popen(child, start_new_session=True)\n"
                      "time.sleep(60)\n")
    started = time.monotonic()
    with pytest.raises(SystemExit, match="stopped after 0 timed step"):
        loader_check.timed_steps([sys.executable, str(script)], tmp_path / "out", 2, 0, timeout=2)
    assert time.monotonic() - started < 30
