"""The virtual cluster (scripts/cluster/): a recipe on emulated nodes, the links at their rate, and nothing left
behind however a run ends. The tests that build namespaces need root and iproute2 and skip, saying so, without."""

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY, child_env

from scripts.cluster import network

PROBLEM = network.require()
needs_namespaces = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")
# one worker runs them all, one at a time: --clean removes every cluster of the machine, and links are timed
pytestmark = pytest.mark.xdist_group("cluster")
RUN = [sys.executable, str(ROOT / "scripts" / "cluster" / "run.py")]

# every rank all-reduces 8 MB three times and prints the bus bandwidth; with --hang, writes its pid and waits
ALLREDUCE = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if "--hang" in sys.argv:
    open(os.path.join(sys.argv[-1], f"rank{rank}.pid"), "w").write(str(os.getpid()))
    dist.barrier()
    time.sleep(600)
tensor = torch.ones(2 * 2**20)
dist.all_reduce(tensor)
started = time.perf_counter()
for _ in range(3):
    dist.all_reduce(tensor)
seconds = (time.perf_counter() - started) / 3
assert tensor[0].item() == world ** 4
if rank == 0:
    print(f"busbw {2 * (world - 1) / world * tensor.numel() * 4 * 8 / seconds / 1e6:.0f} Mbit/s", flush=True)
dist.destroy_process_group()
"""


def ours():
    """This machine's namespaces and /etc/netns folders of virtual clusters."""
    namespaces = {name for name in network.ip("netns", "list").stdout.split() if name.startswith(network.PREFIX)}
    return namespaces | ({p.name for p in network.ETC_NETNS.glob(f"{network.PREFIX}-*")}
                         if network.ETC_NETNS.exists() else set())


def assert_nothing_left(before):
    """No namespace or folder made since `before` is left (those of a cluster still running beside the test,
    a measurement say, are its own: their launcher lives)."""
    def left():
        return {name for name in ours() - before if not Path(f"/proc/{name.split('-')[1]}").exists()}

    deadline = time.monotonic() + 20
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "allreduce.py"
    path.write_text(ALLREDUCE)
    return path


def start(nodes, rate, script, *args, **popen):
    return subprocess.Popen([*RUN, "--nodes", str(nodes), "--rate", rate, str(script), *args], cwd=ROOT,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def test_links_and_names():
    link = network.Link("200mbit", "50us")
    assert link.bits_per_s() == 200e6 and link.delay_s() == pytest.approx(50e-6) and link.problem() is None
    assert "not a rate" in network.Link("fast").problem()
    assert "not a delay" in network.Link("1gbit", "soon").problem()
    cluster = network.Cluster("123", 3)
    assert cluster.namespaces() == ["vcluster-123-switch", "vcluster-123-node0", "vcluster-123-node1",
                                    "vcluster-123-node2"]
    assert [cluster.address(i) for i in range(3)] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]


@needs_namespaces
def test_two_nodes_at_the_rate_and_nothing_left(script):
    before = ours()
    result = start(2, "200mbit", script)
    output, _ = result.communicate(timeout=120)
    assert result.returncode == 0, output
    busbw = float(output.split("busbw ")[1].split()[0])
    assert f"({network.PREFIX}-{result.pid}-1-node0 ...)" in output  # (the launcher's pid, its first cluster)
    assert 0.8 * 200 < busbw < 1.1 * 200, output  # a shaped link, whatever the machine (the benchmark: 10 %)
    assert "cluster: 2 nodes x 1 process(es)" in output and "removed 3 namespaces" in output
    assert output.rstrip().endswith("removed 3 namespaces and every process in them")
    assert_nothing_left(before)


@needs_namespaces
def test_two_clusters_at_once_do_not_collide(script):
    before = ours()
    runs = [start(2, "1gbit", script) for _ in range(2)]
    for run in runs:
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 0 and "busbw" in output, output
    assert_nothing_left(before)


def hung_ranks(tmp_path, run, count):
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank*.pid"))) < count:
        assert run.poll() is None and time.monotonic() < deadline, run.stdout.read() if run.poll() else "timeout"
        time.sleep(0.2)
    return [int((tmp_path / f"rank{rank}.pid").read_text()) for rank in range(count)]


@needs_namespaces
@pytest.mark.parametrize("how", ["sigkill-a-trainer", "sigterm", "sigint", "sigkill-the-launcher"])
def test_nothing_left_however_it_ends(script, tmp_path, how):
    """A trainer killed (its node fails, the others are stopped), the launcher stopped (Ctrl-C, SIGTERM) or the
    launcher killed (its janitor cleans up): no namespace, /etc/netns folder or process is left."""
    before = ours()
    run = start(3, "1gbit", script, "--hang", str(tmp_path))
    pids = hung_ranks(tmp_path, run, 3)
    target, sig = {"sigkill-a-trainer": (pids[1], signal.SIGKILL), "sigterm": (run.pid, signal.SIGTERM),
                   "sigint": (run.pid, signal.SIGINT), "sigkill-the-launcher": (run.pid, signal.SIGKILL)}[how]
    os.kill(target, sig)
    output, _ = run.communicate(timeout=60)
    assert run.returncode != 0
    if how != "sigkill-the-launcher":
        assert "removed 4 namespaces" in output, output
    assert_nothing_left(before)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


@needs_namespaces
def test_ddp_on_four_nodes(tiny_data, tmp_path):
    """The recipe as `make cluster` runs it: ddp on 4 emulated nodes, one process each, to its summary."""
    before = ours()
    out = tmp_path / "run"
    result = subprocess.run([*RUN, "--nodes", "4", "--rate", "1gbit", "recipes/ddp/train.py", str(tiny_data), *TINY,
                             "--epochs", "1", "--out", str(out)], cwd=ROOT, env=child_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = (out / "summary.json").read_text()
    assert '"world_size": 4' in summary
    assert_nothing_left(before)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="drops root to check the line a user without root gets: needs root and setpriv")
def test_without_root_one_line(script):
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *RUN, "--nodes", "2",
                             str(script)], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "error: the virtual cluster needs root (ip netns and tc); run it as root, e.g. with sudo"]


@needs_namespaces
@pytest.mark.parametrize("flags, line", [
    (["--rate", "fast"], "error: rate 'fast' is not a rate such as 200mbit or 1gbit (or none)"),
    (["--nodes", "0"], "error: --nodes and --nproc-per-node must be 1 or more, got 0 and 1"),
])
def test_bad_flags_one_line(script, flags, line):
    result = subprocess.run([*RUN, *flags, str(script)], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [line]


@needs_namespaces
def test_the_bandwidth_benchmark_writes_a_row_a_size_and_resumes(tmp_path):
    command = [sys.executable, "scripts/figures/cluster/measure.py", "--nodes", "2", "--rates", "200mbit", "none",
               "--sizes-mib", "1", "--repeats", "2", "--runs", str(tmp_path / "runs"), "--figures-data", str(tmp_path)]
    first = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    rows = (tmp_path / "cluster_bandwidth.csv").read_text().splitlines()
    assert rows[0].startswith("nodes,rate,rate_bits,size_bytes,seconds,algbw_bits,busbw_bits,repeats,cpu")
    assert [row.split(",")[:4] for row in rows[1:]] == [["2", "200mbit", "200000000.0", "8"],
                                                         ["2", "200mbit", "200000000.0", "1048576"],
                                                         ["2", "none", "", "8"], ["2", "none", "", "1048576"]]
    assert 0.8 * 200e6 < float(rows[2].split(",")[6]) < 1.1 * 200e6  # 1 MB at 200 Mbit/s: 42 ms a ring
    again = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert "(0 run(s) trained now, 2 kept from an earlier start)" in again.stdout
    assert (tmp_path / "cluster_bandwidth.csv").read_text().splitlines() == rows


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="drops root to check the line a user without root gets: needs root and setpriv")
def test_the_bandwidth_benchmark_without_root_keeps_its_data(tmp_path):
    (tmp_path / "cluster_bandwidth.csv").write_text("kept\n")
    tmp_path.chmod(0o777)
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                             "scripts/figures/cluster/measure.py", "--figures-data", str(tmp_path), "--runs",
                             str(tmp_path / "runs")], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stderr.strip().splitlines() == [
        f"cluster: not measured (the virtual cluster needs root (ip netns and tc); run it as root, e.g. with sudo); "
        f"{tmp_path}/cluster_bandwidth.csv kept as it is"]
    assert (tmp_path / "cluster_bandwidth.csv").read_text() == "kept\n"


@needs_namespaces
def test_compression_on_the_cluster_sizes_each_link_by_the_principle(tiny_data, tmp_path):
    """compression/measure.py --parts cluster: a node's step alone measured, each real link's rate here from it,
    a link beyond half the ceiling named and not run, the rows and curves written, then drawn."""
    from scripts.figures.cluster import links

    data = tmp_path / "data"
    data.mkdir()
    command = [sys.executable, "scripts/figures/compression/measure.py", "--data", str(tiny_data), "--quick",
               "--seeds", "0", "--methods", "none", "--parts", "cluster", "--cluster-nodes", "2", "--cluster-epochs",
               "2", "--global-batch", "16", "--runs", str(tmp_path / "runs"), "--figures-data", str(data)]

    def measure(ceiling_bits):
        (data / "cluster_bandwidth.csv").write_text("nodes,rate,rate_bits,size_bytes,seconds,busbw_bits\n"
                                                    f"2,none,,67108864,0.1,{ceiling_bits}\n")
        result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    measure(1)  # a ceiling of 1 bit/s: a node's step alone is measured, and every link is beyond the emulation
    rates = {line.split(",")[0]: float(line.split(",")[4])
             for line in (data / "compression_cluster_skipped.csv").read_text().splitlines()[1:]}
    assert rates["EDR InfiniBand (HAL)"] == pytest.approx(10 * rates["10 Gbit/s Ethernet"], rel=1e-3)
    measure(round(rates["EDR InfiniBand (HAL)"] / 1.5))  # trusted to a third of EDR's: above 10 Gbit/s Ethernet's
    rows = [dict(zip(*[line.split(",") for line in (data / "compression_cluster.csv").read_text().splitlines()[:1]],
                     line.split(","))) for line in (data / "compression_cluster.csv").read_text().splitlines()[1:]]
    assert [(r["method"], r["link"], r["nodes"]) for r in rows] == [("none", "10 Gbit/s Ethernet", "2"),
                                                                    ("none", "1 Gbit/s Ethernet", "2")]
    gradient_bytes, node_step = links.seed_gradient_bytes(), links.seed_node_step()
    for r, bits in zip(rows, (10e9, 1e9)):
        ratio = links.real_ratio(bits, 2, gradient_bytes, node_step)
        assert float(r["ratio"]) == pytest.approx(ratio, abs=1e-4)
        wire = links.wire_seconds(2, float(r["bytes_per_step"]), float(r["rate_bits"]))
        # the principle (the CSV keeps the step alone to 10 µs: on these tiny steps, a few tenths of a percent)
        assert wire == pytest.approx(ratio * float(r["alone_step_s"]), rel=1e-3, abs=ratio * 5e-6)
    # the slower link, the slower emulated rate (its longer step is what the figure measures: on 2 loaded cores the
    # few milliseconds between them are within the noise, and a test asserts no timing)
    assert float(rows[1]["rate_bits"]) < float(rows[0]["rate_bits"]) and all(float(r["step_s"]) > 0 for r in rows)
    skipped = (data / "compression_cluster_skipped.csv").read_text().splitlines()
    assert len(skipped) == 2 and skipped[1].startswith("EDR InfiniBand (HAL),100000000000.0,2,0.0259,")
    curves = (data / "compression_cluster_curves.csv").read_text().splitlines()
    assert len(curves) == 1 + 2 * 2  # an epoch a row: 2 links x 2 epochs
    from scripts.figures.compression import render_cluster

    text = render_cluster.render(data)["compression-cluster"]
    assert ("**10 Gbit/s Ethernet, 2 nodes.** There, ResNet-50's all-reduce takes 25.9% of a node's computing "
            "time") in text
    assert "Not emulated: EDR InfiniBand (HAL) at 2 nodes. There the wire takes 2.6% of a node's computing time" in text



@needs_namespaces
def test_scaling_on_the_cluster_stands_in_for_the_computation_and_trains(tiny_data, tmp_path):
    """scaling/measure.py --parts cluster at 1 and 2 nodes: the stand-in's step on each link beside the model (a
    node's step alone + the wire sized by the principle), the recipe trained on the first link, then drawn."""
    from scripts.figures.cluster import links
    from scripts.figures.scaling import render_cluster

    data = tmp_path / "data"
    command = [sys.executable, "scripts/figures/scaling/measure.py", "--parts", "cluster", "--cluster-data",
               str(tiny_data), "--cluster-nodes", "1", "2", "--seeds", "0", "--cluster-epochs", "1",
               "--cluster-steps", "5", "--cluster-batch", "8", "--csv", str(data / "scaling.csv"), "--runs",
               str(tmp_path / "runs")]
    data.mkdir()
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    read = render_cluster.read_csv
    stand_in, training = read(data / "scaling_cluster.csv"), read(data / "scaling_cluster_training.csv")
    assert [(r["link"], r["nodes"]) for r in stand_in] == [("10 Gbit/s Ethernet", "1"), ("10 Gbit/s Ethernet", "2"),
                                                           ("1 Gbit/s Ethernet", "1"), ("1 Gbit/s Ethernet", "2")]
    gradient_bytes, node_step = links.seed_gradient_bytes(), links.seed_node_step()
    for r in stand_in[1::2]:  # the principle, and the model beside the step
        ratio = links.real_ratio(float(r["link_bits"]), 2, gradient_bytes, node_step)
        wire = links.wire_seconds(2, float(r["bytes_per_step"]), float(r["rate_bits"]))
        assert wire == pytest.approx(ratio * float(r["compute_s"]), rel=1e-3, abs=ratio * 5e-6)  # (kept to 10 µs)
        assert float(r["model_s"]) == pytest.approx(float(r["compute_s"]) + wire, rel=1e-3)
    # the slower link, the slower emulated rate (the steps are the figure's measurement; a test asserts no timing)
    assert float(stand_in[3]["rate_bits"]) < float(stand_in[1]["rate_bits"])
    assert all(float(r["step_s"]) > 0 for r in stand_in)
    assert [(r["nodes"], r["global_batch"]) for r in training] == [("1", "8"), ("2", "16")]
    assert len(read(data / "scaling_cluster_curves.csv")) == 2  # an epoch a run
    text = render_cluster.render(data, tmp_path)["scaling-cluster"]
    r = stand_in[3]
    assert (f"| 1 Gbit/s Ethernet | 2 | {float(r['rate_bits']) / 1e6:.1f} | {float(r['ratio']):.1%} | "
            f"{float(r['step_s']) * 1e3:.1f} | {float(r['model_s']) * 1e3:.1f} |") in text
    assert (tmp_path / "scaling_cluster.png").exists()


@needs_namespaces
def test_the_pipeline_race_on_the_cluster_gives_hetpipes_servers_a_node(tiny_data, tmp_path):
    """pipeline/measure.py --parts cluster --quick: each of 2 replicas on a node, HetPipe's server on a third, the link
    sized by the principle from a replica's step alone; the race's table and its verdict against the paper."""
    from scripts.figures.cluster import links
    from scripts.figures.pipeline import render_cluster

    data = tmp_path / "data"
    data.mkdir()
    command = [sys.executable, "scripts/figures/pipeline/measure.py", "--data", str(tiny_data), "--quick", "--seeds",
               "0", "--parts", "cluster", "--runs", str(tmp_path / "runs"), "--figures-data", str(data)]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = render_cluster.read_csv(data / "pipeline_cluster.csv")
    assert [(r["sync"], r["replicas"], r["nodes"]) for r in rows] == [("allreduce", "2", "2"), ("hetpipe", "2", "3")]
    r = rows[0]
    ratio = links.real_ratio(float(r["link_bits"]), 2, links.seed_gradient_bytes(), links.seed_node_step())
    bytes_per_step = links.fp32_gradient_bytes(tiny_data, ["-a", "lenet", "--image-size", "28"])
    wire = links.wire_seconds(2, bytes_per_step, float(r["rate_bits"]))
    assert wire == pytest.approx(ratio * float(r["alone_step_s"]), rel=1e-3, abs=ratio * 5e-6)  # the principle
    assert float(r["hetero"]) == pytest.approx(float(r["alone_step_s"]) / 0.5, abs=1e-4)  # SD-PIPE's c / X
    images = sum(1 for path in (tiny_data / "train").rglob("*") if path.is_file())
    epoch_alone = float(r["alone_step_s"]) * math.ceil(images / 2 / 8)  # (a replica's minibatches of an epoch, -b 8)
    assert float(r["snapshot_every"]) == pytest.approx(epoch_alone / 4, abs=2e-3)  # T: a quarter of it
    scores = render_cluster.read_csv(data / "pipeline_cluster_time.csv")
    within = [float(x["seconds"]) for x in scores if x["snapshot"] == "1" and x["sync"] == "allreduce"]
    assert within and within == sorted(within) and within[0] == pytest.approx(float(r["snapshot_every"]), rel=1e-3)
    text = render_cluster.render(data)["pipeline-cluster"]
    assert "a node a replica and one more for HetPipe's servers" in text and "Against the paper: 2 x 1 to " in text
    assert "a quarter of a replica's epoch computing alone" in text and "measured before scores" not in text


@needs_namespaces
def test_zenops_on_the_cluster_puts_each_role_on_a_node(tiny_data, tmp_path):
    """ps/measure.py --parts cluster --quick: zenops's server, validator and 8 workers on 10 nodes; drawn beside
    the table's loopback rows when there are some (none here)."""
    from scripts.figures.ps import render_cluster

    digits = tmp_path / "digits"  # the tiny folder's images 14 times over: a round of 8 x 8 for each of 8 workers
    shutil.copytree(tiny_data / "val", digits / "val")
    for image in (tiny_data / "train").rglob("*.png"):
        (digits / "train" / image.parent.name).mkdir(parents=True, exist_ok=True)
        for copy in range(14):
            shutil.copy(image, digits / "train" / image.parent.name / f"{copy}-{image.name}")
    data = tmp_path / "data"
    data.mkdir()
    command = [sys.executable, "scripts/figures/ps/measure.py", "--data", str(digits), "--quick", "--seeds", "0",
               "--epochs", "1", "--parts", "cluster", "--runs", str(tmp_path / "runs"), "--figures-data", str(data)]
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = render_cluster.read_csv(data / "ps_cluster.csv")
    assert [(r["aggregate"], r["attack"], r["processes"], r["diverged"]) for r in rows] == [
        ("zenops", "none", "10", "0")]
    assert float(rows[0]["images_per_s"]) > 0
    text = render_cluster.render(data)["ps-cluster"]
    assert text.startswith("| rule | attack | top-1 (%) | images/s on the cluster |") and "| zenops | none |" in text

def test_the_model_knows_which_hooks_gather():
    """The fp8 hooks gather every rank's bytes (no backend sums fp8): n - 1 times a rank's bytes through a link,
    where a ring all-reduce passes 2 (n - 1) / n; the model's list is the recipe's."""
    from recipes.compression import hooks
    from scripts.figures.cluster import links

    assert links.GATHERED == tuple(hooks.FP8)
    share = links.payload_shares()[1]
    assert links.wire_seconds(4, 1e6, 8e6) == pytest.approx(1.5 / share)
    assert links.wire_seconds(4, 1e6, 8e6, gathered=True) == pytest.approx(3 / share)


def test_nodes_get_cores_of_their_own_where_the_cores_suffice():
    from scripts.cluster import run

    assert run.node_cores(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]] and run.node_threads(2, [0, 1, 2, 3], 1) == 2
    assert run.node_cores(3, [0, 1, 2, 3]) == [[0], [1], [2]]  # (a core left over stays idle: shares are equal)
    assert run.node_cores(4, [0, 1]) == [[0, 1]] * 4  # more nodes than cores: all shared, a thread a process
    assert run.node_threads(4, [0, 1], 1) == 1 and run.node_threads(1, [0, 1], 2) == 1


def test_the_first_failing_node_decides_the_exit_status():
    from scripts.cluster import run

    class Agent:
        def __init__(self, status):
            self.status = status

        def poll(self):
            return self.status

    assert run.wait([Agent(0), Agent(0)], []) == 0
    assert run.wait([Agent(None), Agent(3)], []) == 3
    assert run.wait([Agent(0), Agent(-9)], []) == 137  # killed by SIGKILL: 128 + 9, as a shell says it
    assert run.wait([Agent(None)], [15]) == 143  # SIGTERM to the launcher


def test_links_are_sized_so_the_wire_takes_the_real_clusters_share():
    """The principle, at 4 nodes where the ring's share is 1.5: the emulated wire's seconds over a node's step
    alone equal the real cluster's wire over its node's step."""
    from scripts.figures.cluster import links

    gradient_bytes, node_step = links.seed_gradient_bytes(), links.seed_node_step()
    assert gradient_bytes == 51_220_304 and node_step == 0.277  # (ResNet-50 under O2; the seed's 4-GPU step)
    ratio = links.real_ratio(10e9, 4, gradient_bytes, node_step)  # 16 GPUs: 2 x 15 / 16 of the bytes a port
    assert ratio == pytest.approx(1.875 * gradient_bytes * 8 / 10e9 / node_step)
    rate = links.emulated_rate(ratio, 4, 324_008, 0.03)
    assert links.wire_seconds(4, 324_008, rate) == pytest.approx(ratio * 0.03)
    assert links.seed_images_per_s(4, 100e9, gradient_bytes, node_step) == pytest.approx(4 * 208 / 0.277)
    assert links.seed_images_per_s(8, 100e9, gradient_bytes, node_step) == pytest.approx(
        8 * 208 / (0.277 + 1.75 * gradient_bytes * 8 / 100e9))


@needs_namespaces
def test_clean_removes_what_a_killed_launcher_and_janitor_left():
    """A cluster whose launcher and janitor are both gone (a dead pid in its name): --clean removes its namespace
    and its /etc/netns folder; a live pid's cluster is left alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = f"{network.PREFIX}-{dead.pid}-1-node0"
    network.ip("netns", "add", left)
    (network.ETC_NETNS / f"{network.PREFIX}-{dead.pid}-1-node1").mkdir(parents=True)
    live = f"{network.PREFIX}-{os.getpid()}-99-node0"
    network.ip("netns", "add", live)
    try:
        result = subprocess.run([sys.executable, "scripts/cluster/network.py", "--clean"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "removed 2 namespace(s) and /etc/netns folder(s)" in result.stdout
        names = ours()
        assert left not in names and f"{network.PREFIX}-{dead.pid}-1-node1" not in names and live in names
    finally:
        network.remove([live])
