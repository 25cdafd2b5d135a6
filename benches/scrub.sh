#!/bin/bash
# scrub.sh - what scrubbing a router's large buffers costs (issue 31): routed 1 MiB bulk PUTs
# through an lnet-router on tcp with `buffers: scrub: on` against `off`, interleaved, same run,
# and this machine's scrub rate (1 MiB zero-fills on one core) with the share of a core it
# would take at 100 Gb/s line rate (12.5 GB/s: every forwarded byte written once more).
#
#   bash benches/scrub.sh
#
# Env: SECS=5 (each bulk run), ROUNDS=3. Every run is bounded by `timeout`.
. "$(dirname "$0")/lib.sh"
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-3}
build_perf --bin scrub_rate

# bulk SCRUB: the routed bulk PUT rate in MB/s (lnet_perf's FIGURE line), or NA
bulk() {
  local out
  out=$(timeout 120 "$PERF" --bulk-put "$SECS" --size 1048576 --via-router "$ROUTER" \
    --router-scrub "$1" 2>/dev/null)
  local fig
  fig=$(grep -E '^FIGURE ulnet_bulk' <<<"$out" | head -1 | sed -E 's/.*(value|median)=([0-9.]+).*/\2/')
  echo "${fig:-NA}"
}

declare -a on off
for r in $(seq 1 "$ROUNDS"); do
  off+=("$(bulk off)")
  on+=("$(bulk on)")
  echo "round $r: scrub off ${off[-1]}  scrub on ${on[-1]}"
done
python3 - "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
off = [float(x) for x in sys.argv[1].split() if x != "NA"]
on = [float(x) for x in sys.argv[2].split() if x != "NA"]
if off and on:
    mo, mn = statistics.median(off), statistics.median(on)
    print(f"routed 1 MiB PUT, median of {len(off)}: scrub off {mo:.0f}, scrub on {mn:.0f} "
          f"(on/off {mn / mo:.2f})")
else:
    print("a bulk run failed")
PY
target/release/scrub_rate 2
