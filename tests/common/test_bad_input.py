"""Bad input: one clear line on stderr, exit code 2, no traceback, no harm to checkpoints."""

import hashlib
import pickle
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import ROOT, TINY, assert_one_clear_line, run_recipe, write_tiny_folder, write_tiny_text
from torch.distributed.checkpoint.state_dict import get_state_dict

from recipes import RECIPES as CATALOGUE
from recipes.common import RecipeError, models

RECIPES = [entry.name for entry in CATALOGUE]


def test_bad_input_under_torchrun_is_as_the_faq_says(tmp_path):
    """docs/faq.md: each rank's one line (rank 0's first, bare), then torchrun's report naming exitcode 2, and
    torchrun's own exit code 1."""
    faq = " ".join((ROOT / "docs" / "faq.md").read_text().split())
    assert "torchrun itself exits 1 when any worker exits with anything but 0" in faq
    result = run_recipe("ddp", [tmp_path / "missing", *TINY, "--out", tmp_path / "o"], nproc=2, expect_ok=False,
                        torchrun=True)
    assert result.returncode == 1, result.returncode
    errors = [line for line in result.stderr.splitlines() if "error: " in line and "data directory" in line]
    assert sorted(errors) == sorted([f"error: data directory {tmp_path / 'missing'} does not exist",
                                     f"[rank 1] error: data directory {tmp_path / 'missing'} does not exist"]), errors
    assert "ChildFailedError" in result.stderr and "exitcode  : 2" in result.stderr
    assert max(result.stderr.index(line) for line in errors) < result.stderr.index("Traceback")  # (lines first)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def good_checkpoint(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("good") / "run"
    run_recipe("nd", [tiny_data, *TINY, "--epochs", "1", "--out", out])
    return out / "checkpoint.pt"


def test_missing_data_directory(tmp_path):
    result = run_recipe("nd", [tmp_path / "nowhere", *TINY, "--out", tmp_path / "out"], expect_ok=False)
    assert_one_clear_line(result, "data directory", "does not exist")
    assert not (tmp_path / "out").exists()  # (a run that never started leaves no run directory)


@pytest.mark.parametrize("recipe, nproc", [("ddp", 2), ("ps", 3)])
def test_bad_input_reaches_the_user_in_every_launch(tmp_path, recipe, nproc):
    """Launched again and again, each launch shows rank 0's line: a rank says what is wrong before it frees
    anything, and before torchrun (here: its stand-in) stops the ranks still running."""
    for launch in range(6):
        result = run_recipe(recipe, [*TINY, tmp_path / "nowhere", "--out", tmp_path / "out"], nproc=nproc,
                            expect_ok=False)
        assert any(line.startswith("error: data directory") for line in result.stderr.splitlines()), (
            launch, result.stderr[-2000:])


@pytest.mark.parametrize("recipe", ["nd", "ddp"])
def test_bad_input_says_its_own_reason_where_an_earlier_run_left_a_checkpoint(tiny_data, tmp_path, recipe):
    """The data folder and --arch are checked before --out's clash with an earlier run, whose checkpoint stays
    as it was."""
    out = tmp_path / "earlier"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"an earlier run's checkpoint")
    nproc = 2 if recipe == "ddp" else 1
    for flags, phrase in (([tmp_path / "nowhere"], "data directory"), ([tmp_path], "has no train/ folder"),
                          ([tiny_data, "-a", "resnet19"], "unknown --arch 'resnet19'"),
                          ([tiny_data], "already holds a checkpoint")):
        result = run_recipe(recipe, [*TINY, *flags, "--out", out], nproc=nproc, expect_ok=False)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert result.returncode != 0 and len(errors) == 1 and phrase in errors[0], (phrase, result.stderr[-2000:])
    assert [path.name for path in out.iterdir()] == ["checkpoint.pt"]
    assert (out / "checkpoint.pt").read_bytes() == b"an earlier run's checkpoint"


def test_split_with_no_images(tmp_path):
    root = write_tiny_folder(tmp_path / "data")
    for image in (root / "val").rglob("*.png"):
        image.unlink()
    result = run_recipe("nd", [root, *TINY, "--out", tmp_path / "out"], expect_ok=False)
    assert_one_clear_line(result, "val", "has no images")


def test_unreadable_image(tmp_path):
    root = write_tiny_folder(tmp_path / "data")
    (root / "train" / "red" / "000.png").write_bytes(b"this is not a png")
    result = run_recipe("nd", [root, *TINY, "-j", "1", "--out", tmp_path / "out"], expect_ok=False)
    assert_one_clear_line(result, "unreadable image", "000.png")


def test_unknown_arch(tiny_data, tmp_path):
    result = run_recipe("nd", [tiny_data, *TINY, "-a", "resnet19", "--out", tmp_path / "out"], expect_ok=False)
    assert_one_clear_line(result, "unknown --arch 'resnet19'")


@pytest.mark.parametrize("arch, text, phrase", [
    ("bert_tiny", False, "holds images, and --arch is bert_tiny"),
    ("lenet", True, "holds a text, and --arch is lenet"),
    ("bert_tiny", "garbled", "tokens.pt: not a tokenised text"),
    ("bert_tiny", "long", "tokens.pt: sequences of 200 tokens; bert_tiny takes 4 to 128"),
    ("bert_tiny", "foreign", "tokens.pt: token ids outside the vocabulary of 11")])
def test_a_model_on_data_of_the_other_kind_or_a_garbled_text(tiny_data, tmp_path, arch, text, phrase):
    folder = write_tiny_text(tmp_path / "text") if text else tiny_data
    if text in ("garbled", "long", "foreign"):
        state = {"sequences": torch.full((4, 200 if text == "long" else 16), 3 if text == "long" else 11),
                 "vocabulary": [*"abcdefgh", "[PAD]", "[UNK]", "[MASK]"]}
        torch.save(state, folder / "train" / "tokens.pt")
        if text == "garbled":
            (folder / "train" / "tokens.pt").write_bytes(b"not torch")
        phrase = f"{folder}/train/{phrase}"
    result = run_recipe("nd", [folder, *TINY, "-a", arch, "--out", tmp_path / "out"], expect_ok=False)
    assert_one_clear_line(result, phrase)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arch, size, phrase", [
    ("vit_tiny", "16",
     "-a vit_tiny cuts the image into a grid of 7 x 7 patches: --image-size 16 is not a multiple of 7"),
    ("vit_b_16", "40", "-a vit_b_16 cuts the image into 16 px patches: --image-size 40 is not a multiple of 16")])
def test_a_vision_transformer_at_an_image_size_it_cannot_cut_into_patches(tiny_data, tmp_path, arch, size, phrase):
    result = run_recipe("nd", [tiny_data, *TINY, "-a", arch, "--image-size", size, "--out", tmp_path / "out"],
                        expect_ok=False)
    assert_one_clear_line(result, phrase)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, phrase", [
    (["-b", "0"], "--batch-size must be at least 1"),
    (["--desired-acc", "75"], "--desired-acc is a fraction"),
    (["--epochs", "zero"], "--epochs"),
    (["--accum-steps", "0"], "--accum-steps must be at least 1"),
    (["--lr-steps", "60", "30"], "--lr-steps must be positive epochs in increasing order, got 60 30"),
])
def test_impossible_flag_values(tiny_data, tmp_path, flags, phrase):
    result = run_recipe("nd", [tiny_data, *TINY, *flags, "--out", tmp_path / "out"], expect_ok=False)
    assert_one_clear_line(result, phrase)


@pytest.mark.parametrize("flags, phrase", [
    (["--accum-steps", "-2"], "--accum-steps must be at least 1, got -2"),
    (["--lr-steps", "0", "30"], "--lr-steps must be positive epochs"),
    (["--lr-steps", "30", "30"], "--lr-steps must be positive epochs in increasing order"),
    (["--lr-schedule", "cosine", "--lr-steps", "30"], "--lr-schedule cosine has none"),
    (["--lr-schedule", "linear"], "--lr-schedule"),
    (["--warmup-epochs", "-1"], "--warmup-epochs must be at least 0"),
    (["--epochs", "5", "--warmup-epochs", "5"], "less than --epochs 5"),
    (["--label-smoothing", "1"], "--label-smoothing must be in [0, 1)"),
    (["--mixup-alpha", "-0.2"], "--mixup-alpha must be 0 (off) or positive"),
    (["--cutmix-alpha", "-1"], "--cutmix-alpha must be 0 (off) or positive"),
    (["--ema-decay", "1"], "--ema-decay must be between 0 and 1"),
    (["--ema-decay", "0"], "--ema-decay must be between 0 and 1"),
    (["--profile", "-3"], "--profile must be 0 (off) or a number of steps"),
])
def test_impossible_training_flags(flags, phrase):
    """Every recipe parses them with the same checks; the line and exit code are tested above and below."""
    import importlib

    for recipe in RECIPES:
        with pytest.raises(RecipeError) as error:
            importlib.import_module(f"recipes.{recipe}.train").parse_args(["data", *flags])
        assert phrase in str(error.value), (recipe, str(error.value))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_refuses_a_bad_flag_in_one_line(tiny_data, tmp_path, recipe):
    result = run_recipe(recipe, [tiny_data, *TINY, "-b", "0", "--out", tmp_path / "out"], expect_ok=False)
    assert_one_clear_line(result, "--batch-size must be at least 1")
    assert not (tmp_path / "out").exists()


def test_ema_with_pure_low_precision_weights_is_refused():
    from recipes.apex.train import parse_args
    from recipes.common import RecipeError

    for opt_level in ("O2", "O3"):
        with pytest.raises(RecipeError, match=f"--ema-decay with --opt-level {opt_level}"):
            parse_args(["data", "--opt-level", opt_level, "--ema-decay", "0.999"])
    assert parse_args(["data", "--opt-level", "O1", "--ema-decay", "0.999"]).ema_decay == 0.999


@pytest.mark.parametrize("flags", [["-b", "64"], ["-b", "8", "--accum-steps", "8"]])
def test_step_batch_larger_than_the_shard(tiny_data, tmp_path, flags):
    result = run_recipe("nd", [tiny_data, *TINY, *flags, "--out", tmp_path / "out"], expect_ok=False)
    assert_one_clear_line(result, "fewer than one step of --batch-size", "48 images per process")


def test_truncated_checkpoint_is_refused_and_left_alone(tiny_data, tmp_path, good_checkpoint):
    broken = tmp_path / "checkpoint.pt"
    broken.write_bytes(good_checkpoint.read_bytes()[:2000])
    before = digest(broken)
    result = run_recipe("nd", [tiny_data, *TINY, "--resume", broken, "--out", tmp_path], expect_ok=False)
    assert_one_clear_line(result, "corrupt or truncated")
    assert len(result.stderr) - len(str(broken)) < 150, result.stderr  # (torch's cause in a few words, not its advice)
    assert digest(broken) == before


def test_checkpoint_with_other_class_count(tmp_path, good_checkpoint):
    root = write_tiny_folder(tmp_path / "data")
    (root / "train" / "blue").rename(root / "train" / "cyan")  # 3 classes, but val has blue:
    result = run_recipe("nd", [root, *TINY, "--out", tmp_path / "o"], expect_ok=False)
    assert_one_clear_line(result, "different class folders")
    four_root = write_tiny_folder(tmp_path / "four")
    for split in ("train", "val"):
        (four_root / split / "yellow").mkdir()
        for image in list((four_root / split / "red").glob("*.png"))[:8]:
            (four_root / split / "yellow" / image.name).write_bytes(image.read_bytes())
    before = digest(good_checkpoint)
    result = run_recipe("nd", [four_root, *TINY, "--resume", good_checkpoint, "--out", tmp_path / "r"],
                        expect_ok=False)
    assert_one_clear_line(result, "trained on 3 classes, but the data has 4")
    assert digest(good_checkpoint) == before


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))  # would create the marker file if unpickled


def test_checkpoint_carrying_code_is_not_run(tiny_data, tmp_path):
    marker = tmp_path / "code-ran"
    evil = tmp_path / "evil.pt"
    torch.save({"model": RunsCode(marker), "arch": "lenet"}, evil)
    result = run_recipe("nd", [tiny_data, *TINY, "-e", "--resume", evil, "--out", tmp_path / "o"],
                        expect_ok=False)
    assert_one_clear_line(result, "refusing to load")
    assert not marker.exists()


@pytest.fixture(scope="module")
def sharded_checkpoint(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "run"
    run_recipe("fsdp", [tiny_data, *TINY, "--epochs", "1", "--shard", "full", "--sharded-checkpoint", "--out", out])
    return out / "checkpoint_dcp"


def with_crafted_metadata(sharded, crafted, marker):
    """A copy of a sharded checkpoint whose .metadata would create marker when unpickled."""
    shutil.copytree(sharded, crafted)
    (crafted / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    return crafted


def with_crafted_entry(sharded, crafted, marker):
    """A sharded checkpoint, true to DCP's format, whose learning rate would create marker when loaded."""
    model = models.build_model("lenet", 3)
    model_state, optimizer_state = get_state_dict(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    optimizer_state["param_groups"][0].update(lr=RunsCode(marker), initial_lr=0.1)
    with pytest.warns(UserWarning):  # (DCP warns that it assumes one process)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=crafted)
    shutil.copy(sharded / "meta.json", crafted / "meta.json")
    return crafted


def assert_refused(result, nproc, *phrases):
    """One process: assert_one_clear_line. Under torchrun: each failing rank's line says it, no recipe's traceback."""
    if nproc is None:
        return assert_one_clear_line(result, *phrases)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith(("error: ", "[rank "))]
    assert lines and all(phrase in line for line in lines for phrase in phrases), result.stderr[-3000:]
    assert f'File "{ROOT / "recipes"}' not in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("craft,phrase", [(with_crafted_metadata, "it names io.open, which is no part of"),
                                          (with_crafted_entry, "its entry optimizer.param_groups.0.lr holds")])
@pytest.mark.parametrize("recipe,nproc,flags", [("nd", None, ["-e"]),
                                                ("fsdp", 2, ["--shard", "full", "--epochs", "2"]),
                                                ("ps", 3, ["--epochs", "2"])], ids=["nd-e", "fsdp-2", "ps"])
def test_a_sharded_checkpoint_carrying_code_is_not_run(tiny_data, tmp_path, sharded_checkpoint, craft, phrase,
                                                       recipe, nproc, flags):
    marker = tmp_path / "code-ran"
    crafted = craft(sharded_checkpoint, tmp_path / "crafted", marker)
    result = run_recipe(recipe, [tiny_data, *TINY, *flags, "--resume", crafted, "--out", tmp_path / "o"],
                        nproc=nproc, expect_ok=False)
    assert_refused(result, nproc, f"refusing to load {crafted}", phrase)
    assert not marker.exists()


@pytest.mark.parametrize("metadata,phrase", [
    (lambda good: good[:len(good) // 2], "refusing to load"),  # cut off
    (lambda good: b"not a pickle", "refusing to load"),
    (lambda good: pickle.dumps({"storage_data": {}}), "not a torch.distributed.checkpoint metadata file"),
    (lambda good: good.replace(b"__0_0.distcp", b"../_0.distcp"), "not to a file beside it"),
], ids=["truncated", "garbage", "foreign", "outside"])
def test_a_damaged_or_foreign_sharded_metadata_is_one_line(tiny_data, tmp_path, sharded_checkpoint, metadata,
                                                            phrase):
    damaged = tmp_path / "damaged"
    shutil.copytree(sharded_checkpoint, damaged)
    (damaged / ".metadata").write_bytes(metadata((sharded_checkpoint / ".metadata").read_bytes()))
    result = run_recipe("nd", [tiny_data, *TINY, "-e", "--resume", damaged, "--out", tmp_path / "o"],
                        expect_ok=False)
    assert_one_clear_line(result, phrase, str(damaged / ".metadata"))


def test_foreign_checkpoint(tiny_data, tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    result = run_recipe("nd", [tiny_data, *TINY, "-e", "--resume", foreign, "--out", tmp_path / "o"],
                        expect_ok=False)
    assert_one_clear_line(result, "not a checkpoint of these recipes")


def test_fresh_run_never_overwrites_an_existing_checkpoint(tiny_data, tmp_path, good_checkpoint):
    before = digest(good_checkpoint)
    result = run_recipe("nd", [tiny_data, *TINY, "--out", good_checkpoint.parent], expect_ok=False)
    assert_one_clear_line(result, "already holds a checkpoint", "--auto-resume")
    assert digest(good_checkpoint) == before


def test_apex_backend_without_apex_amp(tiny_data, tmp_path):
    result = run_recipe("apex", [tiny_data, *TINY, "--amp-backend", "apex", "--out", tmp_path / "o"],
                        expect_ok=False)
    assert_one_clear_line(result, "apex.amp", "--amp-backend native")


def test_evaluate_without_a_checkpoint(tiny_data, tmp_path):
    result = run_recipe("nd", [tiny_data, *TINY, "-e", "--out", tmp_path / "o"], expect_ok=False)
    assert_one_clear_line(result, "--evaluate needs --resume")


# The flags whose combinations with each --shard, --sync and parameter-server mode the walk tries, at each value
WALKED = {"--channels-last": [[], ["--channels-last"]],
          "--opt-level": [[], ["--opt-level", "O1", "--amp-dtype", "fp16"], ["--opt-level", "O2", "--amp-dtype",
                                                                             "bf16"],
                          ["--opt-level", "O3", "--amp-dtype", "bf16"]],
          "--ema-decay": [[], ["--ema-decay", "0.9"]], "--sharded-checkpoint": [[], ["--sharded-checkpoint"]],
          "--accum-steps": [[], ["--accum-steps", "2"]], "--compile": [[], ["--compile"]]}
MODES = ([("fsdp", ["--shard", shard]) for shard in ("none", "optimizer", "grad-op", "full")] +
         [("ps", ["--mode", mode]) for mode in ("sync", "async")] +
         [("pipeline", ["--sync", sync, "--stages", "2", "--microbatches", "2", "-a", "lenet"])
          for sync in ("allreduce", "preduce", "adpsgd", "hetpipe")])
# what each recipe's docstring and README say it does not take (beside the walked flags)
DOCUMENTED = {"ps": [["--save-every", "2"], ["--profile", "2"], ["--sync-bn"], ["--accum-steps", "2"]],
              "pipeline": [["--mixup-alpha", "0.2"], ["--cutmix-alpha", "1"], ["--sync-bn"], ["--accum-steps", "2"]],
              "fsdp": [["--sync-bn"], ["--amp-backend", "apex"]]}


def walked_combinations():
    import itertools

    for recipe, mode in MODES:
        for combination in itertools.product(*WALKED.values()):
            yield recipe, [*mode, *(flag for flags in combination for flag in flags)]
        for flags in DOCUMENTED[recipe]:
            yield recipe, [*mode, *flags]


def test_every_refused_combination_of_flags_and_modes_is_one_line():
    """Each recipe's flag checks (parse_args), over every combination of the walked flags with every mode and each
    documented refusal: a combination is taken, or refused with a one-line RecipeError (exit 2 from launch), as
    the docstrings say; nothing else escapes. Refusals that need the world size are test_ps's and
    test_pipeline's; each mode's taken flags train together in test_the_combinations_a_mode_takes_train."""
    import importlib

    for recipe, flags in walked_combinations():
        parse_args = importlib.import_module(f"recipes.{recipe}.train").parse_args
        try:
            parse_args(["data", *flags])
            taken = True
        except RecipeError as error:
            taken, message = False, str(error).strip()
            assert message and "\n" not in message, (recipe, flags, message)
        assert taken == documented_as_taken(recipe, flags), (recipe, flags)


def documented_as_taken(recipe, flags):
    """What the docstrings say of a combination: ps and the pipeline take none of the walked flags (nor the
    documented ones); fsdp refuses --ema-decay, --sync-bn and apex with grad-op and full, --sharded-checkpoint with
    optimizer and with --ema-decay, O2's master copies with optimizer, and (every recipe) --ema-decay with O2's
    and O3's low-precision weights."""
    extra = flags[flags.index("-a") + 2:] if recipe == "pipeline" else flags[2:]
    if recipe != "fsdp":
        return not extra
    shard, given = flags[1], set(extra)
    return not ((shard in ("grad-op", "full") and given & {"--ema-decay", "--sync-bn", "apex"})
                or ("--sharded-checkpoint" in given and (shard == "optimizer" or "--ema-decay" in given))
                or (shard == "optimizer" and "O2" in given)
                or ("--ema-decay" in given and given & {"O2", "O3"}))


@pytest.mark.parametrize("shard, flags", [
    ("none", ["--ema-decay", "0.9"]), ("none", ["--sharded-checkpoint"]), ("optimizer", ["--ema-decay", "0.9"]),
    ("grad-op", ["--sharded-checkpoint"]), ("full", ["--sharded-checkpoint"])])
def test_the_combinations_a_mode_takes_train(tiny_data, tmp_path, shard, flags):
    """What test_every_refused_combination_of_flags_and_modes_is_one_line finds taken runs: each --shard mode with
    every walked flag it takes at once (--compile aside: tests/common/test_training.py compiles), fp16 with loss
    scaling, on 2 processes (ps and the pipeline take none of them)."""
    run_recipe("fsdp", [tiny_data, *TINY, "-b", "4", "--epochs", "1", "--out", tmp_path, "--shard", shard,
                        "--channels-last", "--opt-level", "O1", "--amp-dtype", "fp16", "--accum-steps", "2", *flags],
               nproc=2)
    assert (tmp_path / "summary.json").exists()
