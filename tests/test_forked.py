"""The suite's forked processes (tests/forkserver.py) against fresh interpreters and torchrun's workers: the same
environment, paths, signals, store and exit codes, so that a test passed by forked ranks holds for launched ones."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, child_env, launch_ranks

import forkserver

PROBE = '''
import json, os, random, signal, sys
import torch
report = {"argv": sys.argv, "cwd": os.getcwd(), "path": sys.path, "env": dict(os.environ), "name": __name__,
          "handlers": {n: str(signal.getsignal(n)) for n in range(1, signal.NSIG) if n not in (9, 19, 32, 33)
                       and signal.getsignal(n) is not None},
          "mask": sorted(int(n) for n in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
          "session_leader": os.getsid(0) == os.getpid(), "stdin": os.path.realpath("/proc/self/fd/0"),
          "stdout": [sys.stdout.line_buffering, sys.stdout.write_through], "threads": torch.get_num_threads(),
          "torch_seed": torch.initial_seed(), "random": random.random()}
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
with open(os.path.join(os.path.dirname(sys.argv[0]), f"rank-{os.environ.get('RANK')}.json"), "w") as file:
    json.dump(report, file)
end = sys.argv[1]
if end == "raise":
    raise ValueError("an uncaught error")
if end == "term":
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(int(end) if end.lstrip("-").isdigit() else end)
'''
RUN_SPECIFIC = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")


def fresh_and_forked(probe, end, env):
    command = [sys.executable, str(probe), end]
    fresh = subprocess.run(command, cwd=probe.parent, env=env, capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL, start_new_session=True)
    forked = forkserver.run(command, probe.parent, env, 60, child_env())
    return fresh, forked


@pytest.mark.parametrize("end,code", [("0", 0), ("2", 2), ("75", 75), ("raise", 1), ("error: a reason", 1),
                                      ("term", -15)])
def test_a_forked_process_sees_exits_and_prints_as_a_fresh_one(tmp_path, end, code):
    """`python probe.py` started fresh (in a session of its own with stdin on /dev/null, as torchrun starts a
    worker) and forked: the same argv, folder, sys.path, environment, signal handlers and mask, stdio and
    threads; the same stdout and stderr (the traceback too) and exit code; fresh random seeds each (random's,
    torch's)."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = child_env({"PYTHONPATH": str(tmp_path / "extra")})
    fresh, forked = fresh_and_forked(probe, end, env)
    assert (fresh.returncode, forked.returncode) == (code, code), (fresh.stderr[-2000:], forked.stderr[-2000:])
    assert forked.stderr == fresh.stderr and "on stderr" in fresh.stderr
    assert ("Traceback" in fresh.stderr) == (end == "raise")
    seen = {name: json.loads(result.stdout) for name, result in (("fresh", fresh), ("forked", forked))}
    for seed in ("random", "torch_seed"):
        assert seen["fresh"].pop(seed) != seen["forked"].pop(seed)
    assert seen["forked"] == seen["fresh"]
    assert seen["fresh"]["path"][:2] == [str(tmp_path), str(tmp_path / "extra")]


def test_forked_ranks_see_what_torchrun_gives_its_workers(tmp_path):
    """The probe on 2 ranks under torchrun --standalone and under launch_ranks (forked): the same environment
    but for the run's own port, id and error file, the same chain of stores (torchrun's agent holds the TCPStore
    and each attempt has its prefix), the same sum over the group, each rank a session leader; a rank that exits
    3 makes both exit 1."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    reports = {}
    for name in ("torchrun", "forked"):
        if name == "torchrun":
            result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     "--nproc_per_node=2", str(probe), "0"], cwd=ROOT, env=child_env(),
                                    capture_output=True, text=True, timeout=120)
        else:
            result = launch_ranks([sys.executable, str(probe), "0"], 2, child_env(), 120)
        assert result.returncode == 0, result.stderr[-2000:]
        ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
        for report in ranks:
            report.pop("random"), report.pop("torch_seed")
            for key in RUN_SPECIFIC:
                assert report["env"].pop(key)
            assert report["session_leader"] and report["sum"] == 3.0 and report["stores"][-1] == "TCPStore"
        reports[name] = ranks
    assert [r["env"]["RANK"] for r in reports["forked"]] == ["0", "1"]
    for forked, torchrun in zip(reports["forked"], reports["torchrun"]):
        env = {key for key in {*forked["env"], *torchrun["env"]}
               if forked["env"].get(key) != torchrun["env"].get(key)}
        assert not env, {key: (forked["env"].get(key), torchrun["env"].get(key)) for key in env}
        assert forked == torchrun, {key: (forked[key], torchrun[key]) for key in forked if forked[key] != torchrun[key]}
    failing = "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"
    (tmp_path / "fail.py").write_text(failing)
    command = [sys.executable, str(tmp_path / "fail.py")]
    torchrun = subprocess.run([*command[:1], "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               *command[1:]], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert torchrun.returncode == launch_ranks(command, 2, child_env(), 60).returncode == 1


def test_the_fork_server_has_imported_what_the_recipes_import(tmp_path):
    """A forked recipe finds torch, torchvision, byzfl and every module of recipes/ imported already: the
    start-up the server takes out."""
    script = ("import sys; print(' '.join(m for m in ('torch', 'torchvision', 'byzfl', 'recipes.common.data', "
              "'recipes.ps.rules', 'recipes.pipeline.stages') if m in sys.modules))")
    (tmp_path / "imported.py").write_text(script)
    result = forkserver.run([sys.executable, str(tmp_path / "imported.py")], ROOT, child_env(), 60, child_env())
    assert result.stdout.split() == ["torch", "torchvision", "byzfl", "recipes.common.data", "recipes.ps.rules",
                                     "recipes.pipeline.stages"]
