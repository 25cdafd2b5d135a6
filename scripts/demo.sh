#!/usr/bin/env bash
# The main job on the shipped default: what a ulnet router is for. Three lnet-router daemons on
# loopback with the example configs in router/examples/routed/: a client on o2ib, a router
# between o2ib and o2ib1, a server on o2ib1. The client pings the server through the router
# (the exchange captured to a pcap, decoded by tshark if present); then `route show -v` on the
# client, `routing show`, `peer show -v` and `stats show` on the router; then a graceful stop.
source "$(dirname "$0")/routed-daemons.sh"
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
