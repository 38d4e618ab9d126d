"""Draw every figure and rewrite every table of RESULTS.md from figures/data/ alone.

    python scripts/plot_results.py                 # figures/*.png and RESULTS.md
    python scripts/plot_results.py --data D --figures F --results R.md   # elsewhere (tests)

Each part has its module in scripts/results/ (the index: scripts/results/__init__.py, the
Makefile's PARTS). It reads only the measured files that the benchmark scripts write:
  curves/<recipe>-seed<S>.csv  per-epoch metrics copied from run directories (bench_curves.py)
  scaling.csv           images/s and epoch time per world size, and the bare loop (bench_scaling.py)
  io.csv                input-pipeline images/s and MB/s per decoder and worker count (bench_io.py)
  io_loader.json        uint8 batches on the trainer, first-batch waits (bench_io.py)
  examples.json         the nd recipe against pytorch/examples' imagenet/main.py (bench_examples.py)
  recovery.json         checkpoint cost and restart time (bench_recovery.py)
  compression.csv       time, accuracy and bytes per gradient-compression method and seed (bench_compression.py)
  compile.csv           epoch times, eager against torch.compile (bench_compile.py)
  ps.csv                the parameter server against Byzantine workers, per run and seed (bench_ps.py)
  ps_byzfl.csv          ByzFL's own benchmark on the same digits, per rule, attack and seed (bench_ps_byzfl.py)
  pipeline.csv, pipeline_curves.csv   pipelined replicas per sync method, stragglers and the bubble
                        (bench_pipeline.py)
  sharding.csv          bytes per rank and images/s of each --shard mode against processes (bench_sharding.py)
  timings.csv           how long each part of make figures took (every script above)
  gpu/table.csv, profiles.json, compression.csv   the GPU table, its profiles, and on a node with more GPUs
                        the compression hooks over NCCL (bench_gpu.py: make gpu-check, make figures-gpu)
  gpu/smoke.json, preflight.json   the one-GPU check and the node it ran on (gpu_check.py)
Accuracy over several seeds is reported as the mean and the min-max range; two
results differ by more than the seed-to-seed spread when their ranges do not
overlap. In RESULTS.md only the text between `<!-- BEGIN name -->` and
`<!-- END name -->` markers is rewritten; the prose around it is kept.
"""

import argparse
import importlib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.results import OTHERS, PARTS  # noqa: E402


def rewrite(results, sections):
    text = results.read_text() if results.exists() else ""
    for name, body in sections.items():
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        block = f"<!-- BEGIN {name} -->\n{body}\n<!-- END {name} -->"
        if pattern.search(text):
            text = pattern.sub(lambda m: block, text)
        else:
            text += f"\n{block}\n"
    results.write_text(text)
    print(f"rewrote {len(sections)} table(s) in {results}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="figures/data")
    parser.add_argument("--figures", default="figures")
    parser.add_argument("--results", default="RESULTS.md")
    args = parser.parse_args()
    data, figures = Path(args.data), Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    sections, missing = {}, []
    for part in PARTS + OTHERS:  # (scripts/results/<part>.py)
        sections.update(importlib.import_module(f"scripts.results.{part}").render(data, figures, missing))
    rewrite(Path(args.results), sections)
    for name in missing:
        print(f"warning: no {data / name.split(' ')[0]}: run {name.split(' ')[1][1:-1]} to measure it",
              file=sys.stderr)


if __name__ == "__main__":
    main()
