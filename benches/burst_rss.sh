#!/bin/bash
# burst_rss.sh - does an lnet-router daemon give its memory back after a burst?
#
#   bash benches/burst_rss.sh            (from anywhere; root: runs in a private network namespace)
#
# One daemon (one tcp NI, 127.0.0.1@o2ib, peer_timeout 5 s) in a network namespace of its own
# with only lo up. `lnetctl ping` sends one ping to each of N NIDs 127.x.y.z@o2ib at once: each
# is a new LNet and LND peer, a message queued behind a connect, and a connect refused by lo,
# so every ping fails and every peer is forgotten once it has been quiet for peer_timeout.
# Prints the daemon's VmRSS (/proc/PID/status) before, at its peak during the burst, when the
# pings have all ended, and SETTLE seconds later; the ratio after/before is the figure
# (target: under 3x, against 10x at the peak: the tables shrink back, `lnd::trim`, and the
# allocator returns the freed pages).
#
# Env:  BURST_N=20000   pings (NIDs) in the burst
#       BURST_SETTLE=20 seconds of quiet before the last figure
#       BURST_NETNS=0   run in the current namespace (127.0.0.0/8 only) instead
# Bounded: the ping waits at most 30 s; about 1 minute plus the build.

. "$(dirname "$0")/lib.sh"
N=${BURST_N:-20000}
SETTLE=${BURST_SETTLE:-20}
(cd "$ROOT" && cargo build -q --release -p router --bin lnet-router -p lnetctl) || exit 1
BIN="$ROOT/target/release"
TMP=$(mktemp -d /tmp/ulnet-burst.XXXXXX)
NS=""
PRE=()
PID=""
cleanup() {
    if [ -n "$PID" ]; then
        kill "$PID" 2>/dev/null
        wait "$PID" 2>/dev/null
    fi
    [ -n "$NS" ] && ip netns del "$NS" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "${BURST_NETNS:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
    NS=ulnetburst$$
    ip netns add "$NS" && ip -n "$NS" link set lo up || exit 1
    PRE=(ip netns exec "$NS")
fi

cat >"$TMP/cfg.yaml" <<EOF
net:
    - net type: o2ib
      fabric: tcp
      local NI(s):
        - nid: 127.0.0.1@o2ib
          listen: 127.0.0.1:0
          tunables:
              peer_timeout: 5
EOF
SOCK=$TMP/ctl.sock
"${PRE[@]}" "$BIN/lnet-router" --config "$TMP/cfg.yaml" --socket "$SOCK" >"$TMP/daemon.log" 2>&1 &
PID=$!
for _ in $(seq 1 100); do
    "${PRE[@]}" "$BIN/lnetctl" --socket "$SOCK" net show >/dev/null 2>&1 && break
    sleep 0.1
done
rss() { awk '/^VmRSS/ {print $2}' "/proc/$PID/status" 2>/dev/null; }
before=$(rss)
[ -n "$before" ] || { echo "the daemon did not start:"; cat "$TMP/daemon.log"; exit 1; }

# N distinct loopback NIDs, none of them listening: 127.a.b.c with b, c in 1..250.
python3 -c "
for i in range($N):
    print(f'127.{1 + i // 62500}.{(i // 250) % 250 + 1}.{i % 250 + 1}@o2ib')" >"$TMP/nids"
# One lnetctl for all of them (about 0.5 MB of arguments), so that they are one burst.
# shellcheck disable=SC2046
"${PRE[@]}" "$BIN/lnetctl" --socket "$SOCK" ping -t 30 $(cat "$TMP/nids") >"$TMP/ping.out" 2>&1 &
LP=$!
peak=$before
while kill -0 "$LP" 2>/dev/null; do
    r=$(rss)
    [ -n "$r" ] && [ "$r" -gt "$peak" ] && peak=$r
    sleep 0.2
done
ended=$(rss)
sleep "$SETTLE"
after=$(rss)
peers=$("${PRE[@]}" "$BIN/lnetctl" --socket "$SOCK" peer show 2>/dev/null | grep -c 'primary nid')
failed=$(grep -c 'errno' "$TMP/ping.out")
echo "burst: $N pings to unreachable peers, $failed failed with an errno; LNet peers left after ${SETTLE} s: $peers"
echo "FIGURE rss_before KiB value=$before"
echo "FIGURE rss_peak KiB value=$peak"
echo "FIGURE rss_burst_ended KiB value=$ended"
echo "FIGURE rss_after_${SETTLE}s KiB value=$after"
awk -v a="$after" -v b="$before" -v p="$peak" \
    'BEGIN { printf "FIGURE rss_ratio after/before=%.2f peak/before=%.2f\n", a / b, p / b }'
