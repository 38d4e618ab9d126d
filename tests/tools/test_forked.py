"""The launcher's forked processes (scripts/harness/launch.py) against fresh interpreters and torchrun's workers:
the same environment, paths, signals, store, seeds and exit codes, so that a test passed by forked ranks holds for
launched ones; and how a launch of ranks ends, its first failure stopping the others, its timeout leaving none."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, alive, child_env, launch_ranks

from scripts.harness import forkserver, launch

PROBE = '''
import atexit, json, os, random, signal, sys, threading, time
import numpy, torch
report = {"argv": sys.argv, "cwd": os.getcwd(), "path": sys.path, "env": dict(os.environ), "name": __name__,
          "handlers": {n: str(signal.getsignal(n)) for n in range(1, signal.NSIG) if n not in (9, 19, 32, 33)
                       and signal.getsignal(n) is not None},
          "mask": sorted(int(n) for n in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
          "session_leader": os.getsid(0) == os.getpid(), "stdin": os.path.realpath("/proc/self/fd/0"),
          "stdout": [sys.stdout.line_buffering, sys.stdout.write_through], "threads": torch.get_num_threads(),
          "torch_seed": torch.initial_seed(), "random": random.random(), "numpy": numpy.random.random()}
if "RANK" in os.environ:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(total)
    store = dist.distributed_c10d._get_default_store()
    kinds = []
    while store is not None:
        kinds.append(type(store).__name__)
        store = getattr(store, "underlying_store", None)
    report.update(sum=total.item(), stores=kinds)
    dist.destroy_process_group()
print(json.dumps(report))
print("on stderr", file=sys.stderr)
atexit.register(print, "at exit", file=sys.stderr)
threading.Thread(target=lambda: (time.sleep(0.1), print("a thread's last line", file=sys.stderr))).start()
with open(os.path.join(os.path.dirname(sys.argv[0]), f"rank-{os.environ.get('RANK')}.json"), "w") as file:
    json.dump(report, file)
end = sys.argv[1]
if end == "raise":
    raise ValueError("an uncaught error")
if end == "interrupt":
    raise KeyboardInterrupt
if end == "term":
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(int(end) if end.lstrip("-").isdigit() else end)
'''
RUN_SPECIFIC = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")
SEEDS = ("random", "numpy", "torch_seed")
IGNORED, BLOCKED = (signal.SIGHUP, signal.SIGUSR2), {signal.SIGUSR1}


@contextlib.contextmanager
def as_a_background_job():
    """This process ignoring SIGHUP and SIGUSR2 and blocking SIGUSR1, as nohup or a shell can leave a job: what it
    starts inherits them, as across exec, but for the signals torchrun handles, which its workers start at their
    default."""
    forkserver.start(child_env())  # (the suite's server, started before: with this process's own signals)
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in IGNORED}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for number, handler in previous.items():
            signal.signal(number, handler)


def fresh_and_forked(probe, end, env):
    command = [sys.executable, str(probe), end]
    with as_a_background_job():
        fresh = subprocess.run(command, cwd=probe.parent, env=env, capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL, start_new_session=True)
        forked = launch.run(command, env, probe.parent, 60, server_env=child_env())
    return fresh, forked


@pytest.mark.parametrize("end,code", [("0", 0), ("2", 2), ("75", 75), ("raise", 1), ("error: a reason", 1),
                                      ("interrupt", -2), ("term", -15)])
def test_a_forked_process_sees_exits_and_prints_as_a_fresh_one(tmp_path, end, code):
    """`python probe.py` started fresh (in a session of its own with stdin on /dev/null, as torchrun starts a
    worker) and forked, from a process that ignores and blocks signals: the same argv, folder, sys.path,
    environment, signal handlers and mask, stdio and threads (OMP_NUM_THREADS's, not the server's); the same
    stdout and stderr (the traceback, a thread's last line and the atexit functions' too) and exit code; fresh
    random seeds each (random's, numpy's, torch's)."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    threads = min(2, os.cpu_count())  # (the server's: 1; a fresh torch takes no more than the cores)
    env = child_env({"PYTHONPATH": str(tmp_path / "extra"), "OMP_NUM_THREADS": str(threads)})
    fresh, forked = fresh_and_forked(probe, end, env)
    assert (fresh.returncode, forked.returncode) == (code, code), (fresh.stderr[-2000:], forked.stderr[-2000:])
    assert forked.stderr == fresh.stderr and "on stderr" in fresh.stderr
    assert ("Traceback" in fresh.stderr) == (end in ("raise", "interrupt"))
    assert ("a thread's last line\nat exit\n" in fresh.stderr) == (end != "term")
    seen = {name: json.loads(result.stdout) for name, result in (("fresh", fresh), ("forked", forked))}
    for seed in SEEDS:
        assert seen["fresh"].pop(seed) != seen["forked"].pop(seed)
    assert seen["forked"] == seen["fresh"]
    assert seen["fresh"]["path"][:2] == [str(tmp_path), str(tmp_path / "extra")]
    assert seen["fresh"]["threads"] == threads
    assert all(seen["fresh"]["handlers"][str(int(number))] == str(signal.SIG_IGN) for number in IGNORED)
    assert set(BLOCKED) <= set(seen["fresh"]["mask"])


def test_forked_ranks_see_what_torchrun_gives_its_workers(tmp_path):
    """The probe on 2 ranks under torchrun --standalone and under launch_ranks, forked and (`python -B probe.py`,
    no script to fork) fresh, from a process that ignores and blocks signals: the same environment but for the
    run's own port, id and error file, the same chain of stores (torchrun's agent holds the TCPStore and each
    attempt has its prefix), the same sum over the group, the same signal handlers (those torchrun handles at their
    default) and mask, each rank a session leader with seeds of its own; a rank that exits 3 makes both exit 1."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    reports = {}
    for name in ("torchrun", "forked", "fresh"):
        with as_a_background_job():
            if name == "torchrun":
                result = subprocess.run([*launch.python_command(2), str(probe), "0"], cwd=ROOT, env=child_env(),
                                        capture_output=True, text=True, timeout=120)
            else:
                result = launch_ranks([sys.executable, *["-B"] * (name == "fresh"), str(probe), "0"], 2,
                                      child_env(), 120)
        assert result.returncode == 0, result.stderr[-2000:]
        ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
        for seed in SEEDS:
            assert ranks[0][seed] != ranks[1][seed], (name, seed)
        for report in ranks:
            for seed in SEEDS:
                report.pop(seed)
            for key in RUN_SPECIFIC:
                assert report["env"].pop(key)
            assert report["session_leader"] and report["sum"] == 3.0 and report["stores"][-1] == "TCPStore"
            assert report["handlers"][str(int(signal.SIGHUP))] == str(signal.SIG_DFL)
            assert report["handlers"][str(int(signal.SIGUSR2))] == str(signal.SIG_IGN)
            assert set(BLOCKED) <= set(report["mask"])
        reports[name] = ranks
    for name in ("forked", "fresh"):
        assert [r["env"]["RANK"] for r in reports[name]] == ["0", "1"]
        for launched, torchrun in zip(reports[name], reports["torchrun"]):
            env = {key for key in {*launched["env"], *torchrun["env"]}
                   if launched["env"].get(key) != torchrun["env"].get(key)}
            assert not env, {key: (launched["env"].get(key), torchrun["env"].get(key)) for key in env}
            assert launched == torchrun, {key: (launched[key], torchrun[key]) for key in launched
                                          if launched[key] != torchrun[key]}
    failing = "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"
    (tmp_path / "fail.py").write_text(failing)
    command = [sys.executable, str(tmp_path / "fail.py")]
    torchrun = subprocess.run([*launch.python_command(2), *command[1:]], cwd=ROOT, env=child_env(),
                              capture_output=True, text=True, timeout=120)
    launched = launch_ranks(command, 2, child_env(), 60)
    assert torchrun.returncode == launched.returncode == 1 and launched.first_failure == 3


def test_the_first_failing_rank_stops_the_others_with_sigterm_then_sigkill(tmp_path):
    """Rank 1 exits 3 while rank 0, which takes SIGTERM and carries on, runs a child in its process group: the
    group is sent SIGTERM (rank 0 says so, its child ends), then SIGKILL after the grace; the launch exits 1,
    with 3 as its first failure."""
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "folder = os.path.dirname(os.path.abspath(sys.argv[0]))\n"
        "if os.environ['RANK'] == '1':\n"
        "    while not os.path.exists(os.path.join(folder, 'pids')):\n        time.sleep(0.01)\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('rank 0 took SIGTERM'))\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "with open(os.path.join(folder, 'pids.tmp'), 'w') as file:\n"
        "    file.write(f'{os.getpid()} {child.pid}')\n"
        "os.rename(os.path.join(folder, 'pids.tmp'), os.path.join(folder, 'pids'))\n"
        "while True:\n    time.sleep(0.05)\n")
    started = time.monotonic()
    result = launch.launch_ranks([sys.executable, str(script)], 2, child_env(), 60, grace=1, server_env=child_env())
    took = time.monotonic() - started
    assert (result.returncode, result.first_failure) == (1, 3), result.stderr[-2000:]
    assert "rank 0 took SIGTERM" in result.stdout and 1 <= took < 30
    assert not [pid for pid in map(int, (tmp_path / "pids").read_text().split()) if alive(pid)]


def test_a_launch_past_its_timeout_leaves_no_rank_running(tmp_path):
    """Ranks that never end are killed, each with its process group, when the launch gives up at its timeout."""
    script = tmp_path / "forever.py"
    script.write_text("import os, sys, time\n"
                      "open(os.path.join(os.path.dirname(sys.argv[0]), f\"pid{os.environ['RANK']}\"), 'w')"
                      ".write(str(os.getpid()))\nwhile True:\n    time.sleep(0.05)\n")
    forkserver.start(child_env())  # (started before: its start-up is no part of the timeout's 2 s)
    with pytest.raises(subprocess.TimeoutExpired):
        launch_ranks([sys.executable, str(script)], 2, child_env(), 2)
    ranks = [int(path.read_text()) for path in tmp_path.glob("pid*")]
    try:
        assert len(ranks) == 2 and not [pid for pid in ranks if alive(pid)]
    finally:  # (should one outlive it, as under the mutation check's break)
        for pid in filter(alive, ranks):
            os.kill(pid, signal.SIGKILL)


def test_the_fork_server_has_imported_what_the_recipes_import(tmp_path):
    """A forked recipe finds torch, torchvision, byzfl and every module of recipes/ imported already: the
    start-up the server takes out."""
    script = ("import sys; print(' '.join(m for m in ('torch', 'torchvision', 'byzfl', 'recipes.common.data', "
              "'recipes.ps.rules', 'recipes.pipeline.stages') if m in sys.modules))")
    (tmp_path / "imported.py").write_text(script)
    result = launch.run([sys.executable, str(tmp_path / "imported.py")], child_env(), ROOT, 60)
    assert result.stdout.split() == ["torch", "torchvision", "byzfl", "recipes.common.data", "recipes.ps.rules",
                                     "recipes.pipeline.stages"]


def test_one_fork_server_serves_every_environment_of_the_same_threads(tmp_path):
    """A launch's environment reaches its process, not its server: launches with other variables share the one
    server (a server for each would soon hold gigabytes of memory), and another OMP_NUM_THREADS gets its
    own (tests/tools/test_measuring.py checks the threads each one sees)."""
    suite = forkserver.start(child_env())
    assert forkserver.start(child_env({"SOME_VARIABLE": str(tmp_path)})) == suite
    assert forkserver.start(child_env({"OMP_NUM_THREADS": "2"})) != suite
