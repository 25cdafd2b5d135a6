#!/usr/bin/env bash
# tests/rxe/run.sh — build the verbs_pair example on the host and run it inside a throw-away qemu
# guest with Soft-RoCE (rdma_rxe on dummy0, 10.0.0.1). Exits with the example's status (90+ on
# infrastructure failures, see rxe-run.sh).
#
# This first slice reuses the steering repo's shared guest script; the project needs its own
# harness eventually. Override its location with RXE_RUN=/path/to/rxe-run.sh.
#   VERBS_PAIR_N=1000   messages each way
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
RXE_RUN=${RXE_RUN:-$repo/../shared/tools/rxe-run.sh}
[ -x "$RXE_RUN" ] || [ -f "$RXE_RUN" ] || { echo "rxe harness not found: $RXE_RUN (set RXE_RUN)" >&2; exit 94; }
N=${VERBS_PAIR_N:-1000}

(cd "$repo" && cargo build --release -p lnd --features verbs --example verbs_pair)
bin="$repo/target/release/examples/verbs_pair"
[ -x "$bin" ] || { echo "no $bin" >&2; exit 95; }

RXE_ADD="$bin" exec bash "$RXE_RUN" "ulimit -l unlimited; ${VERBS_PAIR_LOG:+VERBS_PAIR_LOG=1} RUST_BACKTRACE=1 timeout 150 /opt/verbs_pair 10.0.0.1 $N"
