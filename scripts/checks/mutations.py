"""The mutation check: break each lesson on purpose and watch the tests that claim it fail.

    make test-mutations                      # every break, one after another
    python scripts/checks/mutations.py --only checkpoint-written-in-place weights-only-dropped   # some
    python scripts/checks/mutations.py --list       # the breaks and their tests

Each break in BREAKS (scripts/checks/breaks.py) is one exact text of the implementation replaced by another (the
feature switched off, as a slip in a change would switch it off), with the tests that
must catch it. For each break the tree (git's tracked and untracked files, not the
ignored ones) is copied to a temporary folder, the break applied there, and only its
tests run there, with PYTHONPATH putting the copy's `recipes` before the installed
one. First the tests of every chosen break run on a copy with nothing broken: they must
all pass (or a failure would prove nothing). A break is caught when pytest then reports
a failed test (exit 1); a break whose text no longer occurs exactly once, or whose
tests are not found, is an error of the list. It prints one line per break and exits 0
only when every break is caught.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(ROOT))

from scripts.checks.breaks import BREAKS  # noqa: E402 (the list: each break and the tests that must catch it)


def copy_tree(destination):
    """The working tree as git sees it (tracked and untracked files, not the ignored ones) into destination."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # (a file deleted but not yet committed is listed too)
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def apply(tree, mutation):
    """Write the break into the copy; None, or why it cannot be applied."""
    path = tree / mutation["file"]
    text = path.read_text() if path.is_file() else ""
    if not mutation["old"] and not mutation["new"]:  # the control: nothing broken
        return None
    if text.count(mutation["old"]) != 1:
        return f"its text occurs {text.count(mutation['old'])} times in {mutation['file']}, not once"
    path.write_text(text.replace(mutation["old"], mutation["new"]))
    return None


def run_tests(tree, tests, timeout):
    """(pytest's exit code, or None past the timeout; the end of its output), the tests run in the copy with the
    copy's packages first. Past the timeout the whole process group goes: the recipes the tests started too."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    with subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as pytest:
        try:
            output = pytest.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            os.killpg(pytest.pid, signal.SIGKILL)
            pytest.communicate()
            return None, f"its tests ran past {timeout} s"
    return pytest.returncode, output


def first_failure(output):
    """The first test pytest's summary names as failed (or erred), and why, in one line."""
    line = next((line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))), "")
    return line[:160]


def check(mutation, timeout=1200):
    """("caught" | "missed" | "error", seconds, detail): the break applied to a copy of the tree, its tests run."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutation-{mutation['name']}-") as folder:
        tree = Path(folder)
        copy_tree(tree)
        problem = apply(tree, mutation)
        if problem:
            return "error", time.monotonic() - started, problem
        code, output = run_tests(tree, mutation["tests"], timeout)
    seconds = time.monotonic() - started
    if code == 1:
        return "caught", seconds, first_failure(output)
    if code == 0:
        return "missed", seconds, "every test passed with the break in"
    tail = output.strip().splitlines()[-3:] if code is not None else [output]
    return "error", seconds, f"pytest exit {code}: {' | '.join(tail)}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these breaks (default: all)")
    parser.add_argument("--list", action="store_true", help="print the breaks and their tests, run nothing")
    args = parser.parse_args(argv)
    names = [mutation["name"] for mutation in BREAKS]
    unknown = sorted(set(args.only or []) - set(names))
    if unknown:
        parser.exit(2, f"error: no break named {', '.join(unknown)}; the breaks are: {', '.join(names)}\n")
    chosen = [mutation for mutation in BREAKS if not args.only or mutation["name"] in args.only]
    if args.list:
        for mutation in chosen:
            print(f"{mutation['name']:44s} {mutation['file']}\n{'':44s} caught by {', '.join(mutation['tests'])}")
        return 0
    started, outcomes = time.monotonic(), {}
    tests = sorted({test for mutation in chosen for test in mutation["tests"]})
    control = check(dict(name="none", file=chosen[0]["file"], old="", new="", tests=tests), timeout=300 * len(tests))
    if control[0] != "missed":  # ("missed" here: every test passed with nothing broken, as they must)
        print(f"error: the tests fail on the tree as it is, with no break in: {control[2]}", file=sys.stderr)
        return 2
    print(f"control: the {len(tests)} tests pass with no break in "
          f"({control[1]:.1f} s)", flush=True)
    for mutation in chosen:
        outcome, seconds, detail = check(mutation)
        outcomes[mutation["name"]] = outcome
        print(f"{outcome:7s} {mutation['name']:44s} {seconds:6.1f} s  {detail}", flush=True)
    caught = sum(outcome == "caught" for outcome in outcomes.values())
    print(f"{caught} of {len(chosen)} breaks caught in {(time.monotonic() - started) / 60:.1f} min")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
