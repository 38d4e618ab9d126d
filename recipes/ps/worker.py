"""A worker's work around its loop (train.py): who pushes and who lies in a round, and the push made of an
update: a round it sat out carried on (--worker-subsample), the attack, ZenoPS's simulated delay.

--worker-subsample p: each worker pushes in a round with probability p (ZenoPS's --worker-subsample-rate,
zeno_ps byteps/mxnet/__init__.py 381 sync, 824 async). After a round it sat out, sync: it starts from the new
weights plus that round's change and pushes the next alone (413-425); async: no pull, it pushes all it
trained since its last (824-871).

--worker-delay W: before each push a worker sleeps a uniform draw from [0, W) seconds, as ZenoPS's asynchronous
workers (__init__.py 821: W = 1 s x the number of workers), so that pushes arrive out of order. Their workers
also wait, after a push, until the server's timestamp has moved past their last pull (855-858); here a worker
pulls at once, and gets the weights as they are.
"""

import random
import time

import torch

from recipes.ps import attacks, steps


def draws(args, attacker, index, round_):
    """Whether worker `index` pushes in this round (counted from the run's start: a resume too), and which
    tensors of its push lie (one bool each)."""
    pushes = steps.joins(args, index, round_)
    lies = attacker.next_push(round_) if pushes else [False] * len(attacker.sizes)
    return pushes, lies


def prepare_push(args, attacker, index, round_, u, residual, pushes, lies):
    """The vector to push from this round's update u, and the residual to carry: what it trained and did not
    push (a round sat out, --local-steps above 1). Returns (the push, its counts, the residual)."""
    u = u + residual if args.mode == "async" else u
    residual = torch.zeros_like(u) if pushes or args.local_steps == 1 else u
    if pushes or attacker.shares_updates:  # (alie: every liar every round, pushing or not, shares its update)
        u = attacker.poison(u, lies)
    if pushes and args.worker_delay:
        time.sleep(random.Random(f"{args.seed}/{index}/{round_}/delay").uniform(0, args.worker_delay))
    return u, attacks.counts(lies, attacker.sizes), residual
