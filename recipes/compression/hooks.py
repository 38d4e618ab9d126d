"""Gradient compression as DDP communication hooks: compress, communicate, decompress, average.

DDP hands a communication hook one bucket of gradients at a time (a flat fp32
tensor of about 25 MB, as soon as backward has produced it) and waits for the
future the hook returns: that bucket, averaged over the ranks. Uncompressed, the
bucket is allreduced in fp32, 4 bytes per gradient. The hooks here send fewer:

  none        PyTorch's allreduce_hook: what DDP does without a hook     4 bytes per gradient
  fp16, bf16  cast to 16 bits, divide by the world size there (so the    2 bytes per gradient
              sum stays in fp16's range), allreduce (a sum in 16 bits),
              copy back (PyTorch's fp16_compress_hook, bf16_compress_hook)
  fp8-e4m3,   fp8_hook below: scale the bucket so that its largest         1 byte per gradient,
  fp8-e5m2    magnitude is the format's largest value, cast to 8 bits,     + 4 per bucket
              gather every rank's bytes and scale (no backend sums fp8),
              decompress, average
  powersgd    PyTorch's powerSGD_hook: each gradient matrix M (n x m) is   4 (n + m) r / (n m)
              approximated by P Q^T (P: n x r, Q: m x r); P and Q are      per gradient
              allreduced instead of M

Error feedback keeps, on each rank, what compression lost in this step and adds
it to the next step's gradient: a gradient too small for the format is delayed
until it has grown big enough to be sent, instead of being lost every step.

Traffic counts the bytes each rank hands to the collectives; fp32 bytes divided by
them is the compression ratio. (On the wire, a ring allreduce moves 2 (W-1) / W
times its payload per rank, a gather W - 1 times: at W ranks, fp8's ratio on the
wire is its payload ratio times 2 / W.)
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from recipes.common import RecipeError, cli, compat

METHODS = ["none", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "powersgd"]
PYTORCH_HOOKS = {"none": (default_hooks.allreduce_hook, torch.float32),  # hook, the type it sends
                 "fp16": (default_hooks.fp16_compress_hook, torch.float16),
                 "bf16": (default_hooks.bf16_compress_hook, torch.bfloat16)}
FP8 = {"fp8-e4m3": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}
SCALE_BYTES = 4  # the fp32 scale that travels with each fp8 bucket


def add_args(parser):
    group = parser.add_argument_group("gradient compression")
    group.add_argument("--compress", choices=METHODS, default="none",
                       help="how gradients travel (default: none, DDP's fp32 allreduce)")
    group.add_argument("--powersgd-rank", type=int, default=2, help="rank r of PowerSGD's P and Q (default: 2)")
    group.add_argument("--error-feedback", action="store_true",
                       help="add what compression lost in one step to the next step's gradient")


def check_args(args):
    cli.check_ranges(args, {"--powersgd-rank": (lambda r: r >= 1, "must be at least 1")})
    if args.error_feedback and args.compress == "none":
        raise RecipeError("--error-feedback needs --compress: uncompressed gradients lose nothing to feed back")
    return args


def describe(args):
    return f"--compress {args.compress}{' with error feedback' if args.error_feedback else ''}"


class Traffic:
    """Bytes this rank handed to collectives and their fp32 equivalent, counted bucket by bucket."""

    def __init__(self):
        self.sent = self.fp32 = 0

    def count(self, bucket, sent_bytes):
        self.sent += sent_bytes
        self.fp32 += bucket.buffer().numel() * 4

    def snapshot(self):
        return self.sent, self.fp32

    def since(self, snapshot, optimizer_steps):
        """(bytes per optimizer step, compression ratio) since an earlier snapshot(): with --accum-steps, one
        step's bytes only if no_sync kept the micro-batches before the last from communicating."""
        sent, fp32 = (now - then for now, then in zip(self.snapshot(), snapshot))
        return (sent / optimizer_steps, fp32 / sent) if sent else (0.0, 1.0)


# fp8: compress, gather, decompress, average

def compress(grad, dtype):
    """grad / scale in 8 bits, the scale chosen so that the largest magnitude becomes the format's largest value."""
    scale = grad.abs().max().float().clamp(min=1e-30) / torch.finfo(dtype).max
    return (grad / scale).to(dtype), scale


def decompress(payload, scale):
    return payload.float() * scale


def fp8_hook(dtype):
    def hook(process_group, bucket):
        group = process_group or dist.group.WORLD
        grad = bucket.buffer()
        payload, scale = compress(grad, dtype)
        # one message per rank: the 8-bit values, then the fp32 scale as 4 bytes (gloo and NCCL cannot sum
        # fp8, but any tensor travels as bytes)
        message = torch.cat([payload.view(torch.uint8), scale.reshape(1).view(torch.uint8)])
        gathered = torch.empty(group.size() * message.numel(), dtype=torch.uint8, device=grad.device)
        work = compat.all_gather_single(gathered, message, group=group, async_op=True)

        def average(fut):
            rows = gathered.view(group.size(), -1)  # one row per rank
            payloads = rows[:, :-SCALE_BYTES].view(dtype)
            # (copied: one rank's row is contiguous already, at an offset and a stride float32 cannot view)
            scales = rows[:, -SCALE_BYTES:].clone(memory_format=torch.contiguous_format).view(torch.float32)
            grad.copy_(decompress(payloads, scales).mean(dim=0))
            return grad

        return work.get_future().then(average)

    return hook


def with_error_feedback(hook, roundtrip):
    """hook, but each rank first adds what compression lost in its last step, and keeps what it loses now."""
    errors = {}  # bucket index -> this rank's compression error

    def hook_with_feedback(state, bucket):
        grad = bucket.buffer()
        error = errors.get(bucket.index())
        if error is not None and error.shape == grad.shape:  # (DDP rebuilds its buckets after the first step)
            grad.add_(error)
        errors[bucket.index()] = grad - roundtrip(grad)  # what the bucket loses on its way out
        return hook(state, bucket)

    return hook_with_feedback


def build(method, powersgd_rank=2, error_feedback=False):
    """`method`'s hook and the state DDP passes it (the group it averages over; PowerSGD's state), and the
    Traffic that counts what it sends: ddp_model.register_comm_hook(state, hook)."""
    traffic = Traffic()
    if method == "powersgd":
        return (*build_powersgd(traffic, powersgd_rank, error_feedback), traffic)
    if method in FP8:
        dtype = FP8[method]
        hook, bytes_per_gradient, bytes_per_bucket = fp8_hook(dtype), 1, SCALE_BYTES

        def roundtrip(grad):  # the gradient as the other ranks will see it
            return decompress(*compress(grad, dtype))
    else:
        hook, dtype = PYTORCH_HOOKS[method]
        bytes_per_gradient, bytes_per_bucket = dtype.itemsize, 0

        def roundtrip(grad):
            return grad.to(dtype).to(grad.dtype)
    if error_feedback:
        hook = with_error_feedback(hook, roundtrip)

    def counted_hook(process_group, bucket):
        traffic.count(bucket, bucket.buffer().numel() * bytes_per_gradient + bytes_per_bucket)
        return hook(process_group, bucket)

    return dist.group.WORLD, counted_hook, traffic


def build_powersgd(traffic, rank, error_feedback):
    # the first 2 steps allreduce in full (PowerSGD needs them while DDP settles its buckets)
    state = powerSGD_hook.PowerSGDState(process_group=dist.group.WORLD, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=2, use_error_feedback=error_feedback,
                                        warm_start=True, random_seed=0)

    def counted_hook(state, bucket):
        in_full = state.iter < state.start_powerSGD_iter
        before = state.total_numel_after_compression  # PowerSGD adds to it the sizes of the uncompressed
        future = powerSGD_hook.powerSGD_hook(state, bucket)  # tensors, Ps and Qs it allreduces
        elements = bucket.buffer().numel() if in_full else state.total_numel_after_compression - before
        traffic.count(bucket, elements * bucket.buffer().element_size())
        if dist.get_backend() == "gloo":
            # gloo runs the chained allreduces of P and Q on its own threads, where two buckets' chains could
            # reach it in different orders on different ranks (a mismatch: a hang or a crash); one at a time
            future.wait()
        return future

    return state, counted_hook
