"""ps: the recipe's deviations from its authors' code, the table of recipes/ps/deviations.py (no measurement).

    writes   section ps-deviations
"""

from recipes.ps.deviations import AUTHORS_COMMITS, DEVIATIONS, FILES
from scripts.figures.rendering import table


def deviations():
    """The recipe's deviations from its authors' code, as recipes/ps/deviations.py lists them."""
    files = "; in ".join(f"{repository} at {commit[:7]}, " + ", ".join(
        f"{short} is `{path}`" for short, (of, path) in FILES.items() if of == repository)
        for repository, commit in AUTHORS_COMMITS.items())
    rows = [(row["here"], f"{row['theirs']} ({row['where']})", row["why"]) for row in DEVIATIONS]
    return (f"In {files}.\n\n"
            + table(("here", "the authors (their files and lines)", "why"), rows))


def render():
    """Its section, measured or not."""
    return {"ps-deviations": deviations()}
