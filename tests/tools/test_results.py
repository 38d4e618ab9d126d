"""scripts/figures/ and plot_results.py: RESULTS.md and the figures drawn from figures/data/, part by part."""

import csv
import itertools
import json
import re
import shutil
import sys

from conftest import ROOT, plot_results, run_python

sys.path.insert(0, str(ROOT))
from scripts.figures.compile import measure as compile_measure
from scripts.figures.gpu import measure as gpu_measure
from scripts.figures.io import measure as io_measure
from scripts.figures.scaling import measure as scaling_measure
from scripts.figures.sharding import measure as sharding_measure
from scripts.figures.ps import byzfl_reference
from scripts.figures.compression import measure as compression_measure
from scripts.figures.gpu import plan as gpu_plan
from scripts.figures import measuring
from scripts.figures.pipeline import measure as pipeline_measure
from scripts.figures.ps import table as ps_table


def write_figures_data(data):
    """Measured-data files as the benchmark scripts write them, with round numbers to check the tables by."""
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    (data / "curves").mkdir(parents=True)
    for recipe, world_size, offset in (("nd", 1, 0), ("ddp", 2, 0.5), ("apex", 2, 5)):
        for seed in (0, 1, 2):  # final val top-1: nd 60, 61, 62; ddp 60.5, 61.5, 62.5; apex 65, 66, 67
            rows = ["epoch,split,loss,top1,top5,images_per_s,data_s,epoch_s,lr"]
            rows += [f"{e},{split},1.0,{40 + 10 * e + seed + offset},{80 + 5 * e},100,0.1,2.0,0.05" for e in (1, 2)
                     for split in ("train", "val")]
            (data / "curves" / f"{recipe}-seed{seed}.csv").write_text("\n".join(rows) + "\n")
            (data / "curves" / f"{recipe}-seed{seed}.json").write_text(json.dumps(
                {"world_size": world_size, "images_per_s": 120 + seed, "wall_s": 55.0 + seed, "arch": "lenet",
                 "global_batch": 64}))
    header = "kind,recipe,data,processes,threads,arch,image_size,batch_size,images_per_s,epoch_s,cpu,cores,gpu,torch"
    assert header.split(",") == scaling_measure.FIELDS  # (each header here is the script's own, checked)
    rows = [("recipe", "nd", "synthetic", 1, 97, 10), ("recipe", "ddp", "synthetic", 1, 100, 10),
            ("recipe", "ddp", "jpeg", 1, 50, 2), ("recipe", "ddp", "synthetic", 2, 180, 6),
            ("recipe", "ddp", "jpeg", 2, 80, 1.5), ("bare", "nd", "memory", 1, 100, ""),
            ("bare", "ddp", "memory", 1, 100, ""), ("bare", "ddp", "memory", 2, 200, ""),
            ("bare", "independent", "memory", 2, 150, "")]
    (data / "scaling.csv").write_text("\n".join([header] + [
        f"{k},{r},{d},{p},1,resnet18,32,32,{rate},{epoch_s},{','.join(map(str, machine.values()))}"
        for k, r, d, p, rate, epoch_s in rows]) + "\n")
    header = ("decoder,batches,workers,batch_size,image_size,images,seconds,images_per_s,mb_per_s,"
              "images_per_s_per_worker,cpu,cores,gpu,torch")
    assert header.split(",") == io_measure.FIELDS
    rows = [("pil", "uint8", 0, 100), ("pil", "uint8", 2, 200), ("tensor", "uint8", 0, 150),
            ("tensor", "uint8", 2, 300), ("tensor", "float32", 0, 125), ("tensor", "float32", 2, 240)]
    (data / "io.csv").write_text("\n".join([header] + [
        f"{d},{b},{w},32,224,320,1,{rate},{rate / 10},{rate / max(w, 1)},{','.join(map(str, machine.values()))}"
        for d, b, w, rate in rows]) + "\n")
    (data / "io_loader.json").write_text(json.dumps(
        {"batch_size": 32, "image_size": 224, "normalise_ms_per_batch": 12.5, "uint8_batch_bytes": 4816896,
         "float32_batch_bytes": 19267584, "first_batch_workers": 2, "first_batch_s_fresh_workers": 0.9,
         "first_batch_s_persistent_workers": 0.2}))
    (data / "examples.json").write_text(json.dumps(
        {"flags": "-a resnet18 -b 32 -j 2 --epochs 1 -p 1000", "images": 800, "repeats": 3,
         "recipe": {"wall_s": 37.0, "cpu_s": 70.0, "left_running": 0},
         "examples": {"wall_s": 40.0, "cpu_s": 75.0, "left_running": 0}, "wall_ratio": 0.925, "cpu_ratio": 0.9333,
         **machine}))
    (data / "recovery.json").write_text(json.dumps(
        {"arch": "resnet18", "processes": 2, "checkpoint_mb": 89.5, "seconds_per_save": 0.3,
         "save_share_of_epoch": 0.01, "kill_to_first_step_s": 14.0, "steps_redone": 20, "stop_check_us": 150.0,
         "stop_check_share_of_step": 0.0015}))
    header = ("method,error_feedback,processes,seed,threads,arch,epochs,global_batch,train_s,wall_s,top1,top5,"
              "bytes_per_step,compression_ratio,cpu,cores,gpu,torch")
    assert header.split(",") == compression_measure.FIELDS
    rows = [("serial", 0, 1, 60, (95.0, 95.5, 96.0), "", ""), ("none", 0, 2, 40, (94.5, 94.0, 95.0), 4000, 1.0),
            ("fp8-e4m3", 0, 2, 45, (93.25, 93.0, 93.5), 1004, 3.984),  # below none's range: beyond the spread
            ("fp8-e4m3", 1, 2, 46, (94.0, 94.75, 94.25), 1004, 3.984)]  # inside it
    (data / "compression.csv").write_text("\n".join([header] + [
        f"{m},{ef},{p},{seed},1,lenet,15,64,{t + seed},{t + 5},{top1[seed]},99,{b},{r},"
        f"{','.join(map(str, machine.values()))}" for seed in (0, 1, 2) for m, ef, p, t, top1, b, r in rows]) + "\n")
    assert "part,seconds,runs_trained,runs_reused,date,cpu,cores,gpu,torch".split(",") == measuring.TIMING_FIELDS
    (data / "timings.csv").write_text("part,seconds,runs_trained,runs_reused,date,cpu,cores,gpu,torch\n" + "".join(
        f"{part},{seconds},{trained},0,2026-11-24,{','.join(map(str, machine.values()))}\n"
        for part, seconds, trained in (("io", 60, 0), ("curves", 600, 9), ("compression", 3000, 57))))
    rows = [("eager", (12, 10, 10), 100), ("cold", (70, 5, 5), 200), ("warm", (20, 5, 5), 200)]
    assert "mode,epoch,epoch_s,images_per_s,arch,threads,cpu,cores,gpu,torch".split(",") == compile_measure.FIELDS
    (data / "compile.csv").write_text("\n".join(["mode,epoch,epoch_s,images_per_s,arch,threads,cpu,cores,gpu,torch"] + [
        f"{mode},{e + 1},{t},{rate},resnet18,2,{','.join(map(str, machine.values()))}"
        for mode, times, rate in rows for e, t in enumerate(times)]) + "\n")


def test_the_committed_data_redraws_results_md_and_every_figure_as_committed(tmp_path):
    """RESULTS.md and each of its long forms (docs/results/) byte for byte, and each figure pixel for pixel,
    from figures/data/ alone."""
    import matplotlib.image

    pages = [ROOT / "RESULTS.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]
    assert len(pages) > 10
    for page in pages:
        (tmp_path / page.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, tmp_path / page.relative_to(ROOT))
    result = run_python([sys.executable, "scripts/figures/plot_results.py", "--figures", tmp_path, "--results",
                         tmp_path / "RESULTS.md"])
    assert result.returncode == 0, result.stderr[-3000:]
    for page in pages:
        assert (tmp_path / page.relative_to(ROOT)).read_bytes() == page.read_bytes(), page.name
    drawn = sorted(tmp_path.glob("*.png"))
    assert {png.name for png in drawn} == {png.name for png in (ROOT / "figures").glob("*.png")}
    for png in drawn:
        assert (matplotlib.image.imread(png) == matplotlib.image.imread(ROOT / "figures" / png.name)).all(), png.name


def test_every_table_and_figure_has_its_place_on_results_md_or_a_long_form_and_results_md_stays_a_page(tmp_path):
    """Each section a renderer writes stands between its markers on RESULTS.md or a page of docs/results/ (none
    appended at RESULTS.md's end), each figure is shown on one of them, each part's section of RESULTS.md links
    its long form, and RESULTS.md stays at about 300 lines."""
    from scripts import figures as results

    sections = {}
    for part in results.PARTS + results.OTHERS:
        sections.update(results.renderer(part).render(ROOT / "figures" / "data", tmp_path, []))
    pages = {page: page.read_text() for page in [ROOT / "RESULTS.md", *(ROOT / "docs" / "results").glob("*.md")]}
    unplaced = [name for name in sections if not any(f"<!-- BEGIN {name} -->" in text for text in pages.values())]
    assert not unplaced
    shown = {png for text in pages.values() for png in re.findall(r"figures/(\w+\.png)\)", text)}
    assert shown == {png.name for png in (ROOT / "figures").glob("*.png")}
    text = pages[ROOT / "RESULTS.md"]
    assert len(text.splitlines()) <= 320
    for heading, body in re.findall(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        if heading not in ("The answers", "Regenerating it"):
            assert re.search(r"\]\(docs/results/\w+\.md\)", body), heading
            assert body.count("<!-- BEGIN ") <= 2, heading  # (one table; the GPU's has its earlier sweep's line)


def test_each_part_of_make_figures_has_its_renderer():
    """The Makefile's parts are scripts/figures' index, in the same order; each module renders, in 200 lines."""
    from scripts import figures as results

    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^PARTS := (.*)$", makefile, re.M)[1].split() == results.PARTS
    for part in results.PARTS + results.OTHERS:
        assert callable(results.renderer(part).render), part
    for module in (ROOT / "scripts").rglob("render*.py"):
        assert len(module.read_text().splitlines()) <= 200, module.name


def test_each_part_keeps_one_name_from_the_makefile_to_its_figures(tmp_path):
    """Part P: the Makefile runs scripts/figures/P/measure.py, scripts/figures/P/render.py renders it from
    figures/data/P*, draws figures/P*.png and writes sections P or P-* (hardware, where it ran, is no one part's)."""
    from scripts import figures as results

    makefile = (ROOT / "Makefile").read_text()
    data = ROOT / "figures" / "data"
    for part in results.PARTS:
        assert re.search(rf"^figure-part-{part} = \$\(PY\) scripts/figures/{part}/measure\.py ", makefile, re.M), part
        assert list(data.glob(f"{part}*")), part
        figures, missing = tmp_path / part, []
        figures.mkdir()
        sections = results.renderer(part).render(data, figures, missing)
        assert sections and not missing, part
        assert all(name == part or name.startswith(f"{part}-") for name in set(sections) - {"hardware"}), part
        assert all(png.name.startswith(part) for png in figures.glob("*.png")), part
    others = {"examples.json", "timings.csv", "gpu"}  # (examples, timings, gpu/: rendered outside make figures)
    assert all(any(f.name.startswith(part) for part in results.PARTS) for f in data.iterdir() if f.name not in others)


def test_plot_results_draws_every_figure_and_rewrites_only_the_tables(tmp_path):
    data, figures, results = tmp_path / "data", tmp_path / "figures", tmp_path / "RESULTS.md"
    write_figures_data(data)
    results.write_text("# Prose stays\n\n<!-- BEGIN scaling -->\nstale table\n<!-- END scaling -->\n\nMore prose.\n")
    text = plot_results(data, figures, results, ("curves_top1_train", "curves_top1_val", "curves_top5_train",
                                                 "curves_top5_val",
                                                 "scaling_throughput", "scaling_time", "io", "compression"))
    assert text.startswith("# Prose stays") and "More prose." in text and "stale table" not in text
    assert "| ddp | synthetic | 2 | 180.0 | 6.0 | 1.80x | 90 % |" in text  # 180 / (2 x 100)
    assert "| nd | 1 | 1 | 97.0 | 100.0 | 97.0 % |" in text and "| ddp | 2 | 1 | 180.0 | 200.0 | 90.0 % |" in text
    assert "| unconnected bare loops | memory | 2 | 150.0 |  | 1.50x | 75 % |" in text  # against nd's bare loop
    assert "--decoder tensor / PIL, images/s: 0 workers 1.50x, 2 workers 1.50x." in text  # (rows of before TorchCodec)
    assert "uint8 / float32 batches of --decoder tensor, images/s: 0 workers 1.20x, 2 workers 1.25x." in text
    assert "| tensor | torchvision.io | uint8 | 150 | 300 |" in text
    assert "12.50 ms to convert and normalise a batch of 32 at 224 px" in text and "4.8 MB as uint8 and 19.3" in text
    assert "0.900 s when they start anew each epoch (with --seed), 0.200 s when they persist" in text
    assert "| recipes/nd/train.py | 37.00 | 70.00 | 0 |" in text
    assert "| pytorch/examples imagenet/main.py | 40.00 | 75.00 | 0 |" in text
    assert "recipe / examples: wall 0.925x, CPU 0.933x; the medians of 3 runs of each" in text
    assert ("| nd | 1 | 3 | 2 | 61.00 (60.00\u201362.00) | 90.00 (90.00\u201390.00) | 61.00 (60.00\u201362.00) | 121.0 "
            "| 56 |") in text
    assert "| apex | 2 | 3 | 2 | 66.00 (65.00\u201367.00) |" in text
    assert "spread of the final top-1 (points): nd 2.00, ddp 2.00, apex 2.00." in text
    assert "beyond the spread (ranges that do not overlap): nd and apex (-5.00); ddp and apex (-4.50)." in text
    assert "so not told apart from noise: nd and ddp (-0.50)." in text
    assert "CPU Test CPU (2 cores), GPU none: make figures' parts ran CPU-only" in text
    assert "Not measured yet: the GPU table has not run on a GPU." in text  # the GPU section, without gpu/*.csv
    assert "| resnet18 | 2 | 89.5 | 0.3 | 1.00 % | 14.0 | 20 | 150 | 0.15 % |" in text
    assert "| serial | 1 | 3 | 61.0 | 95.50 (95.00\u201396.00) |  |  |  |  |" in text
    assert "| none | 2 | 3 | 41.0 | 94.50 (94.00\u201395.00) |  |  | 4,000 | 1.00 |" in text
    assert "| fp8-e4m3 | 2 | 3 | 46.0 | 93.25 (93.00\u201393.50) | -1.25 | yes | 1,004 | 3.98 |" in text
    assert "| fp8-e4m3 + error feedback | 2 | 3 | 47.0 | 94.33 (94.00\u201394.75) | -0.17 | no | 1,004 | 3.98 |" in text
    assert "Uncompressed DDP's top-1 spreads over 1.00 points at 2 processes from seed to seed." in text
    assert ("Beyond the spread: fp8-e4m3 at 2 (-1.25). Within it (not told apart from noise): fp8-e4m3 + error "
            "feedback at 2 (-0.17).") in text
    assert "| `make figures ONLY=compression` | 50.0 | 57 | 0 | 2026-11-24 |" in text
    assert ("| `make figures` (the parts summed), without cluster, scaling, recovery, compile, precision, ps, "
            "pipeline, sharding | 61.0 |") in text
    assert "| eager (no --compile) | 12.0 | 10.0 | 100.0 | 1.00x |  |" in text
    assert "| --compile, empty Inductor cache | 70.0 | 5.0 | 200.0 | 2.00x | +63.0 |" in text  # (70 - 5) - (12 - 10)
    # the headline: each question answered by its table's numbers, with the machine the part's data records
    assert ("| [How does DDP scale on a cluster?](#scaling) | ddp on 2 processes: 1.80x its images/s on 1 (90 % "
            "scaling efficiency), 1.86x nd's, on synthetic data | Test CPU, 2 cores, torch 2.14.1 |") in text
    assert ("| fp8-e4m3 sends 4x fewer bytes: top-1 93.25 against 94.50 uncompressed, on 2 processes | Test CPU, 2 "
            "cores, torch 2.14.1 |") in text
    assert "| torch.compile at 2.00x eager's images/s in steady state |" in text  # (the table's steady medians)
    assert "| --compile, warm Inductor cache | 20.0 | 5.0 | 200.0 | 2.00x | +13.0 |" in text
    assert "costs 63.0 s at start-up with an empty cache (13.0 s with a warm one) and runs at 2.00x" in text


def write_gpu_data(data):
    """The GPU table of one GPU as scripts/figures/gpu/measure.py writes it (every set-up, the fastest O1 fp16 +
    channels_last at 5000 images/s), a profile, the published figures and an earlier sweep; and the CPU's scaling."""
    machine = {"cpu": "Test CPU", "cores": 16, "gpu": "Test GPU", "capability": "9.0", "torch": "2.11.0"}
    fastest = gpu_plan.Setup("recipe", "apex", "", "fp16", True, False, "O1")
    rates = [1800, 2400, 5000, 4800, 4000, 3900, 1900, 5100, 4600, 3000, 4700]
    rows = []
    for setup, rate in zip(gpu_plan.TABLE, rates):
        resolved = gpu_plan.resolve(setup, fastest)
        rows.append({"planned": gpu_plan.setup_name(setup), "setup": gpu_plan.setup_name(resolved),
                     **resolved._asdict(), "channels_last": int(resolved.channels_last),
                     "compile": int(resolved.compile), "gpus": 1, "batch_size": 256, "workers": 15, "steps": 29,
                     "step_ms": round(256_000 / rate, 3), "step_ms_p10": round(250_000 / rate, 3),
                     "step_ms_p90": round(270_000 / rate, 3), "images_per_s": rate, "data_wait_share": 0.02,
                     "seconds": 31, "model_seconds": 28, "arch": "resnet50", "image_size": 224, **machine})
    (data / "gpu").mkdir(parents=True)
    measuring.write_csv(data / "gpu" / "table.csv", gpu_measure.TABLE_FIELDS, rows)
    (data / "gpu" / "profiles.json").write_text(json.dumps([{
        "setup": "apex O1 fp16 + channels_last", "target": "speed", "value": 5000.0, **machine, "steps": 5,
        "loader_wait_ms": 0.05, "step_ms": 51.2, "busy_ms": 48.0, "idle_ms": 3.2,
        "top": [{"name": "sm90_xmma_fprop|nhwc", "ms": 20.0, "share": 0.3906}]}]))
    (data / "gpu" / "anchors.csv").write_text(
        "source,hardware,gpus,model,data,precision,images_per_s,seconds,url\n"
        "NVIDIA DeepLearningExamples,DGX A100,1,ResNet-50 v1.5,ImageNet,TF32,938,,u\n"
        "tczhangzhi/pytorch-distributed: nn.DataParallel,V100,4,resnet18,ImageNet,FP32,,4000,v\n"
        "tczhangzhi/pytorch-distributed: torch.distributed,V100,4,resnet18,ImageNet,FP32,,1000,v\n")
    (data / "gpu" / "earlier").mkdir()
    (data / "gpu" / "earlier" / "throughput.csv").write_text(
        "recipe,data,decoder,precision,channels_last,gpus,batch_size,images_per_s,arch,image_size,gpu,torch\n"
        "ddp,synthetic,,fp32,0,1,256,1800,resnet50,224,1 x Old GPU,2.11.0\n"
        "apex,synthetic,,fp16,1,1,256,4500,resnet50,224,1 x Old GPU,2.11.0\n")


def test_plot_results_writes_the_gpu_section_from_the_table(tmp_path):
    data, figures, results = tmp_path / "data", tmp_path / "figures", tmp_path / "RESULTS.md"
    write_gpu_data(data)
    measuring.write_csv(data / "scaling.csv", scaling_measure.FIELDS, [
        {"kind": "recipe", "recipe": "ddp", "data": "synthetic", "processes": n, "images_per_s": rate, "epoch_s": 10}
        for n, rate in ((1, 100), (2, 150))])
    results.write_text("# Results\n")
    text = plot_results(data, figures, results, ("gpu_throughput",))
    assert "| [What does mixed precision buy on a GPU?](#gpus) | apex O1 fp16 + channels_last at 5000 images/s of " \
           "ResNet-50, 2.78x ddp fp32 | Test GPU, torch 2.11.0 |" in text  # (the headline's first line)
    assert "| ddp fp32 | synthetic | 1800 | 142.2 | 138.9–150.0 | 1.00x | 2 % | 28 / 31 |" in text
    assert ("| bare loop fp16 + channels_last | synthetic | 5100 | 50.2 | 49.0–52.9 | 2.83x | 2 % | 28 / 31 |"
            in text)
    assert "| apex O1 fp16 + channels_last, JPEGs, --decoder gpu | JPEGs | 4700 |" in text
    assert "Not measured yet" not in text.split("<!-- BEGIN gpu-table -->")[1].split("<!-- END")[0]
    # the targets: 5000 < 6000; 5000 / 5100 = 0.980 >= 0.97; 4700 / 5000 = 0.940 >= 0.9
    assert ("| speed | the fastest set-up's images/s on --synthetic images (O2 aside: the bare loop has no masters) | "
            "at least 6000 | 5000 | no |") in text
    assert "| at least 0.97 | 0.980 | yes |" in text and "| at least 0.9 | 0.940 | yes |" in text
    assert ("Profile of apex O1 fp16 + channels_last (5 steps in the middle of its last epoch; its speed target "
            "missed): the GPU ran 48.0 ms of each step's 51.2 ms and sat idle (waiting for the host or the loader) "
            "3.2 ms (6 %); the loader kept the host waiting 0.05 ms a step.") in text
    assert "| sm90_xmma_fprop\\|nhwc | 20.00 | 39.1 % |" in text
    assert "| apex O2 fp16 + channels_last | 3900.0 | 65.6 (64.1–69.2) | 2.17x |" in text  # (precision)
    assert ("so neither is measured on GPUs here, nor extrapolated; the scaling measured is the CPU's: ddp on 2 "
            "processes at 1.50x its 1-process images/s ([Scaling](../../RESULTS.md#scaling)) and another tutorial's "
            "4 x V100 figure (tczhangzhi/pytorch-distributed: torch.distributed in 1000 s against nn.DataParallel's "
            "4000 s, 4.00x, a published figure).") in text
    assert "Before the table, its sweep measured on 1 x Old GPU" in text and "apex O1 fp16 + channels_last 4500 " \
           "(2.50x)" in text
    assert "| NVIDIA DeepLearningExamples | DGX A100 | 1 | ResNet-50 v1.5 | ImageNet | TF32 | 938 |  | [source](u) |" \
        in text  # (published figures beside the measured ones)
    # a GPU with part of its table (one bare row), and another's rows beyond one GPU: drawn, not in the way
    rows = measuring.read_csv(data / "gpu" / "table.csv")
    measuring.write_csv(data / "gpu" / "table.csv", gpu_measure.TABLE_FIELDS, rows + [
        dict(rows[6], gpu="Half GPU"), dict(rows[0], gpus="2", images_per_s="3400", setup="ddp fp32")])
    (data / "gpu" / "preflight.json").write_text(json.dumps({"gpu": "Test H200", "capability": "9.0", "cuda": "13.0",
                                                             "torch": "2.11.0", "torchvision": "0.26.0", "cpu": "Xeon",
                                                             "python": "3.12", "cores": 16}))
    (data / "gpu" / "smoke.json").write_text(json.dumps({"summary": "gpu-smoke: 1 of 1 checks ok", "checks": [
        {"check": "nd", "ok": True, "seconds": 9.0, "said": "", "earlier": True, "on": "Test H100"}]}))
    text = plot_results(data, figures, results, ())
    assert "| ddp fp32 | 2 | 3400 |" in text and "Half GPU, torch 2.11.0" in text
    assert "Half GPU (compute capability 9.0)" in text and "| nd | ok | 9.0 | passed on Test H100 |" in text
    (data / "gpu" / "table.csv").unlink()  # before the table is measured, the headline gives the earlier sweep's
    text = plot_results(data, figures, results, ())
    assert ("| [What does mixed precision buy on a GPU?](#gpus) | apex O1 fp16 + channels_last at 4500 images/s of "
            "ResNet-50, 2.50x ddp fp32 (the sweep before the GPU table, which is not measured yet) | 1 x Old GPU, "
            "torch 2.11.0 |") in text


def test_plot_results_writes_the_ps_tables_and_figures_from_the_table_data(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    rows = []
    flip, flip_pp = "signflip x6", "signflip x10, p 0.4 per push"

    def add(part, mode, aggregate, attack, top1s, eta="", counts=(80, 0, 0, 0), rate=1000.0):
        """counts: honest and poisoned tensors pushed, rejected (parameters: 10 times as many)."""
        honest, poisoned, honest_rejected, poisoned_rejected = counts
        for seed, top1 in enumerate(top1s):
            per_push = (lambda n: n / 8) if honest != "" else (lambda n: n)
            rows.append({"part": part, "mode": mode, "aggregate": aggregate, "attack": attack, "zeno_eta": eta,
                         "seed": seed, "processes": 10, "epochs": 6, "top1": top1, "honest_pushed": per_push(honest),
                         "honest_rejected": 0, "byzantine_pushed": per_push(poisoned), "byzantine_rejected": 0,
                         "honest_tensors_pushed": honest, "honest_tensors_rejected": honest_rejected,
                         "byzantine_tensors_pushed": poisoned, "byzantine_tensors_rejected": poisoned_rejected,
                         "honest_params_pushed": 10 * honest, "honest_params_rejected": 10 * honest_rejected,
                         "byzantine_params_pushed": 10 * poisoned,
                         "byzantine_params_rejected": 10 * poisoned_rejected,
                         "stale_dropped": 0, "images_per_s": rate, "train_s": 10, **machine})
            if honest == "":  # (nd and ddp count no pushes)
                rows[-1].update({key: "" for key in ps_table.COUNTS})
    add("sync-1v", "sync", "mean", "none", (96, 97, 98))
    add("sync-1v", "sync", "mean", flip, (30, 31, 32), counts=(64, 16, 0, 0))
    add("sync-1v", "sync", "trimmed-mean", "none", (95, 95, 95))
    add("sync-1v", "sync", "trimmed-mean", flip, (94, 94.5, 95), counts=(64, 16, 0, 0))  # above mean's range
    add("sync-1v", "sync", "zenops", "none", (96, 96, 96), counts=(80, 0, 4, 0))
    add("sync-1v", "sync", "zenops", flip, (95, 95.5, 96), counts=(64, 16, 8, 16))
    add("batch", "sync", "zenops, batch 32", "none", (97, 97, 97), counts=(80, 0, 2, 0))
    add("async-1v", "async", "naive-async", "none", (79, 82, 85))
    add("async-1v", "async", "naive-async", flip.replace("6", "2"), (80, 81, 82), counts=(64, 16, 0, 0))
    add("async-1v", "async", "zenops", flip.replace("6", "2"), (90, 91, 92), counts=(64, 16, 6, 12))
    add("zeno", "sync", "mean, 1 step", "3 of 8 flip x4", (40, 45, 50), counts=(60, 36, 0, 0))
    add("zeno", "sync", "zeno, 1 step", "none", (95, 95, 95), counts=(96, 0, 60, 0))
    add("zeno", "sync", "zeno, 1 step", "3 of 8 flip x4", (92, 92, 92), counts=(60, 36, 24, 36))
    add("zeno++", "async", "mean, 1 step", "none", (90, 90, 90))
    add("zeno++", "async", "zeno++, 1 step", "none", (89, 89, 89), counts=(80, 0, 8, 0))
    add("zeno++", "async", "mean, 1 step", flip_pp, (10, "", ""), counts=(48, 32, 0, 0))
    add("zeno++", "async", "zeno++, 1 step", flip_pp, (91, 92, 93), counts=(48, 32, 0, 32))
    for eta, top1s in (("0.1", (70, 71, 72)), ("0", (80, 80, 80)), ("-0.1", (60, 60, 60))):
        add("eta", "sync", "zenops", "N(0,1)", top1s, eta=eta, counts=(64, 16, 16, 8))
    add("eta", "nd", "validation data only", "none", (85, 86, 87), counts=("", "", "", ""))
    add("speed", "ddp", "ddp", "none", (97, 97, 97), counts=("", "", "", ""))
    add("speed", "sync", "ps sync, mean, 1 step", "none", (97, 97, 97), rate=1100.0)
    for row in rows:  # a run that diverged has no top-1 and no counts
        row["diverged"] = int(row["top1"] == "")
        if row["diverged"]:
            row.update({key: "" for key in ps_table.COUNTS})
    with open(data / "ps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=ps_table.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    theirs = []  # ByzFL's benchmark: mean and trimmed mean, no attack and sign flip, 3 seeds
    for rule, attack, top1s in (("mean", "none", (96, 96, 96)), ("trimmed-mean", "none", (95, 95, 95)),
                                ("mean", "signflip", (93, 93.5, 94)), ("trimmed-mean", "signflip", (93, 93.5, 94))):
        theirs += [{"aggregator": rule.title(), "attack": attack, "aggregate": rule, "ps_attack": attack,
                    "byzantine": 2, "honest": 6, "workers": 8, "tolerated_f": 2, "seed": seed, "steps": 150,
                    "batch": 25, "lr": 0.1, "momentum": 0.9, "top1": top1, "diverged": 0, "train_s": 1,
                    "byzfl": "0.0.11", **machine} for seed, top1 in enumerate(top1s)]
    with open(data / "ps_byzfl.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=byzfl_reference.FIELDS)
        writer.writeheader()
        writer.writerows(theirs)
    text = plot_results(data, tmp_path, tmp_path / "RESULTS.md", ("ps", "ps_eta"))
    assert f"| rule | ByzFL: none | ours: none | ByzFL: signflip | ours: {flip} |" in text
    assert ("| `trimmed-mean` | 95.0 (95.0\u201395.0) | 95.0 (95.0\u201395.0) | 93.5 (93.0\u201394.0) | "
            "94.5 (94.0\u201395.0) |") in text
    # ours: the trimmed mean beats mean beyond the spread under the flip; ByzFL's cannot tell them apart
    assert "counts as chance, 10 %): trimmed-mean under signflip (ByzFL +0, ours +1)." in text
    assert f"| aggregation | none | {flip} |" in text
    assert "| `mean` | 97.0 (96.0\u201398.0) | 31.0 (30.0\u201332.0) |" in text
    assert "experiments_sync_single_validator.sh). Final val top-1 (%) after 6 epochs" in text
    assert ("better: trimmed-mean under signflip x6 (+63.5); zenops under signflip x6 (+64.5). Worse: "
            "trimmed-mean under none (-2.0).") in text
    assert "better: zenops under signflip x2 (+10.0). Worse: none." in text  # against naive-async
    assert "| `mean, 1 step` | 90.0 (90.0\u201390.0) | 10.0 (2 of 3 diverged) |" in text
    # zenops' honest rejections against the batch: sync-1v's row at 8, the batch part's at 32
    assert ("| 8 | 6 | 96.0 (96.0\u201396.0) | 5 (5\u20135) | 5 (5\u20135) |\n"
            "| 32 | 6 | 97.0 (97.0\u201397.0) | 2 (2\u20132) |") in text
    # rejections by tensors and by parameters, honest and poisoned apart
    assert "| sync-1v | `zenops` | none | 5 (5\u20135) | 5 (5\u20135) |  |  |" in text
    assert "| sync-1v | `zenops` | signflip x6 | 12 (12\u201312) | 12 (12\u201312) | 100 (100\u2013100) | 100" in text
    assert ("| async-1v | `zenops` (reversed or damped, not dropped) | signflip x2 | 9 (9\u20139) | 9 (9\u20139) |"
            in text)
    # a diverged run counts as chance when a rule is judged against the mean: 92 against 10 (2 of 3 diverged)
    assert f"better: zeno++, 1 step under {flip_pp} (+82.0)." in text
    assert "| 0 | 80.0 (80.0\u201380.0) | 25 (25\u201325) | 50 (50\u201350) |" in text
    assert "| validation data only (nd) | 86.0 (85.0\u201387.0) |  |  |" in text
    assert "| ps sync, mean, 1 step | 3 | 1100 (1100\u20131100) | 1.10 (1.10\u20131.10) |" in text
    # the targets: each rule against itself without the attack, or against the plain rule under the same attack
    assert ("| sync-1v, signflip x6: `zenops` above `mean` beyond the seeds' spread (the attack took `mean` below its "
            "own no-attack top-1) | 95.5 (95.0\u201396.0) against 31.0 (30.0\u201332.0) | yes |") in text
    assert "`mean` at most 50 %" not in text and "at least 90 %" not in text  # (the attack's success alone)
    assert "| sync-1v, signflip x6: `zenops` within 2 points of its own no-attack top-1 | 95.5 against 96.0 | yes |" \
        in text
    assert "| sync-1v, no attack: `zenops` rejects at most 10 % of the honest parameters | 5.0 % | yes |" in text
    assert ("| sync-1v, signflip x6: `zenops` rejects a larger share of the poisoned parameters than of the honest | "
            "100.0 % against 12.5 % | yes |") in text
    assert "| zeno, 3 of 8 flip x4: `zeno` against `mean` under the same attack | not measured |  |" in text
    assert ("| zeno, 3 of 8 flip x4: `zeno` within 2 points of its own no-attack top-1 | 92.0 against 95.0 | no |"
            in text)
    assert ("| async-1v, signflip x2: `zenops` not below `naive-async` beyond the seeds' spread (the attack left "
            "`naive-async` within its spread) | 91.0 (90.0\u201392.0) against 81.0 (80.0\u201382.0) | yes |") in text
    assert "| zeno++, no attack: `zeno++` within 2 points of `mean` | 89.0 against 90.0 | yes |" in text
    assert (f"| zeno++, {flip_pp}: `zeno++` above `mean` beyond the seeds' spread (the attack took `mean` below its "
            f"own no-attack top-1) | 92.0 (91.0\u201393.0) against 10.0 (10.0\u201310.0) | yes |") in text  # (chance)
    assert (f"| zeno++, {flip_pp}: `zeno++` within 2 points of its own no-attack top-1 | 92.0 against 89.0 | yes |"
            in text)
    # the verdicts at one point less and more: zeno's 3-point gap turns yes at 3
    assert ("At one point less, 0 of the \"within\" targets would turn no" in text and
            "At one point more, 1 of the \"within\" targets would turn yes" in text and
            ": zeno, 3 of 8 flip x4: `zeno` within 3 points of its own no-attack top-1." in text)
    assert (tmp_path / "ps.png").exists() and (tmp_path / "ps_eta.png").exists()


def test_plot_results_writes_the_pipeline_tables_and_figure(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    rows, curves = [], []

    def add(replicas, sync, hetero, top1s, rates, reached=("", "", ""), waits=0, step_s=0.01, stages=1,
            schedule="pipedream", part="sync"):
        for seed, (top1, rate, seconds) in enumerate(zip(top1s, rates, reached)):
            rows.append({"part": part, "sync": sync, "hetero": hetero, "schedule": schedule, "microbatches": 1,
                         "batch": 8, "stages": stages, "replicas": replicas, "processes": replicas * stages,
                         "seed": seed, "epochs": 1, "top1": top1, "images_per_s": 8 * rate, "updates_per_s": rate,
                         "step_s": step_s, "train_s": 10, "seconds_to_target": seconds, "target": 90.0,
                         "waits": waits, "full_syncs": 10, "partial_syncs": 50, "connectivity_syncs": 2,
                         "mean_group_size": 2.5, "longest_unconnected_updates": 90, "disagreement": 0.01,
                         "max_applied_staleness": 0, **machine})
            curves.append({"sync": sync, "hetero": hetero, "schedule": schedule, "stages": stages,
                           "replicas": replicas, "seed": seed, "epoch": 1, "seconds": 10, "top1": top1})
    add(8, "allreduce", 0.0, (92, 92.5, 93), (100, 100, 100), (10, 12, 14))
    add(8, "allreduce", 0.02, (92, 92.5, 93), (20, 30, 25), (20, "", 30), waits=30)
    add(8, "preduce", 0.0, (91, 91.5, 92), (100, 95, 90), (10, 10, 10))
    add(8, "preduce", 0.02, (92, 92, 92), (80, 76, 72), (12, 12, 12), waits=3)
    for sync, fast, slow in (("allreduce", (50, 52, 51), (30, 31, 29)), ("preduce", (50, 51, 52), (40, 41, 39))):
        add(2, sync, 0.0, (95, 95.5, 95), fast, (5, 5, 5), stages=2)
        add(2, sync, 0.02, (95, 95, 95), slow, (9, 9, 9), stages=2)
        add(2, sync, 0.0, (94, 94.5, 95.2), fast, (5, 5, 5), stages=2, schedule="1f1b")
    for stages, slow in ((2, {"allreduce": (20, 21, 22), "preduce": (30, 31.5, 33)}), (4, {"allreduce": (10, 10, 10),
                                                                                          "preduce": (12, 15, 18)})):
        for sync in ("allreduce", "preduce"):  # the transformer: faster than allreduce with stragglers, 1.5x and 1.5x
            add(2, sync, 0.0, (30, 31, 32), (40, 40, 40), stages=stages, part="vit")
            add(2, sync, 0.05, (29, 30, 31), slow[sync], stages=stages, part="vit", waits=5)
    for schedule, rates in (("gpipe", {1: 500, 2: 800, 4: 1000}), ("1f1b", {2: 900, 4: 1000})):
        for m, rate in rates.items():
            rows.append({**rows[0], "part": "bubble", "schedule": schedule, "microbatches": m, "batch": 256,
                         "stages": 2, "replicas": 1, "processes": 2, "images_per_s": rate, "seconds_to_target": ""})
    times = []  # the time part at 4 x 1: (top-1 after epochs 1-3) per seed, 10 s an epoch
    for sync, seeds in (("allreduce", ((80, 94, 95.5), (82, 95.1, 96), (81, 94.5, 95))),  # 95.0 at 30, 20, 30 s
                        ("preduce", ((90, 95.2, 96.2), (91, 95.6, 96.6), (90, 95.0, 96.4))),  # 96.4: 20 s each
                        ("hetpipe", ((95.3, 94, 94.1), (93, 94, 94.2), (95, 94.1, 94.0)))):  # 2 of 3 reach 95.0
        for seed, top1s in enumerate(seeds):
            times += [{"sync": sync, "hetero": 0.02, "schedule": "pipedream", "stages": 1, "replicas": 4, "seed": seed,
                       "epoch": epoch, "seconds": 10 * epoch, "top1": top1, **machine}
                      for epoch, top1 in enumerate(top1s, 1)]
    for name, fields, table_rows in (("pipeline.csv", pipeline_measure.FIELDS, rows),
                                     ("pipeline_curves.csv", pipeline_measure.CURVE_FIELDS, curves),
                                     ("pipeline_time.csv", pipeline_measure.TIME_FIELDS, times)):
        with open(data / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(table_rows)
    text = plot_results(data, tmp_path, tmp_path / "RESULTS.md", ("pipeline",))
    assert ("| 8 x 1 | pipedream | `allreduce` | none | 3 | 100 (100–100) | 12.0 (10.0–14.0) | 92.50 (92.00–93.00) "
            "|  | 0.0 | 0.0100 |") in text
    assert "| 8 x 1 | pipedream | `allreduce` | 0.02 s | 3 | 25 (20–30) | 25.0 (20.0–30.0) (2 of 3) |" in text
    assert "| 8 x 1 | pipedream | `preduce` | 0.02 s | 3 | 76 (72–80) | 12.0 (12.0–12.0) | 92.00 (92.00–92.00) |" \
        " 2.50 |" in text
    # the model: 8 trainers on 2 cores, c 0.01 s, X 0.02 s
    allreduce = 0.01 / pipeline_measure.expected_step("allreduce", 0.01, 8, 1, 0, 0.02, 8, 2)  # (steps: not read)
    assert f"| 8 x 1 | pipedream | `allreduce` | 8 / 2 | 0.0100 | 0.02 | 0.50 | {allreduce:.2f} | 0.25 (0.20–0.30) |" \
        in text
    assert "| 8 x 1, pipedream, no stragglers: `preduce` within 10 % of `allreduce` | 0.95 (0.90–1.00) | yes |" in text
    assert "| 2 x 2, pipedream, stragglers: `preduce` faster than `allreduce` beyond the seeds' spread | " \
        "40.0 (39.0–41.0) vs 30.0 (29.0–31.0) updates/s (1.33x; model " in text
    assert "| 2 x 2, `allreduce`: pipedream's top-1 within the seeds' spread of 1f1b's | 95.17 (95.00–95.50) vs " \
        "94.57 (94.00–95.20) | yes |" in text
    assert "8 x 1, pipedream, stragglers: the model within 15 % for every method | `allreduce` " in text
    assert "| 1 | 0.50 | 0.62 | 500 (0.50) |  |" in text  # (1/2) / (4/5)
    assert "| 2 | 0.33 | 0.83 | 800 (0.80) | 900 (0.90) |" in text
    assert "| 2 x 4 | `preduce` | 0.05 s | 3 | 15 (12–18) | 30.00 (29.00–31.00) | 5.0 | " in text  # (vit)
    assert "| 2 x 2 | `allreduce` | none | 3 | 40 (40–40) | 31.00 (30.00–32.00) | 0.0 |  |  |" in text
    assert ("With stragglers, `preduce` over `allreduce`, updates/s seed by seed: 1.50x (1.50–1.50) at 2 x 2; "
            "1.50x (1.20–1.80) at 2 x 4.") in text
    assert "shared by up to 4 processes; " in text and "; the transformer (vit_tiny): 1.50x (2 x 2) and 1.50x (2 x 4)" \
        in text
    assert "| 8 x 1 | pipedream | `allreduce` | none | 3 | 100 (100–100) |" in text  # (lenet's table: no vit row)
    assert "| 2 x 4 | pipedream | `preduce`" not in text
    # the best final top-1 is preduce's 96.4: the target 95.0, which preduce reaches first, in 20 s every seed
    assert ("| 4 x 1 | 95.0 | 26.7 (20.0–30.0) s; ends at 95.50 (95.00–96.00) | **first**: 20.0 (20.0–20.0) s; "
            "ends at 96.40 (96.20–96.60) | 10.0 (10.0–10.0) s (2 of 3 seeds); ends at 94.10 (94.00–94.20) |") in text
    assert ("Beyond the seeds' spread (the ranges do not overlap) or within it: 4 x 1: preduce first within the "
            "spread of allreduce's time, allreduce and hetpipe ending below preduce beyond it.") in text
    assert ("time to a top-1 near the best final one: 4 x 1 to 95.0 %: preduce first (preduce 20.0 s, final 96.4 %; "
            "allreduce 26.7 s, final 95.5 %; hetpipe 2 of 3 seeds reach it, final 94.1 %)") in text
    assert (tmp_path / "pipeline.png").exists()
    assert ("| [What does partial reduce buy over allreduce?](#pipelined-replicas-allreduce-partial-reduce-ad-psgd-"
            "hetpipe) | PipeDream with stragglers (X "
            "sized to SD-PIPE's c / X): partial reduce at 1.33x (2 x 2) allreduce's updates/s, on 2 CPU cores "
            "shared by up to 4 processes; ") in text  # (RESULTS.md's headline)


def test_the_time_part_reads_scores_within_epochs_and_the_data_part_sets_streams_beside_shards(tmp_path):
    """A run directory's snapshots and epoch ends in seconds of training (evaluation left out); the time table's
    first at a snapshot's time and its T; the data part's streams against the time part's shards, per method."""
    from scripts.figures.pipeline import render_data, render_time

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text("epoch,split,loss,top1,top5,images_per_s,data_s,epoch_s,lr\n"
                                     "1,train,1,50,90,1,0,10,0.1\n1,val,1,80,99,1,0,3,0.1\n"
                                     "2,train,1,60,90,1,0,10,0.1\n2,val,1,85,99,1,0,3,0.1\n")
    (run / "snapshots.csv").write_text("epoch,seconds,loss,top1,top5\n1,5.000,1,70,99\n2,5.000,1,82,99\n")
    assert pipeline_measure.timeline(run) == [(1, 5.0, 70.0, 1), (1, 10.0, 80.0, 0), (2, 15.0, 82.0, 1),
                                              (2, 20.0, 85.0, 0)]
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}

    def points(sync, seeds, name):
        rows = [{"sync": sync, "hetero": 0.02, "schedule": "pipedream", "stages": 1, "replicas": 8, "seed": seed,
                 "epoch": epoch, "seconds": seconds, "top1": top1, "snapshot": snapshot, **machine}
                for seed, top1s in enumerate(seeds) for (epoch, seconds, snapshot), top1 in
                zip([(1, 5, 1), (1, 10, 0), (2, 15, 1), (2, 20, 0)], top1s)]
        path = tmp_path / name
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=pipeline_measure.TIME_FIELDS)
            if f.tell() == 0:
                writer.writeheader()
            writer.writerows(rows)

    points("allreduce", [(90, 94, 95, 96), (90, 93, 95, 96.2), (91, 94, 95.5, 96.1)], "pipeline_time.csv")
    points("preduce", [(95.6, 96, 96, 96.5), (95.7, 96, 96, 96.4), (95.5, 96, 96, 96.6)], "pipeline_time.csv")
    points("allreduce", [(90, 94, 95, 96), (90, 93, 95, 96.2), (91, 94, 95.5, 96.1)], "pipeline_data.csv")
    points("preduce", [(90, 95.6, 96, 96.3), (91, 95.5, 96, 96.4), (90, 95.7, 96, 96.5)], "pipeline_data.csv")
    text = render_time.render(tmp_path, tmp_path)["pipeline-time"]
    assert ("| 8 x 1 | 95.5 | 18.3 (15.0–20.0) s; ends at 96.10 (96.00–96.20) | **first**: 5.0 (5.0–5.0) s; ends at "
            "96.50 (96.40–96.60) |") in text  # (preduce at a snapshot: 5 s into the first epoch)
    assert "every T seconds of training (T a quarter of allreduce's epoch without stragglers: 5 s at 8 x 1)" in text
    assert (tmp_path / "pipeline_time.png").exists()
    text = render_data.render(tmp_path)["pipeline-data"]
    assert ("| 8 x 1 | `preduce` | 5.0 (5.0–5.0) s | 96.50 (96.40–96.60) | 10.0 (10.0–10.0) s | 96.40 (96.30–96.50) | "
            "time higher, beyond the spread; final top-1 lower, within the spread |") in text
    assert ("| 8 x 1 | `allreduce` | 18.3 (15.0–20.0) s | 96.10 (96.00–96.20) | 18.3 (15.0–20.0) s | "
            "96.10 (96.00–96.20) | time the same; final top-1 the same |") in text
    assert "at 8 x 1 to 95.5 %, preduce first on shards, preduce first on streams" in text


def test_plot_results_writes_the_sharding_table_and_figure(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    p, rows = 2 ** 20, []
    for (arch, size, p), (n, rates) in itertools.product((("resnet50", 32, 2 ** 20), ("vit_tiny", 28, 2 ** 18)),
                                                          ((1, (100, 99, 98, 97)), (2, (180, 150, 160, 90)))):
        for mode, rate in zip(sharding_measure.MODES, rates):
            model = sharding_measure.model_bytes(mode, p, n)
            rows.append({"shard": mode, "zero": sharding_measure.ZERO[mode], "processes": n, "arch": arch,
                         "image_size": size, "batch": 16, "parameters": p, "param_bytes": int(model) // 3,
                         "grad_bytes": int(model) // 3, "optimizer_bytes": int(model) // 3,
                         "state_bytes": 3 * (int(model) // 3), "model_bytes": model,
                         "peak_rss_bytes": 700 * 2 ** 20, "peak_cuda_bytes": "", "images_per_s": rate,
                         "comm_bytes_model": sharding_measure.comm_bytes(mode, p, n), "top1": 10.0, **machine})
    with open(data / "sharding.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sharding_measure.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    text = plot_results(data, tmp_path, tmp_path / "RESULTS.md", ("sharding",))  # (its PNG; both sections)
    assert "| resnet50 | `none` (DDP) | 1 | 4.0 | 4.0 | 4.0 | 12.0 | 12.0 | 700 | 100.0 | 1.00 | 0 |" in text
    assert "| resnet50 | `full` (ZeRO-3) | 2 | 2.0 | 2.0 | 2.0 | 6.0 | 6.0 | 700 | 90.0 | 0.50 | 6 |" in text
    assert "| resnet50 | `optimizer` (ZeRO-1) | 2 | 3.3 | 3.3 | 3.3 | 10.0 | 10.0 | 700 | 150.0 | 0.83 | 6 |" in text
    assert "| vit_tiny | `full` (ZeRO-3) | 2 | 0.5 | 0.5 | 0.5 | 1.5 | 1.5 | 700 | 90.0 | 0.50 | 2 |" in text
    assert "resnet50 (1.0 M parameters) at 32 px; vit_tiny (0.3 M parameters) at 28 px, -b 16 per process" in text
    assert "Measured sum over the model: `none` 1.00-1.00; `optimizer` 1.00-1.00" in text
    # RESULTS.md's table: the most processes, each model's bytes against ddp's
    assert "| resnet50 | `full` (ZeRO-3) | 2 | 6.0 | 0.50 | 0.50 | 0.50 |" in text
    assert "| vit_tiny | `grad-op` (ZeRO-2) | 2 | 2.0 | 0.67 | 0.67 | 0.89 |" in text
    assert "| resnet50 | `none` (DDP) | 1 |" in text and "| resnet50 | `none` (DDP) | 1 | 12.0 |" not in text
    assert ("FSDP (full) keeps 0.50 (resnet50, 2 processes) and 0.50 (vit_tiny, 2 processes) of DDP's weights, "
            "gradients and momentum per rank, measured") in text


def test_the_hardware_section_names_each_parts_machine_from_its_data(tmp_path):
    """RESULTS.md's hardware: one line when every part ran on one machine, else a row per part, each from the
    part's own files (timings.csv's row for a part whose files record none)."""
    from scripts.figures.rendering import hardware_line

    header = "kind,cpu,cores,gpu,torch\n"
    (tmp_path / "scaling.csv").write_text(header + "recipe,AMD EPYC,2,,2.14.1\n")
    (tmp_path / "timings.csv").write_text("part,seconds,cpu,cores,gpu,torch\ncurves,1,AMD EPYC,2,,2.14.1\n")
    assert hardware_line(tmp_path) == ("CPU AMD EPYC (2 cores), GPU none: make figures' parts ran "
                                         "CPU-only (the GPU rows name their GPU), torch 2.14.1.")
    (tmp_path / "recovery.json").write_text(json.dumps({"hardware": {"cpu": "Xeon", "cores": 2, "gpu": None,
                                                                      "torch": "2.14.1"}}))
    text = hardware_line(tmp_path)
    assert text.startswith("The parts ran on 2 machines")
    assert "it: AMD EPYC (2 cores): scaling, curves; Xeon (2 cores): recovery." in text


def test_the_cluster_verdict_counts_the_links_below_the_ceiling_and_names_each(tmp_path):
    """cluster_bandwidth.csv as measure.py writes it: a link counts where its rate is at most half the unshaped
    bandwidth at its node count, and holds within 10 % of its rate; every shaped link is named with its share."""
    from scripts.figures.cluster import measure as cluster_measure
    from scripts.figures.cluster import render as cluster_render

    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    rows = []
    for nodes, rate, bits, busbw in ((2, "100mbit", 1e8, 95e6), (2, "1gbit", 1e9, 850e6), (2, "3gbit", 3e9, 2.9e9),
                                     (2, "none", "", 4e9)):
        for size, seconds in ((8, 0.0002), (2**20, 0.01), (2**26, 0.5)):
            rows.append({"nodes": nodes, "rate": rate, "rate_bits": bits, "size_bytes": size, "seconds": seconds,
                         "algbw_bits": busbw, "busbw_bits": busbw, "repeats": 5, **machine})
    measuring.write_csv(tmp_path / "cluster_bandwidth.csv", cluster_measure.FIELDS, rows)
    sections = cluster_render.render(tmp_path, tmp_path, [])
    assert (tmp_path / "cluster_bandwidth.png").exists()
    text = sections["cluster-bandwidth"]
    assert "| 2 | 1gbit | 850 | 850 | 85% | 0.20 |" in text
    assert "| 2 | unshaped | 4,000 | 4,000 | (ceiling) | 0.20 |" in text
    # 3gbit is 75 % of the 4 Gbit/s ceiling: named, not counted; 1gbit at 85 % misses the 10 %
    assert "within 10% of the rate in 1 of 2 links (the farthest: 1gbit at 2 nodes, 85% of it)" in text
    assert "100mbit at 2 nodes 2% (95%); 1gbit at 2 nodes 25% (85%); 3gbit at 2 nodes 75% (97%)." in text
    assert "1,448 bytes of payload in a 1,514-byte frame (95.6%), 93.6% when the ring's ACKs share the link" in text
    assert sections["cluster"].startswith("gloo all-reduce bus bandwidth within 10% of the link's rate for 1 of 2 "
                                          "links below the CPU's ceiling (4,000 Mbit/s at 2 nodes)")


def test_compression_on_the_cluster_answers_per_link_beyond_the_seeds_spread(tmp_path):
    """The summary's step columns and the headline: a method is faster only beyond the seeds' spread of steps."""
    from scripts.figures.compression import cluster, render, render_cluster

    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    rows, curves = [], []
    # (link, ratio, the step with the wire unpriced, steps): at 10 Gbit/s the CPU's all-reduce, +20 % over the
    # step alone, is more than half the wire's 25 %
    for link, ratio, unpriced, steps in (
            ("1 Gbit/s Ethernet", 2.5, 0.032, {"none": (90, 95, 100), "fp16": (50, 55, 60)}),
            ("10 Gbit/s Ethernet", 0.25, 0.036, {"none": (30, 32, 34), "fp16": (29, 31, 33)})):
        for method, times in steps.items():
            for seed, step in enumerate(times):
                rows.append({"method": method, "error_feedback": 0, "link": link, "link_bits": 1e9, "nodes": 2,
                             "seed": seed, "ratio": ratio, "rate_bits": 3e7, "alone_step_s": 0.03,
                             "bytes_per_step": 324008 if method == "none" else 162004, "step_s": step / 1e3,
                             "unpriced_step_s": unpriced, "train_s": step, "top1": 98.0, "epochs": 2,
                             "global_batch": 64, "arch": "lenet", **machine})
                curves += [{"method": method, "error_feedback": 0, "link": link, "nodes": 2, "seed": seed,
                            "epoch": epoch, "train_s": epoch * step / 10, "top1": 95.0 + epoch} for epoch in (1, 2)]
    measuring.write_csv(tmp_path / "compression_cluster.csv", cluster.FIELDS, rows)
    measuring.write_csv(tmp_path / "compression_cluster_curves.csv", cluster.CURVE_FIELDS, curves)
    measuring.write_csv(tmp_path / "compression_cluster_skipped.csv", cluster.SKIPPED_FIELDS, [
        {"link": "EDR InfiniBand (HAL)", "link_bits": 1e11, "nodes": 2, "ratio": 0.026, "rate_bits": 3e9,
         "ceiling_bits": 5e9}])
    # 97 % at the second epoch in every run: training seconds 2 x step / 10
    assert render_cluster.headline(tmp_path) == [
        "to 97 % top-1 on links sized as 1 Gbit/s Ethernet is to ResNet-50 on V100 nodes, the soonest against "
        "uncompressed DDP: fp16 1.73x sooner at 2 nodes",
        "to 97 % top-1 on links sized as 10 Gbit/s Ethernet is to ResNet-50 on V100 nodes, the soonest against "
        "uncompressed DDP: fp16 1.03x sooner at 2 nodes (within the seeds' spread) (this machine's CPU, not the link, "
        "sets much of the step there)",
        "on EDR InfiniBand (HAL) the wire is 2.6% of a node's computing time: at most 2.5% of a step to gain (not "
        "emulated: beyond this machine's ceiling)"]
    text = render_cluster.render(tmp_path)["compression-cluster"]
    # the model: 30 ms alone + 162,004 bytes at 30 Mbit/s (93.6 % payload); 96 % after epoch 1, 97 % after 2, 98 never
    assert ("| fp16 | 162,004 | 55.0 (50.0–60.0) | 76.2 | 1.73x (beyond the spread) | 5.5 (5.0–6.0) | 11.0 (10.0–12.0) "
            "| not reached (3 of 3) | 98.00 (98.00–98.00) |") in text
    assert "| fp16 | 162,004 | 31.0 (29.0–33.0) | 76.2 | 1.03x | 3.1 (2.9–3.3) |" in text
    assert ("(measured: its step is +217% over its step alone; with the wire unpriced, +7%)." in text and
            "(measured: its step is +7% over its step alone; with the wire unpriced, +20%, more than 50% of the "
            "wire's share: this machine's CPU, not the link, sets much of these steps)" in text)
    summary = render.compression_summary([{"method": "none", "error_feedback": "0", "processes": "2", "seed": "0",
                                           "top1": "98.0", "bytes_per_step": "324008", "compression_ratio": "1.0",
                                           "arch": "lenet", "epochs": "2", "global_batch": "64"}],
                                         measuring.read_csv(tmp_path / "compression_cluster.csv"))
    assert "step vs none: 10 Gbit/s Ethernet, 2 nodes | step vs none: 1 Gbit/s Ethernet, 2 nodes |" in summary
    assert "| none | 324,008 | 1.00 | 98.00 | 1.00x | 1.00x |" in summary


def test_the_clusters_scaling_answer_leaves_out_the_rows_the_cpu_paced(tmp_path):
    """scaling's render_cluster: a stand-in row whose all-reduce with the wire unpriced takes more than half the
    wire's modelled time is marked (CPU), and the answer takes the most nodes whose row measures the link."""
    from scripts.figures.scaling import cluster, render_cluster

    machine = {"cpu": "Test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    # (link, nodes, step, unpriced, model) in ms, a node's step alone 20 ms
    measured = [("1 Gbit/s Ethernet", 1, 20.5, 20.5, 20.0), ("1 Gbit/s Ethernet", 2, 66.0, 24.0, 70.0),
                ("1 Gbit/s Ethernet", 4, 72.0, 36.0, 71.0), ("1 Gbit/s Ethernet", 8, 90.0, 50.0, 72.0)]
    measuring.write_csv(tmp_path / "scaling_cluster.csv", cluster.STAND_IN_FIELDS, [
        {"link": link, "link_bits": 1e9, "nodes": nodes, "ratio": 2.5 if nodes > 1 else 0, "rate_bits":
         5e7 if nodes > 1 else "", "compute_s": 0.02, "bytes_per_step": 324008, "steps": 40, "step_s": step / 1e3,
         "unpriced_s": unpriced / 1e3, "model_s": model / 1e3, **machine}
        for link, nodes, step, unpriced, model in measured])
    measuring.write_csv(tmp_path / "scaling_cluster_training.csv", cluster.TRAINING_FIELDS, [])
    measuring.write_csv(tmp_path / "scaling_cluster_curves.csv", cluster.CURVE_FIELDS, [])
    text = render_cluster.render(tmp_path, tmp_path)["scaling-cluster"]
    assert "| 1 Gbit/s Ethernet | 4 | 50.0 | 250.0% | 72.0 | 71.0 | 36.0 | 28% | 28% |" in text  # 16 of 51 ms
    assert "| 1 Gbit/s Ethernet | 8 | 50.0 | 250.0% | 90.0 | 72.0 | 50.0 | 22% (CPU) | 28% |" in text  # 30 of 52
    assert "Here: 1 Gbit/s Ethernet at 8 nodes, the wire unpriced 30.0 ms against its modelled 52.0 ms." in text
    assert [render_cluster.trusted(r) for r in render_cluster.read_csv(tmp_path / "scaling_cluster.csv")] == [
        True, True, True, False]
    (tmp_path / "cluster").mkdir()
    for name in ("seed_throughput", "seed_io"):
        (tmp_path / "cluster" / f"{name}.csv").write_text((ROOT / "figures" / "data" / "cluster" /
                                                           f"{name}.csv").read_text())
    assert ("on the virtual cluster, links sized as 1 Gbit/s Ethernet, at 2, 4 nodes: 30%, 28% efficiency (model "
            "29%, 28%; a node's computation stood in for)") in render_cluster.headline(tmp_path)  # (not at 8: CPU)

def test_the_seed_tutorials_points_beside_the_model_say_which_miss_and_why(tmp_path):
    """render_seed: the 4-GPU row is the model's input; a miss with the storage asked beyond what it delivered
    may be the storage, one below it is not."""
    from scripts.figures.cluster import seed
    from scripts.figures.scaling import render_cluster

    source = {"repo": seed.REPO, "commit": seed.COMMIT, "path": "p"}
    (tmp_path / "cluster").mkdir()
    runs = [(4, 3003.3, "Feb09_x_gpux4"), (8, 5806.7, "Feb08_x_gpux8"), (32, 19458.5, "Feb12_x_gpux32"),
            (64, 33132.0, "Feb12_y_gpux64")]
    measuring.write_csv(tmp_path / "cluster" / "seed_throughput.csv", seed.THROUGHPUT_FIELDS, [
        {"run": run, "gpus": gpus, "batch_per_gpu": 208, "opt_level": "O2", "images_per_s": rate, "points": 90,
         "images_per_s_per_gpu": rate / gpus, "step_s": 0.277, **source} for gpus, rate, run in runs])
    measuring.write_csv(tmp_path / "cluster" / "seed_io.csv", seed.IO_FIELDS, [
        {"file": "bandwidth_gpux64_cpu20_feb", "measures": "bandwidth", "gpus": 64, "read": 3.3132e9, "write": 0,
         "units": "bytes/s", "points": 60, **source}])  # 100 kB an image; at most 3.31 GB/s
    text = render_cluster.render(tmp_path, tmp_path)["scaling-seed"]
    assert (tmp_path / "scaling_seed.png").exists()
    assert "| 4 | 3,003 | 751 | 3,004 | (its input) | (one node) | 0.30 | 0.30 |" in text
    assert "The model is within 15% of the published images/s at 8 GPUs" in text
    assert "at 32 GPUs it is +20%, where neither the wire nor the storage (asked for 1.95 GB/s) explains" in text
    assert "at 64 GPUs it is +41%, and it would ask the storage for 4.67 GB/s, more than it delivered" in text


def test_the_seed_tutorials_accuracy_is_read_at_each_runs_end_and_named_with_the_set_up_that_trains_as_it_did(
        tmp_path):
    """seed.py reads RESULTS.md's 'Last val:' lines, with and without the best epoch in brackets; the GPU long form
    gives the 90-epoch runs' range (a run cut short, or one with no such line, is left out) and the command here."""
    from scripts.figures.cluster import seed
    from scripts.figures.gpu import render_context

    assert seed.LAST_VAL.search("Last val: \nPrec@1 75.631 (76.154) Prec@5 92.578 (92.957)").groups() == (
        "75.631", "76.154", "92.578")
    assert seed.LAST_VAL.search("Prec@1 76.292 Prec@5 93.028 ").groups() == ("76.292", None, "93.028")
    (tmp_path / "cluster").mkdir()
    source = {"repo": seed.REPO, "commit": seed.COMMIT, "path": "RESULTS.md"}
    measuring.write_csv(tmp_path / "cluster" / "seed_times.csv", seed.TIME_FIELDS, [
        {"run": "r2", "gpus": 2, "batch_per_gpu": 208, "epochs": 81, "seconds": 1, "measured": "yes", "top1": 70.0,
         "best_top1": 70.0, "top5": 90, **source},
        {"run": "r4", "gpus": 4, "batch_per_gpu": 208, "epochs": 90, "seconds": 1, "measured": "yes", "top1": 76.24,
         "best_top1": 76.24, "top5": 93, **source},
        {"run": "r16", "gpus": 16, "batch_per_gpu": 208, "epochs": 90, "seconds": 1, "measured": "yes",
         "top1": 75.631, "best_top1": 76.154, "top5": 92, **source},
        {"run": "r64", "gpus": 64, "batch_per_gpu": 208, "epochs": 90, "seconds": 1, "measured": "yes", "top1": "",
         "best_top1": "", "top5": "", **source}])
    assert render_context.seed_accuracy(tmp_path) == (
        " The seed's ResNet-50 runs ended their 90 epochs at a validation top-1 of 75.63 to 76.24 % on 4 to 16 GPUs, "
        "as its RESULTS.md gives them; its apex O2 in fp16 at batch 208 a GPU is `recipes/apex/train.py --opt-level "
        "O2 --amp-dtype fp16 -b 208` here.")
    assert render_context.seed_accuracy(tmp_path / "nowhere") == ""


def test_the_input_pipeline_says_what_the_seeds_storage_delivered_and_what_folders_and_shards_would_ask(tmp_path):
    """The seed's 64-GPU run with both an IO file of bandwidth and one of operations, over its images/s; and its
    images/s times this loader's read calls an image, of a folder and of shards (io_storage.csv)."""
    from scripts.figures.cluster import seed
    from scripts.figures.io import render as io_render

    (tmp_path / "cluster").mkdir()
    source = {"repo": "r", "commit": "c", "path": "p"}
    measuring.write_csv(tmp_path / "cluster" / "seed_io.csv", seed.IO_FIELDS, [
        {"file": "bandwidth_gpux64_cpu20_may01", "measures": "bandwidth", "gpus": 64, "read": 4e9, **source},
        {"file": "iops_gpux64_cpu20_may01", "measures": "iops", "gpus": 64, "read": 30000, **source},
        {"file": "bandwidth_gpux64_cpu20_feb", "measures": "bandwidth", "gpus": 64, "read": 1e9, **source}])
    (tmp_path / "cluster" / "seed_throughput.csv").write_text(
        "run,gpus,images_per_s\nMay01_x_gpux64,64,20000\nFeb12_x_gpux64,64,10000\nMay01_y_gpux4,4,3000\n")
    rows = [{"source": "folder", "reads_per_image": "2.0"}, {"source": "shards", "reads_per_image": "1.0"}]
    text = io_render.seed_sentence(io_render.seed_storage(tmp_path), rows)
    assert "trained 20,000 images/s and read 4.00 GB/s in 30,000 operations/s" in text  # (Feb: no operations file)
    assert "200.0 kB and 1.50 operations an image" in text
    assert "40,000 read calls/s of a folder (2.00 an image" in text and "20,000 of shards (1.00 an image" in text
    (tmp_path / "cluster" / "seed_io.csv").unlink()
    assert io_render.seed_storage(tmp_path) is None


def test_a_papers_verdict_follows_the_data():
    """papers.py: zenops is said to hold under an attack only where it ends above the plain rule beyond the seeds'
    spread; where both diverge, or their ranges overlap, it is not."""
    from scripts.figures import papers

    def rows(zenops, mean):
        return [{"part": "sync-1v", "aggregate": rule, "attack": "signflip x6", "seed": str(seed),
                 "top1": "" if top1 is None else str(top1), "diverged": "1" if top1 is None else "0"}
                for rule, tops in (("zenops", zenops), ("mean", mean)) for seed, top1 in enumerate(tops)]

    held = papers.ps_papers(rows([94.0, 95.0, 93.5], [None, None, None]))["ZenoPS"]
    assert "sync signflip x6: zenops 94.2 (93.5–95.0) %, mean diverged" in held[0] and "1 of 1" in held[3], held
    for zenops, mean in (([None, None, None], [None, None, None]), ([90.0, 94.0, 93.0], [91.0, 92.0, 89.0])):
        said = papers.ps_papers(rows(zenops, mean))["ZenoPS"]
        assert "signflip" not in said[0] and "0 of 1" in said[3], said


def test_the_masked_language_models_section_names_the_first_to_the_loss_every_method_reaches(tmp_path):
    """render_bert: the target is the highest final training loss of any run with stragglers; the first
    is the method whose every seed gets there soonest on average; allreduce without stragglers is shown, not
    ranked."""
    from scripts.figures.pipeline import render_bert

    machine = {"cpu": "test CPU", "cores": 2, "gpu": "", "torch": "2.14.1"}
    losses = {("allreduce", 0.0): (5.0, 4.5, 4.0), ("allreduce", 0.2): (5.2, 4.8, 4.3),
              ("preduce", 0.2): (4.9, 4.4, 4.1), ("hetpipe", 0.2): (5.5, 5.0, 4.6)}  # (the target: hetpipe's 4.62)
    rows = [{"sync": sync, "hetero": hetero, "stages": 4, "replicas": 2, "seed": seed, "epoch": epoch,
             "seconds": 10 * epoch * (1 + hetero) + seed, "train_loss": loss + 0.01 * seed, "val_loss": loss + 0.5,
             "top1": 10 + epoch, **machine}
            for (sync, hetero), curve in losses.items() for seed in range(3) for epoch, loss in enumerate(curve, 1)]
    with open(tmp_path / "pipeline_bert.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=pipeline_measure.BERT_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    text = render_bert.render(tmp_path, tmp_path)["pipeline-bert"]
    assert "| **first**: `preduce` | 25.0 (24.0–26.0) |" in text, text  # (epoch 2 at 4.4: 24 s + the seed)
    assert "| `allreduce` without stragglers |" in text and "any run with stragglers, 4.620" in text, text
    assert "preduce's time is beyond the seeds' spread of allreduce's" in text, text
    assert (tmp_path / "pipeline_bert.png").exists()
