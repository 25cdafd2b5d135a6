#!/bin/bash
# bulk.sh - ulnet bulk throughput (RDMA rendezvous over the tcp fabric) against iperf3, on
# loopback, interleaved in one run so that both see the same machine.
#
#   bash benches/bulk.sh            (from anywhere; needs root for the private netns)
#
# For each of ROUNDS rounds, in a private network namespace (only lo up):
#   1. iperf3 TCP single stream, T seconds       (receiver Gbit/s, as shared/tools/peers.sh)
#   2. lnet_perf --bulk-put T --size S, for each size S in SIZES   (brw write analogue)
#   3. lnet_perf --bulk-get T --size S, for each size S in SIZES   (brw read analogue)
#   4. lnet_perf --bulk-put T --size S --via-router lnet-router   (three processes, 2 cores)
# then prints the median of each figure, its ratio to iperf3's median, and routed / direct.
# Targets (issue "Bulk transfers"): 1 MiB direct >= 0.9x iperf3 single stream; through one
# router >= 0.5x direct.
#
# Env:  ROUNDS=3  T=4  SIZES="65536 1048576"  WINDOW=8  BULK_NETNS=0 (root namespace)
# Bounded: every command runs under `timeout`.

set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
ROUNDS=${ROUNDS:-3}
T=${T:-4}
SIZES=${SIZES:-"65536 1048576"}
WINDOW=${WINDOW:-8}
NS=ulnetbulk$$
PRE=""
TMP=$(mktemp -d /tmp/bulk.XXXXXX)

cleanup() {
  [ -n "$PRE" ] && ip netns del "$NS" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

have() { command -v "$1" >/dev/null 2>&1; }
if ! have iperf3; then
  timeout 300 apt-get install -y iperf3 >/dev/null 2>&1 \
    || { timeout 120 apt-get update >/dev/null 2>&1 && timeout 300 apt-get install -y iperf3 >/dev/null 2>&1; }
fi
if [ "${BULK_NETNS:-1}" = 1 ] && ip netns add "$NS" 2>/dev/null; then
  ip netns exec "$NS" ip link set lo up && PRE="ip netns exec $NS"
fi

echo "building lnet_perf (release)" >&2
(cd "$ROOT" && timeout 900 cargo build --release -q -p benches --bin lnet_perf -p router --bin lnet-router) || exit 1
PERF="$ROOT/target/release/lnet_perf"

# One figure per line in $TMP/figs: "<name> <MiB/s>".
for r in $(seq 1 "$ROUNDS"); do
  if have iperf3; then
    $PRE timeout $((T + 30)) iperf3 -s -B 127.0.0.1 -p 5201 -1 >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    gbit=$($PRE timeout $((T + 20)) iperf3 -c 127.0.0.1 -p 5201 -t "$T" -f g 2>/dev/null \
      | awk '/receiver/ {print $(NF-2)}')
    wait $spid 2>/dev/null
    if [ -n "$gbit" ]; then
      # Gbit/s (10^9 bits) to MiB/s.
      echo "iperf3 $(awk -v g="$gbit" 'BEGIN {printf "%.1f", g * 1e9 / 8 / 1048576}')" >>"$TMP/figs"
    else
      echo "WARN iperf3 round $r failed" >&2
    fi
  fi
  for s in $SIZES; do
    for op in put get; do
      out=$($PRE timeout $((T + 60)) "$PERF" --bulk-$op "$T" --size "$s" --window "$WINDOW" \
        --warmup 100 2>"$TMP/err")
      v=$(echo "$out" | awk '/^FIGURE ulnet_bulk_/ {sub("value=", "", $4); print $4}')
      if [ -n "$v" ]; then
        echo "ulnet_bulk_${op}_$s $v" >>"$TMP/figs"
      else
        echo "WARN lnet_perf --bulk-$op --size $s round $r failed: $(tail -3 "$TMP/err" | tr '\n' ' ')" >&2
      fi
    done
    out=$($PRE timeout $((T + 60)) "$PERF" --bulk-put "$T" --size "$s" --window "$WINDOW" \
      --warmup 100 --via-router "$ROOT/target/release/lnet-router" 2>"$TMP/err")
    v=$(echo "$out" | awk '/^FIGURE ulnet_bulk_/ {sub("value=", "", $4); print $4}')
    if [ -n "$v" ]; then
      echo "routed_bulk_put_$s $v" >>"$TMP/figs"
    else
      echo "WARN routed --size $s round $r failed: $(tail -3 "$TMP/err" | tr '\n' ' ')" >&2
    fi
  done
done

median() { sort -n | awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
base=$(awk '$1 == "iperf3" {print $2}' "$TMP/figs" | median)
echo "figure                       MiB/s (median of $ROUNDS)   ratio to iperf3"
for name in $(awk '{print $1}' "$TMP/figs" | sort -u); do
  m=$(awk -v n="$name" '$1 == n {print $2}' "$TMP/figs" | median)
  all=$(awk -v n="$name" '$1 == n {printf "%s ", $2}' "$TMP/figs")
  ratio=NA
  [ -n "$base" ] && ratio=$(awk -v a="$m" -v b="$base" 'BEGIN {printf "%.2f", a / b}')
  printf "%-28s %10s   %6s   (%s)\n" "$name" "$m" "$ratio" "$all"
done
for s in $SIZES; do
  d=$(awk -v n="ulnet_bulk_put_$s" '$1 == n {print $2}' "$TMP/figs" | median)
  ro=$(awk -v n="routed_bulk_put_$s" '$1 == n {print $2}' "$TMP/figs" | median)
  [ -n "$d" ] && [ -n "$ro" ] && printf "routed / direct bulk PUT %s: %s\n" "$s" \
    "$(awk -v a="$ro" -v b="$d" 'BEGIN {printf "%.2f", a / b}')"
done
