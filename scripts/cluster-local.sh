#!/usr/bin/env bash
# The rehearsal of a Kubernetes deployment on one machine, no cluster needed:
#
#   scripts/cluster-local.sh [OVERLAY]      (default deploy/k8s/overlays/cpu)
#
# An overlay that mounts Secrets (deploy/k8s/secure/*: TLS) gets them from
# scripts/dev-certs.sh, as docs/deploy.md creates them: tandem-{coordinator,worker,client}-tls
# (tls.crt, tls.key, ca.crt), tandem-api-token and tandem-metrics-token (token); and Prometheus
# scrapes the metrics port as the secure README configures it (HTTPS, the metrics token).
#
# Renders the overlay and runs its pods as processes: the coordinator, every worker of the
# StatefulSet and the submit Job, each in a network namespace of its own (its own address on
# 192.0.2.0/24, a documentation range), joined by a bridge that lives in one more namespace
# (the "node", from which the probes come, as the kubelet's do). Each process gets exactly the
# command, arguments and environment of its container in the rendered manifests
# (deploy/tools/manifests.py rehearsal), runs as the container's user, and finds the others
# by their Kubernetes DNS names (Service and pod names, written into each namespace's
# /etc/hosts). Then, as on a cluster: wait for the readiness probes (gRPC health, as the
# kubelet sends them), run the Job (tandem submit), follow the job to SUCCEEDED from the
# coordinator's pod (kubectl exec), restart a worker pod and see it registered again, stop
# everything with SIGTERM. Everything it makes (namespaces, links, /etc/netns/<ns>, the run
# directory) is removed on exit; no address outside those namespaces is used.
#
# Needs root (ip netns), a build (build/bin, or $TANDEM_BIN_DIR) and the deploy tools
# (kubectl, PyYAML, grpcio: scripts/install-deps.sh --test). Exit status: 0 when the job
# succeeded, 1 on a failure, 77 when it cannot run here (not root, no network namespaces,
# no tools), saying why. TANDEM_KEEP_REHEARSAL=1 keeps the run directory and its logs.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
overlay="${1:-$src/deploy/k8s/overlays/cpu}"
bin="$(cd "${TANDEM_BIN_DIR:-$src/build/bin}" && pwd)"
venv="${TANDEM_DEPLOY_VENV:-$src/.cache/deploy-tools/venv}"
[ -d "$venv/bin" ] && export PATH="$venv/bin:$PATH"
python=python3
[ -x "$venv/bin/python" ] && python="$venv/bin/python"
tool="$src/deploy/tools/manifests.py"

skip() { echo "skip: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "the rehearsal needs root for network namespaces (ip netns)"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
command -v setpriv >/dev/null || skip "setpriv (util-linux) is not installed"
for p in tandem-coordinator tandem-worker tandem; do
  [ -x "$bin/$p" ] || { echo "$bin/$p is missing: build first (scripts/build.sh)"; exit 1; }
done
"$python" -c 'import yaml, grpc, grpc_health' 2>/dev/null ||
  skip "PyYAML, grpcio and grpcio-health-checking are needed (scripts/install-deps.sh --test)"

tag="tr$$"
node="$tag-node"
namespaces=()
pids=()
watchdog=""
etc_netns_existed=0
[ -d /etc/netns ] && etc_netns_existed=1
run="$(mktemp -d /tmp/tandem-rehearsal-XXXXXX)"
chmod 755 "$run"
cleanup() {
  local rc=$?
  [ -z "$watchdog" ] || kill "$watchdog" 2>/dev/null || true
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in "${namespaces[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  [ "$etc_netns_existed" = 1 ] || rmdir /etc/netns 2>/dev/null || true
  if [ "$rc" != 0 ] && [ "$rc" != 77 ] && [ -d "$run/logs" ]; then
    for f in "$run"/logs/*.log; do echo "== $f"; tail -n 30 "$f"; done
  fi
  if [ "${TANDEM_KEEP_REHEARSAL:-0}" = 1 ]; then echo "kept $run"; else rm -rf "$run"; fi
}
trap cleanup EXIT
trap 'echo "rehearsal: interrupted"; exit 1' INT TERM
# A deadline of its own, well inside ctest's, so that the cleanup always runs.
deadline_s="${TANDEM_REHEARSAL_TIMEOUT:-240}"
(
  trap 'kill "$s" 2>/dev/null; exit 0' TERM
  sleep "$deadline_s" </dev/null >/dev/null 2>&1 &
  s=$!
  wait "$s" && echo "rehearsal: still running after $deadline_s s" && kill -TERM $$
) &
watchdog=$!

# Some sandboxes allow root but no new network namespace: that is a skip, not a failure.
ip netns add "$node" 2>/dev/null || skip "cannot create a network namespace here"
namespaces+=("$node")

echo "== rendering $overlay"
secrets=()
if "$python" "$tool" render "$overlay" | grep -q 'secretName:'; then
  echo "== the Secrets, from scripts/dev-certs.sh"
  "$src/scripts/dev-certs.sh" "$run/certs" --days 2
  for role in coordinator worker client; do
    d="$run/secrets/tandem-$role-tls"
    mkdir -p "$d"
    cp "$run/certs/$role.crt" "$d/tls.crt"
    cp "$run/certs/$role.key" "$d/tls.key"
    cp "$run/certs/ca.crt" "$d/ca.crt"
  done
  mkdir -p "$run/secrets/tandem-api-token"
  cp "$run/certs/token" "$run/secrets/tandem-api-token/token"
  mkdir -p "$run/secrets/tandem-metrics-token"
  cp "$run/certs/metrics-token" "$run/secrets/tandem-metrics-token/token"
  secrets=(--secrets "$run/secrets")
fi
"$python" "$tool" rehearsal --bin "$bin" --run "$run" --subnet 192.0.2.0/24 "${secrets[@]}" \
  "$overlay" >"$run/pods.tsv"
node_ip="$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["node_ip"])' \
  "$run/plan.json")"

# The node: a bridge joining every pod's link, and an address for the probes.
ip -n "$node" link set lo up
ip -n "$node" link add br0 type bridge
ip -n "$node" addr add "$node_ip/24" dev br0
ip -n "$node" link set br0 up

declare -A ns_of exec_of ip_of role_of script_of user_of root_of
order=()
i=0
while IFS=$'\t' read -r name role ip user script exec root probes; do
  ns="$tag-$i"
  ip netns add "$ns"
  namespaces+=("$ns")
  ip -n "$node" link add "v$i" type veth peer name eth0 netns "$ns"
  ip -n "$node" link set "v$i" master br0 up
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # Read by every process that `ip netns exec` starts in the namespace (bind-mounted over
  # /etc/hosts and /etc/resolv.conf); no name goes to a DNS server.
  mkdir -p "/etc/netns/$ns"
  cp "$run/hosts" "/etc/netns/$ns/hosts"
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"/etc/netns/$ns/resolv.conf"
  ns_of[$name]="$ns" exec_of[$name]="$exec" ip_of[$name]="$ip" role_of[$name]="$role"
  script_of[$name]="$script" user_of[$name]="$user" root_of[$name]="$root"
  order+=("$name")
  i=$((i + 1))
done <"$run/pods.tsv"
mkdir -p "$run/logs"

# As the container's user (runAsUser), when the build is reachable by that user; the pod's
# volumes are its own (fsGroup).
as_user() {
  local user="$1"
  if [ "$user" != 0 ] &&
    setpriv --reuid="$user" --regid="$user" --clear-groups test -x "$bin/tandem-worker"; then
    echo setpriv --reuid="$user" --regid="$user" --clear-groups
  fi
}
start_pod() {
  local name="$1" wrapper
  wrapper="$(as_user "${user_of[$name]}")"
  [ -n "$wrapper" ] && chown -R "${user_of[$name]}:${user_of[$name]}" "${root_of[$name]}"
  # shellcheck disable=SC2086
  ip netns exec "${ns_of[$name]}" "${script_of[$name]}" $wrapper \
    >>"$run/logs/$name.log" 2>&1 &
  pids+=($!)
  pid_of[$name]=$!
}
declare -A pid_of
echo "== starting the pods"
for name in "${order[@]}"; do
  [ "${role_of[$name]}" = client ] && continue
  start_pod "$name"
  user="root"
  [ -n "$(as_user "${user_of[$name]}")" ] && user="uid ${user_of[$name]}"
  echo "   $name (${role_of[$name]}) at ${ip_of[$name]}, as $user"
done

probe() {  # probe POD readiness|liveness, from the node, as the kubelet does
  ip netns exec "$node" "$python" "$tool" probe --plan "$run/plan.json" --pod "$1" --probe "$2"
}
wait_ready() {
  local name="$1" deadline=$((SECONDS + 30))
  until probe "$name" readiness >"$run/probe.out" 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      cat "$run/probe.out"
      echo "$name is not ready after 30 s"
      return 1
    fi
    sleep 0.3
  done
  cat "$run/probe.out"
}
echo "== readiness and liveness probes (gRPC health, from the node)"
for name in "${order[@]}"; do
  [ "${role_of[$name]}" = client ] && continue
  wait_ready "$name"
  probe "$name" liveness
done

coordinator="" client="" last=""
for name in "${order[@]}"; do
  case "${role_of[$name]}" in
    coordinator) coordinator="$name" ;;
    client) client="$name" ;;
    worker) last="$name" ;;
  esac
done
kexec() {  # kexec POD COMMAND...: `kubectl exec POD -- COMMAND...`
  local name="$1"
  shift
  ip netns exec "${ns_of[$name]}" "${exec_of[$name]}" "$@"
}
kexec "$coordinator" tandem workers

echo "== the Job: $client"
wrapper="$(as_user "${user_of[$client]}")"
[ -n "$wrapper" ] && chown -R "${user_of[$client]}:${user_of[$client]}" "${root_of[$client]}"
# shellcheck disable=SC2086
job="$(timeout 60 ip netns exec "${ns_of[$client]}" "${script_of[$client]}" $wrapper \
  2>>"$run/logs/$client.log")"
echo "   submitted $job"
echo "== kubectl exec $coordinator -- tandem watch $job"
ip netns exec "${ns_of[$coordinator]}" "${exec_of[$coordinator]}" tandem watch "$job"
kexec "$coordinator" tandem status "$job" | head -n 12
ckpt="${root_of[$coordinator]}"
if ! find "$ckpt" -path "*checkpoints/$job/*" -name manifest.json | grep -q .; then
  echo "no checkpoint of $job in the coordinator's volume"
  exit 1
fi
echo "   checkpoints of $job are in the coordinator's volume"

# A worker pod that restarts (same name, same address) registers again and is ready again.
if [ -n "$last" ]; then
  echo "== restarting $last"
  kill -KILL "${pid_of[$last]}"
  wait "${pid_of[$last]}" 2>/dev/null || true
  start_pod "$last"
  wait_ready "$last"
fi

if [ ${#secrets[@]} -gt 0 ]; then
  # With the Secrets, every daemon serves mutual TLS and none says it is plaintext.
  for name in "${order[@]}"; do
    [ "${role_of[$name]}" = client ] && continue
    grep -q "TLS with mutual authentication" "$run/logs/$name.log" ||
      { echo "$name does not serve TLS"; exit 1; }
    if grep -q "PLAINTEXT" "$run/logs/$name.log"; then echo "$name runs in plaintext"; exit 1; fi
  done
  echo "   every daemon serves mutual TLS (certificates from the Secrets)"
  # Prometheus, from the node: HTTPS to the metrics Service's name, the CA and the metrics
  # token; without the token the port answers 401.
  ip netns exec "$node" "$python" - "$run" "${ip_of[$coordinator]}" <<'PY'
import http.client, json, socket, ssl, sys
run, ip = sys.argv[1], sys.argv[2]
plan = json.load(open(f"{run}/plan.json"))
argv = [p for p in plan["pods"] if p["role"] == "coordinator"][0]["argv"]
port = int([a for a in argv if a.startswith("--metrics-listen=")][0].rpartition(":")[2])
token = open(f"{run}/certs/metrics-token").read().strip()
ctx = ssl.create_default_context(cafile=f"{run}/certs/ca.crt")
def get(headers):
    # The pod's address, checked against the name Prometheus dials (in the certificate).
    conn = http.client.HTTPSConnection(ip, port, context=ctx, timeout=10)
    conn.sock = ctx.wrap_socket(socket.create_connection((ip, port), timeout=10),
                                server_hostname="tandem-coordinator-metrics")
    conn.request("GET", "/metrics", headers=headers)
    r = conn.getresponse()
    return r.status, r.read().decode()
status, body = get({"Authorization": f"Bearer {token}"})
if status != 200 or "tandem_job_steps_completed_total" not in body:
    sys.exit(f"scraping https://{ip}:{port}/metrics with the metrics token: {status} {body[:200]}")
status, body = get({})
if status != 401:
    sys.exit(f"scraping without the token answered {status}, not 401")
print(f"   Prometheus scrapes https://tandem-coordinator-metrics:{port}/metrics with the token "
      "(401 without it)")
PY
fi

echo "== stopping the pods (SIGTERM, as the kubelet does)"
failed=0
for name in "${order[@]}"; do
  [ "${role_of[$name]}" = client ] && continue
  kill -TERM "${pid_of[$name]}"
done
for name in "${order[@]}"; do
  [ "${role_of[$name]}" = client ] && continue
  rc=0
  wait "${pid_of[$name]}" || rc=$?
  [ "$rc" = 0 ] || { echo "   $name exited with $rc after SIGTERM"; failed=1; }
done
pids=()
[ "$failed" = 0 ] || exit 1
echo "rehearsal: $job SUCCEEDED across $((${#order[@]} - 2)) workers"
