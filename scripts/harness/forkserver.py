"""The fork server of scripts/harness/launch.py: a server that has imported torch, torchvision, byzfl and the recipes
once, and forks a process for each request, which then makes itself what `python SCRIPT ARGS` started fresh would
be (launch.py's docstring lists what it is promised, and tests/tools/test_forked.py checks each promise). A process
starts in milliseconds, where a fresh interpreter spends about 2.5 s importing on 2 cores (more with byzfl): most
of the test suite's time before (docs/tests.md: where the time goes), and 25 s of a short parameter-server run.

The server is started by the first request of the process that launches (start()), with that process's stdin as
its lifeline: when the launching process ends, SIGKILL included, the server reads the end of its stdin and ends,
and each process it forked has asked the kernel to SIGKILL it when the server ends (Linux's PR_SET_PDEATHSIG).

    python scripts/harness/forkserver.py SOCKET    # the server (start() runs it, once a launching process)
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
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what the recipes, their wrappers (scripts/harness/nccl_rules.py, scripts/harness/inject_fault.py) and the tests'
# scripts import
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
            if key.fileobj is sys.stdin:  # the launching process is gone: so are the processes forked here
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
        script, *args = request["argv"]
        folder = os.path.dirname(os.path.abspath(script))
        if request["call"]:  # launch.spawn(): function(rank, *args), from the module SCRIPT (and the clone's packages)
            sys.path[:] = dict.fromkeys([folder, str(ROOT), *python_path, *base_path])
            function, args = pickle.loads(base64.b64decode(request["call"]))
            main = functools.partial(function, int(request["env"]["RANK"]), *args)
        else:  # `python SCRIPT ARGS`
            sys.path[:] = dict.fromkeys([folder, *python_path, *base_path])
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


# ---- the launching process's side -------------------------------------------------------------------------------

servers = {}  # this process's servers, one for each OMP_NUM_THREADS: its process and its socket's path


def start(env):
    """The server for env's OMP_NUM_THREADS (which numpy's BLAS reads as the server imports it), started on the
    first call with that number with env (the tests' child_env(), the measuring's environment), then the same one
    (started again should it have ended). A forked process is given its own env: the server's matters only as
    it imports."""
    server = servers.setdefault(env.get("OMP_NUM_THREADS"), {})
    if "process" not in server or server["process"].poll() is not None:
        folder = tempfile.mkdtemp(prefix="forkserver-")
        server["path"] = os.path.join(folder, "socket")
        server["process"] = subprocess.Popen([sys.executable, __file__, server["path"]], cwd=ROOT, env=env,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if server["process"].stdout.readline().strip() != "ready":
            raise RuntimeError(f"the fork server did not start (exit code {server['process'].wait()})")
        atexit.register(stop, server["process"])
    return server["path"]


def stop(process):
    """At the launching process's exit: the server's stdin closed, whose end of file ends it, and the server
    waited for."""
    process.stdin.close()
    process.stdout.close()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def forkable(command):
    """Whether command is `python SCRIPT ...` with this Python, on Linux: what a fork can stand for (the server
    stands on Linux's sockets and parent-death signal)."""
    return (sys.platform.startswith("linux") and len(command) >= 2 and command[0] == sys.executable
            and str(command[1]).endswith(".py"))


class Forked:
    """subprocess.Popen's interface to a process forked by the server: pid, poll, wait, send_signal, terminate,
    kill, returncode."""

    def __init__(self, command, cwd, env, stdout, stderr, server_env, call=None, handled=()):
        """call: launch.spawn()'s function and arguments, pickled (command[1] is then the function's module).
        handled: signals its launcher handles (torchrun: SIGTERM, SIGINT, SIGHUP, SIGQUIT), which its process then
        starts with at their default even where the launching process ignores them."""
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


if __name__ == "__main__":
    preload()
    import argparse  # (after the imports: scripts/checks/test_times.py counts the server's start-up up to parse_args)

    parser = argparse.ArgumentParser(description="the fork server: see the module's docstring")
    parser.add_argument("socket")
    serve(parser.parse_args().socket)
    os._exit(0)  # (at once: nothing of its own to tear down, and the processes it forked end with it)
