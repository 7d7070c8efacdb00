#!/usr/bin/env bash
# The main job: builds Tandem, starts a local coordinator and two CPU workers on 127.0.0.1,
# submits examples/quickstart.yaml (a small GPT on the license texts every Debian ships),
# watches it train to the end, and stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh --programs
bin="$PWD/build/bin"
run="$(mktemp -d /tmp/tandem-demo-XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
# Training text the machine already has: the licenses in /usr/share/common-licenses.
mkdir -p "$run/data"
cat /usr/share/common-licenses/* >"$run/data/licenses.txt"
source scripts/local-cluster.sh
local_cluster_start "$bin" "$run" "$run/data" --data-root "$run/store" || [ "$?" = 2 ]
"$bin/tandem" workers
job="$("$bin/tandem" submit examples/quickstart.yaml)"
echo "submitted $job"
"$bin/tandem" watch "$job"
"$bin/tandem" status "$job"
echo "logs: $run"
