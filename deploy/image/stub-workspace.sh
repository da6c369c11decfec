#!/bin/sh
# Creates placeholder sources for every target the workspace's manifests declare, so that Cargo
# can resolve and build the dependencies from Cargo.toml and Cargo.lock alone. The Dockerfile's
# `deps` stage runs it before copying the sources: that layer (all dependencies, compiled) is
# then rebuilt only when a manifest or the lock file changes.
#
#   sh deploy/image/stub-workspace.sh [WORKSPACE_DIR]
#
# For each member directory with a Cargo.toml: src/lib.rs (empty), and `fn main() {}` at the path
# of every [[bin]], [[bench]], [[test]] and [[example]] (explicit `path`, else Cargo's default).
# Existing files are left alone.
set -eu

root="${1:-.}"
cd "$root"
[ -f Cargo.toml ] || { echo "stub-workspace.sh: no Cargo.toml in $root" >&2; exit 1; }

stub() { # FILE CONTENT
  if [ ! -e "$1" ]; then
    mkdir -p "$(dirname "$1")"
    printf '%s\n' "$2" >"$1"
  fi
}

found=0
for manifest in */Cargo.toml; do
  [ -f "$manifest" ] || continue
  found=1
  crate="$(dirname "$manifest")"
  stub "$crate/src/lib.rs" ""
  # One line per declared target: KIND NAME PATH (PATH "-" when not given).
  awk '
    function flush() { if (kind != "") print kind, (name == "" ? "-" : name), (path == "" ? "-" : path) }
    /^[[:space:]]*\[\[(bin|bench|test|example)\]\][[:space:]]*$/ {
      flush(); kind = $0; gsub(/[][[:space:]]/, "", kind); name = ""; path = ""; next
    }
    /^[[:space:]]*\[/ { flush(); kind = ""; next }
    kind != "" && /^[[:space:]]*(name|path)[[:space:]]*=/ {
      value = $0; sub(/^[^=]*=[[:space:]]*"/, "", value); sub(/".*$/, "", value)
      if ($0 ~ /^[[:space:]]*name/) name = value; else path = value
    }
    END { flush() }
  ' "$manifest" | while read -r kind name path; do
    if [ "$path" = "-" ]; then
      case "$kind" in
        bin) path="src/bin/$name.rs" ;;
        bench) path="benches/$name.rs" ;;
        test) path="tests/$name.rs" ;;
        example) path="examples/$name.rs" ;;
      esac
    fi
    stub "$crate/$path" "fn main() {}"
  done
done
[ "$found" = 1 ] || { echo "stub-workspace.sh: no member Cargo.toml under $root" >&2; exit 1; }
