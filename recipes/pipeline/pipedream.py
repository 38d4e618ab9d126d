"""Asynchronous PipeDream (Narayanan et al., SOSP 2019) as SD-PIPE runs it (`--pipeline pipedream`; the authors'
code, Hsword/VLDB2023_SDPipe: python/hetu/gpu_ops/pipedream_subexecutor.py): what --schedule pipedream needs
beside the loop in train.py.

Order: stage s of S runs S - s forwards, then alternates a backward and a forward (1F1B), and at the epoch's end
the backwards left: S - s minibatches are in flight at stage s, and the pipeline is filled once and drained once
per epoch (pipedream_scheduler, and the drain at batch_num). Each minibatch is one update at every stage.

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

Deviations: SD-PIPE allocates one buffer per in-flight minibatch and copies the newest weights into the oldest
(the same count of versions, by reuse); its GroupStart/GroupEnd calls pair the forward's send with the next
backward's receive (Megatron-LM pairs them so too), where here a gradient's receive is a group of its own, which
keeps a stop after any backward free of a receive that no stage will match.
"""

import torch
import torch.distributed as dist
from torch.func import functional_call

from recipes.common import faults


def operations(stage, stages, minibatches, first=0):
    """Stage `stage`'s operations over minibatches first, ..., minibatches - 1, in order: ("forward", i) and
    ("backward", i)."""
    count = minibatches - first
    warmup = min(stages - stage, count)
    order = [("forward", first + i) for i in range(warmup)]
    for i in range(count):
        order.append(("backward", first + i))
        if warmup + i < count:
            order.append(("forward", first + warmup + i))
    return order


def sample_shapes(parts, image_size):
    """Each stage's input shape for one image (stage 0's: the image), from one image through the stages on the
    CPU, before the model moves to its device (evaluation mode: the running statistics stay as they are)."""
    shapes, x = [], torch.zeros(1, 3, image_size, image_size)
    with torch.no_grad():
        for part in parts:
            shapes.append(tuple(x.shape[1:]))
            for layer in part:
                x = layer.eval()(x)
                layer.train()
    return shapes


class Link:
    """This stage's messages to and from its neighbours in the replica's pipeline (ranks, or None at the ends):
    an operation's sends wait in `pending` for the next exchange."""

    def __init__(self, previous, following, group, device):
        self.previous, self.following, self.group, self.device = previous, following, group, device
        self.pending = []

    def send_forward(self, activation):
        self.pending.append((activation, self.following))

    def send_backward(self, gradient, loss):
        self.pending += [(gradient, self.previous), (loss, self.previous)]

    def exchange(self, receive=()):
        """Post the pending sends and `receive` ([(tensor, from rank)]) as one group, and wait for them."""
        ops = [dist.P2POp(dist.isend, tensor, peer, self.group) for tensor, peer in self.pending]
        ops += [dist.P2POp(dist.irecv, tensor, peer, self.group) for tensor, peer in receive]
        self.pending = []
        if ops:
            with faults.waiting_for("the next or the previous stage (PipeDream's activations and gradients)"):
                for request in dist.batch_isend_irecv(ops):
                    request.wait()

    def receive_gradient(self, shape):
        """A backward's gradient of the stage's output, and the minibatch's loss, from the stage after (a group
        of their own: see above)."""
        gradient, loss = torch.empty(shape, device=self.device), torch.empty((), device=self.device)
        self.exchange([(gradient, self.following), (loss, self.following)])
        return gradient, loss


def fields(module, stage, layout, replica, group, device, sample_shape, criterion, tally):
    """What the PipeDream loop keeps in its `pipe`, beside what every schedule does."""
    last = layout.stages - 1
    return dict(module=module, named=dict(module.named_parameters()), stage=stage, criterion=criterion, tally=tally,
                link=Link(layout.rank(replica, stage - 1) if stage else None,
                          layout.rank(replica, stage + 1) if stage < last else None, group, device),
                input_shape=sample_shape, in_flight={}, stash=None, stash_version=-1)


def next_input(pipe, operation, batches, run):
    """After an operation, its sends; with them, when the next operation is a forward, its input: the batch's
    images (stage 0) or the activation the stage before sent, and the targets. Returns (input, targets), or
    (None, None) before a backward or at the end."""
    if operation is None or operation[0] == "backward":
        pipe.link.exchange()
        return None, None
    images, target = run.to_device(*next(batches))  # (every stage loads the batch: stage 0 needs the images,
    if pipe.stage == 0:                              # the last one the targets, and each one its size)
        pipe.link.exchange()
        return images, target
    activation = torch.empty((len(target), *pipe.input_shape), device=images.device)
    pipe.link.exchange([(activation, pipe.link.previous)])
    return activation.requires_grad_(), target


def forward(pipe, x):
    """The stage's forward of a minibatch on the weights that its backward will use (stashed_weights)."""
    weights = stashed_weights(pipe)
    return functional_call(pipe.module, weights, (x,)), weights


def stashed_weights(pipe):
    """The weights the next forward runs on: the newest, copied once per update (see above); the last stage's
    own. Counts in pipe.tally["versions"] the most versions that in-flight minibatches hold at once."""
    if pipe.is_last:
        pipe.tally["versions"] = 1
        return pipe.named
    if pipe.stash is None or pipe.stash_version != pipe.tally["updates"]:
        pipe.stash = {name: p.detach().clone().requires_grad_() for name, p in pipe.named.items()}
        pipe.stash_version = pipe.tally["updates"]
    held = {id(weights) for _, _, weights in pipe.in_flight.values()} | {id(pipe.stash)}
    pipe.tally["versions"] = max(pipe.tally["versions"], len(held))
    return pipe.stash
