#!/bin/bash
# loopback.sh - ulnet against its peers on loopback TCP, in one go, with the ratios.
#
#   bash benches/loopback.sh            (from anywhere; needs root for the private netns)
#
# Runs, all on 127.0.0.1 and inside one private network namespace (only lo up):
#   1. sockperf TCP ping-pong, 64 B            (one-way latency = RTT/2: avg, p50, p99)
#   2. sockperf TCP throughput, 64 B           (message rate, msg/s)
#   3. ucx_perftest tag_lat, 8 B, UCX_TLS=tcp  (one-way latency = RTT/2: p50, overall avg)
#   4. ucx_perftest tag_bw, 8 B, UCX_TLS=tcp   (message rate, msg/s)
#   5. cargo run --release -p benches --bin lnet_perf -- --rtt 20000      (LNet ping RTT)
#   6. cargo run --release -p benches --bin lnet_perf -- --put-rate 10    (64-B PUT rate)
# then prints each figure and the ratios:
#   ulnet ping RTT (median) / sockperf RTT (2 x one-way p50)      target <= 2
#   ulnet 64-B PUT rate     / sockperf 64-B message rate          target >= 0.5
#   ulnet 64-B PUT rate     / UCX tag_bw 8-B message rate         target >  1
#
# The server and client command lines of sockperf and ucx_perftest are the ones of
# shared/tools/peers.sh. Like peers.sh, everything runs in a private network namespace so
# that ucx_perftest's out-of-band port (it listens on INADDR_ANY) is not reachable from outside;
# lnet_perf runs in the same namespace so that every figure crosses the same lo.
# Missing tools are installed with apt-get (sockperf, ucx-utils); a tool that is still missing
# is skipped (SKIP line) and its ratio shows NA.
#
# Env:  T_SOCK=10        seconds of each sockperf test
#       LNET_RTT=20000   pings;  LNET_SECS=10   seconds of the PUT stream
#       LOOPBACK_NETNS=0 run in the root namespace instead
#       LOOPBACK_CPU_WARN=10   warn when other processes use more than this % of one CPU
#       LOOPBACK_C2C_MAX=150   warn when the cross-vCPU cache-line round trip (ns) is this slow
#       LNET_EXTRA=0     skip the info-only runs (PUT rate with peer_credits 32)
# Bounded: every command runs under `timeout`; the whole script takes about 1.5-2 minutes.

. "$(dirname "$0")/lib.sh"
T_SOCK=${T_SOCK:-10}
LNET_RTT=${LNET_RTT:-20000}
LNET_SECS=${LNET_SECS:-10}
UCX_ENV="env UCX_TLS=tcp UCX_NET_DEVICES=lo"
NS=ulnetlo$$
PRE=""
TMP=$(mktemp -d /tmp/loopback.XXXXXX)
CUR_SPID=""
WARNS=()

cleanup() {
  [ -n "$CUR_SPID" ] && kill "$CUR_SPID" 2>/dev/null
  [ -n "$PRE" ] && ip netns del "$NS" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

have() { command -v "$1" >/dev/null 2>&1; }
warn() { echo "WARN $*" >&2; WARNS+=("$*"); }
run() { echo "+ $*" >&2; "$@"; }

# --- tools --------------------------------------------------------------------------------
need=()
have sockperf || need+=(sockperf)
have ucx_perftest || need+=(ucx-utils)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  timeout 300 apt-get install -y "${need[@]}" >/dev/null 2>&1 \
    || { timeout 120 apt-get update >/dev/null 2>&1 && timeout 300 apt-get install -y "${need[@]}" >/dev/null 2>&1; } \
    || warn "apt-get install ${need[*]} failed"
fi

# --- namespace ----------------------------------------------------------------------------
if [ "${LOOPBACK_NETNS:-1}" = 1 ]; then
  if ip netns add "$NS" 2>/dev/null; then
    ip netns exec "$NS" ip link set lo up && PRE="ip netns exec $NS"
  else
    warn "cannot create netns $NS (not root?); running in the root namespace"
  fi
fi

# --- CPU check (as peers.sh's busy_check): % of one CPU used over 1 s while we are idle ---
busy_check() {
  local a1 a2 a3 a4 a5 a6 a7 a8 b1 b2 b3 b4 b5 b6 b7 b8
  read -r _ a1 a2 a3 a4 a5 a6 a7 a8 _ < /proc/stat; sleep 1
  read -r _ b1 b2 b3 b4 b5 b6 b7 b8 _ < /proc/stat
  local tot=$(( (b1+b2+b3+b4+b5+b6+b7+b8) - (a1+a2+a3+a4+a5+a6+a7+a8) ))
  local idle=$(( (b4+b5) - (a4+a5) ))
  local busy=$(( tot>0 ? (tot-idle)*100*$(nproc)/tot : 0 ))
  if [ "$busy" -gt "${LOOPBACK_CPU_WARN:-10}" ]; then
    warn "before $1: machine already busy (${busy}% of one CPU used by other processes); figures may be low"
  fi
  c2c_check "$1"
}

# c2c probe (from peers.sh): cache-line round trip between vCPU0 and vCPU1. Normally 55-110 ns
# on this VM; 450-800 ns in the host's "slow mode", when every cross-core loopback figure degrades.
C2C=""
if have gcc && [ "$(nproc)" -ge 2 ]; then
  cat > "$TMP/c2c.c" <<'CEOF'
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdatomic.h>
#include <time.h>
static _Alignas(64) atomic_int flag; static const int N=200000;
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void*pong(void*a){(void)a;pin(1);for(int i=0;i<N;i++){while(atomic_load_explicit(&flag,memory_order_acquire)!=2*i+1);atomic_store_explicit(&flag,2*i+2,memory_order_release);}return 0;}
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(void){pthread_t t;pthread_create(&t,0,pong,0);pin(0);double t0=now();
 for(int i=0;i<N;i++){atomic_store_explicit(&flag,2*i+1,memory_order_release);while(atomic_load_explicit(&flag,memory_order_acquire)!=2*i+2);}
 double dt=now()-t0;pthread_join(t,0);printf("%.0f\n",dt/N);return 0;}
CEOF
  gcc -O2 -pthread -o "$TMP/c2c" "$TMP/c2c.c" 2>/dev/null && C2C=$TMP/c2c
fi
C2CS=()
c2c_check() { # label
  [ -z "$C2C" ] && return 0
  local c; c=$(timeout 20 "$C2C") || return 0
  C2CS+=("$1:$c")
  [ "$c" -ge "${LOOPBACK_C2C_MAX:-150}" ] && warn "before $1: cross-vCPU cache-line round trip $c ns (>= ${LOOPBACK_C2C_MAX:-150}): host 'slow mode', figures not comparable"
}

# server in the background (under timeout), client in the foreground, server stopped by PID
pair() { # srv_cmd cli_cmd outfile
  echo "+ $PRE $1 &" >&2
  $PRE bash -c "exec $1" > "$3.srv" 2>&1 &
  local spid=$!; CUR_SPID=$spid
  sleep 1
  echo "+ $PRE $2" >&2
  $PRE bash -c "$2" > "$3" 2>&1; local rc=$?
  for _ in $(seq 1 30); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; CUR_SPID=""
  return $rc
}

declare -A F   # figure name -> value

# --- 1./2. sockperf -----------------------------------------------------------------------
if have sockperf; then
  busy_check "sockperf ping-pong"
  f=$TMP/sp_pp
  if pair "timeout $((T_SOCK+30)) sockperf server --tcp -i 127.0.0.1 -p 11111" \
          "timeout $((T_SOCK+20)) sockperf ping-pong --tcp -i 127.0.0.1 -p 11111 -m 64 -t $T_SOCK" "$f"; then
    F[sp_avg]=$(grep -o 'avg-latency=[0-9.]*' "$f" | cut -d= -f2)
    F[sp_p50]=$(awk '/percentile 50.000/ {print $NF}' "$f")
    F[sp_p99]=$(awk '/percentile 99.000/ {print $NF}' "$f")
  else warn "sockperf ping-pong failed: $(tail -2 "$f" | tr '\n' ' ')"; fi

  busy_check "sockperf throughput"
  f=$TMP/sp_tp
  if pair "timeout $((T_SOCK+30)) sockperf server --tcp -i 127.0.0.1 -p 11112" \
          "timeout $((T_SOCK+20)) sockperf throughput --tcp -i 127.0.0.1 -p 11112 -m 64 -t $T_SOCK" "$f"; then
    F[sp_rate]=$(grep -o 'Message Rate is [0-9.]*' "$f" | awk '{print $4}')
  else warn "sockperf throughput failed: $(tail -2 "$f" | tr '\n' ' ')"; fi
else echo "SKIP sockperf not installed"; fi

# --- 3./4. ucx_perftest over the UCX tcp transport ----------------------------------------
# Final: iters lat50 lat_avg lat_overall bw_avg bw_overall mr_avg mr_overall
if have ucx_perftest; then
  PORT=15200
  ucxrun() { # key args... -> l = the "Final:" line ("" on failure)
    local key=$1; shift; PORT=$((PORT+1)); local f=$TMP/$key; l=""
    busy_check "ucx $key"
    if pair "timeout 120 $UCX_ENV ucx_perftest -p $PORT" \
            "timeout 120 $UCX_ENV ucx_perftest 127.0.0.1 -p $PORT $*" "$f"; then
      l=$(grep '^Final:' "$f" | tail -1)
    fi
    [ -z "$l" ] && warn "ucx $key failed: $(tail -2 "$f" | tr '\n' ' ')"
  }
  ucxrun tag_lat_8B -t tag_lat -s 8 -n 500000 -w 10000
  if [ -n "$l" ]; then
    F[ucx_lat_p50]=$(echo "$l" | awk '{print $3}'); F[ucx_lat_avg]=$(echo "$l" | awk '{print $5}')
  fi
  ucxrun tag_bw_8B -t tag_bw -s 8 -n 2000000 -w 20000
  [ -n "$l" ] && F[ucx_bw_rate]=$(echo "$l" | awk '{print $9}')
else echo "SKIP ucx_perftest not installed"; fi

# --- 5./6. ulnet ----------------------------------------------------------------------------
cd "$ROOT" || exit 1
echo "+ cargo build --release -p benches --bin lnet_perf" >&2
if timeout 600 cargo build --release -q -p benches --bin lnet_perf; then
  busy_check "lnet_perf --rtt"
  f=$TMP/lnet_rtt
  echo "+ $PRE cargo run --release -p benches --bin lnet_perf -- --rtt $LNET_RTT" >&2
  $PRE timeout 180 cargo run --release -q -p benches --bin lnet_perf -- --rtt "$LNET_RTT" > "$f" 2> "$f.err"
  rc=$?; cat "$f" "$f.err" >&2
  if [ $rc = 0 ]; then
    l=$(grep '^FIGURE ulnet_ping_rtt' "$f")
    F[ul_rtt_p50]=$(echo "$l" | grep -o 'median=[0-9.]*' | cut -d= -f2)
    F[ul_rtt_p99]=$(echo "$l" | grep -o 'p99=[0-9.]*' | cut -d= -f2)
    F[ul_rtt_min]=$(echo "$l" | grep -o 'min=[0-9.]*' | cut -d= -f2)
  else warn "lnet_perf --rtt failed (exit $rc)"; fi

  busy_check "lnet_perf --put-rate"
  f=$TMP/lnet_put
  echo "+ $PRE cargo run --release -p benches --bin lnet_perf -- --put-rate $LNET_SECS" >&2
  $PRE timeout $((LNET_SECS+60)) cargo run --release -q -p benches --bin lnet_perf -- --put-rate "$LNET_SECS" > "$f" 2> "$f.err"
  rc=$?; cat "$f" "$f.err" >&2
  if [ $rc = 0 ]; then
    F[ul_put_rate]=$(grep '^FIGURE ulnet_put64_rate' "$f" | grep -o 'value=[0-9.]*' | cut -d= -f2)
  else warn "lnet_perf --put-rate failed (exit $rc)"; fi
  if [ "${LNET_EXTRA:-1}" = 1 ]; then
    # Info only: the PUT stream with peer_credits 32, the profile Lustre ships in
    # ko2iblnd.conf (peer_credits=32, peer_credits_hiw=16) instead of LNet's default 8. At 8
    # the stream is credit-bound: at most 8 messages between two credit returns, so each
    # socket write carries 4-8 of them and the kernel's per-write cost sets the rate.
    busy_check "lnet_perf --put-rate --peer-credits 32"
    f=$TMP/lnet_put32
    echo "+ $PRE cargo run --release -p benches --bin lnet_perf -- --put-rate 5 --peer-credits 32" >&2
    $PRE timeout 70 cargo run --release -q -p benches --bin lnet_perf -- --put-rate 5 --peer-credits 32 > "$f" 2> "$f.err"
    cat "$f" "$f.err" >&2
    F[ul_put_32]=$(grep '^FIGURE ulnet_put64_rate' "$f" | grep -o 'value=[0-9.]*' | cut -d= -f2)
  fi
else warn "cargo build of lnet_perf failed"; fi

# --- table --------------------------------------------------------------------------------
v() { echo "${F[$1]:-NA}"; }
calc() { # awk expression over a b -> value or NA
  local a=$1 b=$2 e=$3
  if [[ "$a" == NA || "$b" == NA || -z "$a" || -z "$b" ]]; then echo NA; return; fi
  awk -v a="$a" -v b="$b" "BEGIN { if (b == 0) print \"NA\"; else printf \"%.3f\", $e }"
}
verdict() { # value op target
  [ "$1" = NA ] && { echo "NA"; return; }
  awk -v x="$1" -v t="$3" -v op="$2" 'BEGIN {
    ok = (op == "<=") ? (x <= t) : (op == ">=") ? (x >= t) : (x > t);
    print ok ? "met" : "NOT met" }'
}
SP_RTT=$(calc "$(v sp_p50)" 1 "2*a")
SP_RTT_AVG=$(calc "$(v sp_avg)" 1 "2*a")
UCX_RTT=$(calc "$(v ucx_lat_p50)" 1 "2*a")
R1=$(calc "$(v ul_rtt_p50)" "$SP_RTT" "a/b")
R2=$(calc "$(v ul_put_rate)" "$(v sp_rate)" "a/b")
R3=$(calc "$(v ul_put_rate)" "$(v ucx_bw_rate)" "a/b")
R4=$(calc "$(v ul_rtt_p50)" "$UCX_RTT" "a/b")

echo
NSDESC=no; [ -n "$PRE" ] && NSDESC=$NS
echo "== figures (loopback TCP, $(nproc) CPUs, private netns: $NSDESC) =="
printf '%-44s %14s  %s\n' figure value unit
printf '%-44s %14s  %s\n' "sockperf tcp ping-pong 64B one-way avg" "$(v sp_avg)" usec
printf '%-44s %14s  %s\n' "sockperf tcp ping-pong 64B one-way p50" "$(v sp_p50)" usec
printf '%-44s %14s  %s\n' "sockperf tcp ping-pong 64B one-way p99" "$(v sp_p99)" usec
printf '%-44s %14s  %s\n' "sockperf tcp ping-pong 64B RTT (2 x p50)" "$SP_RTT" usec
printf '%-44s %14s  %s\n' "sockperf tcp throughput 64B msg rate" "$(v sp_rate)" msgs/s
printf '%-44s %14s  %s\n' "ucx tcp tag_lat 8B one-way p50" "$(v ucx_lat_p50)" usec
printf '%-44s %14s  %s\n' "ucx tcp tag_lat 8B one-way overall avg" "$(v ucx_lat_avg)" usec
printf '%-44s %14s  %s\n' "ucx tcp tag_lat 8B RTT (2 x p50)" "$UCX_RTT" usec
printf '%-44s %14s  %s\n' "ucx tcp tag_bw 8B msg rate (overall)" "$(v ucx_bw_rate)" msgs/s
printf '%-44s %14s  %s\n' "ulnet LNet ping RTT median" "$(v ul_rtt_p50)" usec
printf '%-44s %14s  %s\n' "ulnet LNet ping RTT p99" "$(v ul_rtt_p99)" usec
printf '%-44s %14s  %s\n' "ulnet LNet ping RTT min" "$(v ul_rtt_min)" usec
printf '%-44s %14s  %s\n' "ulnet LNet 64B PUT rate" "$(v ul_put_rate)" msgs/s
printf '%-44s %14s  %s\n' "(info) ulnet 64B PUT rate, peer_credits 32" "$(v ul_put_32)" msgs/s
echo
echo "== ratios =="
printf '%-52s %8s  %-8s %s\n' ratio value target verdict
printf '%-52s %8s  %-8s %s\n' "ulnet ping RTT / sockperf RTT (medians)" "$R1" "<= 2" "$(verdict "$R1" "<=" 2)"
printf '%-52s %8s  %-8s %s\n' "ulnet 64B PUT rate / sockperf 64B msg rate" "$R2" ">= 0.5" "$(verdict "$R2" ">=" 0.5)"
printf '%-52s %8s  %-8s %s\n' "ulnet 64B PUT rate / UCX tag_bw 8B msg rate" "$R3" "> 1" "$(verdict "$R3" ">" 1)"
printf '%-52s %8s  %-8s %s\n' "(info) ulnet ping RTT / UCX tag_lat RTT (medians)" "$R4" "-" "-"
printf '%-52s %8s  %-8s %s\n' "(info) PUT rate pc32 / sockperf 64B msg rate" "$(calc "$(v ul_put_32)" "$(v sp_rate)" "a/b")" "-" "-"
printf '%-52s %8s  %-8s %s\n' "(info) PUT rate pc32 / UCX tag_bw 8B msg rate" "$(calc "$(v ul_put_32)" "$(v ucx_bw_rate)" "a/b")" "-" "-"
[ ${#C2CS[@]} -gt 0 ] && echo "c2c round trip ns before each test: ${C2CS[*]}"
if [ ${#WARNS[@]} -gt 0 ]; then
  echo
  echo "== warnings (figures may not be representative) =="
  printf '%s\n' "${WARNS[@]}"
fi
