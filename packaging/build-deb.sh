#!/usr/bin/env bash
# Builds ulnet's Debian package from this checkout: lnet-router and lnetctl (release), the
# systemd unit, the example configuration as a conffile, manual pages and completions generated
# from the programs themselves, the README and the admin's pages (packaging/doc-pages).
#
#   bash packaging/build-deb.sh [OUT.deb]        (default target/ulnet_<version>_<arch>.deb)
#
# Env: FEATURES="router/verbs" to build the daemon with the verbs fabric (needs libibverbs-dev
# and librdmacm-dev; the package then depends on libibverbs1 and librdmacm1).
#      DEB_PREBUILT=1: package the lnet-router and lnetctl already in target/release instead of
# building them (.ci/run packages the ones tests/rxe/run.sh just built with verbs, rather than
# compiling the workspace in release a second time); FEATURES then only names the dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(awk -F'"' '/^\[workspace.package\]/ {p = 1} p && /^version/ {print $2; exit}' Cargo.toml)
arch=$(dpkg --print-architecture)
out=${1:-target/ulnet_${version}_${arch}.deb}
features=${FEATURES:-}
args=(--release -q -p router --bin lnet-router -p lnetctl --bin lnetctl)
[ -n "$features" ] && args+=(--features "$features")
if [ -n "${DEB_PREBUILT:-}" ]; then
  for b in lnet-router lnetctl; do
    [ -x "target/release/$b" ] || { echo "build-deb.sh: DEB_PREBUILT set but no target/release/$b" >&2; exit 1; }
  done
else
  cargo build "${args[@]}"
fi
root=$(mktemp -d /tmp/ulnet-deb.XXXXXX)
trap 'rm -rf "$root"' EXIT
bin=target/release
install -D -m 755 "$bin/lnet-router" "$root/usr/bin/lnet-router"
install -D -m 755 "$bin/lnetctl" "$root/usr/bin/lnetctl"
strip --strip-debug "$root/usr/bin/lnet-router" "$root/usr/bin/lnetctl" 2>/dev/null || true
install -D -m 644 packaging/lnet-router.service "$root/lib/systemd/system/lnet-router.service"
install -D -m 644 router/examples/lnet-router.yaml "$root/etc/ulnet/lnet-router.yaml"
mkdir -p "$root/usr/share/man/man8" "$root/usr/share/bash-completion/completions" \
  "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d" \
  "$root/usr/share/doc/ulnet"
"$bin/lnet-router" --print-man | gzip -9n > "$root/usr/share/man/man8/lnet-router.8.gz"
"$bin/lnetctl" man | gzip -9n > "$root/usr/share/man/man8/lnetctl.8.gz"
"$bin/lnetctl" completions bash > "$root/usr/share/bash-completion/completions/lnetctl"
"$bin/lnetctl" completions zsh > "$root/usr/share/zsh/vendor-completions/_lnetctl"
"$bin/lnetctl" completions fish > "$root/usr/share/fish/vendor_completions.d/lnetctl.fish"
install -m 644 README.md "$root/usr/share/doc/ulnet/README.md"
# The admin's pages (packaging/doc-pages), at their paths relative to the README.
grep -v '^#' packaging/doc-pages | while read -r page; do
  install -D -m 644 "$page" "$root/usr/share/doc/ulnet/$page"
done
# The metrics endpoint's alert rules and Grafana dashboard, to start from (docs/metrics.md).
for f in packaging/metrics/ulnet-alerts.yml packaging/metrics/ulnet-dashboard.json; do
  install -D -m 644 "$f" "$root/usr/share/doc/ulnet/examples/$(basename "$f")"
done
depends="libc6"
case "$features" in *verbs*) depends="$depends, libibverbs1, librdmacm1" ;; esac
mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CONTROL
Package: ulnet
Version: $version
Architecture: $arch
Maintainer: ulnet developers <ulnet@localhost>
Depends: $depends
Section: net
Priority: optional
Description: Lustre LNet in userspace: the lnet-router daemon and lnetctl
 An o2ib-style LND over verbs or TCP, an LNet router daemon that forwards
 between networks, lnetctl (ping, nets, peers, routes, stats, capture) and an
 lnet_selftest console. The lnet-router service is installed but not enabled.
CONTROL
echo "/etc/ulnet/lnet-router.yaml" > "$root/DEBIAN/conffiles"
mkdir -p "$(dirname "$out")"
dpkg-deb --root-owner-group --build "$root" "$out" >/dev/null
echo "$out"
