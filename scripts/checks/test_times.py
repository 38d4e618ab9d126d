"""Where the suite's time goes, file by file: written to tests/times.json, which scripts/checks/list_tests.py renders
into docs/tests.md.

    python scripts/checks/test_times.py                      # the suite as `make test` runs it, then the page
    python scripts/checks/test_times.py tests/recipes/test_ps.py     # these files again; the other files' rows are kept
    python scripts/checks/test_times.py --workers                    # make test's own time, on its workers

`make test` runs the tests on pytest-xdist workers (WORKERS), as many at a time; here, file by file, they run one
at a time, so that each second has one file to go to.

pytest runs in this process. Every 0.1 s a sampler reads, from /proc, the CPU time of each process the suite
started, and gives the wall time since the last sample to one of four parts:
- start-up: while a Python it started is importing (from its start to its first parse_args call, as this
  script's sitecustomize.py marks it, on PYTHONPATH for every process the suite starts);
- training: while its processes past their start-up use the CPU (the recipes' runs, their evaluation, and
  whatever else the children compute);
- waiting: while the suite's processes are alive but idle (a peer, a timeout, a sleep);
- pytest: while no process of the suite's is alive (collection, fixtures, the tests that compute in pytest's
  own process); the tests' fork server (scripts/harness/forkserver.py) counts while it starts, not while it waits.
Where processes starting and processes past their start-up share an interval, it is split by their CPU time.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMES = ROOT / "tests" / "times.json"
SITE = Path(__file__).resolve().parent / "test_times_site"  # its sitecustomize.py marks each Python's start-up
MAKE_TEST = ["-q", "-p", "no:cacheprovider", "--ignore=tests/tools/test_gpu_check.py"]  # as the Makefile's `test` runs,
WORKERS = ["-n", "2", "--dist", "loadgroup"]  # on its workers
PARTS = ("startup", "training", "waiting", "pytest")
TICK = os.sysconf("SC_CLK_TCK")
IDLE = 0.15  # below this many CPU seconds per wall second, the suite's processes count as waiting


def processes():
    """{pid: (parent pid, CPU seconds so far)} of every process on the machine."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone since the listing
                continue
            found[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return found


def command_line(pid, cache={}):
    """pid's command line, as a list of bytes (empty once it is gone)."""
    if pid not in cache:
        try:
            cache[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cache[pid] = []
    return cache[pid]


def is_python(pid):
    return b"python" in (command_line(pid) or [b""])[0].lower()


class Sampler:
    """pytest's hooks give the test that runs; a thread gives each 0.1 s to that test's file and one part."""

    def __init__(self, marks):
        self.marks, self.current, self.stop = marks, None, threading.Event()
        self.seconds = defaultdict(Counter)  # file -> part -> wall seconds
        self.tests, self.started = Counter(), Counter()  # file -> tests run, Pythons started
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self):
        me, cpu_before, last = os.getpid(), {}, time.monotonic()
        while not self.stop.wait(0.1):
            now, table = time.monotonic(), processes()
            children = defaultdict(list)
            for pid, (parent, _) in table.items():
                children[parent].append(pid)
            suite, todo = [], list(children[me])
            while todo:
                pid = todo.pop()
                todo += children[pid]
                fork_server = pid in children[me] and any(part.endswith(b"forkserver.py") for part in command_line(pid))
                if not (fork_server and (self.marks / f"{pid}.ready").exists()):
                    suite.append(pid)  # (the fork server, idle between tests once started, is not the tests')
            starting = working = 0.0
            for pid in suite:
                used = table[pid][1] - cpu_before.get(pid, 0.0)  # (a new process: all it used)
                if is_python(pid) and not (self.marks / f"{pid}.ready").exists():
                    starting += used
                else:
                    working += used
            cpu_before = {pid: table[pid][1] for pid in suite}
            wall, last = now - last, now
            part = self.seconds[self.current or "(between tests)"]
            if not suite:
                part["pytest"] += wall
            elif starting + working < IDLE * wall:
                part["waiting"] += wall
            else:
                part["startup"] += wall * starting / (starting + working)
                part["training"] += wall * working / (starting + working)

    # pytest's hooks
    def pytest_collection_finish(self, session):
        self.collected = time.monotonic()

    def pytest_runtest_logstart(self, nodeid, location):
        self.current = nodeid.split("::")[0]

    def pytest_runtest_logfinish(self, nodeid, location):
        file = nodeid.split("::")[0]
        self.tests[file] += 1
        for mark in self.marks.glob("*.exec"):  # each a Python that started during the test
            self.started[file] += 1
            mark.unlink()
        self.current = None


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def time_make_test(pytest, torch):
    """The suite as make test runs it, on its workers: its wall time and the tests run, into tests/times.json's
    make_test."""
    finished = []

    class Count:
        def pytest_runtest_logfinish(self, nodeid, location):
            finished.append(nodeid)

    started = time.monotonic()
    code = pytest.main([*MAKE_TEST, *WORKERS], plugins=[Count()])
    total = time.monotonic() - started
    measured = json.loads(TIMES.read_text()) if TIMES.is_file() else {"files": {}}
    measured["make_test"] = {
        "measured": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
        "python": platform.python_version(), "workers": int(WORKERS[1]), "pytest_exit": int(code),
        "tests": len(set(finished)), "total_s": round(total, 1)}
    TIMES.write_text(json.dumps(measured, indent=1) + "\n")
    print(f"wrote {TIMES.relative_to(ROOT)}: make test in {total / 60:.1f} minutes on {WORKERS[1]} workers, "
          f"pytest's exit code {int(code)}")
    from list_tests import main as write_page
    write_page([])
    return int(code)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="test files to measure again (default: the whole of make test)")
    parser.add_argument("--workers", action="store_true",
                        help="time the whole of make test on its workers instead; the files' rows are kept")
    args = parser.parse_args(argv)
    import pytest  # (here: the sitecustomize below reaches only the processes pytest starts)
    import torch

    if args.workers:
        return time_make_test(pytest, torch)

    marks = Path(tempfile.mkdtemp(prefix="test-times-"))
    os.environ.update(TEST_TIMES_MARKS=str(marks), PYTHONPATH=os.pathsep.join(
        filter(None, [str(SITE), os.environ.get("PYTHONPATH")])))
    sampler = Sampler(marks)
    started = time.monotonic()
    sampler.thread.start()
    code = pytest.main([*MAKE_TEST, *args.files], plugins=[sampler])
    sampler.stop.set()
    sampler.thread.join()
    total = time.monotonic() - started
    kept = json.loads(TIMES.read_text()) if TIMES.is_file() else {}
    old = kept if args.files else {"files": {}}
    files = {**old["files"], **{
        file: {"tests": sampler.tests[file], "interpreters": sampler.started[file],
               **{f"{part}_s": round(sampler.seconds[file][part], 1) for part in PARTS}}
        for file in sorted(sampler.tests)}}
    TIMES.write_text(json.dumps({
        "measured": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
        "python": platform.python_version(), "pytest_exit": int(code),
        "total_s": round(total, 1) if not args.files else old.get("total_s"),
        "collection_s": round(sampler.collected - started, 1) if not args.files else old.get("collection_s"),
        "measured_again": sorted(set(old.get("measured_again", [])) | set(sampler.tests)) if args.files else [],
        "files": dict(sorted(files.items())), **({"make_test": kept["make_test"]} if "make_test" in kept else {})},
        indent=1) + "\n")
    print(f"wrote {TIMES.relative_to(ROOT)}: {total / 60:.1f} minutes, pytest's exit code {int(code)}")
    from list_tests import main as write_page
    write_page([])
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
