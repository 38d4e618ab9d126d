"""Check a recipe's list of deviations from its authors' code (recipes/<recipe>/deviations.py) against clones of
that code: every file a row names exists, every line it names is in that file, and the line each row quotes
(`shows`) holds the quoted piece.

    python scripts/checks/authors_lines.py pipeline CLONE    # a clone of Hsword/VLDB2023_SDPipe
    python scripts/checks/authors_lines.py ps CLONE...       # one clone of each of the ps recipe's four repositories

A clone is a work tree or a bare one; with several repositories, each clone is the one whose path holds the
repository's name (xcgoner/zeno_ps: .../zeno_ps/...). Each is read at the commit the list names. Prints one line
per row; exits 1 if any row is off.
"""

import argparse
import importlib
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SD_PIPE = "Hsword/VLDB2023_SDPipe"


def authors_code(recipe):
    """(DEVIATIONS, {short name: (repository, path)}, {repository: commit}) of a recipe's list. The pipeline's is of
    one repository: its FILES are paths, and a file it cites by path needs no short name."""
    deviations = importlib.import_module(f"recipes.{recipe}.deviations")
    if recipe == "pipeline":
        return (deviations.DEVIATIONS, {name: (SD_PIPE, path) for name, path in deviations.FILES.items()},
                {SD_PIPE: deviations.AUTHORS_COMMIT})
    return deviations.DEVIATIONS, deviations.FILES, deviations.AUTHORS_COMMITS


def place(files, commits, name):
    """(repository, path) of a file a row names: its short name, or (one repository) its path there."""
    return files[name] if name in files else (next(iter(commits)), name) if len(commits) == 1 else (None, name)


def cited(where, files, commits):
    """[((repository, path), [line, ...])] of a row's `where`: "file 1-3, 7; other 9"."""
    places = []
    for part in where.split(";"):
        name, numbers = part.strip().split(" ", 1)
        lines = []
        for span in numbers.split(","):
            first, _, last = span.strip().partition("-")
            lines += [int(first), int(last or first)]
        places.append((place(files, commits, name), lines))
    return places


def read(clone, commit, path):
    """The file's lines at the commit, or None where it has no such file."""
    git_dir = clone if (clone / "HEAD").exists() and not (clone / ".git").exists() else clone / ".git"
    result = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"],
                            capture_output=True, text=True)
    return result.stdout.splitlines() if result.returncode == 0 else None


def problems(clones, files, commits, row):
    name, number, piece = row["shows"]
    shown = place(files, commits, name)
    texts, found = {}, []
    for (repository, path), lines in cited(row["where"], files, commits) + [(shown, [number])]:
        if repository is None:
            found.append(f"no file named {path} in FILES")
            continue
        if (repository, path) not in texts:
            texts[repository, path] = read(clones[repository], commits[repository], path)
        text = texts[repository, path]
        if text is None:
            found.append(f"no {path} in {repository}")
        elif max(lines) > len(text):
            found.append(f"{path} has {len(text)} lines, not {max(lines)}")
    text = texts.get(shown)
    if text is not None and number <= len(text) and piece not in text[number - 1]:
        found.append(f"{shown[1]} {number} reads {text[number - 1].strip()!r}, not {piece!r}")
    return found


def match_clones(paths, commits):
    """{repository: its clone}: the one clone of a single repository, else the clone whose path holds its name."""
    if len(commits) == 1 and len(paths) == 1:
        return {next(iter(commits)): paths[0]}
    clones = {}
    for repository in commits:
        named = [path for path in paths if repository.split("/")[1] in str(path.resolve())]
        if len(named) != 1:
            raise SystemExit(f"{len(named)} of the clones given hold {repository.split('/')[1]} in their path: "
                             f"give one clone of each of {', '.join(commits)}")
        clones[repository] = named[0]
    return clones


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", choices=["pipeline", "ps"])
    parser.add_argument("clones", type=Path, nargs="+")
    args = parser.parse_args(argv)
    deviations, files, commits = authors_code(args.recipe)
    clones = match_clones(args.clones, commits)
    failed = 0
    for row in deviations:
        found = problems(clones, files, commits, row)
        failed += bool(found)
        print(f"{'off' if found else 'ok '}  {re.sub(r'`', '', row['here'])[:70]}")
        for problem in found:
            print(f"     {problem}")
    at = ", ".join(f"{repository} at {commit[:7]}" for repository, commit in commits.items())
    print(f"{len(deviations) - failed} of {len(deviations)} rows match the authors' code: {at}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
