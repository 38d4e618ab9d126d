"""torchrun for jobs that a scheduler preempts: a SIGTERM ends it with exit code 75, as it ends the recipes.

    python scripts/preemptible_torchrun.py --nproc_per_node=2 recipes/ddp/train.py DIR --auto-resume ...

Same arguments as torchrun. On SIGTERM (SLURM's time-limit signal, scancel, a
preemption), torchrun passes the signal to its workers, which save a checkpoint
and exit with 75, waits for them (--shutdown-timeout), and then raises
SignalException: plain torchrun prints its traceback and exits 1, so a batch
script cannot tell a preemption from a crash. This one exits 75 ("run me
again") and prints nothing more, so the log ends with the recipe's "preempted"
line. Every other end of torchrun is left as it is.
"""

import os
import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

EXIT_PREEMPTED = 75  # recipes.common.faults.EXIT_PREEMPTED

if __name__ == "__main__":
    try:
        main()
    except SignalException as stop:
        if stop.sigval != signal.SIGTERM:
            raise
        # Its workers have ended. Exit without tearing the interpreter down: there, the rendezvous's keep-alive
        # timer is stopped by a finalizer that now and then fails, and prints a cut-off traceback.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_PREEMPTED)
