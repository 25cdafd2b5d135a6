# lib.sh - what the shell benches share (sourced first, not run): the preamble (`set -u`, HERE =
# benches/, ROOT = the workspace, from wherever the bench is started), the release build of
# lnet_perf and lnet-router (build_perf), and for the daemon benches: lnet-router and lnetctl
# built in the profile asked for, a scratch directory, the processes started, and a cleanup on
# exit that kills them and removes the directory.
#
#   . "$(dirname "$0")/lib.sh"; bench_setup NAME PROFILE
#
# bench_setup sets BIN (the binaries' directory), TMP (the scratch directory) and PIDS (append
# every process started, so the cleanup kills it).
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

# build_perf [--bin NAME...]: cds to ROOT and builds lnet_perf and lnet-router (release), and any
# more benches binaries named; sets PERF and ROUTER (relative to ROOT). Exits if the build fails.
build_perf() {
    cd "$ROOT" || exit 1
    cargo build --release -q -p benches --bin lnet_perf "$@" -p router --bin lnet-router || exit 1
    PERF=target/release/lnet_perf
    ROUTER=target/release/lnet-router
}

# bench_setup NAME PROFILE: builds (release or debug) and sets up; exits if the build fails.
bench_setup() {
    local name=$1 profile=$2
    if [ "$profile" = release ]; then
        (cd "$ROOT" && cargo build -q --release -p router -p lnetctl) || exit 1
    else
        (cd "$ROOT" && cargo build -q -p router -p lnetctl) || exit 1
    fi
    BIN="$ROOT/target/$profile"
    TMP=$(mktemp -d "/tmp/ulnet-$name.XXXXXX")
    PIDS=()
    trap bench_cleanup EXIT
}

bench_cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$TMP"
}

# ni_yaml NAME PORT: writes $TMP/NAME.yaml, one tcp NI 10.0.0.1@o2ib on 127.0.0.1:PORT (a caller
# may append more).
ni_yaml() {
    cat >"$TMP/$1.yaml" <<EOF
net:
    - net type: o2ib
      fabric: tcp
      local NI(s):
        - nid: 10.0.0.1@o2ib
          listen: 127.0.0.1:$2
EOF
}

# await_daemon NAME PID: adds PID to PIDS and waits (10 s at most) until the daemon answers on
# $TMP/NAME.sock; sets SOCK. Exits with its log if it never does.
await_daemon() {
    PIDS+=("$2")
    SOCK="$TMP/$1.sock"
    for _ in $(seq 100); do
        "$BIN/lnetctl" --socket "$SOCK" net show >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "the daemon did not start:"; cat "$TMP/$1.log"; exit 1
}

# free_port: a TCP port free on 127.0.0.1 now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
