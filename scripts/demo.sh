#!/usr/bin/env bash
# The main job on the shipped default: what a ulnet router is for. Three lnet-router daemons on
# loopback with the example configs in router/examples/routed/: a client on o2ib, a router
# between o2ib and o2ib1, a server on o2ib1. The client pings the server through the router
# (the exchange captured to a pcap, decoded by tshark if present); then `route show -v` on the
# client, `routing show`, `peer show -v` and `stats show` on the router; then a graceful stop.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p router -p lnetctl
bin=target/release
run=$(mktemp -d /tmp/ulnet-demo.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$run"
}
trap cleanup EXIT
export LNET_LOG=${LNET_LOG:-warn}
for n in router server client; do
    "$bin/lnet-router" --config "router/examples/routed/$n.yaml" --socket "$run/$n.sock" &
    pids+=($!)
done
for n in router server client; do
    for _ in $(seq 100); do [ -S "$run/$n.sock" ] && break; sleep 0.05; done
done
ctl() {
    local who=$1
    shift
    echo "[$who] \$ lnetctl $*"
    "$bin/lnetctl" --socket "$run/$who.sock" "$@" || echo "(exit status $?)"
    echo
}
# The client's router pinger finds the gateway within a few seconds of both starting.
for _ in $(seq 100); do
    "$bin/lnetctl" --socket "$run/client.sock" route show -v 2>/dev/null | grep -q 'state: up' && break
    sleep 0.1
done
# Record what the client puts on the wire (kernel-bypass traffic is invisible to tcpdump).
"$bin/lnetctl" --socket "$run/client.sock" capture --file "$run/ping.pcap" --duration 2 > "$run/capture.out" &
cap=$!
sleep 0.3
ctl client ping 10.1.0.2@o2ib1
ctl client ping 10.0.0.254@o2ib 0@lo
ctl client route show -v
ctl router routing show
ctl router peer show -v
ctl router stats show
wait "$cap" || true
echo "[client] \$ lnetctl capture --file ping.pcap --duration 2   (started before the first ping)"
cat "$run/capture.out"
if command -v tshark >/dev/null 2>&1; then
    echo "\$ tshark -r ping.pcap   (Wireshark's LNet dissector)"
    tshark -r "$run/ping.pcap" 2>/dev/null | head -20 || true
else
    echo "(install tshark to decode ping.pcap with Wireshark's LNet dissector)"
fi
echo
echo "stopping the three daemons (SIGTERM: graceful close of every connection)"
