#!/usr/bin/env bash
# The main job: builds Tandem, starts a local coordinator and two CPU workers on 127.0.0.1,
# submits examples/quickstart.yaml (a small GPT on the license texts every Debian ships),
# watches it train to the end, and stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
bin="$PWD/build/bin"
run="$(mktemp -d /tmp/tandem-demo-XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
"$bin/tandem-coordinator" --listen 127.0.0.1:0 --port-file "$run/coordinator.port" \
  --data-root "$run/store" >"$run/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$run/coordinator.port" ] && break; sleep 0.1; done
[ -s "$run/coordinator.port" ] || { cat "$run/coordinator.log"; exit 1; }
export TANDEM_COORDINATOR="127.0.0.1:$(cat "$run/coordinator.port")"
# Training text the machine already has: the licenses in /usr/share/common-licenses.
mkdir -p "$run/data"
cat /usr/share/common-licenses/* >"$run/data/licenses.txt"
for i in 0 1; do
  "$bin/tandem-worker" --coordinator "$TANDEM_COORDINATOR" --listen 127.0.0.1:0 --device cpu \
    --threads 1 --data-root "$run/data" >"$run/worker$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do
  [ "$("$bin/tandem" workers -o json | grep -c '"IDLE"' || true)" -ge 2 ] && break
  sleep 0.1
done
"$bin/tandem" workers
job="$("$bin/tandem" submit examples/quickstart.yaml)"
echo "submitted $job"
"$bin/tandem" watch "$job"
"$bin/tandem" status "$job"
echo "logs: $run"
