"""Draw every figure and rewrite every table of RESULTS.md and its long forms from figures/data/ alone.

    python scripts/figures/plot_results.py                 # figures/*.png, RESULTS.md and docs/results/*.md
    python scripts/figures/plot_results.py --data D --figures F --results R.md   # elsewhere (tests)

The pages are RESULTS.md (--results) and the long forms beside it, docs/results/<part>.md from the
folder RESULTS.md is in. Each part has its renderer, scripts/figures/<part>/render.py (the index:
scripts/figures/__init__.py, the Makefile's PARTS). It reads only the measured files that the
benchmark scripts write:
  curves/<recipe>-seed<S>.csv  per-epoch metrics copied from run directories (scripts/figures/curves/measure.py)
  scaling.csv           images/s and epoch time per world size, and the bare loop (scripts/figures/scaling/measure.py)
  io.csv                input-pipeline images/s and MB/s per decoder and worker count (scripts/figures/io/measure.py)
  io_loader.json        uint8 batches on the trainer, first-batch waits (scripts/figures/io/measure.py)
  io_storage.csv        image folder against shards: images/s, MB/s and reads/s, cold and warm page cache
                        (scripts/figures/io/measure.py)
  examples.json         the nd recipe against pytorch/examples' imagenet/main.py (scripts/figures/examples/measure.py)
  recovery.json         checkpoint cost and restart time (scripts/figures/recovery/measure.py)
  compression.csv       time, accuracy and bytes per gradient-compression method and seed
                        (scripts/figures/compression/measure.py)
  compile.csv           epoch times, eager against torch.compile (scripts/figures/compile/measure.py)
  ps.csv                the parameter server against Byzantine workers, per run and seed (scripts/figures/ps/measure.py)
  ps_byzfl.csv          ByzFL's own benchmark on the same digits, per rule, attack and seed
                        (scripts/figures/ps/byzfl_reference.py)
  pipeline.csv, pipeline_curves.csv, pipeline_time.csv, pipeline_bert.csv   pipelined replicas per sync method,
                        stragglers, the time to a target, the masked language model's loss against seconds and
                        the bubble (scripts/figures/pipeline/measure.py)
  sharding.csv          bytes per rank and images/s of each --shard mode against processes
                        (scripts/figures/sharding/measure.py)
  timings.csv           how long each part of make figures took (every script above)
  gpu/table.csv, profiles.json, compression.csv   the GPU table, its profiles, and on a node with more GPUs
                        the compression hooks over NCCL (scripts/figures/gpu/measure.py: make gpu-check,
                        make figures-gpu)
  gpu/smoke.json, preflight.json   the one-GPU check and the node it ran on (scripts/gpu/check.py)
Accuracy over several seeds is reported as the mean and the min-max range; two
results differ by more than the seed-to-seed spread when their ranges do not
overlap. In each page only the text between `<!-- BEGIN name -->` and `<!-- END name -->`
markers is rewritten, wherever they stand (a table may stand on RESULTS.md and on its long
form); the prose around it is kept. A section no page has a place for is added at RESULTS.md's end.
"""

import argparse
import importlib.util
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
if importlib.util.find_spec("matplotlib") is None:
    sys.exit("error: drawing the figures needs matplotlib: pip install -e '.[figures]' (make setup installs it)")
from scripts.figures import OTHERS, PARTS, renderer


def pages_of(results):
    """RESULTS.md, then its long forms (docs/results/*.md beside it)."""
    return [results, *sorted((results.parent / "docs" / "results").glob("*.md"))]


def rewrite(results, sections):
    texts = {page: page.read_text() if page.exists() else "" for page in pages_of(results)}
    for name, body in sections.items():
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        block = f"<!-- BEGIN {name} -->\n{body}\n<!-- END {name} -->"
        found = [page for page, text in texts.items() if pattern.search(text)]
        for page in found:
            texts[page] = pattern.sub(lambda m: block, texts[page])
        if not found:
            texts[results] += f"\n{block}\n"
    for page, text in texts.items():
        page.write_text(text)
    print(f"rewrote {len(sections)} table(s) in {results} and {len(texts) - 1} long form(s) beside it")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="figures/data")
    parser.add_argument("--figures", default="figures")
    parser.add_argument("--results", default="RESULTS.md")
    args = parser.parse_args()
    data, figures = Path(args.data), Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    sections, missing = {}, []
    for part in PARTS + OTHERS:
        sections.update(renderer(part).render(data, figures, missing))
    rewrite(Path(args.results), sections)
    for name in missing:
        print(f"warning: no {data / name.split(' ')[0]}: run {name.split(' ')[1][1:-1]} to measure it",
              file=sys.stderr)


if __name__ == "__main__":
    main()
