"""docs/tests.md from the tests themselves: where the suite's time goes (tests/times.json, measured by
scripts/checks/test_times.py), then each file's docstring and each test's name as the sentence it is.

    python scripts/checks/list_tests.py            # rewrite docs/tests.md
    python scripts/checks/list_tests.py --check    # exit 1 if docs/tests.md is not what the tests say now

A test's name is its claim (test_a_crash_between_write_and_rename_leaves_the_old_checkpoint); the
list says nothing the names do not, so what the README promises of the suite is what this page shows.
"""

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tests.md"
TIMES = ROOT / "tests" / "times.json"
HEADER = """# What the tests show

Generated from `tests/` by `scripts/checks/list_tests.py` (`make test` fails when this page is out of date):
each test's name, as the sentence it is, and the first sentence of its docstring, file by file.
`make test` runs them all on CPU with gloo; `make test-mutations` breaks each lesson in a copy of the
tree and checks that the tests named for it fail (`scripts/checks/mutations.py`).
"""


def decorations(function):
    """'for each of its cases' for a parametrized test, the skip condition's reason for a skipif."""
    notes = []
    for decorator in function.decorator_list:
        text = ast.unparse(decorator)
        if ".parametrize(" in text and "for each of its cases" not in notes:
            notes.append("for each of its cases")
        elif ".skipif(" in text:
            reason = next((ast.literal_eval(k.value) for k in decorator.keywords if k.arg == "reason"), "")
            notes.append(f"skipped where {reason}" if reason else "skipped on some machines")
    return f" ({'; '.join(notes)})" if notes else ""


def how(function):
    """The first sentence of the test's docstring, where it has one: how it shows what its name says."""
    text = " ".join((ast.get_docstring(function) or "").split())
    sentence = text.split(". ")[0].rstrip(".")
    return f": {sentence}." if sentence else ""


def shown(name):
    """A test file's path as the page shows it: from tests/."""
    return Path(name).relative_to("tests").as_posix()


def times():
    """The table of where the time goes, from tests/times.json."""
    if not TIMES.is_file():
        return ["\n## Where the time goes\n", "Not measured yet: `python scripts/checks/test_times.py` measures it.\n"]
    measured = json.loads(TIMES.read_text())
    files, parts = measured["files"], ("startup_s", "training_s", "waiting_s", "pytest_s")
    total = {key: sum(row[key] for row in files.values()) for key in ("tests", "interpreters", *parts)}
    wall = sum(total[part] for part in parts)
    make_test = measured.get("make_test")
    timed = ("`make test` has not been timed on its workers yet (`python scripts/checks/test_times.py --workers`). "
             if make_test is None else
             f"`make test` on {make_test['cores']} cores ({make_test['cpu']}; torch {make_test['torch']}, Python "
             f"{make_test['python']}), timed by `scripts/checks/test_times.py --workers` on {make_test['measured']}: "
             f"{make_test['tests']} tests in {make_test['total_s'] / 60:.1f} minutes on {make_test['workers']} "
             "pytest-xdist workers. ")
    again = ", ".join(shown(name) for name in measured.get("measured_again", []))
    again = f" (the rows of {again} measured again since, those files alone)" if again else ""
    lines = ["\n## Where the time goes\n",
             timed + f"One test at a time, on {measured['cores']} cores ({measured['cpu']}; torch {measured['torch']}, "
             f"Python {measured['python']}), measured by `scripts/checks/test_times.py` on {measured['measured']}: "
             f"{total['tests']} tests in {measured['total_s'] / 60:.1f} minutes, "
             f"{measured['collection_s']:.0f} s of them collecting{again}. Each file's seconds are split four ways: "
             "**start-up**, a fresh Python importing torch and the recipes (the tests' ranks are forked from a "
             "server that imported them once: `scripts/harness/launch.py`; the tests of launchers start real ones); "
             "**training**, the processes past their start-up computing; **waiting**, those processes alive but "
             "idle (a peer, a timeout, a sleep); **pytest**, none of them alive (the tests that compute in "
             "pytest's own process, fixtures). The last column counts the fresh Pythons the file started.\n",
             "| file | tests | seconds | start-up | training | waiting | pytest | Pythons started |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for name, row in sorted(files.items(), key=lambda item: -sum(item[1][part] for part in parts)):
        seconds = sum(row[part] for part in parts)
        lines.append(f"| [{shown(name)}](../{name}) | {row['tests']} | {seconds:.0f} | " + " | ".join(
            f"{row[part]:.0f}" for part in parts) + f" | {row['interpreters']} |")
    for path in test_files():
        name = path.relative_to(ROOT).as_posix()
        if name not in files:
            lines.append(f"| [{path.relative_to(ROOT / 'tests').as_posix()}](../{name}) | not measured | | | | | | |")
    lines.append(f"| all | {total['tests']} | {wall:.0f} | " + " | ".join(
        f"{total[part]:.0f} ({total[part] / wall:.0%})" for part in parts) + f" | {total['interpreters']} |")
    return lines


def test_files():
    """tests/<what they test>/test_*.py, folder by folder (tests/README.md: recipes, common, tools)."""
    return sorted((ROOT / "tests").glob("*/test_*.py"))


def page():
    lines = [HEADER, *times()]
    for path in test_files():
        module = ast.parse(path.read_text())
        tests = [node for node in module.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
        docstring = (ast.get_docstring(module) or "").split("\n\n")[0].replace("\n", " ")
        name = path.relative_to(ROOT / "tests").as_posix()
        lines.append(f"\n## [{name}](../tests/{name}): {docstring}\n")
        lines += [f"- {test.name[len('test_'):].replace('_', ' ')}{decorations(test)}{how(test)}" for test in tests]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare docs/tests.md with the tests")
    args = parser.parse_args(argv)
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != page():
            print(f"error: {PAGE.relative_to(ROOT)} is not what tests/ says now: run python "
                  f"scripts/checks/list_tests.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
