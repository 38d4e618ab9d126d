"""The model cut into stages of about equal forward FLOPs, and put together again for evaluation and checkpoints."""

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from recipes.common import models


def balanced_split(costs, stages):
    """Cut a sequence of layer costs into `stages` consecutive non-empty parts whose largest total is as
    small as it can be. Returns the parts' first indices (and len(costs) at the end)."""
    n = len(costs)
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    # best[s][i]: (largest part, cuts) for the first i layers in s parts
    best = [[(float("inf"), [])] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, [0])
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                largest = max(best[s - 1][j][0], prefix[i] - prefix[j])
                if largest < best[s][i][0]:
                    best[s][i] = (largest, best[s - 1][j][1] + [i])
    return best[stages][n][1]


def weighted_units(layers):
    """The layers grouped so that each group starts with a layer that has weights (one without them, such as
    a ReLU, goes with the layer before it): a stage starts only at such a group."""
    units = []
    for layer in layers:
        if units and not (any(True for _ in layer.parameters()) and any(True for _ in units[-1].parameters())):
            units[-1].append(layer)
        else:
            units.append(nn.Sequential(layer))
    return units


def cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    """FLOPs of the CPU's fused attention kernel, which torch's counter leaves out (it counts the CUDA ones), from
    the shapes of its inputs (FlopCounterMode passes shapes): Q K^T and the weighted sum of V, two FLOPs per
    multiply-add."""
    batch, heads, queries, width = query_shape
    return 2 * batch * heads * queries * key_shape[2] * (width + value_shape[3])


def unit_flops(units, example):
    """Forward FLOPs of each unit for one input (torch.utils.flop_counter), in the order they run, and the shape of
    each unit's input and of the last one's output (evaluation mode: the running statistics stay as they are; with
    autograd on, so that attention runs its counted kernels, not the inference fast path)."""
    flops, shapes, x = [], [], example
    for unit in units:
        shapes.append(tuple(x.shape[1:]))
        counter = FlopCounterMode(display=False, custom_mapping={
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention_flops})
        with counter:
            x = unit.eval()(x).detach()
        unit.train()
        flops.append(counter.get_total_flops())
    return flops, shapes + [tuple(x.shape[1:])]


def bert_cuts(units, stages):
    """SD-PIPE's cut of BERT, [2, 4, 4, 2] of its 12 layers over 4 stages (train_bert 50): the end stages, which
    also hold the embeddings and the vocabulary head (units[0] and units[-1]), take half as many encoder layers
    as a middle one; with 2 stages, half each. Returns the stages' first units (and len(units) at the end)."""
    layers = len(units) - 2
    shares = [1 if s in (0, stages - 1) and stages > 2 else 2 for s in range(stages)]
    counts = [layers * share // sum(shares) for share in shares]
    for s in sorted(range(stages), key=lambda s: -(layers * shares[s] % sum(shares)))[:layers - sum(counts)]:
        counts[s] += 1  # (the largest remainders)
    cuts = [0]
    for s, count in enumerate(counts):
        cuts.append(cuts[-1] + count + (s == 0))
    return cuts[:-1] + [len(units)]


def split_model(model, args, log, example=None):
    """The model's layers cut into --stages parts of about equal forward FLOPs (bert_tiny: as SD-PIPE cuts BERT,
    bert_cuts), measured on `example` (default: an image of --image-size): [[layer, ...] per stage]; each
    stage's input shape for one image (PipeDream's receives); and what each stage costs per image, for the run's
    summary: its forward MFLOPs and the bytes of the activation it sends to the next stage (fp32; its gradient
    comes back at the same size; the last stage sends none: the loss is computed there)."""
    units = weighted_units(models.sequential_layers(model, args.arch))
    example = torch.zeros(1, 3, args.image_size, args.image_size) if example is None else example
    flops, shapes = unit_flops(units, example)
    cuts = bert_cuts(units, args.stages) if args.arch == "bert_tiny" else balanced_split(flops, args.stages)
    parts = [[layer for unit in units[a:b] for layer in unit] for a, b in zip(cuts[:-1], cuts[1:])]
    costs = {"stage_mflops": [round(sum(flops[a:b]) / 1e6, 3) for a, b in zip(cuts[:-1], cuts[1:])],
             "stage_activation_bytes": [4 * math.prod(shapes[b]) for b in cuts[1:-1]] + [0]}
    for s, part in enumerate(parts):
        names = ", ".join(type(layer).__name__ for layer in part)
        params = sum(p.numel() for layer in part for p in layer.parameters())
        sends = f"sends {costs['stage_activation_bytes'][s]:,} bytes per image on" if s < args.stages - 1 else \
            "computes the loss"
        log.print(f"stage {s}: {names}; {params:,} parameters, {costs['stage_mflops'][s]:.2f} MFLOPs per image, "
                  f"{sends}")
    return parts, [shapes[a] for a in cuts[:-1]], costs


class Contiguous(nn.Module):
    """A stage's last layer: its output laid out densely. torch.distributed.pipelining receives into buffers with
    the sender's strides, and gloo and NCCL take only contiguous ones (a transformer block's output is not: its
    attention transposes)."""

    def forward(self, x):
        return x.contiguous()


def state_names(model, part):
    """The model's state_dict keys of the tensors the layers in part hold (the model's own: a ViT's patch
    embedding holds its projection, class token and position embeddings)."""
    keys = {id(tensor): key for key, tensor in model.state_dict(keep_vars=True).items()}
    return [keys[id(tensor)] for layer in part for tensor in layer.state_dict(keep_vars=True).values()]


def gather(model, optimizer, whole, view, stage_keys, ranks, group):
    """Before each evaluation and save: the whole model and its optimizer's state (SGD's momentum, AdamW's
    moments), stage s from ranks[s], into `whole` and the checkpoint's optimizer `view`, on every rank of the gloo
    group (which holds ranks)."""
    whole_params = dict(whole.named_parameters())
    for s, keys in enumerate(stage_keys):
        payload = [None]
        if dist.get_rank() == ranks[s]:
            state, named = model.state_dict(), dict(model.named_parameters())
            optimizer_state = {key: {name: value.cpu() for name, value in optimizer.state[named[key]].items()}
                               for key in keys if key in named and optimizer.state.get(named[key])}
            payload = [({key: state[key].cpu() for key in keys}, optimizer_state)]
        dist.broadcast_object_list(payload, src=ranks[s], group=group)
        weights, optimizer_state = payload[0]
        whole.load_state_dict(weights, strict=False)
        for key, values in optimizer_state.items():
            p = whole_params[key]
            view.state[p] = {name: value if name == "step" else value.to(p.device) for name, value in values.items()}
    view.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"]


def resume_stage(model, whole, view, optimizer, params):
    """After run.resume(): this stage's weights and optimizer state from the checkpoint's whole model."""
    model.load_state_dict(whole.state_dict())
    for p, q in zip(model.parameters(), whole.parameters()):
        if view.state.get(q) and any(p is mine for mine in params):
            optimizer.state[p] = {name: value.clone() for name, value in view.state[q].items()}
