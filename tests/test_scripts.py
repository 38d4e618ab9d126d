"""scripts/: the data sets it writes, and the recovery benchmark."""

import json
import subprocess
import sys

from conftest import ROOT, child_env
from PIL import Image


def test_digits_folder(tmp_path):
    out = tmp_path / "mnist5k"
    subprocess.run([sys.executable, ROOT / "scripts/make_demo_data.py", "--out", out], check=True,
                   capture_output=True)
    for split, per_class in (("train", 400), ("val", 100)):
        folders = sorted(p.name for p in (out / split).iterdir())
        assert folders == [str(d) for d in range(10)]
        assert all(len(list((out / split / d).glob("*.png"))) == per_class for d in folders)
    train = {p.name for p in out.glob("train/*/*.png")}
    assert not train & {p.name for p in out.glob("val/*/*.png")}  # no digit in both splits
    image = Image.open(next(out.glob("val/7/*.png")))
    assert image.size == (28, 28) and image.mode == "L"


def test_imagenet_like_folder(tmp_path):
    out = tmp_path / "imagenet-like"
    subprocess.run([sys.executable, ROOT / "scripts/make_demo_data.py", "--imagenet-like", out,
                    "--classes", "3", "--images", "5"], check=True, capture_output=True)
    for split, n in (("train", 4), ("val", 1)):
        assert sorted(p.name for p in (out / split).iterdir()) == ["class0000", "class0001", "class0002"]
        jpegs = list((out / split).glob("*/*.jpg"))
        assert len(jpegs) == 3 * n
        for path in jpegs:
            with Image.open(path) as image:
                assert image.format == "JPEG" and all(256 <= side <= 500 for side in image.size)


def test_bench_recovery_measures_a_save_and_a_restart(tiny_data, tmp_path):
    out = tmp_path / "recovery.json"
    command = [sys.executable, "scripts/bench_recovery.py", "--quick", str(tiny_data), "--json", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(out.read_text())
    assert measured["finished"] and measured["arch"] == "lenet"
    assert 0 < measured["seconds_per_save"] < measured["train_epoch_s"]
    assert measured["kill_to_first_step_s"] > 0 and measured["checkpoint_mb"] > 0
