#!/bin/bash
# hardening.sh - what silent sockets and the descriptor limit cost an lnet-router daemon.
#
#   bash benches/hardening.sh          (from anywhere; loopback only, no root needed)
#
# 1. Memory per silent socket: one daemon (one tcp NI on 127.0.0.1); N sockets connect and
#    never send a CONNREQ. Its VmRSS (/proc/PID/status) before, with all N in their handshake
#    (the `handshakes` gauge of `lnetctl net show -v` says when), and after they are closed:
#    prints the RSS delta per silent socket (target < 4 KiB) and what stayed after.
# 2. CPU at the descriptor limit: a daemon under `ulimit -n 128`; 600 connections arrive and
#    stay. Its CPU time (utime + stime, /proc/PID/stat) over a fixed window, as % of one core
#    (target < 10%), beside the same daemon idle; the accept counters over the window; and how
#    long `lnetctl net show` takes meanwhile (it must answer).
#
# Env:  HARDENING_N=2500        silent sockets in 1
#       HARDENING_FLOOD=600     connections in 2;   HARDENING_NOFILE=128
#       HARDENING_WINDOW=10     seconds of each CPU window
#       HARDENING_PROFILE=release   or debug (no release build needed)
# Needs python3 (the socket client). Bounded: every wait has a deadline; about 1 minute plus
# the build.

. "$(dirname "$0")/lib.sh"
N=${HARDENING_N:-2500}
FLOOD=${HARDENING_FLOOD:-600}
NOFILE=${HARDENING_NOFILE:-128}
WINDOW=${HARDENING_WINDOW:-10}
PROFILE=${HARDENING_PROFILE:-release}

command -v python3 >/dev/null || { echo "SKIP: python3 is needed for the socket client"; exit 0; }
bench_setup hardening "$PROFILE"

# start_daemon NAME PORT [NOFILE]: starts it, sets DPID; waits until its control socket answers.
start_daemon() {
    local name=$1 port=$2 nofile=${3:-}
    ni_yaml "$name" "$port"
    cat >>"$TMP/$name.yaml" <<EOF
peers:
    - nid: 10.0.0.2@o2ib
      address: 127.0.0.1:1
EOF
    local limit=""
    [ -n "$nofile" ] && limit="ulimit -n $nofile &&"
    LNET_LOG=warn sh -c "$limit exec \"\$0\" \"\$@\"" "$BIN/lnet-router" \
        --config "$TMP/$name.yaml" --socket "$TMP/$name.sock" 2>"$TMP/$name.log" &
    DPID=$!
    await_daemon "$name" "$DPID"
}

# counter NAME: one fabric counter of the NI (lnetctl --json net show -v).
counter() {
    "$BIN/lnetctl" --socket "$SOCK" --json net show -v 2>/dev/null | python3 -c '
import json, sys
v = json.load(sys.stdin)
for net in v["net"]:
    for ni in net.get("local NI(s)", []):
        if "fabric" in ni:
            print(ni["fabric"].get(sys.argv[1], "NA"))
' "$1"
}

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# client PORT COUNT MODE: connects COUNT sockets that never send (MODE block: each connect
# completes, at most 2 s; MODE nonblock: connects are only started), touches $TMP/ready, holds
# them until $TMP/release exists (at most 120 s), then closes them.
client() {
    rm -f "$TMP/ready" "$TMP/release"
    python3 - "$1" "$2" "$3" "$TMP" <<'EOF' &
import os, socket, sys, time
port, n, mode, tmp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
socks, ok = [], 0
for _ in range(n):
    s = socket.socket()
    if mode == "block":
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port)); ok += 1
        except OSError:
            pass
    else:
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
    socks.append(s)
open(os.path.join(tmp, "ready"), "w").write(str(ok))
t = time.time()
while not os.path.exists(os.path.join(tmp, "release")) and time.time() - t < 120:
    time.sleep(0.05)
for s in socks:
    s.close()
EOF
    CPID=$!
    PIDS+=("$CPID")
    for _ in $(seq 600); do [ -e "$TMP/ready" ] && return 0; sleep 0.05; done
    echo "the client did not connect"; exit 1
}
release_client() { touch "$TMP/release"; wait "$CPID" 2>/dev/null; }

wait_counter() { # NAME VALUE SECS
    for _ in $(seq $(($3 * 20))); do
        [ "$(counter "$1")" = "$2" ] && return 0
        sleep 0.05
    done
    return 1
}

echo "== 1. memory per silent socket ($N sockets, $PROFILE build)"
PORT=$(free_port)
start_daemon mem "$PORT"
# Warm up the allocator and the ring with a few, then measure.
client "$PORT" 100 block; wait_counter handshakes 100 5; release_client; wait_counter handshakes 0 5
sleep 0.5
RSS0=$(rss_kib "$DPID")
client "$PORT" "$N" block
CONNECTED=$(cat "$TMP/ready")
wait_counter handshakes "$CONNECTED" 5 || echo "warning: handshakes $(counter handshakes) of $CONNECTED"
RSS1=$(rss_kib "$DPID")
HELD=$(counter rx_buffer_bytes)
HS=$(counter handshakes)
release_client
wait_counter handshakes 0 10 || echo "warning: handshakes still $(counter handshakes)"
sleep 2 # a sweep of the fabric (every 1.25 s) gives back the socket table's spare capacity
RSS2=$(rss_kib "$DPID")
echo "connected:               $CONNECTED silent sockets ($HS in handshake at the sample)"
echo "RSS before:              $RSS0 KiB"
echo "RSS with them:           $RSS1 KiB   (+$((RSS1 - RSS0)) KiB)"
echo "RSS per silent socket:   $(( (RSS1 - RSS0) * 1024 / (CONNECTED > 0 ? CONNECTED : 1) )) B   (target < 4096)"
echo "receive buffers held:    $HELD B   ($(( HELD / (HS > 0 ? HS : 1) )) B each)"
echo "RSS after they closed:   $RSS2 KiB   (+$((RSS2 - RSS0)) KiB over before)"
echo "handshakes_refused:      $(counter handshakes_refused)   handshake_timeouts: $(counter handshake_timeouts)"
kill -TERM "$DPID"; wait "$DPID" 2>/dev/null

echo
echo "== 2. CPU at the descriptor limit (ulimit -n $NOFILE, $FLOOD connections, ${WINDOW} s windows)"
PORT=$(free_port)
start_daemon fd "$PORT" "$NOFILE"
HZ=$(getconf CLK_TCK)
T0=$(cpu_ticks "$DPID"); sleep "$WINDOW"; T1=$(cpu_ticks "$DPID")
echo "idle:                    $(( (T1 - T0) * 1000 / HZ )) ms CPU in ${WINDOW} s = $(( (T1 - T0) * 100 / (HZ * WINDOW) )).$(( (T1 - T0) * 1000 / (HZ * WINDOW) % 10 ))% of a core"
client "$PORT" "$FLOOD" nonblock
sleep 1
E0=$(counter accept_errors); S0=$(counter accepts_shed); B0=$(counter accept_backoffs)
T0=$(cpu_ticks "$DPID")
START=$(date +%s%N)
SLOWEST=0; FAILED=0; CALLS=0
while [ $(( ($(date +%s%N) - START) / 1000000000 )) -lt "$WINDOW" ]; do
    C0=$(date +%s%N)
    if timeout 15 "$BIN/lnetctl" --socket "$SOCK" net show >/dev/null 2>&1; then :; else FAILED=$((FAILED + 1)); fi
    MS=$(( ($(date +%s%N) - C0) / 1000000 ))
    [ "$MS" -gt "$SLOWEST" ] && SLOWEST=$MS
    CALLS=$((CALLS + 1))
    sleep 1
done
T1=$(cpu_ticks "$DPID")
E1=$(counter accept_errors); S1=$(counter accepts_shed); B1=$(counter accept_backoffs)
release_client
echo "at the limit:            $(( (T1 - T0) * 1000 / HZ )) ms CPU in ${WINDOW} s = $(( (T1 - T0) * 100 / (HZ * WINDOW) )).$(( (T1 - T0) * 1000 / (HZ * WINDOW) % 10 ))% of a core   (target < 10%; includes the lnetctl calls)"
echo "over the window:         accept_errors +$((E1 - E0)), accepts_shed +$((S1 - S0)), accept_backoffs +$((B1 - B0))"
echo "totals:                  accepted $(counter accepted), accept_errors $E1, accepts_shed $S1, accept_backoffs $B1, handshake_timeouts $(counter handshake_timeouts)"
echo "lnetctl net show:        $CALLS calls, $FAILED failed, slowest ${SLOWEST} ms"
echo "limit warnings logged:   $(grep -c 'at the descriptor limit' "$TMP/fd.log")"
kill -TERM "$DPID"; wait "$DPID" 2>/dev/null
