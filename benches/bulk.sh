#!/bin/bash
# bulk.sh - ulnet bulk throughput (RDMA rendezvous over the tcp fabric) against iperf3, UCX
# tag_bw and libfabric fi_pingpong, on loopback, interleaved in one run so that every figure
# sees the same machine.
#
#   bash benches/bulk.sh            (from anywhere; needs root for the private netns)
#
# For each of ROUNDS rounds and each message size S in SIZES, in a private network namespace
# (only lo up):
#   1. iperf3 TCP single stream, T seconds, writes of S bytes (-l S)   (receiver Gbit/s), direct
#      and relayed: through `tcp_relay` (benches/src/bin/tcp_relay.rs), the least a process
#      forwarding through its own memory can do (a receive copy and a send copy, nothing else):
#      its relayed/direct is the ceiling of any user-space router on this machine, and the
#      table gives ulnet's routed/direct as a fraction of it; and spliced: through
#      `tcp_relay --splice` (socket -> pipe -> socket, the bytes never in the relay's memory)
#   2. lnet_perf --bulk-put T --size S          ulnet PUT by rendezvous  (brw write analogue)
#   3. lnet_perf --bulk-get T --size S          ulnet GET by rendezvous  (brw read analogue)
#   4. lnet_perf --bulk-put / --bulk-get T --size S --via-router lnet-router   (three processes
#      on 2 cores; a routed GET is IMMEDIATE, its REPLY comes back by rendezvous)
#   4b. the same PUTs on tcp NIDs (socklnd, ksocklnd's wire: `--net tcp`), direct and routed
#      tcp -> o2ib (`--client-net tcp --server-net o2ib --via-router`); `bash benches/socklnd.sh`
#      has socklnd's own figures against iperf3, sockperf and the relay
#   5. ucx_perftest -t tag_bw -s S over UCX's tcp transport (as benches/loopback.sh runs it),
#      about 2 GiB per size (its "overall" bandwidth, MB/s = MiB/s)
#   6. fi_pingpong -p tcp -e msg -d lo -S S -I N (libfabric's tcp provider, MSG endpoint, on
#      lo), N = min(T*2^30/S, T*33333), at least 1000: about T/2..T seconds per size. It is a
#      PING-PONG: one message in flight, the next sent only once the reply is back, so its
#      figure is S / one-way latency, not a streaming one, and is expected below the others at
#      every size. Its "MB/sec" is 10^6 bytes/s over ping and pong bytes (2*S*N / time),
#      converted here to MiB/s. No warm-up. Absent (n/a, warning on stderr) when fi_pingpong
#      or its tcp provider does not work.
#   7. lnet_selftest brw write and read (lnetctl selftest run-test, check=none, concurrency
#      WINDOW, T seconds) from a client daemon's console to a server daemon beside it (direct)
#      and to one behind an lnet-router daemon (routed): four daemons started once, in the
#      namespace. The figure is the servers' LNet bandwidth as lst stat reports it ([R] for
#      write, [W] for read: data plus the 160-byte RPCs).
# then prints, per size, the median of each figure in MiB/s, its ratio to iperf3's, UCX's and
# fi_pingpong's, routed / direct, that as a fraction of the relay's relayed / direct ("x relay's":
# 1.00 is a router that costs no more than the bare relay), and draws them (MiB/s against size, one line per system)
# into PLOT (SVG).
# Targets (issue "Bulk transfers"): 1 MiB direct >= 0.9x iperf3 single stream (>= 1.0x UCX
# tag_bw: stretch); through one router >= 0.5x direct.
#
# Env:  ROUNDS=3  T=3  SIZES="4096 65536 1048576"  WINDOW=8  PLOT=target/bulk.svg
#       BULK_NETNS=0 (run in the root namespace)
# Bounded: every command runs under `timeout`.

. "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}
T=${T:-3}
SIZES=${SIZES:-"4096 65536 1048576"}
WINDOW=${WINDOW:-8}
PLOT=${PLOT:-$ROOT/target/bulk.svg}
NS=ulnetbulk$$
PRE=""
TMP=$(mktemp -d /tmp/bulk.XXXXXX)

cleanup() {
  for p in ${RELAY_PID:-} ${SPLICE_PID:-}; do kill "$p" 2>/dev/null; done
  [ -n "$PRE" ] && ip netns del "$NS" 2>/dev/null
  [ ${#ST_PIDS[@]} -gt 0 ] && st_stop
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

have() { command -v "$1" >/dev/null 2>&1; }
need=()
have iperf3 || need+=(iperf3)
have ucx_perftest || need+=(ucx-utils)
have fi_pingpong || need+=(libfabric-bin)
if [ ${#need[@]} -gt 0 ]; then
  timeout 300 apt-get install -y "${need[@]}" >/dev/null 2>&1 \
    || { timeout 120 apt-get update >/dev/null 2>&1 && timeout 300 apt-get install -y "${need[@]}" >/dev/null 2>&1; }
fi
UCX_ENV="env UCX_TLS=tcp UCX_NET_DEVICES=lo"
UCX_PORT=15400
FI_PORT=16400
FI_PP=(fi_pingpong -p tcp -e msg -d lo)
have fi_pingpong || echo "WARN fi_pingpong not found (package libfabric-bin): no fi_pingpong figures" >&2
if [ "${BULK_NETNS:-1}" = 1 ] && ip netns add "$NS" 2>/dev/null; then
  ip netns exec "$NS" ip link set lo up && PRE="ip netns exec $NS"
fi

echo "building lnet_perf, lnet-router, lnetctl and bulk_plot (release)" >&2
(cd "$ROOT" && timeout 900 cargo build --release -q -p benches --bin lnet_perf --bin bulk_plot \
  --bin tcp_relay -p router --bin lnet-router -p lnetctl) || exit 1
PERF="$ROOT/target/release/lnet_perf"
CTL="$ROOT/target/release/lnetctl"

# The selftest daemons (7.): client 10.0.0.1@o2ib, near server 10.0.0.2@o2ib, router
# 10.0.0.254@o2ib / 10.1.0.254@o2ib1, far server 10.1.0.2@o2ib1, on 127.0.0.1:19880-19884.
ST_PIDS=()
st_yaml() {  # name nis(nid=port,...) route(net=gw or -) routing(0/1)
  local y="$TMP/$1.yaml" ni nid port all
  all="10.0.0.1@o2ib=19880 10.0.0.2@o2ib=19881 10.0.0.254@o2ib=19882 10.1.0.254@o2ib1=19883 10.1.0.2@o2ib1=19884"
  echo "net:" >"$y"
  for ni in ${2//,/ }; do
    nid=${ni%=*}; port=${ni#*=}
    printf '    - net type: %s\n      fabric: tcp\n      local NI(s):\n        - nid: %s\n          listen: 127.0.0.1:%s\n' \
      "${nid#*@}" "$nid" "$port" >>"$y"
  done
  [ "$3" != - ] && printf 'route:\n    - net: %s\n      gateway: %s\n      hop: 1\n' "${3%=*}" "${3#*=}" >>"$y"
  printf 'routing:\n    enable: %s\nbuffers:\n    large: 256\nselftest:\n    enable: 1\npeers:\n' "$4" >>"$y"
  for ni in $all; do
    case ",$2," in *",$ni,"*) continue ;; esac
    printf '    - nid: %s\n      address: 127.0.0.1:%s\n' "${ni%=*}" "${ni#*=}" >>"$y"
  done
}
st_start() {
  st_yaml client 10.0.0.1@o2ib=19880 o2ib1=10.0.0.254@o2ib 0
  st_yaml near 10.0.0.2@o2ib=19881 - 0
  st_yaml router 10.0.0.254@o2ib=19882,10.1.0.254@o2ib1=19883 - 1
  st_yaml far 10.1.0.2@o2ib1=19884 o2ib=10.1.0.254@o2ib1 0
  local n
  for n in router far near client; do
    LNET_LOG=warn $PRE "$ROOT/target/release/lnet-router" --config "$TMP/$n.yaml" \
      --socket "$TMP/$n.sock" 2>>"$TMP/daemons.log" &
    ST_PIDS+=($!)
  done
  for n in router far near client; do
    for _ in $(seq 100); do [ -S "$TMP/$n.sock" ] && break; sleep 0.05; done
  done
  for _ in $(seq 100); do
    $PRE "$CTL" --socket "$TMP/client.sock" route show -v 2>/dev/null | grep -q 'state: up' && return 0
    sleep 0.1
  done
  echo "WARN the selftest daemons' route did not come up: no selftest figures" >&2
  return 1
}
st_stop() {
  local p
  for p in "${ST_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${ST_PIDS[@]}"; do wait "$p" 2>/dev/null; done
  ST_PIDS=()
}
brw() {  # system size read|write server-nid
  local name=$1 s=$2 op=$3 to=$4 out v col
  [ "$op" = write ] && col=mib_read || col=mib_write
  out=$($PRE timeout $((T + 60)) "$CTL" --socket "$TMP/client.sock" selftest run-test \
    --from 10.0.0.1@o2ib --to "$to" --concurrency "$WINDOW" --duration "$T" --interval "$T" \
    brw "$op" "size=$s" check=none 2>"$TMP/err")
  v=$(echo "$out" | awk -v c="$col" '/- group: servers/ {g = 1} g && $1 == c":" {
      gsub(/[{},]/, ""); print $3; exit}')
  if [ -n "$v" ] && ! echo "$out" | grep -q 'brw_errors: [1-9]'; then
    echo "$name $s $v" >>"$TMP/figs"
  else
    echo "WARN $name size $s failed: $(tail -3 "$TMP/err" | tr '\n' ' ')" >&2
  fi
}

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
# libfabric fi_pingpong (see 6. above): server in the namespace, then the client against it.
fi_pp() {  # size round
  local s=$1 r=$2 n spid v
  n=$((T * (1 << 30) / s))
  [ "$n" -gt $((T * 33333)) ] && n=$((T * 33333))
  [ "$n" -lt 1000 ] && n=1000
  FI_PORT=$((FI_PORT + 1))
  $PRE timeout $((T * 10 + 40)) "${FI_PP[@]}" -B $FI_PORT -S "$s" -I "$n" >/dev/null 2>&1 &
  spid=$!
  sleep 0.5
  # Table: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec; "=" before #ack: all back.
  v=$($PRE timeout $((T * 10 + 30)) "${FI_PP[@]}" -P $FI_PORT -S "$s" -I "$n" 127.0.0.1 \
    2>"$TMP/err" | awk '$1 == "bytes" {h = 1; next}
      h && NF == 8 && $3 ~ /^=/ {printf "%.1f", $6 * 1e6 / 1048576; exit}')
  if [ -n "$v" ]; then
    wait $spid 2>/dev/null
    echo "fi_pingpong $s $v" >>"$TMP/figs"
  else
    kill $spid 2>/dev/null
    wait $spid 2>/dev/null
    echo "WARN fi_pingpong size $s round $r failed: $(tail -2 "$TMP/err" | tr '\n' ' ')" >&2
  fi
}
# iperf3 single stream to PORT (5201: the server; 5202: tcp_relay, which forwards to it).
iperf() {  # system port size round
  local name=$1 port=$2 s=$3 r=$4 spid gbit
  $PRE timeout $((T + 30)) iperf3 -s -B 127.0.0.1 -p 5201 -1 >/dev/null 2>&1 &
  spid=$!
  sleep 0.5
  gbit=$($PRE timeout $((T + 20)) iperf3 -c 127.0.0.1 -p "$port" -t "$T" -l "$s" -f g 2>/dev/null \
    | awk '/receiver/ {print $(NF-2)}')
  wait $spid 2>/dev/null
  if [ -n "$gbit" ]; then
    # Gbit/s (10^9 bits) to MiB/s.
    echo "$name $s $(awk -v g="$gbit" 'BEGIN {printf "%.1f", g * 1e9 / 8 / 1048576}')" >>"$TMP/figs"
  else
    echo "WARN $name size $s round $r failed" >&2
  fi
}
RELAY_PID="" SPLICE_PID=""
if have iperf3; then
  $PRE "$ROOT/target/release/tcp_relay" 127.0.0.1:5202 127.0.0.1:5201 >/dev/null 2>>"$TMP/relay.log" &
  RELAY_PID=$!
  $PRE "$ROOT/target/release/tcp_relay" --splice 127.0.0.1:5203 127.0.0.1:5201 \
    >/dev/null 2>>"$TMP/relay.log" &
  SPLICE_PID=$!
fi
ST_OK=0
st_start && ST_OK=1
for r in $(seq 1 "$ROUNDS"); do
  for s in $SIZES; do
    if have iperf3; then
      iperf iperf3 5201 "$s" "$r"
      [ -n "$RELAY_PID" ] && iperf iperf3_relayed 5202 "$s" "$r"
      [ -n "$SPLICE_PID" ] && iperf iperf3_spliced 5203 "$s" "$r"
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
    have fi_pingpong && fi_pp "$s" "$r"
    lnet ulnet_put "$s" --bulk-put "$T"
    lnet ulnet_get "$s" --bulk-get "$T"
    lnet ulnet_put_routed "$s" --bulk-put "$T" --via-router "$ROOT/target/release/lnet-router"
    lnet ulnet_get_routed "$s" --bulk-get "$T" --via-router "$ROOT/target/release/lnet-router"
    lnet socklnd_put "$s" --net tcp --bulk-put "$T"
    lnet socklnd_put_routed "$s" --client-net tcp --server-net o2ib --bulk-put "$T" \
      --via-router "$ROOT/target/release/lnet-router"
    if [ "$ST_OK" = 1 ]; then
      brw brw_write "$s" write 10.0.0.2@o2ib
      brw brw_read "$s" read 10.0.0.2@o2ib
      brw brw_write_routed "$s" write 10.1.0.2@o2ib1
      brw brw_read_routed "$s" read 10.1.0.2@o2ib1
    fi
  done
done
st_stop
for p in $RELAY_PID $SPLICE_PID; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
RELAY_PID="" SPLICE_PID=""

median() { sort -n | awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
fig() { awk -v n="$1" -v s="$2" '$1 == n && $2 == s {print $3}' "$TMP/figs" | median; }
ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}' || echo NA; }
printf "%-9s %-17s %12s %10s %8s %8s %16s %12s\n" size system "MiB/s" "x iperf3" "x UCX" "x fi_pp" \
  "routed/direct" "x relay's"
for s in $SIZES; do
  base=$(fig iperf3 "$s")
  ucx=$(fig ucx_tag_bw "$s")
  fipp=$(fig fi_pingpong "$s")
  ceil=$(ratio "$(fig iperf3_relayed "$s")" "$base")
  for name in iperf3 iperf3_relayed iperf3_spliced ucx_tag_bw fi_pingpong ulnet_put ulnet_get ulnet_put_routed \
      ulnet_get_routed socklnd_put socklnd_put_routed brw_write brw_read brw_write_routed brw_read_routed; do
    m=$(fig "$name" "$s")
    if [ -z "$m" ]; then
      [ "$name" = fi_pingpong ] && printf "%-9s %-17s %12s\n" "$s" "$name" n/a
      continue
    fi
    rd=""
    [ "$name" = iperf3_relayed ] && rd=$ceil
    [ "$name" = iperf3_spliced ] && rd=$(ratio "$m" "$base")
    [ "$name" = ulnet_put_routed ] && rd=$(ratio "$m" "$(fig ulnet_put "$s")")
    [ "$name" = ulnet_get_routed ] && rd=$(ratio "$m" "$(fig ulnet_get "$s")")
    [ "$name" = socklnd_put_routed ] && rd=$(ratio "$m" "$(fig socklnd_put "$s")")
    [ "$name" = brw_write_routed ] && rd=$(ratio "$m" "$(fig brw_write "$s")")
    [ "$name" = brw_read_routed ] && rd=$(ratio "$m" "$(fig brw_read "$s")")
    rc=""
    [ -n "$rd" ] && [ "$rd" != NA ] && [ "$ceil" != NA ] && rc=$(ratio "$rd" "$ceil")
    printf "%-9s %-17s %12s %10s %8s %8s %16s %12s\n" "$s" "$name" "$m" "$(ratio "$m" "$base")" \
      "$(ratio "$m" "$ucx")" "$(ratio "$m" "$fipp")" "$rd" "$rc"
  done
done
mkdir -p "$(dirname "$PLOT")"
if "$ROOT/target/release/bulk_plot" "$TMP/figs" "$PLOT"; then
  echo "plot: $PLOT"
fi
