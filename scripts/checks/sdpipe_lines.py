"""Check recipes/pipeline/deviations.py against SD-PIPE's code: every file a row names exists, every line it
names is in that file, and the line each row quotes (`shows`) holds the quoted piece.

    python scripts/checks/sdpipe_lines.py CLONE    # a clone of Hsword/VLDB2023_SDPipe (a work tree or a bare one)

The clone is read at deviations.AUTHORS_COMMIT. Prints one line per row; exits 1 if any row is off.
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from recipes.pipeline.deviations import AUTHORS_COMMIT, DEVIATIONS, FILES


def read(clone, path):
    """The file's lines at AUTHORS_COMMIT, or None where it has no such file."""
    git_dir = clone if (clone / "HEAD").exists() and not (clone / ".git").exists() else clone / ".git"
    result = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{AUTHORS_COMMIT}:{path}"],
                            capture_output=True, text=True)
    return result.stdout.splitlines() if result.returncode == 0 else None


def cited(where):
    """[(path, [line, ...])] of a row's `where`: "file 1-3, 7; other 9"."""
    places = []
    for part in where.split(";"):
        name, numbers = part.strip().split(" ", 1)
        lines = []
        for span in numbers.split(","):
            first, _, last = span.strip().partition("-")
            lines += [int(first), int(last or first)]
        places.append((FILES.get(name, name), lines))
    return places


def problems(clone, row):
    name, number, piece = row["shows"]
    shown = FILES.get(name, name)
    texts, found = {}, []
    for path, lines in cited(row["where"]) + [(shown, [number])]:
        text = texts[path] = texts[path] if path in texts else read(clone, path)
        if text is None:
            found.append(f"no {path}")
        elif max(lines) > len(text):
            found.append(f"{path} has {len(text)} lines, not {max(lines)}")
    text = texts[shown]
    if text is not None and number <= len(text) and piece not in text[number - 1]:
        found.append(f"{shown} {number} reads {text[number - 1].strip()!r}, not {piece!r}")
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("clone", type=Path)
    args = parser.parse_args(argv)
    failed = 0
    for row in DEVIATIONS:
        found = problems(args.clone, row)
        failed += bool(found)
        print(f"{'off' if found else 'ok '}  {re.sub(r'`', '', row['here'])[:70]}")
        for problem in found:
            print(f"     {problem}")
    print(f"{len(DEVIATIONS) - failed} of {len(DEVIATIONS)} rows match SD-PIPE's code at {AUTHORS_COMMIT[:7]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
