"""The virtual cluster measured before it is trusted: gloo all-reduce bus bandwidth over shaped links.

    sudo python scripts/figures/cluster/measure.py      # figures/data/cluster_bandwidth.csv

For each number of nodes (2, 4 and 8; one process a node) and each link rate (100mbit to 3gbit, and none:
the veth at the CPU's speed) it makes a virtual cluster (scripts/cluster/) and runs allreduce.py on it: fp32
all-reduces of 1, 4, 16 and 64 MiB, 5 timed each (the median kept), and 8-byte ones (the latency). Bus
bandwidth as nccl-tests defines it (bytes x 2 (n - 1) / n / time: what each link carries in a ring) is set
beside the configured rate; the unshaped rows are the emulation's own ceiling on this machine, the rate above
which it measures the CPU, not the link. A (nodes, rate) whose lines are in runs/figures/cluster/ already is
not measured again. Needs root and iproute2: without them it says so in one line and keeps the CSV as it is.
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from scripts.cluster import network, run  # noqa: E402
from scripts.figures import measuring  # noqa: E402

FIELDS = ["nodes", "rate", "rate_bits", "size_bytes", "seconds", "algbw_bits", "busbw_bits", "repeats", "cpu",
          "cores", "gpu", "torch"]


def main():
    started = time.time()
    parser = measuring.Parser(description=__doc__, formatter_class=measuring.argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rates", nargs="+", default=["100mbit", "300mbit", "1gbit", "3gbit", "none"])
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", default="runs/figures/cluster", help="where each cluster's lines go")
    parser.add_argument("--figures-data", default="figures/data", help="where cluster_bandwidth.csv goes")
    args = parser.parse_args()
    links = [network.Link(None if rate == "none" else rate) for rate in args.rates]
    bad = next((link.problem() for link in links if link.problem()), None)
    if bad or min(args.nodes) < 2:
        measuring.bad_input(bad or f"--nodes must be 2 or more, got {args.nodes}")
    problem = network.require()
    if problem:
        print(f"cluster: not measured ({problem}); {args.figures_data}/cluster_bandwidth.csv kept as it is",
              file=sys.stderr)
        return
    runs, machine, rows = Path(args.runs), measuring.hardware(), []
    runs.mkdir(parents=True, exist_ok=True)
    script = ROOT / "scripts" / "figures" / "cluster" / "allreduce.py"
    for nodes in args.nodes:
        for rate, link in zip(args.rates, links):
            out = runs / f"bandwidth-{nodes}-{rate}.jsonl"
            flags = ["--sizes-mib", *map(str, args.sizes_mib), "--repeats", str(args.repeats)]
            lines = read_lines(out, flags)
            if lines is None:
                out.unlink(missing_ok=True)
                measuring.counts["trained"] += 1
                with open(out.with_suffix(".log"), "w") as log:
                    status = run.run(nodes, link, [str(script), str(out), *flags], output=log, quiet=True)
                if status != 0:
                    sys.exit(f"error: the all-reduce on {nodes} nodes at {rate} failed ({status}): see "
                             f"{out.with_suffix('.log')}")
                out.with_suffix(".flags").write_text(json.dumps(flags))
                lines = read_lines(out, flags)
            else:
                measuring.counts["reused"] += 1
            for line in lines:
                rows.append({"nodes": nodes, "rate": rate, "rate_bits": link.bits_per_s() if link.rate else "",
                             "size_bytes": line["size_bytes"], "seconds": f"{line['seconds']:.6f}",
                             "algbw_bits": round(line["algbw_bits"]), "busbw_bits": round(line["busbw_bits"]),
                             "repeats": args.repeats, **machine})
            largest = lines[-1]
            print(f"{nodes} nodes at {rate:>7}: {largest['busbw_bits'] / 1e6:7.0f} Mbit/s bus bandwidth at "
                  f"{largest['size_bytes'] / 2**20:.0f} MiB, {lines[0]['seconds'] * 1e3:.2f} ms for 8 bytes",
                  flush=True)
    path = Path(args.figures_data) / "cluster_bandwidth.csv"
    measuring.write_csv(path, FIELDS, rows)
    print(f"wrote {path}")
    measuring.record_part(args.figures_data, "cluster", started)


def read_lines(out, flags):
    """The lines a finished measurement of these flags left in out, else None."""
    try:
        if json.loads(out.with_suffix(".flags").read_text()) == flags:
            return [json.loads(line) for line in out.read_text().splitlines()]
    except (OSError, ValueError):
        pass
    return None


if __name__ == "__main__":
    main()
