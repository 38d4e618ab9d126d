"""The recipes read as their lesson: short recipes, small diffs between them, short loop signatures,
a --help that keeps the docstring's layout, README excerpts that are the code itself, and a README
that is a map: short, a README per recipe, links that lead somewhere."""

import difflib
import importlib
import inspect
import re

import pytest
from conftest import ROOT

import recipes
from recipes import RECIPES
from recipes.common import RecipeError
from scripts.checks import recipe_pages
from scripts.checks.recipe_pages import changed_lines, source

EVERY_RECIPE = [entry.name for entry in RECIPES]
# the recipes read by their diffs (one against another), and the most lines `diff from to | grep -c '^[<>]'` may
# count, as the catalogue says
DIFF_LIMITS = {(entry.read_against, entry.name): entry.diff_at_most for entry in RECIPES if entry.read_against}
READ_BY_DIFFS = sorted({name for pair in DIFF_LIMITS for name in pair}, key=EVERY_RECIPE.index)


def test_the_single_device_recipe_is_short():
    assert len(source("nd")) <= 95


@pytest.mark.parametrize("pair", DIFF_LIMITS, ids="->".join)
def test_the_diff_between_two_recipes_is_the_lesson(pair):
    assert changed_lines(*pair) <= DIFF_LIMITS[pair]


def added_lines(a, b):
    """The lines `diff recipes/a/train.py recipes/b/train.py` marks with '>'."""
    return [line[1:] for line in difflib.unified_diff(source(a), source(b), lineterm="", n=0)
            if line.startswith("+") and not line.startswith("+++")]


@pytest.mark.parametrize("recipe", [entry.name for entry in RECIPES if entry.read_against])
def test_each_readme_names_what_its_diff_adds_and_the_diff_adds_it(recipe):
    entry = recipes.recipe(recipe)
    readme = (ROOT / "recipes" / recipe / "README.md").read_text()
    base = entry.read_against
    assert f"What it adds to {base}: `diff recipes/{base}/train.py recipes/{recipe}/train.py`" in readme
    blocks = re.findall(r"```\w*\n(.*?)```", readme, re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```\w*\n.*?```", "", readme, flags=re.S))
    added, quoted = "\n".join(added_lines(base, recipe)), "\n".join([*blocks, *spans])
    assert entry.diff_adds
    for code in entry.diff_adds:
        assert code in added, f"the diff from {base} to {recipe} adds no {code!r}"
        assert code in quoted, f"recipes/{recipe}/README.md does not name {code!r}"
    # "its diff against recipes/X/train.py is exactly ...": X is the recipe it is read against
    assert set(re.findall(r"diff\s+against\s+`recipes/(\w+)/train.py`\s+is\s+exactly", readme)) <= {base}


def test_the_nd_to_ddp_diff_holds_the_process_group_and_the_samplers_epoch():
    added = "\n".join(added_lines("nd", "ddp"))
    assert "dist.init_process_group(" in added and "train_sampler.set_epoch(epoch)" in added
    assert "init_process_group" not in "\n".join(source("nd")) and "set_epoch" not in "\n".join(source("nd"))


def test_the_readme_gives_the_diff_sizes_as_they_are():
    readme = (ROOT / "README.md").read_text()
    stated = {(a, b): int(n) for a, b, n in
              re.findall(r"diff recipes/(\w+)/train.py recipes/(\w+)/train.py +#[^\n]*?\((\d+)[ )]", readme)}
    assert stated == {pair: changed_lines(*pair) for pair in DIFF_LIMITS}


def test_the_readme_and_the_flags_page_list_the_recipes_as_the_catalogue_does():
    """README.md's table of recipes and its diffs, and docs/flags.md's list of who takes which flags, are what
    scripts/checks/recipe_pages.py writes from the catalogue now."""
    assert recipe_pages.main(["--check"]) == 0, "run python scripts/checks/recipe_pages.py"
    assert "| [`fsdp`](recipes/fsdp/README.md) | sharded data parallel" in recipe_pages.recipe_table()


@pytest.mark.parametrize("recipe", READ_BY_DIFFS)
def test_train_one_epoch_takes_at_most_7_parameters(recipe):
    train = importlib.import_module(f"recipes.{recipe}.train")
    assert len(inspect.signature(train.train_one_epoch).parameters) <= 7


def pages():
    """The README, each recipe's README, the topic pages and the tests' README (docs/tests.md is generated)."""
    return [ROOT / "README.md", *sorted((ROOT / "recipes").glob("*/README.md")),
            *sorted(page for page in (ROOT / "docs").glob("*.md") if page.name != "tests.md"),
            ROOT / "tests" / "README.md"]


def test_every_python_excerpt_in_the_pages_is_in_a_recipe():
    excerpts = [excerpt for page in pages() for excerpt in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]
    assert len(excerpts) >= 3
    recipes = {recipe: {line.strip() for line in source(recipe)} for recipe in READ_BY_DIFFS}
    for excerpt in excerpts:
        lines = {line.strip() for line in excerpt.splitlines() if line.strip()}
        assert any(lines <= recipe_lines for recipe_lines in recipes.values()), excerpt


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_help_keeps_the_docstrings_layout(recipe, capsys):
    train = importlib.import_module(f"recipes.{recipe}.train")
    with pytest.raises(SystemExit) as done:
        train.parse_args(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    docstring = inspect.cleandoc(train.__doc__)
    assert docstring in shown  # the example command on its own line, the paragraphs as written
    example = next(line for line in train.__doc__.splitlines() if f"recipes/{recipe}/train.py" in line)
    assert f"\n{example}\n" in shown


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_help_shows_every_flags_default(recipe):
    """Each flag's line in --help says its default (a switch's is off), read from the parser itself."""
    import argparse

    parser = recipe_pages.parser_of(recipe)
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.nargs == 0:
            continue  # (positional DIR, hidden flags, switches and --help)
        shown = formatter._expand_help(action)
        assert "default" in shown, (action.option_strings, shown)
        if action.default is not None:
            value = action.default[0] if isinstance(action.default, (list, tuple)) else action.default
            assert str(value) in shown or (isinstance(value, float) and f"{value:g}" in shown), (
                action.option_strings, shown)


def test_the_flags_page_says_which_recipe_takes_which_flag():
    """docs/flags.md against the parsers: each flag it names exists, the distributed and mixed-precision flags
    belong to the recipes it lists, and ps and the pipeline refuse, in one line, the flags it says they do."""
    page = (ROOT / "docs" / "flags.md").read_text()
    flags = {recipe: {flag for action in recipe_pages.parser_of(recipe)._actions for flag in action.option_strings}
             for recipe in EVERY_RECIPE}
    assert set(re.findall(r"`(--[a-z0-9-]+)", page)) <= set().union(*flags.values())
    listed = re.search(r"Every recipe but\s+nd and dp \(([^)]*)\) adds", page).group(1).split(", ")
    assert {recipe for recipe, taken in flags.items() if "--dist-url" in taken} == set(listed)
    assert "apex and fsdp add `--opt-level`" in page
    assert {recipe for recipe, taken in flags.items() if "--opt-level" in taken} == {"apex", "fsdp"}
    text = " ".join(page.split())
    for recipe, pattern in (("ps", r"parameter server refuses (.*?), and the pipeline"),
                            ("pipeline", r"and the pipeline (`.*?) \(it cuts")):
        refused = re.findall(r"`(--[a-z-]+)`", re.search(pattern, text).group(1))
        assert len(refused) >= 5, (recipe, refused)
        train = importlib.import_module(f"recipes.{recipe}.train")
        for flag in refused:
            value = {"--ema-decay": ["0.9"], "--accum-steps": ["2"], "--save-every": ["2"], "--profile": ["2"],
                     "--mixup-alpha": ["0.2"], "--cutmix-alpha": ["1"]}.get(flag, [])
            with pytest.raises(RecipeError, match=re.escape(flag)):
                train.parse_args(["--synthetic", flag, *value])


def test_range_checks_name_the_flag_and_the_value():
    from recipes.compression.train import parse_args

    for flags, line in ((["--workers", "-1"], "--workers must be 0 or more, got -1"),
                        (["--lr", "0"], "--lr must be positive, got 0.0"),
                        (["--hflip", "1.5"], "--hflip is a probability in [0, 1], got 1.5"),
                        (["--dist-timeout", "0"], "--dist-timeout must be positive, got 0.0"),
                        (["--powersgd-rank", "0"], "--powersgd-rank must be at least 1, got 0"),
                        (["--multiprocessing-distributed"], "--multiprocessing-distributed needs --dist-url")):
        with pytest.raises(RecipeError) as error:
            parse_args(["data", *flags])
        assert str(error.value).startswith(line), str(error.value)


def test_the_readme_is_a_map_with_a_readme_for_every_recipe():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for recipe in EVERY_RECIPE:
        assert (ROOT / "recipes" / recipe / "README.md").exists() and f"(recipes/{recipe}/README.md)" in readme, recipe


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_a_recipes_readme_teaches_without_repeating_its_docstrings(recipe):
    """Outside its commands, a recipe's README shares at most 15 runs of 8 words with any one file of its code
    (the docstrings, the --help, the comments): it says why, and links to them for the details."""
    def runs(text):
        words = re.findall(r"\w+", text.lower())
        return {" ".join(words[i:i + 8]) for i in range(len(words) - 7)}

    readme = runs(re.sub(r"```.*?```", "", (ROOT / "recipes" / recipe / "README.md").read_text(), flags=re.S))
    code = [*(ROOT / "recipes" / recipe).glob("*.py"), *(ROOT / "recipes" / "common").glob("*.py")]
    shared = {path.name: len(readme & runs(path.read_text())) for path in code}
    assert max(shared.values()) <= 15, {name: n for name, n in shared.items() if n > 15}


def test_no_two_scripts_import_each_other_and_each_part_keeps_its_folder():
    """scripts/ by part: make figures' parts and the GPU table in scripts/figures/<part>/ (measure.py, render.py), the
    device checks in scripts/gpu/, what a recipe runs under in scripts/harness/, the checks in scripts/checks/; the
    import graph between them has no cycle (no two modules, or chains of them, importing each other, even inside a
    function), and no arrow runs up from scripts/figures/ to the device checks that run it."""
    import ast

    from scripts.figures import PARTS

    modules = {".".join(path.relative_to(ROOT).with_suffix("").parts): path
               for path in (ROOT / "scripts").rglob("*.py")}
    imports = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scripts"):
                found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                          for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("scripts")}
        imports[name] = {m.removesuffix(".__init__") for m in found
                         if m in modules or f"{m}.__init__" in modules} - {name}

    def reaches(start, goal, seen=()):
        return any(m == goal or (m not in seen and reaches(m, goal, (*seen, m))) for m in imports.get(start, ()))

    assert not [name for name in imports if reaches(name, name)]
    assert not [name for name in imports if name.startswith("scripts.figures") and
                any(m.startswith("scripts.gpu") for m in imports[name])]
    for part in [*PARTS, "gpu"]:
        assert {"measure", "render"} <= {path.stem for path in (ROOT / "scripts" / "figures" / part).glob("*.py")}, part
    assert {path.name for path in (ROOT / "scripts").glob("*") if path.is_file()} == {
        "make_demo_data.py", "make_shards.py", "slurm_ddp.sbatch", "preemptible_torchrun.py",
        "loader_check.py"}  # (what a user runs by hand)


def test_no_script_is_longer_than_400_lines():
    """A script is one thing (a part's measuring, the GPU plan, the smoke check); past 400 lines it is two."""
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
               for path in (ROOT / "scripts").rglob("*.py")}
    assert max(lengths.values()) <= 400, {name: n for name, n in lengths.items() if n > 400}


def test_every_relative_link_of_the_pages_leads_to_a_file():
    for page in pages():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://", "mailto:")):
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: {target}"
