#!/usr/bin/env bash
# tests/rxe/guest.sh — ulnet's Soft-RoCE guest harness: boots a throw-away qemu guest whose
# kernel has rdma_rxe, brings up `rxe0` on a dummy netdev with 10.0.0.1/24, runs ONE guest script
# there and exits with that script's status. Nothing is installed on the host except (with apt)
# the packages listed below; the kernel is downloaded and unpacked, never installed.
#
# Usage:
#   tests/rxe/guest.sh [--bin PATH]... [--file PATH]... [--env NAME=VALUE]... [--share DIR]
#                      [--timeout SECS] SCRIPT [ARG...]
#
#   SCRIPT      a host file, run in the guest as `sh /opt/ulnet/script.sh ARG...` (busybox sh),
#               cwd /root, once rxe0 is ACTIVE. Use 10.0.0.1 for rdma_cm (an rxe on lo resolves
#               no routes). Its stdout/stderr go to the console, which this script prints.
#   --bin PATH  copy a host executable into the guest's /opt/ulnet/bin (on PATH), with every
#               shared library `ldd` names, so dynamically linked cargo builds just run. Repeat it
#               (e.g. --bin target/release/lnet-router --bin target/release/lnetctl).
#   --file PATH copy a file or directory into /opt/ulnet/files (configs, expected outputs).
#   --env N=V   export N=V in the guest script's environment (repeatable).
#   --share DIR mount host DIR read-write at /mnt/host in the guest (virtio-9p), e.g. for logs.
#   --timeout S wall-clock bound on the whole guest run (default RXE_TIMEOUT or 300).
#
# In the guest: busybox, iproute2's `rdma`, ibv_devices/ibv_devinfo, perftest (ib_send_lat,
# ib_send_bw, ib_write_lat, ib_write_bw, ib_read_lat), rping; `ulimit -l unlimited`; /tmp is a
# tmpfs; $ULNET_BIN=/opt/ulnet/bin, $ULNET_FILES=/opt/ulnet/files.
#
# Exit status: the guest script's own status (keep test failures below 90), or
#   90  usage error                       94  initramfs could not be built
#   91  host packages missing/apt failed  95  the guest did not boot (no /init reached)
#   92  no kernel package / download      96  the guest never reported a status (timeout, panic)
#   93  kernel unpack / vmlinux problem
#
# Environment:
#   RXE_WORK=DIR       cache (kernel .deb and tree, base initramfs); default <repo>/target/rxe
#   RXE_ACCEL=auto|kvm|tcg  auto: KVM when /dev/kvm works within RXE_KVM_PROBE s (10), else TCG
#   RXE_MEM=1024 RXE_SMP=2  guest size;  RXE_TIMEOUT=300  default for --timeout
#   RXE_KPKG=linux-image-...  kernel package (default: what linux-image-amd64 depends on)
#   RXE_NO_APT=1       never run apt-get (fail with 91 if something is missing)
#   RXE_QUIET=1        do not echo the console while the guest runs (it is still printed on error)
#
# How it is built: the base initramfs (busybox, RDMA tools and the rxe provider, the kernel modules
# rdma_rxe/ib_uverbs/rdma_ucm/dummy/9p and their dependencies, /init) is cached per kernel and
# content of this script; each run appends a small second cpio archive (the kernel concatenates
# them) with the script, the --bin/--file copies and their libraries. The Debian kernel is booted
# as an uncompressed ELF through its PVH entry point when it has one (no in-guest decompression,
# a few seconds less under TCG).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${RXE_WORK:-$REPO/target/rxe}
ACCEL=${RXE_ACCEL:-auto}
MEM=${RXE_MEM:-1024}
SMP=${RXE_SMP:-2}
TIMEOUT=${RXE_TIMEOUT:-300}
KVM_PROBE=${RXE_KVM_PROBE:-10}

say() { printf '[guest.sh %(%T)T] %s\n' -1 "$*" >&2; }
fail() { say "ERROR: $2"; exit "$1"; }

# ------------------------------------------------------------------------------ arguments
BINS=() FILES=() ENVS=() SHARE=""
while [ $# -gt 0 ]; do
  case $1 in
    --bin) [ $# -ge 2 ] || fail 90 "--bin needs a path"; BINS+=("$2"); shift 2 ;;
    --file) [ $# -ge 2 ] || fail 90 "--file needs a path"; FILES+=("$2"); shift 2 ;;
    --env) [ $# -ge 2 ] || fail 90 "--env needs NAME=VALUE"; ENVS+=("$2"); shift 2 ;;
    --share) [ $# -ge 2 ] || fail 90 "--share needs a directory"; SHARE=$(cd "$2" && pwd) || fail 90 "no directory $2"; shift 2 ;;
    --timeout) [ $# -ge 2 ] || fail 90 "--timeout needs seconds"; TIMEOUT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) fail 90 "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || fail 90 "no guest script given (see --help)"
SCRIPT=$1; shift
[ -f "$SCRIPT" ] || fail 90 "guest script $SCRIPT not found"
for b in "${BINS[@]}"; do [ -f "$b" ] && [ -x "$b" ] || fail 90 "--bin $b: not an executable file"; done
for f in "${FILES[@]}"; do [ -e "$f" ] || fail 90 "--file $f: not found"; done
for e in "${ENVS[@]}"; do [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || fail 90 "--env $e: not NAME=VALUE"; done

mkdir -p "$WORK" || fail 90 "cannot create $WORK"
T_START=$(date +%s.%N)

# ------------------------------------------------------------------------------ host packages
# package:command-or-file that proves it is there
NEED="qemu-system-x86:/usr/bin/qemu-system-x86_64 busybox-static:/bin/busybox rdma-core:/usr/sbin/rdma
      iproute2:/usr/bin/rdma ibverbs-providers:/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
      ibverbs-utils:/usr/bin/ibv_devinfo perftest:/usr/bin/ib_write_bw rdmacm-utils:/usr/bin/rping
      kmod:/usr/sbin/depmod cpio:/usr/bin/cpio xz-utils:/usr/bin/xz binutils:/usr/bin/readelf"
missing=()
for pair in $NEED; do
  pkg=${pair%%:*} path=${pair#*:}
  if [ ! -e "$path" ] && ! dpkg -s "$pkg" >/dev/null 2>&1; then missing+=("$pkg"); fi
done
# rdma-core's binary moved between releases; only iproute2's `rdma` is needed.
if [ ${#missing[@]} -gt 0 ]; then
  [ "${RXE_NO_APT:-0}" = 1 ] && fail 91 "missing host packages: ${missing[*]} (RXE_NO_APT=1)"
  say "apt-get install ${missing[*]}"
  timeout 300 apt-get update -qq >"$WORK/apt.log" 2>&1 || say "apt-get update failed, trying the install anyway"
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >>"$WORK/apt.log" 2>&1 || fail 91 "apt-get install failed, see $WORK/apt.log"
fi

# ------------------------------------------------------------------------------ kernel
kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9][^ ]*\).*/\1/p' | head -1; }
KPKG=${RXE_KPKG:-$(kernel_pkg)}
if [ -z "$KPKG" ] && [ "${RXE_NO_APT:-0}" != 1 ]; then
  timeout 300 apt-get update -qq >/dev/null 2>&1
  KPKG=$(kernel_pkg)
fi
[ -n "$KPKG" ] || fail 92 "cannot tell which kernel package to use (set RXE_KPKG=linux-image-...)"
KVER=${KPKG#linux-image-}
KDIR="$WORK/kernel-$KVER"
if [ ! -f "$KDIR/.unpacked" ]; then
  rm -rf "$KDIR"; mkdir -p "$KDIR/deb"
  say "downloading $KPKG"
  (cd "$KDIR/deb" && timeout 600 apt-get download "$KPKG") >"$WORK/download.log" 2>&1 \
    || fail 92 "apt-get download $KPKG failed, see $WORK/download.log"
  timeout 300 dpkg-deb -x "$KDIR"/deb/*.deb "$KDIR/tree" || fail 93 "dpkg-deb -x failed"
  timeout 300 depmod -b "$KDIR/tree" "$KVER" || fail 93 "depmod on the kernel tree failed"
  rm -rf "$KDIR/deb"
  touch "$KDIR/.unpacked"
fi
MODDIR="$KDIR/tree/lib/modules/$KVER"
BZIMAGE="$KDIR/tree/boot/vmlinuz-$KVER"
[ -f "$BZIMAGE" ] && [ -d "$MODDIR" ] || fail 93 "kernel tree in $KDIR is incomplete"
# PVH: the payload of a Debian bzImage is an xz stream holding an ELF vmlinux; its Xen ELF note
# 18 (XEN_ELFNOTE_PHYS32_ENTRY) marks a PVH entry point that qemu -kernel can jump to directly.
KERNEL=$BZIMAGE
if [ ! -f "$KDIR/.pvh-checked" ]; then
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$BZIMAGE" 2>/dev/null | head -1 | cut -d: -f1)
  rm -f "$KDIR/vmlinux.tmp"
  [ -n "$off" ] && tail -c "+$((off + 1))" "$BZIMAGE" | xz -dcq >"$KDIR/vmlinux.tmp" 2>/dev/null
  if [ -s "$KDIR/vmlinux.tmp" ] && LC_ALL=C readelf -n "$KDIR/vmlinux.tmp" 2>/dev/null | grep -q '0x00000012'; then
    mv "$KDIR/vmlinux.tmp" "$KDIR/vmlinux"
  else
    rm -f "$KDIR/vmlinux.tmp"; say "no PVH entry in this kernel: booting the bzImage"
  fi
  touch "$KDIR/.pvh-checked"
fi
[ -s "$KDIR/vmlinux" ] && KERNEL="$KDIR/vmlinux"

# ------------------------------------------------------------------------------ initramfs
# put FILE at DEST inside root DIR, plus the shared libraries it needs (same paths as the host)
install_elf() {
  local root=$1 src=$2 dest=$3 lib
  mkdir -p "$root$(dirname "$dest")" && cp -L "$src" "$root$dest" || return 1
  ldd "$src" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    [ -e "$root$lib" ] || { mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; }
  done
}

MODULES="rdma_rxe ib_uverbs rdma_ucm dummy crc32_generic 9p 9pnet_virtio virtio_pci"
# module name -> its path and dependencies, from modules.dep
mod_line() { awk -F: -v want="$1" '{ n = $1; sub(/^.*\//, "", n); sub(/\.ko(\.[gx]z|\.zst)?$/, "", n); gsub(/-/, "_", n); if (n == want) { print; exit } }' "$MODDIR/modules.dep"; }
add_modules() {  # root, names...
  local root=$1 name line path dep; shift
  local queue=("$@") done=" "
  while [ ${#queue[@]} -gt 0 ]; do
    name=${queue[0]//-/_}; queue=("${queue[@]:1}")
    case $done in *" $name "*) continue ;; esac
    done="$done$name "
    line=$(mod_line "$name")
    if [ -z "$line" ]; then
      # built into the kernel is fine; unknown is not
      grep -qE "/${name}\.ko" "$MODDIR/modules.builtin" 2>/dev/null && continue
      say "module $name not found for $KVER"; return 1
    fi
    path=${line%%:*}
    mkdir -p "$root/lib/modules/$KVER/$(dirname "$path")"
    cp "$MODDIR/$path" "$root/lib/modules/$KVER/$path" || return 1
    for dep in ${line#*:}; do
      dep=${dep##*/}; dep=${dep%%.ko*}; queue+=("$dep")
    done
  done
  cp "$MODDIR"/modules.builtin* "$MODDIR"/modules.order "$root/lib/modules/$KVER/" 2>/dev/null
  depmod -b "$root" "$KVER"
}

build_base() {  # $1 = output cpio
  local root="$WORK/base-root" t
  rm -rf "$root"
  mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,mnt/host,opt/ulnet/bin,opt/ulnet/files,usr/bin,usr/sbin}
  cp /bin/busybox "$root/bin/busybox" || return 1
  for t in $("$root/bin/busybox" --list); do [ -e "$root/bin/$t" ] || ln -s busybox "$root/bin/$t"; done
  ln -sf ../bin/busybox "$root/sbin/modprobe"
  for t in rdma ibv_devices ibv_devinfo rping ib_send_lat ib_send_bw ib_write_lat ib_write_bw ib_read_lat; do
    local p; p=$(command -v "$t") || { say "host tool $t missing"; return 1; }
    install_elf "$root" "$p" "/usr/bin/$t" || return 1
  done
  # the rxe userspace provider, found by libibverbs through its .driver file
  local prov; prov=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null | head -1)
  [ -n "$prov" ] || { say "no librxe provider"; return 1; }
  install_elf "$root" "$prov" "$prov" || return 1
  mkdir -p "$root/etc/libibverbs.d"; cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/" || return 1
  # pthread_cancel/exit unwinding dlopen()s libgcc_s (rping and Rust panics need it)
  [ -e /lib/x86_64-linux-gnu/libgcc_s.so.1 ] && install_elf "$root" /lib/x86_64-linux-gnu/libgcc_s.so.1 /lib/x86_64-linux-gnu/libgcc_s.so.1
  add_modules "$root" $MODULES || return 1
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
  printf 'root:x:0:\n' >"$root/etc/group"
  printf '127.0.0.1 localhost\n10.0.0.1 rxe-guest\n' >"$root/etc/hosts"
  cat >"$root/init" <<'INIT'
#!/bin/sh
# ulnet guest init: mounts, rxe0 on dummy0 (10.0.0.1/24), then the guest script; prints its status.
export PATH=/opt/ulnet/bin:/usr/bin:/usr/sbin:/bin:/sbin HOME=/root
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp; mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
echo "ULNET_GUEST_INIT uptime=$(cut -d' ' -f1 /proc/uptime)"
status() { echo "ULNET_GUEST_STATUS=$1 uptime=$(cut -d' ' -f1 /proc/uptime)"; sync; poweroff -f; }
ip link set lo up
for m in crc32_generic dummy rdma_rxe ib_uverbs rdma_ucm; do modprobe "$m" 2>/dev/null || echo "modprobe $m failed"; done
ip link set dummy0 up && ip addr add 10.0.0.1/24 dev dummy0 || status 97
rdma link add rxe0 type rxe netdev dummy0 || status 97
n=0
while ! rdma link show rxe0/1 2>/dev/null | grep -q 'state ACTIVE'; do
  n=$((n + 1)); [ $n -gt 50 ] && { rdma link show; status 97; }; sleep 0.1
done
if grep -q ulnet_share /proc/cmdline; then
  modprobe virtio_pci; modprobe 9pnet_virtio; modprobe 9p
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 ulnet_share /mnt/host || echo "9p mount failed"
fi
ulimit -l unlimited
[ -f /opt/ulnet/env ] && . /opt/ulnet/env
export ULNET_BIN=/opt/ulnet/bin ULNET_FILES=/opt/ulnet/files
echo "ULNET_GUEST_READY uptime=$(cut -d' ' -f1 /proc/uptime)"
cd /root
sh /opt/ulnet/script.sh $(cat /opt/ulnet/args 2>/dev/null)
status $?
INIT
  chmod 755 "$root/init"
  (cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$1.tmp" || return 1
  mv "$1.tmp" "$1"
}

# the base is rebuilt when the kernel or this script changes
BASE_ID=$(sha256sum <"${BASH_SOURCE[0]}" | cut -c1-12)
BASE="$WORK/base-$KVER-$BASE_ID.cpio"
if [ ! -s "$BASE" ]; then
  say "building the base initramfs for $KVER"
  rm -f "$WORK"/base-*.cpio
  build_base "$BASE" || fail 94 "could not build the base initramfs"
  rm -rf "$WORK/base-root"
fi

# the per-run overlay: script, args, environment, binaries and files
RUN_DIR=$(mktemp -d "$WORK/run.XXXXXX") || fail 94 "mktemp failed"
trap 'rm -rf "$RUN_DIR"' EXIT
OV="$RUN_DIR/root"
mkdir -p "$OV/opt/ulnet/bin" "$OV/opt/ulnet/files"
cp "$SCRIPT" "$OV/opt/ulnet/script.sh" || fail 94 "cannot copy $SCRIPT"
# arguments: one per word (keep them free of spaces)
printf '%s\n' "$@" >"$OV/opt/ulnet/args"
: >"$OV/opt/ulnet/env"
for e in "${ENVS[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}" >>"$OV/opt/ulnet/env"; done
for b in "${BINS[@]}"; do install_elf "$OV" "$b" "/opt/ulnet/bin/$(basename "$b")" || fail 94 "cannot install $b"; done
for f in "${FILES[@]}"; do cp -a "$f" "$OV/opt/ulnet/files/" || fail 94 "cannot copy $f"; done
# (a library the base has too is extracted again over the identical file: harmless)
INITRD="$RUN_DIR/initrd.cpio"
cp "$BASE" "$INITRD" || fail 94 "cannot copy the base initramfs"
(cd "$OV" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >>"$INITRD" || fail 94 "cpio of the overlay failed"

# ------------------------------------------------------------------------------ boot
CONSOLE="$WORK/console.log"
BOOT_T=""
run_qemu() {  # accel, init-probe seconds (0 = none); sets QEMU_RC
  local accel=$1 probe=$2 cpu qpid tpid waited=0 extra=() append
  if [ "$accel" = kvm ]; then cpu=(-enable-kvm -cpu host,-arch-capabilities); else cpu=(-accel tcg,thread=multi -cpu max); fi
  # tsc=reliable: under TCG the kernel's TSC sync check fails spuriously and it falls back to
  # the emulated HPET, where every clock read (Instant::now, gettimeofday) is a slow MMIO exit.
  append="console=ttyS0 rdinit=/init panic=-1 quiet loglevel=3 tsc=reliable"
  if [ -n "$SHARE" ]; then
    extra=(-virtfs "local,path=$SHARE,mount_tag=ulnet_share,security_model=none,id=ulnet_share")
    append="$append ulnet_share"
  fi
  say "booting $KVER ($accel, ${MEM} MiB, $SMP vCPU, bound ${TIMEOUT}s)"
  : >"$CONSOLE"
  local b0; b0=$(date +%s.%N)
  timeout --kill-after=5 "$TIMEOUT" qemu-system-x86_64 "${cpu[@]}" -M pc -m "$MEM" -smp "$SMP" \
    -kernel "$KERNEL" -initrd "$INITRD" -append "$append" \
    -nographic -monitor none -serial stdio -no-reboot -nic none "${extra[@]}" \
    </dev/null >"$CONSOLE" 2>&1 &
  qpid=$!
  if [ "${RXE_QUIET:-0}" != 1 ]; then tail -n +1 -F --pid=$qpid "$CONSOLE" 2>/dev/null & tpid=$!; else tpid=""; fi
  while kill -0 $qpid 2>/dev/null && ! grep -q ULNET_GUEST_INIT "$CONSOLE"; do
    sleep 0.2; waited=$((waited + 1))
    if [ "$probe" -gt 0 ] && [ $waited -ge $((probe * 5)) ]; then
      say "$accel did not reach /init in ${probe}s"; kill $qpid 2>/dev/null; break
    fi
  done
  grep -q ULNET_GUEST_INIT "$CONSOLE" && BOOT_T=$(awk -v a="$b0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  wait $qpid; QEMU_RC=$?
  [ -n "$tpid" ] && { sleep 0.3; kill "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null; }
}

QEMU_RC=0
case $ACCEL in
  kvm) run_qemu kvm 0 ;;
  tcg) run_qemu tcg 0 ;;
  auto)
    if [ -w /dev/kvm ]; then
      run_qemu kvm "$KVM_PROBE"
      grep -q ULNET_GUEST_INIT "$CONSOLE" || { say "falling back to TCG"; run_qemu tcg 0; }
    else
      run_qemu tcg 0
    fi ;;
  *) fail 90 "RXE_ACCEL must be auto, kvm or tcg" ;;
esac
T_END=$(date +%s.%N)
# guest timings depend on the host being otherwise idle (TCG): say how loaded it was
say "host load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"

st=$(sed -n 's/^ULNET_GUEST_STATUS=\([0-9]*\).*/\1/p' "$CONSOLE" | tail -1)
say "qemu status $QEMU_RC, /init after ${BOOT_T:-?}s, total $(awk -v a="$T_START" -v b="$T_END" 'BEGIN { printf "%.1f", b - a }')s, guest status ${st:-none}"
if ! grep -q ULNET_GUEST_INIT "$CONSOLE"; then
  [ "${RXE_QUIET:-0}" = 1 ] && tail -30 "$CONSOLE" >&2
  fail 95 "the guest did not reach /init (console: $CONSOLE)"
fi
if [ -z "$st" ]; then
  [ "${RXE_QUIET:-0}" = 1 ] && tail -30 "$CONSOLE" >&2
  fail 96 "the guest reported no status: timeout (${TIMEOUT}s) or crash (console: $CONSOLE)"
fi
[ "$st" = 97 ] && fail 96 "the guest could not bring rxe0 up (console: $CONSOLE)"
exit "$st"
