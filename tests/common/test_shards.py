"""WebDataset shards (scripts/make_shards.py): written from an image folder, and read by the recipes as they read
the folder: the same images and classes, each rank its own shards, the exact evaluation, the mid-epoch resume,
shards listed by URL, and one line for a broken shard."""

import argparse
import hashlib
import http.server
import io
import os
import shutil
import sys
import tarfile
import threading
from collections import Counter

import pytest
import torch
from torch.utils.data import DistributedSampler

from conftest import ROOT, TINY, assert_one_clear_line, injected, read_summary, run_python, run_recipe

from recipes.common import RecipeError, data

SHARD_MB = 0.01  # (the tiny set's PNGs are about 0.9 KB: 4 training shards, 2 validation ones)


def make_shards(folder, out, *flags):
    return run_python([sys.executable, str(ROOT / "scripts" / "make_shards.py"), str(folder), str(out), *flags])


@pytest.fixture(scope="module")
def tiny_shards(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "tiny"
    result = make_shards(tiny_data, out, "--shard-mb", str(SHARD_MB))
    assert result.returncode == 0, result.stderr
    return out


def contents(dataset):
    """The data set's (class name, image bytes' digest) pairs, counted."""
    return Counter((dataset.classes[target], hashlib.sha1(data.read_bytes(source).numpy().tobytes()).hexdigest())
                   for source, target in (dataset.samples if hasattr(dataset, "samples") else
                                          zip(dataset.members, dataset.targets)))


def test_the_shards_hold_every_image_once_with_its_class_in_shards_of_the_size_asked(tiny_data, tiny_shards):
    for split in ("train", "val"):
        folder = data.PackedImageFolder(tiny_data / split, loader=data.read_image)
        shards = data.TarShards(tiny_shards / split, None, data.read_image)
        assert shards.classes == folder.classes == ["blue", "green", "red"]
        assert contents(shards) == contents(folder)
        assert len(shards.shards) >= 2
        largest = max(image.stat().st_size for image in (tiny_data / split).rglob("*.png"))
        for shard in shards.shards:  # (WebDataset's writer starts a new shard once the files it holds reach the
            with tarfile.open(shard) as tar:  # size, so one image and its .cls more at most; tar's headers apart)
                assert sum(info.size for info in tar) <= SHARD_MB * 1e6 + largest + 1
        with tarfile.open(shards.shards[0]) as tar:  # WebDataset's layout: each image beside its .cls
            names = tar.getnames()
        assert names[:2] == ["00000000.cls", "00000000.png"]
    train = data.TarShards(tiny_shards / "train", None, data.read_image)
    assert [train.targets[i] for i in range(12)] != sorted(train.targets[i] for i in range(12))  # (written shuffled)


def test_make_shards_refuses_an_existing_folder_and_a_folder_without_splits(tiny_data, tiny_shards, tmp_path):
    result = make_shards(tiny_data, tiny_shards)
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [
        f"error: {tiny_shards} exists; give a new folder"]
    result = make_shards(tiny_data / "train", tmp_path / "out")
    assert result.returncode != 0 and "has no train/ and val/ folders" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("world_size, total", [(1, 48), (2, 48), (3, 48), (5, 50)])
def test_each_rank_reads_its_own_shards_in_turn_and_the_epoch_is_a_distributed_samplers(tiny_shards, world_size,
                                                                                         total):
    """ShardOrder: each rank an equal share, together every image (padded as DistributedSampler pads), each rank's
    from at most 2 shards more than its part; a new order each epoch, the same one again for a resumed epoch."""
    shards = data.TarShards(tiny_shards / "train", None, data.read_image)
    shard_of = {index: shard for shard, first in enumerate(shards.first)
                for index in range(first, (shards.first + [len(shards)])[shard + 1])}
    orders = {}
    for epoch in (0, 1):
        everyone = []
        for rank in range(world_size):
            sampler = DistributedSampler(shards, world_size, rank, shuffle=True, seed=3)
            sampler.set_epoch(epoch)
            order = list(data.ShardOrder(shards, sampler))
            assert len(order) == len(sampler) == total // world_size
            assert len({shard_of[i] for i in order}) <= len(shards.shards) // world_size + 2
            assert order == list(data.ShardOrder(shards, sampler))  # (a resume draws the same)
            everyone += order
            orders[epoch, rank] = order
        assert len(everyone) == total and set(everyone) == set(range(len(shards)))
    assert orders[0, 0] != orders[1, 0]


def test_the_recipes_loaders_read_shards_in_shard_order(tiny_shards):
    """nd's loader (its own shuffle) and ddp's (the recipe's DistributedSampler, told the epoch by the recipe) read
    the shards in ShardOrder: a run of whole shards per rank, new each epoch."""
    shards = data.TarShards(tiny_shards / "train", None, data.read_image)
    args = argparse.Namespace(batch_size=4, accum_steps=1, workers=0, seed=0, decoder="tensor", evaluate=False)
    for sampler in (None, DistributedSampler(shards, 2, 1, shuffle=True, seed=0)):
        loader = data.train_loader(shards, args, sampler)
        assert isinstance(loader.sampler, data.ShardOrder)
        epochs = []
        for epoch in (0, 1):
            (sampler or loader.sampler).set_epoch(epoch)
            epochs.append([index for batch in loader.batch_sampler for index in batch])
            assert epochs[-1] == list(data.ShardOrder(shards, loader.sampler.sampler))[:len(epochs[-1])]
        assert epochs[0] != epochs[1]


def test_a_recipe_trains_on_shards_and_evaluates_every_val_image_once_at_1_2_and_3_processes(tiny_data, tiny_shards,
                                                                                            tmp_path):
    """The same flags on the shard folder as on the image folder; the evaluation of one checkpoint on shards, at 1,
    2 and 3 processes, is its evaluation on the folder: every one of the 23 val images once."""
    out = tmp_path / "train"
    result = run_recipe("ddp", [tiny_shards, *TINY, "-b", "4", "--epochs", "1", "--out", out], nproc=2)
    assert "48 train / 23 val images in 4 / 2 tar shards of 3 classes" in result.stdout.splitlines()[0]
    run_recipe("nd", [tiny_data, *TINY, "-e", "--resume", out / "checkpoint.pt", "--out", tmp_path / "folder"])
    folder = read_summary(tmp_path / "folder")
    for nproc in (1, 2, 3):
        evaluated = tmp_path / f"shards{nproc}"
        run_recipe("ddp", [tiny_shards, *TINY, "-e", "--resume", out / "checkpoint.pt", "--out", evaluated],
                   nproc=nproc)
        summary = read_summary(evaluated)
        assert summary["val_images"] == folder["val_images"] == 23
        assert summary["top1_correct"] == folder["top1_correct"]
        assert summary["loss"] == pytest.approx(folder["loss"], rel=1e-5)


def test_a_run_on_shards_stopped_mid_epoch_resumes_exactly(tiny_shards, tmp_path):
    """SIGTERM after step 9 (epoch 2, step 3): the checkpoint holds the epoch and the step, and the shard order is
    the sampler's (seed, epoch), so the relaunch reads the rest of the same order and ends as the run that was not
    stopped (with -j 0, as on a folder: loader workers would draw the rest of the epoch's flips anew)."""
    flags = [tiny_shards, *TINY, "--hflip", "0.5", "--epochs", "3", "-p", "100", "-b", "8"]
    run_recipe("nd", [*flags, "--out", tmp_path / "whole"])
    out = tmp_path / "stopped"
    result = injected("nd", [*flags, "--auto-resume", "--out", out], "term", 9)
    assert result.returncode == 75, result.stderr[-3000:]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 4
    run_recipe("nd", [*flags, "--auto-resume", "--out", out])
    whole, resumed = read_summary(tmp_path / "whole"), read_summary(out)
    assert {k: resumed[k] for k in ("top1_correct", "loss")} == {k: whole[k] for k in ("top1_correct", "loss")}


def broken_copy(tiny_shards, tmp_path, how):
    copy = tmp_path / "shards"
    shutil.copytree(tiny_shards, copy)
    shard = sorted((copy / "train").glob("*.tar"))[1]
    if how == "truncated":
        shard.write_bytes(shard.read_bytes()[:700])
    elif how == "garbage":
        shard.write_bytes(b"not a tar file at all" * 40)
    elif how == "no class":
        with tarfile.open(shard) as tar:
            kept = [(info, tar.extractfile(info).read()) for info in tar if not info.name.endswith(".cls")]
        with tarfile.open(shard, "w") as tar:
            for info, content in kept:
                tar.addfile(info, io.BytesIO(content))
    else:  # no shards: an empty train/
        for tar in (copy / "train").glob("*.tar"):
            tar.unlink()
    return copy, shard


@pytest.mark.parametrize("how, says", [("truncated", "corrupt shard"), ("garbage", "corrupt shard"),
                                       ("no class", "has no .cls (its class index) beside it"),
                                       ("none", "has no images (expected <class>/<image> files or .tar shards)")])
def test_a_broken_or_missing_shard_is_one_line_naming_it(tiny_shards, tmp_path, how, says):
    copy, shard = broken_copy(tiny_shards, tmp_path, how)
    result = run_recipe("nd", [copy, *TINY, "--out", tmp_path / "out"], expect_ok=False)
    assert_one_clear_line(result, says, str(shard) if how != "none" else str(copy / "train"))


def test_a_member_cut_short_is_one_line(tiny_shards, tmp_path):
    shards = data.TarShards(tiny_shards / "val", None, data.read_image)
    member = shards.members[0]._replace(size=10**9)
    with pytest.raises(RecipeError, match=f"corrupt shard {member.shard}: {member.name} ends after"):
        data.read_image(member)


@pytest.fixture
def served(tiny_shards):
    """tiny_shards over HTTP, from a server in this process: (its base URL, the paths it was asked for). A path
    under /cut/ sends the file's length but half its bytes, then closes."""
    asked = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tiny_shards), **kwargs)

        def do_GET(self):
            if not self.path.startswith("/cut/"):
                return super().do_GET()
            content = (tiny_shards / self.path[len("/cut/"):]).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content[:len(content) // 2])
            self.close_connection = True

        def log_message(self, format, *args):
            asked.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", asked
    server.shutdown()
    server.server_close()


def listed(tiny_shards, folder, lines):
    """A data folder whose splits list their shards (shards.txt), lines[split] each."""
    for split, names in lines.items():
        (folder / split).mkdir(parents=True)
        (folder / split / data.SHARD_LIST).write_text("".join(f"{name}\n" for name in names))
    shutil.copy(tiny_shards / "classes.txt", folder)
    return folder


def test_shards_listed_by_url_are_fetched_once_into_the_cache_and_read_as_the_folder(tiny_shards, served, tmp_path,
                                                                                    monkeypatch):
    """shards.txt: http URLs, a path relative to the list, a file: URL, a pipe: command; each fetched once into
    $SHARD_CACHE, read as the shard folder itself is (the same images, classes and shard order), then read from
    the cache; and once a cache, whatever the number of ranks."""
    base, asked = served
    train = sorted(shard.name for shard in (tiny_shards / "train").glob("*.tar"))
    val = sorted((tiny_shards / "val").glob("*.tar"))
    folder = tmp_path / "listed"
    lines = {"train": ["# the training shards", *(f"{base}/train/{name}" for name in train[:-1]), "",
                       os.path.relpath(tiny_shards / "train" / train[-1], folder / "train")],
             "val": [val[0].as_uri(), f"pipe:cat {val[1]}"]}
    listed(tiny_shards, folder, lines)
    monkeypatch.setenv("SHARD_CACHE", str(tmp_path / "cache"))
    for split in ("train", "val"):
        shards, there = (data.TarShards(f / split, None, data.read_image) for f in (folder, tiny_shards))
        assert contents(shards) == contents(there) and shards.first == there.first
        assert [m.name for m in shards.members] == [m.name for m in there.members]
        assert shards.classes == there.classes
    assert sorted(asked) == [f"/train/{name}" for name in train[:-1]]
    data.TarShards(folder / "train", None, data.read_image)
    assert len(asked) == len(train) - 1  # (from the cache)
    assert sorted(path.suffix for path in (tmp_path / "cache").iterdir()) == [".lock"] * 5 + [".tar"] * 5
    # three ranks, a cache of their own: each shard fetched once more, by one of them, as the others wait
    result = run_recipe("ddp", [folder, *TINY, "--epochs", "1", "--out", tmp_path / "run"], nproc=3,
                        env={"SHARD_CACHE": str(tmp_path / "cache of the run"), "no_proxy": "*"})
    assert "48 train / 23 val images in 4 / 2 tar shards" in result.stdout
    assert sorted(asked) == sorted(2 * [f"/train/{name}" for name in train[:-1]])


@pytest.mark.parametrize("line, says", [
    ("{base}/train/shard-000009.tar", "cannot fetch shard {base}/train/shard-000009.tar into {cache}: HTTP Error 404"),
    ("{base}/cut/train/shard-000000.tar", "cannot fetch shard {base}/cut/train/shard-000000.tar into {cache}: the "
                                          "connection closed after"),
    ("{base}/classes.txt", "corrupt shard {base}/classes.txt: "),
    ("http://127.0.0.1:9/shard.tar", "cannot fetch shard http://127.0.0.1:9/shard.tar into {cache}: [Errno 111]"),
    ("pipe:exit 3", "cannot fetch shard pipe:exit 3 into {cache}: the command ended with code 3"),
    ("missing.tar", "{folder}/train/shards.txt names missing.tar, which is not a file")])
def test_a_shard_that_cannot_be_fetched_is_one_line_and_leaves_nothing_in_the_cache(tiny_shards, served, tmp_path,
                                                                                    monkeypatch, line, says):
    base, _ = served
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHARD_CACHE", str(cache))
    monkeypatch.setenv("no_proxy", "*")
    folder = listed(tiny_shards, tmp_path / "listed", {"train": [line.format(base=base)]})
    with pytest.raises(RecipeError) as error:
        data.TarShards(folder / "train", None, data.read_image)
    assert str(error.value).startswith(says.format(base=base, cache=cache, folder=folder)), str(error.value)
    assert [path.suffix for path in cache.glob("*")] in ([], [".lock"])  # (no shard, no part of one)
    if line == "missing.tar":  # and in a recipe, one line
        (folder / "val").mkdir()
        result = run_recipe("nd", [folder, *TINY, "--out", tmp_path / "run"], expect_ok=False)
        assert_one_clear_line(result, "shards.txt names missing.tar, which is not a file")
