#!/usr/bin/env bash
# The third main job: a ulnet router between Ethernet (a `tcp` net, ksocklnd's wire, which
# kernel Lustre clients speak) and InfiniBand (`o2ib`, o2iblnd). Three lnet-router daemons on
# loopback with the example configs in router/examples/tcp-o2ib/: a client on tcp, the router,
# a server on o2ib. Routed pings both ways, then lnet_selftest brw write and read of 1 MiB with
# every word checked, client -> server and server -> client; `routing show` and `conn` counts.
#
#   bash scripts/demo-tcp.sh
#
# Env: DURATION=3 (seconds per brw)
EXAMPLES=tcp-o2ib
source "$(dirname "$0")/routed-daemons.sh"
# From a run-test's output: the servers' bandwidth and the summary's RPC counts.
show() {
    awk '/LNet Bandwidth of servers/ {n = 3} n-- > 0 {print}
         /^ *(rpcs_sent|rpcs_completed|brw_errors|rpc_errors):/ && !seen[$1]++ {print}
         /^\[Latency/ {print}'
}
status=0
ctl client ping 10.0.0.2@o2ib
ctl server ping 127.0.0.11@tcp
for dir in write read; do
    echo "[client] \$ lnetctl selftest run-test --from 127.0.0.11@tcp --to 10.0.0.2@o2ib brw $dir size=1M check=full"
    "$bin/lnetctl" --socket "$run/client.sock" selftest run-test --from 127.0.0.11@tcp \
        --to 10.0.0.2@o2ib --duration "${DURATION:-3}" --concurrency 4 \
        brw "$dir" size=1M check=full 2>/dev/null \
        | show || status=$?
    echo "[server] \$ lnetctl selftest run-test --from 10.0.0.2@o2ib --to 127.0.0.11@tcp brw $dir size=1M check=full"
    "$bin/lnetctl" --socket "$run/server.sock" selftest run-test --from 10.0.0.2@o2ib \
        --to 127.0.0.11@tcp --duration "${DURATION:-3}" --concurrency 4 \
        brw "$dir" size=1M check=full 2>/dev/null \
        | show || status=$?
done
ctl router routing show
ctl router net show -v
echo "stopping the three daemons (SIGTERM: graceful close of every connection)"
exit $status
