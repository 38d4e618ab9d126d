"""One rank of a DDP step whose computation is stood in for by its measured duration, as the pipeline's
stragglers are (scripts/figures/scaling/cluster.py launches it on every node of a virtual cluster): sleep
--compute-s, then all-reduce the model's fp32 gradients, one flat tensor of --bytes (DDP makes one bucket of up
to 25 MB, so lenet's are one all-reduce after the backward, with nothing left to overlap); --warmup steps, then
--steps timed ones. Rank 0 prints the median step (seconds) as JSON. Where nodes outnumber the cores, a node
sleeps instead of sharing them, so it steps as it would alone: only the wire, and gloo's work, are shared.

    python stand_in.py --compute-s 0.023 --bytes 324008 --steps 40     (under torchrun, on each node)
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compute-s", type=float, required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    gradients = torch.ones(args.bytes // 4)
    steps = []
    for step in range(args.warmup + args.steps):
        started = time.perf_counter()
        time.sleep(args.compute_s)  # forward and backward
        dist.all_reduce(gradients)  # DDP's bucket, once the backward is done
        gradients.div_(dist.get_world_size())
        steps.append(time.perf_counter() - started)
    seconds = torch.tensor([statistics.median(steps[args.warmup:])])
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # as long as the slowest rank's
    if dist.get_rank() == 0:
        print(json.dumps({"step_s": seconds.item(), "ranks": dist.get_world_size()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
