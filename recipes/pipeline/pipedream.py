"""Asynchronous PipeDream (Narayanan et al., SOSP 2019) as SD-PIPE runs it (`--pipeline pipedream`; the authors'
code, Hsword/VLDB2023_SDPipe: python/hetu/gpu_ops/pipedream_subexecutor.py): what --schedule pipedream needs
beside the loop in train.py.

Order: stage s of S runs S - s forwards, then alternates a backward and a forward (1F1B), and at the epoch's end
the backwards left: S - s minibatches are in flight at stage s, and the pipeline is filled once and drained once
per epoch (pipedream_scheduler, pipedream_subexecutor.py 36-59, and the drain at batch_num, 344-360). Each
minibatch is one update at every stage.

Weight stashing: a minibatch's backward uses the weights its forward used, and its gradient updates the
stage's newest weights (copy_latest_weight). Here a forward runs on a copy of the newest weights, made only when
an update came since the last copy (forwards with none between share it, by reference), so that a stage holds
at most S - s versions besides its weights; the last stage, whose backward follows its forward at once, runs on
its weights themselves (SD-PIPE: "the last worker has only one copy of weight").

Messages: activations forward and gradients backward, point to point within a replica's pipeline, as grouped
sends and receives (batch_isend_irecv); the loss travels back with each gradient, so that every stage has it
for the progress line and the checks. After each operation its sends go out in one group with the receive of
the next operation when that is a forward (the activation the stage before sent along with its backward); a
gradient is received alone, before its backward. So every group posted is matched by groups its peers post
before they wait, and a stop agreed after any backward leaves no message unmatched: every stage has then sent
what its neighbours' backwards wait for, and received each activation sent to it.

Epochs counted in updates (--sync preduce): stage 0 takes each minibatch from the epoch's updates before its
forward; once none is left, the replica's epoch ends there, and each stage tells the next with a flag (a CPU
number over the replica's gloo group, beside each activation), then drains: the minibatches in flight were
claimed, so an epoch is exactly its count of updates. SD-PIPE's scheduler decides at the last stage, after the
count of updates crosses the epoch, and every stage of that replica stops after the same minibatch
(preduce_handler.cc, setStopCondition); the S - 1 minibatches its drain then finishes are counted nowhere and
averaged with no one (deviations.py).

A stop agreed after a backward (SIGTERM) saves each stage after the same update; the minibatches in flight
beyond it are trained again after the resume (their forwards had moved BatchNorm's running statistics once
already), and the resumed epoch fills the pipeline anew, so it does not repeat the uninterrupted run exactly.

Where this departs from the authors' code (the weight versions, the grouping of the messages), with their
files and lines: deviations.py.
"""

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.func import functional_call

from recipes.common import faults


@dataclass
class EpochEnd:
    """Where this stage's epoch ends: the minibatches before `step` are trained. operations() reads it as it
    goes, and preduce moves it to where the epoch's updates ran out."""
    step: int


def operations(stage, stages, end, first=0):
    """Stage `stage`'s operations, in order, ("forward", i) and ("backward", i) for minibatches first, first + 1,
    ..., end.step - 1 (an EpochEnd, read as they go)."""
    forward = backward = first
    while forward < min(first + stages - stage, end.step):
        yield "forward", forward
        forward += 1
    while backward < end.step:
        yield "backward", backward
        backward += 1
        if forward < end.step:
            yield "forward", forward
            forward += 1


class Link:
    """This stage's messages to and from its neighbours in the replica's pipeline (ranks, or None at the ends):
    an operation's sends wait in `pending` for the next exchange."""

    def __init__(self, previous, following, group, device, control=None):
        """control: with epochs of a number of updates (preduce), the replica's gloo group, over which each
        forward's activation goes with a flag (a CPU number: 1, or 0 when the epoch has ended before it)."""
        self.previous, self.following, self.group, self.device = previous, following, group, device
        self.control, self.pending, self.flags = control, [], []

    def send_forward(self, activation):
        self.pending.append((activation, self.following))
        self.send_flag(1)

    def send_flag(self, go):
        if self.control is not None and self.following is not None:
            self.flags.append(dist.isend(torch.tensor([go]), self.following, group=self.control))

    def receive_flag(self):
        """Whether the stage before sends this forward an activation (always, without flags)."""
        if self.control is None:
            return True
        flag = torch.zeros(1, dtype=torch.int64)
        with faults.waiting_for("the stage before (PipeDream's activations)"):
            dist.recv(flag, self.previous, group=self.control)
        return bool(flag[0])

    def send_backward(self, gradient, loss):
        self.pending += [(gradient, self.previous), (loss, self.previous)]

    def exchange(self, receive=()):
        """Post the pending sends and `receive` ([(tensor, from rank)]) as one group, and wait for them."""
        ops = [dist.P2POp(dist.isend, tensor, peer, self.group) for tensor, peer in self.pending]
        ops += [dist.P2POp(dist.irecv, tensor, peer, self.group) for tensor, peer in receive]
        self.pending, flags, self.flags = [], self.flags, []
        with faults.waiting_for("the next or the previous stage (PipeDream's activations and gradients)"):
            for request in (dist.batch_isend_irecv(ops) if ops else []) + flags:
                request.wait()

    def receive_gradient(self, shape):
        """A backward's gradient of the stage's output, and the minibatch's loss, from the stage after (a group
        of their own: see above)."""
        gradient, loss = torch.empty(shape, device=self.device), torch.empty((), device=self.device)
        self.exchange([(gradient, self.following), (loss, self.following)])
        return gradient, loss


@dataclass
class State:
    """What PipeDream keeps at a stage between its operations: its messages (link), the weights by name, what it
    receives (input_shape, batch_size), the minibatches in flight {i: (input, output, weights)}, the copy of the
    weights the next forward runs on (stash, made after update stash_version), and where the epoch ends."""
    link: Link
    named: dict
    input_shape: tuple
    batch_size: int
    criterion: Any
    tally: Any
    in_flight: dict = field(default_factory=dict)
    stash: Any = None
    stash_version: int = -1
    end: EpochEnd = field(default_factory=lambda: EpochEnd(0))


def state(stage, replicas, device, sample_shape, criterion, tally, batch_size):
    """A stage's State: its neighbours in the replica's pipeline (ranks, or None at the ends), and with preduce
    the replica's gloo group for the epoch's-end flags."""
    layout, replica = replicas.layout, replicas.replica
    link = Link(layout.rank(replica, stage.index - 1) if not stage.is_first else None,
                layout.rank(replica, stage.index + 1) if not stage.is_last else None, stage.pipe_group, device,
                replicas.sync.replica_group)
    return State(link, dict(stage.module.named_parameters()), sample_shape, batch_size, criterion, tally)


def next_input(stage, dream, sync, order, batches, run):
    """After an operation, its sends, and the next operation from `order`; when that is a forward, with its
    input: the batch's images (stage 0) or the activation the stage before sent, and the targets. Returns
    (input, targets, operation); (None, None, operation) before a backward or at the end (None). With preduce
    (sync.counts_updates), stage 0 first takes the minibatch from the epoch's updates; once none is left, the epoch
    ends there for this replica (dream.end), and each stage tells the next in place of that activation."""
    link, claims = dream.link, sync.counts_updates
    operation = next(order, None)
    if operation is None or operation[0] == "backward":
        link.exchange()
        if operation is None and claims and run.first_step < run.steps_per_epoch:
            sync.leave(run.epoch)  # (drained: the leaders of the stage's groups wait for one fewer)
        return None, None, operation
    go = sync.take(run.epoch, run.steps_per_epoch) if stage.is_first and claims else link.receive_flag()
    if not go:
        dream.end.step = operation[1]
        link.send_flag(0)
        return next_input(stage, dream, sync, order, batches, run)  # (the drain's first backward, or the end)
    if stage.is_first:
        link.exchange()  # (the sends first: the stage after waits for them, not for this batch's loading)
        images, target = run.to_device(*next(batches))
        return images, target, operation
    activation = torch.empty((dream.batch_size, *dream.input_shape), device=link.device)  # (the loader drops
    link.exchange([(activation, link.previous)])  # a last, smaller batch)
    target = next(batches)[1]  # (every stage loads the batch: the last one needs its targets)
    return activation.requires_grad_(), target.to(link.device, non_blocking=True), operation


def forward(stage, dream, x):
    """The stage's forward of a minibatch on the weights that its backward will use (stashed_weights)."""
    weights = stashed_weights(stage, dream)
    return functional_call(stage.module, weights, (x,)), weights


def stashed_weights(stage, dream):
    """The weights the next forward runs on: the newest, copied once per update (see above); the last stage's
    own. Counts in tally.versions the most versions that in-flight minibatches hold at once."""
    tally = dream.tally
    if stage.is_last:
        tally.versions = 1
        return dream.named
    if dream.stash is None or dream.stash_version != tally.updates:
        dream.stash = {name: p.detach().clone().requires_grad_() for name, p in dream.named.items()}
        dream.stash_version = tally.updates
    held = {id(weights) for _, _, weights in dream.in_flight.values()} | {id(dream.stash)}
    tally.versions = max(tally.versions, len(held))
    return dream.stash
