"""headline: RESULTS.md's first table, a user's questions each answered by one part, with the machine it ran on.

    reads    what each part reads (its module's headline(data)), the GPU table's (scripts/figures/gpu/render.py), and
             the machine each part's data records (rendering.measured_on)
    draws    none
    writes   RESULTS.md's headline
"""

from scripts.figures import renderer
from scripts.figures.rendering import measured_on, table
from scripts.figures.gpu import render as gpu

# the questions a user comes with, first those the page is for; each answered by one part (its section's anchor)
QUESTIONS = [("gpu", "What does mixed precision buy on a GPU?", "gpus"),
             ("precision", "And on a CPU?", "mixed-precision"),
             ("scaling", "How does DDP scale on a cluster?", "scaling"),
             ("ps", "Does the parameter server with Zeno validators hold against attacks, and at what cost?",
              "parameter-server-against-byzantine-workers"),
             ("pipeline", "What does partial reduce buy over allreduce?",
              "pipelined-replicas-allreduce-partial-reduce-ad-psgd-hetpipe"),
             ("sharding", "What does ZeRO save?", "sharded-data-parallel-bytes-per-rank-zero-1-to-zero-3"),
             ("curves", "Do the recipes learn alike?", "learning-curves"),
             ("compression", "What does gradient compression buy on a real network, and cost in accuracy?",
              "gradient-compression"),
             ("cluster", "Does the virtual cluster's wire run at the rate it is set to?", "a-cluster-on-one-machine"),
             ("recovery", "How soon does a killed run train again?", "recovery"),
             ("io", "How fast can the loader feed a trainer?", "input-pipeline"),
             ("compile", "What does torch.compile buy?", "torchcompile"),
             ("papers", "Where do the results agree with the papers the recipes follow, and why not?",
              "docs/results/papers.md")]


def render(data, figures, missing):
    rows = []
    for part, question, anchor in QUESTIONS:
        module, machine = (gpu, gpu.measured_on(data)) if part == "gpu" else (renderer(part), measured_on(data, part))
        if part == "papers":  # (no data of its own: the parts' whose papers it reads)
            machine = "; ".join(dict.fromkeys(measured_on(data, p) for p in ("ps", "pipeline")))
        answer = module.headline(data)
        if answer:
            rows.append([f"[{question}]({anchor if '/' in anchor else f'#{anchor}'})", answer, machine])
    return {"headline": table(["question", "answer", "measured on"], rows)}
