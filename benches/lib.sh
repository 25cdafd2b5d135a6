# lib.sh - what the daemon benches share (sourced, not run): builds lnet-router and lnetctl in
# the profile asked for, a scratch directory, the processes started, and a cleanup on exit that
# kills them and removes the directory.
#
#   . "$(dirname "$0")/lib.sh"; bench_setup NAME PROFILE
#
# Sets ROOT (the workspace), BIN (the binaries' directory), TMP (the scratch directory) and
# PIDS (append every process started, so the cleanup kills it).

# bench_setup NAME PROFILE: builds (release or debug) and sets up; exits if the build fails.
bench_setup() {
    local name=$1 profile=$2
    ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
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

# free_port: a TCP port free on 127.0.0.1 now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
