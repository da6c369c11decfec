#!/usr/bin/env bash
# Runs Checkov (the pinned 3.3.30, .ci/install-checkov.sh) on what the two installs render:
# `kubectl kustomize deploy/default` and the chart's default `helm template`. Prints each
# render's counts and every skipped check with its reason, and fails on any failed check and on
# any skip without a reason (docs/operations.md, "What a security scanner reports, and why").
#
#   make scan      (installs Checkov and Helm first)
#
# CHECKOV and HELM name the binaries (default: $SMOLVM_CHECKOV, $SMOLVM_HELM, then PATH).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
checkov="${CHECKOV:-${SMOLVM_CHECKOV:-checkov}}"
helm="${HELM:-${SMOLVM_HELM:-helm}}"
kubectl="${KUBECTL:-kubectl}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$kubectl" kustomize "$repo/deploy/default" >"$work/kustomize-default.yaml"
"$helm" template smolvm-operator "$repo/deploy/helm/smolvm-operator" --namespace smolvm-system \
  >"$work/helm-default.yaml"

status=0
for render in kustomize-default helm-default; do
  # --skip-download: no network calls (Checkov would fetch guidelines from its vendor's API).
  "$checkov" --file "$work/$render.yaml" --framework kubernetes --skip-download \
    --output json >"$work/$render.json" 2>"$work/$render.err" || true
  # Checkov exits 1 on any failure; the report says which.
  python3 - "$render" "$work/$render.json" <<'PY' || status=1
import json, sys
render, path = sys.argv[1], sys.argv[2]
with open(path) as f:
    text = f.read()
if not text.strip():
    sys.exit(f"{render}: Checkov printed no report")
report = json.loads(text)
reports = report if isinstance(report, list) else [report]
failed, skipped, passed = [], [], 0
for r in reports:
    passed += r["summary"]["passed"]
    failed += r["results"]["failed_checks"]
    skipped += r["results"]["skipped_checks"]
print(f"{render}: {passed} passed, {len(failed)} failed, {len(skipped)} skipped")
bad = 0
for c in sorted(skipped, key=lambda c: (c["resource"], c["check_id"])):
    reason = (c.get("check_result") or {}).get("suppress_comment") or ""
    print(f"  skipped {c['check_id']:<11} {c['resource']}: {reason}")
    if len(reason) < 40 or reason == "No comment provided":
        print(f"    ^ no reason a reviewer can check")
        bad += 1
for c in failed:
    print(f"  FAILED  {c['check_id']:<11} {c['resource']}: {c['check_name']}")
    bad += 1
sys.exit(1 if bad else 0)
PY
done
exit $status
