//! Real daemons on `tcp` nets, speaking ksocklnd's wire (issue 35's process tests, loopback):
//! a client and a server on one tcp net (ping, brw PUT/GET 1 B to 1 MiB with check=full), a
//! router between a tcp net and an o2ib net (routed pings and brw both ways, the router killed
//! and restarted mid-brw), and a graceful close that the peer sees at once.
//!
//! Each daemon has its own 127.0.x.y address and all share one acceptor port (as kernel nodes
//! share 988), above 1023 so the tests run unprivileged (`acceptor: accept: all`, source
//! ports from the system).

mod common;

use std::time::Duration;

use common::*;

/// A free port for every daemon's acceptor (free on 127.0.0.1; each daemon binds its own
/// address on it).
fn acceptor_port() -> u16 {
    held_port().1
}

fn acceptor(port: u16) -> String {
    format!("acceptor:\n  accept: all\n  port: {port}\n  source ports: 0\nselftest:\n  enable: 1\n")
}

/// A node with one tcp NI (and the routes given, as YAML lines).
fn tcp_node(nid: &str, port: u16, routes: &str) -> String {
    format!(
        "net:\n  - net type: tcp\n    local NI(s):\n      - nid: {nid}\n{routes}{}",
        acceptor(port)
    )
}

/// Two daemons in `dir`, `a` and `b`, one tcp NI each (`a_nid`, `b_nid`) on the acceptor
/// `port`: the peers of most tests here.
fn tcp_pair(dir: &Scratch, port: u16, a_nid: &str, b_nid: &str) -> (Daemon, Daemon) {
    (
        start_yaml(&dir.0, "a", &tcp_node(a_nid, port, ""), Opts::default()),
        start_yaml(&dir.0, "b", &tcp_node(b_nid, port, ""), Opts::default()),
    )
}

/// `lnetctl selftest run-test` from `d`'s console; the JSON summary.
fn run_test(d: &Daemon, from: &str, to: &str, extra: &[&str], test: &[&str]) -> serde_json::Value {
    let mut args = vec!["--json", "selftest", "run-test", "--from", from, "--to", to];
    args.extend_from_slice(extra);
    args.extend_from_slice(test);
    let out = lnetctl(d, &args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let json_start = stdout
        .find("{\n")
        .unwrap_or_else(|| panic!("a JSON summary: {stdout}\n{stderr}"));
    serde_json::from_str(&stdout[json_start..]).expect("JSON")
}

#[test]
fn socklnd_client_and_server_ping_and_move_1_byte_to_1_mib_check_full() {
    let dir = Scratch::new("sock_pair");
    let port = acceptor_port();
    let (a_nid, b_nid) = ("127.0.20.1@tcp", "127.0.20.2@tcp");
    let (a, b) = tcp_pair(&dir, port, a_nid, b_nid);
    ping_until_ok(&a, b_nid, Duration::from_secs(10));
    ping_until_ok(&b, a_nid, Duration::from_secs(10));
    for size in ["1", "3976", "3977", "4k", "64k", "1M"] {
        for dir in ["write", "read"] {
            let size_arg = format!("size={size}");
            let v = run_test(
                &a,
                a_nid,
                b_nid,
                &["--loop", "4", "--concurrency", "2"],
                &["brw", dir, &size_arg, "check=full"],
            );
            assert_eq!(v["brw_errors"], 0, "{dir} {size}: {v}");
            assert_eq!(v["rpc_errors"], 0, "{dir} {size}: {v}");
            assert_eq!(v["latency"][0]["count"], 8, "{dir} {size}: 2 x 4 RPCs: {v}");
        }
    }
    // The kernel's typed set: CONTROL, BULK_IN, BULK_OUT from the dialer, adopted by the other
    // side (it dials nothing of its own).
    let established = std::process::Command::new("ss")
        .args(["-Htn", "state", "established"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    // Loopback lists both ends of each connection: count the dialling ends (peer column).
    let dialled_to = |addr: String| {
        established
            .lines()
            .filter(|l| l.split_whitespace().last() == Some(addr.as_str()))
            .count()
    };
    let to_b = dialled_to(format!("127.0.20.2:{port}"));
    let to_a = dialled_to(format!("127.0.20.1:{port}"));
    if !established.is_empty() {
        let ours: Vec<&str> = established
            .lines()
            .filter(|l| l.contains("127.0.20."))
            .collect();
        assert_eq!((to_b, to_a), (3, 0), "connections to b, to a: {ours:#?}");
    }
}

/// client (tcp) -> router (tcp | o2ib on the tcp fabric) -> server (o2ib), and back.
struct Routed {
    dir: Scratch,
    client: Daemon,
    router: Option<Daemon>,
    server: Daemon,
    router_yaml: String,
}

const CLIENT: &str = "127.0.21.1@tcp";
const ROUTER_TCP: &str = "127.0.21.4@tcp";
const ROUTER_IB: &str = "127.0.22.4@o2ib";
const SERVER: &str = "127.0.22.5@o2ib";

fn routed(test: &str) -> Routed {
    let dir = Scratch::new(test);
    let port = acceptor_port();
    let (r_ib_port, s_port) = (held_port().1, held_port().1);
    let peer = |nid: &str, addr: &str| format!("peers:\n  - nid: {nid}\n    address: {addr}\n");
    let router_peers = peer(SERVER, &format!("127.0.22.5:{s_port}"));
    let server_peers = peer(ROUTER_IB, &format!("127.0.22.4:{r_ib_port}"));
    let router_yaml = format!(
        "net:\n  - net type: tcp\n    local NI(s):\n      - nid: {ROUTER_TCP}\n  - net type: o2ib\n    \
         fabric: tcp\n    local NI(s):\n      - nid: {ROUTER_IB}\n        listen: 127.0.22.4:{r_ib_port}\n\
         routing:\n  enable: 1\n{router_peers}{}",
        acceptor(port)
    );
    let server_yaml = format!(
        "net:\n  - net type: o2ib\n    fabric: tcp\n    local NI(s):\n      - nid: {SERVER}\n        \
         listen: 127.0.22.5:{s_port}\nroute:\n  - net: tcp\n    gateway: {ROUTER_IB}\n{server_peers}{}",
        acceptor(port)
    );
    let client_yaml = tcp_node(
        CLIENT,
        port,
        &format!("route:\n  - net: o2ib\n    gateway: {ROUTER_TCP}\n"),
    );
    let router = start_yaml(&dir.0, "router", &router_yaml, Opts::default());
    let server = start_yaml(&dir.0, "server", &server_yaml, Opts::default());
    let client = start_yaml(&dir.0, "client", &client_yaml, Opts::default());
    Routed {
        dir,
        client,
        router: Some(router),
        server,
        router_yaml,
    }
}

#[test]
fn routed_tcp_to_o2ib_and_back_ping_and_brw_check_full() {
    let t = routed("sock_routed");
    ping_until_ok(&t.client, SERVER, Duration::from_secs(15));
    ping_until_ok(&t.server, CLIENT, Duration::from_secs(15));
    for (console, from, to) in [(&t.client, CLIENT, SERVER), (&t.server, SERVER, CLIENT)] {
        for dir in ["write", "read"] {
            for size in ["4k", "1M"] {
                let size_arg = format!("size={size}");
                let v = run_test(
                    console,
                    from,
                    to,
                    &["--loop", "5", "--concurrency", "2"],
                    &["brw", dir, &size_arg, "check=full"],
                );
                assert_eq!(v["brw_errors"], 0, "{from} {dir} {size}: {v}");
                assert_eq!(v["latency"][0]["count"], 10, "{from} {dir} {size}: {v}");
            }
        }
    }
    let r = match call(
        t.router.as_ref().unwrap(),
        router::control::Request::RoutingShow,
    ) {
        router::control::Response::Routing(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.forwarding.dropped, 0, "{:?}", r.forwarding);
    assert!(r.forwarding.forwarded > 0, "{:?}", r.forwarding);
}

/// The router is stopped and started again while a brw runs through it: every RPC completes
/// or fails with a reason (none is left hanging), the route comes back, and a brw after the
/// restart passes clean.
#[test]
fn a_router_restarted_mid_brw_loses_only_what_was_in_flight_and_the_route_comes_back() {
    let mut t = routed("sock_router_restart");
    ping_until_ok(&t.client, SERVER, Duration::from_secs(15));
    let child = lnetctl_cmd(&t.client)
        .arg("--json")
        .args(run_test_args(
            CLIENT,
            SERVER,
            &["--duration", "8", "brw", "write", "size=1M", "check=full"],
        ))
        .spawn()
        .expect("lnetctl");
    std::thread::sleep(Duration::from_secs(2));
    let mut router = t.router.take().unwrap();
    router.signal("-TERM");
    assert!(router.wait_exit(Duration::from_secs(10)).success());
    drop(router);
    t.router = Some(start_yaml(
        &t.dir.0,
        "router2",
        &t.router_yaml,
        Opts::default(),
    ));
    let out = child.wait_with_output().expect("lnetctl ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json_start = stdout.find("{\n").expect("a JSON summary");
    let v: serde_json::Value = serde_json::from_str(&stdout[json_start..]).expect("JSON");
    let sent = v["rpcs_sent"].as_u64().expect("rpcs_sent");
    let completed = v["rpcs_completed"].as_u64().expect("rpcs_completed");
    let failed =
        v["rpc_errors"].as_u64().expect("rpc_errors") + v["rpcs_expired"].as_u64().unwrap_or(0);
    assert!(sent > 0, "{v}");
    assert!(
        completed + failed >= sent,
        "every RPC completed or failed: {v}"
    );
    assert!(completed > 0, "RPCs before and after the restart: {v}");
    // The route is back: a clean brw through the new router.
    ping_until_ok(&t.client, SERVER, Duration::from_secs(20));
    let v = run_test(
        &t.client,
        CLIENT,
        SERVER,
        &["--loop", "4"],
        &["brw", "read", "size=1M", "check=full"],
    );
    assert_eq!(v["brw_errors"], 0, "{v}");
}

/// 3FS #426's lesson on socklnd: a daemon that stops closes its connections gracefully, and its
/// peer marks it down at once (a close, not a timeout).
#[test]
fn a_stopping_peer_is_seen_down_at_once_as_closed() {
    let dir = Scratch::new("sock_close");
    let port = acceptor_port();
    let (a_nid, b_nid) = ("127.0.23.1@tcp", "127.0.23.2@tcp");
    let (a, mut b) = tcp_pair(&dir, port, a_nid, b_nid);
    ping_until_ok(&a, b_nid, Duration::from_secs(10));
    b.signal("-TERM");
    assert!(b.wait_exit(Duration::from_secs(10)).success());
    let seen = wait_for(Duration::from_secs(3), || {
        log_lines(&a)
            .iter()
            .any(|l| l.contains("peer down") && l.contains(b_nid) && l.contains("Closed"))
    });
    assert!(seen.is_some(), "{:?}", log_lines(&a));
}

/// A `tcp` NI added at run time (`lnetctl net add`, which says nothing of ports) takes the
/// running daemon's acceptor settings: it listens on the daemon's acceptor port and dials its
/// peers there, so two daemons' added tcp1 NIs reach each other.
#[test]
fn a_tcp_ni_added_at_run_time_takes_the_daemons_acceptor() {
    let dir = Scratch::new("sock_net_add");
    let port = acceptor_port();
    let a = start_yaml(
        &dir.0,
        "a",
        &tcp_node("127.0.25.1@tcp", port, ""),
        Opts::default(),
    );
    let b = start_yaml(
        &dir.0,
        "b",
        &tcp_node("127.0.25.2@tcp", port, ""),
        Opts::default(),
    );
    for (d, nid) in [(&a, "127.0.25.3@tcp1"), (&b, "127.0.25.4@tcp1")] {
        let out = lnetctl(d, &["net", "add", "--nid", nid]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // b answers from its first NI (the reply lists both of its NIDs).
    let answered = wait_for(Duration::from_secs(10), || {
        let req = router::control::Request::Ping {
            nids: vec!["127.0.25.4@tcp1".into()],
            timeout_secs: Some(2),
            source: None,
        };
        matches!(call(&a, req), router::control::Response::Ping(p)
            if p.ping.first().is_some_and(|x| x.peer_ni.iter().any(|n| n == "127.0.25.4@tcp1")))
    });
    assert!(answered.is_some(), "a's tcp1 NI reaches b's");
    let log = std::fs::read_to_string(&b.log).unwrap();
    assert!(
        log.contains(&format!("local=127.0.25.4:{port}")),
        "b's added NI listens on the acceptor port {port}: {log}"
    );
}

/// The metrics endpoint on a daemon with a tcp NI: socklnd's counters and connections carry
/// `lnd="socklnd"`, its two gauges are gauges.
#[test]
fn socklnd_metrics_carry_the_lnd_label() {
    use std::io::{Read, Write};
    let dir = Scratch::new("sock_metrics");
    let port = acceptor_port();
    let with_metrics = format!(
        "{}metrics:\n  listen: 127.0.0.1:0\n",
        tcp_node("127.0.26.1@tcp", port, "")
    );
    let a = start_yaml(&dir.0, "a", &with_metrics, Opts::default());
    let _b = start_yaml(
        &dir.0,
        "b",
        &tcp_node("127.0.26.2@tcp", port, ""),
        Opts::default(),
    );
    ping_until_ok(&a, "127.0.26.2@tcp", Duration::from_secs(10));
    let mut addr = None;
    wait_for(Duration::from_secs(10), || {
        addr = log_lines(&a)
            .iter()
            .filter(|l| l.contains("metrics endpoint serving /metrics"))
            .find_map(|l| {
                l.split("listen=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse::<std::net::SocketAddr>()
                    .ok()
            });
        addr.is_some()
    });
    let addr = addr.expect("the metrics endpoint's address in the log");
    // The NI publishes its counters at most once a second: scrape until the connections show.
    let mut text = String::new();
    let seen = wait_for(Duration::from_secs(10), || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        text.clear();
        let _ = s.read_to_string(&mut text);
        text.contains("ulnet_lnd_conns{") && text.contains("lnd=\"socklnd\"")
    });
    assert!(seen.is_some(), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("ulnet_lnd_msgs_sent_total{") && l.contains("lnd=\"socklnd\"")),
        "{text}"
    );
    assert!(
        text.contains("# TYPE ulnet_lnd_unauthenticated gauge"),
        "{text}"
    );
    assert!(
        !text.contains("ulnet_lnd_conns_total"),
        "connections are a gauge: {text}"
    );
}

/// `lnetctl capture` on a tcp NI records socklnd's streams as TCP segments that Wireshark's
/// LNet dissector decodes: a ping (GET, REPLY) and a brw write (PUTs whose 64 KiB payloads are
/// kept up to 4 KiB, the rest written as zeros so the stream stays whole).
#[test]
fn capture_on_a_tcp_ni_decodes_in_tshark() {
    use std::io::{BufRead, BufReader};
    let Some(tshark) = testkit::tshark_or_skip() else {
        return;
    };
    let dir = Scratch::new("sock_capture");
    let port = acceptor_port();
    let (a_nid, b_nid) = ("127.0.27.1@tcp", "127.0.27.2@tcp");
    let (a, _b) = tcp_pair(&dir, port, a_nid, b_nid);
    let file = dir.0.join("sock.pcap");
    let mut child = lnetctl_cmd(&a)
        .args(["capture", "--duration", "4", "--file"])
        .arg(&file)
        .spawn()
        .expect("lnetctl capture");
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains(&format!("capturing on {a_nid}")), "{line}");
    ping_until_ok(&a, b_nid, Duration::from_secs(10));
    let v = run_test(
        &a,
        a_nid,
        b_nid,
        &["--loop", "2"],
        &["brw", "write", "size=64k"],
    );
    assert_eq!(v["brw_errors"], 0, "{v}");
    let status = testkit::wait_exit(&mut child, Duration::from_secs(20)).expect("capture ends");
    assert!(status.success());
    let decode = format!("tcp.port=={port},lnet");
    let text = testkit::run_tshark(
        &tshark,
        &file,
        &[
            "-d",
            &decode,
            "-Y",
            "lnet",
            "-T",
            "fields",
            "-e",
            "lnet.ksm_type",
            "-e",
            "lnet.msg_type",
        ],
    );
    let rows: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect();
    assert!(
        !rows.is_empty() && rows.iter().all(|(k, _)| k.ends_with("c1")),
        "every LNet PDU a KSOCK_MSG_LNET: {text}"
    );
    for (ty, what) in [("1", "PUT"), ("2", "GET"), ("3", "REPLY")] {
        assert!(
            rows.iter().any(|(_, m)| m.split(',').any(|x| x == ty)),
            "no {what} decoded: {text}"
        );
    }
}
