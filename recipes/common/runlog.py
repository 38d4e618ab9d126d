"""Rank-0 output of a run: console lines, tqdm bars, metrics.csv, TensorBoard, JSON."""

import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from recipes.common import RecipeError, checkpoint, data, models

CSV_FIELDS = ["epoch", "split", "loss", "top1", "top5", "images_per_s", "data_s", "epoch_s", "lr",
              "process_images_per_s", "skipped_steps", "read_mb", "read_calls"]


class RunLog:
    """Writes the run directory; on ranks other than 0 every method does nothing."""

    def __init__(self, args, enabled=True):
        self.out, self.enabled = Path(args.out), enabled
        # the data folder and the model before --out: a wrong DIR or --arch is the error a user sees, not a clash
        # with an earlier run (checked on every rank after the process group is made, so that each finds it at
        # once and says so before torchrun stops the others)
        if getattr(args, "data", None) and not getattr(args, "synthetic", False):
            data.check_folder(args)
        if getattr(args, "arch", None):
            models.check_arch(args.arch, getattr(args, "image_size", 224))
        fresh = not (args.evaluate or args.resume or getattr(args, "auto_resume", False))
        if fresh and (self.out / "checkpoint.pt").exists():
            # checked on every rank, so all of them stop, and the old checkpoint stays intact
            raise RecipeError(f"{self.out} already holds a checkpoint: continue it with --auto-resume, "
                              f"or choose another --out")
        self.bar, self.writer, self.profiler, self.train_rates = None, None, None, []
        self.skipped_steps = 0  # by the loss scaler, over the run's epochs (None: apex.amp's, not counted)
        self.start, self.args, self.opened = time.perf_counter(), dict(vars(args)), False
        if not enabled:
            return
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0 and not getattr(args, "auto_resume", False):
            self.print("warning: torchrun may restart this run (--max-restarts), but without --auto-resume a "
                       "restart starts again from epoch 1, or stops if a checkpoint was written")

    def make_run_dir(self):
        """The run directory and its args.json, made when the run first writes into it: a run that stops at bad
        input leaves no --out behind."""
        if self.enabled and not self.opened:
            self.opened = True
            self.out.mkdir(parents=True, exist_ok=True)
            self.write_json("args.json", self.args)

    def start_metrics(self, start_epoch):
        """metrics.csv anew, or on resume kept up to the checkpoint's epoch."""
        if not self.enabled:
            return
        self.make_run_dir()
        from torch.utils.tensorboard import SummaryWriter  # slow import: rank 0 only

        self.writer = SummaryWriter(self.out)
        path = self.out / "metrics.csv"
        rows = []
        if start_epoch > 0 and path.exists():
            with open(path, newline="") as f:
                rows = [row for row in csv.DictReader(f) if int(row["epoch"]) <= start_epoch]
        self.skipped_steps = sum(int(row.get("skipped_steps") or 0) for row in rows if row["split"] == "train")
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, CSV_FIELDS)
            writer.writeheader()
            writer.writerows(rows)

    def start_profiler(self, steps, device):
        """--profile N: torch.profiler records optimizer steps 3 to N+2 (after the loader's and the
        compiler's start-up) into <out>/profile: Chrome traces, which Perfetto and chrome://tracing read."""
        if not (self.enabled and steps):
            return
        # kineto's own log: level 4 would show a failed GPU query on a CPU-only machine as an error, 5 its
        # "USDT: profiler_start/stop" markers; 6 shows none of them
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        folder = self.out / "profile"
        write_trace = torch.profiler.tensorboard_trace_handler(str(folder))

        def written(profiler):
            write_trace(profiler)
            self.print(f"profile of {steps} steps written to {folder}")

        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        steps_to_record = torch.profiler.schedule(wait=1, warmup=1, active=steps, repeat=1)
        self.profiler = torch.profiler.profile(activities=activities, schedule=steps_to_record, on_trace_ready=written)
        self.profiler.start()

    def profile_step(self):
        """The profiler's clock: call after every optimizer step."""
        if self.profiler is not None:
            self.profiler.step()

    def print(self, message):
        if self.enabled:
            tqdm.write(message, file=sys.stdout)
            sys.stdout.flush()

    def progress(self, iterable, description):
        """A progress bar on a terminal; without one (SLURM, nohup, a pipe) step() prints plain lines instead."""
        self.bar = tqdm(iterable, desc=description, disable=not (self.enabled and sys.stderr.isatty()),
                        leave=False, dynamic_ncols=True, file=sys.stderr)
        return self.bar

    def step(self, epoch, step, steps_per_epoch, loss, lr, images_per_s, world_size):
        """Every --print-freq steps: the loss on the bar (or one line without a terminal), the loss and
        learning rate in TensorBoard. epoch and step count from 0; images_per_s: this process's, or None; the
        line gives it and world_size times it."""
        if not self.enabled:
            return
        loss = loss.item()
        if self.bar.disable:
            rate = f"  {images_per_s * world_size:.1f} images/s ({images_per_s:.1f} a process)" \
                if images_per_s else ""
            self.print(f"epoch {epoch + 1} step {step + 1}/{steps_per_epoch}  loss {loss:.4f}{rate}  lr {lr:.4g}")
        else:
            self.bar.set_postfix(loss=f"{loss:.4f}")
        self.writer.add_scalar("train/step_loss", loss, epoch * steps_per_epoch + step)
        self.writer.add_scalar("train/step_lr", lr, epoch * steps_per_epoch + step)

    def epoch(self, epoch, split, stats, lr):
        """One row of metrics.csv and one console line; epochs count from 1."""
        if not self.enabled or stats is None or stats["images"] == 0:  # (no EMA; or resumed at an epoch's end)
            return
        row = {"epoch": epoch, "split": split, "loss": f"{stats['loss']:.6f}", "top1": f"{stats['top1']:.4f}",
               "top5": f"{stats['top5']:.4f}", "images_per_s": f"{stats['images_per_s']:.2f}",
               "data_s": f"{stats['data_s']:.3f}", "epoch_s": f"{stats['epoch_s']:.3f}", "lr": f"{lr:.6g}",
               "process_images_per_s": f"{stats['process_images_per_s']:.2f}",
               "read_mb": "" if stats.get("read_mb") is None else f"{stats['read_mb']:.3f}",
               "read_calls": "" if stats.get("read_calls") is None else stats["read_calls"]}
        skipped = None
        if split == "train":
            skipped = stats["skipped_steps"]  # (None: apex.amp's own, not counted)
            row["skipped_steps"] = "" if skipped is None else skipped
            self.skipped_steps = None if None in (skipped, self.skipped_steps) else self.skipped_steps + skipped
        with open(self.out / "metrics.csv", "a", newline="") as f:
            csv.DictWriter(f, CSV_FIELDS).writerow(row)
        for key in ("loss", "top1", "top5", "images_per_s", "data_s"):
            self.writer.add_scalar(f"{split}/{key}", stats[key], epoch)
        if split == "train":
            self.writer.add_scalar("train/lr", lr, epoch)
            self.train_rates.append(stats["images_per_s"])
        self.writer.flush()
        seconds = max(stats["epoch_s"], 1e-9)
        read = (f"  read {stats['read_mb'] / seconds:.1f} MB/s in {stats['read_calls'] / seconds:.0f} reads/s"
                if stats.get("read_mb") is not None else "")
        self.print(f"epoch {epoch} {split:7s} loss {stats['loss']:.4f}  top1 {stats['top1']:6.2f} %  "
                   f"top5 {stats['top5']:6.2f} %  {stats['images_per_s']:8.1f} images/s "
                   f"({stats['process_images_per_s']:.1f} a process)  data wait {stats['data_s']:.1f} s{read}  "
                   f"epoch {stats['epoch_s']:.1f} s" + (f"  {skipped} step(s) skipped by the loss scaler (fp16 "
                                                         f"overflow)" if skipped else ""))

    def scalars(self, epoch, values):
        """Per-epoch TensorBoard scalars a recipe adds of its own ({tag: value})."""
        if self.enabled:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, epoch)

    def finish(self, args, val_stats, epochs, world_size, global_batch, device, best_top1, ema_stats=None, **extra):
        """Write summary.json and print it. world_size counts every process of the run, whatever its role;
        global_batch is the images of one update (-e: none). images_per_s is the training throughput of
        all ranks together, the median over epochs after the first (which warms up);
        "ema" holds the EMA model's validation metrics (--ema-decay); a recipe's own
        results (extra) are added as they are."""
        if not self.enabled:
            return
        rates = self.train_rates[1:] or self.train_rates
        summary = {
            "recipe": args.recipe, "arch": args.arch, "epochs": epochs, "world_size": world_size,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "top1": val_stats["top1"], "top5": val_stats["top5"], "loss": val_stats["loss"],
            "val_images": val_stats["images"], "top1_correct": val_stats["top1_correct"],
            "best_top1": best_top1, "images_per_s": statistics.median(rates) if rates else None,
            "global_batch": None if args.evaluate else global_batch, "wall_s": time.perf_counter() - self.start,
            "torch": torch.__version__,
            "ema": {key: ema_stats[key] for key in ("top1", "top5", "loss")} if ema_stats else None,
            "skipped_steps": self.skipped_steps, **precision(args), **extra}
        self.write_json("summary.json", summary)
        samples = "sequences" if args.arch == "bert_tiny" else "images"  # (bert_tiny's top-1: of the masked tokens)
        throughput = f"{summary['images_per_s']:.1f} {samples}/s" if rates else f"evaluation only{in_fp32(args)}"
        ema = f"  (EMA: top1 {ema_stats['top1']:.2f} %  top5 {ema_stats['top5']:.2f} %)" if ema_stats else ""
        self.print(f"done: top1 {summary['top1']:.2f} %  top5 {summary['top5']:.2f} %{ema}  on "
                   f"{summary['val_images']} val {samples}{self.best_of(args, best_top1)}  |  {throughput}  |  "
                   f"wall {summary['wall_s']:.1f} s")
        self.print(f"run directory {self.out}  (tensorboard --logdir {self.out})")
        self.close()

    def best_of(self, args, best_top1):
        """For the last line of a run that trained: that its top-1 is the last epoch's, and which epoch best.pt
        holds (the first epoch at the best top-1, from metrics.csv); else ""."""
        path = self.out / "metrics.csv"
        if args.evaluate or not path.exists():
            return ""
        with open(path, newline="") as f:
            val = [row for row in csv.DictReader(f) if row["split"] == "val"]
        best = next((row["epoch"] for row in val if abs(float(row["top1"]) - best_top1) < 1e-3), None)
        if best is None:
            return ""
        if best == val[-1]["epoch"]:
            return f" (epoch {best}, the best: best.pt)"
        return f" (epoch {val[-1]['epoch']}; best.pt holds epoch {best}, top1 {best_top1:.2f} %)"

    def write_json(self, name, obj):
        if self.enabled:
            self.make_run_dir()
            (self.out / name).write_text(json.dumps(obj, indent=2, default=str) + "\n")

    def close(self):
        if self.profiler is not None:  # a run shorter than the profiled steps: write what was recorded
            self.profiler.stop()
            self.profiler = None
        if self.writer is not None:
            self.writer.close()


def precision(args):
    """What the run computed in, where it takes --opt-level (apex, fsdp): opt_level, and precision ("fp32" at O0,
    else the autocast dtype)."""
    if getattr(args, "opt_level", None) is None:
        return {}
    return {"opt_level": args.opt_level, "precision": "fp32" if args.opt_level == "O0" else args.amp_dtype}


def in_fp32(args):
    """-e --resume FILE in a recipe without --opt-level (it evaluates in fp32) of a checkpoint whose run trained
    and evaluated in mixed precision, which this recipe cannot repeat: what differs, for the result line; else ""."""
    if not args.evaluate or hasattr(args, "opt_level"):  # (apex and fsdp repeat the run's precision)
        return ""
    recorded = checkpoint.settings_from(args.resume)
    if recorded.get("opt_level", "O0") == "O0":
        return ""
    run = " ".join(recorded[key] for key in ("opt_level", "amp_dtype") if key in recorded)
    return f" in fp32, where the run evaluated at {run} ({args.recipe} has no --opt-level; apex -e repeats it)"
