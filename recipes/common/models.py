"""Models by name: torchvision's classification models, and one small CNN."""

import torchvision
from torch import nn

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


def build_model(arch, num_classes):
    if arch == "lenet":
        return lenet(num_classes)
    if arch not in torchvision.models.list_models(module=torchvision.models):
        raise RecipeError(f"unknown --arch {arch!r}: use a torchvision classification model "
                          f"(resnet18, resnet50, mobilenet_v3_small, ...) or lenet")
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
