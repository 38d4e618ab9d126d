# make demo   generate the digits if missing, then train the ddp recipe on them (2 CPU processes, or every GPU)
# make test   the test suite (CPU, gloo; about 5 minutes on 2 cores)
# Each target creates the virtual environment .venv first when it is missing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# one process per GPU, else 2 CPU processes (evaluated only once the environment exists)
NPROC = $(shell $(PY) -c "import torch; print(torch.cuda.device_count() or 2)")
DEMO_DATA := data/mnist5k

.PHONY: setup demo test clean

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

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf runs .pytest_cache
