# Lumigo Kubernetes Operator (Python re-implementation).
# The two commands a newcomer needs: `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Two pytest processes side by side (hack/test-tiers): the real-node tier in one, every other
# tier in the other. TEST_WORKERS=0 runs everything in one process, in file order.
TEST_WORKERS ?= 2
export PATH := $(CURDIR)/bin:$(PATH)

.PHONY: help
help: ## Show the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check --require-hashes --no-deps -r requirements.lock
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@# The repository root on the venv's path (the product is there through -e .): envtest/,
	@# tests/ and bench/ import each other without a sys.path line in every script.
	$(VENV)/bin/python -c 'import site, sys; open(site.getsitepackages()[0] + "/lumigo-operator-dev.pth", "w").write(sys.argv[1] + "\n")' $(CURDIR)
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create .venv from the lock file

.PHONY: tools
tools: ## Build/install the pinned upstream tools into bin/ (cached in ~/.cache/lumigo-operator)
	$(PYTHON) hack/install-tools all

.PHONY: manifests
manifests: venv ## Regenerate the CRD (and its copies) from the api/ schemas
	$(PY) hack/gen-manifests

.PHONY: bundle
bundle: manifests ## Regenerate the OLM bundle (bundle/, bundle.Dockerfile) from config/
	$(PY) hack/gen-bundle

.PHONY: chart-readme
chart-readme: venv ## Regenerate charts/lumigo-operator/README.md from the chart's values.yaml
	$(PY) hack/gen-chart-readme

.PHONY: catalog
catalog: bundle ## Regenerate the file-based OLM catalog (catalog/, catalog.Dockerfile) from bundle/
	$(PYTHON) hack/install-tools helm-olm
	$(PY) hack/gen-catalog

IMG ?= quay.io/lumigo/lumigo-operator:v$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
.PHONY: docker-build
docker-build: ## Build the operator image (needs docker; the autotrace image: injector/Dockerfile)
	docker build -t $(IMG) .

# Releases (docs/releasing.md): REGISTRY=host[:port][/prefix] VERSION=x.y.z; a registry's
# credentials (docker config.json) and private CA (PEM) through REGISTRY_AUTH_FILE/REGISTRY_CA_FILE.
RELEASE_FLAGS = --registry "$(REGISTRY)" --version "$(VERSION)" \
	$(if $(REGISTRY_AUTH_FILE),--auth-file "$(REGISTRY_AUTH_FILE)") \
	$(if $(REGISTRY_CA_FILE),--ca-file "$(REGISTRY_CA_FILE)")
.PHONY: release-args
release-args:
	@test -n "$(REGISTRY)" -a -n "$(VERSION)" || { echo "usage: make $(MAKECMDGOALS) REGISTRY=host[:port][/prefix] VERSION=x.y.z" >&2; exit 2; }

.PHONY: release
release: release-args venv images ## Push images (OCI indexes), SBOMs, signatures, chart, bundle: REGISTRY=… VERSION=…
	$(PYTHON) hack/install-tools helm-olm cosign
	$(PY) hack/release publish $(RELEASE_FLAGS) $(if $(RELEASE_KEY_DIR),--key-dir "$(RELEASE_KEY_DIR)")

.PHONY: verify-release
verify-release: release-args venv ## Verify a release's signatures and SBOMs: REGISTRY=… VERSION=… [RELEASE_KEY=cosign.pub]
	$(PYTHON) hack/install-tools cosign
	$(PY) hack/release verify $(RELEASE_FLAGS) $(if $(RELEASE_KEY),--key "$(RELEASE_KEY)")

.PHONY: lint
lint: venv ## ruff (lint + format check), mypy --strict, import-linter (the layering, pyproject.toml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict kube api webhook controller
	$(VENV)/bin/lint-imports

.PHONY: fmt
fmt: venv ## Format the code
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

.PHONY: system-deps
system-deps: ## Install the Debian packages the injector needs (musl-tools, aarch64 gcc, valgrind) if missing
	hack/install-system-deps

.PHONY: payload
payload: venv system-deps ## Build lumigo_injector.so (x86_64 + aarch64) and the tracer payload tree in build/payload (cached)
	$(PY) injector/build-payload --out build/payload

.PHONY: images
images: system-deps payload ## Build the container images from Debian packages, no registry (cached)
	$(PYTHON) hack/install-tools otelcol
	$(PYTHON) hack/build-images

.PHONY: test
test: venv system-deps ## Install what is missing, then run every test tier
	@# The tool builds (CPU), the payload's downloads (network) and lint overlap on a cold machine
	@# (their lines interleave; each says which step it comes from).
	$(MAKE) --no-print-directory -j3 tools payload lint
	$(MAKE) --no-print-directory images
	TEST_WORKERS=$(TEST_WORKERS) PY=$(PY) hack/test-tiers $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv ## Only the unit tier (no processes)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

.PHONY: run
run: venv system-deps tools payload ## Local control plane (+ a real node where possible), the operator, a traced demo; Ctrl-C stops
	$(PY) hack/run-local

.PHONY: clean
clean: ## Remove build outputs (not the tool cache)
	rm -rf bin build .pytest_cache .mypy_cache .ruff_cache
