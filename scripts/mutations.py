"""The mutation check: break each lesson on purpose and watch the tests that claim it fail.

    make test-mutations                      # every break, one after another
    python scripts/mutations.py --only checkpoint-written-in-place weights-only-dropped   # some
    python scripts/mutations.py --list       # the breaks and their tests

Each break in BREAKS is one exact text of the implementation replaced by another (the
feature switched off, as a slip in a change would switch it off), with the tests that
must catch it. For each break the tree (git's tracked and untracked files, not the
ignored ones) is copied to a temporary folder, the break applied there, and only its
tests run there, with PYTHONPATH putting the copy's `recipes` before the installed
one. First the tests of every chosen break run on a copy with nothing broken: they must
all pass (or a failure would prove nothing). A break is caught when pytest then reports
a failed test (exit 1); a break whose text no longer occurs exactly once, or whose
tests are not found, is an error of the list. It prints one line per break and exits 0
only when every break is caught.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRECISION_TEST = ("tests/test_benchmarks.py::test_bench_precision_runs_each_precision_it_names_and_says_what_the_"
                  "cpu_has")
PRECISION_GPU_TEST = ("tests/test_gpu_plan.py::test_the_precision_part_on_gpus_runs_fp16_and_bf16_per_gpu_and_goes_"
                      "on_where_a_lease_stopped")
PIPEDREAM_TEST = ("tests/test_pipeline.py::test_pipedream_updates_per_minibatch_with_stashed_weights_as_a_plain_"
                  "reference_does")
NAIVE_ASYNC_TEST = ("tests/test_ps.py::test_local_steps_with_one_worker_train_nds_model_and_naive_async_moves_alpha_"
                    "of_it")
HOOK_TEST = "test_each_hook_averages_within_its_bound_and_counts_the_bytes_it_hands_to_the_collectives"

# name, the file, the text switched off, what replaces it, the tests that must catch it
BREAKS = [
    # features a test could miss by checking only exit codes, files and rows: each test now sees the feature act
    dict(name="autocast-off", file="recipes/common/amp.py", old="enabled=use_autocast)", new="enabled=False)",
         tests=["tests/test_amp.py::test_low_precision_loss_curves_follow_fp32"]),
    dict(name="compile-returns-the-model", file="recipes/common/models.py",
         old="    return torch.compile(module)", new="    return module",
         tests=["tests/test_benchmarks.py::test_bench_compile_runs_eager_cold_and_warm"]),
    dict(name="compression-no-sync-removed", file="recipes/compression/train.py",
         old="with model.no_sync() if i < run.accum_steps - 1 else contextlib.nullcontext():",
         new="with contextlib.nullcontext():",
         tests=["tests/test_training.py::test_accumulation_keeps_one_allreduce_per_step_in_the_compression_recipe"]),
    dict(name="scaler-not-restored", file="recipes/common/checkpoint.py",
         old="            scaler.load_state_dict(state[\"scaler\"])", new="            pass",
         tests=["tests/test_common.py::test_a_checkpoint_saves_and_resumes_every_training_object_in_one_call_each"]),
    dict(name="best-top1-reset-on-resume", file="recipes/common/checkpoint.py",
         old="    return state[\"epoch\"], step, state[\"best_top1\"]", new="    return state[\"epoch\"], step, 0.0",
         tests=["tests/test_recipes.py::test_resume_matches_an_uninterrupted_run"]),
    dict(name="ddp-without-label-smoothing", file="recipes/ddp/train.py",
         old="nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)", new="nn.CrossEntropyLoss()",
         tests=["tests/test_training.py::test_mixup_cutmix_and_label_smoothing_train_end_to_end"]),
    dict(name="error-feedback-off", file="recipes/compression/hooks.py",
         old="hook = with_error_feedback(hook, roundtrip)", new="hook = hook",
         tests=["tests/test_compression.py::test_error_feedback_runs_end_to_end"]),
    dict(name="ddp-optimizer-step-dropped", file="recipes/ddp/train.py",
         old="        optimizer.step()\n", new="        pass\n",
         tests=["tests/test_training.py::test_accumulated_micro_batches_equal_one_big_batch_with_one_allreduce_per_step"
                "[ddp]"]),
    dict(name="bf16-sent-as-fp16", file="recipes/compression/hooks.py",
         old="\"bf16\": (default_hooks.bf16_compress_hook,", new="\"bf16\": (default_hooks.fp16_compress_hook,",
         tests=[f"tests/test_compression.py::{HOOK_TEST}[bf16]"]),
    dict(name="fp8-e5m2-sent-as-e4m3", file="recipes/compression/hooks.py",
         old="\"fp8-e5m2\": torch.float8_e5m2}", new="\"fp8-e5m2\": torch.float8_e4m3fn}",
         tests=[f"tests/test_compression.py::{HOOK_TEST}[fp8-e5m2]"]),
    # one per lesson the README claims
    dict(name="ddp-wrapper-removed", file="recipes/ddp/train.py",
         old="    ddp_model = DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None)",
         new="    ddp_model = model",
         tests=["tests/test_recipes.py::test_ddp_two_processes_match_nd_with_double_batch"]),
    dict(name="sampler-set-epoch-removed", file="recipes/ddp/train.py",
         old="        train_sampler.set_epoch(epoch)  # a new shuffle each epoch\n", new="",
         tests=["tests/test_recipes.py::test_ddp_two_processes_match_nd_with_double_batch"]),
    dict(name="evaluation-leftover-dropped", file="recipes/common/data.py",
         old="range(rank, len(dataset), world_size)", new="range(rank, len(dataset) - len(dataset) % world_size, "
                                                          "world_size)",
         tests=["tests/test_recipes.py::test_evaluation_counts_every_image_once_for_any_world_size"]),
    dict(name="checkpoint-written-in-place", file="recipes/common/checkpoint.py",
         old="    tmp = path.with_name(f\".{path.name}.{os.getpid()}.tmp\")\n    try:\n"
             "        with open(tmp, \"wb\") as f:\n            write(f)\n            f.flush()\n            os.fsync(f.fileno())\n"
             "        os.replace(tmp, path)\n    finally:\n        tmp.unlink(missing_ok=True)\n",
         new="    with open(path, \"wb\") as f:\n        write(f)\n",
         tests=["tests/test_common.py::test_checkpoint_write_is_atomic"]),
    dict(name="weights-only-dropped", file="recipes/common/checkpoint.py",
         old="            state = torch.load(path, map_location=device, weights_only=True, mmap=mmap)",
         new="            state = torch.load(path, map_location=device, weights_only=False, mmap=mmap)",
         tests=["tests/test_bad_input.py::test_checkpoint_carrying_code_is_not_run"]),
    dict(name="full-shard-keeps-weights-gathered", file="recipes/fsdp/train.py",
         old="fully_shard(block, mp_policy=policy, reshard_after_forward=args.shard == \"full\")",
         new="fully_shard(block, mp_policy=policy, reshard_after_forward=False)",
         tests=["tests/test_fsdp.py::test_the_measured_bytes_per_rank_are_what_each_mode_shards"]),
    dict(name="zero1-optimizer-not-sharded", file="recipes/fsdp/train.py",
         old="ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, **sgd)",
         new="torch.optim.SGD(model.parameters(), **sgd)",
         tests=["tests/test_fsdp.py::test_the_measured_bytes_per_rank_are_what_each_mode_shards"]),
    dict(name="fsdp-accumulation-not-averaged", file="recipes/fsdp/train.py",
         old="scaler.scale(loss / run.accum_steps).backward()", new="scaler.scale(loss).backward()",
         tests=["tests/test_fsdp.py::test_each_mode_ends_with_ddps_weights[full]"]),
    dict(name="fsdp-accumulation-reduces-every-micro-batch", file="recipes/fsdp/train.py",
         old="return contextlib.nullcontext() if sync else model.no_sync()", new="return contextlib.nullcontext()",
         tests=["tests/test_training.py::test_accumulated_micro_batches_equal_one_big_batch_with_one_allreduce_per_step"
                "[fsdp]"]),
    dict(name="cpu-without-native-bf16-taken-as-native", file="recipes/common/amp.py",
         old="slow_cpu = device.type == \"cpu\" and not cpu_has_native_bf16()", new="slow_cpu = False",
         tests=["tests/test_amp.py::test_cpu_default_is_fp32_without_native_bf16"]),
    dict(name="compression-never-steps", file="recipes/compression/train.py",
         old="        optimizer.step()\n", new="        optimizer.zero_grad()\n",
         tests=["tests/test_compression.py::test_a_two_process_run_writes_a_complete_run_directory[fp8-e4m3]"]),
    # the parameter server: its rules and its average
    dict(name="ps-mean-takes-the-first-push", file="recipes/ps/rules.py",
         old="return stacked.mean(dim=0)", new="return stacked[0]",
         tests=["tests/test_ps.py::test_sync_mean_ends_with_ddps_weights[1]"]),
    dict(name="local-steps-push-the-last-gradient", file="recipes/ps/steps.py",
         old="        if steps == 1:\n", new="        if True:\n",
         tests=["tests/test_ps.py::test_local_steps_push_the_change_of_the_weights_and_keep_the_momentum",
                NAIVE_ASYNC_TEST]),
    dict(name="zenops-sync-accepts-all", file="recipes/ps/rules.py",
         old="passed.append(bool((u_t * v_t).mean() > eta * v2 and (u_t * u_t).mean() < (1 + rho) * v2))",
         new="passed.append(True)",
         tests=["tests/test_ps.py::test_zenops_sync_judges_each_tensor_exactly_where_its_formula_says",
                "tests/test_ps.py::test_validators_count_what_they_reject[zenops-sync-extra0]"]),
    dict(name="zeno-keeps-all", file="recipes/ps/rules.py",
         old="return sorted(ranked[:len(scores) - b])", new="return sorted(ranked)",
         tests=["tests/test_ps.py::test_zeno_scores_with_a_penalty_scaled_by_lr_and_dimension_and_keeps_the_n_minus_b_best",
                "tests/test_ps.py::test_validators_count_what_they_reject[zeno-sync-extra1]"]),
    dict(name="zenops-async-accepts-all", file="recipes/ps/rules.py",
         old="pieces.append(alpha * u_t if score >= eta else alpha * score * u_t)", new="pieces.append(alpha * u_t)",
         tests=["tests/test_ps.py::test_zenops_async_clips_and_scales_each_tensor_as_its_formula_says"]),
    dict(name="zeno-plus-plus-accepts-all", file="recipes/ps/rules.py",
         old="return rescaled, base_lr * (rescaled @ v).item() - rho * g_squared + base_lr * eps >= 0",
         new="return rescaled, True",
         tests=["tests/test_ps.py::test_validators_count_what_they_reject[zeno++-async-extra3]"]),
    dict(name="attack-prob-ignored", file="recipes/ps/attacks.py",
         old="generator=self.generator) < self.prob", new="generator=self.generator) < 0",
         tests=["tests/test_ps.py::test_who_lies_byzantine_always_and_every_worker_with_the_attack_probability"]),
    dict(name="attacks-drawn-per-push-again", file="recipes/ps/attacks.py",
         old='self.per_tensor = args.attack_draw == "tensor" and', new='self.per_tensor = False and',
         tests=["tests/test_ps.py::test_who_lies_byzantine_always_and_every_worker_with_the_attack_probability"]),
    dict(name="worker-subsample-ignored", file="recipes/ps/steps.py",
         old="return args.worker_subsample >= 1 or", new="return True or",
         tests=["tests/test_ps.py::test_a_worker_pushes_in_a_round_with_the_subsample_probability_seeded"]),
    dict(name="subsample-without-the-residual", file="recipes/ps/train.py",
         old="            residual = u\n", new="            residual = torch.zeros_like(vector)\n",
         tests=[NAIVE_ASYNC_TEST]),
    dict(name="zeno-plus-plus-v-refreshed-per-validator", file="recipes/ps/validators.py",
         old='if args.aggregate == "zeno++":\n        counted', new='if False:\n        counted',
         tests=["tests/test_ps.py::test_zeno_plus_plus_refreshes_v_every_k_pushes_of_all_validators"]),
    dict(name="phocas-keeps-all", file="recipes/ps/rules.py",
         old=".argsort(dim=0)[:n - b]", new=".argsort(dim=0)[:n]",
         tests=["tests/test_ps.py::test_phocas_rejects_a_sign_flip"]),
    # the pipeline: partial reduce and the stragglers
    dict(name="preduce-never-connects", file="recipes/pipeline/preduce.py",
         old="while not connects_all(parents):", new="while False:",
         tests=["tests/test_pipeline.py::test_once_the_updates_cross_a_multiple_of_ten_r_the_next_group_connects_every_"
                "replica"]),
    dict(name="preduce-fixed-deadline", file="recipes/pipeline/preduce.py",
         old="return min(2 * wait, LONGEST_WAIT) if size < 2 else max(0.9 * wait, SHORTEST_WAIT)", new="return wait",
         tests=["tests/test_pipeline.py::test_the_deadline_doubles_after_a_group_of_one_and_shrinks_otherwise"]),
    dict(name="stragglers-ignore-the-seed", file="recipes/pipeline/stragglers.py",
         old="random.Random(f\"{args.seed}/{rank}/{epoch}/{step}\")", new="random.Random(f\"{rank}/{epoch}/{step}\")",
         tests=["tests/test_pipeline.py::test_stragglers_are_drawn_per_slot_from_the_seed"]),
    # the precision part of make figures: what each row ran in, and what the CPU has (caught on a CPU with native
    # bf16, where the low-precision rows run; elsewhere they are left out and the first has nothing to break)
    dict(name="precision-rows-silently-fp32", file="scripts/bench_precision.py",
         old='*(["--opt-level", level] if level else [])', new='*(["--opt-level", "O0"] if level else [])',
         tests=[PRECISION_TEST]),
    dict(name="precision-cpu-flags-not-recorded", file="scripts/bench_precision.py",
         old='"cpu_flags": flags_found}', new='"cpu_flags": ""}', tests=[PRECISION_TEST]),
    dict(name="precision-text-ignores-the-cpu", file="scripts/results/precision.py",
         old='if info["native_bf16"] else', new='if True else', tests=[PRECISION_TEST]),
    # PipeDream: each backward on its forward's weights, an update per minibatch
    dict(name="pipedream-weights-not-stashed", file="recipes/pipeline/pipedream.py",
         old="    weights = stashed_weights(pipe)\n", new="    weights = stashed_weights(pipe) and pipe.named\n",
         tests=[PIPEDREAM_TEST]),
    dict(name="pipedream-an-update-every-other-minibatch", file="recipes/pipeline/train.py",
         old="            optimizer.step()\n            tally[\"updates\"] += 1  #",
         new="            if i % 2:\n                optimizer.step()\n            tally[\"updates\"] += 1  #", tests=[PIPEDREAM_TEST]),
    # SD-PIPE's partial reduce inside each backward (without it, only the epoch's average after the drain is left);
    # and its pairs beyond 8 replicas, which connect no one for the staleness bound
    dict(name="preduce-pairs-join-the-union", file="recipes/pipeline/preduce.py",
         old="if replicas <= PAIRS_BEYOND:  # (pairs", new="if True:  # (pairs",
         tests=["tests/test_pipeline.py::test_once_the_updates_cross_a_multiple_of_ten_r_the_next_group_connects_every_"
                "replica"]),
    dict(name="preduce-not-inside-the-backward", file="recipes/pipeline/train.py",
         old="            agree(args, pipe, tally, run.epoch, i, straggled)  #",
         new="            None if preduce else agree(args, pipe, tally, run.epoch, i, straggled)  #",
         tests=["tests/test_pipeline.py::test_pipedream_with_preduce_counts_epochs_in_updates_and_every_stage_"
                "updates_once_a_minibatch"]),
    # HetPipe as SD-PIPE runs it: no bound on the pulls unless --staleness asks for one
    dict(name="hetpipe-with-a-barrier", file="recipes/pipeline/hetpipe.py",
         old='bound = float("inf") if args.staleness is None', new='bound = 0 if args.staleness is None',
         tests=["tests/test_pipeline.py::test_hetpipe_pushes_every_minibatch_and_bounds_no_pull_unless_asked"]),
    # the same part on GPUs (make figures-gpu ONLY=precision): fp16 where every CUDA GPU runs it, a GPU per process
    dict(name="precision-gpu-without-fp16", file="scripts/bench_precision.py",
         old='return dtype == "fp16" or torch.cuda.is_bf16_supported()',
         new='return dtype != "fp16" and torch.cuda.is_bf16_supported()', tests=[PRECISION_GPU_TEST]),
    dict(name="precision-gpus-all-on-the-first", file="scripts/bench_precision.py",
         old='visible_gpus(processes)', new='visible_gpus(1)', tests=[PRECISION_GPU_TEST]),
]


def copy_tree(destination):
    """The working tree as git sees it (tracked and untracked files, not the ignored ones) into destination."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # (a file deleted but not yet committed is listed too)
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def apply(tree, mutation):
    """Write the break into the copy; None, or why it cannot be applied."""
    path = tree / mutation["file"]
    text = path.read_text() if path.is_file() else ""
    if not mutation["old"] and not mutation["new"]:  # the control: nothing broken
        return None
    if text.count(mutation["old"]) != 1:
        return f"its text occurs {text.count(mutation['old'])} times in {mutation['file']}, not once"
    path.write_text(text.replace(mutation["old"], mutation["new"]))
    return None


def run_tests(tree, tests, timeout):
    """(pytest's exit code, or None past the timeout; the end of its output), the tests run in the copy with the
    copy's packages first. Past the timeout the whole process group goes: the recipes the tests started too."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    with subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as pytest:
        try:
            output = pytest.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            os.killpg(pytest.pid, signal.SIGKILL)
            pytest.communicate()
            return None, f"its tests ran past {timeout} s"
    return pytest.returncode, output


def first_failure(output):
    """The first test pytest's summary names as failed (or erred), and why, in one line."""
    line = next((line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))), "")
    return line[:160]


def check(mutation, timeout=1200):
    """("caught" | "missed" | "error", seconds, detail): the break applied to a copy of the tree, its tests run."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutation-{mutation['name']}-") as folder:
        tree = Path(folder)
        copy_tree(tree)
        problem = apply(tree, mutation)
        if problem:
            return "error", time.monotonic() - started, problem
        code, output = run_tests(tree, mutation["tests"], timeout)
    seconds = time.monotonic() - started
    if code == 1:
        return "caught", seconds, first_failure(output)
    if code == 0:
        return "missed", seconds, "every test passed with the break in"
    tail = output.strip().splitlines()[-3:] if code is not None else [output]
    return "error", seconds, f"pytest exit {code}: {' | '.join(tail)}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these breaks (default: all)")
    parser.add_argument("--list", action="store_true", help="print the breaks and their tests, run nothing")
    args = parser.parse_args(argv)
    names = [mutation["name"] for mutation in BREAKS]
    unknown = sorted(set(args.only or []) - set(names))
    if unknown:
        parser.exit(2, f"error: no break named {', '.join(unknown)}; the breaks are: {', '.join(names)}\n")
    chosen = [mutation for mutation in BREAKS if not args.only or mutation["name"] in args.only]
    if args.list:
        for mutation in chosen:
            print(f"{mutation['name']:44s} {mutation['file']}\n{'':44s} caught by {', '.join(mutation['tests'])}")
        return 0
    started, outcomes = time.monotonic(), {}
    tests = sorted({test for mutation in chosen for test in mutation["tests"]})
    control = check(dict(name="none", file=chosen[0]["file"], old="", new="", tests=tests), timeout=300 * len(tests))
    if control[0] != "missed":  # ("missed" here: every test passed with nothing broken, as they must)
        print(f"error: the tests fail on the tree as it is, with no break in: {control[2]}", file=sys.stderr)
        return 2
    print(f"control: the {len(tests)} tests pass with no break in "
          f"({control[1]:.1f} s)", flush=True)
    for mutation in chosen:
        outcome, seconds, detail = check(mutation)
        outcomes[mutation["name"]] = outcome
        print(f"{outcome:7s} {mutation['name']:44s} {seconds:6.1f} s  {detail}", flush=True)
    caught = sum(outcome == "caught" for outcome in outcomes.values())
    print(f"{caught} of {len(chosen)} breaks caught in {(time.monotonic() - started) / 60:.1f} min")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
