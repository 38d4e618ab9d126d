"""What every recipe needs and no recipe teaches.

data, distributed set-up, exact evaluation, metrics, logging, checkpoints and
the command line. The training loops stay in the recipes.
"""


class RecipeError(Exception):
    """Bad input: the run ends with this one line and exit code 2."""

    exit_code = 2


class RunFailed(RecipeError):
    """The run cannot go on (a peer died, training diverged): one line and exit code 1."""

    exit_code = 1
