"""RESULTS.md and figures/ from figures/data/, one module per part of `make figures`.

Each module's render(data, figures, missing) draws its part's figures and returns its
RESULTS.md sections (marker name -> text); a part whose data is missing adds a line to
`missing` and returns nothing. scripts/plot_results.py runs them all and rewrites the
text between the markers. Each module's docstring says what it reads, draws and writes.

    part         measured by                                  module
    io           scripts/bench_io.py                          io.py
    scaling      scripts/bench_scaling.py                     scaling.py
    curves       scripts/bench_curves.py                      curves.py
    recovery     scripts/bench_recovery.py                    recovery.py
    compile      scripts/bench_compile.py                     compile.py
    precision    scripts/bench_precision.py                   precision.py
    compression  scripts/bench_compression.py                 compression.py
    ps           scripts/bench_ps.py, bench_ps_byzfl.py        ps.py (and ps_targets.py)
    pipeline     scripts/bench_pipeline.py                    pipeline.py (and pipeline_targets.py)
    sharding     scripts/bench_sharding.py                    sharding.py
and, outside make figures: examples.py (scripts/bench_examples.py, run by hand), gpu.py and
gpu_context.py (make gpu-check, make figures-gpu), timings.py (how long each part took), headline.py (one line of what each
part found, first in RESULTS.md).
"""

PARTS = ["io", "scaling", "curves", "recovery", "compile", "precision", "compression", "ps", "pipeline",
         "sharding"]  # make figures' order: the Makefile's PARTS is this list (tests/test_results.py checks it)
OTHERS = ["examples", "timings", "gpu", "gpu_context", "headline"]  # rendered after the parts (headline: a line of each)
