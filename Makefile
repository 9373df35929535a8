# The two set-up commands of the README: `make run` and `make test`.
# Each installs what it needs from nothing: a Python 3.13 venv with the project (`make run`:
# the server's own extras only; `make test`: the dev tools too), and (for tests) DynamoDB
# Local from the npm package amplify-dynamodb-simulator.

SHELL := /bin/bash
# python3.13: pyenv's newest 3.13 if pyenv has one (its shim fails unless selected), else PATH.
PYENV_313 := $(shell pyenv versions --bare 2>/dev/null | grep -E '^3\.13(\.[0-9]+)?$$' | sort -V | tail -n1)
PYTHON ?= $(shell { [ -n "$(PYENV_313)" ] && PYENV_VERSION=$(PYENV_313) pyenv which python3.13; } 2>/dev/null || command -v python3.13)
VENV := .venv
BIN := $(VENV)/bin
# What each venv holds: `.[local]` (runtime + the local runner) or `.[dev]` (+ test tools).
LOCAL_STAMP := $(VENV)/.installed-local
DEV_STAMP := $(VENV)/.installed-dev
DDB_VERSION := 2.9.30
DDB_DIR := .tools/dynamodb-local
# The IAM policy simulator of tests/http/test_http_permissions.py (pinned, as DynamoDB Local).
IAM_SIMULATE_VERSION := 0.1.173
IAM_SIMULATE_DIR := .tools/iam-simulate
# The Vercel AI SDK of tests/http/test_http_chat_clients.py, driving the Chat Completions face
# (pinned, as the other tools: AI SDK 6 and its OpenAI provider 3).
AI_SDK_VERSION := 6.0.333
AI_SDK_OPENAI_VERSION := 3.0.141
AI_SDK_DIR := .tools/ai-sdk
SAM_VENV := .tools/sam
# checkov pins its own dependencies: a venv of its own, never the project's. Pinned: a
# newer checkov adds checks, which should be a change of ours, not a surprise in CI.
CHECKOV_VENV := .tools/checkov
CHECKOV_VERSION := 3.3.30
PORT ?= 3000
# Where `make run` keeps conversations across restarts; `make run DATA_DIR=` keeps them in memory.
DATA_DIR ?= .data
ARGS ?=

.PHONY: run test lint typecheck template quota bench clean chromium

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "python3.13 not found (pyenv install 3.13 or put it on PATH)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

## The server alone: runtime dependencies and the local runner's (moto, PyYAML).
$(LOCAL_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[local]'
	@touch $@

## Everything: the server, tests, linters, type checker.
$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@ $(LOCAL_STAMP)

$(BIN)/turnledger: $(DEV_STAMP)
	@touch $@

$(DDB_DIR)/DynamoDBLocal.jar:
	mkdir -p $(DDB_DIR)
	cd $(DDB_DIR) && npm pack --silent amplify-dynamodb-simulator@$(DDB_VERSION) >/dev/null \
	  && tar xzf amplify-dynamodb-simulator-$(DDB_VERSION).tgz --strip-components=2 package/emulator \
	  && rm -f amplify-dynamodb-simulator-$(DDB_VERSION).tgz

## @cloud-copilot/iam-simulate from the npm registry: evaluates each AWS call the functions
## make against their roles (tests/support/iam_policies.py).
$(IAM_SIMULATE_DIR)/node_modules/@cloud-copilot/iam-simulate/package.json:
	mkdir -p $(IAM_SIMULATE_DIR)
	npm install --silent --no-audit --no-fund --no-save --prefix $(IAM_SIMULATE_DIR) \
	  @cloud-copilot/iam-simulate@$(IAM_SIMULATE_VERSION)

## The Vercel AI SDK (`ai`, `@ai-sdk/openai`) from the npm registry, for the Chat Completions
## face's client test (tests/support/ai_sdk_chat.mjs).
$(AI_SDK_DIR)/node_modules/ai/package.json:
	mkdir -p $(AI_SDK_DIR)
	npm install --silent --no-audit --no-fund --no-save --prefix $(AI_SDK_DIR) \
	  ai@$(AI_SDK_VERSION) @ai-sdk/openai@$(AI_SDK_OPENAI_VERSION)

## Debian's Chromium for the approval page's browser test (tests/http/test_approvals_page.py),
## launched by path through the playwright package; installed once, skipped when present.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    $(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq \
	    && $(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "chromium not found: install it for the approval page's browser test"; fi; }

## Run the service locally on 127.0.0.1:$(PORT), conversations in $(DATA_DIR), the demo model.
run: $(LOCAL_STAMP)
	$(BIN)/turnledger local --port $(PORT) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(ARGS)

## Run every test: unit, functional (moto), contract, integration (DynamoDB Local), HTTP.
test: $(DEV_STAMP) $(DDB_DIR)/DynamoDBLocal.jar $(IAM_SIMULATE_DIR)/node_modules/@cloud-copilot/iam-simulate/package.json $(AI_SDK_DIR)/node_modules/ai/package.json chromium
	TURNLEDGER_DYNAMODB_LOCAL_JAR=$(abspath $(DDB_DIR))/DynamoDBLocal.jar $(BIN)/pytest -n 2 $(ARGS)

## Code style, and the template's security scan: every checkov check passes or is skipped in
## template.yaml with its reason (a skip without one fails tests/unit/test_template_hardening.py).
## --skip-download: offline, no Prisma Cloud account.
lint: $(DEV_STAMP) $(CHECKOV_VENV)/bin/checkov
	$(BIN)/ruff check layers functions tests bench
	$(BIN)/ruff format --check layers functions
	$(CHECKOV_VENV)/bin/checkov --quiet --compact --skip-download --framework cloudformation \
	  --file template.yaml

$(CHECKOV_VENV)/bin/checkov:
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet checkov==$(CHECKOV_VERSION)

typecheck: $(DEV_STAMP)
	$(BIN)/mypy layers/turnledger/turnledger layers/local/turnledger_local functions

$(SAM_VENV)/bin/sam:
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install --quiet aws-sam-cli

## Check the SAM template without an AWS account: lint and a full build (needs python3.13
## on PATH), whose layer must ship every module's bytecode (layers/turnledger/Makefile).
template: $(SAM_VENV)/bin/sam
	$(SAM_VENV)/bin/sam validate --lint
	PATH="$(dir $(PYTHON)):$$PATH" $(SAM_VENV)/bin/sam build --no-cached
	$(PYTHON) tests/support/layer_bytecode.py .aws-sam/build/TurnledgerLayer/python

## The account concurrency quota a deployment needs: make quota ARGS='ReservedConcurrency=on'
## (ARGS: sam deploy's --parameter-overrides pairs; docs/DEPLOY.md, First deploy).
quota: $(LOCAL_STAMP)
	$(BIN)/turnledger quota $(ARGS)

bench: $(DEV_STAMP) $(DDB_DIR)/DynamoDBLocal.jar
	TURNLEDGER_DYNAMODB_LOCAL_JAR=$(abspath $(DDB_DIR))/DynamoDBLocal.jar $(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) .tools .aws-sam
