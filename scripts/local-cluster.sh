# Sourced by scripts/demo.sh and the benchmarks: starts a local coordinator and two CPU workers
# (one thread each) on 127.0.0.1. The caller defines the array `pids` (the processes are
# appended to it, for its cleanup trap) and sources this file.
#
#   local_cluster_start BIN RUN WORKER_DATA_ROOT [COORDINATOR FLAGS...]
#
# BIN holds the binaries, RUN is a scratch directory for the port file and logs. Exports
# TANDEM_COORDINATOR. Returns 1, printing its log, when the coordinator does not come up within
# 10 s; 2, printing the workers' logs, when the two workers are not both registered and idle
# by then (a job submitted anyway waits for them in the queue).
local_cluster_start() {
  local bin="$1" run="$2" data="$3"
  shift 3
  "$bin/tandem-coordinator" --listen 127.0.0.1:0 --port-file "$run/coordinator.port" "$@" \
    >"$run/coordinator.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$run/coordinator.port" ] && break; sleep 0.1; done
  [ -s "$run/coordinator.port" ] || { cat "$run/coordinator.log" >&2; return 1; }
  export TANDEM_COORDINATOR="127.0.0.1:$(cat "$run/coordinator.port")"
  local i
  for i in 0 1; do
    "$bin/tandem-worker" --coordinator "$TANDEM_COORDINATOR" --listen 127.0.0.1:0 --device cpu \
      --threads 1 --data-root "$data" >"$run/worker$i.log" 2>&1 &
    pids+=($!)
  done
  local idle=0
  for _ in $(seq 100); do
    idle="$("$bin/tandem" workers -o json | grep -c '"IDLE"' || true)"
    [ "$idle" -ge 2 ] && return 0
    sleep 0.1
  done
  echo "local cluster: $idle of 2 workers idle after 10 s" >&2
  cat "$run"/worker*.log >&2
  return 2
}
