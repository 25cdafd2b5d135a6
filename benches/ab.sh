#!/bin/bash
# ab.sh - before/after on one machine: benches/routed.sh and benches/bulk.sh (1 MiB rows) run
# alternately from two checkouts, so that both see the same phases of a shared, noisy machine.
#
#   bash benches/ab.sh OLD_CHECKOUT NEW_CHECKOUT [RUNS]      (needs root for bulk.sh's netns)
#
# Each of RUNS rounds (default 5) runs old then new (or new then old: the order alternates by
# round, so neither side always runs second): routed.sh (RTT_N, PUT_SECS below) and bulk.sh
# (SIZES=1048576, ROUNDS=1, T below). Every checkout builds its own release binaries (once).
# Then prints, for every figure both sides produced: the old runs' median, min and max, the new
# median, and whether the new median lies within the old runs' min..max or within 5% of the old
# median ("ok"), else "SLOWER" or "faster" (by whether the figure is a time or a rate).
#
# Env: RUNS_DIR (where the raw outputs are kept; default a fresh /tmp dir), RTT_N=3000,
#      PUT_SECS=2, T=2.
set -u
OLD=$(cd "${1:?old checkout}" && pwd)
NEW=$(cd "${2:?new checkout}" && pwd)
RUNS=${3:-5}
RTT_N=${RTT_N:-3000}
PUT_SECS=${PUT_SECS:-2}
T=${T:-2}
OUT=${RUNS_DIR:-$(mktemp -d /tmp/ab.XXXXXX)}
mkdir -p "$OUT"
echo "raw outputs: $OUT" >&2

one() { # SIDE DIR ROUND
  (cd "$2" && RTT_N=$RTT_N PUT_SECS=$PUT_SECS timeout 900 bash benches/routed.sh \
    >"$OUT/routed-$1-$3.txt" 2>"$OUT/routed-$1-$3.err")
  (cd "$2" && SIZES=1048576 ROUNDS=1 T=$T PLOT="$OUT/plot-$1-$3.svg" timeout 900 bash benches/bulk.sh \
    >"$OUT/bulk-$1-$3.txt" 2>"$OUT/bulk-$1-$3.err")
}

for r in $(seq 1 "$RUNS"); do
  if [ $((r % 2)) -eq 1 ]; then
    one old "$OLD" "$r"; one new "$NEW" "$r"
  else
    one new "$NEW" "$r"; one old "$OLD" "$r"
  fi
  echo "round $r of $RUNS done" >&2
done

python3 - "$OUT" "$RUNS" <<'EOF'
import re, sys, statistics, glob, os
out, runs = sys.argv[1], int(sys.argv[2])

def routed(path):
    # Rows of routed.sh's table: "figure (unit)  direct  per-ni  shared  ratios..."
    figs = {}
    for line in open(path):
        m = re.match(r'^(.+?\((?:us|msgs/s)\))\s+(\S+)\s+(\S+)\s+(\S+)', line)
        if not m:
            continue
        name = m.group(1).strip()
        for col, v in zip(("direct", "routed per-ni", "routed shared"), m.group(2, 3, 4)):
            try:
                figs[f"routed.sh {name} [{col}]"] = float(v)
            except ValueError:
                pass
    return figs

def bulk(path):
    # Rows of bulk.sh's table: "size system MiB/s ..."
    figs = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 3 and f[0] == "1048576":
            try:
                figs[f"bulk.sh 1 MiB {f[1]} (MiB/s)"] = float(f[2])
            except ValueError:
                pass
    return figs

data = {"old": {}, "new": {}}
for side in data:
    for r in range(1, runs + 1):
        for kind, parse in (("routed", routed), ("bulk", bulk)):
            p = os.path.join(out, f"{kind}-{side}-{r}.txt")
            if os.path.exists(p):
                for k, v in parse(p).items():
                    data[side].setdefault(k, []).append(v)

print(f"{'figure':58} {'old median':>11} {'old min':>9} {'old max':>9} {'new median':>11} {'new min':>9} {'new max':>9}  verdict")
for k in sorted(set(data["old"]) & set(data["new"])):
    o, n = data["old"][k], data["new"][k]
    om, nm = statistics.median(o), statistics.median(n)
    lower_better = "(us)" in k
    within = min(o) <= nm <= max(o) or abs(nm - om) <= 0.05 * om
    if within:
        verdict = "ok"
    else:
        worse = nm > om if lower_better else nm < om
        verdict = "SLOWER" if worse else "faster"
    print(f"{k:58} {om:11.1f} {min(o):9.1f} {max(o):9.1f} {nm:11.1f} {min(n):9.1f} {max(n):9.1f}  {verdict} (n={len(o)}/{len(n)})")
EOF
