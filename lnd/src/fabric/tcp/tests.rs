//! Real-socket tests of the tcp fabric over loopback: two endpoints driven alternately from one
//! thread, each test bounded in time.

use crate::engine::LndEvent;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use super::*;
use crate::engine::{DownReason, EndpointConfig, TxError};
use crate::wire::LnetHdr;

type Book = Arc<Mutex<HashMap<Nid, SocketAddr>>>;

const STEP_WAIT: StdDuration = StdDuration::from_micros(500);

fn nid(s: &str) -> Nid {
    s.parse().unwrap()
}

fn hdr(from: Nid, to: Nid, len: usize) -> LnetHdr {
    LnetHdr::put(from, to, len as u32, 4, 7)
}

/// A payload carrying its index, of varying size (8..=3907 bytes).
fn payload(i: u64) -> Vec<u8> {
    let len = 8 + (i as usize * 37) % 3900;
    let mut p: Vec<u8> = (0..len).map(|k| (k as u64 ^ i) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

fn index_of(p: &[u8]) -> u64 {
    let i = u64::from_le_bytes(p[..8].try_into().unwrap());
    assert_eq!(p, &payload(i)[..], "payload {i} corrupted");
    i
}

struct Node {
    fabric: TcpFabric,
    ep: Endpoint,
    got: Vec<(Nid, Vec<u8>)>,
    done: HashMap<u64, Result<(), TxError>>,
    downs: Vec<(Nid, DownReason)>,
}

impl Node {
    fn new(book: &Book, name: &str, incarnation: u64, clock: &MonotonicClock) -> Node {
        let b = Arc::clone(book);
        let fabric = TcpFabric::bind("127.0.0.1:0".parse().unwrap(), move |n| {
            b.lock().unwrap().get(&n).copied()
        })
        .unwrap();
        book.lock().unwrap().insert(nid(name), fabric.local_addr());
        Node {
            fabric,
            ep: Endpoint::new(EndpointConfig::new(nid(name), incarnation), clock.now()),
            got: Vec::new(),
            done: HashMap::new(),
            downs: Vec::new(),
        }
    }

    fn step(&mut self, clock: &MonotonicClock) {
        let Node {
            fabric,
            ep,
            got,
            done,
            downs,
        } = self;
        turn(fabric, ep, clock, STEP_WAIT, &mut |ep, now, ev| match ev {
            LndEvent::Received {
                from, payload, rx, ..
            } => {
                got.push((from, payload));
                ep.recv_done(now, rx);
            }
            LndEvent::SendDone { cookie, result, .. } => {
                assert!(
                    done.insert(cookie, result).is_none(),
                    "message {cookie} finished twice"
                );
            }
            LndEvent::PeerUp { .. } => {}
            LndEvent::PeerDown { nid, reason } => downs.push((nid, reason)),
        })
        .unwrap();
    }

    fn send(&mut self, clock: &MonotonicClock, to: Nid, cookie: u64, p: Vec<u8>) {
        let h = hdr(self.ep.nid(), to, p.len());
        self.ep.send(clock.now(), to, h, p, cookie).unwrap();
    }

    fn conns(&self) -> usize {
        self.ep.conns().count()
    }
}

/// Steps every node until `cond` holds or `limit` passes; returns whether it held.
fn run_until(
    nodes: &mut [&mut Node],
    clock: &MonotonicClock,
    limit: StdDuration,
    mut cond: impl FnMut(&[&mut Node]) -> bool,
) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if cond(nodes) {
            return true;
        }
        for n in nodes.iter_mut() {
            n.step(clock);
        }
    }
    cond(nodes)
}

/// Two nodes with one connection between them (one message each way delivered).
fn connected_pair(clock: &MonotonicClock) -> (Book, Node, Node) {
    let book = Book::default();
    let mut a = Node::new(&book, "10.0.0.1@o2ib", 100, clock);
    let mut b = Node::new(&book, "10.0.0.2@o2ib", 200, clock);
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    a.send(clock, bn, 1, payload(0));
    b.send(clock, an, 1, payload(0));
    assert!(
        run_until(
            &mut [&mut a, &mut b],
            clock,
            StdDuration::from_secs(5),
            |n| { n.iter().all(|n| n.done.len() == 1 && n.got.len() == 1) }
        ),
        "pair did not connect"
    );
    assert_eq!(a.done[&1], Ok(()));
    assert_eq!(b.done[&1], Ok(()));
    (book, a, b)
}

fn shut_down_both(a: &mut Node, b: &mut Node, clock: &MonotonicClock) {
    let now = clock.now();
    a.ep.shutdown(now);
    b.ep.shutdown(now);
    assert!(
        run_until(&mut [a, b], clock, StdDuration::from_secs(5), |n| {
            n.iter().all(|n| n.ep.is_shut_down())
        }),
        "endpoints did not shut down"
    );
    // The last Destroys reach the fabrics, whose sockets then close.
    assert!(run_until(
        &mut [a, b],
        clock,
        StdDuration::from_secs(2),
        |n| n.iter().all(|n| n.fabric.sockets() == 0)
    ));
}

#[test]
fn tcp_exchange_1000_messages_each_way() {
    let clock = MonotonicClock::new();
    let book = Book::default();
    let mut a = Node::new(&book, "10.0.0.1@o2ib", 100, &clock);
    let mut b = Node::new(&book, "10.0.0.2@o2ib", 200, &clock);
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    const N: u64 = 1000;
    for i in 0..N {
        a.send(&clock, bn, i, payload(i));
        b.send(&clock, an, i, payload(i));
    }
    let ok = run_until(
        &mut [&mut a, &mut b],
        &clock,
        StdDuration::from_secs(30),
        |n| {
            n.iter()
                .all(|n| n.done.len() == N as usize && n.got.len() == N as usize)
        },
    );
    assert!(
        ok,
        "a: {} done {} got; b: {} done {} got",
        a.done.len(),
        a.got.len(),
        b.done.len(),
        b.got.len()
    );
    for n in [&a, &b] {
        assert!(n.done.values().all(|r| *r == Ok(())), "{:?}", n.done);
        let order: Vec<u64> = n.got.iter().map(|(_, p)| index_of(p)).collect();
        assert_eq!(order, (0..N).collect::<Vec<_>>(), "out of order");
    }
    assert!(a.got.iter().all(|(from, _)| *from == bn));
    assert!(b.got.iter().all(|(from, _)| *from == an));
    // The race was settled into one connection each side.
    assert_eq!(a.conns(), 1);
    assert_eq!(b.conns(), 1);
    let (sa, sb) = (a.fabric.stats().clone(), b.fabric.stats().clone());
    assert!(sa.msgs_rx >= N && sb.msgs_rx >= N, "{sa:?} {sb:?}");
    assert_eq!(sa.protocol_errors() + sb.protocol_errors(), 0);
    assert_eq!(
        sa.rx_stalls + sb.rx_stalls,
        0,
        "credits must prevent stalls"
    );
    shut_down_both(&mut a, &mut b, &clock);
    assert!(a.fabric.ring_stats().cqes > 0);
}

#[test]
fn tcp_graceful_shutdown_is_seen_at_once() {
    let clock = MonotonicClock::new();
    let (_book, mut a, mut b) = connected_pair(&clock);
    let an = a.ep.nid();
    let t0 = std::time::Instant::now();
    a.ep.shutdown(clock.now());
    let ok = run_until(
        &mut [&mut a, &mut b],
        &clock,
        StdDuration::from_secs(2),
        |n| n[0].ep.is_shut_down() && n[1].conns() == 0,
    );
    let took = t0.elapsed();
    assert!(
        ok,
        "a shut down: {}, b conns: {}",
        a.ep.is_shut_down(),
        b.conns()
    );
    assert!(took < StdDuration::from_millis(500), "took {took:?}");
    assert!(b.fabric.stats().peer_disconnects >= 1);
    assert_eq!(b.fabric.stats().eof_without_disconnect, 0);
    assert!(b.downs.contains(&(an, DownReason::Closed)), "{:?}", b.downs);
    // Both fabrics let go of every socket.
    assert!(run_until(
        &mut [&mut a, &mut b],
        &clock,
        StdDuration::from_secs(2),
        |n| n.iter().all(|n| n.fabric.sockets() == 0)
    ));
    b.ep.shutdown(clock.now());
    assert!(run_until(
        &mut [&mut b],
        &clock,
        StdDuration::from_secs(2),
        |n| n[0].ep.is_shut_down()
    ));
}

#[test]
fn tcp_dropped_fabric_is_seen_at_once_and_messages_end() {
    let clock = MonotonicClock::new();
    let (_book, a, mut b) = connected_pair(&clock);
    let an = a.ep.nid();
    // The process-equivalent dies: its sockets close without a DISCONNECT frame.
    let Node {
        fabric, ep: a_ep, ..
    } = a;
    let t0 = std::time::Instant::now();
    drop(fabric);
    // Messages sent right away: on the dying connection or queued behind it.
    for c in 10..15 {
        b.send(&clock, an, c, payload(c));
    }
    let ok = run_until(&mut [&mut b], &clock, StdDuration::from_secs(2), |n| {
        n[0].conns() == 0
    });
    let took = t0.elapsed();
    assert!(ok, "b still has {} conns", b.conns());
    assert!(took < StdDuration::from_millis(500), "took {took:?}");
    let s = b.fabric.stats();
    assert!(
        s.eof_without_disconnect + s.resets >= 1,
        "no EOF/RST counted: {s:?}"
    );
    // Every one of them ends with a status.
    assert!(run_until(
        &mut [&mut b],
        &clock,
        StdDuration::from_secs(5),
        |n| { (10..15).all(|c| n[0].done.contains_key(&c)) }
    ));
    // Messages queued now fail: nobody listens any more.
    for c in 20..25 {
        b.send(&clock, an, c, payload(c));
    }
    assert!(run_until(
        &mut [&mut b],
        &clock,
        StdDuration::from_secs(5),
        |n| { (20..25).all(|c| n[0].done.contains_key(&c)) }
    ));
    for c in 20..25 {
        assert_eq!(b.done[&c], Err(TxError::ConnectFailed), "message {c}");
    }
    assert!(b.downs.iter().any(|(n, _)| *n == an));
    drop(a_ep); // logs the ungraceful drop: that is the point of this test
}

/// Drives `b` until the raw socket is closed by it; returns what was read.
fn read_until_closed(
    raw: &mut TcpStream,
    nodes: &mut [&mut Node],
    clock: &MonotonicClock,
) -> Vec<u8> {
    raw.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let mut closed = false;
    let ok = run_until(nodes, clock, StdDuration::from_secs(3), |_| {
        let mut buf = [0u8; 256];
        loop {
            match raw.read(&mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        closed
    });
    assert!(ok, "the fabric did not close the garbage connection");
    got
}

#[test]
fn tcp_garbage_is_refused_and_counted_while_a_connection_works() {
    let clock = MonotonicClock::new();
    let (_book, mut a, mut b) = connected_pair(&clock);
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    let conn_before: Vec<_> = b.ep.conns().map(|c| c.id).collect();
    let target = b.fabric.local_addr();

    // 1. Random bytes.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let garbage: Vec<u8> = (0..256)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    // 2. A bad kind. 3. A MSG before any CONNREQ. 4. A length too large for a CONNREQ.
    let cases: Vec<Vec<u8>> = vec![
        garbage,
        vec![1, 0, 0, 0, 9],
        vec![5, 0, 0, 0, 4, 1, 2, 3, 4],
        vec![200, 0, 0, 0, 1],
        vec![1, 0, 0, 0, 6],
    ];
    let n_cases = cases.len() as u64;
    for bytes in cases {
        let mut raw = TcpStream::connect(target).unwrap();
        raw.write_all(&bytes).unwrap();
        read_until_closed(&mut raw, &mut [&mut a, &mut b], &clock);
    }
    let s = b.fabric.stats().clone();
    assert_eq!(s.protocol_errors(), n_cases, "{s:?}");
    assert!(s.bad_kind >= 1 && s.unexpected_frames >= 1 && s.bad_length >= 1);
    assert_eq!(s.unsupported_frames, 1);

    // 5. EOF in the middle of a CONNREQ.
    let mut raw = TcpStream::connect(target).unwrap();
    raw.write_all(&[21, 0, 0, 0, 1, 1, 2, 3]).unwrap();
    raw.shutdown(std::net::Shutdown::Write).unwrap();
    read_until_closed(&mut raw, &mut [&mut a, &mut b], &clock);
    assert_eq!(b.fabric.stats().truncated, 1);

    // 6. A well-framed CONNREQ whose private data is garbage: the engine rejects it, and the
    //    client reads a REJECT frame before the socket closes.
    let bad_connreqs = b.ep.stats().bad_connreqs;
    let rejects_sent = b.fabric.stats().rejects_sent;
    let mut raw = TcpStream::connect(target).unwrap();
    let mut f = Vec::new();
    frame::push_frame(&mut f, FrameKind::ConnReq, &[0xab; 40]);
    raw.write_all(&f).unwrap();
    let got = read_until_closed(&mut raw, &mut [&mut a, &mut b], &clock);
    let head = frame::parse_head(&got).unwrap().unwrap();
    assert_eq!(head.kind, FrameKind::Reject);
    assert_eq!(got.len(), head.frame_len());
    assert_eq!(b.ep.stats().bad_connreqs, bad_connreqs + 1);
    assert_eq!(b.fabric.stats().rejects_sent, rejects_sent + 1);

    // The real connection never noticed.
    let conn_after: Vec<_> = b.ep.conns().map(|c| c.id).collect();
    assert_eq!(conn_before, conn_after);
    for i in 100..120 {
        a.send(&clock, bn, i, payload(i));
        b.send(&clock, an, i, payload(i));
    }
    assert!(run_until(
        &mut [&mut a, &mut b],
        &clock,
        StdDuration::from_secs(5),
        |n| n.iter().all(|n| n.done.len() == 21 && n.got.len() == 21)
    ));
    assert!(a.done.values().chain(b.done.values()).all(|r| *r == Ok(())));
    // Garbage sockets are all gone; one connection each side remains.
    assert_eq!(b.fabric.sockets(), 1);
    shut_down_both(&mut a, &mut b, &clock);
}

#[test]
fn tcp_connect_to_nobody_fails_queued_messages() {
    let clock = MonotonicClock::new();
    let book = Book::default();
    let mut a = Node::new(&book, "10.0.0.1@o2ib", 100, &clock);
    // A port that was free a moment ago and has no listener now.
    let dead: SocketAddr = {
        let l = StdListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let nobody = nid("10.0.0.9@o2ib");
    book.lock().unwrap().insert(nobody, dead);
    let unknown = nid("10.0.0.10@o2ib"); // not in the book at all
    for c in 0..3 {
        a.send(&clock, nobody, c, payload(c));
    }
    a.send(&clock, unknown, 7, payload(7));
    let t0 = std::time::Instant::now();
    assert!(run_until(
        &mut [&mut a],
        &clock,
        StdDuration::from_secs(5),
        |n| { n[0].done.len() == 4 }
    ));
    assert!(t0.elapsed() < StdDuration::from_secs(1));
    for c in [0, 1, 2, 7] {
        assert_eq!(a.done[&c], Err(TxError::ConnectFailed), "message {c}");
    }
    assert!(a.fabric.stats().connect_failures >= 2);
    // The failed attempts are reaped, and the fabric lets go of them.
    assert!(run_until(
        &mut [&mut a],
        &clock,
        StdDuration::from_secs(1),
        |n| { n[0].conns() == 0 && n[0].fabric.sockets() == 0 }
    ));
}

#[test]
fn tcp_user_timeout_is_configured_on_sockets() {
    let cfg = TcpConfig {
        user_timeout: StdDuration::from_millis(1234),
        ..TcpConfig::default()
    };
    assert_eq!(
        TcpConfig::default().user_timeout,
        StdDuration::from_secs(50)
    );
    let f = TcpFabric::bind_with("127.0.0.1:0".parse().unwrap(), |_| None, cfg).unwrap();
    let s = f.open_socket(f.local_addr()).unwrap();
    assert_eq!(
        uring::tcp_user_timeout(s.as_fd()).unwrap(),
        StdDuration::from_millis(1234)
    );
    assert!(s.nodelay().unwrap());
}

#[test]
fn tcp_silent_client_is_closed_after_the_handshake_timeout() {
    let clock = MonotonicClock::new();
    let cfg = TcpConfig {
        handshake_timeout: StdDuration::from_millis(200),
        ..TcpConfig::default()
    };
    let fabric = TcpFabric::bind_with("127.0.0.1:0".parse().unwrap(), |_| None, cfg).unwrap();
    let mut n = Node {
        fabric,
        ep: Endpoint::new(EndpointConfig::new(nid("10.0.0.1@o2ib"), 1), clock.now()),
        got: Vec::new(),
        done: HashMap::new(),
        downs: Vec::new(),
    };
    let t0 = std::time::Instant::now();
    let mut raw = TcpStream::connect(n.fabric.local_addr()).unwrap();
    read_until_closed(&mut raw, &mut [&mut n], &clock);
    let took = t0.elapsed();
    assert!(took >= StdDuration::from_millis(200), "took {took:?}");
    assert!(took < StdDuration::from_millis(1000), "took {took:?}");
    assert_eq!(n.fabric.stats().handshake_timeouts, 1);
    assert!(run_until(
        &mut [&mut n],
        &clock,
        StdDuration::from_secs(1),
        |n| { n[0].fabric.sockets() == 0 }
    ));
}

/// The deployment shape: one thread per NI running `run_endpoint`. A sends 200 messages, shuts
/// down when all are done; B shuts itself down when it sees A go.
#[test]
fn tcp_run_endpoint_on_two_threads() {
    let book = Book::default();
    let (an, bn) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let bind = |book: &Book| {
        let b = Arc::clone(book);
        TcpFabric::bind("127.0.0.1:0".parse().unwrap(), move |n| {
            b.lock().unwrap().get(&n).copied()
        })
        .unwrap()
    };
    let (fa, fb) = (bind(&book), bind(&book));
    book.lock().unwrap().insert(an, fa.local_addr());
    book.lock().unwrap().insert(bn, fb.local_addr());
    let (tx, rx) = std::sync::mpsc::channel();
    let tx_b = tx.clone();
    let b_thread = std::thread::spawn(move || {
        let mut fb = fb;
        let clock = MonotonicClock::new();
        let mut ep = Endpoint::new(EndpointConfig::new(bn, 200), clock.now());
        let mut received = 0u64;
        run_endpoint(
            &mut fb,
            &mut ep,
            &clock,
            StdDuration::from_millis(5),
            |ep| ep.is_shut_down(),
            |ep, now, ev| match ev {
                LndEvent::Received { payload: p, rx, .. } => {
                    assert_eq!(index_of(&p), received);
                    received += 1;
                    ep.recv_done(now, rx);
                }
                LndEvent::PeerDown { .. } => ep.shutdown(now),
                _ => {}
            },
        )
        .unwrap();
        tx_b.send(("b", received)).unwrap();
    });
    let a_thread = std::thread::spawn(move || {
        let mut fa = fa;
        let clock = MonotonicClock::new();
        let mut ep = Endpoint::new(EndpointConfig::new(an, 100), clock.now());
        const N: u64 = 200;
        for i in 0..N {
            let p = payload(i);
            ep.send(clock.now(), bn, hdr(an, bn, p.len()), p, i)
                .unwrap();
        }
        let mut ok = 0u64;
        let mut finished = 0u64;
        run_endpoint(
            &mut fa,
            &mut ep,
            &clock,
            StdDuration::from_millis(5),
            |ep| ep.is_shut_down(),
            |ep, now, ev| {
                if let LndEvent::SendDone { result, .. } = ev {
                    finished += 1;
                    ok += u64::from(result.is_ok());
                    if finished == N {
                        ep.shutdown(now);
                    }
                }
            },
        )
        .unwrap();
        tx.send(("a", ok)).unwrap();
    });
    let mut results = HashMap::new();
    for _ in 0..2 {
        let (who, n) = rx
            .recv_timeout(StdDuration::from_secs(20))
            .expect("threads did not finish in time");
        results.insert(who, n);
    }
    a_thread.join().unwrap();
    b_thread.join().unwrap();
    assert_eq!(results["a"], 200);
    assert_eq!(results["b"], 200);
}

#[test]
fn tcp_fabric_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<TcpFabric>();
}

#[test]
fn tcp_tags_roundtrip() {
    for (op, key, generation) in [
        (OpTag::Accept, 0, 0),
        (OpTag::Recv, 5, 1),
        (OpTag::Send, u32::MAX as usize, GEN_MASK),
        (OpTag::Cancel, 77, 12345),
        (OpTag::Connect, 1, 3),
    ] {
        assert_eq!(untag(tag(op, key, generation)), (Some(op), key, generation));
    }
    let mut s = Slots::default();
    s.post_first(3);
    assert!(s.post(511));
    assert!(!s.post(512));
    assert_eq!(s.take_lowest(), Some(0));
    assert_eq!(s.take_lowest(), Some(1));
    assert_eq!(s.take_lowest(), Some(2));
    assert_eq!(s.take_lowest(), Some(511));
    assert_eq!(s.take_lowest(), None);
}
