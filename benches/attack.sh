#!/bin/bash
# attack.sh - the legitimate routed bulk rate a router keeps while peers hoard its large
# buffers (issue 31, item 2): 64 fresh NIDs take every grant the router gives them, never fill
# it, and ask again after each reclaim, from a third into the measured window, while one client
# streams 1 MiB bulk PUTs through an lnet-router on tcp to a server behind it. Unattacked and
# attacked runs interleaved; each attacked run also gives its own rate before the attack.
# Goal: the rate under attack at least half the unattacked one.
#
#   bash benches/attack.sh
#
# Env: SECS=9 (each measured window), ROUNDS=2, ATTACKERS=64, LARGE=N (the router's pool of
# large buffers, `buffers: large:`, in both runs; default the router's 1024, split between its
# two NIs: then all 64 attackers get a grant at once; with LARGE=16 the unproven share, half of
# an NI's 8, lets 4 at a time). Every run is bounded by `timeout`.
. "$(dirname "$0")/lib.sh"
SECS=${SECS:-9}
ROUNDS=${ROUNDS:-2}
ATTACKERS=${ATTACKERS:-64}
LARGE=${LARGE:-}
POOL=()
[ -n "$LARGE" ] && POOL=(--router-large "$LARGE")
build_perf

# run [ARGS...]: one routed bulk run; its FIGURE lines, with its exit status on a last line
run() {
  local out rc
  out=$(timeout 180 "$PERF" --bulk-put "$SECS" --size 1048576 --via-router "$ROUTER" \
    "${POOL[@]}" "$@" \
    2>/dev/null)
  rc=$?
  grep -E '^FIGURE' <<<"$out"
  echo "EXIT $rc"
}

# fig NAME: the value= of FIGURE NAME on stdin, or NA
fig() {
  local v
  v=$(grep -E "^FIGURE $1 " | head -1 | sed -E 's/.*value=([0-9.]+).*/\1/')
  echo "${v:-NA}"
}

declare -a plain before during
for r in $(seq 1 "$ROUNDS"); do
  out=$(run)
  echo "round $r unattacked:"
  sed 's/^/  /' <<<"$out"
  plain+=("$(fig ulnet_bulk_put_1048576 <<<"$out")")
  out=$(run --attackers "$ATTACKERS")
  echo "round $r attacked ($ATTACKERS attackers):"
  sed 's/^/  /' <<<"$out"
  before+=("$(fig ulnet_bulk_put_before_attack <<<"$out")")
  during+=("$(fig ulnet_bulk_put_under_attack <<<"$out")")
done
python3 - "${plain[*]}" "${before[*]}" "${during[*]}" <<'PY'
import sys
runs = [s.split() for s in sys.argv[1:4]]
plain, before, during = runs
for i, (p, b, d) in enumerate(zip(plain, before, during), 1):
    ratio = f"{float(d) / float(p):.2f}" if "NA" not in (p, d) else "NA"
    print(f"round {i}: unattacked {p} MiB/s; attacked run: before {b}, under attack {d} MiB/s;"
          f" attacked/unattacked {ratio}")
ok = [(float(p), float(d)) for p, d in zip(plain, during) if "NA" not in (p, d)]
if ok:
    sp, sd = sum(p for p, _ in ok), sum(d for _, d in ok)
    print(f"mean of {len(ok)}: unattacked {sp / len(ok):.1f} MiB/s, under attack "
          f"{sd / len(ok):.1f} MiB/s, attacked/unattacked {sd / sp:.2f} (goal >= 0.5)")
else:
    print("a run failed")
PY
