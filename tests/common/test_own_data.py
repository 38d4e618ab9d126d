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
    cache = pretrained_in_cache(tmp_path / "torch", "resnet18")  # (--pretrained's file, as if downloaded before)
    outputs = []
    for command in commands:
        words = shlex.split(command)
        result = run_python([sys.executable, *words[1:]], cwd=tmp_path, env={"TORCH_HOME": str(tmp_path / "torch")})
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        outputs.append(result.stdout)
    assert f"{3 * IMAGES} train / {3 * IMAGES} val images of 3 classes" in outputs[0].splitlines()[0]
    runs = {path.parent.name: read_json(path) for path in (tmp_path / "runs").glob("*/summary.json")}
    trained, evaluated = runs["try"], runs["nd-evaluate"]
    assert evaluated["top1"] == trained["best_top1"] and evaluated["val_images"] == 3 * IMAGES
    assert any("--pretrained" in command for command in commands) and "tuned" in runs and cache.exists()


def pretrained_in_cache(torch_home, arch):
    """torch.hub's cache under torch_home holding the file torchvision names for arch's default weights: a
    stand-in, the model's own initial weights, with the real file's names and shapes."""
    import torch
    import torchvision

    from recipes.common import models

    url = torchvision.models.get_model_weights(arch).DEFAULT.url
    cached = torch_home / "hub" / "checkpoints" / url.rsplit("/", 1)[1]
    cached.parent.mkdir(parents=True, exist_ok=True)
    torch.save(models.build_model(arch, 1000).state_dict(), cached)
    return cached


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


def test_fine_tuning_starts_from_weights_and_replaces_the_classifier(own_data, tmp_path):
    """--weights FILE (a 10-class lenet's state dict, as torch.save writes it) on a folder of 3 classes: every
    weight but the classifier's is the file's when training starts, the classifier is built for 3, and ddp on 2
    processes fine-tunes from it. best.pt of that run starts another (a recipe's checkpoint is taken too)."""
    import torch

    from recipes.common import models

    source = models.build_model("lenet", 10, 28)
    torch.save(source.state_dict(), tmp_path / "lenet10.pth")
    model = models.build_model("lenet", 3, 28, str(tmp_path / "lenet10.pth"))
    own, theirs = model.state_dict(), source.state_dict()
    assert [key for key in own if not torch.equal(own[key], theirs[key]) or own[key].shape != theirs[key].shape] \
        == ["9.weight", "9.bias"]  # lenet's last Linear: 3 classes, newly initialised
    assert own["9.weight"].shape == (3, 128)
    flags = ["-a", "lenet", "--image-size", "28", "-b", "8", "--epochs", "1", "-j", "0", "--seed", "0"]
    run_recipe("ddp", [own_data, *flags, "--weights", tmp_path / "lenet10.pth", "--out", tmp_path / "tuned"], nproc=2)
    run_recipe("nd", [own_data, *flags, "--weights", tmp_path / "tuned" / "best.pt", "--out", tmp_path / "again"])


def test_pretrained_reads_torchvisions_weights_from_the_cache_offline(tmp_path, monkeypatch):
    """--pretrained reads the file torchvision would download, from torch.hub's cache; where it is absent and
    the download fails (offline), one line says where to put it."""
    import urllib.error

    import torch
    import torchvision

    from recipes.common import RecipeError, models

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    entry = torchvision.models.get_model_weights("resnet18").DEFAULT
    cached = tmp_path / "hub" / "checkpoints" / entry.url.rsplit("/", 1)[1]

    def offline(url, *args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(RecipeError, match=f"--pretrained: {cached} is not there and .* could not be downloaded "
                                          r"\(no network\); put the file there, or pass --weights FILE"):
        models.build_model("resnet18", 3, weights=models.PRETRAINED)
    assert pretrained_in_cache(tmp_path, "resnet18") == cached
    imagenet = torch.load(cached, weights_only=True)
    model = models.build_model("resnet18", 3, weights=models.PRETRAINED)
    assert torch.equal(model.conv1.weight, imagenet["conv1.weight"]) and model.fc.weight.shape == (3, 512)


@pytest.mark.parametrize("flags, line", [
    (["--weights", "missing.pth"], "--weights missing.pth: no such file"),
    (["--weights", "resnet.pth"], "--weights resnet.pth does not fit this model: 128 weight(s) missing, extra or "
                                  "of another shape"),
    (["--weights", "args.json"], "--weights args.json: not a state dict torch.load reads"),
    (["--pretrained"], "--pretrained: torchvision has no weights for -a lenet (use --weights FILE)"),
    (["--pretrained", "--weights", "x.pth"], "argument --weights: not allowed with argument --pretrained")])
def test_weights_that_cannot_start_the_model_are_one_line(own_data, tmp_path, flags, line):
    import torch

    from recipes.common import models

    torch.save(models.build_model("resnet18", 3).state_dict(), tmp_path / "resnet.pth")
    (tmp_path / "args.json").write_text("{}")
    result = run_python([sys.executable, ROOT / "recipes" / "nd" / "train.py", own_data, "-a", "lenet", "-b", "8",
                         "--epochs", "1", "--out", tmp_path / "run", *flags], cwd=tmp_path)
    assert result.returncode == 2 and line in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) <= 2  # (argparse's usage line, then its error)
