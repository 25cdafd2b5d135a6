//! Process-level faults between two `lnet-router` daemons on loopback: a peer killed with
//! SIGKILL, a peer frozen with SIGSTOP, a peer restarted (new incarnation) while traffic to it is
//! queued, bad input on a listening port, and a graceful stop.
//!
//! Every daemon runs with small LND tunables (`timeout: 2`, `keepalive: 1`, seconds) unless a test
//! says otherwise, and `LNET_LOG=debug`, its stderr in a log file that is printed when a test
//! fails. Every process a test starts is SIGKILLed by a guard's `Drop` (also on panic), every
//! control call runs under a deadline, and every wait is a poll loop on its condition bounded by
//! a generous overall limit (`WAIT`); a time bound the daemon guarantees is measured from the
//! daemons' own log timestamps. Every daemon listens on a port the OS assigned. The helpers are
//! in `common/`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use router::control::{Request, Response};

/// A peer killed with SIGKILL is marked down "quickly": by the end of its sockets (the kernel
/// closes them), not by the keepalive/timeout machinery. That is what the counters show: the
/// fabric saw an end of stream or a reset without a DISCONNECT, and no silent-peer close
/// happened. A ping afterwards fails with an error status instead of hanging.
#[test]
fn kill_9_peer_is_marked_down_quickly() {
    let mut p = connected_pair("kill9");
    let silent0 = lnd_counters(&p.a, NID_A).counters.get("silent_peers");
    let ends = |d: &Daemon| {
        fabric_counter(d, NID_A, "eof_without_disconnect") + fabric_counter(d, NID_A, "resets")
    };
    let ends0 = ends(&p.a);
    p.b.signal("-KILL");
    let _ = p.b.wait_exit(WAIT);

    let took = wait_for(WAIT, || a_sees_b_down(&p.a));
    assert!(
        took.is_some(),
        "{WAIT:?} after B's SIGKILL A still sees B up: peer {:?}, conns {:?}",
        peer_state(&p.a, NID_B),
        conns_to(&p.a, NID_B)
    );
    assert!(
        ends(&p.a) > ends0,
        "A did not see the killed B's sockets end: {:?}",
        ni_entry(&p.a, NID_A).fabric
    );
    let silent = lnd_counters(&p.a, NID_A).counters.get("silent_peers");
    assert_eq!(
        silent, silent0,
        "the killed B was found by a timeout, not by its sockets' end"
    );

    // A ping now fails with an error status; `ping` bounds the call, so a hang fails the test.
    let r = ping(&p.a, NID_B, LND_TIMEOUT);
    assert!(r.ping.is_empty(), "a ping of a dead peer answered: {r:?}");
    assert_eq!(r.manage.len(), 1, "{r:?}");
    assert!(r.manage[0].errno < 0, "{r:?}");
}

/// A frozen peer that owes us something is declared dead: with more pings queued than the
/// connection's credits, the ones waiting for credits the stopped B never returns miss their LND
/// deadline, and A closes the connection within the LND timeout + one keepalive period.
///
/// That bound is the daemon's guarantee, so it is measured on A's own clock: from A's log line
/// of the 12-ping request to A's "peer down" line for B (a margin of 1.5 s for A's timers and
/// its loop). The test's own wait for the down state is bounded only by the generous `WAIT`.
#[test]
fn frozen_peer_with_traffic_beyond_credits_declared_down_within_timeout_plus_keepalive() {
    let p = connected_pair("frozen");
    let before = lnd_counters(&p.a, NID_A).counters.get("silent_peers");
    let from = log_lines(&p.a)
        .last()
        .and_then(|l| log_time(l))
        .expect("A's log has timestamped lines");
    p.b.signal("-STOP");
    // 12 pings at once: 8 take the connection's credits (peer_credits 8), 4 wait for credits.
    let socket = p.a.socket.clone();
    let pinger = std::thread::spawn(move || {
        let mut c = router::control::ControlClient::connect(&socket).expect("connect");
        let _ = c.call(&Request::Ping {
            nids: vec![NID_B.to_string(); 12],
            timeout_secs: Some(10),
            source: None,
        });
    });
    let took = wait_for(WAIT, || a_sees_b_down(&p.a));
    let (state, c) = (peer_state(&p.a, NID_B), conns_to(&p.a, NID_B));
    let after = lnd_counters(&p.a, NID_A).counters.get("silent_peers");
    // Cleanup: let B run again before the guard kills it (SIGKILL works on a stopped process
    // too; SIGCONT only keeps the log honest).
    p.b.signal("-CONT");
    assert!(
        took.is_some(),
        "{WAIT:?} after B's SIGSTOP, with pings queued beyond the credits, A still sees B up: \
         peer {state:?}, conns {c:?}"
    );
    assert!(
        after > before,
        "the close was not counted as a silent peer: {before:?} -> {after:?}"
    );
    // The bound, on A's clock: the first of the 12 pings asked for (the daemon logs each NID's
    // ping as a request of its own), then B declared down.
    let asked = log_time_of(&p.a, from, &["control request", "Ping", NID_B])
        .expect("A's log: the 12-ping request");
    let down = log_time_of(&p.a, asked, &["peer down", NID_B]).expect("A's log: B's peer down");
    let bound = (LND_KEEPALIVE + LND_TIMEOUT) as f64 + 1.5;
    assert!(
        down - asked <= bound,
        "A declared B down {:.3} s after the pings were asked for (bound {bound} s)",
        down - asked
    );
    let _ = pinger.join();
}

/// o2iblnd's liveness: a peer that owes us nothing may stay silent forever. B sends no
/// keepalives at all (keepalive 0, as a kernel with `keepalive=0`) and never answers ours, and A
/// (keepalive 1 s, timeout 2 s) keeps the idle connection: the same connection, no silent-peer
/// close, and a ping afterwards goes over it.
#[test]
fn idle_peer_that_sends_no_keepalives_keeps_its_connection() {
    let dir = Scratch::new("nokeepalive");
    // B first, on a port the OS assigns; A, which connects to it, is given that port.
    let b_opts = Opts {
        lnd: Lnd {
            timeout: LND_TIMEOUT,
            keepalive: 0,
        },
        ..Opts::default()
    };
    let (b, pb) = start_on_any_port(&dir.0, "b", NID_B, None, b_opts);
    let (a, _) = start_on_any_port(&dir.0, "a", NID_A, Some((NID_B, pb)), Opts::default());
    ping_until_ok(&a, NID_B, WAIT);
    let conn = conns_to(&a, NID_B);
    assert_eq!(conn.len(), 1, "{conn:?}");
    let a_before = lnd_counters(&a, NID_A);
    let b_before = lnd_counters(&b, NID_B);
    // Well past keepalive + timeout, three times over.
    std::thread::sleep(Duration::from_secs(3 * (LND_KEEPALIVE + LND_TIMEOUT)));
    let a_after = lnd_counters(&a, NID_A);
    let b_after = lnd_counters(&b, NID_B);
    // The same connection: same peer instance and side, older than before.
    let same = |now: &[router::control::ConnEntry]| {
        now.len() == 1
            && now[0].incarnation == conn[0].incarnation
            && now[0].side == conn[0].side
            && now[0].state == "Established"
            && now[0].age_ms > conn[0].age_ms
    };
    let now = conns_to(&a, NID_B);
    assert!(
        same(&now),
        "A's connection to the silent but healthy B changed: {conn:?} -> {now:?}"
    );
    let get = |c: &router::control::LndCounters, k: &str| c.counters.get(k).unwrap_or(0);
    assert_eq!(
        get(&a_after, "silent_peers"),
        get(&a_before, "silent_peers")
    );
    assert_eq!(get(&a_after, "conns_lost"), get(&a_before, "conns_lost"));
    assert!(
        get(&a_after, "keepalives") > get(&a_before, "keepalives"),
        "A sent no keepalive in the idle time"
    );
    assert_eq!(
        get(&b_after, "keepalives"),
        get(&b_before, "keepalives"),
        "B (keepalive 0) sent keepalives"
    );
    let p = ping(&a, NID_B, 2);
    assert_eq!(p.ping.len(), 1, "{p:?}");
    let now = conns_to(&a, NID_B);
    assert!(
        same(&now),
        "the ping did not use the same connection: {now:?}"
    );
}

/// A daemon restarts while its peer has traffic queued for it, and the peer reconnects to the
/// new instance at once, without a race storm.
///
/// What the peer remembers: when B is killed, A's connection to it closes and, with nothing
/// queued, A's LND forgets B, as o2iblnd unlinks a peer whose last connection closed
/// (kiblnd_close_conn_locked). So the CONNREQ A later sends to B's new instance names no
/// incarnation and is accepted: no CONN_STALE round trip (the simulator's `peer_reboot_conn_stale`
/// covers the CONN_STALE path, which a peer that kept traffic queued across the restart takes).
///
/// Queued traffic: B's old instance is killed (SIGKILL: a crash); its new instance is started on
/// the same port and frozen (SIGSTOP) as soon as it listens, so that A's ping, started then,
/// connects at the TCP level and waits behind an active connect the frozen B cannot answer (a
/// ping to a port nobody listens on would fail at once instead). Then B runs again: the queued
/// ping must complete OK, within the LND timeout, without a race storm.
#[test]
fn restart_with_queued_traffic_reconnects_to_the_new_instance() {
    // A 10 s LND timeout: the queued ping's deadline; the connect deadline is max(5 s, 10/4).
    let lnd = Lnd {
        timeout: 10,
        keepalive: 100,
    };
    let mut p = connected_pair_with("restart", lnd);
    let before = conns_to(&p.a, NID_B)[0].incarnation.clone();
    let a_before = lnd_counters(&p.a, NID_A);

    p.b.signal("-KILL");
    let _ = p.b.wait_exit(WAIT);
    assert!(
        wait_for(WAIT, || conns_to(&p.a, NID_B).is_empty()).is_some(),
        "A still holds a connection to the killed B: {:?}",
        conns_to(&p.a, NID_B)
    );

    // B's new instance, on B's port again (A knows B there): listening, then frozen before
    // anyone connects.
    let opts = Opts {
        lnd,
        ..Opts::default()
    };
    p.b = start_opts(&p.dir.0, "b", NID_B, p.pb, NID_A, p.pa, opts);
    p.b.signal("-STOP");

    let mut ping = std::process::Command::new(lnetctl_bin())
        .arg("--socket")
        .arg(&p.a.socket)
        .args(["ping", NID_B, "--timeout", "20"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The ping waits behind an active connect to the frozen B (for up to the 5 s connect
    // deadline; on a machine so slow that the wait misses it, the test fails below).
    let queued = wait_for(WAIT, || {
        conns_to(&p.a, NID_B)
            .iter()
            .any(|c| c.state == "ActiveConnect")
    });
    let state = conns_to(&p.a, NID_B);
    p.b.signal("-CONT");
    if queued.is_none() {
        let _ = ping.kill();
        let _ = ping.wait();
        panic!("A's ping did not wait behind a connect to the frozen B: {state:?}");
    }

    // The queued ping completes, OK (its own timeout is 20 s; beyond that plus `WAIT` it hung).
    let bound = Duration::from_secs(20) + WAIT;
    let Some(status) = testkit::wait_exit(&mut ping, bound) else {
        let _ = ping.kill();
        let _ = ping.wait();
        panic!("the queued ping did not finish within {bound:?}");
    };
    let out = ping.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        status.code(),
        Some(0),
        "queued ping: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("primary nid: {NID_B}")),
        "{stdout}"
    );

    // A forgot the dead B (its last connection closed, nothing queued), so its request named
    // no instance and the new B accepted it: no CONN_STALE either way.
    let a_after = lnd_counters(&p.a, NID_A);
    let b_after = lnd_counters(&p.b, NID_B);
    let count = |c: &router::control::LndCounters, k: &str| c.counters.get(k).unwrap();
    assert!(
        count(&a_after, "peers_forgotten") > count(&a_before, "peers_forgotten"),
        "A did not forget the dead B: {a_after:?}"
    );
    let stale_received = a_after.rejects_received.get("conn_stale").unwrap()
        - a_before.rejects_received.get("conn_stale").unwrap();
    let stale_sent = b_after.rejects_sent.get("conn_stale").unwrap();
    assert_eq!(stale_received, 0, "A named a dead instance: {a_after:?}");
    assert_eq!(stale_sent, 0, "B refused A as stale: {b_after:?}");

    let c = conns_to(&p.a, NID_B);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].state, "Established", "{c:?}");
    assert_ne!(
        c[0].incarnation, before,
        "A kept B's old incarnation: {c:?}"
    );
    assert_eq!(peer_state(&p.a, NID_B).as_deref(), Some("up"));
    // No race storm: below the race limit (20) per connection and in total.
    for (who, d, nid) in [("A", &p.a, NID_A), ("B", &p.b, NID_B)] {
        for c in conns(d) {
            assert!(c.races < 20, "{who}: CONN_RACE storm: {c:?}");
        }
        let races = lnd_counters(d, nid).counters.get("races").unwrap();
        assert!(races < 20, "{who}: {races} CONN_RACE rejects sent");
    }
}

/// Bad input on B's listening port: random bytes, a truncated frame, and a well-formed CONNREQ
/// frame whose kib message has a wrong magic. Each connection is refused (closed; the CONNREQ
/// answered with a FATAL reject) and counted in `net show -v` (the fabric's frame counters, the
/// LND's `bad_connreqs` and `rejects_sent`), while A's connection to B keeps working.
#[test]
fn bad_input_on_the_listening_port_is_refused_and_counted() {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};

    let p = connected_pair("badinput");
    let a_conn = conns_to(&p.a, NID_B);
    let frame_errors = |d: &Daemon| {
        [
            "bad_kind",
            "bad_length",
            "unsupported_frames",
            "truncated",
            "unexpected_frames",
        ]
        .iter()
        .map(|n| fabric_counter(d, NID_B, n))
        .sum::<u64>()
    };
    let bad_connreqs = |d: &Daemon| lnd_counters(d, NID_B).counters.get("bad_connreqs").unwrap();
    let fatal_sent = |d: &Daemon| lnd_counters(d, NID_B).rejects_sent.get("fatal").unwrap();
    let connect = || {
        let s = TcpStream::connect(("127.0.0.1", p.pb)).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s
    };
    // Reads until B closes the connection; what it sent before.
    let until_closed = |mut s: TcpStream, what: &str| {
        let mut got = Vec::new();
        match s.read_to_end(&mut got) {
            Ok(_) => got,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => got,
            Err(e) => panic!("{what}: B did not close the connection: {e}"),
        }
    };

    // 1. Random bytes (a fixed xorshift sequence: the same bytes every run).
    let (errors0, bad0) = (frame_errors(&p.b), bad_connreqs(&p.b));
    let noise = noise(0x9e37_79b9_7f4a_7c15, 512);
    let mut s = connect();
    s.write_all(&noise).unwrap();
    until_closed(s, "random bytes");
    assert!(
        wait_for(WAIT, || frame_errors(&p.b) + bad_connreqs(&p.b)
            > errors0 + bad0)
        .is_some(),
        "random bytes were not counted: {:?}",
        ni_entry(&p.b, NID_B)
    );

    // 2. A truncated frame: a CONNREQ head announcing 56 bytes, 20 of them, then end of stream.
    let truncated0 = fabric_counter(&p.b, NID_B, "truncated");
    let mut s = connect();
    let mut f = 57u32.to_le_bytes().to_vec();
    f.push(1);
    f.extend_from_slice(&[0x5a; 20]);
    s.write_all(&f).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    until_closed(s, "truncated frame");
    assert!(
        wait_for(WAIT, || fabric_counter(&p.b, NID_B, "truncated")
            > truncated0)
        .is_some(),
        "the truncated frame was not counted: {:?}",
        ni_entry(&p.b, NID_B).fabric
    );

    // 3. A well-formed CONNREQ frame whose kib message has a wrong magic.
    let (bad0, fatal0) = (bad_connreqs(&p.b), fatal_sent(&p.b));
    let req = lnd::wire::KibMsg {
        version: lnd::wire::kib::VERSION_2,
        credits: 0,
        src_nid: "10.0.0.9@o2ib".parse().unwrap(),
        src_stamp: 7,
        dst_nid: NID_B.parse().unwrap(),
        dst_stamp: 0,
        body: lnd::wire::KibBody::ConnReq(lnd::wire::ConnParams {
            queue_depth: 8,
            max_frags: 256,
            max_msg_size: 4096,
        }),
    };
    let mut body = [0u8; 64];
    let n = req.emit(&mut body, Default::default()).unwrap();
    assert!(
        lnd::wire::KibMsg::parse(&body[..n]).is_ok(),
        "the good CONNREQ"
    );
    body[..4].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    assert!(
        lnd::wire::KibMsg::parse(&body[..n]).is_err(),
        "the bad CONNREQ"
    );
    let mut f = (n as u32 + 1).to_le_bytes().to_vec();
    f.push(1);
    f.extend_from_slice(&body[..n]);
    let mut s = connect();
    s.write_all(&f).unwrap();
    let reply = until_closed(s, "wrong magic");
    // B answered with a REJECT frame (kind 3) carrying a FATAL reject, then closed.
    assert!(reply.len() > 5, "no reply to the bad CONNREQ: {reply:?}");
    assert_eq!(reply[4], 3, "not a REJECT frame: {reply:?}");
    let len = u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]) as usize;
    let (rej, _) = lnd::wire::KibRej::parse(&reply[5..4 + len]).unwrap();
    assert_eq!(rej.why, lnd::wire::RejectReason::Fatal, "{rej:?}");
    assert!(bad_connreqs(&p.b) > bad0, "{:?}", lnd_counters(&p.b, NID_B));
    assert!(fatal_sent(&p.b) > fatal0, "{:?}", lnd_counters(&p.b, NID_B));

    // The existing connection kept working: same connection, and it still carries pings.
    ping_until_ok(&p.a, NID_B, WAIT);
    let now = conns_to(&p.a, NID_B);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].incarnation, a_conn[0].incarnation, "{now:?}");
    assert!(
        now[0].age_ms >= a_conn[0].age_ms,
        "A reconnected: {a_conn:?} -> {now:?}"
    );
    assert_eq!(peer_state(&p.b, NID_A).as_deref(), Some("up"));

    // And an operator sees it with lnetctl.
    let o = lnetctl(&p.b, &["--json", "net", "show", "-v", "5"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ni = &v["net"][1]["local NI(s)"][0];
    assert_eq!(ni["nid"], NID_B, "{v}");
    assert_eq!(ni["fabric"]["type"], "tcp", "{v}");
    assert!(ni["fabric"]["truncated"].as_u64().unwrap() >= 1, "{v}");
    assert!(
        ni["lnd statistics"]["bad_connreqs"].as_u64().unwrap() >= 1,
        "{v}"
    );
    assert!(
        ni["lnd statistics"]["rejects_sent"]["fatal"]
            .as_u64()
            .unwrap()
            >= 1,
        "{v}"
    );
}

/// A SIGTERMed B closes its connections gracefully and A sees it within a second: measured on
/// the daemons' clocks, from B's "closing every connection" line to A's "peer down" line for
/// B. The test's own wait for A's connection to go is bounded only by the generous `WAIT`.
#[test]
fn graceful_stop_is_seen_within_a_second() {
    let mut p = connected_pair("graceful");
    let from = log_lines(&p.a)
        .last()
        .and_then(|l| log_time(l))
        .expect("A's log has timestamped lines");
    p.b.signal("-TERM");
    let t0 = Instant::now();
    let took = wait_for(WAIT, || conns_to(&p.a, NID_B).is_empty());
    assert!(
        took.is_some(),
        "{:?} after B's SIGTERM A still has {:?}",
        t0.elapsed(),
        conns_to(&p.a, NID_B)
    );
    let st = p.b.wait_exit(WAIT);
    assert_eq!(st.code(), Some(0), "B's graceful stop: {st}");
    assert!(!p.b.socket.exists(), "B left its control socket behind");
    // Ungraceful drops 0 on both. A: its LND counter, and its fabric saw B's DISCONNECT before
    // the end of the stream (never an EOF without one: what a crash looks like). B: its LND
    // logs an error and counts when an endpoint is dropped still owning connections.
    let lnd = lnd_counters(&p.a, NID_A);
    assert_eq!(lnd.counters.get("ungraceful_drops"), Some(0), "{lnd:?}");
    assert!(fabric_counter(&p.a, NID_A, "peer_disconnects") >= 1);
    assert_eq!(fabric_counter(&p.a, NID_A, "eof_without_disconnect"), 0);
    let b_log = std::fs::read_to_string(&p.b.log).unwrap_or_default();
    assert!(
        !b_log.contains("no graceful close was done"),
        "B dropped connections without closing them:\n{b_log}"
    );
    assert!(b_log.contains("lnet-router stopped"), "B's log: {b_log}");
    let closing = log_time_of(&p.b, from, &["closing every connection"])
        .expect("B's log: closing every connection");
    let seen = log_time_of(&p.a, closing, &["peer down", NID_B])
        .expect("A's log: B's peer down after B began closing");
    assert!(
        seen - closing <= 1.0,
        "A saw B's graceful close {:.3} s after B began it",
        seen - closing
    );
}

/// The reverted LU-7646 patch deadlocked on `lctl ping` of a node's own NID, because the ping went
/// through the LND and raced with itself. Ours never reaches the LND: 10,000 pings of our own NID
/// and of `0@lo` through a running daemon all answer, and the daemon has made no connection at
/// all (its LND was never asked to connect), within an overall bound.
#[test]
fn self_ping_10000_never_touches_the_lnd() {
    let dir = Scratch::new("selfping");
    // B is never started: its address is a port the test holds (a connect to it would show).
    let (_b_listener, pb) = held_port();
    let (a, _) = start_on_any_port(&dir.0, "a", NID_A, Some((NID_B, pb)), Opts::default());
    let t0 = Instant::now();
    // 10,000 requests of one NID each, alternating our NID and 0@lo, on one control
    // connection (a control request wakes the daemon's loop, so each costs a round trip over
    // the control socket, not a loop period). The reader runs on its own thread so that a hang
    // fails the test at the overall bound instead of blocking it.
    let socket = a.socket.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut cl = router::control::ControlClient::connect(&socket).unwrap();
        for i in 0..10_000u32 {
            let nid = if i % 2 == 0 { NID_A } else { "0@lo" };
            let resp = cl.call(&Request::Ping {
                nids: vec![nid.to_string()],
                timeout_secs: Some(5),
                source: None,
            });
            let ok =
                matches!(&resp, Ok(Response::Ping(r)) if r.manage.is_empty() && r.ping.len() == 1);
            if tx.send((i, ok, format!("{resp:?}"))).is_err() || !ok {
                return;
            }
        }
    });
    let mut done = 0u32;
    while done < 10_000 {
        let left = Duration::from_secs(120).saturating_sub(t0.elapsed());
        let Ok((i, ok, what)) = rx.recv_timeout(left) else {
            panic!(
                "self-pings stalled after {done} of 10,000 ({:?})",
                t0.elapsed()
            );
        };
        assert!(ok, "self-ping {i}: {what}");
        done += 1;
    }
    eprintln!("10,000 self-pings through the daemon in {:?}", t0.elapsed());
    assert!(conns(&a).is_empty(), "a self-ping made an LND connection");
    let stats = match call(&a, Request::StatsShow) {
        Response::Stats(s) => s,
        other => panic!("stats show: {other:?}"),
    };
    // A ping is a GET and a REPLY, both delivered in memory.
    assert!(stats.statistics.loopback_count >= 20_000, "{stats:?}");
}

/// LNet health's local NI recovery on real sockets (lnet_recover_local_nis): B freezes with
/// pings from A queued behind its credits; when A's connection times out, what was still
/// queued fails LOCAL_TIMEOUT and A's NI loses health. Once B is back, A's recovery pings go
/// through the NI to B (never to A's own NID: Lustre pings itself through the LND, and
/// LU-7646's first fix deadlocked on that) until the NI is back at the maximum and `debug
/// recovery --local` is empty again.
#[test]
fn a_local_ni_recovers_through_pings_to_a_live_peer_never_its_own_nid_over_tcp() {
    let p = connected_pair_two_nis("local_ni_recovery");
    assert_eq!(
        out(&lnetctl(&p.a, &["set", "health_sensitivity", "100"])).0,
        Some(0)
    );
    let health = |d: &Daemon| {
        ni_entry(d, NID_A)
            .health_stats
            .map(|h| h.health_value)
            .unwrap_or(0)
    };
    assert_eq!(health(&p.a), 1000);
    p.b.signal("-STOP");
    // More GETs than B has credits for: some stay queued on the connection.
    let pinger = ping_in_background(&p.a, NID_B, 24, 3);
    let fell = wait_for(WAIT, || health(&p.a) < 1000);
    let _ = pinger.join();
    assert!(
        fell.is_some(),
        "the NI lost health when its connection timed out"
    );
    let recovery = |d: &Daemon| out(&lnetctl(d, &["debug", "recovery", "--local"])).1;
    assert!(recovery(&p.a).contains(NID_A), "{}", recovery(&p.a));
    p.b.signal("-CONT");
    let back = wait_for(WAIT, || health(&p.a) == 1000);
    assert!(
        back.is_some(),
        "the NI recovered through pings to B: {}",
        recovery(&p.a)
    );
    assert!(!recovery(&p.a).contains(NID_A), "{}", recovery(&p.a));
    // Nothing ever went to our own NID through the fabric: no peer entry for it.
    match call(
        &p.a,
        Request::PeerShow {
            nid: Some(NID_A.into()),
            verbose: true,
        },
    ) {
        Response::Error(e) => assert_eq!(e.errno, 2, "{e:?}"),
        Response::Peer(s) => assert!(s.peer.is_empty(), "{s:?}"),
        other => panic!("{other:?}"),
    }
}
