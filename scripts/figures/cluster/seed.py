"""The seed tutorial's own numbers (richardkxu/distributed-pytorch, ResNet-50 on ImageNet, HAL at NCSA), read
from its published CSVs at one commit, straight from a clone or a bare git directory.

    python scripts/figures/cluster/seed.py CLONE_OR_GITDIR        # writes figures/data/cluster/seed_*.csv
    python scripts/figures/cluster/seed.py CLONE_OR_GITDIR --out DIR

  seed_throughput.csv  one row a run (Throughput_train/*.csv beside BatchTime_train/*.csv): GPUs, batch per GPU
                       and opt level from the file name, the median images/s over the logged steps (one a
                       training epoch), their number, the median per GPU and the median seconds a step
  seed_io.csv          one row an IO/*.csv (the shared file system's reads and writes, one point a minute while
                       the 64-GPU runs trained): the medians over every minute the file holds, idle ones included
  seed_times.csv       each training time in RESULTS.md: seconds, epochs, GPUs, batch per GPU, the run's last
                       validation top-1 and top-5 and its best top-1 where it gives them; `measured` is no
                       where the epochs exceed the run's --epochs (the 2-GPU run stopped at 81; its 90-epoch
                       time is the 81 epochs' scaled by 90/81)
Every row names its source: repo, commit, path.

What a Throughput_train value is (imagenet_ddp_apex.py at that commit): rank 0 alone logs it, once an epoch
(step = epoch + 1), as world_size * batch_size / batch_time.avg, batch_time being rank 0's seconds a step
averaged over the epoch's windows of --print-freq steps. It is the whole job's images/s, as rank 0 times it;
its BatchTime_train value is that batch_time.avg. The IO files' units are not written in them: the seed's
plot.py divides Read by 1e9 for "Bandwidth (GBs)" and by 1000 for "K IOPS", so bytes/s and operations/s.
"""

import argparse
import csv
import io
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = "richardkxu/distributed-pytorch"
COMMIT = "b2a3e175d468d7cbceb6d0e020a603da83d789f4"
RUN = re.compile(r"run-(?P<run>.+?_gpux(?P<gpus>\d+)_b(?P<batch>\d+)_cpu\d+_opt(?P<opt>[^-]+))-tag-")
UNITS = {"bandwidth": "bytes/s", "iops": "operations/s"}  # (the seed's plot.py: Read / 1e9 "GBs", / 1000 "K IOPS")
SOURCE = ["repo", "commit", "path"]
THROUGHPUT_FIELDS = ["run", "gpus", "batch_per_gpu", "opt_level", "images_per_s", "points", "images_per_s_per_gpu",
                     "step_s", *SOURCE]
IO_FIELDS = ["file", "measures", "gpus", "read", "write", "units", "points", *SOURCE]
TIME_FIELDS = ["run", "gpus", "batch_per_gpu", "epochs", "seconds", "measured", "top1", "best_top1", "top5",
               *SOURCE]
LAST_VAL = re.compile(r"Prec@1 ([\d.]+)(?: \(([\d.]+)\))? Prec@5 ([\d.]+)")  # 'Prec@1 75.631 (76.154) Prec@5 92.578'


def git(gitdir, *args):
    done = subprocess.run(["git", "-C", str(gitdir), *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {gitdir} is not a clone of {REPO} with commit {COMMIT[:7]} "
                 f"({(done.stderr.strip().splitlines() or ['git failed'])[-1]})")
    return done.stdout


def files(gitdir, folder):
    return git(gitdir, "ls-tree", "--name-only", COMMIT, f"{folder}/").split()


def rows(gitdir, path, delimiter=","):
    return list(csv.DictReader(io.StringIO(git(gitdir, "show", f"{COMMIT}:{path}")), delimiter=delimiter))


def source(path):
    return {"repo": REPO, "commit": COMMIT, "path": path}


def throughput(gitdir):
    out = []
    for path in files(gitdir, "Throughput_train"):
        run = RUN.search(path)
        images = [float(row["Value"]) for row in rows(gitdir, path)]
        steps = [float(row["Value"]) for row in rows(gitdir, path.replace("Throughput_train", "BatchTime_train", 1)
                                                     .replace("-tag-Throughput_train", "-tag-Time_train"))]
        median, gpus = statistics.median(images), int(run["gpus"])
        out.append({"run": run["run"], "gpus": gpus, "batch_per_gpu": int(run["batch"]), "opt_level": run["opt"],
                    "images_per_s": round(median, 2), "points": len(images),
                    "images_per_s_per_gpu": round(median / gpus, 2), "step_s": round(statistics.median(steps), 4),
                    **source(path)})
    return sorted(out, key=lambda r: (r["batch_per_gpu"] != 208, r["gpus"], r["run"]))


def storage(gitdir):
    out = []
    for path in files(gitdir, "IO"):
        measures = Path(path).name.split("_")[0]
        points = rows(gitdir, path, delimiter=";")
        out.append({"file": Path(path).stem, "measures": measures, "gpus": re.search(r"gpux(\d+)", path)[1],
                    "read": round(statistics.median(float(p["Read"]) for p in points), 1),
                    "write": round(statistics.median(float(p["Write"]) for p in points), 1),
                    "units": UNITS[measures], "points": len(points), **source(path)})
    return out


def times(gitdir):
    """RESULTS.md: '## RUN' sections, each with 'Training Time:' lines '... | SECONDS secs [(N epochs)]' and, in
    most, 'Last val:' 'Prec@1 TOP1 [(BEST)] Prec@5 TOP5': the last epoch's validation top-1 and top-5 (%), and in
    brackets where given the best epoch's top-1 (blank where a run has no such line)."""
    out = []
    for section in git(gitdir, "show", f"{COMMIT}:RESULTS.md").split("\n## ")[1:]:
        run = section.splitlines()[0].strip()
        gpus, batch = re.search(r"gpux(\d+)_b(\d+)", run).groups()
        asked = re.search(r"epochs=(\d+)", section)
        asked = int(asked[1]) if asked else 90  # (no --epochs on the command line: the script's default, 90)
        val = LAST_VAL.search(section)
        accuracy = ({"top1": float(val[1]), "best_top1": float(val[2] or val[1]), "top5": float(val[3])} if val
                    else {"top1": "", "best_top1": "", "top5": ""})
        for seconds, epochs in re.findall(r"\|\s*([\d.]+) secs(?: \((\d+) epochs\))?", section):
            epochs = int(epochs or asked)
            out.append({"run": run, "gpus": int(gpus), "batch_per_gpu": int(batch), "epochs": epochs,
                        "seconds": float(seconds), "measured": "yes" if epochs <= asked else "no",
                        **(accuracy if epochs <= asked else dict.fromkeys(accuracy, "")),  # (at the run's end)
                        **source("RESULTS.md")})
    return sorted(out, key=lambda r: (r["gpus"], r["epochs"]))


def write(path, fields, table):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(table)
    print(f"wrote {path} ({len(table)} rows)")


def io_of_64_gpu_runs(data):
    """[(run, images/s, {measures: the median read})] of the 64-GPU runs whose IO files are published, from
    data/cluster/ (what this script wrote): an IO file is named for its run's month (..._feb, ..._aprl30,
    ..._may01), a run begins with it (Feb12_..., May01_...)."""
    with open(Path(data) / "cluster" / "seed_throughput.csv", newline="") as f:
        runs = {r["run"][:3].lower(): r for r in csv.DictReader(f) if r["gpus"] == "64"}
    io_by_month = {}
    with open(Path(data) / "cluster" / "seed_io.csv", newline="") as f:
        for r in csv.DictReader(f):
            io_by_month.setdefault(r["file"].rsplit("_", 1)[1][:3], {})[r["measures"]] = float(r["read"])
    return [(runs[month]["run"], float(runs[month]["images_per_s"]), measured)
            for month, measured in sorted(io_by_month.items()) if month in runs]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gitdir", metavar="CLONE_OR_GITDIR", help=f"a clone of {REPO}, or its .git directory")
    parser.add_argument("--out", default="figures/data/cluster", help="where the CSVs go")
    args = parser.parse_args()
    if not Path(args.gitdir).is_dir():
        sys.exit(f"error: {args.gitdir} is not a directory (a clone of {REPO}, or its .git directory)")
    git(args.gitdir, "cat-file", "-e", f"{COMMIT}^{{commit}}")
    runs, reads, trained = throughput(args.gitdir), storage(args.gitdir), times(args.gitdir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write(out / "seed_throughput.csv", THROUGHPUT_FIELDS, runs)
    write(out / "seed_io.csv", IO_FIELDS, reads)
    write(out / "seed_times.csv", TIME_FIELDS, trained)
    for r in runs:
        print(f"{r['gpus']:3d} GPUs x {r['batch_per_gpu']}: {r['images_per_s']:9.1f} images/s "
              f"({r['images_per_s_per_gpu']:.1f} a GPU, {r['points']} epochs)")


if __name__ == "__main__":
    main()
