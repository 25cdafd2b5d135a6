#!/usr/bin/env bash
# The second main job: an lnet_selftest session through a ulnet router. Three lnet-router
# daemons on loopback with the example configs in router/examples/routed/ (a client on o2ib, a
# router between o2ib and o2ib1, a server on o2ib1). The client's console runs
# `lnetctl selftest run-test`: it makes a session on the client and the server, adds a brw
# test (the client writes 1 MiB to the server, every word checked), runs it with a live
# progress line, and ends with lst's report, the latency percentiles and a YAML summary.
#
#   bash scripts/selftest.sh [TEST...]     e.g.  bash scripts/selftest.sh brw read size=64k check=full
#
# Env: DURATION=5 (seconds), CONCURRENCY=4
source "$(dirname "$0")/routed-daemons.sh"
test=("$@")
[ ${#test[@]} -gt 0 ] || test=(brw write size=1M check=full)
echo "[client] \$ lnetctl selftest run-test --from 10.0.0.1@o2ib --to 10.1.0.2@o2ib1" \
    "--concurrency ${CONCURRENCY:-4} --duration ${DURATION:-5} ${test[*]}"
status=0
"$bin/lnetctl" --socket "$run/client.sock" selftest run-test \
    --from 10.0.0.1@o2ib --to 10.1.0.2@o2ib1 \
    --concurrency "${CONCURRENCY:-4}" --duration "${DURATION:-5}" "${test[@]}" || status=$?
echo
echo "[router] \$ lnetctl routing show   (the bulk went through its large buffers)"
"$bin/lnetctl" --socket "$run/router.sock" routing show | sed -n '1,40p'
exit $status
