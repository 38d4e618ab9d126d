"""Data sets and loaders: ImageNet-style folders, WebDataset shards, synthetic in-memory images, or a tokenised
text for a masked language model."""

import array
import fcntl
import hashlib
import http.client
import io as bytes_io
import os
import random
import re
import shutil
import subprocess
import tarfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import NamedTuple

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision import datasets, io, transforms
from torchvision.transforms import v2

from recipes.common import RecipeError, workers
from recipes.common.models import BERT_POSITIONS  # (the longest sequence bert_tiny embeds)

try:  # TorchCodec decodes where installed: torchvision 0.29 deprecates its own image decoding for it
    from torchcodec.decoders import decode_image, decode_jpeg
except (ImportError, OSError, RuntimeError):  # (a GPU node's torch 2.11 without it, or a broken install)
    decode_image = decode_jpeg = None

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SYNTHETIC_TRAIN_IMAGES, SYNTHETIC_VAL_IMAGES, SYNTHETIC_CLASSES = 12800, 1280, 1000


def set_seed(seed, epoch=0, rank=0):
    """Reseed per (epoch, rank): a resumed run then draws the same augmentations. None: no seeding."""
    if seed is not None:
        random.seed(seed + 100_003 * rank + epoch)
        torch.manual_seed(seed + 100_003 * rank + epoch)


def load_image(path):
    """--decoder pil: a PIL image, for the classic transforms."""
    try:
        return Image.open(bytes_io.BytesIO(read_bytes(path).numpy())).convert("RGB")
    except UnidentifiedImageError:
        raise RecipeError(f"unreadable image {path}: not an image format PIL knows") from None
    except OSError as error:  # truncated or damaged files
        raise RecipeError(f"unreadable image {path}: {error}") from None


def read_image(path):
    """--decoder tensor: a 3 x H x W uint8 tensor, decoded by TorchCodec where it is installed (libjpeg-turbo,
    libpng, libwebp, giflib), else by torchvision.io (the same libraries). Formats neither decodes (BMP, TIFF,
    ...) go through PIL. A 16-bit PNG is scaled to 8 bits, as every image the device normalises is."""
    if decode_image is None:
        return read_image_torchvision(path)
    try:
        image = decode_image(read_bytes(path), mode="RGB")
    except ValueError:  # a format TorchCodec does not know
        return v2.functional.pil_to_tensor(load_image(path))
    except RuntimeError as error:
        raise RecipeError(f"unreadable image {path}: {reason(error)}") from None
    return image[0] if image.ndim == 4 else image  # an animated GIF: its first frame, as PIL gives


def read_image_torchvision(path):
    """read_image by torchvision.io, where TorchCodec is not installed (and for measuring the two side by side)."""
    try:
        image = io.decode_image(read_bytes(path), mode=io.ImageReadMode.RGB)
    except RuntimeError as error:
        if "Unsupported image file" in str(error):
            return v2.functional.pil_to_tensor(load_image(path))
        raise RecipeError(f"unreadable image {path}: {reason(error)}") from None
    image = image[0] if image.ndim == 4 else image
    return v2.functional.to_dtype(image, torch.uint8, scale=True) if image.dtype == torch.uint16 else image


def read_bytes(path):
    """A file's bytes, or a shard member's (Member), as a 1-D uint8 tensor (a copy in memory, which loader
    workers can hand over)."""
    encoded = path.read() if isinstance(path, Member) else Path(path).read_bytes()
    if not encoded:
        raise RecipeError(f"unreadable image {path}: the file is empty")
    return torch.frombuffer(bytearray(encoded), dtype=torch.uint8)


class Member(NamedTuple):
    """One image in a tar shard: where its bytes are. Read with one pread, on a descriptor each process keeps
    open per shard."""
    shard: str
    name: str
    offset: int
    size: int

    def read(self):
        if self.shard not in OPEN_SHARDS:
            OPEN_SHARDS[self.shard] = os.open(self.shard, os.O_RDONLY)
        encoded = os.pread(OPEN_SHARDS[self.shard], self.size, self.offset)
        if len(encoded) != self.size:
            raise RecipeError(f"corrupt shard {self.shard}: {self.name} ends after {len(encoded)} of its "
                              f"{self.size} bytes")
        return encoded

    def __str__(self):
        return f"{self.shard}:{self.name}"


OPEN_SHARDS = {}  # this process's descriptor of each shard it has read from (a loader worker opens its own)


class StorageReads:
    """What loading a data set asks of the storage: the bytes read and the read calls that loading each image
    makes (its file's reads; a shard's pread), in every process that loads it (the training process with -j 0,
    else its loader workers), from Linux's own counters of the loading thread (/proc/thread-self/io: rchar, syscr,
    read just before and just after the loading; a worker's other threads, which hand its batches over, are not
    counted), added up in shared memory, a slot for each process (the training process's, each worker id's). Where
    those counters are not, nothing is counted (total() is None)."""

    def __init__(self):
        self.counts = torch.zeros(MAX_LOADER_WORKERS + 1, 2, dtype=torch.int64).share_memory_()
        self.before = None

    def total(self):
        """(bytes read, read calls) so far, or None where the counters are not."""
        return self.counts.sum(0) if COUNTERS.exists() else None

    def before_loading(self):
        self.before = io_counters()

    def after_loading(self):
        if self.before is not None:
            before, size = self.before
            now, _ = io_counters()
            info = torch.utils.data.get_worker_info()  # (the counting's own read, between the two: taken off)
            own = torch.tensor([size, 1])
            self.counts[0 if info is None else 1 + info.id % MAX_LOADER_WORKERS] += now - before - own


COUNTERS, MAX_LOADER_WORKERS = Path("/proc/thread-self/io"), 64  # (the loading thread's own)
COUNTERS_FD = {}  # by process and thread: its descriptor of /proc/thread-self/io


def io_counters():
    """This thread's (bytes read, read calls) since it started (reads the page cache answered included), and the
    bytes this call read: one read call itself. None where the counters are not."""
    thread = os.getpid(), threading.get_ident()
    if thread not in COUNTERS_FD:
        COUNTERS_FD[thread] = os.open(COUNTERS, os.O_RDONLY) if COUNTERS.exists() else None
    if COUNTERS_FD[thread] is None:
        return None
    text = os.pread(COUNTERS_FD[thread], 4096, 0)
    fields = dict(line.split(b": ") for line in text.splitlines())
    return torch.tensor([int(fields[b"rchar"]), int(fields[b"syscr"])]), len(text)


def reads_from_now(loader):
    """A function that gives what loading from `loader` has asked of the storage since this call, (bytes, read
    calls), from the StorageReads of its data set (or of the data set a Subset of it takes from: evaluation's
    shard, a held-out part); it gives None where that data set counts nothing."""
    dataset = getattr(loader, "dataset", None)
    reads = getattr(getattr(dataset, "dataset", dataset), "reads", None)
    start = reads and reads.total()
    return lambda: None if start is None else reads.total() - start


def reason(error):
    """A decoder's error in one line, without its C++ source location."""
    return re.sub(r"^.*?\.cpp:\d+, ", "", str(error).strip().splitlines()[0])


def read_jpeg_bytes(path):
    """--decoder gpu: the file's bytes, for the GPU to decode (JPEG files only)."""
    encoded = read_bytes(path)
    if encoded[:3].tolist() != [0xFF, 0xD8, 0xFF]:
        raise RecipeError(f"--decoder gpu decodes JPEG files on the GPU, and {path} is not one: use --decoder "
                          f"tensor for other formats")
    return encoded


def decoded_by(args):
    """What decodes the images, for the run's first line; None for --synthetic images."""
    decoder = getattr(args, "decoder", "tensor")
    if args.synthetic or decoder == "pil":
        return None if args.synthetic else "PIL"
    library = "TorchCodec" if decode_image is not None else "torchvision.io"
    return f"{library} on the GPU" if decoder == "gpu" else library


def build_transforms(args):
    """The loader workers' share of the ImageNet training and validation transforms: crop, resize and flip, on
    PIL images or uint8 tensors; none with --decoder gpu. The batches stay uint8, 4x fewer bytes than float
    through shared memory, pinning and the copy; the device converts and normalises them (device_transform)."""
    decoder = getattr(args, "decoder", "tensor")
    if decoder == "gpu":
        return None, None
    if decoder == "pil":
        return (transforms.Compose([transforms.RandomResizedCrop(args.image_size, scale=tuple(args.scale)),
                                    transforms.RandomHorizontalFlip(args.hflip), transforms.PILToTensor()]),
                transforms.Compose([transforms.Resize(round(args.image_size / 0.875)),  # 256 for 224
                                    transforms.CenterCrop(args.image_size), transforms.PILToTensor()]))
    return image_transforms(args)


def image_transforms(args):
    """RandomResizedCrop and a flip for training, resize to size/0.875 and a centre crop for validation, on uint8
    tensors (in the loader workers, or on the GPU after --decoder gpu)."""
    return (v2.Compose([v2.RandomResizedCrop(args.image_size, scale=tuple(args.scale), antialias=True),
                        v2.RandomHorizontalFlip(args.hflip)]),
            v2.Compose([v2.Resize(round(args.image_size / 0.875), antialias=True),  # 256 for 224
                        v2.CenterCrop(args.image_size)]))


def normalization():
    """The per-channel mean and std the inputs are normalised with (of 0-1 pixels; checkpoints record them)."""
    return {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}


def device_transform(args, device, num_classes, train=True):
    """What the training process does to each batch: (images, target) -> on the device, ready for the model.

    The copies do not block (the loader pins its batches on CUDA). On the device: decode the JPEG bytes and
    crop (--decoder gpu); uint8 to float, normalised; channels_last (--channels-last); and for training,
    mixing (--mixup-alpha, --cutmix-alpha: soft targets).
    """
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
    memory_format = torch.channels_last if getattr(args, "channels_last", False) else torch.contiguous_format
    decode = getattr(args, "decoder", "tensor") == "gpu"
    crop = image_transforms(args)[0 if train else 1] if decode else None
    mix = mixup_cutmix(args, num_classes) if train else None

    def to_device(images, target):
        if decode:
            images = decode_on_device(images, crop, device, args.image_size)
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        if not images.is_floating_point() and images.dtype != torch.uint8:  # token ids: the model embeds them
            return images, target
        # One float copy, normalised in place: on a CPU, a new tensor per operation costs more than the arithmetic.
        images = images.to(torch.float32, memory_format=memory_format).sub_(mean).div_(std)
        return mix(images, target) if mix is not None else (images, target)
    return to_device


def decode_on_device(encoded, crop, device, image_size):
    """--decoder gpu: a batch of JPEG files' bytes, decoded together on the GPU (nvjpeg, through TorchCodec where
    it is installed, else torchvision.io), each cropped there."""
    if not encoded:  # (an empty batch, which evaluation in lockstep runs)
        return torch.empty(0, 3, image_size, image_size, dtype=torch.uint8, device=device)
    try:
        if decode_jpeg is not None:
            images = decode_jpeg(list(encoded), mode="RGB", device=device)
        else:
            images = io.decode_jpeg(list(encoded), mode=io.ImageReadMode.RGB, device=device)
    except RuntimeError as error:
        raise RecipeError(f"--decoder gpu could not decode a batch on {device} "
                          f"({reason(error)}): use --decoder tensor") from None
    return torch.stack([crop(image) for image in images])


def collate_encoded(samples):
    """--decoder gpu: a batch of files' bytes (of different lengths) stays a list; the labels become a tensor."""
    return [image for image, _ in samples], torch.tensor([label for _, label in samples])


class PackedImageFolder(datasets.ImageFolder):
    """ImageFolder whose (path, class) list pickles as one bytes string and one array.

    Loader workers start from a fork server every epoch and receive the data set
    through a pipe: ImageNet's list of 1.28 M tuples takes about a second to pickle,
    per worker, in the training process; packed, a few hundredths. Its reads are counted (StorageReads).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = StorageReads()

    def __getitem__(self, index):
        self.reads.before_loading()
        image, target = super().__getitem__(index)
        self.reads.after_loading()
        return image, target

    def __getstate__(self):
        state = {key: value for key, value in self.__dict__.items() if key not in ("samples", "imgs", "targets")}
        state["packed"] = ("\0".join(path for path, _ in self.samples).encode(), array.array("q", self.targets))
        return state

    def __setstate__(self, state):
        paths, targets = state.pop("packed")
        self.__dict__.update(state)
        self.targets = targets.tolist()
        self.samples = self.imgs = list(zip(paths.decode().split("\0"), self.targets)) if self.targets else []


class TarShards(Dataset):
    """A folder of WebDataset shards (scripts/make_shards.py writes them: each image beside a .cls file holding
    its class index) as a map-style data set, like an image folder: indexed once at the start (every tar
    header read), then each image is one read at its offset. So the samplers, the exact evaluation and the
    mid-epoch resume work on it as on a folder; ShardOrder gives each rank its own shards to read in turn.
    The class names come from classes.txt beside train/ and val/, else they are the indices."""

    def __init__(self, folder, transform, loader):
        self.transform, self.loader, self.reads = transform, loader, StorageReads()
        self.shards = shard_paths(folder)
        if not self.shards:
            raise RecipeError(f"{folder} has no images (expected <class>/<image> files or .tar shards)")
        self.members, self.targets, self.first = [], [], []  # per image; the first image of each shard
        for shard in self.shards:
            self.first.append(len(self.members))
            for member, target in index_shard(shard):
                self.members.append(member)
                self.targets.append(target)
        names = Path(folder).parent / "classes.txt"
        count = max(self.targets, default=-1) + 1
        self.classes = names.read_text().split("\n")[:-1] if names.exists() else [str(c) for c in range(count)]
        if count > len(self.classes):
            raise RecipeError(f"{folder}'s shards hold class index {count - 1}, and {names} names "
                              f"{len(self.classes)} classes")

    def __len__(self):
        return len(self.members)

    def __getitem__(self, index):
        self.reads.before_loading()
        image = self.loader(self.members[index])
        self.reads.after_loading()
        return (self.transform(image) if self.transform else image), self.targets[index]


SHARD_LIST = "shards.txt"  # in a split's folder, instead of its .tar files: where they are, one a line
FETCHED = ("http", "https", "ftp", "file")  # the URL schemes fetched into the shard cache (and "pipe:COMMAND")


def shard_paths(folder):
    """The shards of a split's folder: its .tar files, sorted; or, where it holds shards.txt, the shards listed
    there, in that order: a path (relative to the folder, or absolute), or a URL (http, https, ftp, file, or
    WebDataset's pipe:COMMAND, whose output is the shard), fetched into the shard cache first."""
    listing = Path(folder) / SHARD_LIST
    if not listing.exists():
        return sorted(str(shard) for shard in Path(folder).glob("*.tar"))
    shards = []
    for line in listing.read_text().splitlines():
        source = line.strip()
        if not source or source.startswith("#"):
            continue
        if source.startswith("pipe:") or urllib.parse.urlsplit(source).scheme in FETCHED:
            shards.append(fetch_shard(source))
        elif (Path(folder) / source).is_file():
            shards.append(str(Path(folder) / source))
        else:
            raise RecipeError(f"{listing} names {source}, which is not a file (give a path or an http(s), ftp, "
                              f"file or pipe: URL)")
    return shards


def shard_cache():
    """Where fetched shards are kept: $SHARD_CACHE, else ~/.cache/recipes/shards (a local disk: each machine
    fetches its own copy)."""
    return Path(os.environ.get("SHARD_CACHE") or Path.home() / ".cache" / "recipes" / "shards")


def fetch_shard(source):
    """The path of the shard at URL `source` in the shard cache, fetched once per cache: the first process to
    ask fetches it while the others (this machine's other ranks) wait on a lock, then read it. A shard enters
    the cache only whole and readable (fetched under a temporary name, indexed, then renamed), so a failed or
    cut-short fetch is fetched again next time, never read."""
    cache = shard_cache()
    name = f"{hashlib.sha256(source.encode()).hexdigest()[:16]}-{Path(urllib.parse.urlsplit(source).path).name}"
    path, partial = cache / name, cache / f"{name}.partial"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                _fetch(source, partial)
                index_shard(str(partial))
                os.replace(partial, path)
    except RecipeError as error:  # (index_shard's: the shard fetched is not a readable one)
        partial.unlink(missing_ok=True)
        raise RecipeError(str(error).replace(str(partial), source)) from None
    except (OSError, ValueError, http.client.HTTPException) as error:
        partial.unlink(missing_ok=True)
        why = error.reason if type(error) is urllib.error.URLError else error  # (not "<urlopen error ...>")
        raise RecipeError(f"cannot fetch shard {source} into {cache}: {str(why).strip() or type(why).__name__}") \
            from None
    return str(path)


def _fetch(source, into):
    with open(into, "wb") as out:
        if source.startswith("pipe:"):
            done = subprocess.run(source[len("pipe:"):], shell=True, stdout=out, stderr=subprocess.PIPE, text=True)
            if done.returncode:
                said = done.stderr.strip().splitlines()
                raise OSError(f"the command ended with code {done.returncode}" + (f": {said[-1]}" if said else ""))
            return
        with urllib.request.urlopen(source, timeout=60) as response:
            shutil.copyfileobj(response, out, 1 << 20)
            size = response.headers.get("Content-Length")
        if size is not None and out.tell() != int(size):
            raise OSError(f"the connection closed after {out.tell()} of its {size} bytes")


def index_shard(shard):
    """[(Member, class index)] of one tar shard, in its order: every image with its .cls beside it."""
    images, targets = {}, {}
    try:
        with tarfile.open(shard, "r:") as tar:
            for info in tar:
                folder, _, name = info.name.rpartition("/")
                key, _, extension = name.partition(".")  # (WebDataset: the key is up to the name's first dot)
                key = f"{folder}/{key}"
                if not info.isfile():
                    continue
                if extension == "cls":
                    targets[key] = int(tar.extractfile(info).read().decode().strip())
                elif f".{extension.lower()}" in datasets.folder.IMG_EXTENSIONS:  # (as ImageFolder reads a folder)
                    images[key] = Member(shard, info.name, info.offset_data, info.size)
    except (tarfile.TarError, OSError, ValueError) as error:
        raise RecipeError(f"corrupt shard {shard}: {str(error).strip() or type(error).__name__}") from None
    missing = sorted(set(images) - set(targets))
    if missing:
        raise RecipeError(f"corrupt shard {shard}: {images[missing[0]].name} has no .cls (its class index) beside it")
    return [(member, targets[key]) for key, member in images.items()]


class ShardOrder(torch.utils.data.Sampler):
    """A DistributedSampler's share of an epoch (its ranks, seed and epoch: the recipe's set_epoch reaches it),
    by shard: the shards in a new order each epoch, cut into equal runs, one a rank, so that each reads its
    own shards, one after another; shuffled within a buffer of SHUFFLE_BUFFER images, as WebDataset's
    shuffle(). A folder is shuffled image by image; shards are written shuffled (scripts/make_shards.py)."""

    def __init__(self, dataset, sampler):
        self.dataset, self.sampler = dataset, sampler

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch):  # (nd's loader: Run.batches tells it the epoch)
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        sampler, shards = self.sampler, self.dataset
        generator = torch.Generator().manual_seed(sampler.seed + sampler.epoch)
        bounds = [*shards.first, len(shards)]
        order = [index for shard in torch.randperm(len(shards.first), generator=generator).tolist()
                 for index in range(bounds[shard], bounds[shard + 1])]
        order = (order * (sampler.total_size // max(len(order), 1) + 1))[:sampler.total_size]  # (as it pads)
        mine = order[sampler.rank * sampler.num_samples:(sampler.rank + 1) * sampler.num_samples]
        buffer = []
        for index in mine:
            buffer.append(index)
            if len(buffer) == SHUFFLE_BUFFER:
                yield buffer.pop(int(torch.randint(len(buffer), (), generator=generator)))
        while buffer:
            yield buffer.pop(int(torch.randint(len(buffer), (), generator=generator)))


SHUFFLE_BUFFER = 1000
TOKENS = "tokens.pt"  # a split of a text: {"sequences": (N, T) token ids, "vocabulary": [token, ...]}
MASK, IGNORED = "[MASK]", -100  # the mask token; a label nothing is scored on (CrossEntropyLoss's ignore_index)
MASKED_FRACTION = 0.15  # BERT's: of each sequence's tokens, this share is predicted


class MaskedTokens(Dataset):
    """A text's fixed-length token sequences for masked-language-model training, after BERT (Devlin et al., 2019):
    in each sequence round(0.15 T) positions (at least one) are chosen, each replaced by [MASK] (80 %), a random
    token (10 %) or left as it is (10 %), and only they are scored: the label is the original token there,
    IGNORED elsewhere.
    Every sequence has the same count of scored positions, so the meters' per-sequence sums are exact per-token
    ones. The masks are drawn from the sequence's index, the same in every epoch (BERT's static masking, with
    one copy of each sequence where BERT's data writes 10): a pipeline's first stage, which reads the tokens,
    and its last, which reads the labels, load the batch apart and must draw the same. `classes` is the
    vocabulary: the model predicts one of its tokens."""

    def __init__(self, path):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            self.sequences, self.classes = state["sequences"], list(state["vocabulary"])
        except Exception as error:  # (a file torch cannot read, or a state without the two keys)
            raise RecipeError(f"{path}: not a tokenised text ({reason(error)}): write it with "
                              f"python scripts/make_demo_data.py --text DIR") from None
        if self.sequences.ndim != 2 or not self.sequences.numel() or MASK not in self.classes:
            raise RecipeError(f"{path}: expected (sequences, tokens) token ids and a vocabulary with {MASK}")
        if not 4 <= self.sequences.shape[1] <= BERT_POSITIONS:  # (bert_tiny's position embeddings)
            raise RecipeError(f"{path}: sequences of {self.sequences.shape[1]} tokens; bert_tiny takes 4 to "
                              f"{BERT_POSITIONS}")
        if self.sequences.min() < 0 or self.sequences.max() >= len(self.classes):
            raise RecipeError(f"{path}: token ids outside the vocabulary of {len(self.classes)}")
        self.sequences = self.sequences.long()  # (ids, never pixels: uint8 ones would be normalised as images)
        self.mask = self.classes.index(MASK)
        self.masked = max(1, round(MASKED_FRACTION * self.sequences.shape[1]))

    def __len__(self):
        return len(self.sequences)

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        tokens = self.sequences[index].clone()
        positions = torch.randperm(len(tokens), generator=generator)[:self.masked]
        target = torch.full_like(tokens, IGNORED)
        target[positions] = tokens[positions]
        draw = torch.rand(self.masked, generator=generator)
        tokens[positions[draw < 0.8]] = self.mask
        randomised = positions[(draw >= 0.8) & (draw < 0.9)]
        tokens[randomised] = torch.randint(len(self.classes), (len(randomised),), generator=generator)
        return tokens, target


class SyntheticImages(Dataset):
    """Random uint8 images with labels, served from a small in-memory pool."""

    def __init__(self, length, image_size, num_classes, pool_size=256):
        self.length, self.image_size, self.num_classes = length, image_size, num_classes
        self.pool_size = pool_size if length else 0  # (-e's empty training set: no images to serve)
        self.pool = self._make_pool()

    def _make_pool(self):
        generator = torch.Generator().manual_seed(self.length)
        return torch.randint(0, 256, (self.pool_size, 3, self.image_size, self.image_size), dtype=torch.uint8,
                             generator=generator)

    def __getstate__(self):  # a loader worker rebuilds the pool rather than receive 38 MB through a pipe
        return {key: value for key, value in self.__dict__.items() if key != "pool"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.pool = self._make_pool()

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return self.pool[index % len(self.pool)], index % self.num_classes


def example_input(dataset, image_size):
    """One input of zeros as the model takes it (what a pipeline's split is measured on): a sequence of the text's
    length, or an image."""
    if isinstance(dataset, MaskedTokens):
        return torch.zeros(1, dataset.sequences.shape[1], dtype=torch.long)
    return torch.zeros(1, 3, image_size, image_size)


def check_folder(args):
    """DIR exists and holds train/ and val/ (-e: val/ alone), what can be told without reading an image: the
    folder, else one clear error. runlog.RunLog checks it first, so that a wrong DIR is the error a user sees."""
    root = Path(args.data)
    if not root.is_dir():
        raise RecipeError(f"data directory {root} does not exist")
    for split in splits(args):
        if not (root / split).is_dir():
            raise RecipeError(f"{root} has no {split}/ folder (expected {root}/{split}/<class>/<image>)")
    return root


def splits(args):
    """The folders a run reads: -e evaluates on val/ and trains on nothing, so it needs no train/."""
    return ("val",) if getattr(args, "evaluate", False) else ("train", "val")


def build_datasets(args):
    """Return (train_set, val_set, num_classes); bad folders are one clear error. With -e the training set is
    empty (train/ is not read, and may be missing) and the classes are val/'s."""
    if args.synthetic:
        train_images = SYNTHETIC_TRAIN_IMAGES if "train" in splits(args) else 0
        return (SyntheticImages(train_images, args.image_size, SYNTHETIC_CLASSES),
                SyntheticImages(SYNTHETIC_VAL_IMAGES, args.image_size, SYNTHETIC_CLASSES),
                SYNTHETIC_CLASSES)
    root = check_folder(args)
    transforms = dict(zip(("train", "val"), build_transforms(args)))
    loader = {"pil": load_image, "gpu": read_jpeg_bytes}.get(getattr(args, "decoder", "tensor"), read_image)
    folders = {}
    for split in splits(args):
        if (root / split / TOKENS).exists():  # a tokenised text
            folders[split] = MaskedTokens(root / split / TOKENS)
            continue
        if any((root / split).glob("*.tar")) or (root / split / SHARD_LIST).exists():
            folders[split] = TarShards(root / split, transforms[split], loader)
            continue
        try:
            folders[split] = PackedImageFolder(root / split, transforms[split], loader=loader)
        except FileNotFoundError:
            raise RecipeError(f"{root / split} has no images (expected <class>/<image> files or .tar shards)") \
                from None
    val_set = folders["val"]
    arch = getattr(args, "arch", None)
    if isinstance(val_set, MaskedTokens) != (arch == "bert_tiny"):  # (else the first forward fails)
        raise RecipeError(f"-a bert_tiny trains on a tokenised text, the other models on images: {root} holds "
                          f"{'a text' if isinstance(val_set, MaskedTokens) else 'images'}, and --arch is {arch}")
    if "train" not in folders:  # -e
        return Subset(val_set, []), val_set, len(val_set.classes)
    train_set = folders["train"]
    if train_set.classes != val_set.classes:  # else val labels would silently mean other classes
        raise RecipeError(f"train/ and val/ in {root} have different class folders (or vocabularies): "
                          f"{len(train_set.classes)} vs {len(val_set.classes)}")
    return train_set, val_set, len(train_set.classes)


def hold_out(dataset, fraction, seed):
    """Split a training set in two at random (the same split for every rank and run with the same seed):
    (the rest, the held-out `fraction`). The parameter server's validators train-check on the held-out part."""
    if len(dataset) == 0:  # (-e: nothing to train on, nothing to hold out)
        return dataset, dataset
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed or 0)).tolist()
    held = max(1, round(fraction * len(dataset)))
    if held >= len(dataset):
        raise RecipeError(f"holding out {fraction:g} of {len(dataset)} train images leaves none to train on")
    return Subset(dataset, sorted(order[held:])), Subset(dataset, sorted(order[:held]))


class EpochShuffle(DistributedSampler):
    """One process's shuffle, new each epoch, as DataLoader's shuffle=True: the permutation that a DDP run with
    the same --seed splits between its ranks, so that the two see the same data per step. The loader owns it, and
    Run.batches gives it the epoch, so a resumed run draws the same order. (A sampler that the recipe brings, as
    DDP's DistributedSampler, is the recipe's to tell: set_epoch.)"""

    def __init__(self, dataset, seed):
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed or 0)


def train_loader(dataset, args, sampler=None):
    """One batch per optimizer step: --batch-size x --accum-steps images (uint8; the device normalises them).
    Without a sampler: shuffled anew each epoch (EpochShuffle)."""
    step_batch = args.batch_size * args.accum_steps
    if sampler is None:
        sampler = EpochShuffle(dataset, args.seed)
    if isinstance(dataset, TarShards) and isinstance(sampler, DistributedSampler):
        sampler = ShardOrder(dataset, sampler)  # (the same share of the epoch, read shard by shard)
    # persistent workers: started once, not every epoch; with --seed each epoch starts new ones, seeded per epoch
    # (data.set_seed), so that a run resumed at an epoch's end draws the same augmentations
    loader = _train_dataloader(dataset, step_batch, sampler, args.workers, collate(args),
                               persistent=args.seed is None)
    if len(loader) == 0 and not getattr(args, "evaluate", False):  # (-e trains on nothing: an empty loader)
        raise RecipeError(f"train/ gives {len(sampler)} images per process, fewer than one step of "
                          f"--batch-size {args.batch_size} x --accum-steps {args.accum_steps}")
    return loader


def collate(args):
    return collate_encoded if getattr(args, "decoder", "tensor") == "gpu" else None


def mixup_cutmix(args, num_classes):
    """--mixup-alpha, --cutmix-alpha: blend pairs of images of a batch, and their labels in the same
    proportion (soft targets); with both on, one or the other per batch. None when both are off. It runs on the
    device, on the normalised batch (mixing commutes with the per-channel normalisation)."""
    mixes = [mix(alpha=alpha, num_classes=num_classes)
             for mix, alpha in ((v2.MixUp, args.mixup_alpha), (v2.CutMix, args.cutmix_alpha)) if alpha > 0]
    return v2.RandomChoice(mixes) if mixes else None


def skip_batches(loader, steps):
    """The rest of this epoch's batches after `steps` of them, in the same order.

    Call after the sampler has its epoch. The skipped images are never loaded. The new
    loader draws its workers' seed from a generator of its own, so the random
    state a mid-epoch checkpoint restored is left for the augmentations.
    """
    if steps == 0:
        return loader
    if not isinstance(loader, DataLoader):  # (the parameter server's steps: a range)
        return loader[steps:]
    remaining = list(loader.sampler)[steps * loader.batch_size:]
    return _train_dataloader(loader.dataset, loader.batch_size, remaining, loader.num_workers, loader.collate_fn,
                             generator=torch.Generator().manual_seed(steps))


def _train_dataloader(dataset, batch_size, sampler, num_workers, collate_fn=None, generator=None, persistent=False):
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, collate_fn=collate_fn,
                      pin_memory=torch.cuda.is_available(), drop_last=True, generator=generator,
                      persistent_workers=persistent and num_workers > 0,
                      multiprocessing_context=workers.context(num_workers),
                      worker_init_fn=workers.leave_sigterm_to_the_trainer)


def val_loader(dataset, args, rank=0, world_size=1):
    """Every validation image exactly once: rank r takes images r, r+W, r+2W, ...

    Shards differ by at most one image and nothing is padded or dropped; the
    counts are summed across ranks afterwards (metrics.evaluate).
    """
    shard = Subset(dataset, range(rank, len(dataset), world_size))
    return DataLoader(shard, batch_size=args.batch_size, shuffle=False, num_workers=args.workers,
                      collate_fn=collate(args), pin_memory=torch.cuda.is_available(),
                      persistent_workers=args.workers > 0,  # (evaluation draws nothing at random)
                      multiprocessing_context=workers.context(args.workers),
                      worker_init_fn=workers.leave_sigterm_to_the_trainer)
