#!/bin/bash
# socklnd.sh - ulnet's socklnd (ksocklnd's wire over the io_uring socket driver) against its
# baselines on loopback, alternating, with medians and ratios (issue 35, "Figures").
#
#   bash benches/socklnd.sh            (unprivileged; every node on its own 127.0.x.y)
#
# Each of ROUNDS rounds runs, one after the other (so that the host's phases hit all alike):
#   bulk: iperf3 -l 1M direct; iperf3 through the bare tcp_relay; lnet_perf --bulk-put on tcp
#         NIDs (socklnd direct); the same with --zero-copy (IORING_OP_SEND_ZC); on o2ib NIDs
#         (o2iblnd on the tcp fabric); routed tcp -> o2ib and o2ib -> tcp through lnet-router.
#   small: sockperf ping-pong and throughput (64 B, as loopback.sh); lnet_perf --rtt and
#         --put-rate on tcp NIDs and on o2ib NIDs.
# then the median of each figure and the ratios:
#   socklnd 1 MiB PUT / iperf3 -l 1M                         target >= 0.95 (must 0.9)
#   socklnd ping RTT / sockperf RTT (2 x one-way p50), / o2ib ping RTT
#   socklnd 64-B PUT rate / sockperf 64-B msg rate, / o2ib 64-B PUT rate
#   routed/direct (each way; direct: the slower leg's) / the bare relay's routed/direct
#                                                               target >= 0.85 (goal 0.95)
#   zero-copy / copy                                            (loopback: the kernel copies)
#
# Env:  ROUNDS=5   T=3 (seconds per bulk run)   T_SOCK=5   LNET_RTT=20000   LNET_SECS=5
#       LNET_PERF, LNET_ROUTER, TCP_RELAY: binaries to use (default: built here, release)
#       CARGO_TARGET_DIR as cargo's.
# Bounded: every command runs under `timeout`; 5 rounds take about 6 minutes.

. "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-5}
T=${T:-3}
T_SOCK=${T_SOCK:-5}
LNET_RTT=${LNET_RTT:-20000}
LNET_SECS=${LNET_SECS:-5}
TMP=$(mktemp -d /tmp/socklnd.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
have() { command -v "$1" >/dev/null 2>&1; }

TD=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${LNET_PERF:-}" ] || [ -z "${LNET_ROUTER:-}" ] || [ -z "${TCP_RELAY:-}" ]; then
  (cd "$ROOT" && timeout 1800 cargo build --release -q -p benches --bin lnet_perf --bin tcp_relay \
    -p router --bin lnet-router) || exit 1
fi
PERF=${LNET_PERF:-$TD/release/lnet_perf}
ROUTER=${LNET_ROUTER:-$TD/release/lnet-router}
RELAY=${TCP_RELAY:-$TD/release/tcp_relay}
for t in iperf3 sockperf; do have $t || echo "SKIP $t not installed (its ratios show NA)"; done

fig() { echo "$1 $2" >>"$TMP/figs"; }   # name value
# lnet_perf ARGS... -> the FIGURE line's value (value=, or median= for the RTT)
perf() {
  local name=$1; shift
  local out
  out=$(timeout 120 "$PERF" "$@" 2>>"$TMP/perf.log")
  local v
  v=$(echo "$out" | grep -E '^FIGURE ulnet_(bulk_put|put64_rate|ping_rtt)' \
      | grep -oE '(value|median)=[0-9.]+' | head -1 | cut -d= -f2)
  if [ -n "$v" ]; then fig "$name" "$v"; else echo "WARN $name failed: $(tail -1 "$TMP/perf.log")" >&2; fi
}
iperf() {  # name port
  local spid gbit
  timeout $((T + 30)) iperf3 -s -B 127.0.0.1 -p 5201 -1 >/dev/null 2>&1 &
  spid=$!
  sleep 0.5
  gbit=$(timeout $((T + 20)) iperf3 -c 127.0.0.1 -p "$2" -t "$T" -l 1M -f g 2>/dev/null \
    | awk '/receiver/ {print $(NF-2)}')
  wait $spid 2>/dev/null
  if [ -n "$gbit" ]; then
    fig "$1" "$(awk -v g="$gbit" 'BEGIN {printf "%.1f", g * 1e9 / 8 / 1048576}')"
  else echo "WARN $1 failed" >&2; fi
}
sockperf_pair() {  # name port mode -> fig
  local spid f=$TMP/sp
  timeout $((T_SOCK + 30)) sockperf server --tcp -i 127.0.0.1 -p "$2" >/dev/null 2>&1 &
  spid=$!
  sleep 0.5
  timeout $((T_SOCK + 20)) sockperf "$3" --tcp -i 127.0.0.1 -p "$2" -m 64 -t "$T_SOCK" >"$f" 2>&1
  kill $spid 2>/dev/null; wait $spid 2>/dev/null
  case $3 in
    ping-pong) v=$(awk '/percentile 50.000/ {print 2 * $NF}' "$f") ;;
    throughput) v=$(grep -o 'Message Rate is [0-9.]*' "$f" | awk '{print $4}') ;;
  esac
  if [ -n "$v" ]; then fig "$1" "$v"; else echo "WARN $1 failed" >&2; fi
}

if [ -x "$RELAY" ]; then
  "$RELAY" 127.0.0.1:5202 127.0.0.1:5201 >/dev/null 2>>"$TMP/relay.log" &
  PIDS+=($!)
fi
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS: bulk" >&2
  if have iperf3; then
    iperf iperf3 5201
    [ -x "$RELAY" ] && iperf iperf3_relayed 5202
  fi
  perf sock_put --net tcp --bulk-put "$T"
  perf sock_put_zc --net tcp --zero-copy --bulk-put "$T"
  perf o2ib_put --bulk-put "$T"
  perf routed_tcp_o2ib --client-net tcp --server-net o2ib --via-router "$ROUTER" --bulk-put "$T"
  perf routed_o2ib_tcp --client-net o2ib --server-net tcp --via-router "$ROUTER" --bulk-put "$T"
  echo "round $r/$ROUNDS: small messages" >&2
  if have sockperf; then
    sockperf_pair sockperf_rtt 11111 ping-pong
    sockperf_pair sockperf_rate 11112 throughput
  fi
  perf sock_rtt --net tcp --rtt "$LNET_RTT"
  perf o2ib_rtt --rtt "$LNET_RTT"
  perf sock_rate --net tcp --put-rate "$LNET_SECS"
  perf o2ib_rate --put-rate "$LNET_SECS"
done

med() {  # name -> median (or empty)
  awk -v n="$1" '$1 == n {print $2}' "$TMP/figs" | sort -g \
    | awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}
all() { awk -v n="$1" '$1 == n {printf "%s ", $2}' "$TMP/figs"; }
ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.3f", a / b; else print "NA"}' || echo NA; }
verdict() { awk -v r="$1" -v op="$2" -v t="$3" 'BEGIN {if (r == "NA" || r == "") print "NA"; else if ((op == ">=" && r + 0 >= t) || (op == "<=" && r + 0 <= t)) print "ok"; else print "MISS"}'; }

echo
echo "socklnd figures, $(date -u +%F), commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null), $ROUNDS rounds (median; every run)"
for n in iperf3 iperf3_relayed sock_put sock_put_zc o2ib_put routed_tcp_o2ib routed_o2ib_tcp; do
  printf '%-20s %10s MiB/s   (%s)\n' "$n" "$(med $n)" "$(all $n)"
done
for n in sockperf_rtt sock_rtt o2ib_rtt; do printf '%-20s %10s usec    (%s)\n' "$n" "$(med $n)" "$(all $n)"; done
for n in sockperf_rate sock_rate o2ib_rate; do printf '%-20s %10s msgs/s  (%s)\n' "$n" "$(med $n)" "$(all $n)"; done
echo
R_BULK=$(ratio "$(med sock_put)" "$(med iperf3)")
RELAY_RD=$(ratio "$(med iperf3_relayed)" "$(med iperf3)")
# A routed transfer crosses both LNDs: its direct figure is the slower of the two direct legs
# (o2iblnd on the tcp fabric is the slower one on this host); against socklnd's alone as well.
DIRECT=$(awk -v a="$(med sock_put)" -v b="$(med o2ib_put)" 'BEGIN {if (a != "" && b != "") print (a < b ? a : b)}')
R_TO=$(ratio "$(ratio "$(med routed_tcp_o2ib)" "$DIRECT")" "$RELAY_RD")
R_FROM=$(ratio "$(ratio "$(med routed_o2ib_tcp)" "$DIRECT")" "$RELAY_RD")
S_TO=$(ratio "$(ratio "$(med routed_tcp_o2ib)" "$(med sock_put)")" "$RELAY_RD")
S_FROM=$(ratio "$(ratio "$(med routed_o2ib_tcp)" "$(med sock_put)")" "$RELAY_RD")
printf '%-56s %8s  %-8s %s\n' "socklnd 1 MiB PUT / iperf3 -l 1M" "$R_BULK" ">= 0.95" "$(verdict "$R_BULK" ">=" 0.95)"
printf '%-56s %8s\n' "socklnd ping RTT / sockperf RTT" "$(ratio "$(med sock_rtt)" "$(med sockperf_rtt)")"
printf '%-56s %8s\n' "socklnd ping RTT / o2ib(tcp fabric) ping RTT" "$(ratio "$(med sock_rtt)" "$(med o2ib_rtt)")"
printf '%-56s %8s\n' "socklnd 64B PUT rate / sockperf 64B msg rate" "$(ratio "$(med sock_rate)" "$(med sockperf_rate)")"
printf '%-56s %8s\n' "socklnd 64B PUT rate / o2ib(tcp fabric) 64B PUT rate" "$(ratio "$(med sock_rate)" "$(med o2ib_rate)")"
printf '%-56s %8s\n' "bare relay routed/direct (iperf3)" "$RELAY_RD"
printf '%-56s %8s  %-8s %s\n' "routed tcp->o2ib / slower direct leg, / the relay's" "$R_TO" ">= 0.85" "$(verdict "$R_TO" ">=" 0.85)"
printf '%-56s %8s  %-8s %s\n' "routed o2ib->tcp / slower direct leg, / the relay's" "$R_FROM" ">= 0.85" "$(verdict "$R_FROM" ">=" 0.85)"
printf '%-56s %8s\n' "(info) routed tcp->o2ib / socklnd direct, / the relay's" "$S_TO"
printf '%-56s %8s\n' "(info) routed o2ib->tcp / socklnd direct, / the relay's" "$S_FROM"
printf '%-56s %8s\n' "socklnd 1 MiB PUT zero-copy / copy" "$(ratio "$(med sock_put_zc)" "$(med sock_put)")"
