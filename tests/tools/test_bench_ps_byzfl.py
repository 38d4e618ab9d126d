"""scripts/figures/ps/byzfl_reference.py: byzfl's own benchmark on the digits, read from IDX files, with no download."""

import csv
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_python
from PIL import Image

sys.path.insert(0, str(ROOT))
from scripts.figures.ps import byzfl_reference

TRAIN_PER_DIGIT, VAL_PER_DIGIT = 12, 3


def write_digit_folder(root, seed=0):
    """28x28 grey images in train/<digit>/ and val/<digit>/: digit d is a bright bar at rows 2d..2d+3, in noise."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", TRAIN_PER_DIGIT), ("val", VAL_PER_DIGIT)):
        for digit in range(10):
            folder = root / split / str(digit)
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                pixels = rng.integers(0, 60, (28, 28))
                pixels[2 * digit + 4:2 * digit + 8, 4:24] += 180
                Image.fromarray(pixels.astype(np.uint8), mode="L").save(folder / f"{i:03d}.png")
    return root


# one worker runs them all: its module's fixture runs the benchmark once for every test it serves
pytestmark = pytest.mark.xdist_group("bench_ps_byzfl")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return write_digit_folder(tmp_path_factory.mktemp("digits"))


@pytest.fixture(scope="module")
def quick(digits, tmp_path_factory):
    """One --quick run of the script (1 seed, Average and Median, SignFlipping and no attack, 20 steps)."""
    tmp = tmp_path_factory.mktemp("byzfl")
    runs, figures = tmp / "runs", tmp / "figures"
    command = [sys.executable, str(ROOT / "scripts" / "figures" / "ps" / "byzfl_reference.py"), "--quick", "--data",
               str(digits),
               "--runs", str(runs), "--figures-data", str(figures)]
    result = run_python(command, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return command, runs, figures, result.stdout


def read_idx(path):
    """An IDX file read by hand (not by the writer's code): big-endian header, then unsigned bytes."""
    data = Path(path).read_bytes()
    assert data[:3] == b"\x00\x00\x08", "not an unsigned-byte IDX file"
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def test_quick_run_writes_a_row_per_rule_attack_and_seed_with_a_top1_in_percent(quick):
    _, _, figures, stdout = quick
    with open(figures / "ps_byzfl.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = {(row["aggregator"], row["attack"], int(row["byzantine"]), int(row["honest"])) for row in rows}
    assert got == {("Average", "NoAttack", 0, 8), ("Median", "NoAttack", 0, 8),
                   ("Average", "SignFlipping", 2, 6), ("Median", "SignFlipping", 2, 6)}
    assert len(rows) == 4
    for row in rows:
        assert 0 <= float(row["top1"]) <= 100
        assert (row["seed"], row["steps"], row["tolerated_f"], row["workers"]) == ("0", "20", "2", "8")
        assert row["aggregate"] in ("mean", "median") and row["ps_attack"] in ("none", "signflip")
        assert row["torch"] and row["byzfl"]
    assert "4 run(s) trained now" in stdout


def test_the_idx_files_decode_to_the_folders_images_and_labels(quick, digits):
    from torchvision.datasets import MNIST, ImageFolder

    _, runs, _, _ = quick
    raw = runs / "mnist-idx" / "MNIST" / "raw"
    for split, prefix in (("train", "train"), ("val", "t10k")):
        folder = ImageFolder(digits / split)
        expected = np.stack([np.asarray(Image.open(path).convert("L")) for path, _ in folder.samples])
        labels = np.array(folder.targets)
        images = read_idx(raw / f"{prefix}-images-idx3-ubyte")
        assert images.shape == (len(folder), 28, 28) and (images == expected).all()
        assert (read_idx(raw / f"{prefix}-labels-idx1-ubyte") == labels).all()
        assert [int(folder.classes[label]) for label in labels] == labels.tolist()  # the label is the digit
        mnist = MNIST(runs / "mnist-idx", train=split == "train")  # and torchvision reads them the same
        assert (mnist.data.numpy() == expected).all() and (mnist.targets.numpy() == labels).all()


def test_byzfl_read_the_idx_files_and_downloaded_nothing(quick, monkeypatch):
    from torchvision.datasets import MNIST

    _, runs, _, _ = quick
    raw = runs / "mnist-idx" / "MNIST" / "raw"
    # a download leaves its .gz archives beside the files, and a processed/ folder would be read instead of them
    assert sorted(p.name for p in raw.iterdir()) == sorted(byzfl_reference.IDX_FILES.values())
    assert not (runs / "mnist-idx" / "MNIST" / "processed").exists()
    for config in (runs / "quick-steps20" / "configs").glob("*/config.json"):  # byzfl was pointed at them
        assert f'"data_folder": "{(runs / "mnist-idx").resolve()}"' in config.read_text()
    # what byzfl does, with every connection refused: download=True finds the files and returns
    def refuse(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert len(MNIST(runs / "mnist-idx", train=True, download=True)) == 10 * TRAIN_PER_DIGIT
    assert len(MNIST(runs / "mnist-idx", train=False, download=True)) == 10 * VAL_PER_DIGIT
    assert sorted(p.name for p in raw.iterdir()) == sorted(byzfl_reference.IDX_FILES.values())


def test_a_finished_run_is_not_trained_again(quick):
    command, runs, figures, _ = quick
    timings = sorted((runs / "quick-steps20" / "results").glob("*/train_time_tr_seed_0_dd_seed_0.txt"))
    assert len(timings) == 4
    before = [path.stat().st_mtime_ns for path in timings]
    result = run_python(command, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "0 run(s) trained now, 4 kept" in result.stdout
    assert [path.stat().st_mtime_ns for path in timings] == before
    assert len((figures / "ps_byzfl.csv").read_text().splitlines()) == 1 + 4


def test_a_folder_without_train_and_val_is_a_one_line_error(tmp_path):
    result = run_python([sys.executable, str(ROOT / "scripts" / "figures" / "ps" / "byzfl_reference.py"), "--data",
                         str(tmp_path / "missing"), "--runs", str(tmp_path / "runs")], timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [f"error: {tmp_path / 'missing'} has no train/ and val/ folders; "
                                                  "run `python scripts/make_demo_data.py` first"]
