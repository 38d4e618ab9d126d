"""examples: the nd recipe against pytorch/examples' imagenet/main.py (scripts/figures/examples/measure.py, run by hand:
it needs pytorch/examples; not a part of make figures).

    reads    figures/data/examples.json
    draws    none
    writes   sections examples
"""

import json

from scripts.figures.rendering import table


def examples_table(result):
    """The nd recipe against pytorch/examples' imagenet/main.py (scripts/figures/examples/measure.py)."""
    rows = [[name, f"{result[key]['wall_s']:.2f}", f"{result[key]['cpu_s']:.2f}", result[key]["left_running"]]
            for name, key in (("recipes/nd/train.py", "recipe"), ("pytorch/examples imagenet/main.py", "examples"))]
    return (table(["command", "wall (s)", "CPU (s)", "processes left when it ended"], rows) +
            f"\n\nrecipe / examples: wall {result['wall_ratio']:.3f}x, CPU {result['cpu_ratio']:.3f}x; the medians "
            f"of {result['repeats']} runs of each, taken in turn: `{result['flags']}`, one epoch of "
            f"{result['images']} JPEGs on {result['cpu']} ({result['cores']} cores), torch {result['torch']}.")


def render(data, figures, missing):
    path = data / "examples.json"
    return {"examples": examples_table(json.loads(path.read_text()))} if path.exists() else {}
