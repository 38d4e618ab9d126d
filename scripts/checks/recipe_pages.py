"""README.md's table of recipes and its diff commands, and docs/flags.md's list of who takes which flags, from
the catalogue of recipes (recipes/__init__.py) and the recipes' own parsers.

    python scripts/checks/recipe_pages.py            # rewrite them
    python scripts/checks/recipe_pages.py --check    # exit 1 if a page is not what the catalogue says now

Only the text between `<!-- BEGIN name -->` and `<!-- END name -->` is rewritten, as in RESULTS.md; the diff
sizes are counted afresh, as `diff a b | grep -c '^[<>]'` counts them.
"""

import argparse
import difflib
import importlib
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from recipes import RECIPES  # noqa: E402


def source(name, root=ROOT):
    return (root / "recipes" / name / "train.py").read_text().splitlines()


def changed_lines(a, b, root=ROOT):
    """Lines removed plus lines added, as `diff a b | grep -c '^[<>]'` counts them."""
    return sum(line[:1] in "+-" and not line.startswith(("+++", "---"))
               for line in difflib.unified_diff(source(a, root), source(b, root), lineterm="", n=0))


def parser_of(name):
    """The parser recipes/<name>/train.py's parse_args builds (caught as it prints its --help)."""
    parsers = []
    real = argparse.ArgumentParser.format_help
    argparse.ArgumentParser.format_help = lambda self: parsers.append(self) or ""
    try:
        importlib.import_module(f"recipes.{name}.train").parse_args(["--help"])
    except SystemExit:
        pass
    finally:
        argparse.ArgumentParser.format_help = real
    [parser] = parsers
    return parser


def recipe_table(root=ROOT):
    rows = ["| recipe | what it teaches | read |", "|---|---|---|"]
    for entry in RECIPES:
        modules = [path for path in (root / "recipes" / entry.name).glob("*.py") if path.name != "train.py"]
        read = (f"`diff` against {entry.read_against}" if entry.read_against else
                f"`recipes/{entry.name}/train.py`{', then its modules' if modules else ''}")
        rows.append(f"| [`{entry.name}`](recipes/{entry.name}/README.md) | {entry.lesson} | {read} |")
    return "\n".join(rows)


def diff_commands(root=ROOT):
    commands = [(f"diff recipes/{entry.read_against}/train.py recipes/{entry.name}/train.py", entry)
                for entry in RECIPES if entry.read_against]
    width = max(len(command) for command, _ in commands) + 2
    lines = [f"{command:<{width}}# {entry.diff_shows} ({changed_lines(entry.read_against, entry.name, root)}"
             f"{' lines changed' if i == 0 else ''})" for i, (command, entry) in enumerate(commands)]
    return "\n".join(["```bash", *lines, "```"])


def flags_by_recipe():
    """Which recipes take the distributed flags and the mixed-precision flags (their parsers' groups)."""
    groups = {}
    for entry in RECIPES:
        for group in parser_of(entry.name)._action_groups:
            if group.title in ("distributed", "mixed precision"):
                flags = [action.option_strings[0] for action in group._group_actions
                         if action.help != argparse.SUPPRESS]
                groups.setdefault(group.title, [[], flags])[0].append(entry.name)
    return groups


def flags_list():
    names = [entry.name for entry in RECIPES]
    (distributed, distributed_flags), (mixed, mixed_flags) = (flags_by_recipe()[group] for group in
                                                              ("distributed", "mixed precision"))
    text = (f"Every recipe but {' and '.join(name for name in names if name not in distributed)} "
            f"({', '.join(distributed)}) adds {', '.join(f'`{flag}`' for flag in distributed_flags)}; "
            f"{' and '.join(mixed)} add {', '.join(f'`{flag}`' for flag in mixed_flags)}.")
    return textwrap.fill(text, 84, break_on_hyphens=False)


def sections():
    """{page: {marker name: text}}."""
    return {ROOT / "README.md": {"recipes": recipe_table(), "recipe-diffs": diff_commands()},
            ROOT / "docs" / "flags.md": {"flags-by-recipe": flags_list()}}


def rewritten(text, blocks):
    for name, body in blocks.items():
        pattern = re.compile(rf"<!-- BEGIN {name} -->\n.*?<!-- END {name} -->", re.S)
        if not pattern.search(text):
            raise SystemExit(f"error: no <!-- BEGIN {name} --> ... <!-- END {name} --> markers to write between")
        text = pattern.sub(lambda m: f"<!-- BEGIN {name} -->\n{body}\n<!-- END {name} -->", text)
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is out of date; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for page, blocks in sections().items():
        text = page.read_text()
        new = rewritten(text, blocks)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new)
    if args.check and stale:
        print(f"out of date: {', '.join(map(str, stale))}: run python scripts/checks/recipe_pages.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
