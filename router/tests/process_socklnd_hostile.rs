//! Hostile peers against a real daemon's socklnd (issue 35, acceptance "Hostile peers"), on
//! loopback: raw peers written here with `std::net::TcpStream` and the byte layouts of
//! `lnd::wire::sock` (the acceptor request, the HELLO, the KSOCK header). Each attack is
//! refused or bounded, counted in `net show -v`'s `lnd statistics` (ksocklnd's counters), and a
//! good peer (another daemon) pings through every one of them.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::path::Path;
use std::time::Duration;

use common::*;
use lnd::wire::lnet::{LnetHdr, LNET_HDR_LEN, LNET_MTU, LNET_PID_LUSTRE};
use lnd::wire::sock::{ConnReq, Hello, HelloVersion, KsockHdr, HELLO_V3_LEN};
use lnd::wire::Nid;

/// The acceptor every daemon here shares (as kernel nodes share 988), above 1023 so the tests
/// run unprivileged; an accept timeout of `timeout` s so that half-open handshakes end soon, and
/// a listen backlog that holds a whole flood (the kernel resets dials past a full backlog: that
/// would be the test's own limit, not the daemon's).
fn acceptor(port: u16, accept: &str, timeout: u32) -> String {
    format!(
        "acceptor:\n  accept: {accept}\n  port: {port}\n  source ports: 0\n  timeout: {timeout}\n  \
         backlog: 2048\n"
    )
}

fn tcp_node(nid: &str, port: u16, accept: &str, extra: &str) -> String {
    tcp_node_timeout(nid, port, accept, extra, 2)
}

fn tcp_node_timeout(nid: &str, port: u16, accept: &str, extra: &str, timeout: u32) -> String {
    format!(
        "net:\n  - net type: tcp\n    local NI(s):\n      - nid: {nid}\n{extra}{}",
        acceptor(port, accept, timeout)
    )
}

/// The two daemons of every test here, started in `dir` from their YAML: the victim `v`, which
/// the raw peers attack, and the good peer `g`, whose pings must pass throughout.
fn start_pair(dir: &Path, v_yaml: &str, g_yaml: &str) -> (Daemon, Daemon) {
    (
        start_yaml(dir, "v", v_yaml, Opts::default()),
        start_yaml(dir, "g", g_yaml, Opts::default()),
    )
}

/// One counter of `d`'s socklnd NI `nid`, by its `lnd statistics` name.
fn counter(d: &Daemon, nid: &str, name: &str) -> u64 {
    let c = lnd_counters(d, nid);
    c.counters
        .get(name)
        .unwrap_or_else(|| panic!("{}: no lnd statistics {name}: {c:?}", d.name))
}

/// Waits (bounded) until `d`'s counter `name` reaches `at_least`; the value then.
fn counter_reaches(d: &Daemon, nid: &str, name: &str, at_least: u64) -> u64 {
    let mut v = 0;
    wait_for(Duration::from_secs(20), || {
        v = counter(d, nid, name);
        v >= at_least
    });
    assert!(
        v >= at_least,
        "{}: {name} = {v}, wanted >= {at_least}",
        d.name
    );
    v
}

fn addr(nid: &str, port: u16) -> SocketAddrV4 {
    let ip: Ipv4Addr = nid.split('@').next().unwrap().parse().unwrap();
    SocketAddrV4::new(ip, port)
}

fn dial(nid: &str, port: u16) -> TcpStream {
    let s = TcpStream::connect(addr(nid, port)).expect("connect to the acceptor");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Reads until the daemon closes the socket (EOF or reset); the bytes it sent first. Bounded by
/// the read timeout: a socket still open after it fails the test.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the daemon did not close the socket: {e} (read {got:?})"),
        }
    }
}

/// A V3 HELLO from `src` to `dst` asking for a connection of wire type `ctype`.
fn hello(src: Nid, dst: Nid, ctype: i32) -> Vec<u8> {
    Hello {
        version: HelloVersion::V3,
        src_nid: src,
        dst_nid: dst,
        src_pid: LNET_PID_LUSTRE,
        dst_pid: 0,
        src_incarnation: 0x5eed,
        dst_incarnation: 0,
        ctype,
        nips: 0,
    }
    .emit()
    .unwrap()
}

/// A raw peer `me` through `victim`'s acceptor and HELLO on a CONTROL connection (ctype 1);
/// the established stream.
fn raw_peer(victim: &str, port: u16, me: &str) -> TcpStream {
    let mut s = dial(victim, port);
    let v: Nid = victim.parse().unwrap();
    s.write_all(&ConnReq::new(v).emit()).unwrap();
    s.write_all(&hello(me.parse().unwrap(), v, 1)).unwrap();
    let mut reply = [0u8; HELLO_V3_LEN];
    s.read_exact(&mut reply).expect("the victim's HELLO answer");
    assert_eq!(reply[48], 1, "CONTROL answered with CONTROL: {reply:?}");
    s
}

/// A KSOCK LNET message head (24 + 72 bytes) for a PUT from `src` to `dst` announcing `len`
/// payload bytes (written into the header's field as is, even past LNET_MTU).
fn put_head(src: Nid, dst: Nid, len: u32) -> Vec<u8> {
    let mut b = KsockHdr::LNET.emit().to_vec();
    let mut h = [0u8; LNET_HDR_LEN];
    LnetHdr::put(src, dst, 0, 4, 1).emit(&mut h).unwrap();
    // payload_length: after dest_nid, src_nid, dest_pid, src_pid and type (lib-types.h).
    h[28..32].copy_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&h);
    b
}

/// Default `max_unauthenticated` of a socklnd NI (`SockConfig`).
const MAX_UNAUTHENTICATED: u64 = 256;

/// More silent sockets than `max_unauthenticated`: the rest are refused at once and counted,
/// those held cost under 4 KiB each (RSS), every one is closed by the accept timeout; sockets
/// that send the acceptor request and no HELLO end the same way. A good peer pings throughout.
#[test]
fn silent_and_half_open_floods_are_bounded_counted_and_cheap() {
    let dir = Scratch::new("sock_hostile_flood");
    let port = held_port().1;
    let (v_nid, g_nid) = ("127.0.30.1@tcp", "127.0.30.2@tcp");
    // Accept timeout 10 s: the whole flood is in before the first held socket times out.
    let yaml = |nid| tcp_node_timeout(nid, port, "all", "", 10);
    let (v, g) = start_pair(&dir.0, &yaml(v_nid), &yaml(g_nid));
    ping_until_ok(&g, v_nid, Duration::from_secs(10));
    let pid: u32 = v.pid().parse().unwrap();
    let timeouts0 = counter(&v, v_nid, "handshake_timeouts");
    let refused0 = counter(&v, v_nid, "refused_unauthenticated_limit");
    let rss0 = proc_status(pid, "VmRSS");

    // 1,000 silent sockets: at most `max_unauthenticated` are held, the rest refused at once.
    let flood: Vec<TcpStream> = (0..1000).map(|_| dial(v_nid, port)).collect();
    let (mut refused, mut held) = (0, 0);
    wait_for(Duration::from_secs(20), || {
        let c = lnd_counters(&v, v_nid);
        refused = c.counters.get("refused_unauthenticated_limit").unwrap() - refused0;
        held = c.counters.get("unauthenticated").unwrap();
        refused + held >= 1000
    });
    assert_eq!(
        (refused, held),
        (1000 - MAX_UNAUTHENTICATED, MAX_UNAUTHENTICATED)
    );
    let rss1 = proc_status(pid, "VmRSS");
    let per_socket = rss1.saturating_sub(rss0) * 1024 / held;
    eprintln!(
        "RSS {rss0} kB -> {rss1} kB with {held} unauthenticated sockets: {per_socket} B each"
    );
    assert!(
        per_socket < 4096,
        "{per_socket} B per unauthenticated socket"
    );
    // The good peer is unaffected (its connections are up: no new socket needed).
    ping_until_ok(&g, v_nid, Duration::from_secs(10));
    // Each held one is closed at the accept timeout and counted; the refused ones were closed.
    counter_reaches(&v, v_nid, "handshake_timeouts", timeouts0 + held);
    for mut s in flood {
        read_to_close(&mut s);
    }
    assert_eq!(counter(&v, v_nid, "handshake_timeouts"), timeouts0 + held);
    assert_eq!(counter(&v, v_nid, "unauthenticated"), 0);

    // Sockets that stop after the acceptor request, before any HELLO: the same bound.
    let timeouts1 = counter(&v, v_nid, "handshake_timeouts");
    let req = ConnReq::new(v_nid.parse().unwrap()).emit();
    let half: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = dial(v_nid, port);
            s.write_all(&req).unwrap();
            s
        })
        .collect();
    ping_until_ok(&g, v_nid, Duration::from_secs(10));
    counter_reaches(&v, v_nid, "handshake_timeouts", timeouts1 + 50);
    for mut s in half {
        assert_eq!(
            read_to_close(&mut s),
            Vec::<u8>::new(),
            "closed, nothing sent"
        );
    }
    ping_until_ok(&g, v_nid, Duration::from_secs(10));
    assert_eq!(counter(&v, v_nid, "unauthenticated"), 0);
}

/// HELLOs with a bad magic, an unknown version, or LNET_NID_ANY as their NID, and a message
/// announcing more than LNET_MTU: each connection is closed and counted once; a good peer's
/// pings pass between them, and `conn show` lists the good peer's typed connections.
#[test]
fn bad_hellos_and_oversized_messages_are_closed_and_counted() {
    let dir = Scratch::new("sock_hostile_hello");
    let port = held_port().1;
    let (v_nid, g_nid, x_nid) = ("127.0.31.1@tcp", "127.0.31.2@tcp", "127.0.31.9@tcp");
    let (v, g) = start_pair(
        &dir.0,
        &tcp_node(v_nid, port, "all", ""),
        &tcp_node(g_nid, port, "all", ""),
    );
    ping_until_ok(&g, v_nid, Duration::from_secs(10));
    let vn: Nid = v_nid.parse().unwrap();
    let xn: Nid = x_nid.parse().unwrap();
    let req = ConnReq::new(vn).emit();

    // conn show: the good peer dialled the victim's CONTROL, BULK_IN and BULK_OUT.
    let types = |d: &Daemon| {
        let mut t: Vec<String> = conns_to(d, g_nid)
            .into_iter()
            .filter_map(|c| c.sock.map(|s| s.ctype))
            .collect();
        t.sort();
        t
    };
    assert_eq!(
        types(&v),
        ["BULK_IN", "BULK_OUT", "CONTROL"],
        "{:?}",
        conns(&v)
    );

    let cases: [(&str, Vec<u8>); 3] = [
        ("bad_magic", {
            let mut h = hello(xn, vn, 1);
            h[0] ^= 0xff;
            h
        }),
        ("refused_version", {
            let mut h = hello(xn, vn, 1);
            h[4..8].copy_from_slice(&7u32.to_le_bytes());
            h
        }),
        ("bad_hello", hello(Nid::ANY, vn, 1)),
    ];
    for (name, h) in cases {
        let before = counter(&v, v_nid, name);
        let mut s = dial(v_nid, port);
        s.write_all(&req).unwrap();
        s.write_all(&h).unwrap();
        let answer = read_to_close(&mut s);
        assert!(
            answer.len() <= HELLO_V3_LEN,
            "{name}: at most a refusal: {answer:?}"
        );
        assert_eq!(counter(&v, v_nid, name), before + 1, "{name}");
        ping_until_ok(&g, v_nid, Duration::from_secs(10));
    }

    // A message announcing LNET_MTU + 1 bytes on an established connection.
    let before = counter(&v, v_nid, "protocol_errors");
    let mut s = raw_peer(v_nid, port, x_nid);
    s.write_all(&put_head(xn, vn, LNET_MTU + 1)).unwrap();
    read_to_close(&mut s);
    assert_eq!(counter(&v, v_nid, "protocol_errors"), before + 1);
    ping_until_ok(&g, v_nid, Duration::from_secs(10));
}

/// `accept: secure`: a dialer from a port above 1023 is closed before anything is read, and
/// counted; the victim's own dials to a good peer still work.
#[test]
fn secure_acceptor_closes_an_unprivileged_dialer_unread() {
    let dir = Scratch::new("sock_hostile_secure");
    let port = held_port().1;
    let (v_nid, g_nid) = ("127.0.32.1@tcp", "127.0.32.2@tcp");
    let (v, g) = start_pair(
        &dir.0,
        &tcp_node(v_nid, port, "secure", ""),
        &tcp_node(g_nid, port, "all", ""),
    );
    ping_until_ok(&v, g_nid, Duration::from_secs(10));
    let before = counter(&v, v_nid, "refused_insecure_port");
    let accepts = counter(&v, v_nid, "accepts");
    for _ in 0..5 {
        let mut s = dial(v_nid, port);
        assert!(s.local_addr().unwrap().port() > 1023);
        // Whatever it sends is never read: the answer is the close alone.
        let _ = s.write_all(&ConnReq::new(v_nid.parse().unwrap()).emit());
        assert_eq!(read_to_close(&mut s), Vec::<u8>::new());
    }
    assert_eq!(counter(&v, v_nid, "refused_insecure_port"), before + 5);
    assert_eq!(counter(&v, v_nid, "accepts"), accepts, "none adopted");
    ping_until_ok(&v, g_nid, Duration::from_secs(10));
    ping_until_ok(&g, v_nid, Duration::from_secs(10));
}

/// A peer that trickles a 1 MiB PUT through a router byte by byte: the router's large buffer
/// is granted at the header and taken back when the bulk grant bound passes (the connection
/// closed, `bulk_stalls` counted); a good peer pings through the router meanwhile.
#[test]
fn a_trickled_1_mib_put_holds_the_routers_buffer_only_within_the_grant_bound() {
    let dir = Scratch::new("sock_hostile_trickle");
    let port = held_port().1;
    let ib_port = held_port().1;
    let (v_nid, g_nid, x_nid) = ("127.0.33.1@tcp", "127.0.33.2@tcp", "127.0.33.9@tcp");
    let (v_ib, far) = ("127.0.34.1@o2ib", "127.0.34.5@o2ib");
    let router_extra = format!(
        "  - net type: o2ib\n    fabric: tcp\n    local NI(s):\n      - nid: {v_ib}\n        \
         listen: 127.0.34.1:{ib_port}\nrouting:\n  enable: 1\n"
    );
    let (v, g) = start_pair(
        &dir.0,
        &tcp_node(v_nid, port, "all", &router_extra),
        &tcp_node(g_nid, port, "all", ""),
    );
    ping_until_ok(&g, v_nid, Duration::from_secs(10));
    let large = |d: &Daemon| match call(d, router::control::Request::RoutingShow) {
        router::control::Response::Routing(r) => r.cpts.iter().fold((0i64, 0i64, 0i64), |a, c| {
            (
                a.0 + i64::from(c.large.nbuffers),
                a.1 + c.large.credits,
                a.2 + c.large.mincredits,
            )
        }),
        other => panic!("{other:?}"),
    };
    let (nbuf, credits0, min0) = large(&v);
    assert_eq!(credits0, nbuf, "all large buffers free");
    let stalls0 = counter(&v, v_nid, "bulk_stalls");

    let mut s = raw_peer(v_nid, port, x_nid);
    s.write_all(&put_head(
        x_nid.parse().unwrap(),
        far.parse().unwrap(),
        1 << 20,
    ))
    .unwrap();
    // One byte at a time until the router closes the connection (bounded by the read side).
    s.set_nonblocking(true).unwrap();
    let mut sent = 0usize;
    let closed = wait_for(Duration::from_secs(30), || {
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return true,
        }
        if s.write_all(&[0x5a]).is_err() {
            return true;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(40));
        false
    });
    assert!(
        closed.is_some(),
        "the router closed the trickler ({sent} bytes sent)"
    );
    assert!(sent < 1 << 20, "{sent}");
    assert_eq!(counter(&v, v_nid, "bulk_stalls"), stalls0 + 1);
    let (_, credits1, min1) = large(&v);
    assert!(
        min1 < min0,
        "a large buffer was granted to the trickler: {min0} -> {min1}"
    );
    wait_for(Duration::from_secs(10), || large(&v).1 == nbuf);
    assert_eq!(large(&v).1, nbuf, "released (was {credits1})");
    ping_until_ok(&g, v_nid, Duration::from_secs(10));
}
