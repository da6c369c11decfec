#!/usr/bin/env bash
# Installs the Debian packages the cluster tier (`make cluster-e2e`) needs, when any is missing:
# containerd, runc and the CNI plugins run the node's pods; buildah builds the images without a
# container engine daemon; catatonit is the pods' pause process and busybox the probe pod's
# tools; iptables serves kube-proxy; etcd-server is the node's etcd; prometheus scrapes the
# pods with deploy/components/monitoring's rules (and carries promtool for the rules' tests).
#
#   bash tests/scripts/cluster-deps.sh
#
# The Kubernetes binaries themselves (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy) are in no package registry: the tier finds them as envtest does
# (KUBEBUILDER_ASSETS, TEST_ASSET_<NAME>, PATH) and skips, saying so, without them.
set -euo pipefail

# program:package
want=(
  containerd:containerd
  ctr:containerd
  runc:runc
  buildah:buildah
  catatonit:catatonit
  iptables:iptables
  ip:iproute2
  etcd:etcd-server
  prometheus:prometheus
)
missing=()
for entry in "${want[@]}"; do
  program=${entry%%:*} package=${entry#*:}
  if ! command -v "$program" >/dev/null 2>&1 && [[ ! " ${missing[*]} " == *" $package "* ]]; then
    missing+=("$package")
  fi
done
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)

if [ ${#missing[@]} -eq 0 ]; then
  echo "cluster-deps: everything is installed" >&2
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "cluster-deps: missing ${missing[*]}; run as root to install them (apt-get)" >&2
  exit 0
fi
echo "cluster-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: containerd's and buildah's recommendations pull in services this
# tier starts itself, or not at all.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
