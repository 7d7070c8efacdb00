#!/usr/bin/env bash
# dev-certs.sh DIR [--namespace NS] [--cluster-domain DOMAIN] [--host NAME]... [--days N] [--force]
#
# Makes a development CA and the certificates of a Tandem deployment in DIR, with openssl
# (scripts/install-deps.sh installs it):
#
#   ca.crt ca.key                  the CA (keep ca.key off the cluster)
#   coordinator.crt coordinator.key  CN=tandem-coordinator
#   worker.crt worker.key          CN=tandem-worker (one certificate for every worker)
#   client.crt client.key          CN=tandem-client (for `tandem --tls-cert/--tls-key`)
#   token                          a random bearer token (for --auth-token-file/--token-file)
#   metrics-token                  another, that opens only the metrics port (--metrics-token-file)
#
# The Common Name carries the role the peers check (docs/architecture.md, "Security"). The
# subjectAltNames are the names the peers dial: localhost, 127.0.0.1 and ::1 for every
# certificate; the coordinator's Services (tandem-coordinator and tandem-coordinator-metrics,
# .NS, .NS.svc, .NS.svc.DOMAIN) and the workers' pod names (*.tandem-worker.NS.svc.DOMAIN) of deploy/k8s; and every --host.
# NS defaults to tandem and DOMAIN to cluster.local, as in deploy/k8s. Keys are ECDSA P-256,
# unencrypted, mode 0600. These are development certificates: for production use your own CA
# (or cert-manager) with the same Common Names and names.
set -euo pipefail

usage() { sed -n '2,3p' "$0" | sed 's/^# //' >&2; exit 2; }
[ $# -ge 1 ] || usage
dir="$1"
shift
namespace=tandem
domain=cluster.local
days=365
force=0
hosts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --namespace) namespace="${2:?--namespace NS}"; shift 2 ;;
    --cluster-domain) domain="${2:?--cluster-domain DOMAIN}"; shift 2 ;;
    --host) hosts+=("${2:?--host NAME}"); shift 2 ;;
    --days) days="${2:?--days N}"; shift 2 ;;
    --force) force=1; shift ;;
    *) usage ;;
  esac
done
command -v openssl >/dev/null ||
  { echo "dev-certs.sh: openssl is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
mkdir -p "$dir"
if [ -e "$dir/ca.key" ] && [ "$force" = 0 ]; then
  echo "dev-certs.sh: $dir/ca.key exists; give --force to replace every file in $dir" >&2
  exit 1
fi
umask 077
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# "DNS:a,DNS:b,IP:127.0.0.1" from the names given.
san() {
  local out="" n
  for n in "$@"; do
    if [[ "$n" =~ ^[0-9.]+$ || "$n" == *:* ]]; then out+="IP:$n,"; else out+="DNS:$n,"; fi
  done
  echo "${out%,}"
}

openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" -days "$days" -subj "/O=Tandem/CN=Tandem development CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>"$work/log" || { cat "$work/log" >&2; exit 1; }

# leaf NAME CN EXTENDED_KEY_USAGE SAN
leaf() {
  local name="$1" cn="$2" eku="$3" names="$4"
  cat >"$work/$name.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=$eku
subjectAltName=$names
EOF
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/$name.key" -out "$work/$name.csr" -subj "/O=Tandem/CN=$cn" 2>"$work/log" ||
    { cat "$work/log" >&2; exit 1; }
  openssl x509 -req -in "$work/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -CAserial "$work/ca.srl" -days "$days" -extfile "$work/$name.ext" \
    -out "$dir/$name.crt" 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
}

local_names=(localhost 127.0.0.1 ::1)
svc_names=()
for svc in tandem-coordinator tandem-coordinator-metrics; do
  svc_names+=("$svc" "$svc.$namespace" "$svc.$namespace.svc" "$svc.$namespace.svc.$domain")
done
leaf coordinator tandem-coordinator serverAuth,clientAuth "$(san "${local_names[@]}" \
  "${svc_names[@]}" "${hosts[@]}")"
leaf worker tandem-worker serverAuth,clientAuth "$(san "${local_names[@]}" \
  "*.tandem-worker.$namespace.svc.$domain" "*.tandem-worker.$namespace.svc" "${hosts[@]}")"
leaf client tandem-client clientAuth "$(san "${local_names[@]}")"
openssl rand -hex 32 >"$dir/token"
openssl rand -hex 32 >"$dir/metrics-token"
chmod 0644 "$dir"/*.crt
chmod 0600 "$dir"/*.key "$dir/token" "$dir/metrics-token"
echo "dev-certs.sh: in $dir: ca.crt ca.key, coordinator/worker/client .crt .key, token," \
  "metrics-token" \
  "(namespace $namespace, cluster domain $domain${hosts[*]:+, hosts ${hosts[*]}})"
