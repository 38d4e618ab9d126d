"""The tests' Python processes, forked from a server that has imported torch, torchvision, byzfl and the recipes
once: a rank starts in milliseconds, where a fresh interpreter spends about 2.5 s importing on 2 cores (more
with byzfl), most of the suite's time before (docs/tests.md: where the time goes).

A forked process sees what `python SCRIPT ARGS` started fresh in the same environment sees, and test_forked.py
checks it against fresh ones and torchrun's workers: its environment exactly, its argv and working folder,
sys.path from its script's folder and PYTHONPATH, a session of its own (as torchrun's workers have), the signal
handlers a fresh Python starts with (the signals the tests' process ignores stay ignored, as across exec) and the
tests' process's signal mask, stdin on /dev/null, stdout and stderr on the files given (unbuffered,
as PYTHONUNBUFFERED=1 makes them), fresh random seeds, and the exit code Python gives (SystemExit's code; 1 after
an uncaught exception, its traceback on stderr; -N when signal N ended it). What it cannot see afresh: a module
the server imported is not imported again (a PYTHONPATH entry does not replace it; a test that needs that starts
a real interpreter), and the server's interpreter flags and hash seed are its own.

    python tests/forkserver.py SOCKET    # the server (start() runs it, once a pytest session)
"""

import atexit
import base64
import builtins
import ctypes
import faulthandler
import functools
import importlib
import importlib.machinery
import json
import os
import pickle
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the recipes, their wrappers (scripts/gpu/nccl_rules.py, scripts/checks/inject_fault.py) and the tests' scripts
# import
PRELOAD = ["numpy", "PIL.Image", "torch", "torchvision", "torch.distributed.pipelining", "torch.utils.tensorboard",
           "torch.distributed.elastic.multiprocessing.errors", "tqdm", "byzfl"]
FDS = 2  # stdout, stderr
MESSAGE = 32 << 10  # requests longer than this are written to a file, which the forked process reads and deletes


# ---- the server ----------------------------------------------------------------------------------------------

def preload():
    sys.path.insert(0, str(ROOT))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # (byzfl, say, on a GPU node's Python: a recipe that needs it says so itself)
            pass
    for path in sorted((ROOT / "recipes").glob("*/*.py")):  # every recipe's modules but the scripts themselves
        if path.name not in ("train.py", "__init__.py"):
            importlib.import_module(f"recipes.{path.parent.name}.{path.stem}")
    sys.path.remove(str(ROOT))


def serve(path):
    faulthandler.register(signal.SIGUSR1)  # (where it waits, should a test hang: kill -USR1 on the server)
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p not in own]  # (a forked process puts its own PYTHONPATH first)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (a handler, so that the wake-up byte is written)
    selector = selectors.DefaultSelector()
    for fileobj in (listener, wakeup_r, sys.stdin):
        selector.register(fileobj, selectors.EVENT_READ)
    print("ready", flush=True)
    running = {}  # pid -> the client's connection, which gets the exit code
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:  # the tests' process is gone: so are the processes forked here
                return
            if key.fileobj is wakeup_r:
                os.read(wakeup_r, 4096)
                while running:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    connection = running.pop(pid, None)
                    if connection is None:
                        continue
                    try:
                        connection.send(str(os.waitstatus_to_exitcode(status)).encode())
                    except OSError:  # the test has stopped waiting for it
                        pass
                    connection.close()
                continue
            connection, _ = listener.accept()
            connection.settimeout(10)
            try:
                message, fds, _, _ = socket.recv_fds(connection, MESSAGE + 1024, FDS)
            except OSError:  # a test gone between its connect and its request
                connection.close()
                continue
            if len(fds) != FDS:
                connection.close()
                continue
            sys.stdout.flush(), sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError:  # (no memory, say: the test is told by the closed connection)
                pid = None
            if pid == 0:  # the server's files are not the forked process's
                selector.close()
                for fileobj in (listener, connection, sys.stdin, *running.values()):
                    fileobj.close()
                os.close(wakeup_r), os.close(wakeup_w)
                run_child(message, fds, base_path)
            for fd in fds:
                os.close(fd)
            if pid is None:
                connection.close()
                continue
            running[pid] = connection
            try:
                connection.send(str(pid).encode())
            except OSError:
                pass


def run_script(script):
    """What `python SCRIPT` does with it: a module __main__ of the script's code, its __file__ absolute."""
    path = os.path.abspath(script)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None, __spec__=None,
                           __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = module
    with open(path, "rb") as file:
        code = compile(file.read(), path, "exec")
    exec(code, module.__dict__)


def run_child(message, fds, base_path):
    """In the forked process: become `python SCRIPT ARGS` in the request's environment, run it (or spawn()'s
    function), exit as Python does."""
    code = 1
    try:
        request = json.loads(message)
        if "file" in request:
            path = request["file"]
            request = json.loads(Path(path).read_text())
            os.unlink(path)
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it ends with the server
        os.setsid()
        signal.set_wakeup_fd(-1)
        # as exec leaves them: what the test's process ignores stays ignored, the rest default, its mask kept;
        # then as Python starts: SIGINT raises KeyboardInterrupt (unless ignored), SIGPIPE and SIGXFSZ ignored
        for number in range(1, signal.NSIG):
            try:
                signal.signal(number, signal.SIG_IGN if number in request["ignored"] else signal.SIG_DFL)
            except (OSError, ValueError):  # SIGKILL, SIGSTOP, and numbers with no signal
                pass
        if signal.SIGINT not in request["ignored"]:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for number in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(number, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = sys.__stdin__ = open(0, closefd=False)
        for target, fd in zip((1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # PYTHONPATH's folders, absolute (from the working folder) and each once, as site.py leaves sys.path
        python_path = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        if request["call"]:  # spawn(): function(rank, *args), from a test module
            sys.path[:] = dict.fromkeys([str(ROOT / "tests"), str(ROOT), *python_path, *base_path])
            function, args = pickle.loads(base64.b64decode(request["call"]))
            main = functools.partial(function, int(request["env"]["RANK"]), *args)
        else:  # `python SCRIPT ARGS`
            script, *args = request["argv"]
            sys.path[:] = dict.fromkeys([os.path.dirname(os.path.abspath(script)), *python_path, *base_path])
            sys.argv = [script, *args]
            main = functools.partial(run_script, script)
        torch = sys.modules["torch"]
        random.seed(), sys.modules["numpy"].random.seed(), torch.seed()  # as a fresh interpreter seeds them
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count()))
        code = 0
        try:
            main()
        except SystemExit as exit:
            if exit.code is None or isinstance(exit.code, int):
                code = (exit.code or 0) & 0xFF
            else:
                print(exit.code, file=sys.stderr)
                code = 1
        except BaseException as error:  # the traceback from the script's own frames on, as Python prints it
            frames = error.__traceback__
            while frames.tb_next and frames.tb_frame.f_code.co_filename == __file__:
                frames = frames.tb_next
            sys.excepthook(type(error), error.with_traceback(frames), frames)
            code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
        threading._shutdown()  # as the interpreter ends: its threads joined, then the atexit functions
        atexit._run_exitfuncs()
        if code == -signal.SIGINT:  # Python ends an uncaught KeyboardInterrupt by SIGINT
            sys.stdout.flush(), sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # before the script ran: the request could not be set up
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush(), sys.stderr.flush()
        finally:
            os._exit(code)


# ---- the tests' side ------------------------------------------------------------------------------------------

server = {}  # the one server of this pytest session: its process and its socket's path


def start(env):
    """The server, started on the first call with env (the suite's child_env()), then the same one (started
    again should it have ended)."""
    if "process" not in server or server["process"].poll() is not None:
        folder = tempfile.mkdtemp(prefix="forkserver-")
        server["path"] = os.path.join(folder, "socket")
        server["process"] = subprocess.Popen([sys.executable, __file__, server["path"]], cwd=ROOT, env=env,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if server["process"].stdout.readline().strip() != "ready":
            raise RuntimeError(f"the fork server did not start (exit code {server['process'].wait()})")
        atexit.register(server["process"].stdin.close)  # its end of file ends it
    return server["path"]


def forkable(command):
    """Whether command is `python SCRIPT ...` with this Python: what a fork can stand for."""
    return len(command) >= 2 and command[0] == sys.executable and str(command[1]).endswith(".py")


class Forked:
    """subprocess.Popen's interface to a process forked by the server: pid, poll, wait, send_signal, terminate,
    kill, returncode."""

    def __init__(self, command, cwd, env, stdout, stderr, server_env, call=None, handled=()):
        """handled: signals its launcher handles (torchrun: SIGTERM, SIGINT, SIGHUP, SIGQUIT), which its
        process then starts with at their default even where the tests' process ignores them."""
        self.args, self.returncode = command, None
        self.connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.connection.connect(start(server_env))
        ignored = [number for number in range(1, signal.NSIG) if number not in (signal.SIGPIPE, signal.SIGXFSZ)
                   and number not in handled and signal.getsignal(number) == signal.SIG_IGN]  # (subprocess
        # restores SIGPIPE and SIGXFSZ)
        request = json.dumps({"argv": [str(part) for part in command[1:]], "cwd": str(cwd),
                              "env": {key: str(value) for key, value in env.items()}, "call": call,
                              "ignored": ignored, "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))})
        try:
            if len(request) > MESSAGE:  # (a socket's message has a size limit: a long one goes by file)
                with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
                    file.write(request)
                request = json.dumps({"file": file.name})
            socket.send_fds(self.connection, [request.encode()], [stdout.fileno(), stderr.fileno()])
        except BaseException:
            self.connection.close()
            raise
        self.pid = self.number(self.connection.recv(64))

    def number(self, message):
        if not message:  # (the server is gone: the next request starts another)
            raise RuntimeError(f"the fork server ended before {self.args} did")
        return int(message)

    def poll(self):
        if self.returncode is None:
            self.connection.setblocking(False)
            try:
                self.exited(self.connection.recv(64))
            except BlockingIOError:
                pass
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self.connection.settimeout(timeout)
            try:
                self.exited(self.connection.recv(64))
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def exited(self, message):
        self.returncode = self.number(message)
        self.connection.close()

    def send_signal(self, number):
        signal_group(self, number)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def signal_group(process, number):
    """What torchrun's agent does to stop a worker, for a Forked or a Popen process that leads a session of its
    own: the signal to its process group, unless it has ended."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, number)
        except ProcessLookupError:  # ended since poll() looked
            pass


def spawn(function, args, nprocs, env, timeout=300):
    """torch.multiprocessing.spawn(function, args, nprocs) with forked processes: function(rank, *args) in each
    (function and args pickled; function from a test module), RANK set in each one's env. When a process fails,
    the others are killed and AssertionError carries its exit code and stderr, as spawn's exception does."""
    call = base64.b64encode(pickle.dumps((function, args))).decode()
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(nprocs)]
    deadline, failed, processes = time.monotonic() + timeout, None, []
    try:
        for rank, (out, err) in enumerate(files):
            processes.append(Forked([sys.executable, function.__module__], ROOT, {**env, "RANK": str(rank)}, out, err,
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


def run(command, cwd, env, timeout, server_env):
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout), forked."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = Forked(command, cwd, env, out, err, server_env)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read())


if __name__ == "__main__":
    preload()
    import argparse  # (after the imports: scripts/checks/test_times.py counts the server's start-up up to parse_args)

    parser = argparse.ArgumentParser(description="the fork server: see the module's docstring")
    parser.add_argument("socket")
    serve(parser.parse_args().socket)
