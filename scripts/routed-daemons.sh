# scripts/routed-daemons.sh - sourced by the main jobs (demo.sh, selftest.sh, demo-tcp.sh):
# builds lnet-router and lnetctl, starts the three daemons of router/examples/$EXAMPLES/
# (`routed` unless set: router, server, client) on loopback with their control sockets in a private directory, waits until the
# client's route through the router is up, and stops them gracefully (SIGTERM) when the
# script exits. Sets `bin` (the binaries) and `run` (the sockets' directory), and defines
# `ctl WHO ARGS...`: runs lnetctl on WHO's socket, echoing the command as the demos show it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release -q -p router -p lnetctl
bin=${CARGO_TARGET_DIR:-target}/release
run=$(mktemp -d /tmp/ulnet-routed.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$run"
}
trap cleanup EXIT
export LNET_LOG=${LNET_LOG:-warn}
for n in router server client; do
    "$bin/lnet-router" --config "router/examples/${EXAMPLES:-routed}/$n.yaml" --socket "$run/$n.sock" &
    pids+=($!)
done
for n in router server client; do
    for _ in $(seq 100); do [ -S "$run/$n.sock" ] && break; sleep 0.05; done
done
# The client's router pinger finds the gateway within a few seconds of both starting.
for _ in $(seq 100); do
    "$bin/lnetctl" --socket "$run/client.sock" route show -v 2>/dev/null | grep -q 'state: up' && break
    sleep 0.1
done
ctl() {
    local who=$1
    shift
    echo "[$who] \$ lnetctl $*"
    "$bin/lnetctl" --socket "$run/$who.sock" "$@" || echo "(exit status $?)"
    echo
}
