# The two set-up commands of the README: `make run` and `make test`.
# Each installs what it needs from nothing: a Python 3.13 venv with the project,
# and (for tests) DynamoDB Local from the npm package amplify-dynamodb-simulator.

SHELL := /bin/bash
# python3.13: pyenv's newest 3.13 if pyenv has one (its shim fails unless selected), else PATH.
PYENV_313 := $(shell pyenv versions --bare 2>/dev/null | grep -E '^3\.13(\.[0-9]+)?$$' | sort -V | tail -n1)
PYTHON ?= $(shell { [ -n "$(PYENV_313)" ] && PYENV_VERSION=$(PYENV_313) pyenv which python3.13; } 2>/dev/null || command -v python3.13)
VENV := .venv
BIN := $(VENV)/bin
DDB_VERSION := 2.9.30
DDB_DIR := .tools/dynamodb-local
SAM_VENV := .tools/sam
PORT ?= 3000
# Where `make run` keeps conversations across restarts; `make run DATA_DIR=` keeps them in memory.
DATA_DIR ?= .data
ARGS ?=

.PHONY: run test lint typecheck template bench clean

$(BIN)/turnledger: pyproject.toml
	@test -n "$(PYTHON)" || { echo "python3.13 not found (pyenv install 3.13 or put it on PATH)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

$(DDB_DIR)/DynamoDBLocal.jar:
	mkdir -p $(DDB_DIR)
	cd $(DDB_DIR) && npm pack --silent amplify-dynamodb-simulator@$(DDB_VERSION) >/dev/null \
	  && tar xzf amplify-dynamodb-simulator-$(DDB_VERSION).tgz --strip-components=2 package/emulator \
	  && rm -f amplify-dynamodb-simulator-$(DDB_VERSION).tgz

## Run the service locally on 127.0.0.1:$(PORT), conversations in $(DATA_DIR), the demo model.
run: $(BIN)/turnledger
	$(BIN)/turnledger local --port $(PORT) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(ARGS)

## Run every test: unit, functional (moto), contract, integration (DynamoDB Local), HTTP.
test: $(BIN)/turnledger $(DDB_DIR)/DynamoDBLocal.jar
	TURNLEDGER_DYNAMODB_LOCAL_JAR=$(abspath $(DDB_DIR))/DynamoDBLocal.jar $(BIN)/pytest -n 2 $(ARGS)

lint: $(BIN)/turnledger
	$(BIN)/ruff check layers functions tests bench
	$(BIN)/ruff format --check layers functions

typecheck: $(BIN)/turnledger
	$(BIN)/mypy layers/turnledger/turnledger functions

$(SAM_VENV)/bin/sam:
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install --quiet aws-sam-cli

## Check the SAM template offline: lint and a full build (needs python3.13 on PATH).
template: $(SAM_VENV)/bin/sam
	$(SAM_VENV)/bin/sam validate --lint
	PATH="$(dir $(PYTHON)):$$PATH" $(SAM_VENV)/bin/sam build --no-cached

bench: $(BIN)/turnledger $(DDB_DIR)/DynamoDBLocal.jar
	TURNLEDGER_DYNAMODB_LOCAL_JAR=$(abspath $(DDB_DIR))/DynamoDBLocal.jar $(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) .tools .aws-sam
