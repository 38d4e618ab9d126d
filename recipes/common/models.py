"""Models by name: torchvision's classification models, one small CNN, one small vision transformer and one small
BERT (a masked language model)."""

import itertools
import os
import shutil

import torch
import torchvision
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from recipes.common import RecipeError, first_line


def lenet(num_classes):
    """A LeNet-5-style CNN: no batch norm, no dropout, any image size >= 8 px.

    Fast on CPU, and with no batch statistics a DDP step equals a single-process
    step on the combined batch exactly, which the tests rely on.
    """
    return nn.Sequential(
        nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveMaxPool2d(4),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, num_classes))


VIT_GRID = 7  # vit_tiny cuts every image into a grid of 7 x 7 patches: 49 tokens and the class token, at any size


def vit_tiny(num_classes, image_size):
    """A small vision transformer (torchvision's VisionTransformer): the image cut into a grid of 7 x 7 patches
    (4 px each at 28 px), each a token of width 64, a class token, and 8 pre-norm encoder blocks of 4 heads and
    an MLP of 256 (BERT's encoder on images, at a width a CPU trains on the digits in minutes: 0.4 M
    parameters). Its blocks are equal, which is what a pipeline's stages and FSDP's units are cut by."""
    return torchvision.models.VisionTransformer(image_size, patch_size=image_size // VIT_GRID, num_layers=8,
                                                num_heads=4, hidden_dim=64, mlp_dim=256, num_classes=num_classes)


BERT_POSITIONS = 128  # bert_tiny's longest sequence (SD-PIPE's BERT: max_position_embeddings 128)


class TokenEmbedding(nn.Module):
    """BERT's input end: each token's embedding and its position's, added, normalised (post-LN), dropout."""

    def __init__(self, vocabulary, width, dropout):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocabulary, width), nn.Embedding(BERT_POSITIONS, width)
        self.norm, self.dropout = nn.LayerNorm(width), nn.Dropout(dropout)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.dropout(self.norm(self.tokens(tokens) + self.positions(positions)))


class MaskedLMHead(nn.Module):
    """BERT's output end: a dense layer, GELU and a layer norm, then a decoder to the vocabulary, untied from the
    input embedding (as SD-PIPE's, hetu_bert 373-374). Scores are (sequences, vocabulary, positions), the layout
    CrossEntropyLoss takes."""

    def __init__(self, vocabulary, width):
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))
        self.decoder = nn.Linear(width, vocabulary)

    def forward(self, hidden):
        return self.decoder(self.transform(hidden)).transpose(1, 2)


def bert_tiny(vocabulary, layers=6, width=64, heads=4, dropout=0.1):
    """A small BERT for masked-language-model training, in plain torch.nn: token and position embeddings, 6
    post-LN encoder layers (nn.TransformerEncoderLayer, GELU, an MLP of 4 x the width: BERT's), and an untied
    vocabulary head. A sequence of layers, so a pipeline cuts it as SD-PIPE cuts BERT (stages.py)."""
    return nn.Sequential(TokenEmbedding(vocabulary, width, dropout),
                         *[nn.TransformerEncoderLayer(width, heads, 4 * width, dropout, activation="gelu",
                                                      batch_first=True) for _ in range(layers)],
                         MaskedLMHead(vocabulary, width))


OWN_MODELS = ("lenet", "vit_tiny", "bert_tiny")  # the models torchvision does not build


def vit_patch(arch):
    """The patch size of a vision transformer by name (vit_b_16: 16 px), None for vit_tiny (1/7 of the image)
    and for the models that are not ViTs."""
    return int(arch.rsplit("_", 1)[1]) if arch.startswith("vit_") and arch != "vit_tiny" else None


def check_arch(arch, image_size=224):
    """lenet, vit_tiny or a torchvision classification model, at an image size a ViT can cut into patches; else
    one clear error (runlog.RunLog checks it first)."""
    if arch not in OWN_MODELS and arch not in torchvision.models.list_models(module=torchvision.models):
        raise RecipeError(f"unknown --arch {arch!r}: use a torchvision classification model "
                          f"(resnet18, resnet50, mobilenet_v3_small, vit_b_16, ...), lenet, vit_tiny or bert_tiny")
    if arch == "vit_tiny" and image_size % VIT_GRID:
        raise RecipeError(f"-a vit_tiny cuts the image into a grid of {VIT_GRID} x {VIT_GRID} patches: --image-size "
                          f"{image_size} is not a multiple of {VIT_GRID} (use 28, 56, 112 or 224)")
    if vit_patch(arch) and image_size % vit_patch(arch):
        raise RecipeError(f"-a {arch} cuts the image into {vit_patch(arch)} px patches: --image-size {image_size} "
                          f"is not a multiple of {vit_patch(arch)}")


PRETRAINED = "torchvision"  # --pretrained: args.weights names torchvision's default weights of --arch


def build_model(arch, num_classes, image_size=224, weights=None):
    """The model --arch names, for num_classes classes; a vision transformer is built for --image-size (its
    position embeddings are one per patch). weights (--weights FILE, or PRETRAINED for --pretrained): its
    starting weights, the classifier's left as built where the class counts differ (fine-tuning)."""
    check_arch(arch, image_size)
    if arch == "lenet":
        model = lenet(num_classes)
    elif arch == "vit_tiny":
        model = vit_tiny(num_classes, image_size)
    elif arch == "bert_tiny":  # (its classes: the vocabulary)
        model = bert_tiny(num_classes)
    elif vit_patch(arch):  # torchvision's ViTs
        model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes, image_size=image_size)
    else:
        model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    if weights:
        load_weights(model, *starting_state(arch, weights))
    return model


def starting_state(arch, weights):
    """(the state dict, where it came from) of --weights FILE (a model's state dict, or a recipe's checkpoint)
    or --pretrained: torchvision's default weights for arch, from torch.hub's cache, downloaded where online."""
    if weights == PRETRAINED:
        if arch in OWN_MODELS:
            raise RecipeError(f"--pretrained: torchvision has no weights for -a {arch} (use --weights FILE)")
        entry = torchvision.models.get_model_weights(arch).DEFAULT
        try:
            return entry.get_state_dict(progress=False), f"--pretrained ({entry})"
        except OSError as error:  # (urllib's URLError is one: offline, or no such host)
            cache = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(entry.url))
            reason = getattr(error, "reason", error)
            raise RecipeError(f"--pretrained: {cache} is not there and {entry.url} could not be downloaded "
                              f"({reason}); put the file there, or pass --weights FILE") from None
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise RecipeError(f"--weights {weights}: no such file") from None
    except Exception as error:  # (a pickle torch refuses, a file that is no torch file)
        raise RecipeError(f"--weights {weights}: not a state dict torch.load reads ({first_line(error)})") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):  # a recipe's checkpoint.pt or best.pt
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise RecipeError(f"--weights {weights}: not a model's state dict (names to tensors)")
    return state, f"--weights {weights}"


def load_weights(model, state, source):
    """state into model, but for the classifier (the last Linear layer) where its shape differs: a model for
    another number of classes keeps its own, newly initialised. Anything else that does not fit is one error."""
    own = model.state_dict()
    last = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)][-1:]
    head = {f"{name}.{part}" for name in last for part in ("weight", "bias")}
    differ = {key for key in own.keys() & state.keys() if own[key].shape != state[key].shape}
    wrong = sorted((differ - head) | (own.keys() - state.keys() - head) | (state.keys() - own.keys()))
    if wrong:
        raise RecipeError(f"{source} does not fit this model: {len(wrong)} weight(s) missing, extra or of "
                          f"another shape, {', '.join(wrong[:3])}{', ...' if len(wrong) > 3 else ''}")
    model.load_state_dict({key: value for key, value in state.items() if key not in differ}, strict=False)


class PatchEmbedding(nn.Module):
    """A torchvision ViT's input end as one layer (its own modules and parameters, shared): the image's patches
    projected to tokens, the class token put first, the position embeddings added. What its forward runs
    before the encoder's blocks."""

    def __init__(self, vit):
        super().__init__()
        self.conv_proj, self.class_token = vit.conv_proj, vit.class_token
        self.pos_embedding, self.dropout = vit.encoder.pos_embedding, vit.encoder.dropout

    def forward(self, images):
        tokens = self.conv_proj(images).flatten(2).transpose(1, 2)  # (batch, patches, width)
        tokens = torch.cat([self.class_token.expand(len(tokens), -1, -1), tokens], dim=1)
        return self.dropout(tokens + self.pos_embedding)


class ClassTokenHead(nn.Module):
    """A torchvision ViT's output end as one layer: the final layer norm, and the classifier on the class
    token."""

    def __init__(self, vit):
        super().__init__()
        self.ln, self.heads = vit.encoder.ln, vit.heads

    def forward(self, tokens):
        return self.heads(self.ln(tokens)[:, 0])


def sequential_layers(model, arch):
    """The model as the list of layers its forward runs one after the other (the points where a pipeline can
    cut it): lenet's layers; a ResNet's stem, each residual block, pooling and the classifier; a vision
    transformer's patch embedding, each encoder block and its class-token head; the features, pooling and
    classifier of models built that way (VGG, MobileNet, EfficientNet, ...). The layers are the model's own
    modules (or hold them), so stages built from them train the model's weights."""
    if isinstance(model, nn.Sequential):
        return list(model)
    if isinstance(model, torchvision.models.VisionTransformer):
        return [PatchEmbedding(model), *model.encoder.layers, ClassTokenHead(model)]
    if isinstance(model, torchvision.models.ResNet):
        blocks = [*model.layer1, *model.layer2, *model.layer3, *model.layer4]
        return [model.conv1, model.bn1, model.relu, model.maxpool, *blocks, model.avgpool, nn.Flatten(), model.fc]
    if all(hasattr(model, name) for name in ("features", "avgpool", "classifier")):
        flatten = [] if any(isinstance(m, nn.Flatten) for m in model.classifier) else [nn.Flatten()]  # (convnext)
        return [*model.features, model.avgpool, *flatten, *model.classifier]
    raise RecipeError(f"--arch {arch} does not run as a sequence of layers (which a pipeline cuts into stages and "
                      f"FSDP shards block by block): use lenet, vit_tiny, a torchvision ViT, "
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
