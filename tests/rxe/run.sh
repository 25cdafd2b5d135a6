#!/usr/bin/env bash
# tests/rxe/run.sh — the verbs fabric for real: builds the verbs examples (lnd/examples/verbs_*.rs)
# on the host and runs them in one Soft-RoCE qemu guest with our harness (tests/rxe/guest.sh),
# through the guest script tests/rxe/verbs-suite.sh:
#   verbs_pair   1000 IMMEDIATE messages each way, one-way credit NOOPs, idle keepalives, graceful close
#   verbs_conn   a real CONN_RACE (our policy and Lustre 2.8's) and a real CONN_STALE + reconnect
#   verbs_kill   a SIGKILLed peer process: detection time, queued messages failed
#   verbs_bench  64 B round trips and 64 KiB RDMA writes, beside ib_send_lat / ib_write_bw
# Exit status: the suite's (0; 11-15 the first failed step, see verbs-suite.sh), or guest.sh's
# infrastructure codes (90 and above).
#   VERBS_PAIR_N=1000  VERBS_BENCH_ITERS=1000  VERBS_BENCH_WRITES=2000
#   RXE_ACCEL, RXE_TIMEOUT, RXE_WORK, ...: see tests/rxe/guest.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
examples="verbs_pair verbs_conn verbs_kill verbs_bench"

args=()
for e in $examples; do args+=(--example "$e"); done
(cd "$repo" && cargo build --release -p lnd --features verbs "${args[@]}")
bins=()
for e in $examples; do
  b="$repo/target/release/examples/$e"
  [ -x "$b" ] || { echo "run.sh: no $b" >&2; exit 94; }
  bins+=(--bin "$b")
done
exec bash "$here/guest.sh" "${bins[@]}" \
  --env "VERBS_PAIR_N=${VERBS_PAIR_N:-1000}" \
  --env "VERBS_BENCH_ITERS=${VERBS_BENCH_ITERS:-1000}" \
  --env "VERBS_BENCH_WRITES=${VERBS_BENCH_WRITES:-2000}" \
  --timeout "${RXE_TIMEOUT:-300}" \
  "$here/verbs-suite.sh"
