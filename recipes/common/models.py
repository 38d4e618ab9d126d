"""Models by name: torchvision's classification models, and one small CNN."""

import itertools
import os
import shutil

import torch
import torchvision
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from recipes.common import RecipeError


def lenet(num_classes):
    """A LeNet-5-style CNN: no batch norm, no dropout, any image size >= 8 px.

    Fast on CPU, and with no batch statistics a DDP step equals a single-process
    step on the combined batch exactly, which the tests rely on.
    """
    return nn.Sequential(
        nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveMaxPool2d(4),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, num_classes))


def check_arch(arch):
    """lenet or a torchvision classification model, else one clear error (runlog.RunLog checks it first)."""
    if arch != "lenet" and arch not in torchvision.models.list_models(module=torchvision.models):
        raise RecipeError(f"unknown --arch {arch!r}: use a torchvision classification model "
                          f"(resnet18, resnet50, mobilenet_v3_small, ...) or lenet")


def build_model(arch, num_classes):
    check_arch(arch)
    if arch == "lenet":
        return lenet(num_classes)
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)


def sequential_layers(model, arch):
    """The model as the list of layers its forward runs one after the other (the points where a pipeline can
    cut it): lenet's layers; a ResNet's stem, each residual block, pooling and the classifier; the features,
    pooling and classifier of models built that way (VGG, MobileNet, EfficientNet, ...). The layers are the
    model's own modules, so stages built from them train the model's weights."""
    if isinstance(model, nn.Sequential):
        return list(model)
    if isinstance(model, torchvision.models.ResNet):
        blocks = [*model.layer1, *model.layer2, *model.layer3, *model.layer4]
        return [model.conv1, model.bn1, model.relu, model.maxpool, *blocks, model.avgpool, nn.Flatten(), model.fc]
    if all(hasattr(model, name) for name in ("features", "avgpool", "classifier")):
        flatten = [] if any(isinstance(m, nn.Flatten) for m in model.classifier) else [nn.Flatten()]  # (convnext)
        return [*model.features, model.avgpool, *flatten, *model.classifier]
    raise RecipeError(f"--arch {arch} does not run as a sequence of layers (which a pipeline cuts into stages and "
                      f"FSDP shards block by block): use lenet, "
                      f"a ResNet, or a model made of features, avgpool and classifier (vgg11, mobilenet_v3_small, "
                      f"efficientnet_b0, ...)")


def build_ema(model, decay):
    """--ema-decay: a copy of the model whose weights and batch-norm statistics follow
    ema = decay x ema + (1 - decay) x model after every update_parameters(model)
    (the first update copies). None without --ema-decay."""
    if decay is None:
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


@torch.no_grad()
def update_ema(ema, model):
    """ema.update_parameters(model), the same EMA of the weights and buffers, without its per-step copy of the
    update counter (n_averaged, which AveragedModel keeps on the CPU) to the GPU: a host synchronisation."""
    pairs = zip(itertools.chain(ema.module.parameters(), ema.module.buffers()),
                itertools.chain(model.parameters(), model.buffers()))
    if ema.n_averaged == 0:  # the first update copies
        for averaged, current in pairs:
            averaged.copy_(current)
    else:
        by_dtype = {}  # (the EMA function takes tensors of one dtype at a time)
        for averaged, current in pairs:
            group = by_dtype.setdefault(averaged.dtype, ([], []))
            group[0].append(averaged)
            group[1].append(current)
        for averaged, current in by_dtype.values():
            ema.multi_avg_fn(averaged, current, ema.n_averaged)
    ema.n_averaged += 1


def compile_model(module, device, args):
    """--compile: torch.compile (TorchInductor) of the training model (-e trains nothing: none). The first
    steps trace and compile; later ones run the generated kernels. On CPU Inductor writes C++, so it needs
    a C++ compiler."""
    if not args.compile or args.evaluate:
        return module
    if device.type == "cpu" and not any(shutil.which(name) for name in (os.environ.get("CXX"), "g++", "clang++")
                                        if name):
        raise RecipeError("--compile on CPU needs a C++ compiler for TorchInductor (g++ or clang++, or $CXX); "
                          "none is on PATH")
    return torch.compile(module)
