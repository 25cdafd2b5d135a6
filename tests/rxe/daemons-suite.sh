#!/bin/sh
# tests/rxe/daemons-suite.sh — issue 5's daemon acceptance, inside the Soft-RoCE guest (busybox
# sh, run by guest.sh directly or by verbs-suite.sh after its own steps): two `lnet-router`
# daemons on `fabric: verbs` in this guest, A = 10.0.0.1@o2ib and B = 10.0.0.2@o2ib (10.0.0.2 is
# added to dummy0; rxe0 gets its GID), each on its NID's address, port 987 (the defaults: no
# `listen:` and no `peers:` in the configs), LND tunables timeout 4 s, keepalive 2 s.
#
#   1 ping      `lnetctl ping` A->B and B->A; A's `peer show` / `conn show` show B up and connected
#   2 stop      SIGTERM to B: B exits 0 within 7 s (its close is bounded at 5 s), and A's RC
#               queue pairs (`rdma res show qp`, A's pid) are back to the baseline taken before
#               A connected in under 1 s of the signal; A's `conn show` has no connection to B
#   3 kill      B restarted and connected again, then frozen (SIGSTOP) while A sends it 12 pings
#               (more than peer_credits 8, so some wait in A's queues), then SIGKILLed: A sees the
#               disconnect and marks B down within keepalive + timeout (6 s; measured with lnetctl
#               polls and from A's log); every pending ping exits non-zero with an error message:
#               those still queued in A (at least 12 - 8) on the disconnect, within 6 s, those whose
#               GET B's HCA had already taken at their own 10 s timeout, none later; a ping started
#               right after the kill fails within 6 s too
#   4 qps       A's queue pairs back to the baseline after the kill as well
#   5 frozen    B restarted, connected, then frozen (SIGSTOP), so no cm event comes: while idle A
#               keeps the connection (a peer that owes us nothing may stay silent, as in o2iblnd);
#               then A sends it 12 pings (more than peer_credits 8): those waiting for credits the
#               frozen B never returns miss their deadline, and A marks B down within timeout +
#               keepalive (+1.5 s for the emulated guest's polls), the connection and its QP gone
#               1 s later at most (the engine's close bound: a frozen peer never answers the DREQ)
#   6 routed    routing over verbs: C = 10.0.0.11@o2ib, router R = 10.0.0.13@o2ib + 10.0.1.13@o2ib1,
#               S = 10.0.1.12@o2ib1 (four more addresses on dummy0, so rxe0 gets their GIDs):
#               C's `route show -v` shows the route up, C pings S and S pings C through R, and
#               R's `routing show` has forwarded every GET and REPLY, its books balanced; then
#               bulk PUTs of 1 B..1 MiB from an LNet client (10.0.0.14@o2ib) to an LNet server
#               (10.0.1.15@o2ib1) through R's registered large buffers, byte for byte
#               (verbs_routed_bulk), R's books balanced with nothing dropped
#   7 selftest  lnet_selftest over verbs from C's console (`lnetctl selftest run-test`): brw write
#               and read with check=full, 1 B to 1 MiB (odd lengths, offset 8), each run to A
#               (direct, on o2ib) and to S (through R) at once, every RPC clean; then brw write
#               bandwidth C->A at 64 KiB and 1 MiB (check=none) beside ib_write_bw at those sizes
#               when perftest is in the guest (a ratio for the record: the emulated CPU makes it
#               no gate)
#
# Exit status: 0, or the first failure: 21 setup (address, GID, daemons did not start), 22 ping,
# 23 graceful stop, 24 queue pairs after the graceful stop, 25 SIGKILL detection / pending pings,
# 26 queue pairs after the kill, 28 frozen peer, 29 routing, 30 selftest (27: verbs-suite.sh's
# bound on this whole suite ran out). Every check prints what it measured.
A=10.0.0.1 B=10.0.0.2
NA=$A@o2ib NB=$B@o2ib
SA=/tmp/a.sock SB=/tmp/b.sock
TIMEOUT=4 KEEPALIVE=2 PEER_CREDITS=8 PING_TO=10
export RUST_BACKTRACE=1 LNET_LOG=${LNET_LOG:-info}
first=0
failed() { echo "=== daemons: FAILED ($1): $2"; [ "$first" = 0 ] && first=$1; }
now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# RC queue pairs owned by process $1 (rdma res show qp: "... type RC ... pid N comm ...").
# The kernel records the *thread* that created a QP (the daemon's "ni <nid>" thread, not
# its main thread), so count the QPs of every task of the process.
qps() {
  rdma res show qp 2>/dev/null | awk -v tids="$(ls /proc/"$1"/task 2>/dev/null | tr '\n' ' ')" '
    BEGIN { n = split(tids, a, " "); for (i = 1; i <= n; i++) mine[a[i]] = 1; n = 0 }
    { for (i = 1; i < NF; i++) { if ($i == "type") t = $(i + 1); if ($i == "pid") q = $(i + 1) } }
    t == "RC" && (q in mine) { n++ } { t = ""; q = "" } END { print n + 0 }'
}
# the UTC time of day to a few ms, as the daemons' logs write it (busybox date has no %N; a
# tmpfs file's mtime has the kernel's coarse clock: a tick)
tod() { : >/tmp/.tod; TZ=UTC stat -c %y /tmp/.tod | cut -d' ' -f2; }
# seconds from time of day $1 to the first "peer down" for B that A logged at or after it
a_logged_down_after() {
  tr -d '\033' </tmp/A.log | sed 's/\[[0-9;]*m//g' | grep "peer down" | grep "nid=$NB" | awk -v k="$1" '
    function sec(t, a) { split(t, a, ":"); return a[1] * 3600 + a[2] * 60 + a[3] }
    { t = $1; sub(/^.*T/, "", t); sub(/Z$/, "", t); d = sec(t) - sec(k); if (d < -43200) d += 86400
      if (d >= 0) { printf "%.3f\n", d; exit } }'
}
# every RC queue pair in the guest
all_qps() { rdma res show qp 2>/dev/null | grep -c 'type RC'; }

conf() {  # nid file ; B's config names no fabric: the daemon finds its address on rxe0
  if [ "$1" = "$NB" ]; then fabric=""; else fabric="      fabric: verbs
"; fi
  cat >"$2" <<EOF
net:
    - net type: o2ib
${fabric}      local NI(s):
        - nid: $1
          tunables:
              peer_credits: $PEER_CREDITS
          lnd tunables:
              timeout: $TIMEOUT
              keepalive: $KEEPALIVE
selftest:
    enable: 1
EOF
}

# Every daemon runs with the systemd unit's capabilities and nothing more (issue 32, item 7):
# setpriv sets its bounding, inheritable and ambient sets to the unit's CapabilityBoundingSet
# (run.sh ships the unit and util-linux's setpriv); memlock is the guest's `ulimit -l
# unlimited`, as the unit's LimitMEMLOCK=infinity. Without setpriv in the guest the daemons run
# with root's full set and the suite says so.
UNIT=${ULNET_FILES:-/opt/ulnet/files}/lnet-router.service
# util-linux's setpriv, by its path: busybox's sh runs its own applet for a bare `setpriv`,
# which has no --bounding-set.
SETPRIV=${ULNET_BIN:-/opt/ulnet/bin}/setpriv
CAPS="" WANT_CAPEFF=""
if [ -x "$SETPRIV" ] && "$SETPRIV" --help 2>&1 | grep -q -- --bounding-set && [ -f "$UNIT" ]; then
  CAPS=$(sed -n 's/^CapabilityBoundingSet=//p' "$UNIT" | tail -1 | tr 'A-Z ' 'a-z\n' | sed -n 's/^cap_\(.*\)/+\1/p' | paste -sd, -)
  CAPS="-all${CAPS:+,$CAPS}"
  # CapEff as /proc shows it: CAP_NET_BIND_SERVICE (10) alone is 0x400.
  [ "$CAPS" = "-all,+net_bind_service" ] && WANT_CAPEFF=0000000000000400
  echo "daemons run under setpriv with the unit's capabilities: $CAPS"
else
  echo "NOTE: no util-linux setpriv or no unit in the guest: the daemons run with root's full capability set"
fi
run_daemon() {  # lnet-router's arguments; execs it (same pid) under the unit's capabilities
  if [ -n "$CAPS" ]; then
    exec "$SETPRIV" --bounding-set="$CAPS" --inh-caps="$CAPS" --ambient-caps="$CAPS" -- lnet-router "$@"
  fi
  exec lnet-router "$@"
}

start() {  # name nid socket [yaml already written] ; sets PID_<name>
  [ -n "${4:-}" ] || conf "$2" "/tmp/$1.yaml"
  (run_daemon --config "/tmp/$1.yaml" --socket "$3") >>"/tmp/$1.log" 2>&1 &
  eval "PID_$1=$!"
  n=0
  until lnetctl --socket "$3" net show >/dev/null 2>&1; do
    n=$((n + 1))
    if [ $n -gt 100 ] || ! kill -0 "$(eval echo \$PID_$1)" 2>/dev/null; then
      echo "daemon $1 did not come up:"; cat "/tmp/$1.log"; return 1
    fi
    sleep 0.1
  done
  echo "daemon $1 ($2) up, pid $(eval echo \$PID_$1)"
  if [ -n "$WANT_CAPEFF" ]; then
    eff=$(awk '$1 == "CapEff:" { print $2 }' "/proc/$(eval echo \$PID_$1)/status")
    echo "daemon $1: CapEff $eff"
    [ "$eff" = "$WANT_CAPEFF" ] || { echo "daemon $1 runs with CapEff $eff, not the unit's $WANT_CAPEFF"; return 1; }
  fi
}

# B's state in A's `peer show` (up/down/none)
b_state() {
  lnetctl --socket $SA peer show --nid $NB 2>/dev/null | awk '$1 == "state:" { print $2; exit }'
}
# A's connections to B in `conn show`
a_conns_to_b() { lnetctl --socket $SA conn show 2>/dev/null | grep -c "peer: $NB"; }

waitpid_bounded() {  # pid seconds -> sets RC (exit status, or "timeout")
  w=$1 lim=$2 w0=$(now) RC=timeout
  while kill -0 "$w" 2>/dev/null; do
    lt "$(since "$w0")" "$lim" || return 1
    sleep 0.05
  done
  wait "$w"; RC=$?
}

dump_logs() { for d in A B C R S; do [ -f "/tmp/$d.log" ] || continue; echo "--- /tmp/$d.log (tail)"; tail -40 "/tmp/$d.log"; done; }

# Shows the router R's forwarding counters and sets `books` to "received forwarded dropped
# in_flight" from them (the routed case's books must balance).
r_books() {
  lnetctl --socket $SR routing show | sed -n '/^forwarding:/,$p' | sed 's/^/    /'
  books=$(lnetctl --socket $SR routing show | awk '
    $1 == "received:" { r = $2 } $1 == "forwarded:" { f = $2 } $1 == "in_flight:" { i = $2 }
    $1 == "dropped:" { d = $2 } END { print r, f, d, i }')
}

# Restarts B, waits until A reaches it, then freezes it (SIGSTOP) with the connection up: the
# start of the SIGKILL and frozen-peer cases. $1: the failure code when A cannot ping it.
restart_and_freeze_b() {
  start B $NB $SB || { dump_logs; failed 21 "daemon B did not restart"; exit "$first"; }
  ok=0
  for i in 1 2 3 4 5; do
    lnetctl --socket $SA ping $NB --timeout 10 >/dev/null 2>&1 && { ok=1; break; }
    sleep 0.5
  done
  [ $ok = 1 ] || failed "$1" "A cannot ping the restarted B"
  echo "A connected to the restarted B (pid $PID_B): A=$(qps "$PID_A") B=$(qps "$PID_B") RC QPs"
  kill -STOP "$PID_B"
}

# ------------------------------------------------------------------------ setup
echo "=== daemons: setup"
ip addr add $B/24 dev dummy0 || { failed 21 "cannot add $B to dummy0"; exit 21; }
n=0
until grep -q "0a00:0002" /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null; do
  n=$((n + 1)); [ $n -gt 50 ] && break; sleep 0.1
done
rdma link show
ip -4 addr show dev dummy0 | grep inet
gids=$(grep -h -v '^0000:0000:0000:0000:0000:0000:0000:0000$' /sys/class/infiniband/rxe0/ports/1/gids/* | sort -u)
echo "rxe0 port 1 GIDs:"; echo "$gids" | sed 's/^/    /'
echo "$gids" | grep -q "0a00:0002" || { failed 21 "rxe0 has no GID for $B"; exit 21; }
start A $NA $SA || { failed 21 "daemon A did not start"; exit 21; }
start B $NB $SB || { dump_logs; failed 21 "daemon B did not start"; exit 21; }
# B's config has no `fabric:`: its address is on dummy0, rxe0's netdev, so it takes verbs.
grep -q "its NIs are on RDMA devices, using verbs" /tmp/B.log \
  || { dump_logs; failed 21 "daemon B did not pick verbs for its RDMA address"; exit 21; }
echo "daemon B chose verbs by itself: $(grep -o 'devices=[^ ]*' /tmp/B.log | head -1)"
BASE_A=$(qps "$PID_A") BASE_ALL=$(all_qps)
echo "QP baseline (before any connection): A=$BASE_A (pid $PID_A), all RC in the guest=$BASE_ALL"

# ------------------------------------------------------------------------ 1 ping
echo "=== daemons 1: ping over verbs"
for dir in "$SA $NB A->B" "$SB $NA B->A"; do
  set -- $dir
  t0=$(now)
  out=$(timeout 40 lnetctl --socket "$1" ping "$2" --timeout 20 2>&1); rc=$?
  echo "ping $3 ($2): status $rc in $(since "$t0") s"; echo "$out" | sed 's/^/    /'
  [ $rc = 0 ] && echo "$out" | grep -q "$2" || failed 22 "ping $3 failed"
done
t0=$(now)
out=$(lnetctl --socket $SA ping $NB 2>&1) && echo "second ping A->B: ok in $(since "$t0") s (connection reused)" \
  || failed 22 "second ping A->B failed: $out"
echo "--- A: peer show"; lnetctl --socket $SA peer show | sed 's/^/    /'
echo "--- A: conn show"; lnetctl --socket $SA conn show | sed 's/^/    /'
echo "--- B: conn show"; lnetctl --socket $SB conn show | sed 's/^/    /'
[ "$(b_state)" = up ] || failed 22 "A's peer show does not have B up (state '$(b_state)')"
[ "$(a_conns_to_b)" -ge 1 ] || failed 22 "A's conn show has no connection to B"
lnetctl --socket $SB conn show | grep -q "peer: $NA" || failed 22 "B's conn show has no connection to A"
CONN_A=$(qps "$PID_A") CONN_B=$(qps "$PID_B")
echo "QPs while connected: A=$CONN_A B=$CONN_B all RC=$(all_qps)"
rdma res show qp | grep 'type RC' | sed 's/^/    /'
[ "$CONN_A" -gt "$BASE_A" ] || failed 22 "A's RC QP count did not rise while connected ($BASE_A -> $CONN_A): the count cannot show a leak"

# ------------------------------------------------------------------------ 2 graceful stop
echo "=== daemons 2: graceful stop of B (SIGTERM)"
t0=$(now) k0=$(tod)
kill -TERM "$PID_B"
back="" last=""
while lt "$(since "$t0")" 3; do
  c=$(qps "$PID_A")
  [ "$c" != "$last" ] && { echo "  t+$(since "$t0") s: A has $c RC QPs"; last=$c; }
  [ "$c" -le "$BASE_A" ] && { back=$(since "$t0"); break; }
done
waitpid_bounded "$PID_B" 7
echo "B: exit status $RC, $(since "$t0") s after SIGTERM"
[ "$RC" = 0 ] || failed 23 "B did not exit 0 within 7 s of SIGTERM (status $RC)"
if [ -n "$back" ]; then
  echo "A's RC QPs back to baseline ($BASE_A) $back s after B's SIGTERM"
  lt "$back" 1 || failed 24 "A's QPs took $back s to return to baseline (bound 1 s)"
else
  failed 24 "A still has $(qps "$PID_A") RC QPs 3 s after B's SIGTERM (baseline $BASE_A): the 3FS #426 leak"
fi
echo "--- A: conn show"; lnetctl --socket $SA conn show | sed 's/^/    /'
[ "$(a_conns_to_b)" = 0 ] || failed 23 "A's conn show still has a connection to the stopped B"
echo "A's peer show: B $(b_state); all RC QPs in the guest: $(all_qps)"
d=$(a_logged_down_after "$k0")
echo "A's log: peer down for B ${d:-(not found)} s after B's SIGTERM"

# ------------------------------------------------------------------------ 3 SIGKILL
echo "=== daemons 3: SIGKILL of B with pings pending on A"
restart_and_freeze_b 25
NPEND=12 PINGS=""
i=0
while [ $i -lt $NPEND ]; do
  i=$((i + 1))
  ( timeout 60 lnetctl --socket $SA ping $NB --timeout $PING_TO >"/tmp/pend$i.out" 2>&1
    echo "$? $(now)" >"/tmp/pend$i.rc" ) &
  PINGS="$PINGS $!"
done
sleep 2
echo "--- A: conn show, B frozen (SIGSTOP), $NPEND pings (--timeout $PING_TO) started"
lnetctl --socket $SA conn show | sed 's/^/    /'
queued=$(lnetctl --socket $SA conn show | awk '$1 == "queued:" { n += $2 } END { print n + 0 }')
t0=$(now) k0=$(tod)
kill -KILL "$PID_B"
( timeout 60 lnetctl --socket $SA ping $NB --timeout $PING_TO >/tmp/after.out 2>&1
  echo "$? $(now)" >/tmp/after.rc ) &
PINGS="$PINGS $!"
det="" qback="" last=""
while lt "$(since "$t0")" 10; do
  st=$(b_state) nc=$(a_conns_to_b) c=$(qps "$PID_A")
  [ "$st/$nc/$c" != "$last" ] && { echo "  t+$(since "$t0") s: A sees B $st, $nc connection(s), A has $c RC QPs"; last="$st/$nc/$c"; }
  [ -z "$det" ] && [ "$st" = down ] && [ "$nc" = 0 ] && det=$(since "$t0")
  [ -z "$qback" ] && [ "$c" -le "$BASE_A" ] && qback=$(since "$t0")
  [ -n "$det" ] && [ -n "$qback" ] && break
  sleep 0.05
done
wait "$PID_B" 2>/dev/null
if [ -n "$det" ]; then
  d=$(a_logged_down_after "$k0")
  echo "DETECTION: A marked B down with no connection $det s after SIGKILL as lnetctl polls see it (bound keepalive + timeout = $((KEEPALIVE + TIMEOUT)) s); A's log says peer down ${d:-(not found)} s after it"
  lt "$det" $((KEEPALIVE + TIMEOUT)) || failed 25 "detection took $det s"
else
  failed 25 "10 s after B's SIGKILL A still sees B $(b_state) with $(a_conns_to_b) connection(s)"
fi
wait $PINGS  # the pending pings and the one started after the kill (not A)
# A ping whose GET was already delivered to the frozen B (at most peer_credits of them) waits for
# a REPLY that never comes: it fails at its own timeout (-110), as LNet's do. The others were
# still queued in A when B died: they must fail on the disconnect, long before that.
i=0 nbad=0 nfast=0 nslow=0 worst=0
while [ $i -lt $NPEND ]; do
  i=$((i + 1))
  set -- $(cat "/tmp/pend$i.rc" 2>/dev/null || echo "none $(now)")
  rel=$(awk -v a="$t0" -v b="$2" 'BEGIN { printf "%.2f", b - a }')
  msg=$(tr '\n' ' ' <"/tmp/pend$i.out" | tr -s ' ')
  if [ "$1" = 0 ] || [ "$1" = 124 ] || [ "$1" = none ] || ! echo "$msg" | grep -q 'failed to ping'; then
    kind=BAD; nbad=$((nbad + 1))
  elif lt "$rel" $((KEEPALIVE + TIMEOUT)); then
    kind=on-disconnect; nfast=$((nfast + 1))
  else
    kind=at-timeout; nslow=$((nslow + 1))
  fi
  lt "$worst" "$rel" && worst=$rel
  echo "  pending ping $i: status $1, ended $rel s after the kill ($kind): $msg"
done
echo "pending pings: $nfast failed on the disconnect, $nslow at their $PING_TO s timeout (GET already delivered), $nbad otherwise; $queued queued in A's LND before the kill; the last ended $worst s after the kill"
[ $nbad = 0 ] || failed 25 "$nbad of $NPEND pending pings did not fail with a status and an error message"
[ $nfast -ge $((NPEND - PEER_CREDITS)) ] && [ $nfast -ge 1 ] \
  || failed 25 "only $nfast pending pings failed on the disconnect (at least $((NPEND - PEER_CREDITS)) could not have been sent)"
lt "$worst" $((PING_TO + 3)) || failed 25 "a pending ping ended $worst s after the kill: it hung past its timeout"
set -- $(cat /tmp/after.rc 2>/dev/null || echo "none $(now)")
rel=$(awk -v a="$t0" -v b="$2" 'BEGIN { printf "%.2f", b - a }')
msg=$(tr '\n' ' ' </tmp/after.out | tr -s ' ')
echo "ping started after the kill: status $1, ended $rel s after the kill: $msg"
{ [ "$1" != 0 ] && [ "$1" != 124 ] && [ "$1" != none ] && echo "$msg" | grep -q 'failed to ping' && lt "$rel" $((KEEPALIVE + TIMEOUT)); } \
  || failed 25 "the ping started after the kill did not fail with a status within $((KEEPALIVE + TIMEOUT)) s"
echo "--- A: peer show"; lnetctl --socket $SA peer show | sed 's/^/    /'
echo "--- A: net show -v 5 (some lnd and fabric counters)"
lnetctl --socket $SA net show -v 5 | grep -E ' (connects|established|peers_down|conns_lost|graceful_closes|ungraceful_drops|silent_peers|tx_timeouts|zombies|reaped|disconnects|send_errors|type):' | grep -v 'net type' | sed 's/^/    /'

# ------------------------------------------------------------------------ 4 queue pairs after the kill
echo "=== daemons 4: A's queue pairs after the kill"
c=$(qps "$PID_A")
echo "A: $c RC QPs now (baseline $BASE_A); all RC in the guest: $(all_qps)"
if [ -n "$qback" ]; then
  echo "A's RC QPs were back to baseline $qback s after B's SIGKILL"
  [ "$c" -le "$BASE_A" ] || failed 26 "A's RC QPs rose again to $c after the pings (baseline $BASE_A)"
else
  failed 26 "A still had $(qps "$PID_A") RC QPs 10 s after B's SIGKILL (baseline $BASE_A)"
fi

# ------------------------------------------------------------------------ 5 frozen peer
# No cm signal at all (a hung or powered-off host: B's HCA, here the kernel's rxe, still ACKs).
# Idle, it owes A nothing and A keeps the connection; with traffic beyond the credits, the
# messages waiting for credits miss their deadline and A declares it dead.
echo "=== daemons 5: B frozen (SIGSTOP): kept while idle, found by the tx deadlines under traffic"
restart_and_freeze_b 28
idle=$((2 * (KEEPALIVE + TIMEOUT)))
sleep "$idle"
st=$(b_state) nc=$(a_conns_to_b)
echo "IDLE: $idle s after B's SIGSTOP with no traffic A sees B $st with $nc connection(s)"
{ [ "$st" = up ] && [ "$nc" = 1 ]; } || failed 28 "A dropped the idle frozen B ($st, $nc connection(s)): a peer that owes nothing may stay silent"
t0=$(now) k0=$(tod)
FPINGS=""
i=0
while [ $i -lt 12 ]; do
  i=$((i + 1))
  ( timeout 30 lnetctl --socket $SA ping $NB --timeout $PING_TO >/dev/null 2>&1 ) &
  FPINGS="$FPINGS $!"
done
# bounds: down by timeout + keepalive; the connection and its QP gone by then + the engine's
# close bound (1 s: a frozen peer never answers the DREQ); + 1.5 s for the emulated guest's polls
dbound=$(awk -v k=$KEEPALIVE -v t=$TIMEOUT 'BEGIN { print k + t + 1.5 }')
gbound=$(awk -v b="$dbound" 'BEGIN { print b + 1 }')
down="" gone="" last=""
while lt "$(since "$t0")" "$gbound" || [ -z "$last" ]; do
  st=$(b_state) nc=$(a_conns_to_b) c=$(qps "$PID_A")
  [ "$st/$nc/$c" != "$last" ] && { echo "  t+$(since "$t0") s: A sees B $st, $nc connection(s), A has $c RC QPs"; last="$st/$nc/$c"; }
  [ -z "$down" ] && [ "$st" = down ] && down=$(since "$t0")
  [ -z "$gone" ] && [ "$nc" = 0 ] && [ "$c" -le "$BASE_A" ] && gone=$(since "$t0")
  [ -n "$down" ] && [ -n "$gone" ] && break
  sleep 0.1
done
d=$(a_logged_down_after "$k0")
echo "FROZEN: with 12 pings queued A marked B down ${down:-never} s after they started as lnetctl polls see it (A's log: ${d:-(not found)} s; bound timeout + keepalive = $((KEEPALIVE + TIMEOUT)) s + 1.5 s), its connection and QP gone ${gone:-never} s after it (bound $gbound s)"
lnetctl --socket $SA net show -v 5 | grep -E ' (silent_peers|tx_timeouts|keepalives|peers_down|close_timeouts):' | sed 's/^/    /'
silent=$(lnetctl --socket $SA net show -v 5 | awk '$1 == "silent_peers:" { n += $2 } END { print n + 0 }')
[ "$silent" -ge 1 ] || failed 28 "the frozen B's close was not counted as a silent peer"
{ [ -n "$down" ] && lt "$down" "$dbound"; } || failed 28 "the frozen B was not marked down within $dbound s"
{ [ -n "$gone" ] && lt "$gone" "$gbound"; } \
  || failed 28 "A still has $(a_conns_to_b) connection(s) to the frozen B and $(qps "$PID_A") RC QPs (baseline $BASE_A) after $gbound s"
kill -KILL "$PID_B"; kill -CONT "$PID_B" 2>/dev/null; wait "$PID_B" 2>/dev/null
for p in $FPINGS; do wait "$p" 2>/dev/null; done

# ------------------------------------------------------------------------ 6 routed
echo "=== daemons 6: routed: C on o2ib, R on o2ib + o2ib1, S on o2ib1"
NC=10.0.0.11@o2ib NRA=10.0.0.13@o2ib NRB=10.0.1.13@o2ib1 NS=10.0.1.12@o2ib1
for ip in 10.0.0.11 10.0.0.13 10.0.1.12 10.0.1.13 10.0.0.14 10.0.1.15; do
  ip addr add $ip/24 dev dummy0 || failed 29 "cannot add $ip to dummy0"
done
n=0
until [ "$(cat /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null | grep -c -E '0a00:(000b|000d|010c|010d|000e|010f)$')" -ge 6 ]; do
  n=$((n + 1)); [ $n -gt 50 ] && break; sleep 0.1
done
rconf() {  # file, then items: "ni NID" ... "route NET GW" ... "routing 0|1"
  f=$1; shift
  echo "net:" >"$f"
  routes="" routing=0
  for item in "$@"; do
    set -- $item
    case $1 in
      ni) printf '    - net type: %s\n      fabric: verbs\n      local NI(s):\n        - nid: %s\n          lnd tunables:\n              timeout: %s\n              keepalive: %s\n' \
            "${2#*@}" "$2" "$TIMEOUT" "$KEEPALIVE" >>"$f" ;;
      route) routes="$routes
    - net: $2
      gateway: $3
      hop: 1" ;;
      routing) routing=$2 ;;
    esac
  done
  [ -n "$routes" ] && printf 'route:%s\n' "$routes" >>"$f"
  printf 'routing:\n    enable: %s\n    alive_router_check_interval: 2\n    router_ping_timeout: 2\n' "$routing" >>"$f"
  # Large router buffers are pinned on verbs: few, in the guest's small memory.
  [ "$routing" = 1 ] && printf 'buffers:\n    tiny: 64\n    small: 64\n    large: 8\n' >>"$f"
  printf 'selftest:\n    enable: 1\n' >>"$f"
  return 0
}
rconf /tmp/R.yaml "ni $NRA" "ni $NRB" "routing 1"
rconf /tmp/S.yaml "ni $NS" "route o2ib $NRB"
rconf /tmp/C.yaml "ni $NC" "route o2ib1 $NRA"
SR=/tmp/r.sock SS=/tmp/s.sock SC=/tmp/c.sock
routed_ok=1
{ start R $NRA $SR yes && start S $NS $SS yes && start C $NC $SC yes; } \
  || { routed_ok=0; failed 29 "a routing daemon did not start"; }
if [ $routed_ok = 1 ]; then
  t0=$(now)
  until lnetctl --socket $SC route show -v 2>/dev/null | grep -q 'state: up'; do
    lt "$(since "$t0")" 60 || break; sleep 0.2
  done
  echo "C's route up after $(since "$t0") s:"
  lnetctl --socket $SC route show -v | sed 's/^/    /'
  lnetctl --socket $SC route show -v | grep -q 'state: up' || failed 29 "C's route to o2ib1 never came up"
  for dir in "$SC $NS C->S" "$SS $NC S->C"; do
    set -- $dir
    t0=$(now) ok=0
    while lt "$(since "$t0")" 60; do
      out=$(timeout 40 lnetctl --socket "$1" ping "$2" --timeout 10 2>&1) && { ok=1; break; }
      sleep 0.5
    done
    echo "routed ping $3 ($2): $([ $ok = 1 ] && echo ok || echo FAILED) after $(since "$t0") s"
    echo "$out" | sed 's/^/    /'
    [ $ok = 1 ] || failed 29 "routed ping $3 failed"
  done
  good=0
  for i in 1 2 3 4 5 6 7 8 9 10; do
    lnetctl --socket $SC ping $NS --timeout 10 >/dev/null 2>&1 && good=$((good + 1))
  done
  echo "10 more routed pings C->S: $good answered"
  [ $good = 10 ] || failed 29 "only $good of 10 routed pings answered"
  r_books
  set -- $books
  echo "R's books: received $1 = forwarded $2 + dropped $3 + in flight $4"
  [ "$1" = $(($2 + $3 + $4)) ] || failed 29 "R's books do not balance: $books"
  [ "$2" -ge 24 ] || failed 29 "R forwarded only $2 messages for 12 pings each way"
  # Bulk PUTs through R, from an LNet client on o2ib to an LNet server on o2ib1 (one process,
  # its own verbs fabrics): into R's registered large buffers, then on to the server's sinks.
  if command -v verbs_routed_bulk >/dev/null 2>&1; then
    echo "--- bulk through R (verbs_routed_bulk)"
    timeout 150 verbs_routed_bulk 10.0.0.14@o2ib 10.0.1.15@o2ib1 $NRA $NRB 2>&1 | sed 's/^/    /' >/tmp/rbulk.log
    cat /tmp/rbulk.log
    grep -q 'verbs_routed_bulk: PASS' /tmp/rbulk.log || failed 29 "bulk PUTs through the router failed"
    r_books
    set -- $books
    echo "R's books after bulk: received $1 = forwarded $2 + dropped $3 + in flight $4"
    [ "$1" = $(($2 + $3 + $4)) ] && [ "$3" = 0 ] || failed 29 "R's books after bulk: $books"
  fi
  # ---------------------------------------------------------------------- 7 selftest
  echo "=== daemons 7: lnet_selftest over verbs: C's console, brw to A (direct) and S (through R)"
  t0=$(now) runs=0 bad=0
  for op in write read; do
    for size in 1 4097 65543 1M; do
      runs=$((runs + 1))
      if timeout 60 lnetctl --socket $SC selftest run-test --from $NC --to $NA,$NS \
          --distribute 1:2 --concurrency 2 --loop 3 brw $op size=$size check=full off=8 \
          >/tmp/st.out 2>/tmp/st.err && grep -q 'brw_errors: 0' /tmp/st.out; then
        echo "selftest brw $op size=$size check=full off=8 to A and S: clean"
      else
        bad=$((bad + 1))
        echo "selftest brw $op size=$size check=full off=8: FAILED"
        sed 's/^/    /' /tmp/st.out /tmp/st.err | tail -30
      fi
    done
  done
  echo "selftest: $runs sessions, $bad failed, $(since "$t0") s"
  [ $bad = 0 ] || failed 30 "$bad selftest sessions failed"
  for size in 64k 1M; do
    timeout 60 lnetctl --socket $SC selftest run-test --from $NC --to $NA --concurrency 4 \
      --duration 3 --interval 3 brw write size=$size check=none >/tmp/st.out 2>/tmp/st.err \
      || failed 30 "selftest brw write size=$size bandwidth run failed"
    mib=$(awk '/- group: servers/ { g = 1 } g && $1 == "mib_read:" { gsub(/[{},]/, ""); print $3; exit }' /tmp/st.out)
    bytes=$((65536)); [ $size = 1M ] && bytes=1048576
    wbw=""
    if command -v ib_write_bw >/dev/null 2>&1; then
      timeout 40 ib_write_bw -d rxe0 -s $bytes -n 200 -F >/dev/null 2>&1 &
      srv=$!
      sleep 1
      wbw=$(timeout 40 ib_write_bw -d rxe0 -s $bytes -n 200 -F 10.0.0.1 2>/dev/null \
        | awk -v b=$bytes '$1 == b { print $4; exit }')
      wait $srv 2>/dev/null
    fi
    if [ -n "$wbw" ] && [ -n "$mib" ]; then
      echo "selftest brw write $size C->A: $mib MiB/s; ib_write_bw $size: $wbw MiB/s; ratio $(awk -v a="$mib" -v b="$wbw" 'BEGIN { printf "%.2f", a / b }')"
    else
      echo "selftest brw write $size C->A: ${mib:-?} MiB/s (ib_write_bw: ${wbw:-not run})"
    fi
  done
  for p in $PID_C $PID_S $PID_R; do kill -TERM "$p"; done
  for p in $PID_C $PID_S $PID_R; do
    waitpid_bounded "$p" 7
    [ "$RC" = 0 ] || failed 29 "a routing daemon exited $RC after SIGTERM"
  done
fi

# ------------------------------------------------------------------------ end
kill -TERM "$PID_A"
waitpid_bounded "$PID_A" 7
echo "A: exit status $RC after SIGTERM"
[ "$first" = 0 ] && [ -z "${DAEMONS_DUMP_LOGS:-}" ] || dump_logs
echo "=== daemons suite status: $first"
exit "$first"
