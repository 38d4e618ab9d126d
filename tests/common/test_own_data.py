"""A newcomer's own small folder, 3 classes x 20 images: docs/data.md's commands run as written, and every
recipe's best.pt evaluates with -e on val/ alone, without -b, to the top-1 its run logged."""

import json
import re
import shlex
import shutil
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import ROOT, run_python, run_recipe

from recipes import RECIPES

CLASSES, IMAGES = ("cat", "dog", "fox"), 20  # per class, in train/ and in val/


def write_own_folder(root):
    """JPEGs of a few sizes, the class a faint colour under heavy noise: a few epochs learn it in part, so that
    top-1 stays well under 100 % and moves from epoch to epoch (best.pt is often not the last epoch's)."""
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for c, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(IMAGES):
                pixels = rng.integers(0, 200, (36 + i % 3 * 6, 44, 3))
                pixels[..., c] += 12
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"IMG_{i:04d}.jpg")
    return root


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    return write_own_folder(tmp_path_factory.mktemp("own") / "DIR")


@pytest.fixture(scope="module")
def val_only(own_data, tmp_path_factory):
    """The same val/, and no train/."""
    root = tmp_path_factory.mktemp("val-only")
    shutil.copytree(own_data / "val", root / "val")
    return root


def data_md_commands():
    """The recipe commands of docs/data.md's "Your own data", as written."""
    page = (ROOT / "docs" / "data.md").read_text()
    section = page[page.index("## Your own data"):]
    return [line.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)
            for line in block.splitlines() if line.strip().startswith("python recipes/")]


def read_json(path):
    return json.loads(path.read_text())


def test_docs_data_commands_run_as_written_on_a_folder_of_ones_own(own_data, tmp_path):
    """In a directory holding DIR (the folder) and the clone's recipes/: each command, word for word, runs;
    the first line counts the images and classes found, and the evaluation of best.pt gives the run's best."""
    commands = data_md_commands()
    assert len(commands) >= 2 and any(" -e " in command for command in commands), commands
    shutil.copytree(own_data, tmp_path / "DIR")
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    outputs = []
    for command in commands:
        words = shlex.split(command)
        result = run_python([sys.executable, *words[1:]], cwd=tmp_path)
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        outputs.append(result.stdout)
    assert f"{3 * IMAGES} train / {3 * IMAGES} val images of 3 classes" in outputs[0].splitlines()[0]
    runs = {read_json(path.parent / "args.json")["evaluate"]: read_json(path)
            for path in (tmp_path / "runs").glob("*/summary.json")}
    trained, evaluated = runs[False], runs[True]
    assert evaluated["top1"] == trained["best_top1"] and evaluated["val_images"] == 3 * IMAGES


# recipe: (its training processes, its evaluating processes, training's flags, evaluation's flags), as the
# catalogue says (ps trains with 1 server, no validator and 2 workers, and evaluates with 2 servers, 1 validator
# and 2 workers)
EVERY_RECIPE = {entry.name: (entry.processes, entry.evaluated_on, list(entry.trained_with),
                             [*entry.trained_with, *entry.evaluated_with]) for entry in RECIPES}


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_best_checkpoint_evaluates_on_val_alone_without_a_batch_size(recipe, own_data, val_only, tmp_path):
    """-e needs neither train/ nor -b (default 256 > the 60 images, which training refuses): best.pt of a run
    scores the run's best top-1, on another number of processes."""
    train_nproc, eval_nproc, train_flags, eval_flags = EVERY_RECIPE[recipe]
    run = tmp_path / "run"
    run_recipe(recipe, [own_data, "-a", "lenet", "--image-size", "32", "-b", "8", "--epochs", "3", "-j", "0",
                        "--seed", "0", "--lr", "0.5", *train_flags, "--out", run], nproc=train_nproc)
    trained = read_json(run / "summary.json")
    out = tmp_path / "evaluate"
    result = run_recipe(recipe, [val_only, "-e", "--resume", run / "best.pt", "-j", "0", *eval_flags, "--out", out],
                        nproc=eval_nproc)
    evaluated = read_json(out / "summary.json")
    assert f"evaluating lenet on {3 * IMAGES} val images of 3 classes" in result.stdout
    assert evaluated["val_images"] == 3 * IMAGES and evaluated["global_batch"] is None
    assert evaluated["top1"] == trained["best_top1"], (evaluated, trained)
