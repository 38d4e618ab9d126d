"""The catalogue of recipes (recipes/__init__.py) is the one list of them: a recipe added there, with its folder,
is launched by the tests, run by the GPU check and documented on the pages, with no other list edited."""

import re
import shutil
import subprocess
import sys

from conftest import ROOT, child_env

from recipes import RECIPES

TOY_ENTRY = '''
RECIPES.append(Recipe("toy", "a throwaway copy of ddp", read_against="ddp", diff_shows="its name",
                      diff_at_most=6, diff_adds=('"toy"',), processes=2, evaluated_on=3))
'''


def test_the_catalogue_names_each_recipe_folder_once_in_reading_order():
    names = [entry.name for entry in RECIPES]
    assert len(names) == len(set(names))
    assert set(names) == {path.parent.name for path in (ROOT / "recipes").glob("*/train.py")}
    for entry in RECIPES:  # a recipe is read against one before it
        assert not entry.read_against or names.index(entry.read_against) < names.index(entry.name), entry.name
        assert (ROOT / "recipes" / entry.name / "README.md").is_file(), entry.name


def test_a_recipe_added_to_the_catalogue_is_launched_documented_and_checked(tmp_path):
    """A copy of the tree gains recipes/toy/ (ddp under another name) and one catalogue entry: the pages' generator
    finds them out of date and writes the toy's row, diff and flags; the GPU check lists its run; and the tests
    that go over every recipe collect it and pass on it (its --help, its README, a bad flag refused in one line,
    a complete run directory from 2 processes)."""
    tree = tmp_path / "tree"
    for folder in ("recipes", "scripts", "tests", "docs"):
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__", "times.json"))
    for page in ("README.md", "pyproject.toml", "RESULTS.md"):
        shutil.copy(ROOT / page, tree / page)
    toy = tree / "recipes" / "toy"
    toy.mkdir()
    (toy / "train.py").write_text((ROOT / "recipes" / "ddp" / "train.py").read_text()
                                  .replace("recipes/ddp/", "recipes/toy/").replace('"ddp"', '"toy"')
                                  .replace('f"ddp: ', 'f"toy: '))
    (toy / "README.md").write_text("# toy\n\nddp under another name (`\"toy\"`), to show what adding a recipe "
                                   "takes.\n\nWhat it adds to ddp: `diff recipes/ddp/train.py recipes/toy/train.py`.\n")
    catalogue = tree / "recipes" / "__init__.py"
    catalogue.write_text(catalogue.read_text() + TOY_ENTRY)
    env = child_env()

    def run(*command):
        return subprocess.run([sys.executable, *command], cwd=tree, env=env, capture_output=True, text=True,
                              timeout=600)

    assert run("scripts/checks/recipe_pages.py", "--check").returncode == 1
    assert run("scripts/checks/recipe_pages.py").returncode == 0
    readme, flags = (tree / "README.md").read_text(), (tree / "docs" / "flags.md").read_text()
    assert "| [`toy`](recipes/toy/README.md) | a throwaway copy of ddp | `diff` against ddp |" in readme
    assert re.search(r"diff recipes/ddp/train.py recipes/toy/train.py +# its name \(\d+\)", readme), readme
    assert re.search(r"\(ddp, apex, compression, fsdp, ps, pipeline, toy\) adds", " ".join(flags.split()))
    listed = run("scripts/gpu/smoke.py", "--list")
    assert re.search(r"^toy +.*recipes/toy/train.py", listed.stdout, re.M), listed.stdout + listed.stderr
    passed = run("-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/recipes/test_recipes.py",
                 "tests/common/test_bad_input.py", "tests/common/test_own_data.py", "tests/recipes/test_shape.py", "-k",
                 "toy or readme or flags_page")
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-2000:]
    for test in ("test_recipe_writes_complete_run_directory[toy]", "test_every_recipe_refuses_a_bad_flag_in_one_line"
                 "[toy]", "test_best_checkpoint_evaluates_on_val_alone_without_a_batch_size[toy]",
                 "test_the_diff_between_two_recipes_is_the_lesson[ddp->toy]", "test_help_keeps_the_docstrings_layout"
                 "[toy]"):
        assert re.search(rf"::{re.escape(test)} PASSED", passed.stdout), (test, passed.stdout[-3000:])
