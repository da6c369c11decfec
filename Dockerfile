# syntax=docker/dockerfile:1
# Two images from one build (make docker-build IMG=… / make docker-build-runtime RUNTIME_IMG=…):
#   docker build --target operator -t IMG .          smolvm-controller and smolvm-webhook
#   docker build --target runtime  -t RUNTIME_IMG .  smolvm-runtime with smolvm 1.32.2 (linux/amd64)
# The scripts this file runs live in deploy/image/ and are tested outside Docker
# (tests/tests/deploy/dockerfile.rs).

ARG RUST_VERSION=1.95
ARG DEBIAN=bookworm

# --- dependencies: compiled from the manifests alone --------------------------------------------
# Placeholder sources (deploy/image/stub-workspace.sh) stand in for the real ones, so this layer,
# every dependency fetched and compiled, is reused until Cargo.toml or Cargo.lock change.
# Both builds use Cargo's dist profile: the release profile with fat LTO (Cargo.toml says what it
# gives).
FROM rust:${RUST_VERSION}-slim-${DEBIAN} AS deps
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY api/Cargo.toml api/Cargo.toml
COPY certs/Cargo.toml certs/Cargo.toml
COPY kit/Cargo.toml kit/Cargo.toml
COPY webhook/Cargo.toml webhook/Cargo.toml
COPY webhook-bench/Cargo.toml webhook-bench/Cargo.toml
COPY controller/Cargo.toml controller/Cargo.toml
COPY runtime/Cargo.toml runtime/Cargo.toml
COPY testkit/Cargo.toml testkit/Cargo.toml
COPY tests/Cargo.toml tests/Cargo.toml
COPY kubectl-smolvm/Cargo.toml kubectl-smolvm/Cargo.toml
COPY soak/Cargo.toml soak/Cargo.toml
COPY deploy/image/stub-workspace.sh /usr/local/bin/stub-workspace.sh
RUN sh /usr/local/bin/stub-workspace.sh . \
 && cargo build --profile dist --locked --bin smolvm-controller --bin smolvm-webhook --bin smolvm-runtime

# --- build: the real sources over the placeholders ----------------------------------------------
FROM deps AS build
COPY . .
# COPY keeps the sources' own timestamps, which may be older than the placeholder build: touch
# them so Cargo rebuilds the workspace crates (the dependencies stay compiled).
RUN find . -path ./target -prune -o -name '*.rs' -exec touch {} + \
 && cargo build --profile dist --locked --bin smolvm-controller --bin smolvm-webhook --bin smolvm-runtime \
 && mkdir -p /out \
 && cp target/dist/smolvm-controller target/dist/smolvm-webhook target/dist/smolvm-runtime /out/

# --- smolvm: the pinned smolmachines wheel, checked against its sha256, unpacked ----------------
FROM python:3.11-slim-${DEBIAN} AS smolvm
COPY deploy/image/smolmachines.txt deploy/image/unpack-smolvm.sh /tmp/smolvm/
RUN pip download --no-cache-dir --no-deps --only-binary=:all: --require-hashes \
      -r /tmp/smolvm/smolmachines.txt -d /tmp/smolvm/wheel \
 && sh /tmp/smolvm/unpack-smolvm.sh /tmp/smolvm/wheel/smolmachines-*.whl /opt/smolvm

# --- runtime image: the node agent and smolvm ---------------------------------------------------
# Runs as root, in a privileged container (deploy/base/runtime/daemonset.yaml says why): smolvm
# needs /dev/kvm and drops each VM to its own unprivileged uid. ca-certificates: smolvm pulls
# OCI images over HTTPS.
FROM debian:${DEBIAN}-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=smolvm /opt/smolvm /opt/smolvm
COPY --from=build /out/smolvm-runtime /usr/local/bin/smolvm-runtime
COPY --chmod=0755 deploy/image/runtime-entrypoint.sh /usr/local/bin/smolvm-runtime-entrypoint
ENV SMOLVM_DIST=/opt/smolvm
ENTRYPOINT ["/usr/local/bin/smolvm-runtime-entrypoint"]

# --- operator image: controller and webhook, as a non-root user ---------------------------------
# The Deployments choose the binary with `command:`; the default is the controller.
FROM debian:${DEBIAN}-slim AS operator
COPY --from=build /out/smolvm-controller /out/smolvm-webhook /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/smolvm-controller"]
