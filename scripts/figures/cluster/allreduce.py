"""One rank of the bandwidth benchmark (scripts/figures/cluster/measure.py launches it on every node of a
virtual cluster): gloo all-reduces of fp32 tensors of each size, after a warm-up, timed between barriers;
rank 0 appends one JSON line a size to OUT: the median seconds, the algorithm and bus bandwidth as nccl-tests
define them (algbw = bytes / time; busbw = algbw x 2 (n - 1) / n, what each rank's link carries in a ring),
and the median of 8-byte all-reduces (the latency the link adds, with nothing to carry).

    python allreduce.py OUT --sizes-mib 1 16 64 --repeats 5     (under torchrun, on each node)
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def timed(tensor, repeats):
    times = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    small = torch.zeros(2)
    timed(small, 3)  # connections made
    rows = [{"size_bytes": 8, "seconds": timed(small, 20)}]
    for size_mib in args.sizes_mib:
        tensor = torch.ones(int(size_mib * 2**20) // 4)
        dist.all_reduce(tensor)  # warm-up: buffers allocated, TCP windows grown
        rows.append({"size_bytes": tensor.numel() * 4, "seconds": timed(tensor, args.repeats)})
    if dist.get_rank() == 0:
        with open(args.out, "a") as f:
            for row in rows:
                algbw = row["size_bytes"] * 8 / row["seconds"]
                f.write(json.dumps({**row, "ranks": world, "algbw_bits": algbw,
                                    "busbw_bits": algbw * 2 * (world - 1) / world}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
