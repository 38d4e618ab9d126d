"""A torch.distributed.checkpoint directory loaded as torch.load(weights_only=True) loads a file: no code runs.

DCP's FileSystemReader unpickles a directory's .metadata with plain pickle.load, and its
DefaultLoadPlanner loads each entry that is not a tensor (an optimizer's learning rate) with
torch.load(weights_only=False): a crafted directory would run its code at --resume. Here
.metadata goes through an unpickler that builds nothing but DCP's own metadata types and the
few torch types they hold, its file names must lie inside the directory, and the other entries
load with weights_only=True. What fails is refused in one line naming the file.
"""

import io
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from recipes.common import RecipeError

METADATA_TYPES = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # torch.strided and the other layouts, by name
    # the directory it was saved to, when given as a Path (pathlib._local: where Python 3.13 moved the classes)
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib._local", "PosixPath"),
    ("pathlib._local", "PurePosixPath"),
}


class MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata types, torch.Size, dtypes and layouts; refuses every other global."""

    def find_class(self, module, name):
        if (module, name) in METADATA_TYPES or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                 torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is no part of a checkpoint's metadata")


def read_metadata(file):
    """Unpickle a .metadata file with MetadataUnpickler and check what it points to; RecipeError if it fails."""
    file = Path(file)
    try:
        with open(file, "rb") as f:
            metadata = MetadataUnpickler(f).load()
    except Exception as error:  # refused, truncated, or not a pickle at all
        text = str(error).strip().splitlines()
        raise RecipeError(f"refusing to load {file}: {text[0] if text else type(error).__name__} "
                          f"(nothing was loaded or run)") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise RecipeError(f"refusing to load {file}: it is not a torch.distributed.checkpoint metadata file")
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            raise RecipeError(f"refusing to load {file}: it points to {name!r}, not to a file beside it")
        target = file.parent / name  # (a link would lead anywhere: a device, a pipe, another user's file)
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise RecipeError(f"refusing to load {file}: its {name} is a link or not a plain file")
    return metadata


class SafeReader(FileSystemReader):
    """FileSystemReader with .metadata read by read_metadata()."""

    def read_metadata(self, *args, **kwargs):
        metadata = read_metadata(self._get_metadata_path(kwargs.get("rank")))
        if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class WeightsOnlyPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner with the entries that are not tensors loaded by torch.load(weights_only=True).

    load_bytes is DefaultLoadPlanner.load_bytes (torch/distributed/checkpoint/default_planner.py) with that one
    change: its attributes (flatten_state_dict, mappings, original_state_dict) are the parent's."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def load_bytes(self, read_item, value: io.BytesIO):
        try:
            value = torch.load(value, weights_only=True)
        except pickle.UnpicklingError:
            raise RecipeError(f"refusing to load {self.path}: its entry {read_item.dest_index.fqn} holds Python "
                              f"objects other than plain values (possibly code), which weights_only loading "
                              f"blocks") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], value)
        else:
            self.state_dict[read_item.dest_index.fqn] = value
