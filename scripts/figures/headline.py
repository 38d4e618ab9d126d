"""headline: one line of what each part of make figures found, first in RESULTS.md, after the GPU's.

    reads    what each part reads (its module's headline(data)), and the GPU table's (gpu.headline(data))
    draws    none
    writes   RESULTS.md's headline
"""

import importlib

from scripts.results import PARTS, gpu
from scripts.results.common import table

ANCHORS = {"io": "input-pipeline", "scaling": "scaling", "curves": "learning-curves", "recovery": "recovery",
           "compile": "torchcompile", "precision": "mixed-precision",
           "compression": "gradient-compression",
           "ps": "parameter-server-against-byzantine-workers",
           "pipeline": "pipelined-replicas-allreduce-partial-reduce-ad-psgd-hetpipe",
           "sharding": "sharded-data-parallel-bytes-per-rank-zero-1-to-zero-3"}


def render(data, figures, missing):
    rows = [["[GPU](#gpus)", gpu.headline(data)]] + [
        [f"[{part}](#{ANCHORS[part]})", found] for part in PARTS
        for found in [importlib.import_module(f"scripts.results.{part}").headline(data)] if found]
    return {"headline": table(["part", "what it found"], rows)}
