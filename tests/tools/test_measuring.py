"""scripts/make_demo_data.py's data sets and scripts/figures/measuring.py's helpers: finished runs, forked ranks."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, alive, child_env, run_python
from PIL import Image

sys.path.insert(0, str(ROOT))
from scripts.figures import measuring


def test_digits_folder(tmp_path):
    out = tmp_path / "mnist5k"
    assert run_python([sys.executable, ROOT / "scripts/make_demo_data.py", "--out", out]).returncode == 0
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
    assert run_python([sys.executable, ROOT / "scripts/make_demo_data.py", "--imagenet-like", out, "--classes", "3",
                       "--images", "5"]).returncode == 0
    for split, n in (("train", 4), ("val", 1)):
        assert sorted(p.name for p in (out / split).iterdir()) == ["class0000", "class0001", "class0002"]
        jpegs = list((out / split).glob("*/*.jpg"))
        assert len(jpegs) == 3 * n
        for path in jpegs:
            with Image.open(path) as image:
                assert image.format == "JPEG" and all(256 <= side <= 500 for side in image.size)


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


def test_forked_runs_get_torchruns_environment_and_a_failing_rank_fails_the_run(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text("import os, sys\nrank = int(os.environ['RANK'])\n"
                      "print(f\"rank {rank} of {os.environ['WORLD_SIZE']} local {os.environ['LOCAL_RANK']} "
                      "at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} args {sys.argv[1:]}\")\n"
                      "if rank == int(sys.argv[1]):\n    sys.exit(3)\n"
                      "if rank == int(sys.argv[2]):\n    raise RuntimeError('a bug in rank 2')\n")
    program = ("import sys\nfrom scripts.figures import measuring\nif __name__ == '__main__':\n"
               "    for failing in (('-1', '-1'), ('1', '-1'), ('-1', '2')):\n"
               f"        result = measuring.run_forked(3, [{str(script)!r}, *failing], 1)\n"
               "        print('returncode', result.returncode)\n        print(result.stdout)\n")
    result = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    fine, exited, raised = result.stdout.split("returncode ")[1:]
    assert fine.startswith("0\n") and exited.startswith("3\n") and raised.startswith("1\n")
    assert all(f"rank {rank} of 3 local {rank} at localhost:" in fine for rank in range(3))
    assert "args ['-1', '-1']" in fine
    assert "RuntimeError: a bug in rank 2" in raised  # the traceback reaches the run's output


def test_a_forked_run_has_its_own_threads_and_one_process_runs_as_python_does(tmp_path):
    """Runs of 1 and 2 threads a process, in turn and back (a fork server for each): each sees its own threads,
    torch's and numpy's BLAS's, which reads them as it loads; one process sees no torchrun variables, as
    `python SCRIPT` started afresh."""
    script = tmp_path / "threads.py"
    script.write_text("import os, numpy, threadpoolctl, torch\n"
                      "blas = {pool['num_threads'] for pool in threadpoolctl.threadpool_info() if pool['user_api'] == "
                      "'blas'}\nprint('threads', torch.get_num_threads(), *blas, 'rank', os.environ.get('RANK'))\n")
    program = ("from scripts.figures import measuring\nif __name__ == '__main__':\n"
               "    for processes, threads in ((2, 1), (1, 2), (2, 1)):\n"
               f"        print(measuring.run_forked(processes, [{str(script)!r}], threads).stdout)\n")
    result = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("threads")]
    assert sorted(lines[:2]) == ["threads 1 1 rank 0", "threads 1 1 rank 1"]
    assert lines[2] == "threads 2 2 rank None"  # (what one fork server for every run would give: "threads 2 1")
    assert sorted(lines[3:]) == ["threads 1 1 rank 0", "threads 1 1 rank 1"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_no_forked_rank_outlives_the_script_that_forked_it(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(f"import os, time\nopen({str(tmp_path)!r} + f'/pid{{os.environ[\"RANK\"]}}', 'w')"
                      ".write(str(os.getpid()))\ntime.sleep(300)\n")
    program = ("from scripts.figures import measuring\nif __name__ == '__main__':\n"
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
    try:
        assert not [pid for pid in ranks if alive(pid)]
    finally:  # (should one outlive it, as under the mutation check's break)
        for pid in filter(alive, ranks):
            os.kill(pid, signal.SIGKILL)
