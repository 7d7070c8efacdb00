#!/usr/bin/env bash
# check-runtime.sh [ROOTFS_TAR]: the images' runtime stage, checked without a container daemon
# (as root). Builds the programs with the Dockerfiles' flags into build-image/, bundles them
# as the Dockerfiles do (bundle.sh), unpacks a minimal Debian 12 root (ROOTFS_TAR, default
# the cache of shared/tools/fresh-debian-check.sh; else made with debootstrap), and there, as
# uid 10001 and with nothing installed but the bundle, runs a coordinator and two workers that
# advertise a host name, and a 2-stage job to SUCCEEDED.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$src"
[ "$(id -u)" = 0 ] || { echo "needs root (chroot)"; exit 1; }
./scripts/build.sh >/dev/null # dependencies, and the CMake cache of build/
cmake -S . -B build-image -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_BUILD_TESTS=OFF \
  -DTANDEM_BUILD_BENCH=OFF -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags >/dev/null
ninja -C build-image -j "${TANDEM_BUILD_JOBS:-$(nproc)}" tandem-coordinator tandem-worker tandem
root="$(mktemp -d /tmp/tandem-runtime-XXXXXX)"
cleanup() { umount "$root/proc" 2>/dev/null || true; rm -rf "$root"; }
trap cleanup EXIT
tar="${1:-$HOME/.cache/fresh-debian/bookworm-minbase.tar}"
if [ -f "$tar" ]; then
  tar -C "$root" -xf "$tar"
else
  debootstrap --variant=minbase bookworm "$root" >/dev/null
fi
deploy/docker/bundle.sh build-image/bin "$root/opt/tandem"
# What a container runtime provides: /proc (for $ORIGIN) and /etc/hosts.
mount -t proc proc "$root/proc"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' >"$root/etc/hosts"
mkdir -p "$root/tmp/smoke"
chown 10001:10001 "$root/tmp/smoke"
cat >"$root/tmp/smoke/run.sh" <<'SMOKE'
set -eu
cd /tmp/smoke
export PATH=/opt/tandem/bin:/usr/bin:/bin
tandem-coordinator --listen=127.0.0.1:0 --port-file=c.port --data-root=/tmp/smoke/store >c.log 2>&1 &
pids="$!"
trap 'kill $pids 2>/dev/null' EXIT
for _ in $(seq 50); do [ -s c.port ] && break; sleep 0.1; done
export TANDEM_COORDINATOR="127.0.0.1:$(cat c.port)"
for i in 0 1; do
  tandem-worker --listen=127.0.0.1:0 --advertise=localhost:0 >"w$i.log" 2>&1 &
  pids="$pids $!"
done
for _ in $(seq 100); do
  [ "$(tandem workers -o json | grep -c '"IDLE"')" = 2 ] && break
  sleep 0.1
done
printf '%s\n' 'name: smoke' 'steps: 5' 'data: {source: synthetic}' \
  'model: {arch: gpt, n_layer: 2, n_head: 2, d_model: 32, seq_len: 16, vocab_size: 256}' \
  'pipeline: {stages: 2, micro_batch_size: 2, micro_batches: 2, partition: uniform}' >job.yaml
tandem watch "$(tandem submit job.yaml)"
SMOKE
timeout 120 chroot --userspec=10001:10001 "$root" /bin/sh /tmp/smoke/run.sh
echo "runtime: the bundle runs on a bare Debian 12 root as uid 10001"
