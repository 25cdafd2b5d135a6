//! Helpers shared by the process-level tests: `lnet-router` daemons on loopback, each a guarded
//! child process (SIGKILLed and reaped on drop, its log printed when the test fails), bounded
//! control calls, poll loops with deadlines, and the `lnetctl` binary.
//!
//! Every daemon runs with small LND tunables by default (`timeout: 2`, `keepalive: 1`, seconds)
//! and `LNET_LOG=debug`, its stderr in a log file.
//!
//! Ports: a daemon listens on a port the OS assigns (`listen: 127.0.0.1:0`), and the test reads
//! it back from `net show -v` ([`start_on_any_port`]); only a restart binds a known port again,
//! the one its previous instance had. A peer address no daemon ever listens on is a port the
//! test holds ([`held_port`]). No port is bound, released and then bound by someone else.
//!
//! Waits: every wait is a condition polled until it holds, bounded by a generous overall limit
//! ([`WAIT`]): a condition that holds ends the wait at once, so the limit only decides how long
//! a failing test takes, and a loaded machine does not fail a test whose condition would hold.
//! Where a test's point is a time bound the daemon guarantees, it is measured from the daemons'
//! own log timestamps ([`log_time`]), not by the test's clock.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use router::control::{
    ConnEntry, ControlClient, LndCounters, NiEntry, PingShow, Request, Response,
};
// The generic helpers (NIDs, condition waits, scratch directories, ports, skips) are the
// workspace's `testkit`; the process tests reach them through this module.
#[allow(unused_imports)] // each test binary uses its own few
pub use testkit::{
    find_on_path, held_port, nid, noise, notice, root_or_skip, run_or_skip, strip_ansi,
    tool_or_skip, wait_for, wait_until, Scratch, WAIT,
};

pub const NID_A: &str = "10.0.0.1@o2ib";
pub const NID_B: &str = "10.0.0.2@o2ib";
/// `lnd tunables: timeout` of both daemons, seconds.
pub const LND_TIMEOUT: u64 = 2;
/// `lnd tunables: keepalive` of both daemons, seconds.
pub const LND_KEEPALIVE: u64 = 1;
/// How long a control call that is not a ping may take before the test calls it a hang.
pub const CALL_BOUND: Duration = Duration::from_secs(20);

/// One daemon process. Dropping it SIGKILLs and reaps the process (a stopped one too) and, when
/// the test is failing, prints the tail of its log.
pub struct Daemon {
    pub name: String,
    pub child: Child,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// The process ended and was reaped.
    pub exited: Option<ExitStatus>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            // Without ANSI colours and without the test's own control requests.
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let text = strip_ansi(&text);
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.contains("control request"))
                .collect();
            let from = lines.len().saturating_sub(80);
            eprintln!(
                "----- {} log ({}), last {} lines -----",
                self.name,
                self.log.display(),
                lines.len() - from
            );
            for l in &lines[from..] {
                eprintln!("{l}");
            }
        }
    }
}

impl Daemon {
    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Sends a signal with kill(1) (`-KILL`, `-STOP`, `-CONT`, `-TERM`).
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.pid()])
            .status()
            .unwrap();
        assert!(st.success(), "kill {sig} {} failed", self.pid());
    }

    /// Waits up to `bound` for the process to exit.
    pub fn wait_exit(&mut self, bound: Duration) -> ExitStatus {
        let s = testkit::wait_exit(&mut self.child, bound)
            .unwrap_or_else(|| panic!("{} did not exit within {bound:?}", self.name));
        self.exited = Some(s);
        s
    }
}

/// Writes `name.yaml` (one tcp NI `nid` on 127.0.0.1:`port`, the peer at 127.0.0.1:`peer_port`,
/// the small LND tunables) and starts the daemon; returns once its control socket answers.
pub fn start(dir: &Path, name: &str, nid: &str, port: u16, peer: &str, peer_port: u16) -> Daemon {
    start_opts(dir, name, nid, port, peer, peer_port, Opts::default())
}

/// How [`start_opts`] starts a daemon, beyond its NI and peer.
#[derive(Clone, Debug, Default)]
pub struct Opts {
    pub lnd: Lnd,
    /// Extra command-line arguments.
    pub args: Vec<String>,
    /// Start the daemon with this umask (through `sh -c 'umask ..; exec ..'`).
    pub umask: Option<u32>,
    /// The control socket [default: `dir/name.sock`].
    pub socket: Option<PathBuf>,
    /// Extra YAML lines for the NI, each indented 10 spaces (e.g. `tunables:` or ulnet's keys).
    pub ni_yaml: String,
    /// The daemon's RLIMIT_NOFILE (set by `sh -c 'ulimit -n N; exec ...'`: same process id).
    pub nofile: Option<u32>,
    /// Run the daemon in this network namespace (`ip netns exec NS ...`, which execs: same
    /// process id). Needs root.
    pub netns: Option<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// A command that runs the daemon (its arguments follow) by exec, so the child stays the
    /// daemon itself (same pid): e.g. `setpriv --bounding-set=...`.
    pub wrap: Vec<String>,
}

/// [`start`] with [`Opts`].
pub fn start_opts(
    dir: &Path,
    name: &str,
    nid: &str,
    port: u16,
    peer: &str,
    peer_port: u16,
    opts: Opts,
) -> Daemon {
    let yaml = one_ni_yaml(nid, port, Some((peer, peer_port)), &opts);
    start_yaml(dir, name, &yaml, opts)
}

/// One tcp NI `nid` on 127.0.0.1:`port` with [`Opts`]'s tunables and NI lines, and the peer
/// `(nid, port)` on 127.0.0.1 if any.
pub fn one_ni_yaml(nid: &str, port: u16, peer: Option<(&str, u16)>, opts: &Opts) -> String {
    let Lnd { timeout, keepalive } = opts.lnd;
    let mut yaml = format!(
        "net:\n    - net type: o2ib\n      fabric: tcp\n      local NI(s):\n        - nid: {nid}\n          listen: 127.0.0.1:{port}\n{}          lnd tunables:\n              timeout: {timeout}\n              keepalive: {keepalive}\n",
        opts.ni_yaml
    );
    if let Some((peer, peer_port)) = peer {
        yaml.push_str(&format!(
            "peers:\n    - nid: {peer}\n      address: 127.0.0.1:{peer_port}\n"
        ));
    }
    yaml
}

/// Starts a daemon whose one NI `nid` listens on a port the OS assigns (`listen: 127.0.0.1:0`),
/// knowing the peer `(nid, port)` if any; returns it with the port it listens on (read back
/// from `net show -v`, and checked against the "NI up" line of its log).
pub fn start_on_any_port(
    dir: &Path,
    name: &str,
    nid: &str,
    peer: Option<(&str, u16)>,
    opts: Opts,
) -> (Daemon, u16) {
    let yaml = one_ni_yaml(nid, 0, peer, &opts);
    let d = start_yaml(dir, name, &yaml, opts);
    let port = listen_port(&d, nid);
    (d, port)
}

/// The port `d`'s NI `nid` listens on: `listen` of its `ulnet:` settings in `net show -v`, which
/// its log's "NI up" line must name too.
pub fn listen_port(d: &Daemon, nid: &str) -> u16 {
    let ni = ni_entry(d, nid);
    let listen = ni
        .ulnet
        .as_ref()
        .and_then(|u| u.listen.clone())
        .unwrap_or_else(|| panic!("{}: net show -v without ulnet listen: {ni:?}", d.name));
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    assert_ne!(addr.port(), 0, "{}: listen {listen}", d.name);
    let log = strip_ansi(&std::fs::read_to_string(&d.log).unwrap_or_default());
    assert!(
        log.lines()
            .any(|l| l.contains("NI up") && l.contains(&format!("nid={nid} listen={listen}"))),
        "{}: no \"NI up nid={nid} listen={listen}\" in the log",
        d.name
    );
    addr.port()
}

/// Runs `lnet-router args...` to its end (`--version`, a usage error); its output.
pub fn lnet_router(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lnet-router"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs `lnet-router --config cfg --socket socket args...` to its end (a start it refuses), with
/// `LNET_LOG` set to `log` if given; its output.
pub fn run_to_exit(cfg: &Path, socket: &Path, args: &[&str], log: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lnet-router"));
    cmd.arg("--config")
        .arg(cfg)
        .arg("--socket")
        .arg(socket)
        .args(args);
    if let Some(log) = log {
        cmd.env("LNET_LOG", log);
    }
    cmd.output().unwrap()
}

/// A daemon started with `--no-nis` and an empty configuration (lnet.service's start on a
/// node that `lnetctl import` or `net add` configures afterwards).
pub fn start_without_nis(dir: &Path, name: &str) -> Daemon {
    let opts = Opts {
        args: vec!["--no-nis".into()],
        ..Opts::default()
    };
    start_yaml(dir, name, "", opts)
}

/// Starts a daemon on the configuration `yaml` (written to `dir/name.yaml`), with [`Opts`]
/// (its `lnd` and `ni_yaml` are not used: the configuration is whole).
pub fn start_yaml(dir: &Path, name: &str, yaml: &str, opts: Opts) -> Daemon {
    let cfg = dir.join(format!("{name}.yaml"));
    std::fs::write(&cfg, yaml).unwrap();
    let socket = opts
        .socket
        .clone()
        .unwrap_or_else(|| dir.join(format!("{name}.sock")));
    let _ = std::fs::remove_file(&socket);
    // One log per incarnation: a restarted daemon appends to its predecessor's file.
    let log = dir.join(format!("{name}.log"));
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    let bin = env!("CARGO_BIN_EXE_lnet-router");
    // Through `sh -c '...; exec'` when the umask or the descriptor limit differ: the child stays
    // the daemon itself (same pid), so the guard kills the daemon.
    let mut prelude = Vec::new();
    if let Some(m) = opts.umask {
        prelude.push(format!("umask {m:03o}"));
    }
    if let Some(n) = opts.nofile {
        prelude.push(format!("ulimit -n {n}"));
    }
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if let Some(ns) = &opts.netns {
        argv.extend(["ip", "netns", "exec", ns].map(Into::into));
    }
    argv.extend(opts.wrap.iter().map(Into::into));
    if !prelude.is_empty() {
        argv.push("sh".into());
        argv.push("-c".into());
        argv.push(format!("{} && exec \"$0\" \"$@\"", prelude.join(" && ")).into());
    }
    argv.push(bin.into());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    let child = cmd
        .args(&opts.args)
        .arg("--config")
        .arg(&cfg)
        .arg("--socket")
        .arg(&socket)
        .env(
            "LNET_LOG",
            std::env::var("LNET_LOG").unwrap_or_else(|_| "debug".into()),
        )
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut d = Daemon {
        name: name.into(),
        child,
        socket,
        log,
        exited: None,
    };
    let t0 = Instant::now();
    loop {
        if d.socket.exists() && ControlClient::connect(&d.socket).is_ok() {
            return d;
        }
        if let Some(s) = d.child.try_wait().unwrap() {
            d.exited = Some(s);
            panic!("{name} exited at start: {s}");
        }
        assert!(t0.elapsed() < WAIT, "{name} did not start within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One control call, bounded: a daemon that does not answer within `bound` fails the test
/// instead of hanging it (the blocked reader thread is released when the guard kills the daemon).
pub fn call_within(d: &Daemon, req: Request, bound: Duration) -> Response {
    let socket = d.socket.clone();
    let (tx, rx) = mpsc::channel();
    let what = format!("{req:?}");
    std::thread::spawn(move || {
        let r = ControlClient::connect(&socket).and_then(|mut c| c.call(&req));
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    match rx.recv_timeout(bound) {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => panic!("{}: {what}: {e}", d.name),
        Err(_) => panic!("{}: {what}: no answer within {bound:?}", d.name),
    }
}

pub fn call(d: &Daemon, req: Request) -> Response {
    call_within(d, req, CALL_BOUND)
}

/// Pings `nid` from `d` with `timeout_secs`; the answer must come within that plus a generous
/// margin (a ping that never answers fails the test instead of hanging it).
pub fn ping(d: &Daemon, nid: &str, timeout_secs: u64) -> PingShow {
    let resp = call_within(
        d,
        Request::Ping {
            nids: vec![nid.into()],
            timeout_secs: Some(timeout_secs),
            source: None,
        },
        Duration::from_secs(timeout_secs) + CALL_BOUND,
    );
    match resp {
        Response::Ping(p) => p,
        other => panic!("{}: ping {nid}: {other:?}", d.name),
    }
}

/// Pings `nid` until it answers, for at most `bound`; returns how many attempts failed first.
pub fn ping_until_ok(d: &Daemon, nid: &str, bound: Duration) -> usize {
    let t0 = Instant::now();
    let mut failures = Vec::new();
    loop {
        let p = ping(d, nid, 2);
        if p.manage.is_empty() && p.ping.len() == 1 {
            assert_eq!(p.ping[0].primary_nid, nid, "{p:?}");
            return failures.len();
        }
        failures.push(p);
        assert!(
            t0.elapsed() < bound,
            "{}: ping {nid} kept failing for {bound:?}: {failures:?}",
            d.name
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The peer's state in `peer show --nid` (`None`: no such peer).
pub fn peer_state(d: &Daemon, nid: &str) -> Option<String> {
    match call(
        d,
        Request::PeerShow {
            nid: Some(nid.into()),
            verbose: false,
        },
    ) {
        Response::Peer(p) => Some(p.peer[0].peer_ni[0].state.clone()),
        Response::Error(_) => None,
        other => panic!("{}: peer show: {other:?}", d.name),
    }
}

/// `conn show`, every connection.
pub fn conns(d: &Daemon) -> Vec<ConnEntry> {
    match call(d, Request::ConnShow) {
        Response::Conn(c) => c.conn,
        other => panic!("{}: conn show: {other:?}", d.name),
    }
}

/// `conn show`: the incarnations of the connections (a reconnect changes them).
pub fn incarnations(d: &Daemon) -> Vec<String> {
    conns(d).into_iter().map(|c| c.incarnation).collect()
}

/// `conn show`, the connections to `nid`.
pub fn conns_to(d: &Daemon, nid: &str) -> Vec<ConnEntry> {
    conns(d).into_iter().filter(|c| c.peer == nid).collect()
}

/// B is down as A sees it: `peer show` says down, or no connection to B is left.
pub fn a_sees_b_down(a: &Daemon) -> bool {
    peer_state(a, NID_B).as_deref() == Some("down") || conns_to(a, NID_B).is_empty()
}

pub struct Pair {
    // Field order: the daemons are killed before the scratch directory goes.
    pub a: Daemon,
    pub b: Daemon,
    pub pb: u16,
    pub pa: u16,
    pub dir: Scratch,
}

/// A and B started, A has pinged B, and A holds one established connection to B.
///
/// Each listens on a port the OS assigned. B starts first, knowing no address of A: A connects
/// to it (A pings B), and B answers over that connection. A restarted B is given both ports
/// (its own again, and A's).
pub fn connected_pair(test: &str) -> Pair {
    connected_pair_with(test, Lnd::default())
}

/// [`connected_pair`] with other LND tunables on both daemons.
pub fn connected_pair_with(test: &str, lnd: Lnd) -> Pair {
    let dir = Scratch::new(test);
    let opts = || Opts {
        lnd,
        ..Opts::default()
    };
    let (b, pb) = start_on_any_port(&dir.0, "b", NID_B, None, opts());
    let (a, pa) = start_on_any_port(&dir.0, "a", NID_A, Some((NID_B, pb)), opts());
    let pair = Pair { a, b, pa, pb, dir };
    ping_until_ok(&pair.a, NID_B, WAIT);
    assert_eq!(
        peer_state(&pair.a, NID_B).as_deref(),
        Some("up"),
        "after a ping"
    );
    let c = conns_to(&pair.a, NID_B);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].state, "Established", "{c:?}");
    pair
}

/// [`connected_pair`], but A has a second NI (`10.0.1.1@o2ib1`, on a port the OS assigns,
/// talking to nobody): LNet health judges the NIs of a node with two NIs or more only (Lustre
/// 2.16's lnet_health_check), so tests of local NI health need it. B takes 4 peer credits
/// where A's LNet gives 8: their connection's queue depth is B's, so when B stops returning
/// credits, some of A's messages always wait in A's LND queue (and time out there), whatever
/// credits A owed B at that moment.
pub fn connected_pair_two_nis(test: &str) -> Pair {
    let dir = Scratch::new(test);
    let b_opts = Opts {
        ni_yaml: "          tunables:\n              peer_credits: 4\n".into(),
        ..Opts::default()
    };
    let (b, pb) = start_on_any_port(&dir.0, "b", NID_B, None, b_opts);
    let Lnd { timeout, keepalive } = Lnd::default();
    let yaml = format!(
        "net:\n    - net type: o2ib\n      fabric: tcp\n      local NI(s):\n        - nid: {NID_A}\n          listen: 127.0.0.1:0\n          lnd tunables:\n              timeout: {timeout}\n              keepalive: {keepalive}\n\
         \n    - net type: o2ib1\n      fabric: tcp\n      local NI(s):\n        - nid: 10.0.1.1@o2ib1\n          listen: 127.0.0.1:0\n\
         peers:\n    - nid: {NID_B}\n      address: 127.0.0.1:{pb}\n"
    );
    let a = start_yaml(&dir.0, "a", &yaml, Opts::default());
    let pa = listen_port(&a, NID_A);
    let pair = Pair { a, b, pa, pb, dir };
    ping_until_ok(&pair.a, NID_B, WAIT);
    let c = conns_to(&pair.a, NID_B);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].queue_depth, 4, "B's queue depth: {c:?}");
    pair
}

/// A field of `/proc/PID/status` as a number (`VmRSS` in kB, `Threads`).
pub fn proc_status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The LND tunables a daemon is started with, seconds.
#[derive(Copy, Clone, Debug)]
pub struct Lnd {
    pub timeout: u64,
    pub keepalive: u64,
}

impl Default for Lnd {
    fn default() -> Lnd {
        Lnd {
            timeout: LND_TIMEOUT,
            keepalive: LND_KEEPALIVE,
        }
    }
}

/// The `lnetctl` binary, built next to `lnet-router` (`cargo test` at the workspace root, or
/// `cargo test -p router -p lnetctl`, builds both).
pub fn lnetctl_bin() -> PathBuf {
    let router = Path::new(env!("CARGO_BIN_EXE_lnet-router"));
    let p = router.with_file_name("lnetctl");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p lnetctl` (or run `cargo test -p router \
         -p lnetctl`), these tests drive the real lnetctl",
        p.display()
    );
    p
}

/// An lnetctl run's exit status, standard output and standard error.
pub fn out(o: &std::process::Output) -> (Option<i32>, String, String) {
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Pings `nid` `count` times at once from `d` (each with `timeout_secs`), on a thread of its
/// own: the test watches the daemon meanwhile, then joins for the answer.
pub fn ping_in_background(
    d: &Daemon,
    nid: &str,
    count: usize,
    timeout_secs: u64,
) -> std::thread::JoinHandle<Result<Response, router::control::ClientError>> {
    let socket = d.socket.clone();
    let nids = vec![nid.to_string(); count];
    std::thread::spawn(move || {
        ControlClient::connect(&socket)?.call(&Request::Ping {
            nids,
            timeout_secs: Some(timeout_secs),
            source: None,
        })
    })
}

/// `lnetctl --socket <d's socket> args...`, with its output.
pub fn lnetctl(d: &Daemon, args: &[&str]) -> std::process::Output {
    lnetctl_cmd(d).args(args).output().expect("run lnetctl")
}

/// `lnetctl --socket <d's socket>` with its stdout and stderr piped, for a test that starts it
/// (adding its arguments), watches the daemon meanwhile and then reads what it printed.
pub fn lnetctl_cmd(d: &Daemon) -> Command {
    let mut c = Command::new(lnetctl_bin());
    c.arg("--socket")
        .arg(&d.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `net show -v`: the entry of `d`'s NI `nid`.
pub fn ni_entry(d: &Daemon, nid: &str) -> NiEntry {
    match call(d, Request::NetShow { verbose: true }) {
        Response::Net(n) => n
            .net
            .into_iter()
            .flat_map(|n| n.local_nis)
            .find(|ni| ni.nid == nid)
            .unwrap_or_else(|| panic!("{}: no NI {nid}", d.name)),
        other => panic!("{}: net show: {other:?}", d.name),
    }
}

/// The LND counters of `d`'s NI `nid` (`net show -v`, `lnd statistics`).
pub fn lnd_counters(d: &Daemon, nid: &str) -> LndCounters {
    ni_entry(d, nid)
        .lnd_statistics
        .unwrap_or_else(|| panic!("{}: net show -v without lnd statistics", d.name))
}

/// One fabric counter of `d`'s NI `nid` (`net show -v`, `fabric`).
pub fn fabric_counter(d: &Daemon, nid: &str, name: &str) -> u64 {
    let f = ni_entry(d, nid)
        .fabric
        .unwrap_or_else(|| panic!("{}: net show -v without fabric counters", d.name));
    f.counters
        .get(name)
        .unwrap_or_else(|| panic!("{}: no fabric counter {name}: {f:?}", d.name))
}

/// The lines of `d`'s log, without ANSI colours.
pub fn log_lines(d: &Daemon) -> Vec<String> {
    strip_ansi(&std::fs::read_to_string(&d.log).unwrap_or_default())
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The timestamp that starts a log line (`2026-12-02T22:23:44.330919Z ...`, UTC), in seconds
/// since the Unix epoch: the daemon's own clock, which a slow test harness does not inflate.
pub fn log_time(line: &str) -> Option<f64> {
    let ts = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    let sec = t.next()?.parse::<f64>().ok()?;
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec)
}

/// The time of the first line of `d`'s log at or after `from` (seconds, [`log_time`]) that
/// contains every one of `pats`.
pub fn log_time_of(d: &Daemon, from: f64, pats: &[&str]) -> Option<f64> {
    log_lines(d).iter().find_map(|l| {
        let t = log_time(l)?;
        (t >= from && pats.iter().all(|p| l.contains(p))).then_some(t)
    })
}

/// The names of the daemon's threads (`comm`, at most 15 bytes each).
pub fn thread_names(d: &Daemon) -> Vec<String> {
    let dir = format!("/proc/{}/task", d.pid());
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                .map(|s| s.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The daemons of a routed test on loopback. Every NID of `all` listens on its own 127.a.b.c and
/// `port` (a: `a`, the test file's base plus the test's number; b from this process's id; c the
/// NID's place in `all`), so every daemon knows the others' addresses before any starts, and a
/// restarted one binds its own again. Nothing else uses those addresses.
pub struct Site {
    pub all: &'static [&'static str],
    pub port: u16,
    pub a: u8,
    /// Each NI listens on its NID's own address instead (the test across network namespaces).
    pub nid_addresses: bool,
    /// YAML after `routing:` (buffers, selftest), given whether the daemon routes.
    pub extra: fn(bool) -> String,
}

impl Site {
    /// The NIDs `all` on their own loopback addresses, `port`, 127.`a`, with `extra` YAML.
    pub fn loopback(
        all: &'static [&'static str],
        port: u16,
        a: u8,
        extra: fn(bool) -> String,
    ) -> Site {
        Site {
            all,
            port,
            a,
            nid_addresses: false,
            extra,
        }
    }

    /// Where `nid` listens.
    pub fn address(&self, nid: &str) -> String {
        let port = self.port;
        if self.nid_addresses {
            return format!("{}:{port}", nid.split('@').next().unwrap());
        }
        let b = (std::process::id() % 250) as u8 + 1;
        let host = self.all.iter().position(|n| *n == nid).unwrap() as u8 + 1;
        format!("127.{}.{b}.{host}:{port}", self.a)
    }

    /// A daemon's YAML: its NIs, its routes (net, gateway), routing on or off, the health
    /// settings small, the LND's tunables small, [`Site::extra`], and every other NID's address.
    pub fn yaml(&self, nis: &[&str], routes: &[(&str, &str)], routing: bool) -> String {
        let mut y = String::from("net:\n");
        for ni in nis {
            let net = ni.split('@').nth(1).unwrap();
            y.push_str(&format!(
                "    - net type: {net}\n      fabric: tcp\n      local NI(s):\n        - nid: {ni}\n          listen: {}\n          busy poll us: 0\n          lnd tunables:\n              timeout: {LND_TIMEOUT}\n              keepalive: {LND_KEEPALIVE}\n",
                self.address(ni)
            ));
        }
        if !routes.is_empty() {
            y.push_str("route:\n");
            for (net, gw) in routes {
                y.push_str(&format!(
                    "    - net: {net}\n      gateway: {gw}\n      hop: 1\n"
                ));
            }
        }
        y.push_str(&format!(
            "routing:\n    enable: {}\n    alive_router_check_interval: 1\n    router_ping_timeout: 1\n",
            u8::from(routing)
        ));
        y.push_str(&(self.extra)(routing));
        y.push_str("peers:\n");
        for n in self.all {
            if !nis.contains(n) {
                y.push_str(&format!(
                    "    - nid: {n}\n      address: {}\n",
                    self.address(n)
                ));
            }
        }
        y
    }

    /// Starts daemon `name` on [`Site::yaml`] with the default [`Opts`].
    pub fn start(
        &self,
        dir: &Path,
        name: &str,
        nis: &[&str],
        routes: &[(&str, &str)],
        routing: bool,
    ) -> Daemon {
        start_yaml(dir, name, &self.yaml(nis, routes, routing), Opts::default())
    }
}

/// The routed pair's NIDs: the client on o2ib, the router's two NIs, the far server on o2ib1.
pub use testkit::topo::{CLIENT, R_A, R_B, SERVER as FAR};

impl Site {
    /// The two ends of a routed pair, started in this order: the far server (routing o2ib
    /// through [`R_B`]) and the client (routing o2ib1 through [`R_A`]).
    pub fn start_ends(&self, dir: &Path) -> (Daemon, Daemon) {
        let far = self.start(dir, "far", &[FAR], &[("o2ib", R_B)], false);
        let client = self.start(dir, "client", &[CLIENT], &[("o2ib1", R_A)], false);
        (far, client)
    }
}

/// `lnetctl --json selftest run-test --from FROM --to TO args...` on `d`, with its output.
pub fn run_test(d: &Daemon, from: &str, to: &str, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--json"];
    all.extend(run_test_args(from, to, args));
    lnetctl(d, &all)
}

/// [`run_test`] of the bulk check the tests share: `--concurrency UNITS --loop LOOPS brw write
/// size=1M check=full` (every word of every 1 MiB checked).
pub fn brw_write_1m(d: &Daemon, from: &str, to: &str, units: u32, loops: u32) -> Output {
    let (c, l) = (units.to_string(), loops.to_string());
    let args = [
        "--concurrency",
        &c,
        "--loop",
        &l,
        "brw",
        "write",
        "size=1M",
        "check=full",
    ];
    run_test(d, from, to, &args)
}

/// lnetctl's arguments `selftest run-test --from FROM --to TO args...`.
pub fn run_test_args<'a>(from: &'a str, to: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["selftest", "run-test", "--from", from, "--to", to];
    all.extend_from_slice(args);
    all
}

/// The string `key` of each item of the JSON list `list`.
pub fn json_strs<'a>(list: &'a serde_json::Value, key: &str) -> Vec<&'a str> {
    let items = list
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"));
    items.iter().map(|p| p[key].as_str().unwrap()).collect()
}

/// The JSON summary `run-test --json` prints after lst's report.
pub fn json_summary(stdout: &str) -> serde_json::Value {
    let json_start = stdout.find("{\n").expect("a JSON summary");
    serde_json::from_str(&stdout[json_start..]).expect("JSON")
}

/// `lnetctl --socket <d's socket> args...`, which must succeed; its standard output.
pub fn lnetctl_ok(d: &Daemon, args: &[&str]) -> String {
    let out = lnetctl(d, args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "lnetctl {args:?}: {:?}\nstdout: {text}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
