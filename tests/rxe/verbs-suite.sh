#!/bin/sh
# tests/rxe/verbs-suite.sh — the guest side of tests/rxe/run.sh (run by guest.sh inside the
# Soft-RoCE guest, busybox sh): the verbs examples, then perftest's ib_send_lat / ib_write_bw
# beside our figures in one table; then, when run.sh shipped it in $ULNET_FILES, the daemons suite
# (daemons-suite.sh). Exit status: 0, or the first failure: 11 verbs_pair, 12 verbs_conn,
# 13 verbs_kill, 14 verbs_bench, 15 perftest, 16 verbs_bulk; 21-26, 28-30 the daemons suite's, 27 it timed out.
IP=10.0.0.1
N=${VERBS_PAIR_N:-1000}
ITERS=${VERBS_BENCH_ITERS:-1000}
WRITES=${VERBS_BENCH_WRITES:-2000}
export RUST_BACKTRACE=1
first=0
failed() { [ "$first" = 0 ] && first=$1; }

step() {  # name code command...
  name=$1 code=$2; shift 2
  echo "=== $name: $*"
  s=$(cut -d' ' -f1 /proc/uptime)
  timeout 150 "$@" >"/tmp/$name.log" 2>&1
  rc=$?
  cat "/tmp/$name.log"
  e=$(cut -d' ' -f1 /proc/uptime)
  if [ $rc = 0 ]; then
    echo "=== $name: passed ($(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.1f", b - a }') s)"
  else
    echo "=== $name: FAILED (status $rc)"; failed "$code"
  fi
}

perftest_once() {  # tool args... : one server/client run for perftest; sets rc
  "$@" >"/tmp/$name-server.log" 2>&1 &
  srv=$!
  sleep 1
  timeout 60 "$@" "$IP" >"/tmp/$name.log" 2>&1
  rc=$?
  wait $srv
}

perftest() {  # name tool args... : server and client on $IP, client output in /tmp/$name.log
  name=$1; shift
  echo "=== $name: $*"
  perftest_once "$@"
  if [ $rc = 0 ] && grep -q ' inf ' "/tmp/$name.log"; then
    # perftest divides by its CPU-frequency estimate; a starved emulated CPU can make it 0
    echo "=== $name: perftest reported inf (bad cpu MHz estimate), once more"
    perftest_once "$@"
  fi
  grep -v '^ *$' "/tmp/$name.log" | tail -6
  [ $rc = 0 ] || { echo "=== $name: FAILED (status $rc)"; cat "/tmp/$name-server.log"; failed 15; }
}

rdma link show
step verbs_pair 11 verbs_pair "$IP" "$N"
step verbs_conn 12 verbs_conn "$IP"
step verbs_kill 13 verbs_kill "$IP"
step verbs_bulk 16 verbs_bulk "$IP"
perftest send_lat ib_send_lat -d rxe0 -s 64 -n "$ITERS" -F
step verbs_bench 14 verbs_bench "$IP" "$ITERS" "$WRITES"
perftest write_bw ib_write_bw -d rxe0 -s 65536 -n "$WRITES" -F

# perftest columns: ib_send_lat "#bytes #iterations t_min t_max t_typical t_avg ..." (half round
# trips, usec); ib_write_bw "#bytes #iterations BW_peak BW_average MsgRate" (MB/sec = 2^20 B/s).
lat=$(awk '$1 == 64 && NF >= 6 && $5 != "inf" { v = $5 } END { print v }' /tmp/send_lat.log)
bw=$(awk '$1 == 65536 && NF >= 5 { v = $4 } END { print v }' /tmp/write_bw.log)
bench=$(grep '^BENCH ' /tmp/verbs_bench.log | tail -1)
half=$(echo "$bench" | sed -n 's/.* half_rtt_us=\([0-9.]*\).*/\1/p')
rtt=$(echo "$bench" | sed -n 's/.*rtt_median_us=\([0-9.]*\).*/\1/p')
wbw=$(echo "$bench" | sed -n 's/.*write_mib_s=\([0-9.]*\).*/\1/p')
spin=$(echo "$bench" | sed -n 's/.*spin_half_rtt_us=\([0-9.]*\).*/\1/p')
det=$(grep '^verbs_kill: DETECTION' /tmp/verbs_kill.log | sed 's/^verbs_kill: DETECTION //')
awk -v lat="$lat" -v bw="$bw" -v half="$half" -v rtt="$rtt" -v wbw="$wbw" -v spin="$spin" -v det="$det" 'BEGIN {
  printf "\n=== figures (qemu TCG + Soft-RoCE: emulated CPU, they only prove the path)\n"
  printf "%-34s %-26s %-30s %s\n", "what", "perftest", "ulnet (engine + verbs fabric)", "ulnet / perftest"
  printf "%-34s %-26s %-30s %s\n", "64 B message, half RTT (median)", \
    (lat != "" ? sprintf("ib_send_lat %.2f us", lat) : "n/a"), \
    (half != "" ? sprintf("IMMEDIATE %.2f us (RTT %.2f)", half, rtt) : "n/a"), \
    (lat > 0 && half != "" ? sprintf("%.2fx", half / lat) : "n/a")
  printf "%-34s %-26s %-30s %s\n", "  same, both sides spinning", \
    (lat != "" ? sprintf("ib_send_lat %.2f us", lat) : "n/a"), \
    (spin != "" ? sprintf("IMMEDIATE %.2f us", spin) : "n/a"), \
    (lat > 0 && spin != "" ? sprintf("%.2fx", spin / lat) : "n/a")
  printf "%-34s %-26s %-30s %s\n", "64 KiB RDMA write, 2000, MiB/s", \
    (bw != "" ? sprintf("ib_write_bw %.0f", bw) : "n/a"), \
    (wbw != "" ? sprintf("RdmaWrite loop %.0f", wbw) : "n/a"), \
    (bw > 0 && wbw != "" ? sprintf("%.2fx", wbw / bw) : "n/a")
  printf "SIGKILLed peer detection: %s\n", (det != "" ? det : "n/a")
}'
[ -n "$lat" ] && [ -n "$bw" ] || failed 15
echo "=== verbs suite status: $first"

# The daemons over verbs, in this same boot, when run.sh shipped them (21-28, daemons-suite.sh).
daemons=${ULNET_FILES:-/opt/ulnet/files}/daemons-suite.sh
if [ -f "$daemons" ]; then
  echo; echo "=== daemons suite: $daemons"
  timeout 330 sh "$daemons"
  rc=$?
  [ $rc = 124 ] && { echo "=== daemons suite: timed out after 330 s"; rc=27; }
  [ $rc = 0 ] || failed "$rc"
fi
exit "$first"
