# smolvm-operator: the developer entry points. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# smolvm (PyPI smolmachines 1.32.2) is installed into a private venv by .ci/install-smolvm.sh;
# the runtime's tests drive the real `smolvm serve` through it.
SMOLVM_ENV = eval "$$(bash .ci/install-smolvm.sh)"

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

.PHONY: generate
generate: ## Generate the CRDs from the Rust types into deploy/crds/ and print them.
	$(CARGO) run -q -p smolvm-controller --bin crdgen
	@cat deploy/crds/*.yaml

.PHONY: manifests
manifests: ## Regenerate every generated manifest (the CRDs).
	$(CARGO) run -q -p smolvm-controller --bin crdgen

.PHONY: fmt
fmt: ## Format the code.
	$(CARGO) fmt --all

.PHONY: vet
vet: ## Check formatting and lints (clippy, warnings are errors).
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: build
build: ## Build every binary.
	$(CARGO) build --workspace --bins

.PHONY: test
test: ## Run every test tier (installs smolvm for the runtime's tests on first use).
	$(SMOLVM_ENV) && $(CARGO) test --workspace

.PHONY: bench
bench: ## Run the benchmarks and print their figures.
	$(CARGO) bench -p smolvm-api --bench admission
	$(CARGO) bench -p smolvm-controller --bench placement
	$(SMOLVM_ENV) && $(CARGO) bench -p smolvm-runtime --bench nodeapi_latency

.PHONY: install
install: ## Install the CRDs into the cluster of the current KUBECONFIG.
	kubectl apply --server-side -f deploy/crds/

.PHONY: uninstall
uninstall: ## Remove the CRDs (and with them every SmolVM and SmolVMNode).
	kubectl delete --ignore-not-found -f deploy/crds/
