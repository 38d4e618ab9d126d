"""The breaks of the mutation check (scripts/mutations.py): name, the file, the text switched off, what replaces
it, the tests that must catch it."""

PRECISION_TEST = ("tests/test_benchmarks.py::test_bench_precision_runs_each_precision_it_names_and_says_what_the_"
                  "cpu_has")
PRECISION_GPU_TEST = ("tests/test_gpu_plan.py::test_the_precision_part_on_gpus_runs_fp16_and_bf16_and_a_process_"
                      "per_gpu")
PIPEDREAM_TEST = ("tests/test_pipeline.py::test_pipedream_updates_per_minibatch_with_stashed_weights_as_a_plain_"
                  "reference_does")
NAIVE_ASYNC_TEST = ("tests/test_ps.py::test_local_steps_with_one_worker_train_nds_model_and_naive_async_moves_alpha_"
                    "of_it")
GPU_TABLE_TEST = ("tests/test_gpu_plan.py::test_bench_gpu_measures_each_set_up_once_per_gpu_and_torch_and_profiles_"
                  "the_targets_it_misses")
BARE_LOOP_TEST = "tests/test_gpu_plan.py::test_the_bare_loop_is_plain_pytorch_in_the_set_up_it_is_given"
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
         old="if pushes or args.local_steps == 1 else u\n", new="if True else u\n", tests=[NAIVE_ASYNC_TEST]),
    dict(name="subsample-pushes-the-sat-out-change-too", file="recipes/ps/train.py",
         old='u = u + residual if args.mode == "async" else u', new="u = u + residual",
         tests=[NAIVE_ASYNC_TEST]),
    dict(name="async-subsample-pushes-the-last-round-alone", file="recipes/ps/train.py",
         old='u = u + residual if args.mode == "async" else u', new="u = u",
         tests=[NAIVE_ASYNC_TEST]),
    dict(name="trim-ratio-ignored", file="recipes/ps/rules.py", old="    if trim_ratio is not None:\n",
         new="    if False:\n",
         tests=["tests/test_ps.py::test_the_trim_ratio_draws_b_from_each_rounds_pushes_as_zenops_validators"]),
    dict(name="clean-epochs-ignored", file="recipes/ps/attacks.py", old="if round_ < self.clean_rounds:",
         new="if False:",
         tests=["tests/test_ps.py::test_who_lies_byzantine_always_and_every_worker_with_the_attack_probability"]),
    dict(name="validation-split-only-with-validators", file="recipes/ps/train.py",
         old="if args.validation_split \\", new="if args.validators \\",
         tests=["tests/test_ps.py::test_a_validation_split_without_validators_is_held_out_all_the_same"]),
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
    # the same part on GPUs (make figures on a CUDA machine): fp16 where every CUDA GPU runs it, a GPU per process
    dict(name="precision-gpu-without-fp16", file="scripts/bench_precision.py",
         old='return dtype == "fp16" or torch.cuda.is_bf16_supported()',
         new='return dtype != "fp16" and torch.cuda.is_bf16_supported()', tests=[PRECISION_GPU_TEST]),
    dict(name="precision-gpus-all-on-the-first", file="scripts/bench_precision.py",
         old='visible_gpus(processes)', new='visible_gpus(1)', tests=[PRECISION_GPU_TEST]),
    # the GPU table (make gpu-check): every set-up planned, the smoke's passes kept for a GPU of the same compute
    # capability, a bare loop that is bare and runs its set-up, the timed epoch, the fastest set-up
    dict(name="gpu-table-leaves-a-set-up-out", file="scripts/gpu_plan.py",
         old='         Setup("recipe", "apex", "", "bf16", True, True),\n', new="",
         tests=["tests/test_gpu_plan.py::test_the_gpu_table_plans_every_set_up_a_user_chooses_between_in_one_command"]),
    dict(name="smoke-again-on-a-gpu-of-the-same-capability", file="scripts/gpu_smoke.py",
         old='(report.get("capability"), report.get("torch")) != (capability', new='(report.get("device"), '
         'report.get("torch")) != (capability',
         tests=["tests/test_gpu_plan.py::test_the_smoke_s_passes_hold_on_a_gpu_of_the_same_compute_capability_and_"
                "torch"]),
    dict(name="bare-loop-goes-through-the-recipes", file="scripts/bare_loop.py",
         old="from recipes.common.models import build_model  # noqa",
         new="from recipes.common import bookkeeping  # noqa: E402,F401\n"
             "from recipes.common.models import build_model  # noqa",
         tests=[BARE_LOOP_TEST]),
    dict(name="bare-loop-ignores-its-layout", file="scripts/bare_loop.py",
         old="layout = torch.channels_last if args.channels_last else torch.contiguous_format",
         new="layout = torch.contiguous_format", tests=[BARE_LOOP_TEST]),
    dict(name="bare-loop-row-runs-the-recipe", file="scripts/bench_gpu.py", old='        if setup.kind == "bare":\n'
         '            flags =', new='        if False:\n            flags =', tests=[GPU_TABLE_TEST]),
    dict(name="table-times-the-warm-up-epoch", file="scripts/bench_gpu.py", old='else found["epochs"][-1]',
         new='else found["epochs"][0]', tests=[GPU_TABLE_TEST]),
    dict(name="fastest-set-up-is-the-slowest", file="scripts/gpu_plan.py",
         old='return setup_of(max(candidates,', new='return setup_of(min(candidates,', tests=[GPU_TABLE_TEST]),
]
