# make demo   generate the digits if missing, then train the ddp recipe on them (2 CPU processes, or every GPU)
# make cluster   a recipe on a virtual cluster: NODES network namespaces on this machine, each linked at RATE, torchrun
#                on each (root and iproute2; docs/cluster.md). Defaults: RECIPE=ddp NODES=4 RATE=1gbit, and ARGS the
#                demo's flags for one epoch into runs/cluster (emptied first); NPROC_PER_NODE=1 DELAY=0
# make test   the test suite (CPU, gloo; docs/tests.md says how long it takes on 2 cores, file by file)
# make test-mutations   break each lesson in a copy of the tree and check that its tests fail (scripts/checks/mutations.py)
# make figures                measure every part (cluster, io, scaling, curves, recovery, compile, precision,
#                             compression, ps, pipeline, sharding), then
#                             redraw figures/, RESULTS.md and docs/results/ from figures/data/
# make figures ONLY="curves compression"   measure only these parts, then redraw everything
# make figures QUICK=1        the same in small (lenet, few steps), written under runs/figures-quick/ instead
# make figures-gpu            on a machine with CUDA: the GPU table into figures/data/gpu/ and the pages, and on a
#                             node with more GPUs scaling and compression: ONLY="table scaling compression" (all)
# make gpu-smoke              on a machine with CUDA: every recipe's one-GPU path, a few steps each
# make gpu-check              the device command (scripts/gpu/README.md): preflight, gpu-smoke, then the GPU
#                             table's runs that fit in 9 minutes; into figures/data/gpu/ and the pages. STAND_IN=1:
#                             rehearsed on a CPU
# make gpu-wheels             the wheels a GPU node without a package index lacks (byzfl), into .wheels/ to carry there
# make test-compat            the compatibility run: under torch 2.11 (.venv-2.11, the GPU nodes' packages, nothing of
#                             this project installed) the rehearsal of gpu-check, then the documented commands, the
#                             forked ranks against torchrun's, and the compression, fsdp, ps and pipeline tests
#   The GPU targets install nothing: they run PY=..., else .venv's Python where it exists, else python3.
# A stopped `make figures` started again skips the runs whose summary.json is complete (in runs/figures/);
# delete that folder to measure everything afresh. Each target but the GPU ones creates .venv first when it is missing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# PY=... on the command line: an environment that already has torch (on a GPU node, say); no .venv then
SETUP := $(if $(filter command line,$(origin PY)),,setup)
# the GPU targets' Python: a node's own, no install (PY=...; else .venv's, where make setup made it; else python3)
GPU_PY := $(if $(filter command line,$(origin PY)),$(PY),$(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(PYTHON)))
# the compatibility run: the oldest torch supported, with the packages a GPU node's image has (and no mlxtend,
# no byzfl: byzfl comes from .wheels/, as on a node without a package index)
COMPAT_VENV := .venv-2.11
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_PACKAGES := torch==2.11.0 torchvision==0.26.0 tensorboard tqdm matplotlib numpy pillow scipy seaborn pandas pytest
# the documented commands, the forked ranks against torchrun's, the device check's rehearsal, the SLURM script, and
# the recipes' tests but test_recipes.py (under torch 2.11 its evaluation at 1, 2 and 3 processes hangs after the
# file's earlier tests)
COMPAT_TESTS := tests/common/test_commands.py tests/tools/test_forked.py tests/tools/test_gpu_check.py \
	tests/tools/test_slurm.py \
	$(filter-out tests/recipes/test_recipes.py,$(wildcard tests/recipes/test_*.py))
WHEELS := .wheels
STAND_IN ?=
# one process per GPU, else 2 CPU processes (evaluated only once the environment exists)
NPROC = $(shell $(PY) -c "import torch; print(torch.cuda.device_count() or 2)")
DEMO_DATA := data/mnist5k
TEXT_DATA := data/pydoc
JPEG_DATA := data/imagenet-like
GPU_JPEG_DATA := data/imagenet-like-gpu
PARTS := cluster io scaling curves recovery compile precision compression ps pipeline sharding
GPU_PARTS := table scaling compression
GPU_ONLY := $(if $(filter command line,$(origin ONLY)),$(ONLY),$(GPU_PARTS))
ONLY ?= $(PARTS)
QUICK ?=
# QUICK=1 (anything but empty or 0) leaves the committed figures alone
quick := $(filter-out 0,$(QUICK))
FIG_DIR := $(if $(quick),runs/figures-quick/figures,figures)
FIG_DATA := $(FIG_DIR)/data
RUNS := $(if $(quick),runs/figures-quick/runs,runs/figures)
RESULTS := $(if $(quick),runs/figures-quick/RESULTS.md,RESULTS.md)

ifneq ($(filter figures,$(MAKECMDGOALS)),)
ifneq ($(filter-out $(PARTS),$(ONLY)),)
$(error ONLY=$(filter-out $(PARTS),$(ONLY)) is not a part of make figures; the parts are: $(PARTS))
endif
endif
ifneq ($(filter figures-gpu,$(MAKECMDGOALS)),)
ifneq ($(filter-out $(GPU_PARTS),$(GPU_ONLY)),)
$(error ONLY=$(filter-out $(GPU_PARTS),$(GPU_ONLY)) is not a part of make figures-gpu; the parts are: $(GPU_PARTS))
endif
endif

.PHONY: help setup demo cluster test test-compat test-mutations figures figures-gpu gpu-smoke gpu-check gpu-wheels \
	gpu-check-figures-gpu gpu-check-gpu-smoke clean

# the default goal: the targets, as the first lines of this file say them (it installs nothing)
help:
	@sed -n '/^# make/,/^$$/p' Makefile | sed -n '/^#/s/^# \{0,1\}//p'

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[ps,digits,figures,test,codec,shards]'
	touch $@

$(DEMO_DATA)/.complete: | $(SETUP)
	$(PY) scripts/make_demo_data.py --out $(DEMO_DATA)
	touch $@

# the text the pipeline part's masked language model trains on: Python's pydoc topics
$(TEXT_DATA)/.complete: | $(SETUP)
	$(PY) scripts/make_demo_data.py --text $(TEXT_DATA)
	touch $@

demo: $(SETUP) $(DEMO_DATA)/.complete
	rm -rf runs/demo
	$(PY) -m torch.distributed.run --standalone --nproc_per_node=$(NPROC) recipes/ddp/train.py $(DEMO_DATA) \
		-a resnet18 --image-size 28 --scale 0.6 1 --hflip 0 -b 32 --lr 0.05 --epochs 8 -j 1 --seed 0 \
		--desired-acc 0.97 --out runs/demo

RECIPE ?= ddp
NODES ?= 4
NPROC_PER_NODE ?= 1
RATE ?= 1gbit
DELAY ?= 0
ARGS ?= $(DEMO_DATA) -a resnet18 --image-size 28 --scale 0.6 1 --hflip 0 -b 32 --lr 0.05 --epochs 1 -j 1 --seed 0 \
	--out runs/cluster

cluster: $(SETUP) $(DEMO_DATA)/.complete
	$(PY) scripts/cluster/network.py --require
	rm -rf runs/cluster
	$(PY) scripts/cluster/run.py --nodes $(NODES) --nproc-per-node $(NPROC_PER_NODE) --rate $(RATE) --delay $(DELAY) \
		recipes/$(RECIPE)/train.py $(ARGS)

$(JPEG_DATA)/.complete: | $(SETUP)
	$(PY) scripts/make_demo_data.py --imagenet-like $(JPEG_DATA) --classes 10 --images 120
	touch $@

# the parts of make figures, each one command
figure-part-cluster = $(PY) scripts/figures/cluster/measure.py --figures-data $(FIG_DATA) --runs $(RUNS)/cluster \
	$(if $(quick),--nodes 2 --rates 1gbit none --sizes-mib 1 4 --repeats 2)
figure-part-io = $(PY) scripts/figures/io/measure.py $(JPEG_DATA) --csv $(FIG_DATA)/io.csv \
	$(if $(quick),--workers 0 2 --repeats 1)
figure-part-scaling = $(PY) scripts/figures/scaling/measure.py --jpeg $(JPEG_DATA) --csv $(FIG_DATA)/scaling.csv \
	--runs $(RUNS)/scaling $(if $(quick),-a lenet --image-size 16 --steps 20 --cluster-nodes 1 2 --seeds 0 \
	--cluster-epochs 1 --cluster-steps 10)
figure-part-curves = $(PY) scripts/figures/curves/measure.py --data $(DEMO_DATA) --figures-data $(FIG_DATA) \
	--runs $(RUNS)/curves $(if $(quick),--quick --epochs 2)
figure-part-recovery = $(PY) scripts/figures/recovery/measure.py --json $(FIG_DATA)/recovery.json --runs $(RUNS)/recovery \
	$(if $(quick),--quick $(DEMO_DATA))
figure-part-compile = $(PY) scripts/figures/compile/measure.py $(if $(quick),--quick $(DEMO_DATA) --epochs 2) \
	--csv $(FIG_DATA)/compile.csv --runs $(RUNS)/compile
figure-part-precision = $(PY) scripts/figures/precision/measure.py --csv $(FIG_DATA)/precision.csv --runs $(RUNS)/precision \
	$(if $(quick),--quick)
figure-part-compression = $(PY) scripts/figures/compression/measure.py --data $(DEMO_DATA) --figures-data $(FIG_DATA) \
	--runs $(RUNS)/compression $(if $(quick),--quick --epochs 2 --processes 2 --methods none fp8-e4m3 --seeds 0 \
	--cluster-nodes 2 --cluster-epochs 2)
figure-part-ps = $(PY) scripts/figures/ps/measure.py --data $(DEMO_DATA) --figures-data $(FIG_DATA) --runs $(RUNS)/ps \
	$(if $(quick),--quick --epochs 1 --seeds 0)
figure-part-pipeline = $(PY) scripts/figures/pipeline/measure.py --data $(DEMO_DATA) --text $(TEXT_DATA) \
	--figures-data $(FIG_DATA) \
	--runs $(RUNS)/pipeline $(if $(quick),--quick --epochs 1 --seeds 0)
figure-part-sharding = $(PY) scripts/figures/sharding/measure.py --data $(JPEG_DATA) --csv $(FIG_DATA)/sharding.csv \
	--runs $(RUNS)/sharding $(if $(quick),-a lenet --image-size 16 --processes 1 2)
define newline


endef

figures: $(SETUP) $(DEMO_DATA)/.complete $(JPEG_DATA)/.complete $(TEXT_DATA)/.complete
	mkdir -p $(FIG_DATA)
	$(if $(quick),rm -rf runs/figures-quick/docs && mkdir -p runs/figures-quick/docs && cp RESULTS.md $(RESULTS) && \
		cp -r docs/results runs/figures-quick/docs/)
	$(foreach part,$(filter $(ONLY),$(PARTS)),$(figure-part-$(part))$(newline))
	$(PY) scripts/figures/plot_results.py --data $(FIG_DATA) --figures $(FIG_DIR) --results $(RESULTS)

# GPUs need longer epochs than the CPU folder gives: 100 classes x 250 (20,000 train JPEGs, 78 steps of 256), as
# scripts/gpu/check.py writes it
$(GPU_JPEG_DATA)/.complete:
	$(GPU_PY) scripts/make_demo_data.py --imagenet-like $(GPU_JPEG_DATA) --classes 100 --images 250 --jobs 0
	touch $@

# a CUDA GPU, and the packages the target needs in $(GPU_PY): else one line (scripts/checks/check_python.py) and exit 2
# (its exit status decides: a warning torch prints on stderr is no failure)
gpu-check-figures-gpu gpu-check-gpu-smoke:
	$(eval problem := $(shell $(GPU_PY) scripts/checks/check_python.py --gpu --stdout $(@:gpu-check-%=%) 2>/dev/null))
	$(if $(filter-out 0,$(.SHELLSTATUS)),$(error $(or $(patsubst error:%,%,$(problem)),$(GPU_PY) \
		scripts/checks/check_python.py $(@:gpu-check-%=%) failed)))

figures-gpu: gpu-check-figures-gpu $(if $(filter table,$(GPU_ONLY)),$(GPU_JPEG_DATA)/.complete)
	$(GPU_PY) scripts/figures/gpu/measure.py $(if $(filter table,$(GPU_ONLY)),--jpeg $(GPU_JPEG_DATA)) \
		--parts $(GPU_ONLY) --figures-data figures/data/gpu --runs runs/figures-gpu
	$(GPU_PY) scripts/figures/plot_results.py

gpu-smoke: gpu-check-gpu-smoke
	$(GPU_PY) scripts/gpu/smoke.py

# the device command: what a lent GPU runs in one call (scripts/gpu/check.py; scripts/gpu/README.md)
gpu-check:
	$(GPU_PY) scripts/gpu/check.py $(if $(filter-out 0,$(STAND_IN)),--stand-in) $(if $(ARCHIVE),--archive $(ARCHIVE))

# byzfl's wheel (pure Python; what a GPU node's image lacks) for gpu-check to install from, with no index
gpu-wheels: $(WHEELS)/.complete
$(WHEELS)/.complete: constraints.txt
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: -d $(WHEELS) $(shell grep '^byzfl==' constraints.txt)
	touch $@

$(COMPAT_VENV)/.installed:
	test -x $(COMPAT_PY) || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install --quiet $(COMPAT_PACKAGES)
	touch $@

# the rehearsal of the device command exactly as a GPU node runs it, then the recipes' tests, under torch 2.11
test-compat: setup $(DEMO_DATA)/.complete $(COMPAT_VENV)/.installed gpu-wheels
	$(MAKE) --no-print-directory gpu-check PY=$(COMPAT_PY) STAND_IN=1
	PYTHONPATH=$(CURDIR)/runs/gpu-check/site $(COMPAT_PY) -m pytest -q -p no:cacheprovider --durations=10 $(COMPAT_TESTS)

# (test_gpu_check.py runs in make test-compat, under torch 2.11: the suite must stay under 15 minutes on 2 cores,
# on 2 pytest-xdist workers, the tests of an xdist_group on one of them; the slowest 15 tests are printed;
# scripts/checks/test_times.py measures where the time goes, into docs/tests.md)
test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q --durations=15 -n 2 --dist loadgroup --ignore=tests/tools/test_gpu_check.py

test-mutations: setup
	$(PY) scripts/checks/mutations.py

clean:
	rm -rf runs .pytest_cache $(WHEELS)
