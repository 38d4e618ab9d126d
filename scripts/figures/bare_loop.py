"""The bare loop: a recipe's set-up in plain PyTorch, what the GPU table holds the recipes against.

    python scripts/figures/bare_loop.py -a resnet50 --image-size 224 -b 256 --precision fp16 --channels-last \\
        --compile --json OUT.json

The same model (the recipes' by name), batch, precision, layout and optimizer as the recipes (SGD at the GPU
table's --lr 0.01 for 256, momentum 0.9 and weight decay 1e-4, fused on CUDA, its momentum from zeros;
GradScaler in fp16; autocast in fp16 or bf16; channels_last weights and input; torch.compile of the model),
and nothing else: one batch that stays on the device, then forward, loss, backward and step, --warmup steps
and then --steps more. No loader, no copy to the device, no meter, no DDP, no logs, no checks: whatever the
recipe's images/s lacks of this loop's is what the recipe costs. A mark after each step (a CUDA event, or on
a CPU the clock) gives the seconds of each timed step, as scripts/figures/gpu/step_times.py gives a recipe's; written to
--json with what ran (the dtype the model computed in, the batch's layout) and the modules of this project it
imported.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from recipes.common.models import build_model  # (the model only: lenet, or torchvision's by name)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-a", "--arch", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (default: 10)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps (default: 30)")
    parser.add_argument("--json", required=True, help="where the step times go")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True  # as the recipes without --seed
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    model = build_model(args.arch, 1000, args.image_size).to(device, memory_format=layout)
    optimizer = torch.optim.SGD(model.parameters(), 0.01 * args.batch_size / 256, momentum=0.9, weight_decay=1e-4,
                                fused=device.type == "cuda")
    for param in model.parameters():  # (fused SGD leaves them uninitialised where the scaler skips its first step)
        optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)
    dtype = DTYPES.get(args.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    criterion = torch.nn.CrossEntropyLoss()
    forward = torch.compile(model) if args.compile else model
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    images = images.contiguous(memory_format=layout)
    target = torch.randint(0, 1000, (args.batch_size,), device=device)

    def step():
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            output = forward(images)
            loss = criterion(output, target)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return output, loss

    marks = []
    for i in range(args.warmup + args.steps + 1):
        output, loss = step()
        if i >= args.warmup:  # the mark after the last warm-up step starts the first timed one
            if device.type == "cuda":
                marks.append(torch.cuda.Event(enable_timing=True))
                marks[-1].record()
            else:
                marks.append(time.perf_counter())
    if device.type == "cuda":
        torch.cuda.synchronize()
    weight = next(p for p in model.parameters() if p.ndim == 4)  # (the first convolution's)
    seconds = [a.elapsed_time(b) / 1000 if device.type == "cuda" else b - a for a, b in zip(marks, marks[1:])]
    ran = {"precision": str(output.dtype).removeprefix("torch."), "batch_on": str(images.device),
           "channels_last": all(t.is_contiguous(memory_format=torch.channels_last) for t in (images, weight)),
           "compiled": forward is not model, "fused_sgd": optimizer.defaults["fused"] is True,
           "loss": loss.item(), "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("recipes", "scripts"))}
    Path(args.json).write_text(json.dumps({"device": device.type, "steps": [round(s, 6) for s in seconds],
                                           "ran": ran}) + "\n")


if __name__ == "__main__":
    main()
