# make demo   generate the digits if missing, then train the ddp recipe on them (2 CPU processes, or every GPU)
# make test   the test suite (CPU, gloo; about 20 minutes on 2 cores)
# make figures          measure (I/O, scaling, learning curves, recovery, compile, compression),
#                       then redraw figures/ and RESULTS.md
# make figures QUICK=1  the same in small (lenet, few steps), written under runs/figures-quick/ instead
# Each target creates the virtual environment .venv first when it is missing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# one process per GPU, else 2 CPU processes (evaluated only once the environment exists)
NPROC = $(shell $(PY) -c "import torch; print(torch.cuda.device_count() or 2)")
DEMO_DATA := data/mnist5k
JPEG_DATA := data/imagenet-like
QUICK ?=
# QUICK=1 leaves the committed figures alone
FIG_DIR := $(if $(QUICK),runs/figures-quick,figures)
FIG_DATA := $(FIG_DIR)/data
RESULTS := $(if $(QUICK),runs/figures-quick/RESULTS.md,RESULTS.md)

.PHONY: setup demo test figures clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

$(DEMO_DATA)/.complete: | setup
	$(PY) scripts/make_demo_data.py --out $(DEMO_DATA)
	touch $@

demo: setup $(DEMO_DATA)/.complete
	rm -rf runs/demo
	$(PY) -m torch.distributed.run --standalone --nproc_per_node=$(NPROC) recipes/ddp/train.py $(DEMO_DATA) \
		-a resnet18 --image-size 28 --scale 0.6 1 --hflip 0 -b 32 --lr 0.05 --epochs 8 -j 1 --seed 0 \
		--desired-acc 0.97 --out runs/demo

$(JPEG_DATA)/.complete: | setup
	$(PY) scripts/make_demo_data.py --imagenet-like $(JPEG_DATA) --classes 10 --images 120
	touch $@

figures: setup $(DEMO_DATA)/.complete $(JPEG_DATA)/.complete
	mkdir -p $(FIG_DATA)
	$(if $(QUICK),cp RESULTS.md $(RESULTS))
	$(PY) scripts/bench_io.py $(JPEG_DATA) --csv $(FIG_DATA)/io.csv $(if $(QUICK),--workers 0 2 --repeats 1)
	$(PY) scripts/bench_scaling.py --jpeg $(JPEG_DATA) --csv $(FIG_DATA)/scaling.csv \
		$(if $(QUICK),-a lenet --image-size 16 --steps 20)
	$(PY) scripts/learning_curves.py --data $(DEMO_DATA) --figures-data $(FIG_DATA) --runs runs/curves \
		$(if $(QUICK),--quick --epochs 2)
	$(PY) scripts/bench_recovery.py --json $(FIG_DATA)/recovery.json $(if $(QUICK),--quick $(DEMO_DATA))
	$(PY) scripts/bench_compile.py $(if $(QUICK),--quick $(DEMO_DATA) --epochs 2) --csv $(FIG_DATA)/compile.csv
	$(PY) scripts/compression_table.py --data $(DEMO_DATA) --figures-data $(FIG_DATA) --figures $(FIG_DIR) \
		--results $(RESULTS) $(if $(QUICK),--quick --epochs 1 --processes 2 --methods none fp8-e4m3)
	$(PY) scripts/plot_results.py --data $(FIG_DATA) --figures $(FIG_DIR) --results $(RESULTS)

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf runs .pytest_cache
