"""Stragglers, as SD-PIPE makes them: --hetero X sleeps X seconds with probability --hetero-prob
before each forward slot and each backward slot of a minibatch, in every process (two draws per
minibatch and process, whatever the schedule); --slow-rank makes one process --slow-factor times slower.

SD-PIPE draws before each slot of its PipeDream schedule (pipedream_subexecutor.py 342-343), and twice
before each step of its synchronous executor (executor.py 941-943). Under gpipe and 1f1b a process
sleeps before the first forward and before the first backward of the minibatch's microbatches.
The draws are seeded by (--seed, rank, epoch, step), so any rank can tell whether another slept at a
step (for the waits the summary counts) and a run draws the same stragglers again. SD-PIPE draws
from Python's unseeded global generator; the rest (X, the probability, the slots) is its rule.
The functions read the flags from `delays` (Delays, or the run's flags themselves).
"""

import random
import time
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Delays:
    """The flags that make stragglers: --hetero, --hetero-prob, --seed, --slow-rank, --slow-factor."""
    hetero: float
    hetero_prob: float
    seed: Any
    slow_rank: Any
    slow_factor: float


def sleeps(delays, rank, epoch, step):
    """Whether rank sleeps before this minibatch's forward slot and before its backward slot."""
    if not delays.hetero:
        return [False, False]
    draw = random.Random(f"{delays.seed}/{rank}/{epoch}/{step}")
    return [draw.random() < delays.hetero_prob for _ in range(2)]


def before_slot(delays, rank, epoch, step, slot, device):
    """PipeDream: sleep before the minibatch's forward or backward slot, as the step's draws say (SD-PIPE's
    random_wait before each slot); returns the --slow-rank clock for slow_down() after it."""
    if delays.hetero and sleeps(delays, rank, epoch, step)[slot == "backward"]:
        time.sleep(delays.hetero)
    return slow_rank_clock(delays, rank, device)


def replica_straggles(delays, layout, replica, epoch, step):
    """Whether any process of the replica's pipeline sleeps at this step (its stages wait for one another)."""
    ranks = layout.pipeline_ranks(replica)
    return delays.slow_rank in ranks or any(any(sleeps(delays, rank, epoch, step)) for rank in ranks)


def inject(module, delays):
    """gpipe, 1f1b: hooks that sleep before the step's first forward and its first backward of a microbatch, as
    the step's draws say: returns {"forward": [...], "backward": [...]}, which plan() refills before each step."""
    slots = {"forward": [], "backward": []}

    def before_backward(grad):
        if slots["backward"] and slots["backward"].pop(0):
            time.sleep(delays.hetero)

    def before_forward(module, inputs):
        real = inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].device.type != "meta"
        if real and slots["forward"] and slots["forward"].pop(0):  # (shape inference runs on meta tensors)
            time.sleep(delays.hetero)

    def after_forward(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.requires_grad and output.device.type != "meta":
            output.register_hook(before_backward)

    if delays.hetero:
        module.register_forward_pre_hook(before_forward)
        module.register_forward_hook(after_forward)
    return slots


def plan(slots, delays, rank, epoch, step):
    """Before a step: its two draws into the hooks' slots (the microbatches after the first draw nothing)."""
    slots["forward"][:], slots["backward"][:] = ([draw] for draw in sleeps(delays, rank, epoch, step))


def slow_rank_clock(delays, rank, device):
    """--slow-rank: the time, once this rank's device has done its work (a GPU runs behind the host's queue, so
    the slow rank waits for it: what it sleeps is then F - 1 times its step's real time). Others: None."""
    if rank != delays.slow_rank:
        return None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def slow_down(delays, rank, device, started):
    """--slow-factor F: after the step, rank --slow-rank sleeps F - 1 times what the step took on its device."""
    if started is not None:
        time.sleep((delays.slow_factor - 1) * (slow_rank_clock(delays, rank, device) - started))
