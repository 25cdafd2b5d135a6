#!/usr/bin/env bash
# Unpacks a ulnet .deb into a temporary root (never installs it on this host) and checks its
# files: the binaries run (--version, lnetctl --help), the unit and its sandbox (systemd-analyze
# security: 2.5 or lower), the conffile, the manual pages and completions, the README and the
# admin's pages (packaging/doc-pages), and the control fields.
#
#   bash packaging/check-deb.sh FILE.deb
set -euo pipefail
deb=$1
root=$(mktemp -d /tmp/ulnet-deb-check.XXXXXX)
trap 'rm -rf "$root"' EXIT
dpkg-deb -x "$deb" "$root"
fail() { echo "check-deb: $*" >&2; exit 1; }
for f in usr/bin/lnet-router usr/bin/lnetctl lib/systemd/system/lnet-router.service \
  etc/ulnet/lnet-router.yaml usr/share/man/man8/lnet-router.8.gz usr/share/man/man8/lnetctl.8.gz \
  usr/share/bash-completion/completions/lnetctl usr/share/zsh/vendor-completions/_lnetctl \
  usr/share/fish/vendor_completions.d/lnetctl.fish usr/share/doc/ulnet/README.md \
  usr/share/doc/ulnet/examples/ulnet-alerts.yml usr/share/doc/ulnet/examples/ulnet-dashboard.json; do
  [ -s "$root/$f" ] || fail "missing or empty: $f"
done
# The admin's pages (packaging/doc-pages, read beside this script), beside the README.
pages=$(grep -v '^#' "$(dirname "$0")/doc-pages")
[ -n "$pages" ] || fail "packaging/doc-pages lists no page"
for page in $pages; do
  [ -s "$root/usr/share/doc/ulnet/$page" ] || fail "missing or empty: usr/share/doc/ulnet/$page"
done
[ -x "$root/usr/bin/lnet-router" ] && [ -x "$root/usr/bin/lnetctl" ] || fail "binaries not executable"
"$root/usr/bin/lnet-router" --version | grep -q '^lnet-router .* (git ' || fail "lnet-router --version"
"$root/usr/bin/lnetctl" --help | grep -q selftest || fail "lnetctl --help"
grep -q '^ExecStart=/usr/bin/lnet-router ' "$root/lib/systemd/system/lnet-router.service" \
  || fail "the unit does not start /usr/bin/lnet-router"
# The unit's sandbox: systemd-analyze's exposure score (0 safest, 10 unsafe) at most 2.5, rated
# offline on the packaged file (no systemd needs to run here; .ci/run installs systemd-analyze).
unit="$root/lib/systemd/system/lnet-router.service"
command -v systemd-analyze >/dev/null 2>&1 || fail "systemd-analyze is missing (apt-get install systemd)"
grep -q '^CapabilityBoundingSet=CAP_NET_BIND_SERVICE$' "$unit" \
  || fail "the unit's capability set is not CAP_NET_BIND_SERVICE alone"
exposure=$(systemd-analyze security --offline=yes "$unit" 2>/dev/null \
  | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
[ -n "$exposure" ] || fail "systemd-analyze security gave no exposure level for the unit"
awk -v e="$exposure" 'BEGIN { exit !(e <= 2.5) }' \
  || fail "the unit's exposure level is $exposure (systemd-analyze security; at most 2.5)"
zcat "$root/usr/share/man/man8/lnetctl.8.gz" | grep -q '^\.TH lnetctl 8' || fail "lnetctl.8"
zcat "$root/usr/share/man/man8/lnet-router.8.gz" | grep -q '^\.TH lnet-router 8' || fail "lnet-router.8"
ctl=$(dpkg-deb -f "$deb" Package Version Architecture)
echo "$ctl" | grep -q '^Package: ulnet$' || fail "control: $ctl"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/ulnet/lnet-router.yaml \
  || fail "the config is not a conffile"
owners=$(dpkg-deb -c "$deb" | awk '{print $2}' | sort -u)
[ "$owners" = "root/root" ] || fail "files not owned by root: $owners"
echo "check-deb: $deb: $(dpkg-deb -c "$deb" | wc -l) entries, unit exposure $exposure, all checks passed"
