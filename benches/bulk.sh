#!/bin/bash
# bulk.sh - ulnet bulk throughput (RDMA rendezvous over the tcp fabric) against iperf3, on
# loopback, interleaved in one run so that every figure sees the same machine.
#
#   bash benches/bulk.sh            (from anywhere; needs root for the private netns)
#
# For each of ROUNDS rounds and each message size S in SIZES, in a private network namespace
# (only lo up):
#   1. iperf3 TCP single stream, T seconds, writes of S bytes (-l S)   (receiver Gbit/s)
#   2. lnet_perf --bulk-put T --size S          ulnet PUT by rendezvous  (brw write analogue)
#   3. lnet_perf --bulk-get T --size S          ulnet GET by rendezvous  (brw read analogue)
#   4. lnet_perf --bulk-put / --bulk-get T --size S --via-router lnet-router   (three processes
#      on 2 cores; a routed GET is IMMEDIATE, its REPLY comes back by rendezvous)
#   5. ucx_perftest -t tag_bw -s S over UCX's tcp transport (as benches/loopback.sh runs it),
#      about 2 GiB per size (its "overall" bandwidth, MB/s = MiB/s)
# then prints, per size, the median of each figure in MiB/s, its ratio to iperf3's, routed /
# direct, and draws them (MiB/s against size, one line per system) into PLOT (SVG).
# Targets (issue "Bulk transfers"): 1 MiB direct >= 0.9x iperf3 single stream (>= 1.0x UCX
# tag_bw: stretch); through one router >= 0.5x direct.
#
# Env:  ROUNDS=3  T=3  SIZES="4096 65536 1048576"  WINDOW=8  PLOT=target/bulk.svg
#       BULK_NETNS=0 (run in the root namespace)
# Bounded: every command runs under `timeout`.

set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
ROUNDS=${ROUNDS:-3}
T=${T:-3}
SIZES=${SIZES:-"4096 65536 1048576"}
WINDOW=${WINDOW:-8}
PLOT=${PLOT:-$ROOT/target/bulk.svg}
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
need=()
have iperf3 || need+=(iperf3)
have ucx_perftest || need+=(ucx-utils)
if [ ${#need[@]} -gt 0 ]; then
  timeout 300 apt-get install -y "${need[@]}" >/dev/null 2>&1 \
    || { timeout 120 apt-get update >/dev/null 2>&1 && timeout 300 apt-get install -y "${need[@]}" >/dev/null 2>&1; }
fi
UCX_ENV="env UCX_TLS=tcp UCX_NET_DEVICES=lo"
UCX_PORT=15400
if [ "${BULK_NETNS:-1}" = 1 ] && ip netns add "$NS" 2>/dev/null; then
  ip netns exec "$NS" ip link set lo up && PRE="ip netns exec $NS"
fi

echo "building lnet_perf, lnet-router and bulk_plot (release)" >&2
(cd "$ROOT" && timeout 900 cargo build --release -q -p benches --bin lnet_perf --bin bulk_plot \
  -p router --bin lnet-router) || exit 1
PERF="$ROOT/target/release/lnet_perf"

# One measurement per line in $TMP/figs: "<system> <size> <MiB/s>".
lnet() {  # system size args...
  local name=$1 s=$2; shift 2
  local out v
  out=$($PRE timeout $((T + 60)) "$PERF" "$@" --size "$s" --window "$WINDOW" --warmup 100 \
    2>"$TMP/err")
  v=$(echo "$out" | awk '/^FIGURE ulnet_bulk_/ {sub("value=", "", $4); print $4}')
  if [ -n "$v" ]; then
    echo "$name $s $v" >>"$TMP/figs"
  else
    echo "WARN $name size $s failed: $(tail -3 "$TMP/err" | tr '\n' ' ')" >&2
  fi
}
for r in $(seq 1 "$ROUNDS"); do
  for s in $SIZES; do
    if have iperf3; then
      $PRE timeout $((T + 30)) iperf3 -s -B 127.0.0.1 -p 5201 -1 >/dev/null 2>&1 &
      spid=$!
      sleep 0.5
      gbit=$($PRE timeout $((T + 20)) iperf3 -c 127.0.0.1 -p 5201 -t "$T" -l "$s" -f g 2>/dev/null \
        | awk '/receiver/ {print $(NF-2)}')
      wait $spid 2>/dev/null
      if [ -n "$gbit" ]; then
        # Gbit/s (10^9 bits) to MiB/s.
        echo "iperf3 $s $(awk -v g="$gbit" 'BEGIN {printf "%.1f", g * 1e9 / 8 / 1048576}')" >>"$TMP/figs"
      else
        echo "WARN iperf3 size $s round $r failed" >&2
      fi
    fi
    if have ucx_perftest; then
      UCX_PORT=$((UCX_PORT + 1))
      $PRE timeout 120 $UCX_ENV ucx_perftest -p $UCX_PORT >/dev/null 2>&1 &
      spid=$!
      sleep 1
      n=$(( (2 << 30) / s ))
      v=$($PRE timeout 120 $UCX_ENV ucx_perftest 127.0.0.1 -p $UCX_PORT -t tag_bw -s "$s" \
        -n "$n" -w 100 2>/dev/null | awk '/^Final:/ {print $7}')
      wait $spid 2>/dev/null
      if [ -n "$v" ]; then
        echo "ucx_tag_bw $s $v" >>"$TMP/figs"
      else
        echo "WARN ucx_perftest tag_bw size $s round $r failed" >&2
      fi
    fi
    lnet ulnet_put "$s" --bulk-put "$T"
    lnet ulnet_get "$s" --bulk-get "$T"
    lnet ulnet_put_routed "$s" --bulk-put "$T" --via-router "$ROOT/target/release/lnet-router"
    lnet ulnet_get_routed "$s" --bulk-get "$T" --via-router "$ROOT/target/release/lnet-router"
  done
done

median() { sort -n | awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
fig() { awk -v n="$1" -v s="$2" '$1 == n && $2 == s {print $3}' "$TMP/figs" | median; }
ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}' || echo NA; }
printf "%-9s %-17s %12s %10s %8s %16s\n" size system "MiB/s" "x iperf3" "x UCX" "routed/direct"
for s in $SIZES; do
  base=$(fig iperf3 "$s")
  ucx=$(fig ucx_tag_bw "$s")
  for name in iperf3 ucx_tag_bw ulnet_put ulnet_get ulnet_put_routed ulnet_get_routed; do
    m=$(fig "$name" "$s")
    [ -n "$m" ] || continue
    rd=""
    [ "$name" = ulnet_put_routed ] && rd=$(ratio "$m" "$(fig ulnet_put "$s")")
    [ "$name" = ulnet_get_routed ] && rd=$(ratio "$m" "$(fig ulnet_get "$s")")
    printf "%-9s %-17s %12s %10s %8s %16s\n" "$s" "$name" "$m" "$(ratio "$m" "$base")" \
      "$(ratio "$m" "$ucx")" "$rd"
  done
done
mkdir -p "$(dirname "$PLOT")"
if "$ROOT/target/release/bulk_plot" "$TMP/figs" "$PLOT"; then
  echo "plot: $PLOT"
fi
