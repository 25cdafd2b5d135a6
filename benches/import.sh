#!/bin/bash
# import.sh - how long `lnetctl import` of many routes takes, and that the export imports back.
#
#   bash benches/import.sh          (from anywhere; loopback only, no root needed)
#
# 1. A document of N routes (N/10 remote nets, each through 10 gateways on the daemon's net)
#    imported into a daemon with one tcp NI on 127.0.0.1: wall time of `lnetctl import`
#    (target: 100,000 routes in at most 10 s).
# 2. `lnetctl export` of that daemon (its size: over the daemon's 1 MiB request cap from about
#    9,000 routes), imported into a fresh daemon: wall time, and `route show` of both compared.
# 3. The same export imported again into the second daemon: the no-op's wall time.
# Also the second daemon's peak RSS (VmHWM) after the import of the export.
#
# Env:  IMPORT_N=100000             routes
#       IMPORT_PROFILE=release      or debug (no release build needed)
# Bounded: every wait has a deadline; a release run takes well under a minute plus the build.

. "$(dirname "$0")/lib.sh"
N=${IMPORT_N:-100000}
PROFILE=${IMPORT_PROFILE:-release}

command -v python3 >/dev/null || { echo "SKIP: python3 is needed to find free ports"; exit 0; }
bench_setup import "$PROFILE"

# start_daemon NAME: one tcp NI 10.0.0.1@o2ib on a free port; sets SOCK once it answers.
start_daemon() {
    local name=$1 port
    port=$(free_port)
    ni_yaml "$name" "$port"
    LNET_LOG=warn "$BIN/lnet-router" --config "$TMP/$name.yaml" --socket "$TMP/$name.sock" \
        2>"$TMP/$name.log" &
    await_daemon "$name" "$!"
}

# timed LABEL CMD...: runs CMD, prints its wall time; exits if it fails.
timed() {
    local label=$1; shift
    local t0 t1
    t0=$(date +%s.%N)
    "$@" || { echo "$label: failed (exit $?)"; exit 1; }
    t1=$(date +%s.%N)
    printf '%-44s %8.2f s\n' "$label" "$(echo "$t1 - $t0" | bc)"
}

awk -v n="$N" 'BEGIN {
    print "route:"
    for (i = 0; i < n; i++)
        printf "    - net: o2ib%d\n      gateway: 10.0.0.%d@o2ib\n      hop: 1\n", int(i / 10) + 1, i % 10 + 2
}' >"$TMP/routes.yaml"
echo "routes: $N ($(($(stat -c %s "$TMP/routes.yaml") >> 10)) KiB document), profile $PROFILE"

start_daemon a
A=$SOCK
timed "import of $N routes" "$BIN/lnetctl" --socket "$A" import "$TMP/routes.yaml"
"$BIN/lnetctl" --socket "$A" export >"$TMP/export.yaml" || exit 1
echo "export: $(($(stat -c %s "$TMP/export.yaml") >> 10)) KiB"
start_daemon b
B=$SOCK
BPID=${PIDS[-1]}
timed "import of that export into a fresh daemon" "$BIN/lnetctl" --socket "$B" import "$TMP/export.yaml"
# The daemon's peak memory: its route tables (one per NI loop and the template's) and at most
# one part of the document at a time, not the whole document.
echo "daemon peak RSS (VmHWM) after it: $(awk '/VmHWM/ {print $2, $3}' "/proc/$BPID/status")"
timed "the same import again (a no-op)" "$BIN/lnetctl" --socket "$B" import "$TMP/export.yaml"
"$BIN/lnetctl" --socket "$A" route show -v >"$TMP/a.routes"
"$BIN/lnetctl" --socket "$B" route show -v >"$TMP/b.routes"
# The gateways' state differs by when each daemon pinged them: compare the configuration.
strip() { grep -E '^ *(- )?(net|gateway|hop|priority):' "$1"; }
if cmp -s <(strip "$TMP/a.routes") <(strip "$TMP/b.routes"); then
    echo "route show: $(grep -c 'gateway:' "$TMP/b.routes") routes on both daemons, the same"
else
    echo "route show differs between the two daemons"; exit 1
fi
