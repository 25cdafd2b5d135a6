//! What ulnet's tests share, so that a test file says only what it tests.
//!
//! - [`topo`]: the routed topology's NIDs;
//! - [`nid`]: a NID from its text (`nid::<Nid>("10.0.0.1@o2ib")`, the type usually inferred);
//! - [`XorShift`], [`noise`]: reproducible pseudo-random numbers and bytes; [`BULK_SWEEP`]: the
//!   sizes a bulk sweep moves;
//! - [`wait_exit`]: a child process's end, bounded;
//! - [`wait_for`]: a condition polled until it holds, bounded by a generous limit ([`WAIT`]), so a
//!   loaded machine makes a test slower, never wrong;
//! - [`Scratch`] and [`TempFile`]: per-test paths under the temp directory, removed when the test
//!   passes;
//! - [`held_port`]: a loopback port nobody else can take, where no peer answers;
//! - [`run_or_skip`], [`root_or_skip`], [`tool_or_skip`], [`find_on_path`], [`notice`]: a test
//!   that needs root or a tool says so when it skips, and fails under `CI` (which provides both);
//! - [`tshark_or_skip`], [`run_tshark`]: the tshark tests' harness;
//! - [`strip_ansi`]: a daemon log without its colours.
//!
//! It depends on no workspace crate (see Cargo.toml): the daemon helpers, which need
//! `router::control` and the `lnet-router` binary cargo builds for router's tests, are in
//! `router/tests/common`, built on these.

use std::fmt::Debug;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The NIDs of the routed topology the routing tests share (unit and process tests alike): a
/// client on o2ib, routers with one NI on o2ib and one on o2ib1, a server on o2ib1.
pub mod topo {
    pub const CLIENT: &str = "10.0.0.1@o2ib";
    pub const SERVER: &str = "10.1.0.2@o2ib1";
    /// The (first) router's NIs.
    pub const R_A: &str = "10.0.0.254@o2ib";
    pub const R_B: &str = "10.1.0.254@o2ib1";
    /// A second router's NIs.
    pub const R2_A: &str = "10.0.0.253@o2ib";
    pub const R2_B: &str = "10.1.0.253@o2ib1";
}

/// The overall limit of a condition wait (a daemon starting, a peer going down, a counter
/// moving): far beyond what any of them takes, so only a condition that never holds reaches it.
pub const WAIT: Duration = Duration::from_secs(30);

/// `s` parsed as a NID (or anything else that parses from text); panics, naming `s`, if it does
/// not. Generic so that lnd's own unit tests (`crate::Nid`) and everyone else (`lnd::Nid`) share
/// it.
#[track_caller]
pub fn nid<N>(s: &str) -> N
where
    N: FromStr,
    N::Err: Debug,
{
    s.parse()
        .unwrap_or_else(|e| panic!("test NID {s:?} does not parse: {e:?}"))
}

/// xorshift64 from a non-zero seed: a fixed pseudo-random sequence, the same every run, so a
/// failing input can be replayed.
#[derive(Clone, Debug)]
pub struct XorShift(pub u64);

impl Iterator for XorShift {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        Some(x)
    }
}

/// `len` bytes of noise: the low byte of each of [`XorShift`]'s numbers from `seed`.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    XorShift(seed).take(len).map(|x| x as u8).collect()
}

/// The bytes a hex string spells (two digits a byte, as the reference vectors are written).
/// Panics on an odd length or a non-hex digit: a vector typed wrong is the test's bug.
pub fn hex(s: &str) -> Vec<u8> {
    assert_eq!(s.len() % 2, 0, "a hex vector has two digits a byte");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The 257 fragments (offset, len) of a 1 MiB buffer that starts 2 KiB into a page: the most
/// an o2iblnd RDMA descriptor carries (IBLND_MAX_RDMA_FRAGS).
pub fn frags_257() -> Vec<(u64, u32)> {
    const MIB: u64 = 1 << 20;
    let mut v = vec![(0u64, 2048u32)];
    let mut off = 2048u64;
    while off + 4096 <= MIB {
        v.push((off, 4096));
        off += 4096;
    }
    v.push((off, (MIB - off) as u32));
    v
}

/// The bulk sizes a rendezvous sweep moves byte for byte: 1 and 7 bytes, each side of
/// o2iblnd's 3976-byte immediate limit, one past 64 KiB (a fragment boundary), an odd size in
/// between, and 1 MiB (LNET_MTU) and just under it.
pub const BULK_SWEEP: [u32; 8] = [1, 7, 3975, 3977, 65_537, 300_001, (1 << 20) - 3, 1 << 20];

/// Polls `cond` every 10 ms until it holds; returns how long that took, or `None` after `bound`.
pub fn wait_for(bound: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        if cond() {
            return Some(t0.elapsed());
        }
        if t0.elapsed() >= bound {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`wait_for`] that fails the test, saying `what`, when `cond` does not hold within `bound`.
#[track_caller]
pub fn wait_until(bound: Duration, what: &str, cond: impl FnMut() -> bool) -> Duration {
    wait_for(bound, cond).unwrap_or_else(|| panic!("{what}: not within {bound:?}"))
}

/// Waits up to `bound` for `child` to exit (polled, as [`wait_for`]); its status, or `None` if it
/// still runs (the caller kills it or fails).
pub fn wait_exit(
    child: &mut std::process::Child,
    bound: Duration,
) -> Option<std::process::ExitStatus> {
    let mut status = None;
    wait_for(bound, || {
        status = child.try_wait().expect("wait for a child");
        status.is_some()
    });
    status
}

/// A per-test scratch directory (`ulnet-<test>-<pid>` in the temp dir, emptied first), removed
/// when the test passes and kept, with the daemons' logs, when it fails.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ulnet-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside the directory.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A file name in the temp dir (`ulnet-<stem>-<pid>-<nanos>.<ext>`), removed on drop; kept, and
/// named on stderr, when the environment variable `keep` is set.
pub struct TempFile {
    pub path: PathBuf,
    keep: &'static str,
}

impl TempFile {
    pub fn new(stem: &str, ext: &str, keep: &'static str) -> TempFile {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("ulnet-{stem}-{}-{nanos}.{ext}", std::process::id());
        TempFile {
            path: std::env::temp_dir().join(name),
            keep,
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if std::env::var_os(self.keep).is_some() {
            notice(&format!(
                "kept {} ({} is set)",
                self.path.display(),
                self.keep
            ));
        } else {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A port held by a listener the test keeps and never accepts on: the address of a peer that
/// is never started. Connects to it complete in the kernel and then hear nothing; no other
/// process can take the port while the listener lives.
pub fn held_port() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// `s` without ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes a line straight to stderr, past the test harness's output capture, so that it shows
/// even when the test passes (a skip, a kept file).
pub fn notice(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The program named by the environment variable `var`, or `name` found executable on `PATH`.
pub fn find_on_path(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether a test whose needs are `met` may run. If they are not, it says `SKIPPED: what` on
/// stderr (past the harness's capture) and returns false, unless `CI` is set, where it fails:
/// CI runs as root and installs the tools its tests need, so a skip there would hide a test
/// that never ran.
pub fn run_or_skip(met: bool, what: &str) -> bool {
    if met {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{what}, and CI is set: CI must provide it"
    );
    notice(&format!("SKIPPED: {what}"));
    false
}

/// Whether a test that needs root may run ([`run_or_skip`]).
pub fn root_or_skip(why: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    run_or_skip(root, &format!("needs root ({why})"))
}

/// Whether `tool --version` runs here ([`run_or_skip`]).
pub fn tool_or_skip(tool: &str, package: &str) -> bool {
    let found = std::process::Command::new(tool)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    run_or_skip(found, &format!("no {tool} here ({package})"))
}

/// `$TSHARK`, or `tshark` on `PATH`; `None` after [`run_or_skip`]'s notice when there is none
/// (and a failure under `CI`, which installs it).
pub fn tshark_or_skip() -> Option<PathBuf> {
    let tshark = find_on_path("TSHARK", "tshark");
    run_or_skip(
        tshark.is_some(),
        "tshark not found (install the tshark package)",
    )
    .then_some(tshark)
    .flatten()
}

/// What `tshark` prints for `capture` read with `args` (its output format and fields): numeric
/// addresses, IP checksums checked, times in UTC and the C locale, so that the text does not
/// depend on the machine. Panics with tshark's stderr if it fails.
pub fn run_tshark(tshark: &Path, capture: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(tshark)
        .arg("-n") // no name resolution: addresses stay numeric
        .args(["-o", "ip.check_checksum:TRUE"])
        .arg("-r")
        .arg(capture)
        .args(args)
        .env("TZ", "UTC")
        .env("LC_ALL", "C")
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nid_parses_and_names_what_does_not() {
        let n: std::net::Ipv4Addr = nid("10.0.0.1");
        assert_eq!(n.octets(), [10, 0, 0, 1]);
        let e = std::panic::catch_unwind(|| nid::<u64>("x@o2ib")).unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(msg.contains("\"x@o2ib\""), "{msg}");
    }

    #[test]
    fn wait_for_ends_when_the_condition_holds() {
        let mut n = 0;
        assert!(wait_for(WAIT, || {
            n += 1;
            n == 3
        })
        .is_some());
        assert_eq!(n, 3);
        assert_eq!(wait_for(Duration::ZERO, || false), None);
    }

    #[test]
    fn wait_exit_sees_the_end_or_gives_up() {
        let mut c = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .unwrap();
        assert_eq!(wait_exit(&mut c, WAIT).and_then(|s| s.code()), Some(3));
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(wait_exit(&mut c, Duration::from_millis(50)), None);
        c.kill().unwrap();
        c.wait().unwrap();
    }

    #[test]
    fn scratch_goes_when_the_test_passes() {
        let s = Scratch::new("testkit-scratch");
        std::fs::write(s.join("f"), b"x").unwrap();
        let p = s.path().to_path_buf();
        drop(s);
        assert!(!p.exists());
    }

    #[test]
    fn noise_is_the_same_every_run() {
        assert_eq!(noise(1, 4), noise(1, 4));
        assert_ne!(noise(1, 64), noise(2, 64));
        assert_eq!(XorShift(1).next(), Some(0x4082_2041));
    }

    #[test]
    fn frags_257_cover_a_mebibyte() {
        let f = frags_257();
        assert_eq!(f.len(), 257);
        assert_eq!(f.iter().map(|&(_, l)| u64::from(l)).sum::<u64>(), 1 << 20);
        assert!(f.windows(2).all(|w| w[0].0 + u64::from(w[0].1) == w[1].0));
    }

    #[test]
    fn strip_ansi_drops_colour_codes() {
        assert_eq!(strip_ansi("\u{1b}[2mINFO\u{1b}[0m up"), "INFO up");
    }
}
