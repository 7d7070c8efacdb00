#!/usr/bin/env bash
# run.sh CHECK: one deploy check (see CMakeLists.txt here), with the tools that
# scripts/install-deps.sh --test puts in .cache/deploy-tools/venv (or $TANDEM_DEPLOY_VENV)
# ahead of PATH. Exit 77 (a skip for ctest), saying why, when a tool is missing.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${TANDEM_DEPLOY_VENV:-$src/.cache/deploy-tools/venv}"
[ -d "$venv/bin" ] && export PATH="$venv/bin:$PATH"
python=python3
[ -x "$venv/bin/python" ] && python="$venv/bin/python"
command -v "$python" >/dev/null || { echo "skip: no python3"; exit 77; }
tool=("$python" "$src/deploy/tools/manifests.py")
bin="${TANDEM_BIN_DIR:-$src/build/bin}"
overlays=()
# The overlays, and the secure ones (deploy/k8s/secure/*; its tls/ is a Component, not one).
for d in "$src"/deploy/k8s/overlays/*/ "$src"/deploy/k8s/secure/*/; do
  grep -q '^kind: Component' "$d/kustomization.yaml" || overlays+=("${d%/}")
done

case "$1" in
  render)  # every overlay renders with kubectl kustomize
    for o in "${overlays[@]}"; do
      rc=0
      out="$("${tool[@]}" render "$o" 2>&1)" || rc=$?
      [ "$rc" = 0 ] || { echo "$out"; exit "$rc"; }
      echo "$o: $(grep -c '^kind:' <<<"$out") documents"
    done ;;
  validate)  # ... and every document is valid against the API schemas, offline, strict
    exec "${tool[@]}" validate "${overlays[@]}" ;;
  binaries)  # ... and consistent with the programs they run
    exec "${tool[@]}" check --bin "$bin" "${overlays[@]}" ;;
  mutants)  # the check above catches each mistake of tests/deploy/mutants
    exec "${tool[@]}" mutants --bin "$bin" "$src/tests/deploy/mutants" ;;
  dockerfiles)  # multi-stage, the README's build commands, non-root, the three programs
    exec "${tool[@]}" dockerfiles "$src/deploy/docker" ;;
  hadolint)
    command -v hadolint >/dev/null ||
      { echo "skip: hadolint is not installed (scripts/install-deps.sh --test installs it)"; exit 77; }
    hadolint --config "$src/deploy/docker/hadolint.yaml" "$src"/deploy/docker/Dockerfile.*
    echo "hadolint: $(ls "$src"/deploy/docker/Dockerfile.* | wc -l) Dockerfiles clean" ;;
  rehearsal)
    exec "$src/scripts/cluster-local.sh" ;;
  rehearsal-secure)  # the same with TLS: the secure overlay, Secrets from dev-certs.sh
    exec "$src/scripts/cluster-local.sh" "$src/deploy/k8s/secure/cpu" ;;
  *) echo "unknown check $1"; exit 2 ;;
esac
