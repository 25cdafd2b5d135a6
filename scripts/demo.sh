#!/usr/bin/env bash
# The main job on the shipped default: two lnet-router daemons on loopback (the example configs
# router/examples/lnet-router.yaml and lnet-router-b.yaml), then lnetctl against the first:
# ping the second (captured to a pcap and decoded by tshark if present), show peers, connections
# and counters; then a graceful stop of both.
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
"$bin/lnet-router" --config router/examples/lnet-router.yaml --socket "$run/a.sock" & pids+=($!)
"$bin/lnet-router" --config router/examples/lnet-router-b.yaml --socket "$run/b.sock" & pids+=($!)
for s in a b; do
    for _ in $(seq 100); do [ -S "$run/$s.sock" ] && break; sleep 0.05; done
done
ctl() { echo "\$ lnetctl $*"; "$bin/lnetctl" --socket "$run/a.sock" "$@" || echo "(exit status $?)"; echo; }
# Record what the first ping puts on the wire (kernel-bypass traffic is invisible to tcpdump).
"$bin/lnetctl" --socket "$run/a.sock" capture --file "$run/ping.pcap" --duration 2 > "$run/capture.out" &
cap=$!
sleep 0.3
ctl ping 10.0.0.2@o2ib
ctl ping 10.0.0.1@o2ib 0@lo
ctl peer show -v
ctl conn show
ctl stats show
wait "$cap" || true
echo "\$ lnetctl capture --file ping.pcap --duration 2   (started before the first ping)"
cat "$run/capture.out"
if command -v tshark >/dev/null 2>&1; then
    echo "\$ tshark -r ping.pcap   (Wireshark's LNet dissector)"
    tshark -r "$run/ping.pcap" 2>/dev/null | head -20 || true
else
    echo "(install tshark to decode ping.pcap with Wireshark's LNet dissector)"
fi
echo
echo "stopping both daemons (SIGTERM: graceful close of every connection)"
