"""Mixed precision for the recipes that take --opt-level (apex, fsdp): apex's opt levels mapped onto torch.amp.

| --opt-level | apex.amp meant                          | here, with torch.amp                          |
|-------------|-----------------------------------------|-----------------------------------------------|
| O0          | fp32                                    | fp32, autocast off                            |
| O1          | cast per op to fp16, dynamic loss scale | autocast(dtype) + GradScaler when fp16        |
| O2          | fp16 weights + fp32 master copy         | model.to(dtype) but BatchNorm, inputs cast in |
|             | + fp32 BatchNorm, dynamic loss scale    | and logits out; the optimizer steps fp32      |
|             |                                         | copies (MasterWeights) + GradScaler for fp16  |
| O3          | pure fp16, no loss scaling (a speed     | model.to(dtype), autocast, no GradScaler      |
|             | baseline, may not converge)             |                                               |

initialize() is the counterpart of apex.amp.initialize: it returns the model,
the optimizer, a loss scaler and the autocast context for the training loop.
GradScaler skips a step whose gradients overflowed without asking the host when the
optimizer is fused (the recipes' SGD on CUDA takes the scale and the overflow flag
on the device); an unfused one (ZeroRedundancyOptimizer, SGD over fully_shard's
DTensors) makes it read the flag on the host, once per fp16 step.
The run counts the steps the scaler skipped (bookkeeping.Run.skipped_step), on the device.
fsdp_policy() maps the same flags onto FSDP2's MixedPrecisionPolicy: O1 and O2 gather
the weights in fp16/bf16 for forward and backward and reduce the gradients in fp32;
O3 reduces them in fp16/bf16 too; the sharded fp32 weights are the master copy (O2's
by construction).
"""

import dataclasses
import functools
import types
from pathlib import Path

import torch
import torch.distributed as dist
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
        enabled = dtype == torch.float16 and opt_level in ("O1", "O2")
        if opt_level == "O2":  # apex's: the model in low precision (BatchNorm fp32), the optimizer on fp32 copies
            scaler = MasterWeights(model, optimizer, dtype, device.type, enabled=enabled)
        else:
            scaler = torch.amp.GradScaler(device.type, enabled=enabled)
        if scaler.is_enabled():
            zero_momentum(optimizer)
        use_autocast = opt_level in ("O1", "O3")  # (O2 casts once, at the model's input, as apex did)
    masters = (f"weights {DTYPE_NAMES[dtype]} but BatchNorm's, fp32 master copies in the optimizer, "
               if opt_level == "O2" and args.amp_backend != "apex" else "")
    log.print(f"mixed precision: opt level {opt_level} ({'fp32' if opt_level == 'O0' else DTYPE_NAMES[dtype]}, "
              f"{args.amp_backend}): {masters}autocast {'on' if use_autocast else 'off'}, loss scaling "
              f"{'on' if args.amp_backend == 'apex' or scaler.is_enabled() else 'off'}")
    return model, optimizer, scaler, functools.partial(torch.autocast, device.type, dtype=dtype, enabled=use_autocast)


class MasterWeights(torch.amp.GradScaler):
    """apex's O2 on torch's pieces: the model's weights in fp16/bf16 but BatchNorm's (its statistics need fp32), its
    input cast to that type and its logits back to fp32 (the loss in fp32), and the optimizer stepping fp32 master
    copies of the weights, so that updates smaller than a half-precision step still add up.

    A GradScaler (disabled for bf16: no loss scaling) whose step() does what apex hid in scale_loss and its patched
    optimizer.step: copy the model's gradients into the masters' (as fp32), step the masters (unscaled; skipped
    after an overflow), copy them back into the model. Checkpoints hold the masters (a state_dict hook), so that
    they resume exactly and load into any recipe's fp32 model.
    """

    def __init__(self, model, optimizer, dtype, device_type, enabled):
        super().__init__(device_type, enabled=enabled)
        if dist.is_initialized():  # rank 0's, as DDP would make them, but in fp32: DDP sees only the half copy
            for param in model.parameters():
                dist.broadcast(param.detach(), 0)
        names = {param: name for name, param in model.named_parameters()}
        self.masters = {name: param.detach().clone().requires_grad_() for param, name in names.items()}
        for group in optimizer.param_groups:
            group["params"] = [self.masters[names[param]] for param in group["params"]]
        model.to(dtype)
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.float()
        self.pairs = [(param, self.masters[name]) for name, param in model.named_parameters()]
        model.register_forward_pre_hook(lambda module, inputs: cast(inputs, dtype))
        model.register_forward_hook(lambda module, inputs, output: cast(output, torch.float32))
        model.register_state_dict_post_hook(functools.partial(masters_into_state, self.masters))
        model.register_load_state_dict_pre_hook(functools.partial(state_into_masters, self.masters))

    def step(self, optimizer, *args, **kwargs):
        for param, master in self.pairs:
            if param.grad is not None:
                master.grad, param.grad = param.grad.float(), None  # (the model's are set to none here)
        result = super().step(optimizer, *args, **kwargs)  # unscales the masters' gradients, skips an overflow
        with torch.no_grad():
            for param, master in self.pairs:
                param.copy_(master)
        return result


def masters_into_state(masters, module, state, prefix, local_metadata):
    """O2's state_dict hook: the fp32 masters in place of the model's fp16/bf16 weights."""
    for name, master in masters.items():
        state[prefix + name] = master.detach().clone()


@torch.no_grad()
def state_into_masters(masters, module, state, prefix, *unused):
    """O2's load_state_dict hook: the fp32 weights loaded into the masters too (the model takes them rounded)."""
    for name, master in masters.items():
        value = state.get(prefix + name)
        if value is not None and value.shape == master.shape:  # (else load_state_dict reports it)
            master.copy_(value)


def cast(value, dtype):
    """value with its floating-point tensors (also inside tuples, lists and dicts) in dtype."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(cast(item, dtype) for item in value)
    if isinstance(value, dict):
        return {key: cast(item, dtype) for key, item in value.items()}
    return value


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
