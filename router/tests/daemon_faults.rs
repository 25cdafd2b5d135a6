//! Process-level faults between two `lnet-router` daemons on loopback: a peer killed with
//! SIGKILL, a peer frozen with SIGSTOP, a peer restarted (new incarnation), and a graceful stop.
//!
//! Every daemon runs with small LND tunables (`timeout: 2`, `keepalive: 1`, seconds) and
//! `LNET_LOG=debug`, its stderr in a log file that is printed when a test fails. Every process a
//! test starts is SIGKILLed by a guard's `Drop` (also on panic), every control call runs under a
//! deadline, and every wait is a poll loop with a deadline of a few seconds.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use router::control::{ConnEntry, ControlClient, PingShow, Request, Response};

const NID_A: &str = "10.0.0.1@o2ib";
const NID_B: &str = "10.0.0.2@o2ib";
/// `lnd tunables: timeout` of both daemons, seconds.
const LND_TIMEOUT: u64 = 2;
/// `lnd tunables: keepalive` of both daemons, seconds.
const LND_KEEPALIVE: u64 = 1;
/// How long a control call that is not a ping may take.
const CALL_BOUND: Duration = Duration::from_secs(5);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A per-test scratch directory, removed when the test passes (kept with the logs otherwise).
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("ulnet-daemon-faults-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// One daemon process. Dropping it SIGKILLs and reaps the process (a stopped one too) and, when
/// the test is failing, prints the tail of its log.
struct Daemon {
    name: String,
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    /// The process ended and was reaped.
    exited: Option<ExitStatus>,
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

/// `s` without ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(s: &str) -> String {
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

impl Daemon {
    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Sends a signal with kill(1) (`-KILL`, `-STOP`, `-CONT`, `-TERM`).
    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.pid()])
            .status()
            .unwrap();
        assert!(st.success(), "kill {sig} {} failed", self.pid());
    }

    /// Waits up to `bound` for the process to exit.
    fn wait_exit(&mut self, bound: Duration) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                self.exited = Some(s);
                return s;
            }
            assert!(
                t0.elapsed() < bound,
                "{} did not exit within {bound:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Writes `name.yaml` (one tcp NI `nid` on 127.0.0.1:`port`, the peer at 127.0.0.1:`peer_port`,
/// the small LND tunables) and starts the daemon; returns once its control socket answers.
fn start(dir: &Path, name: &str, nid: &str, port: u16, peer: &str, peer_port: u16) -> Daemon {
    let cfg = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &cfg,
        format!(
            "net:\n    - net type: o2ib\n      fabric: tcp\n      local NI(s):\n        - nid: {nid}\n          listen: 127.0.0.1:{port}\n          lnd tunables:\n              timeout: {LND_TIMEOUT}\n              keepalive: {LND_KEEPALIVE}\npeers:\n    - nid: {peer}\n      address: 127.0.0.1:{peer_port}\n"
        ),
    )
    .unwrap();
    let socket = dir.join(format!("{name}.sock"));
    let _ = std::fs::remove_file(&socket);
    // One log per incarnation: a restarted daemon appends to its predecessor's file.
    let log = dir.join(format!("{name}.log"));
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_lnet-router"))
        .arg("--config")
        .arg(&cfg)
        .arg("--socket")
        .arg(&socket)
        .env(
            "LNET_LOG",
            std::env::var("LNET_LOG").unwrap_or_else(|_| "debug".into()),
        )
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
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{name} did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One control call, bounded: a daemon that does not answer within `bound` fails the test
/// instead of hanging it (the blocked reader thread is released when the guard kills the daemon).
fn call_within(d: &Daemon, req: Request, bound: Duration) -> Response {
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

fn call(d: &Daemon, req: Request) -> Response {
    call_within(d, req, CALL_BOUND)
}

/// Pings `nid` from `d` with `timeout_secs`; the answer must come within that plus a margin.
fn ping(d: &Daemon, nid: &str, timeout_secs: u64) -> PingShow {
    let resp = call_within(
        d,
        Request::Ping {
            nids: vec![nid.into()],
            timeout_secs: Some(timeout_secs),
            source: None,
        },
        Duration::from_secs(timeout_secs + 3),
    );
    match resp {
        Response::Ping(p) => p,
        other => panic!("{}: ping {nid}: {other:?}", d.name),
    }
}

/// Pings `nid` until it answers, for at most `bound`; returns how many attempts failed first.
fn ping_until_ok(d: &Daemon, nid: &str, bound: Duration) -> usize {
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
fn peer_state(d: &Daemon, nid: &str) -> Option<String> {
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
fn conns(d: &Daemon) -> Vec<ConnEntry> {
    match call(d, Request::ConnShow) {
        Response::Conn(c) => c.conn,
        other => panic!("{}: conn show: {other:?}", d.name),
    }
}

/// `conn show`, the connections to `nid`.
fn conns_to(d: &Daemon, nid: &str) -> Vec<ConnEntry> {
    conns(d).into_iter().filter(|c| c.peer == nid).collect()
}

/// Polls `cond` every 10 ms until it holds; returns how long that took, or `None` after `bound`.
fn wait_for(bound: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
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

/// B is down as A sees it: `peer show` says down, or no connection to B is left.
fn a_sees_b_down(a: &Daemon) -> bool {
    peer_state(a, NID_B).as_deref() == Some("down") || conns_to(a, NID_B).is_empty()
}

struct Pair {
    // Field order: the daemons are killed before the scratch directory goes.
    a: Daemon,
    b: Daemon,
    pb: u16,
    pa: u16,
    dir: Scratch,
}

/// A and B started, A has pinged B, and A holds one established connection to B.
fn connected_pair(test: &str) -> Pair {
    let dir = Scratch::new(test);
    let (pa, pb) = (free_port(), free_port());
    let a = start(&dir.0, "a", NID_A, pa, NID_B, pb);
    let b = start(&dir.0, "b", NID_B, pb, NID_A, pa);
    let pair = Pair { a, b, pa, pb, dir };
    ping_until_ok(&pair.a, NID_B, Duration::from_secs(5));
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

#[test]
fn kill_9_peer_is_marked_down_quickly() {
    let mut p = connected_pair("kill9");
    p.b.signal("-KILL");
    let _ = p.b.wait_exit(Duration::from_secs(5));

    let took = wait_for(Duration::from_secs(2), || a_sees_b_down(&p.a));
    assert!(
        took.is_some(),
        "2 s after B's SIGKILL A still sees B up: peer {:?}, conns {:?}",
        peer_state(&p.a, NID_B),
        conns_to(&p.a, NID_B)
    );

    // A ping now fails with an error, within its timeout (not a hang).
    let t0 = Instant::now();
    let r = ping(&p.a, NID_B, LND_TIMEOUT);
    let elapsed = t0.elapsed();
    assert!(r.ping.is_empty(), "a ping of a dead peer answered: {r:?}");
    assert_eq!(r.manage.len(), 1, "{r:?}");
    assert!(r.manage[0].errno < 0, "{r:?}");
    assert!(
        elapsed < Duration::from_secs(LND_TIMEOUT) + Duration::from_millis(1500),
        "the failed ping took {elapsed:?}: {r:?}"
    );
}

#[test]
fn frozen_peer_declared_down_within_keepalive_plus_timeout() {
    let p = connected_pair("frozen");
    p.b.signal("-STOP");
    let bound = Duration::from_secs(LND_KEEPALIVE + LND_TIMEOUT) + Duration::from_millis(1500);
    let took = wait_for(bound, || a_sees_b_down(&p.a));
    let (state, c) = (peer_state(&p.a, NID_B), conns_to(&p.a, NID_B));
    // Cleanup: let B run again before the guard kills it (SIGKILL works on a stopped process
    // too; SIGCONT only keeps the log honest).
    p.b.signal("-CONT");
    assert!(
        took.is_some(),
        "{bound:?} after B's SIGSTOP A still sees B up: peer {state:?}, conns {c:?}"
    );
}

#[test]
/// On the tcp fabric a graceful stop (and even a crash) closes B's sockets, so A usually drops the
/// old connection (peer down, reason Closed) before B's new incarnation is up and the ping makes a
/// fresh connection: the CONN_STALE / "Rebooted" path is taken only if A still holds the old
/// connection when the new one arrives. The assertions hold either way.
fn restart_reconnects_through_conn_stale() {
    let mut p = connected_pair("restart");
    let before = conns_to(&p.a, NID_B)[0].incarnation.clone();

    p.b.signal("-TERM");
    let st = p.b.wait_exit(Duration::from_secs(7));
    assert_eq!(st.code(), Some(0), "B's graceful stop: {st}");

    // A new incarnation of B, same configuration and port.
    p.b = start(&p.dir.0, "b", NID_B, p.pb, NID_A, p.pa);
    ping_until_ok(&p.a, NID_B, Duration::from_secs(6));

    let c = conns_to(&p.a, NID_B);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].state, "Established", "{c:?}");
    assert_ne!(
        c[0].incarnation, before,
        "A kept B's old incarnation: {c:?}"
    );
    for (who, d) in [("A", &p.a), ("B", &p.b)] {
        for c in conns(d) {
            assert!(c.races < 20, "{who}: CONN_RACE storm: {c:?}");
        }
    }
    assert_eq!(peer_state(&p.a, NID_B).as_deref(), Some("up"));
}

#[test]
fn graceful_stop_is_seen_within_a_second() {
    let mut p = connected_pair("graceful");
    p.b.signal("-TERM");
    let t0 = Instant::now();
    let took = wait_for(Duration::from_secs(1), || conns_to(&p.a, NID_B).is_empty());
    assert!(
        took.is_some(),
        "{:?} after B's SIGTERM A still has {:?}",
        t0.elapsed(),
        conns_to(&p.a, NID_B)
    );
    let st = p.b.wait_exit(Duration::from_secs(7));
    assert_eq!(st.code(), Some(0), "B's graceful stop: {st}");
    assert!(!p.b.socket.exists(), "B left its control socket behind");
}

/// The reverted LU-7646 patch deadlocked on `lctl ping` of a node's own NID, because the ping went
/// through the LND and raced with itself. Ours never reaches the LND: 10,000 pings of our own NID
/// and of `0@lo` through a running daemon all answer, and the daemon has made no connection at
/// all (its LND was never asked to connect), within an overall bound.
#[test]
fn self_ping_10000_never_touches_the_lnd() {
    let dir = Scratch::new("selfping");
    let (pa, pb) = (free_port(), free_port());
    let a = start(&dir.0, "a", NID_A, pa, NID_B, pb);
    let t0 = Instant::now();
    // 100 requests of 100 NIDs each: the daemon's loop looks at control requests every 20 ms, so
    // one ping per request would measure that, not the pings.
    let nids: Vec<String> = (0..100)
        .map(|i| {
            if i % 2 == 0 {
                NID_A.to_string()
            } else {
                "0@lo".to_string()
            }
        })
        .collect();
    for round in 0..100 {
        let resp = call_within(
            &a,
            Request::Ping {
                nids: nids.clone(),
                timeout_secs: Some(5),
                source: None,
            },
            Duration::from_secs(10),
        );
        let Response::Ping(r) = resp else {
            panic!("round {round}: {resp:?}");
        };
        assert!(r.manage.is_empty(), "round {round}: {:?}", r.manage);
        assert_eq!(r.ping.len(), 100, "round {round}");
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "self-pings stalled after {round} rounds"
        );
    }
    assert!(conns(&a).is_empty(), "a self-ping made an LND connection");
    let stats = match call(&a, Request::StatsShow) {
        Response::Stats(s) => s,
        other => panic!("stats show: {other:?}"),
    };
    // A ping is a GET and a REPLY, both delivered in memory.
    assert!(stats.statistics.loopback_count >= 20_000, "{stats:?}");
}
