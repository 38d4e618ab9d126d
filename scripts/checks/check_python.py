"""Check, before a make target starts, that its Python has what the target needs: one line and exit 2 if not.

    python scripts/checks/check_python.py --gpu gpu-smoke      # (the Makefile runs it: PY=python3 make gpu-smoke)

GPU nodes often have a Python with torch and torchvision and no package index: a missing
package is then named at the start, with the way to bring it, not met as an ImportError
minutes into the run. --gpu: a CUDA GPU must be visible too.
"""

import argparse
import importlib
import importlib.util
import sys

RECIPES = {"torchvision": "the recipes", "tqdm": "the recipes", "tensorboard": "the recipes",
           "numpy": "the JPEG folder", "PIL": "the JPEG folder"}
# what each target imports besides torch: the package (as its module is named) and what needs it
NEEDS = {
    "gpu-smoke": {**RECIPES, "byzfl": "the parameter-server check"},
    "figures-gpu": {**RECIPES, "matplotlib": "the figures"},
    "gpu-check": {**RECIPES, "byzfl": "the parameter-server check", "matplotlib": "the figures"},
}
# the packages that only some groups of checks need: a target run without those groups does without them
ONLY_FOR = {"byzfl": "ps"}
# imported, not only found: a wheel installed without its dependencies (byzfl needs scipy and seaborn) is found
IMPORTED = {"byzfl"}
PIP_NAMES = {"PIL": "pillow"}
# the oldest releases the recipes are written for (fully_shard with output_dtype, DCP's reader and planner API,
# decode_jpeg on CUDA in batches); pyproject.toml pins newer ones, and GPU nodes often have these
OLDEST = {"torch": (2, 11), "torchvision": (0, 26)}


def too_old():
    """'name version (at least x.y)' for torch or torchvision older than OLDEST."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name, oldest in OLDEST.items():
        try:
            release = version(name)
        except PackageNotFoundError:
            continue
        numbers = tuple(int(part) for part in release.split("+")[0].split(".")[:2] if part.isdigit())
        if numbers < oldest:
            found.append(f"{name} {release} (at least {'.'.join(map(str, oldest))})")
    return found


def missing(target, groups=None):
    """'name (what needs it)' for each package `target` needs and this Python lacks (groups: the groups of checks
    that will run, None for all)."""
    lacking = []
    for name, why in NEEDS[target].items():
        if groups is not None and name in ONLY_FOR and ONLY_FOR[name] not in groups:
            continue
        if importlib.util.find_spec(name) is None:
            lacking.append(f"{PIP_NAMES.get(name, name)} ({why})")
        elif name in IMPORTED:
            try:
                importlib.import_module(name)
            except ImportError as error:  # (a package it needs is missing)
                lacking.append(f"{error.name or 'a package'} ({why}: {name} imports it)")
    return lacking


def require(target, gpu=False, groups=None):
    """Exit 2 with one line unless this Python has torch, target's packages (those the groups of checks need)
    and (gpu) a CUDA GPU."""
    if importlib.util.find_spec("torch") is None:
        fail(f"this Python ({sys.executable}) has no torch: make setup, or PY=a Python that has it")
    old = too_old()
    if old:
        fail(f"this Python ({sys.executable}) has {', '.join(old)}: make {target} needs newer releases; pip install "
             f"a newer one, or use make setup's .venv")
    lacking = missing(target, groups)
    if lacking:
        fail(f"this Python ({sys.executable}) lacks {', '.join(lacking)}, which make {target} needs: pip install "
             f"it, or on a node without a package index carry the wheels that make gpu-wheels downloads elsewhere "
             f"(scripts/gpu/README.md), or use make setup's .venv")
    if gpu:
        import torch

        if not torch.cuda.is_available():
            fail(f"no CUDA GPU here (torch.cuda.is_available() is False): make {target} needs one; make test and "
                 f"make figures run on the CPU")


TO_STDOUT = False  # --stdout: the Makefile reads the line there, and leaves stderr's warnings aside


def fail(message):
    (sys.stdout if TO_STDOUT else sys.stderr).write(f"error: {message}\n")
    sys.exit(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=sorted(NEEDS))
    parser.add_argument("--gpu", action="store_true", help="a CUDA GPU must be visible too")
    parser.add_argument("--groups", nargs="+", help="only the packages these groups of checks need")
    parser.add_argument("--stdout", action="store_true", help="the line on stdout (the Makefile's way to read it)")
    args = parser.parse_args()
    if args.stdout:
        global TO_STDOUT
        TO_STDOUT = True
    require(args.target, args.gpu, args.groups and set(args.groups))


if __name__ == "__main__":
    main()
