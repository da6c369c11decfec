# syntax=docker/dockerfile:1
# Two images from one build:
#   docker build --target operator -t IMG .          (smolvm-controller and smolvm-webhook)
#   docker build --target runtime  -t RUNTIME_IMG .  (smolvm-runtime with smolvm 1.32.2)

ARG RUST_VERSION=1.95
ARG DEBIAN=bookworm

# --- dependencies, cached apart from the sources -------------------------------------------
FROM rust:${RUST_VERSION}-slim-${DEBIAN} AS deps
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY api/Cargo.toml api/Cargo.toml
COPY certs/Cargo.toml certs/Cargo.toml
COPY webhook/Cargo.toml webhook/Cargo.toml
COPY controller/Cargo.toml controller/Cargo.toml
COPY runtime/Cargo.toml runtime/Cargo.toml
COPY tests/Cargo.toml tests/Cargo.toml
# Stub sources so `cargo fetch` and a dependency build can run before the real sources arrive.
RUN for c in api certs webhook controller runtime tests; do mkdir -p $c/src && echo '' > $c/src/lib.rs; done \
 && cargo fetch --locked

# --- build ---------------------------------------------------------------------------------
FROM deps AS build
COPY . .
RUN cargo build --release --locked --bins \
 && mkdir -p /out \
 && for b in smolvm-controller smolvm-webhook smolvm-runtime; do \
      if [ -f target/release/$b ]; then cp target/release/$b /out/; fi; \
    done

# --- operator image: controller + webhook ------------------------------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/smolvm-controller"]

# --- runtime image: agent + smolvm unpacked from the smolmachines wheel ------------------------
FROM python:3.11-slim-${DEBIAN} AS smolvm
RUN pip install --no-cache-dir --no-deps --target /opt/wheel smolmachines==1.32.2 \
 && test -x /opt/wheel/smol/smol-vmm -o -f /opt/wheel/smol/smol-vmm \
 && chmod +x /opt/wheel/smol/smol-vmm

FROM debian:${DEBIAN}-slim AS runtime
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=smolvm /opt/wheel/smol /opt/smolvm
COPY --from=build /out/smolvm-runtime /usr/local/bin/smolvm-runtime
ENV SMOLVM_BIN=/opt/smolvm/smol-vmm \
    SMOLVM_BOOT_BINARY=/opt/smolvm/smol-vmm \
    SMOLVM_LIB_DIR=/opt/smolvm \
    SMOLVM_AGENT_ROOTFS_TAR=/opt/smolvm/agent-rootfs.tar.zst
# The agent owns /dev/kvm, /var/lib/smolvm and /var/run/smolvm on the node; it runs as root in a
# DaemonSet that grants only the KVM device and those host paths.
ENTRYPOINT ["/usr/local/bin/smolvm-runtime"]
