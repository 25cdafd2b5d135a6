#!/usr/bin/env bash
# tests/rxe/run.sh — the verbs fabric for real: builds the verbs examples (lnd/examples/verbs_*.rs)
# and the daemon with lnetctl (`lnet-router` with --features verbs) on the host and runs them in ONE
# Soft-RoCE qemu guest with our harness (tests/rxe/guest.sh), through the guest script
# tests/rxe/verbs-suite.sh, which ends with tests/rxe/daemons-suite.sh:
#   verbs_pair   1000 IMMEDIATE messages each way, one-way credit NOOPs, idle keepalives, graceful close
#   verbs_conn   a real CONN_RACE (our policy and Lustre 2.8's) and a restarted peer reached again
#   verbs_kill   a SIGKILLed peer process: detection time, queued messages failed
#   verbs_bench  64 B round trips and 64 KiB RDMA writes, beside ib_send_lat / ib_write_bw
#   verbs_bulk   PUT and GET by the engine's RDMA rendezvous, 1 B..1 MiB byte for byte; a sink
#                advertising past its registration costs the writer the connection, not the victim
#   daemons      two lnet-router daemons on fabric: verbs (10.0.0.1@o2ib, 10.0.0.2@o2ib): lnetctl
#                ping both ways, a graceful stop leaves no queue pair behind (3FS #426), a SIGKILL
#                is detected and the pending pings fail with a status; routing through a third
#                daemon: pings, and bulk PUTs 1 B..1 MiB (verbs_routed_bulk) byte for byte
# Exit status: the suite's (0; 11-16 the first failed verbs step, see verbs-suite.sh; 21-28 the
# daemons suite's, see daemons-suite.sh), or guest.sh's infrastructure codes (90 and above).
#   RXE_SUITE=all|verbs|daemons  what to run (default all, in one boot)
#   VERBS_PAIR_N=1000  VERBS_BENCH_ITERS=1000  VERBS_BENCH_WRITES=2000
#   RXE_ACCEL, RXE_TIMEOUT, RXE_WORK, ...: see tests/rxe/guest.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
suite=${RXE_SUITE:-all}
examples="verbs_pair verbs_conn verbs_kill verbs_bench verbs_bulk"
case $suite in
  all|verbs|daemons) ;;
  *) echo "run.sh: RXE_SUITE must be all, verbs or daemons (not $suite)" >&2; exit 90 ;;
esac

# One cargo build for everything the guest runs, in the same package selection and features as
# packaging/build-deb.sh (-p lnd -p router -p lnetctl, verbs): one feature set, so lnd, router and
# lnetctl compile once in release, and after the .deb's build (as in .ci/run) only the examples
# are left to build. Built per suite before, lnetctl alone and lnd alone each took their own
# feature set and recompiled lnd and router.
build=(--release -p lnd -p router -p lnetctl --features lnd/verbs,router/verbs)
if [ "$suite" != daemons ]; then
  for e in $examples; do build+=(--example "$e"); done
fi
if [ "$suite" != verbs ]; then
  build+=(--bin lnet-router --bin lnetctl --example verbs_routed_bulk)
fi
(cd "$repo" && cargo build "${build[@]}")
bins=()
if [ "$suite" != daemons ]; then
  for e in $examples; do
    b="$repo/target/release/examples/$e"
    [ -x "$b" ] || { echo "run.sh: no $b" >&2; exit 94; }
    bins+=(--bin "$b")
  done
fi
files=()
if [ "$suite" != verbs ]; then
  # without their debug info (~50 MiB less initramfs for the emulated guest to unpack)
  dir="${RXE_WORK:-$repo/target/rxe}/daemons"
  mkdir -p "$dir"
  for b in lnet-router lnetctl examples/verbs_routed_bulk; do
    [ -x "$repo/target/release/$b" ] || { echo "run.sh: no target/release/$b" >&2; exit 94; }
    objcopy --strip-debug "$repo/target/release/$b" "$dir/${b#examples/}" 2>/dev/null \
      || cp "$repo/target/release/$b" "$dir/${b#examples/}"
    bins+=(--bin "$dir/${b#examples/}")
  done
  files+=(--file "$here/daemons-suite.sh" --file "$repo/packaging/lnet-router.service")
  # The daemons run under the unit's capability set (daemons-suite.sh), through setpriv.
  setpriv=$(command -v setpriv || true)
  [ -n "$setpriv" ] && bins+=(--bin "$setpriv")
fi
script="$here/verbs-suite.sh"
[ "$suite" = daemons ] && script="$here/daemons-suite.sh"
exec bash "$here/guest.sh" "${bins[@]}" "${files[@]}" \
  --env "VERBS_PAIR_N=${VERBS_PAIR_N:-1000}" \
  --env "VERBS_BENCH_ITERS=${VERBS_BENCH_ITERS:-1000}" \
  --env "VERBS_BENCH_WRITES=${VERBS_BENCH_WRITES:-2000}" \
  --timeout "${RXE_TIMEOUT:-300}" \
  "$script"
