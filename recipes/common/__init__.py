"""What every recipe needs and no recipe teaches.

data, distributed set-up, exact evaluation, metrics, logging, checkpoints and
the command line. The training loops stay in the recipes.
"""


class RecipeError(Exception):
    """Bad input: the run ends with this one line and a non-zero exit."""
