//! Two `lnet-router` daemons on loopback: ping across the tcp fabric through the control socket,
//! the show commands, and a graceful SIGTERM. Each daemon listens on a port the OS assigns and
//! reports in `net show -v`; every wait is bounded by a generous overall limit.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use router::control::{ControlClient, Request, Response};

/// The overall limit of every wait: only a condition that never holds reaches it.
const WAIT: Duration = Duration::from_secs(30);

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a daemon with one NI `nid` on a port the OS assigns, knowing the peer `(nid, port)` if
/// any; returns it with its port (from `net show -v`).
fn start(dir: &Path, name: &str, nid: &str, peer: Option<(&str, u16)>) -> (Daemon, u16) {
    let cfg = dir.join(format!("{name}.yaml"));
    let mut yaml = format!(
        "net:\n    - net type: o2ib\n      fabric: tcp\n      local NI(s):\n        - nid: {nid}\n          listen: 127.0.0.1:0\n"
    );
    if let Some((peer, peer_port)) = peer {
        yaml.push_str(&format!(
            "peers:\n    - nid: {peer}\n      address: 127.0.0.1:{peer_port}\n"
        ));
    }
    std::fs::write(&cfg, yaml).unwrap();
    let socket = dir.join(format!("{name}.sock"));
    let child = Command::new(env!("CARGO_BIN_EXE_lnet-router"))
        .arg("--config")
        .arg(&cfg)
        .arg("--socket")
        .arg(&socket)
        .env("LNET_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !socket.exists() {
        assert!(t0.elapsed() < WAIT, "{name} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let d = Daemon { child, socket };
    let port = listen_port(&d, nid);
    (d, port)
}

/// The port `d`'s NI `nid` listens on, as `net show -v` reports it (`ulnet: listen`).
fn listen_port(d: &Daemon, nid: &str) -> u16 {
    let Response::Net(n) = call(d, Request::NetShow { verbose: true }) else {
        panic!("net show")
    };
    let ni = n
        .net
        .iter()
        .flat_map(|n| &n.local_nis)
        .find(|ni| ni.nid == nid)
        .expect("our NI");
    let listen = ni.ulnet.as_ref().and_then(|u| u.listen.as_deref());
    let addr: std::net::SocketAddr = listen.expect("ulnet: listen").parse().unwrap();
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    assert_ne!(addr.port(), 0);
    addr.port()
}

fn call(d: &Daemon, req: Request) -> Response {
    ControlClient::connect(&d.socket)
        .unwrap()
        .call(&req)
        .unwrap()
}

#[test]
fn two_daemons_ping_and_stop_gracefully() {
    let dir = std::env::temp_dir().join(format!("ulnet-daemon-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // B first; A, which pings B, is given B's port (B answers over A's connection).
    let (mut b, pb) = start(&dir, "b", "10.0.0.2@o2ib", None);
    let (a, _) = start(&dir, "a", "10.0.0.1@o2ib", Some(("10.0.0.2@o2ib", pb)));

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
    let st = Command::new("kill")
        .args(["-TERM", &b.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = b.child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < WAIT, "b did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(!b.socket.exists());

    // A saw the graceful close: the peer goes down, its connection is gone.
    let t0 = Instant::now();
    loop {
        let Response::Peer(peers) = call(
            &a,
            Request::PeerShow {
                nid: Some("10.0.0.2@o2ib".into()),
                verbose: false,
            },
        ) else {
            panic!()
        };
        if peers.peer[0].peer_ni[0].state == "down" {
            break;
        }
        assert!(t0.elapsed() < WAIT, "{peers:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(a);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_config_exits_2_naming_the_line() {
    let dir = std::env::temp_dir().join(format!("ulnet-daemon-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.yaml");
    std::fs::write(
        &cfg,
        "net:\n    - net type: o2ib\n      local NI(s):\n        - nid: 10.0.0.1@o2ib\n          listen: 127.0.0.1:1\n          tunables:\n              peer_credit: 8\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_lnet-router"))
        .arg("--config")
        .arg(&cfg)
        .arg("--socket")
        .arg(dir.join("s.sock"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.yaml:7: unknown key 'peer_credit' (did you mean peer_credits?)"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every kind of bad configuration stops the daemon at start with exit 2 and a message that
/// names the file and, where there is one, the line: a bad value, broken YAML, an unknown key in a
/// nested table, a missing file.
#[test]
fn bad_configs_name_file_and_line() {
    let dir = std::env::temp_dir().join(format!("ulnet-daemon-cfgs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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
        let o = Command::new(env!("CARGO_BIN_EXE_lnet-router"))
            .arg("--config")
            .arg(&cfg)
            .arg("--socket")
            .arg(dir.join("s.sock"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(want), "{name}: expected {want:?} in {err}");
        assert!(!dir.join("s.sock").exists(), "{name}: a socket was bound");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad command line is a usage error: exit 2 with clap's usage on stderr, nothing started.
#[test]
fn bad_daemon_arguments_exit_2_with_usage() {
    for args in [
        &["--frobnicate"][..],
        &["--log-format", "xml"],
        &["--config"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_lnet-router"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(
            err.contains("Usage: lnet-router") || err.contains("try '--help'"),
            "{args:?}: {err}"
        );
    }
}
