"""Input-pipeline throughput: images/s and MB/s read, against loader workers, per decoder.

    python scripts/make_demo_data.py --imagenet-like data/imagenet-like --classes 10 --images 120
    python scripts/figures/io/measure.py data/imagenet-like                    # writes figures/data/io.csv

It times the recipes' own training loader (recipes/common/data.py: ImageFolder,
RandomResizedCrop 224 and a flip in the loader workers, uint8 batches of -b) with
nothing downstream:
  pil          --decoder pil: PIL decode, then the classic transforms on PIL images
  torchcodec   --decoder tensor where TorchCodec is installed: its decode_image
               (libjpeg-turbo), then transforms.v2 on uint8 tensors
  torchvision  --decoder tensor without TorchCodec: torchvision.io.decode_image
               (libjpeg-turbo; deprecated since torchvision 0.29), then the same
and, for --decoder tensor, the batches as the workers made them before they left
the conversion to the device: float32, normalised in the workers ("float32" rows).
Each point is one pass over train/ after one batch per worker (worker start-up,
and the batches all workers prepare at once while starting, are not counted), the
median of --repeats passes, the configurations interleaved so that a slow moment
of a shared machine does not land on one of them.

Then (io_storage.csv) what the storage is asked for, the image folder against the
same images as WebDataset shards (scripts/make_shards.py, written once into
--shards): a whole epoch of --decoder tensor's loader (after an untimed one that
starts its workers), 1, 2 and 4 workers, on a
cold page cache (dropped before each pass, where this machine lets it: root on
Linux; else the rows say warm) and a warm one: images/s, and the MB/s and read
calls/s of the loading processes (data.StorageReads, the recipes' own counters).

Beside it (io_loader.json): what the uint8 batches move to the training process
on a CPU (converting and normalising a batch there, milliseconds per batch; on a
GPU the device does it), the bytes of a batch either way, and the wait for an
epoch's first batch with 2 workers started anew each epoch and with persistent
ones (median of 5 epochs).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from recipes.common import cli, data  # noqa: E402
from scripts.figures import measuring  # noqa: E402
from scripts.figures.measuring import hardware, write_csv  # noqa: E402

FIELDS = ["decoder", "batches", "workers", "batch_size", "image_size", "images", "seconds", "images_per_s", "mb_per_s",
          "images_per_s_per_worker", "cpu", "cores", "gpu", "torch"]
STORAGE_FIELDS = ["source", "cache", "workers", "batch_size", "image_size", "images", "shards", "seconds",
                  "images_per_s", "read_mb_per_s", "reads_per_s", "reads_per_image", "cpu", "cores", "gpu", "torch"]
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


# each decoder measured: the --decoder flag it is, and the function its loader reads a file with
DECODERS = {"pil": ("pil", data.load_image), "torchcodec": ("tensor", data.read_image),
            "torchvision": ("tensor", data.read_image_torchvision)}


def loader_args(folder, decoder, workers, batch_size, image_size):
    return cli.parse_args(cli.build_parser("io", ""), [str(folder), "--decoder", DECODERS[decoder][0], "-j",
                                                       str(workers), "-b", str(batch_size), "--image-size",
                                                       str(image_size)])


def tensor_decoder():
    """What --decoder tensor decodes with here: TorchCodec where it is installed, else torchvision.io."""
    return "torchcodec" if data.decode_image is not None else "torchvision"


def normalised_in_the_workers(dataset):
    """The float32 batches of before: the transform ends with the conversion and normalisation."""
    to_float = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(data.IMAGENET_MEAN, data.IMAGENET_STD)])
    dataset.transform = v2.Compose([dataset.transform, to_float])
    return dataset


def one_pass(folder, decoder, batches, workers, batch_size, image_size):
    args = loader_args(folder, decoder, workers, batch_size, image_size)
    train_set, _, _ = data.build_datasets(args)
    train_set.loader = DECODERS[decoder][1]
    if batches == "float32":
        train_set = normalised_in_the_workers(train_set)
    sampler = data.EpochShuffle(train_set, seed=0)
    loader = data.train_loader(train_set, args, sampler)
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


def drop_page_cache():
    """Empty the page cache (root on Linux), so that the next pass reads from the storage. False where not allowed."""
    os.sync()
    try:
        DROP_CACHES.write_text("1")
    except OSError:
        return False
    return True


def storage_pass(source, workers, batch_size, image_size, cold):
    """A whole epoch of --decoder tensor's training loader on an image folder or a shard folder, its workers
    started by an epoch before (persistent: what their first use of torch reads, such as the CPU's topology, is not
    counted): (images, seconds, bytes read, read calls), the last two from the loading processes' own counters."""
    args = loader_args(source, tensor_decoder(), workers, batch_size, image_size)
    train_set, _, _ = data.build_datasets(args)
    loader = data.train_loader(train_set, args, data.EpochShuffle(train_set, seed=0))
    assert loader.persistent_workers or workers == 0
    for _ in loader:  # (the workers' start)
        pass
    if cold:
        drop_page_cache()
    before, start, images = train_set.reads.total(), time.perf_counter(), 0
    for tensor, _ in loader:
        images += tensor.shape[0]
    seconds = time.perf_counter() - start
    read_bytes, read_calls = (train_set.reads.total() - before).tolist()
    return images, seconds, read_bytes, read_calls


def shards_of(folder, shards):
    """The folder's images as shards in `shards`, written there once (scripts/make_shards.py, 16 MB shards)."""
    if not (shards / "classes.txt").exists():
        shutil.rmtree(shards, ignore_errors=True)
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_shards.py"), str(folder), str(shards),
                                 "--shard-mb", "16"], capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(result.stderr.strip() or "error: scripts/make_shards.py failed")
    return shards


def measure_storage(folder, shards, workers, batch_size, image_size, repeats, machine):
    """io_storage.csv's rows: folder and shards, cold and warm, at each worker count (median of the repeats)."""
    cold = drop_page_cache()
    if not cold:
        print("the page cache cannot be dropped here (it needs root on Linux): warm passes only")
    sources = {"folder": Path(folder), "shards": shards_of(folder, Path(shards))}
    caches = ["cold", "warm"] if cold else ["warm"]
    runs = {}
    for _ in range(repeats):
        for cache in caches:
            for name, source in sources.items():
                for count in workers:
                    runs.setdefault((name, cache, count), []).append(
                        storage_pass(source, count, batch_size, image_size, cache == "cold"))
    rows = []
    for (name, cache, count), passes in runs.items():
        images, seconds, read_bytes, read_calls = sorted(passes, key=lambda p: p[1])[len(passes) // 2]  # (median)
        shard_count = len(list((sources["shards"] / "train").glob("*.tar"))) if name == "shards" else ""
        rows.append({"source": name, "cache": cache, "workers": count, "batch_size": batch_size,
                     "image_size": image_size, "images": images, "shards": shard_count, "seconds": round(seconds, 4),
                     "images_per_s": round(images / seconds, 2), "read_mb_per_s": round(read_bytes / seconds / 1e6, 3),
                     "reads_per_s": round(read_calls / seconds, 1),
                     "reads_per_image": round(read_calls / images, 3), **machine})
        print(f"{name:>7} {cache:>5}  {count} worker(s)  {images / seconds:8.1f} images/s  "
              f"{read_bytes / seconds / 1e6:7.2f} MB/s  {read_calls / seconds:8.1f} reads/s")
    return rows


def on_the_trainer(folder, batch_size, image_size, repeats=20):
    """Milliseconds to convert and normalise one uint8 batch in the training process on this CPU, and the bytes
    of a batch as uint8 and as float32."""
    args = loader_args(folder, tensor_decoder(), 0, batch_size, image_size)
    train_set, _, num_classes = data.build_datasets(args)
    images, target = next(iter(data.train_loader(train_set, args, data.EpochShuffle(train_set, 0))))
    to_device = data.device_transform(args, torch.device("cpu"), num_classes)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        to_device(images, target)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), images.numel(), images.numel() * 4


def first_batch_waits(folder, batch_size, image_size, workers=2, epochs=6):
    """Seconds from the start of an epoch to its first batch, median over the epochs after the first: workers
    started anew each epoch (persistent_workers=False, the recipes' way with --seed) and persistent ones."""
    waits = {}
    for persistent in (False, True):
        args = loader_args(folder, tensor_decoder(), workers, batch_size, image_size)
        args.seed = None if persistent else 0
        train_set, _, _ = data.build_datasets(args)
        loader = data.train_loader(train_set, args, data.EpochShuffle(train_set, 0))
        assert loader.persistent_workers == persistent
        seconds = []
        for _ in range(epochs):
            start = time.perf_counter()
            batches = iter(loader)
            next(batches)
            seconds.append(time.perf_counter() - start)
            for _ in batches:  # the rest of the epoch
                pass
        waits["persistent" if persistent else "fresh"] = statistics.median(seconds[1:])
    return waits


def _batch_indices(sampler, batch_size, skip):
    order = list(sampler)
    for first in range(skip * batch_size, len(order) - batch_size + 1, batch_size):
        yield order[first:first + batch_size]


def main():
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="an ImageNet-style folder of JPEGs (train/<class>/<image>)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=list(DECODERS),
                        help="(torchcodec: where TorchCodec is installed; without it, left out)")
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", default="figures/data/io.csv", help="(io_loader.json and io_storage.csv go "
                        "beside it)")
    parser.add_argument("--shards", default="runs/figures/io-shards", help="where the folder's shards are written "
                        "once (default: runs/figures/io-shards)")
    parser.add_argument("--storage-workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    if not (Path(args.folder) / "train").is_dir():
        sys.exit(f"error: {args.folder} has no train/ folder; see the usage at the top of this script")
    torch.set_num_threads(1)  # the main process only collates; workers decode (and use one thread each)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores: on purpose

    decoders = [decoder for decoder in args.decoders if decoder != "torchcodec" or data.decode_image is not None]
    if decoders != args.decoders:
        print("TorchCodec is not installed here: measuring without it")
    configurations = [(decoder, "uint8") for decoder in decoders]
    if tensor_decoder() in decoders:
        configurations.append((tensor_decoder(), "float32"))
    times = {}
    for _ in range(args.repeats):
        for decoder, batches in configurations:
            for workers in args.workers:
                images, seconds, read = one_pass(args.folder, decoder, batches, workers, args.batch_size,
                                                 args.image_size)
                times.setdefault((decoder, batches, workers), []).append((seconds, images, read))
    rows, machine = [], hardware()
    for (decoder, batches, workers), runs in times.items():
        seconds = statistics.median(s for s, _, _ in runs)
        images, read = runs[0][1], runs[0][2]
        rate = images / seconds
        rows.append({"decoder": decoder, "batches": batches, "workers": workers, "batch_size": args.batch_size,
                     "image_size": args.image_size, "images": images,
                     "seconds": round(seconds, 4), "images_per_s": round(rate, 2),
                     "mb_per_s": round(read / seconds / 1e6, 3),
                     "images_per_s_per_worker": round(rate / max(workers, 1), 2), **machine})
        print(f"{decoder:>11} {batches:>7}  {workers} worker(s)  {rate:8.1f} images/s  "
              f"{read / seconds / 1e6:7.2f} MB/s")
    write_csv(args.csv, FIELDS, rows)

    write_csv(Path(args.csv).parent / "io_storage.csv", STORAGE_FIELDS,
              measure_storage(args.folder, args.shards, args.storage_workers, args.batch_size, args.image_size,
                              args.repeats, machine))

    normalise_ms, uint8_bytes, float_bytes = on_the_trainer(args.folder, args.batch_size, args.image_size)
    waits = first_batch_waits(args.folder, args.batch_size, args.image_size)
    loader = {"batch_size": args.batch_size, "image_size": args.image_size, "normalise_ms_per_batch":
              round(normalise_ms, 3), "uint8_batch_bytes": uint8_bytes, "float32_batch_bytes": float_bytes,
              "first_batch_workers": 2, "first_batch_s_fresh_workers": round(waits["fresh"], 4),
              "first_batch_s_persistent_workers": round(waits["persistent"], 4), **machine}
    (Path(args.csv).parent / "io_loader.json").write_text(json.dumps(loader, indent=2) + "\n")
    print(f"on the trainer: {normalise_ms:.2f} ms to normalise a batch of {args.batch_size}; an epoch's first batch "
          f"after {waits['fresh']:.3f} s with fresh workers, {waits['persistent']:.3f} s with persistent ones")
    measuring.record_part(Path(args.csv).parent, "io", started)


if __name__ == "__main__":
    main()
