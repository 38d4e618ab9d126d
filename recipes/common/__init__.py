"""What every recipe needs and no recipe teaches. The training loops stay in the recipes.

    cli          the flags and their checks
    launch       running a recipe's main (or spawning one per device); early ends as one line
    distributed  the process group, for each launch style
    data         data sets, transforms, samplers and loaders; workers: how loader workers start and end
    models       models by name, EMA, torch.compile
    amp          mixed precision: apex's opt levels on torch.amp
    schedule     learning-rate schedules, stepped every optimizer step
    bookkeeping  the Run: position, meters, schedule and EMA steps, evaluation, logs, checkpoints
    checkpoint   the one checkpoint schema: atomic saves, safe loads, resume; safe_dcp: sharded ones, as safely
    metrics      top-k counts, epoch meters summed across ranks, exact evaluation
    runlog       rank 0's output: console, progress bars, metrics.csv, TensorBoard, summary.json
    faults       SIGTERM and divergence checks
    sharding     sharded training's state dicts in the one schema, and bytes per rank
    pushpull     push and pull over point-to-point messages (the parameter server, hetpipe's servers)
    compat       what moved between the torch releases the recipes run on
"""


class RecipeError(Exception):
    """Bad input: the run ends with this one line and exit code 2."""

    exit_code = 2


class RunFailed(RecipeError):
    """The run cannot go on (a peer died, training diverged): one line and exit code 1."""

    exit_code = 1


def first_line(error):
    """The error's first sentence: what torch found, without its advice (which the line's own words give)."""
    text = str(error).strip()
    return text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(error).__name__
