//! Hardening of the tcp fabric as a daemon sees it, with real `lnet-router` processes on
//! loopback: what a socket in its handshake holds and the cap on such sockets, accepting at the
//! descriptor limit (a bounded back-off, the control socket still answering), and restarts right
//! after SIGKILL (the listen address is retried, never given up at once).
//!
//! Every test asserts counts (`net show -v` counters and gauges, exit codes), never timings;
//! every loop is bounded in count and time, every process is SIGKILLed by a guard on drop.
//! CPU and memory figures are measured by `benches/hardening.sh`, not here.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;

/// The tcp fabric's default `handshake_buffer`, bytes.
const HANDSHAKE_BUFFER: u64 = 512;

/// Connects `n` sockets to `port` that never send anything, `threads` at a time; those whose
/// connect does not complete within `each` are left out (a full listen backlog drops SYNs).
fn silent_clients(port: u16, n: usize, threads: usize, each: Duration) -> Vec<TcpStream> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let per = n.div_ceil(threads);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let k = per.min(n.saturating_sub(t * per));
            std::thread::spawn(move || {
                (0..k)
                    .filter_map(|_| TcpStream::connect_timeout(&addr, each).ok())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

/// The daemon A, with `opts`, in a scratch directory named `test`, knowing a peer B that is never
/// started (B's address is a port the test holds): the directory, the held port, A and the
/// port A listens on.
fn a_with_absent_peer(test: &str, opts: Opts) -> (Scratch, std::net::TcpListener, Daemon, u16) {
    let dir = Scratch::new(test);
    let (held, pb) = held_port();
    let (a, pa) = start_on_any_port(&dir.0, "a", NID_A, Some((NID_B, pb)), opts);
    (dir, held, a, pa)
}

/// Silent sockets each hold a handshake-sized receive buffer (not 64 KiB), at most
/// `handshake limit` of them are kept, the excess is closed at once and counted, and once they
/// are gone nothing is held any more.
#[test]
fn silent_sockets_hold_a_small_buffer_and_the_excess_is_refused() {
    const LIMIT: u64 = 100;
    let opts = Opts {
        ni_yaml: format!("          handshake limit: {LIMIT}\n"),
        ..Opts::default()
    };
    let (_dir, _b, a, pa) = a_with_absent_peer("hs-cap", opts);
    let c = |name| fabric_counter(&a, NID_A, name);
    assert_eq!((c("handshakes"), c("rx_buffer_bytes")), (0, 0));

    // LIMIT silent sockets: all in their handshake, each with the small buffer.
    let mut held = silent_clients(pa, LIMIT as usize, 4, Duration::from_secs(2));
    assert_eq!(held.len() as u64, LIMIT);
    assert!(
        wait_for(WAIT, || c("handshakes") == LIMIT).is_some(),
        "handshakes {} (of {LIMIT})",
        c("handshakes")
    );
    let bytes = c("rx_buffer_bytes");
    assert_eq!(bytes, LIMIT * HANDSHAKE_BUFFER, "{bytes} bytes for {LIMIT}");
    assert!(
        bytes / LIMIT <= 1024,
        "{} B per silent socket",
        bytes / LIMIT
    );

    // 50 more: accepted by the kernel, closed at once by the fabric, counted.
    let refused0 = c("handshakes_refused");
    let mut more = silent_clients(pa, 50, 2, Duration::from_secs(2));
    assert_eq!(more.len(), 50);
    assert!(
        wait_for(WAIT, || c("handshakes_refused") - refused0 >= 50).is_some(),
        "handshakes_refused {} (+50 expected)",
        c("handshakes_refused")
    );
    // (Held sockets that outstay the 5 s handshake timeout are closed and counted apart.)
    assert_eq!(c("handshakes_refused") - refused0, 50);
    assert!(c("handshakes") <= LIMIT);
    // The refused ones read end of stream.
    for s in &mut more {
        use std::io::Read;
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut b = [0u8; 8];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("a refused socket was not closed: {other:?}"),
        }
    }
    // The operator sees them (lnetctl renders every fabric counter).
    let o = lnetctl(&a, &["--json", "net", "show", "-v", "5"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = &v["net"][1]["local NI(s)"][0]["fabric"];
    assert!(f["handshakes_refused"].as_u64().unwrap() >= 50, "{v}");
    for k in [
        "handshakes",
        "rx_buffer_bytes",
        "accepts_shed",
        "accept_backoffs",
    ] {
        assert!(f[k].is_u64(), "{k} missing: {v}");
    }

    // All gone: nothing held.
    held.clear();
    more.clear();
    assert!(
        wait_for(WAIT, || c("handshakes") == 0 && c("rx_buffer_bytes") == 0).is_some(),
        "after close: handshakes {}, rx_buffer_bytes {}",
        c("handshakes"),
        c("rx_buffer_bytes")
    );
    assert_eq!(c("accept_backoffs"), 0, "no descriptor trouble here");
}

/// At `ulimit -n 128` with 600 incoming connections, the daemon sheds what would eat its last
/// descriptors and pauses accepting: over 5 s a handful of accept failures, not hundreds of
/// thousands; and `lnetctl net show` answers all the while.
#[test]
fn at_the_fd_limit_accepting_backs_off_and_the_control_socket_answers() {
    const NOFILE: u32 = 128;
    let opts = Opts {
        nofile: Some(NOFILE),
        ..Opts::default()
    };
    let (_dir, _b, a, pa) = a_with_absent_peer("fd-limit", opts);
    let c = |name| fabric_counter(&a, NID_A, name);
    let limit_hits = || c("accept_errors") + c("accepts_shed");

    // 600 connections that never speak (what does not get through the backlog is dropped).
    let flood = silent_clients(pa, 600, 8, Duration::from_millis(100));
    assert!(
        flood.len() > NOFILE as usize,
        "only {} connections",
        flood.len()
    );
    assert!(
        wait_for(WAIT, || c("accept_backoffs") > 0).is_some(),
        "the daemon never reached its descriptor limit: accepted {}, shed {}, errors {}",
        c("accepted"),
        c("accepts_shed"),
        c("accept_errors")
    );

    // 5 s at the limit (the flood still connected), and at least 5 answers (a loaded machine
    // may stretch the window: the bounds below are per second of the window as it was):
    // accept failures stay a handful, and the control socket answers every time.
    let (hits0, backoffs0) = (limit_hits(), c("accept_backoffs"));
    let t0 = Instant::now();
    let mut answered = 0;
    while t0.elapsed() < Duration::from_secs(5) || answered < 5 {
        let o = lnetctl(&a, &["net", "show"]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "lnetctl net show at the fd limit: {} {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(String::from_utf8_lossy(&o.stdout).contains(NID_A));
        answered += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    let (hits, backoffs) = (limit_hits() - hits0, c("accept_backoffs") - backoffs0);
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "over {secs:.1} s at the fd limit: {hits} accept failures/sheds, {backoffs} back-offs, \
         {answered} lnetctl answers; totals: accepted {}, shed {}, errors {}, handshakes {}",
        c("accepted"),
        c("accepts_shed"),
        c("accept_errors"),
        c("handshakes")
    );
    assert!(answered >= 5);
    // Back-offs of 100 ms doubling to 1 s: at most 50 in 5 s (10 a second), in practice
    // about 8.
    assert!(
        backoffs as f64 <= 10.0 * secs,
        "{backoffs} back-offs in {secs:.1} s"
    );
    // Each back-off ends in one probing accept (shed again while at the limit); a kept one
    // (handshake timeouts free descriptors) lets a burst in until the reserve: a few per
    // back-off, never one per retry of a spinning loop (at most 150 in 5 s, 30 a second).
    assert!(
        hits as f64 <= 30.0 * secs,
        "{hits} accept failures in {secs:.1} s"
    );
    // Warned, at most once per 10 s: on the daemon's clock, consecutive warnings are 10 s
    // apart (however long a loaded machine made the test).
    let warned: Vec<f64> = log_lines(&a)
        .iter()
        .filter(|l| l.contains("at the descriptor limit"))
        .filter_map(|l| log_time(l))
        .collect();
    assert!(!warned.is_empty(), "no warning about the limit");
    for w in warned.windows(2) {
        assert!(
            w[1] - w[0] >= 9.9,
            "warnings about the limit {:.3} s apart (at most one per 10 s): {warned:?}",
            w[1] - w[0]
        );
    }
    drop(flood);
}

/// A daemon killed with SIGKILL right after both sides pinged each other (ESTAB sockets, a
/// live io_uring) is restarted at once, 30 times: every restart binds (the listen address is
/// retried while the dead process's socket lingers) and serves pings again.
#[test]
fn restart_right_after_sigkill_binds_every_time() {
    const RESTARTS: usize = 30;
    let mut p = connected_pair("restart30");
    let t0 = Instant::now();
    for i in 0..RESTARTS {
        // Both have pinged each other: established sockets on both ends.
        ping_until_ok(&p.b, NID_A, WAIT);
        p.b.signal("-KILL");
        let _ = p.b.wait_exit(WAIT);
        // `start_with` panics if the daemon exits at start (it used to: "Address already in
        // use") and returns once its control socket answers, i.e. after its NI is listening.
        p.b = start(&p.dir.0, "b", NID_B, p.pb, NID_A, p.pa);
        ping_until_ok(&p.a, NID_B, WAIT);
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "{i} restarts took {:?}",
            t0.elapsed()
        );
    }
    let log = std::fs::read_to_string(&p.b.log).unwrap_or_default();
    let retried = log.matches("listen address in use").count();
    let up = log.matches("NI up").count();
    eprintln!(
        "{RESTARTS} restarts after SIGKILL in {:?}; {retried} had to retry the bind",
        t0.elapsed()
    );
    assert_eq!(up, RESTARTS + 1, "every instance came up");
    assert!(!log.contains("cannot listen"), "a restart failed to bind");
}
