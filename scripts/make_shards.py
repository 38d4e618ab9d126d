"""Write an image folder as WebDataset shards, which the recipes read as they read the folder.

    python scripts/make_shards.py data/imagenet-like data/imagenet-like-shards --shard-mb 64
    torchrun --nproc_per_node=2 recipes/ddp/train.py data/imagenet-like-shards ...   # the same flags

DIR/train/<class>/<image> and DIR/val/... become OUT/train/shard-000000.tar, ...
and OUT/val/shard-000000.tar, ..., each ending once its files reach --shard-mb MB,
and OUT/classes.txt
(the class names, one a line, sorted as ImageFolder sorts them). In a shard each
image keeps its bytes and its extension beside a .cls file holding its class
index (WebDataset's layout: 00000042.jpg, 00000042.cls), so other WebDataset
readers (timm, torchtitan) read them too. The training images are written in a
seeded random order: a reader that takes whole shards in turn and shuffles in a
buffer (the recipes' ShardOrder) then sees every class in every batch. Shards
are written under temporary names and renamed when complete; an existing OUT is
refused.
"""

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchvision import datasets  # noqa: E402

try:
    import webdataset
except ImportError:
    webdataset = None


def write_split(folder, out, shard_mb, seed):
    """One split's shards; returns (images, shards, class names)."""
    images = datasets.ImageFolder(folder, loader=lambda path: path)  # (the files' list: nothing decoded)
    samples = list(images.samples)
    if seed is not None:
        random.Random(seed).shuffle(samples)
    out.mkdir(parents=True)
    written = []

    def finished(name):  # a shard is complete: give it its name
        final = Path(name).with_suffix("")  # (shard-000000.tar.partial -> shard-000000.tar)
        Path(name).rename(final)
        written.append(final)

    with webdataset.ShardWriter(str(out / "shard-%06d.tar.partial"), maxsize=shard_mb * 1e6, post=finished,
                                verbose=0) as shards:
        for index, (path, target) in enumerate(samples):
            extension = Path(path).suffix.lower().lstrip(".")
            shards.write({"__key__": f"{index:08d}", extension: Path(path).read_bytes(), "cls": str(target)})
    return len(samples), len(written), images.classes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="an image folder: train/<class>/<image> and val/<class>/<image>")
    parser.add_argument("out", help="the shard folder to write (must not exist)")
    parser.add_argument("--shard-mb", type=float, default=64, help="a shard ends once its files reach this size, "
                        "in MB (tar's headers apart: about 2 KB an image more; default: 64)")
    parser.add_argument("--seed", type=int, default=0, help="the training images' order (default: 0)")
    args = parser.parse_args()
    folder, out = Path(args.folder), Path(args.out)
    if webdataset is None:
        sys.exit("error: the webdataset package is not installed: pip install -e '.[shards]' (make setup installs "
                 "it)")
    if not all((folder / split).is_dir() for split in ("train", "val")):
        sys.exit(f"error: {folder} has no train/ and val/ folders (expected {folder}/train/<class>/<image>)")
    if out.exists():
        sys.exit(f"error: {out} exists; give a new folder")
    if args.shard_mb <= 0:
        sys.exit("error: --shard-mb must be more than 0")
    classes = {}
    for split, seed in (("train", args.seed), ("val", None)):
        images, shards, classes[split] = write_split(folder / split, out / split, args.shard_mb, seed)
        print(f"{out / split}: {images} images in {shards} shard(s) of up to {args.shard_mb:g} MB")
    if classes["train"] != classes["val"]:
        sys.exit(f"error: train/ and val/ in {folder} have different class folders")
    (out / "classes.txt").write_text("".join(f"{name}\n" for name in classes["train"]))


if __name__ == "__main__":
    main()
