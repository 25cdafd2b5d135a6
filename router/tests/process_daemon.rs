//! Two `lnet-router` daemons on loopback: ping across the tcp fabric through the control socket,
//! the show commands, and a graceful SIGTERM. Each daemon listens on a port the OS assigns and
//! reports in `net show -v`; every wait is bounded by a generous overall limit.

mod common;

use common::*;
use router::control::{Request, Response};

#[test]
fn two_daemons_ping_and_stop_gracefully() {
    let dir = Scratch::new("daemon-ping-stop");
    // B first; A, which pings B, is given B's port (B answers over A's connection).
    let (mut b, pb) = start_on_any_port(&dir.0, "b", "10.0.0.2@o2ib", None, Opts::default());
    let peer = Some(("10.0.0.2@o2ib", pb));
    let (a, _) = start_on_any_port(&dir.0, "a", "10.0.0.1@o2ib", peer, Opts::default());

    let resp = call(
        &a,
        Request::Ping {
            nids: vec!["10.0.0.2@o2ib".into(), "0@lo".into()],
            timeout_secs: Some(10),
            source: None,
        },
    );
    let Response::Ping(p) = resp else {
        panic!("{resp:?}")
    };
    assert!(p.manage.is_empty(), "{p:?}");
    assert_eq!(p.ping[0].primary_nid, "10.0.0.2@o2ib");
    assert_eq!(p.ping[0].peer_ni, vec!["10.0.0.2@o2ib".to_string()]);
    assert_eq!(p.ping[1].primary_nid, "10.0.0.1@o2ib");

    let Response::Peer(peers) = call(
        &a,
        Request::PeerShow {
            nid: Some("10.0.0.2@o2ib".into()),
            verbose: true,
        },
    ) else {
        panic!()
    };
    assert_eq!(peers.peer[0].peer_ni[0].state, "up");
    let Response::Conn(c) = call(&a, Request::ConnShow) else {
        panic!()
    };
    assert_eq!(c.conn.len(), 1, "{c:?}");
    assert_eq!(c.conn[0].state, "Established");
    let Response::Conn(c) = call(&b, Request::ConnShow) else {
        panic!()
    };
    assert_eq!(c.conn[0].side, "passive");
    let Response::Stats(s) = call(&b, Request::StatsShow) else {
        panic!()
    };
    assert!(s.statistics.recv_count >= 1);
    assert!(matches!(
        call(&a, Request::NetShow { verbose: true }),
        Response::Net(_)
    ));
    assert!(matches!(call(&a, Request::GlobalShow), Response::Global(_)));

    // SIGTERM: graceful close, exit 0, socket removed.
    b.signal("-TERM");
    let status = b.wait_exit(WAIT);
    assert_eq!(status.code(), Some(0));
    assert!(!b.socket.exists());

    // A saw the graceful close: the peer goes down, its connection is gone.
    wait_until(WAIT, "A sees B down", || {
        peer_state(&a, "10.0.0.2@o2ib").as_deref() == Some("down")
    });
    drop(a);
}

#[test]
fn bad_config_exits_2_naming_the_line() {
    let dir = Scratch::new("daemon-bad-config");
    let cfg = dir.join("bad.yaml");
    std::fs::write(
        &cfg,
        "net:\n    - net type: o2ib\n      local NI(s):\n        - nid: 10.0.0.1@o2ib\n          listen: 127.0.0.1:1\n          tunables:\n              peer_credit: 8\n",
    )
    .unwrap();
    let o = run_to_exit(&cfg, &dir.join("s.sock"), &[], None);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.yaml:7: unknown key 'peer_credit' (did you mean peer_credits?)"),
        "{err}"
    );
}

/// Every kind of bad configuration stops the daemon at start with exit 2 and a message that
/// names the file and, where there is one, the line: a bad value, broken YAML, an unknown key in a
/// nested table, a missing file.
#[test]
fn bad_configs_name_file_and_line() {
    let dir = Scratch::new("daemon-bad-configs");
    let ni = "net:\n    - net type: o2ib\n      fabric: tcp\n      local NI(s):\n        - nid: 10.0.0.1@o2ib\n          listen: 127.0.0.1:1\n";
    let cases: [(&str, String, &str); 4] = [
        (
            "value.yaml",
            format!("{ni}          tunables:\n              peer_credits: lots\n"),
            "value.yaml:8: not a whole number in 0..=4294967295: `peer_credits: lots`",
        ),
        (
            "syntax.yaml",
            "net:\n    - net type: o2ib\n      local NI(s): [\n".to_string(),
            "syntax.yaml:3: unclosed bracket",
        ),
        (
            "lnd.yaml",
            format!("{ni}          lnd tunables:\n              keepalive: 1\n              timeuot: 2\n"),
            "lnd.yaml:9: unknown key 'timeuot'",
        ),
        ("missing.yaml", String::new(), "missing.yaml: cannot read"),
    ];
    for (name, text, want) in cases {
        let cfg = dir.join(name);
        if !text.is_empty() {
            std::fs::write(&cfg, text).unwrap();
        }
        let o = run_to_exit(&cfg, &dir.join("s.sock"), &[], None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(want), "{name}: expected {want:?} in {err}");
        assert!(!dir.join("s.sock").exists(), "{name}: a socket was bound");
    }
}

/// A bad command line is a usage error: exit 2 with clap's usage on stderr, nothing started.
#[test]
fn bad_daemon_arguments_exit_2_with_usage() {
    for args in [
        &["--frobnicate"][..],
        &["--log-format", "xml"],
        &["--config"],
    ] {
        let o = lnet_router(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(
            err.contains("Usage: lnet-router") || err.contains("try '--help'"),
            "{args:?}: {err}"
        );
    }
}
