"""make figures: one folder a part, each holding how it is measured and how it is rendered.

    scripts/figures/<part>/measure.py   the part's command: its runs, into figures/data/<part>*
    scripts/figures/<part>/render.py    render(data, figures, missing): its figures, and its sections of
                                        RESULTS.md and docs/results/<part>.md; headline(data): its answer
    scripts/figures/plot_results.py     runs every render() and rewrites the text between the pages' markers
    measuring.py, rendering.py          what the measuring, and the rendering, of several parts share
    bare_loop.py                        the plain PyTorch loop the recipes are timed against (scaling, GPU)
    headline.py, timings.py             RESULTS.md's first table, and how long each part took
    papers.py                           where the results agree with the papers the recipes follow
A part whose data is missing adds a line to `missing` and returns nothing. Beyond the parts in
make figures' order: examples (the nd recipe against pytorch/examples, run by hand), the GPU table
(scripts/figures/gpu/, its plan and its step timer beside measure.py and render.py: make figures-gpu, and
scripts/gpu/check.py's make gpu-check), timings and the headline. Nothing here imports scripts/gpu/ (the device
checks), which runs the GPU table from here.
"""

import importlib

PARTS = ["cluster", "io", "scaling", "curves", "recovery", "compile", "precision", "compression", "ps", "pipeline",
         "sharding"]  # make figures' order: the Makefile's PARTS is this list (tests/tools/test_results.py checks it)
OTHERS = ["examples", "timings", "gpu", "gpu_context", "papers",
          "headline"]  # rendered after the parts (headline: a line of each)
MODULES = {**{part: f"scripts.figures.{part}.render" for part in PARTS + ["examples"]},
           "timings": "scripts.figures.timings", "gpu": "scripts.figures.gpu.render",
           "gpu_context": "scripts.figures.gpu.render_context", "papers": "scripts.figures.papers",
           "headline": "scripts.figures.headline"}


def renderer(name):
    """The module that renders name (a part, or one of OTHERS)."""
    return importlib.import_module(MODULES[name])
