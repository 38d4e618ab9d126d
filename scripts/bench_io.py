"""Input-pipeline throughput: images/s and MB/s read, against loader workers, per decoder.

    python scripts/make_demo_data.py --imagenet-like data/imagenet-like --classes 10 --images 120
    python scripts/bench_io.py data/imagenet-like                    # writes figures/data/io.csv

It times the recipes' own training loader (recipes/common/data.py: ImageFolder,
RandomResizedCrop 224, flip, normalise, batches of -b) with nothing downstream:
  pil     PIL decode, then the classic transforms on PIL images
  tensor  torchvision.io.decode_image (libjpeg-turbo), then transforms.v2 on uint8 tensors
Each point is one pass over train/ after one batch per worker (worker start-up,
and the batches all workers prepare at once while starting, are not counted), the
median of --repeats passes, the configurations interleaved so that a slow moment
of a shared machine does not land on one of them.
"""

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from recipes.common import cli, data  # noqa: E402
from scripts import measuring  # noqa: E402
from scripts.measuring import hardware, write_csv  # noqa: E402

FIELDS = ["decoder", "workers", "batch_size", "image_size", "images", "seconds", "images_per_s", "mb_per_s",
          "images_per_s_per_worker", "cpu", "cores", "gpu", "torch"]


def one_pass(folder, decoder, workers, batch_size, image_size):
    args = cli.parse_args(cli.build_parser("io", ""), [str(folder), "--decoder", decoder, "-j", str(workers),
                                                       "-b", str(batch_size), "--image-size", str(image_size)])
    train_set, _, num_classes = data.build_datasets(args)
    sampler = data.shuffle_sampler(train_set, seed=0)
    loader = data.train_loader(train_set, args, sampler, num_classes)
    batches = iter(loader)
    warmup = max(workers, 1)  # one batch per worker: they all start together, so these are ready early
    for _ in range(warmup):
        next(batches)
    start, images, read = time.perf_counter(), 0, 0
    for (tensor, _), indices in zip(batches, _batch_indices(sampler, batch_size, skip=warmup)):
        images += tensor.shape[0]
        read += sum(os.path.getsize(train_set.samples[i][0]) for i in indices)
    seconds = time.perf_counter() - start
    return images, seconds, read


def _batch_indices(sampler, batch_size, skip):
    order = list(sampler)
    for first in range(skip * batch_size, len(order) - batch_size + 1, batch_size):
        yield order[first:first + batch_size]


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="an ImageNet-style folder of JPEGs (train/<class>/<image>)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--decoders", nargs="+", default=["pil", "tensor"], choices=["pil", "tensor"])
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", default="figures/data/io.csv")
    args = parser.parse_args()
    if not (Path(args.folder) / "train").is_dir():
        sys.exit(f"error: {args.folder} has no train/ folder; see the usage at the top of this script")
    torch.set_num_threads(1)  # the main process only collates; workers decode (and use one thread each)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores: on purpose

    times = {}
    for _ in range(args.repeats):
        for decoder in args.decoders:
            for workers in args.workers:
                images, seconds, read = one_pass(args.folder, decoder, workers, args.batch_size, args.image_size)
                times.setdefault((decoder, workers), []).append((seconds, images, read))
    rows, machine = [], hardware()
    for (decoder, workers), runs in times.items():
        seconds = statistics.median(s for s, _, _ in runs)
        images, read = runs[0][1], runs[0][2]
        rate = images / seconds
        rows.append({"decoder": decoder, "workers": workers, "batch_size": args.batch_size,
                     "image_size": args.image_size, "images": images,
                     "seconds": round(seconds, 4), "images_per_s": round(rate, 2),
                     "mb_per_s": round(read / seconds / 1e6, 3),
                     "images_per_s_per_worker": round(rate / max(workers, 1), 2), **machine})
        print(f"{decoder:>6}  {workers} worker(s)  {rate:8.1f} images/s  {read / seconds / 1e6:7.2f} MB/s")
    write_csv(args.csv, FIELDS, rows)
    measuring.record_part(Path(args.csv).parent, "io", started)


if __name__ == "__main__":
    main()
