"""Mixed precision for the recipes that take --opt-level (apex, fsdp): apex's opt levels mapped onto torch.amp.

| --opt-level | apex.amp meant                          | here, with torch.amp                          |
|-------------|-----------------------------------------|-----------------------------------------------|
| O0          | fp32                                    | fp32, autocast off                            |
| O1          | cast per op to fp16, dynamic loss scale | autocast(dtype) + GradScaler when fp16        |
| O2          | fp16 weights + fp32 master copy         | as O1: autocast keeps the fp32 weights as the |
|             | + fp32 BatchNorm, dynamic loss scale    | master copy and casts per op                  |
| O3          | pure fp16, no loss scaling (a speed     | model.to(dtype), autocast, no GradScaler      |
|             | baseline, may not converge)             |                                               |

initialize() is the counterpart of apex.amp.initialize: it returns the model,
the optimizer, a loss scaler and the autocast context for the training loop.
GradScaler skips a step whose gradients overflowed without asking the host when the
optimizer is fused (the recipes' SGD on CUDA takes the scale and the overflow flag
on the device); an unfused one (ZeroRedundancyOptimizer, SGD over fully_shard's
DTensors) makes it read the flag on the host, once per fp16 step.
fsdp_policy() maps the same flags onto FSDP2's MixedPrecisionPolicy: O1 and O2 gather
the weights in fp16/bf16 for forward and backward and reduce the gradients in fp32;
O3 reduces them in fp16/bf16 too; the sharded fp32 weights are the master copy.
"""

import dataclasses
import functools
import types
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from recipes.common import RecipeError

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def cpu_has_native_bf16():
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve(args, device, log):
    """Return (opt_level, dtype), filling in defaults that suit the device."""
    dtype_name = args.amp_dtype or ("fp16" if device.type == "cuda" else "bf16")
    if device.type == "cuda" and dtype_name == "bf16" and not torch.cuda.is_bf16_supported():
        raise RecipeError(f"--amp-dtype bf16 is not supported by {torch.cuda.get_device_name(device)}; use fp16")
    slow_cpu = device.type == "cpu" and not cpu_has_native_bf16()
    opt_level = args.opt_level
    if opt_level is None:
        opt_level = "O0" if slow_cpu else "O1"
        if slow_cpu:
            log.print("note: this CPU has no native bf16 (AVX512-BF16 or AMX), where low-precision autocast "
                      "runs slower than fp32: defaulting to --opt-level O0 (fp32)")
    elif opt_level != "O0" and slow_cpu:
        log.print(f"warning: --opt-level {opt_level} ({dtype_name}) on a CPU without native bf16 (AVX512-BF16 "
                  f"or AMX): autocast runs much slower than fp32 here (9x to 16x measured for resnet18 on AVX2)")
    args.opt_level, args.amp_dtype = opt_level, dtype_name  # what the run uses: its checkpoints record them
    return opt_level, DTYPES[dtype_name]


def initialize(model, optimizer, args, device, log):
    """(model, optimizer, scaler, autocast) for --opt-level, --amp-dtype, --amp-backend and --channels-last.

    The loop runs the forward pass and loss under autocast() and steps through the
    scaler: scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update().
    Call it after building the optimizer, before wrapping the model in DDP.
    """
    opt_level, dtype = resolve(args, device, log)
    if args.channels_last:  # NHWC weights (the input batches too: data.device_transform); convolutions run NHWC
        model = model.to(memory_format=torch.channels_last)
        say_channels_last(model, log)
    if args.amp_backend == "apex":  # the original: apex.amp patches the model and the optimizer
        apex_amp = import_apex_amp()
        model, optimizer = apex_amp.initialize(model, optimizer, opt_level=opt_level)
        scaler, use_autocast = ApexLossScaler(apex_amp, optimizer), False
    else:
        if opt_level == "O3":  # pure low precision: no fp32 weights at all (the optimizer keeps the same tensors)
            model = model.to(dtype)
        scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16 and opt_level in ("O1", "O2"))
        if scaler.is_enabled():
            zero_momentum(optimizer)
        use_autocast = opt_level != "O0"
    log.print(f"mixed precision: opt level {opt_level} ({'fp32' if opt_level == 'O0' else DTYPE_NAMES[dtype]}, "
              f"{args.amp_backend}): autocast {'on' if use_autocast else 'off'}, loss scaling "
              f"{'on' if args.amp_backend == 'apex' or scaler.is_enabled() else 'off'}")
    return model, optimizer, scaler, functools.partial(torch.autocast, device.type, dtype=dtype, enabled=use_autocast)


def say_channels_last(model, log):
    """--channels-last changes only convolutions: say so where a model has one alone (a vision transformer's
    patch projection; its blocks' activations are tokens, 3-D, which have no NHWC)."""
    convolutions = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    if not convolutions:
        log.print("note: --channels-last: this model has no convolution; it runs as without the flag")
    elif len(convolutions) == 1:
        log.print("note: --channels-last: this model has 1 convolution (a ViT's: its patch projection); the rest "
                  "of it runs as without the flag")


def zero_momentum(optimizer):
    """Give fused SGD its momentum buffers as zeros before the first step, where GradScaler may skip it.

    torch's fused SGD allocates them with empty_like at its first step and leaves them so when the scaler
    skips that step (an fp16 overflow, routine at the start): the next step then adds uninitialised memory
    (on an H100, ResNet-50's loss was NaN at step 4). From zeros, the first step's momentum 0.9 x 0 + g is
    stock SGD's g (dampening 0, as the recipes'). A skipped step leaves them untouched.
    """
    if not isinstance(optimizer, torch.optim.SGD):  # (ZeroRedundancyOptimizer: the scaler skips on the host)
        return
    for group in optimizer.param_groups:
        if group["fused"] and group["momentum"]:
            for param in group["params"]:
                optimizer.state[param].setdefault("momentum_buffer", torch.zeros_like(param))


def fsdp_policy(model, args, device, log):
    """(model, MixedPrecisionPolicy, GradScaler) for --opt-level and --amp-dtype under fully_shard, which casts
    each block's weights as it gathers them: no autocast in the training loop."""
    opt_level, dtype = resolve(args, device, log)
    # --channels-last: fully_shard takes only contiguous weights, so they stay NCHW; the input batches are NHWC
    # (data.device_transform), and a convolution given either in NHWC runs and answers in NHWC
    if args.channels_last:
        say_channels_last(model, log)
    policy = MixedPrecisionPolicy()  # O0: fp32 throughout
    if opt_level != "O0":
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype if opt_level == "O3" else torch.float32)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16 and opt_level in ("O1", "O2"))
    log.print(f"mixed precision: opt level {opt_level}, MixedPrecisionPolicy: weights gathered in "
              f"{DTYPE_NAMES.get(policy.param_dtype, 'fp32')}, gradients reduced in "
              f"{DTYPE_NAMES.get(policy.reduce_dtype, 'fp32')}, loss scaling {'on' if scaler.is_enabled() else 'off'}")
    return model, policy, scaler


def root_policy(policy):
    """The root module's policy: as policy, but its output (the logits) in fp32, so that the loss is too: in fp16 a
    loss of 7 scaled by GradScaler's 65,536 overflows, and every step would be skipped."""
    return dataclasses.replace(policy, output_dtype=torch.float32) if policy.param_dtype is not None else policy


def batchnorm_policy(policy):
    """BatchNorm under a low-precision policy: its running statistics are fp32 buffers, which a low-precision
    input or weight cannot update, so it is sharded on its own and runs in fp32, returning policy's dtype."""
    return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=policy.reduce_dtype,
                                output_dtype=policy.param_dtype, cast_forward_inputs=True)


def import_apex_amp():
    try:
        from apex import amp

        amp.initialize, amp.scale_loss  # (the 'apex' on PyPI is another project)
    except (ImportError, AttributeError):
        raise RecipeError("--amp-backend apex needs NVIDIA apex with apex.amp, which is not installed here "
                          "(apex.amp was removed upstream in 2025 and apex is not on PyPI): "
                          "use --amp-backend native (torch.amp, its successor)") from None
    return amp


class ApexLossScaler:
    """apex.amp behind GradScaler's three calls, so one training loop serves both backends."""

    def __init__(self, apex_amp, optimizer):
        self.amp, self.optimizer = apex_amp, optimizer

    def scale(self, loss):
        return types.SimpleNamespace(backward=lambda: self._backward(loss))

    def _backward(self, loss):
        with self.amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()

    def step(self, optimizer):
        optimizer.step()  # apex's patched step skips itself after an overflow

    def update(self):
        pass  # apex adjusts its loss scale inside scale_loss

    def state_dict(self):
        return self.amp.state_dict()

    def load_state_dict(self, state):
        self.amp.load_state_dict(state)
