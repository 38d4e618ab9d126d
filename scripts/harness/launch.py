"""How the tests and the measuring launch a script: one process (`python SCRIPT ARGS`), or N ranks as
`torchrun --standalone --nproc_per_node=N` starts its workers. Each is real (a fresh interpreter; torchrun itself:
python_command) or forked from the fork server (scripts/harness/forkserver.py), which has imported torch,
torchvision, byzfl and the recipes once: a forked process starts in milliseconds, a fresh one spends about 2.5 s
importing on 2 cores. The tests of a launcher's own behaviour, and measured timings, start real ones.

A forked process is promised what `python SCRIPT ARGS` started afresh in the same environment, in a session of its
own with stdin on /dev/null (as torchrun starts a worker), is given, and forked ranks what torchrun gives its
workers. A test checks each promise, named in brackets: [fresh] test_forked.py's
test_a_forked_process_sees_exits_and_prints_as_a_fresh_one, [torchrun] its
test_forked_ranks_see_what_torchrun_gives_its_workers, each against the real thing.
- Environment: exactly env [fresh]; for ranks, env and what torchrun adds (torchrun_env: RANK, LOCAL_RANK,
  WORLD_SIZE, ..., MASTER_ADDR/PORT of a TCPStore this process holds, as torchrun's agent holds it) [torchrun].
- Its argv, working folder, `__main__`, and sys.path from its script's folder and PYTHONPATH [fresh].
- Signals: the handlers a fresh Python starts with; a signal this process ignores stays ignored, as across exec
  [fresh], but for those torchrun handles (HANDLED), which ranks start at their default [torchrun]; this
  process's signal mask [fresh, torchrun].
- A session of its own, so that a signal to its process group reaches what it started [fresh, torchrun].
- stdin on /dev/null; stdout and stderr on the files given, unbuffered as the server's PYTHONUNBUFFERED=1 makes
  them [fresh].
- torch's threads: OMP_NUM_THREADS's, not the server's [fresh].
- Fresh random seeds (random's, numpy's, torch's), each process its own [torchrun].
- Its end, as Python's: its threads joined, its atexit functions run, and the exit code Python gives (SystemExit's
  code; 1 after an uncaught exception, its traceback on stderr; -N when signal N ended it, -2 after an uncaught
  KeyboardInterrupt) [fresh].
- Ranks end as torchrun's: exit code 1 when any rank failed (first_failure: the first failing rank's own)
  [torchrun]; the first rank to fail has every rank's process group sent SIGTERM, then SIGKILL after a grace
  [test_the_first_failing_rank_stops_the_others_with_sigterm_then_sigkill].
- No rank outlives its launch: past the timeout, or on an error, every rank's process group is killed
  [test_a_launch_past_its_timeout_leaves_no_rank_running]; and no forked process outlives the process that
  launched it, SIGKILL included: it dies with the server, the server with that process
  [test_measuring.py's test_no_forked_rank_outlives_the_script_that_forked_it].
What a forked process cannot see afresh: a module the server imported is not imported again (a PYTHONPATH entry
does not replace it; a test that needs that starts a real interpreter); the server's interpreter flags, hash seed
and PYTHONUNBUFFERED are its own; and an OMP_NUM_THREADS above the machine's cores, which a fresh torch built
with MKL caps at the cores, is taken as it is. A command that is not `python SCRIPT` with this Python (or any
command off Linux) starts afresh: one process as subprocess.run starts it, ranks as torchrun does (env and
store as above, a session each, HANDLED at their default) [torchrun, as `python -B SCRIPT`].
"""

import base64
import fcntl
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

from scripts.harness import forkserver

ROOT = Path(__file__).resolve().parents[2]
# the signals torchrun handles (its TORCHELASTIC_SIGNALS_TO_HANDLE): its workers start with them at their default,
# where an ignored signal is otherwise inherited (the tests under nohup, or started in a shell's background)
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def python_command(nproc=None):
    """python, or torchrun --standalone for nproc processes: prefix it to a script and its flags."""
    if nproc is None:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def run(command, env, cwd=ROOT, timeout=None, server_env=None, forked=True, echo=None):
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout) in env: forked from the fork server
    (started with server_env, else env) when forked and command is `python SCRIPT ...` with this Python, else
    started afresh. echo (afresh): its output lines are printed as they come, each after "[echo] ", its stderr
    in its stdout (one stream, returned as both)."""
    if forked and forkserver.forkable(command):
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            process = forkserver.Forked(command, cwd, env, out, err, server_env or env)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise
            out.seek(0), err.seek(0)
            return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read())
    if echo is None:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = []
    with subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        for line in process.stdout:
            lines.append(line)
            print(f"[{echo}] {line}", end="", flush=True)
    output = "".join(lines)
    return subprocess.CompletedProcess(command, process.returncode, output, output)


def start(command, env, out, err, cwd=ROOT, server_env=None):
    """subprocess.Popen(command, stdout=out, stderr=err) in env, in a session of its own, without waiting: forked
    from the fork server (started with server_env, else env) when command is `python SCRIPT ...` with this
    Python, else started afresh. out and err are files (the same one for both: stderr=subprocess.STDOUT)."""
    if forkserver.forkable(command):
        return forkserver.Forked(command, cwd, env, out, err, server_env or env)
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)


def torchrun_env(rank, nproc, port, run_id, errors):
    """What torchrun --standalone --nproc_per_node=nproc adds to rank's environment (test_forked.py compares)."""
    return {"RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank), "ROLE_NAME": "default",
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(nproc),
            "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "localhost",
            "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCHELASTIC_ERROR_FILE": str(errors / str(rank) / "error.json"),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(signal.Signals(number).name for number in HANDLED)}


def default_handled_signals():
    for number in HANDLED:
        signal.signal(number, signal.SIG_DFL)


def launch_ranks(command, nproc, env, timeout=None, grace=10, cwd=ROOT, server_env=None, one_stream=False):
    """nproc processes of command as torchrun --standalone starts its workers, without its agent: the
    environment it gives them (torchrun_env), its store (held here, as the agent holds it) and a session each;
    `python SCRIPT` forked from the fork server (started with server_env, else env). The agent's start-up costs
    about a second a run, a fresh interpreter's imports 2.5 s a rank. As its agent does, the first rank to fail
    has the others' process groups sent SIGTERM, then SIGKILL after `grace` seconds, and the exit code is 1 when
    any rank failed; first_failure is that rank's exit code (None when none failed). The output: every rank's
    stdout (then stderr), rank by rank; one_stream: every rank's stdout and stderr in one file as they write
    them, returned as stdout."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    run_id, errors = str(uuid.uuid4()), Path(tempfile.mkdtemp(prefix="torchelastic-"))
    if one_stream:
        log = tempfile.TemporaryFile("w+")
        fcntl.fcntl(log, fcntl.F_SETFL, fcntl.fcntl(log, fcntl.F_GETFL) | os.O_APPEND)  # (writers never overlap)
        files = [(log, log)] * nproc
    else:
        files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(nproc)]
    envs = [{**env, **torchrun_env(rank, nproc, store.port, run_id, errors)} for rank in range(nproc)]
    deadline = None if timeout is None else time.monotonic() + timeout
    stop_at, first_failure, ranks = None, None, []
    try:
        for rank_env, (out, err) in zip(envs, files):
            if forkserver.forkable(command):
                ranks.append(forkserver.Forked(command, cwd, rank_env, out, err, server_env or env, handled=HANDLED))
            else:
                ranks.append(subprocess.Popen(command, cwd=cwd, stdout=out, stderr=err, text=True, env=rank_env,
                                              start_new_session=True, preexec_fn=default_handled_signals))
        while None in [rank.poll() for rank in ranks]:  # (each one polled)
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(command, timeout)
            if first_failure is None:
                first_failure = next((rank.returncode for rank in ranks if rank.returncode), None)
                if first_failure is not None:
                    stop_at = time.monotonic() + grace
                    for rank in ranks:
                        forkserver.signal_group(rank, signal.SIGTERM)
            if stop_at is not None and time.monotonic() > stop_at:
                for rank in ranks:
                    forkserver.signal_group(rank, signal.SIGKILL)
            time.sleep(0.02)
    finally:
        for rank in ranks:
            forkserver.signal_group(rank, signal.SIGKILL)
            rank.wait()
        shutil.rmtree(errors, ignore_errors=True)
    if first_failure is None:  # (failed in the last round polled)
        first_failure = next((rank.returncode for rank in ranks if rank.returncode), None)
    outputs = []
    for out, err in dict.fromkeys(files):
        out.seek(0), err.seek(0)
        outputs.append((out.read(), "" if err is out else err.read()))
        out.close(), err.close()
    result = subprocess.CompletedProcess(command, int(first_failure is not None), "".join(out for out, _ in outputs),
                                         "".join(err for _, err in outputs))
    result.first_failure = first_failure
    return result


def descendants(pid):
    """{pid: name} of every living process below pid, read from /proc (torchrun starts its workers in sessions
    of their own, so a signal to the launcher's process group misses them)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, fields = stat.read_text().rsplit(")", 1)
        except OSError:  # ended meanwhile
            continue
        state, parent = fields.split()[:2]
        if state not in "ZX":  # a zombie has ended; it only waits for its parent to collect it
            children.setdefault(int(parent), []).append((int(stat.parent.name), name.split("(", 1)[1]))
    found, todo = {}, [pid]
    while todo:
        for child, name in children.get(todo.pop(), []):
            found[child] = name
            todo.append(child)
    return found


def spawn(function, args, nprocs, env, timeout=300):
    """torch.multiprocessing.spawn(function, args, nprocs) with forked processes: function(rank, *args) in each
    (function and args pickled; function from a module the fork server can import from its file's folder and
    the clone), RANK set in each one's env. When a process fails, the others are killed and AssertionError
    carries its exit code and stderr, as spawn's exception does."""
    call = base64.b64encode(pickle.dumps((function, args))).decode()
    module = sys.modules[function.__module__].__file__
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(nprocs)]
    deadline, failed, processes = time.monotonic() + timeout, None, []
    try:
        for rank, (out, err) in enumerate(files):
            processes.append(forkserver.Forked([sys.executable, module], ROOT, {**env, "RANK": str(rank)}, out, err,
                                               env, call=call))
        while failed is None and None in [process.poll() for process in processes]:  # (each one polled)
            failed = next((rank for rank, process in enumerate(processes) if process.returncode), None)
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(function.__name__, timeout)
            time.sleep(0.01)
    finally:
        for process in processes:
            process.kill()
            process.wait()
    failed = next((rank for rank, process in enumerate(processes) if process.returncode), None) \
        if failed is None else failed
    if failed is not None:
        files[failed][1].seek(0)
        raise AssertionError(f"process {failed} of {function.__name__} exited with {processes[failed].returncode}:"
                             f"\n{files[failed][1].read()[-5000:]}")
