"""What loading asks of the storage, per epoch: metrics.csv's read_mb and read_calls, and the epoch line's MB/s and
reads/s, from /proc/thread-self/io of every process that loads (data.StorageReads)."""

import csv
import re
import sys

import pytest

from conftest import ROOT, TINY, run_python, run_recipe

from recipes.common import data

pytestmark = pytest.mark.skipif(not data.COUNTERS.exists(), reason="no /proc/thread-self/io here")


def rows(out):
    with open(out / "metrics.csv", newline="") as f:
        return {(row["epoch"], row["split"]): row for row in csv.DictReader(f)}


def file_bytes(folder):
    return sum(image.stat().st_size for image in folder.rglob("*.png"))


@pytest.fixture(scope="module")
def tiny_shards(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "tiny"
    result = run_python([sys.executable, str(ROOT / "scripts" / "make_shards.py"), str(tiny_data), str(out),
                         "--shard-mb", "0.01"])
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("source, calls_per_image", [("folder", 2), ("shards", 1)])
@pytest.mark.parametrize("recipe, nproc", [("nd", None), ("ddp", 2)])
def test_each_epoch_counts_the_bytes_and_read_calls_its_images_took(tiny_data, tiny_shards, tmp_path, source,
                                                                   calls_per_image, recipe, nproc):
    """In the training process (-j 0), every rank's loading added up: an image file is its bytes in two read calls
    (the data, then the end of the file), a shard's image its bytes in one pread; the epoch line gives them a
    second of the epoch."""
    out = tmp_path / "run"
    result = run_recipe(recipe, [tiny_data if source == "folder" else tiny_shards, *TINY, "-b", "4" if nproc else "8",
                                 "--epochs", "2", "--out", out], nproc=nproc)
    for split, images in (("train", 48), ("val", 23)):
        expected = file_bytes(tiny_data / split)
        for epoch in ("1", "2"):
            row = rows(out)[epoch, split]
            assert float(row["read_mb"]) == pytest.approx(expected / 1e6, abs=1e-3), (split, row)
            assert int(row["read_calls"]) == calls_per_image * images, (split, row)
        line = next(line for line in result.stdout.splitlines() if line.startswith(f"epoch 2 {split} "))
        rate, calls = map(float, re.search(r"read ([0-9.]+) MB/s in ([0-9.]+) reads/s", line).groups())
        seconds = float(rows(out)["2", split]["epoch_s"])
        rounding = 0.02 + 0.001 / seconds  # (metrics.csv keeps the epoch's seconds to 3 decimals; the line, 0.1 MB/s)
        assert calls == pytest.approx(calls_per_image * images / seconds, rel=rounding, abs=1)
        # (the two errors add: the line's 0.05 MB/s and the seconds' rounding; approx would take the larger alone)
        assert abs(rate - expected / 1e6 / seconds) <= 0.05 + rounding * expected / 1e6 / seconds


def test_loader_workers_count_their_reads_too(tiny_data, tmp_path):
    """-j 2: the workers' reads, added up in shared memory; a fresh worker's first image adds what its first load
    reads besides (21 small reads, 3 KB, measured here: 32 and 8 KB allowed), the persistent ones' later epochs
    only the images."""
    out = tmp_path / "run"
    run_recipe("nd", [tiny_data, *TINY, "-j", "2", "--epochs", "2", "--seed", "0", "--out", out])
    for split, images in (("train", 48), ("val", 23)):
        for epoch in ("1", "2"):
            row = rows(out)[epoch, split]
            assert 2 * images <= int(row["read_calls"]) <= 2 * images + 2 * 32, (split, row)
            assert file_bytes(tiny_data / split) <= float(row["read_mb"]) * 1e6 <= file_bytes(tiny_data / split) \
                + 2 * 8000, (split, row)


def test_a_role_that_loads_nothing_leaves_the_columns_blank(tiny_data, tmp_path):
    """The parameter server's rows are its servers' (which load no images): blank, not 0."""
    out = tmp_path / "run"
    run_recipe("ps", [tiny_data, *TINY, "-b", "4", "--epochs", "1", "--out", out], nproc=3)
    assert rows(out)["1", "train"]["read_mb"] == "" and rows(out)["1", "train"]["read_calls"] == ""
