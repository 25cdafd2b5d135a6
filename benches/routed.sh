#!/bin/bash
# routed.sh - LNet through a ulnet router against the direct path, same run, on loopback.
#
#   bash benches/routed.sh
#
# Builds lnet_perf and lnet-router (release), then runs, each direct (client -> server) and
# routed (client -> lnet-router daemon -> server, three processes):
#   ping RTT, 1 client           lnet_perf --rtt 10000 [--via-router target/release/lnet-router]
#   64-B PUT rate, 1 client      lnet_perf --put-rate 5 [...]
#   64-B PUT rate, 8 clients     lnet_perf --put-rate 5 --clients 8 [...]
#   ping RTT, 8 clients          lnet_perf --rtt 2000 --clients 8 [...]
#   64-B PUT rate, 8 clients, the server and the router tuned as a site tunes its servers and
#   routers (peer_credits TUNED_CREDITS=64 on their NIs, the clients at the default 8):
#                                lnet_perf --put-rate 5 --clients 8 --server-peer-credits 64 [...]
#   With every node at the default 8, eight clients' streams share the router's 8 LNet
#   credits towards the server (kernel LNet's lpni_txcredits, likewise), where direct they
#   have 8 each: the default row measures that funnel, the tuned row the forwarding itself.
# Routed runs twice: the router with a thread per NI (--ni-threads per-ni, the default) and with
# both NIs on one thread (--ni-threads shared). Prints each figure, the routed/direct ratios,
# and the CPU seconds each process used.
# The relay ceiling, same run: each figure again with a bare relay between the same client and
# server (lnet_perf --via-relay target/release/tcp_relay --relay-arg --spin: a byte-stream
# relay that busy-polls every connection and never sleeps, with no framing, no LNet, no
# credits of its own, so the clients' LND credits reach the server end to end): what a third
# process forwarding on these two cores reaches by itself. Where the target is below it, no
# router can meet the target here; the 8-client rate at default credits is also LNet's funnel,
# which the relay does not have.
# Targets (issue "Routing", on a 2-core machine where three processes share two cores):
# routed rate >= 0.5x direct, routed RTT <= 2.5x direct.
#
# Metrics cost (issue 36): `bash benches/routed.sh --metrics-ab` runs only the routed 64-B PUT
# rate, 1 client, AB_RUNS=5 times alternating the router without its metrics endpoint and with it
# on (--metrics-listen 127.0.0.1:METRICS_PORT, default 9170) and scraped every second by a curl
# loop, and prints each run, both medians, the scrapes served, and whether the on median is
# within the off runs' min-max or within 5% of their median.
#
# Env: ROUTER_BUSY_POLL_US (the router's NIs' busy-poll budget; default: lnet_perf's, 50 us),
#      RTT_N=10000, PUT_SECS=5, TUNED_CREDITS=64. Every run is bounded by `timeout`.
. "$(dirname "$0")/lib.sh"
RTT_N=${RTT_N:-10000}
PUT_SECS=${PUT_SECS:-5}
TUNED_CREDITS=${TUNED_CREDITS:-64}
build_perf --bin tcp_relay
extra=()
[ -n "${ROUTER_BUSY_POLL_US:-}" ] && extra=(--router-busy-poll-us "$ROUTER_BUSY_POLL_US")

# run NAME ARGS...: prints "NAME value cpu-line" from lnet_perf's FIGURE lines
run() {
  local name=$1
  shift
  echo "\$ lnet_perf $*" >&2
  local out
  out=$(timeout 300 "$PERF" "$@" 2>/dev/null)
  local st=$?
  local fig cpu
  fig=$(grep -E '^FIGURE ulnet_(ping_rtt|put64_rate)' <<<"$out" | sed -E 's/.*(median|value)=([0-9.]+).*/\2/')
  cpu=$(grep '^FIGURE cpu_seconds' <<<"$out" | sed 's/^FIGURE cpu_seconds //')
  [ $st -eq 0 ] && [ -n "$fig" ] || { fig=NA; cpu="(run failed, status $st)"; }
  printf '%s %s %s\n' "$name" "$fig" "$cpu"
}

median() { printf '%s\n' "$@" | grep -v NA | sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "NA"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

if [ "${1:-}" = "--metrics-ab" ]; then
  AB_RUNS=${AB_RUNS:-5}
  METRICS_PORT=${METRICS_PORT:-9170}
  off=() on=() scrapes=()
  for i in $(seq 1 "$AB_RUNS"); do
    read -r _ v _ < <(run "off-$i" --put-rate "$PUT_SECS" --via-router "$ROUTER" "${extra[@]}")
    off+=("$v")
    count=$(mktemp)
    # The scraper: one GET /metrics a second for as long as the run may take (bounded).
    (
      n=0
      end=$((SECONDS + PUT_SECS + 60))
      while [ $SECONDS -lt $end ]; do
        curl -s -f -o /dev/null --max-time 2 "http://127.0.0.1:$METRICS_PORT/metrics" && n=$((n + 1)) && echo "$n" >"$count"
        sleep 1
      done
    ) &
    scraper=$!
    read -r _ v _ < <(run "on-$i" --put-rate "$PUT_SECS" --via-router "$ROUTER" "${extra[@]}" \
      --router-arg --metrics-listen --router-arg "127.0.0.1:$METRICS_PORT")
    kill "$scraper" 2>/dev/null
    wait "$scraper" 2>/dev/null
    on+=("$v")
    scrapes+=("$(cat "$count" 2>/dev/null || echo 0)")
    rm -f "$count"
    echo "run $i: off ${off[-1]} msgs/s, on ${on[-1]} msgs/s (${scrapes[-1]} scrapes)"
  done
  mo=$(median "${off[@]}")
  mn=$(median "${on[@]}")
  lo=$(printf '%s\n' "${off[@]}" | grep -v NA | sort -g | head -1)
  hi=$(printf '%s\n' "${off[@]}" | grep -v NA | sort -g | tail -1)
  echo "metrics off: median $mo msgs/s (min $lo, max $hi); metrics on, scraped every 1 s: median $mn msgs/s"
  if awk -v m="$mn" -v o="$mo" -v lo="$lo" -v hi="$hi" 'BEGIN { exit !(m != "NA" && o != "NA" && ((m >= lo && m <= hi) || (m >= 0.95 * o && m <= 1.05 * o))) }'; then
    echo "target (on median within off min-max or within 5% of off median): met"
  else
    echo "target (on median within off min-max or within 5% of off median): NOT met"
  fi
  exit 0
fi

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "NA" || b == "NA" || b == 0) print "NA"; else printf "%.2f", a / b }'; }

declare -A V C
for spec in \
  "rtt1|--rtt $RTT_N" \
  "put1|--put-rate $PUT_SECS" \
  "put8|--put-rate $PUT_SECS --clients 8" \
  "rtt8|--rtt $((RTT_N / 5)) --clients 8" \
  "put8t|--put-rate $PUT_SECS --clients 8 --server-peer-credits $TUNED_CREDITS"; do
  key=${spec%%|*}
  args=${spec#*|}
  # shellcheck disable=SC2086
  read -r _ v c < <(run "$key-direct" $args)
  V[$key-direct]=$v C[$key-direct]=$c
  # shellcheck disable=SC2086
  read -r _ v c < <(run "$key-relay" $args --via-relay target/release/tcp_relay --relay-arg --spin)
  V[$key-relay]=$v C[$key-relay]=$c
  for mode in per-ni shared; do
    # shellcheck disable=SC2086
    read -r _ v c < <(run "$key-$mode" $args --via-router "$ROUTER" "${extra[@]}" \
      --router-arg --ni-threads --router-arg "$mode")
    V[$key-$mode]=$v C[$key-$mode]=$c
  done
done

echo
printf '%-28s %10s %14s %14s %8s %8s %8s   %s\n' "figure" "direct" "routed per-ni" "routed shared" "ratio" "ratio" "target" "bare relay (ratio)"
row() {  # key label unit target-op target
  local out verdict r
  out=$(printf '%-28s %10s %14s %14s' "$2 ($3)" "${V[$1-direct]}" "${V[$1-per-ni]}" "${V[$1-shared]}")
  verdict=""
  for mode in per-ni shared; do
    r=$(ratio "${V[$1-$mode]}" "${V[$1-direct]}")
    out="$out $(printf '%8s' "$r")"
    if [ "$r" != NA ] && awk -v r="$r" -v t="$5" -v op="$4" 'BEGIN { exit !((op == "<=" && r <= t) || (op == ">=" && r >= t)) }'; then
      verdict="$verdict $mode:met"
    else
      verdict="$verdict $mode:NOT-met"
    fi
  done
  printf '%s %8s %s   %s (%s)\n' "$out" "$4 $5" "$verdict" "${V[$1-relay]}" "$(ratio "${V[$1-relay]}" "${V[$1-direct]}")"
}
row rtt1 "ping RTT median, 1 client" "us" "<=" 2.5
row rtt8 "ping RTT median, 8 clients" "us" "<=" 2.5
row put1 "64-B PUT rate, 1 client" "msgs/s" ">=" 0.5
row put8 "64-B PUT rate, 8 clients" "msgs/s" ">=" 0.5
row put8t "same, server+router pc=$TUNED_CREDITS" "msgs/s" ">=" 0.5
echo
echo "CPU seconds (user + system) of each process over each run:"
for k in rtt1 rtt8 put1 put8 put8t; do
  for mode in direct relay per-ni shared; do
    printf '  %-6s %-7s %s\n' "$k" "$mode" "${C[$k-$mode]}"
  done
done

# A slow consumer: the server stops (SIGSTOP) for STALL_SECS under a routed 8-client PUT stream;
# the clients must stall on credits, the router's RSS and held messages stay flat, and after it
# continues the books reconcile (lnet_perf exits 1 otherwise).
STALL_SECS=${STALL_SECS:-10}
echo
echo "Slow consumer: server stopped for ${STALL_SECS} s under a routed PUT stream, 8 clients (every 1 s):"
echo "\$ lnet_perf --put-rate 2 --clients 8 --via-router $ROUTER --stall-server $STALL_SECS" >&2
out=$(timeout 300 "$PERF" --put-rate 2 --clients 8 --via-router "$ROUTER" --stall-server "$STALL_SECS" 2>/dev/null)
st=$?
grep '^SAMPLE stall' <<<"$out" | awk 'NR % 4 == 1 { $1 = $2 = ""; print "  " $0 }'
grep -E '^FIGURE (router_rss_kib|router_books)' <<<"$out" | sed 's/^FIGURE /  /'
[ $st -eq 0 ] && echo "  lnet_perf: ok (nothing lost, books reconcile)" || echo "  lnet_perf FAILED (status $st)"
