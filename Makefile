# Two commands do all the set-up: `make lab` and `make test`. One NVIDIA GPU: `make lab PROFILE=gpu`.
PYTHON ?= python3
PROFILE ?= cpu
# each profile has its own environment, so switching never reinstalls the other
VENV ?= $(if $(filter cpu,$(PROFILE)),.venv,.venv-$(PROFILE))
PY := $(VENV)/bin/python
# PyTorch's CPU wheel index, added by install/install.py only when pip's own indexes lack the CPU torch that
# vLLM's CPU build pins: point it at a mirror or proxy if you have one
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
export TORCH_CPU_INDEX
DEV := $(if $(filter client,$(PROFILE)),,--dev)
# the engine `make lab` starts: WORKSHOP_PROFILE=gpu for the gpu environment, the default (cpu) otherwise
LAB_ENV := $(if $(filter gpu,$(PROFILE)),WORKSHOP_PROFILE=gpu)

.PHONY: lab test venv up down clean-venv image lab-image lab-container router-image

# install/install.py: the profile's pins from pyproject.toml and its requirements file (reinstalled when either
# changes), PyTorch's CPU index when needed, the workshop in place, and a check of what the profile promises
$(VENV)/.installed-$(PROFILE): pyproject.toml requirements.txt requirements-gpu.txt requirements-client.txt install/install.py
	@$(PYTHON) install/install.py --profile $(PROFILE) --preflight
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) install/install.py --profile $(PROFILE) $(DEV)
	touch $@

venv: $(VENV)/.installed-$(PROFILE)

lab: venv  ## create the environment, start the local engine, open JupyterLab
	$(LAB_ENV) $(VENV)/bin/workshop lab

# The engine tests one at a time, and beside them the tests without an engine on TEST_WORKERS cores (pytest-xdist,
# each file on one worker) at a lower CPU priority (nice), so that they take the cores the engine tests leave idle
# (about 40% of a 2-core machine while vLLM starts and a notebook waits). The tests without an engine print into
# build/unit-tests.log, shown when both runs have ended. Both always run, and the first failure's status is returned
# (an empty selection, status 5, is no failure unless both are empty). One WORKSHOP_TEST_SUITE merges both runs into
# build/test-times.md (tests/timetable.py).
# PYTEST_ARGS go to both runs: make test PYTEST_ARGS="-k kv"
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
NICE ?= 10
# pytest for the run in the background: a non-interactive shell starts it with SIGINT ignored, so this puts Python's
# Ctrl-C handler back (Ctrl-C then stops both runs)
BESIDE := $(PY) -c "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); sys.exit(pytest.main(sys.argv[1:]))"
test: venv  ## create the environment if needed, run the whole suite
	@export WORKSHOP_TEST_SUITE=suite-$$(date +%Y%m%dT%H%M%S)-$$$$; mkdir -p build; rm -f build/unit-tests.status; \
	echo 'beside: nice -n $(NICE) $(PY) -m pytest -m "not engine" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) > build/unit-tests.log'; \
	(nice -n $(NICE) $(BESIDE) -m "not engine" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) \
	  > build/unit-tests.log 2>&1; echo $$? > build/unit-tests.status) & \
	echo '$(PY) -m pytest -m engine $(PYTEST_ARGS)'; \
	$(PY) -m pytest -m engine $(PYTEST_ARGS); engine=$$?; \
	wait; unit=$$(cat build/unit-tests.status 2>/dev/null || echo 1); \
	echo; echo '---- the tests without an engine (build/unit-tests.log)'; cat build/unit-tests.log; \
	echo "tests without an engine: exit $$unit; engine tests: exit $$engine (5: none selected)"; \
	if [ $$unit -eq 5 ] && [ $$engine -eq 5 ]; then exit 5; fi; \
	if [ $$unit -ne 0 ] && [ $$unit -ne 5 ]; then exit $$unit; fi; \
	if [ $$engine -ne 0 ] && [ $$engine -ne 5 ]; then exit $$engine; fi

up: venv
	$(LAB_ENV) $(VENV)/bin/workshop up

down: venv
	$(LAB_ENV) $(VENV)/bin/workshop down

clean-venv:
	rm -rf $(VENV)

# Images (images/notebook/Containerfile), with docker or podman; they install through install/install.py too.
IMAGE ?= workshop-notebook:dev
LAB_IMAGE ?= workshop-lab-cpu:dev
ROUTER_IMAGE ?= workshop-router:0.1.17-v0.33.0
CONTAINER ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)
CONTAINERFILE := images/notebook/Containerfile
BUILD_ARGS := --build-arg TORCH_CPU_INDEX=$(TORCH_CPU_INDEX)

image:  ## the participants' notebook image for the cluster: make image IMAGE=registry/name:tag
	@test -n "$(CONTAINER)" || { echo "make image needs docker or podman on PATH (or CONTAINER=/path/to/one)" >&2; exit 2; }
	$(CONTAINER) build -f $(CONTAINERFILE) --target notebook $(BUILD_ARGS) -t $(IMAGE) .

lab-image:  ## the self-study image (vLLM's CPU build, the tiny models, workshop lab)
	@test -n "$(CONTAINER)" || { echo "make lab-image needs docker or podman on PATH (or CONTAINER=/path/to/one)" >&2; exit 2; }
	$(CONTAINER) build -f $(CONTAINERFILE) --target lab-cpu $(BUILD_ARGS) -t $(LAB_IMAGE) .

lab-container: lab-image  ## build the self-study image and run it: JupyterLab on http://127.0.0.1:8888
	$(CONTAINER) run --rm -it -p 127.0.0.1:8888:8888 $(LAB_IMAGE)

router-image:  ## vLLM's router for k8s/components/router (images/router/Containerfile): make router-image ROUTER_IMAGE=registry/name:tag
	@test -n "$(CONTAINER)" || { echo "make router-image needs docker or podman on PATH (or CONTAINER=/path/to/one)" >&2; exit 2; }
	$(CONTAINER) build -f images/router/Containerfile --target router -t $(ROUTER_IMAGE) .
