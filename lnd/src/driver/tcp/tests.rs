//! Real-socket tests of the tcp fabric over loopback: two endpoints driven alternately from one
//! thread, each test bounded in time.

use crate::engine::LndEvent;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use super::*;
use crate::driver::tamper::Tamper;
use crate::engine::{DownReason, Endpoint, EndpointConfig, TxError};
use crate::iface::Lnd;
use crate::wire::LnetHdr;

type Book = Arc<Mutex<HashMap<Nid, SocketAddr>>>;

const STEP_WAIT: StdDuration = StdDuration::from_micros(500);
/// How long [`run_until`] waits before giving up (the least [`run_for`] does). A condition that
/// holds ends the wait at once, so this only matters when a test fails; it is generous so that a
/// loaded machine (two shared cores running other tests) does not fail a test that would have
/// passed (the 1 to 10 s bounds the tests once named were all below it and so never counted:
/// [`run_until`] takes none). It stays below the default LND timeout (50 s) and keepalive
/// (100 s): a wait for a close "at once" is not satisfied by a timeout instead.
const MIN_WAIT: StdDuration = StdDuration::from_secs(20);

use testkit::nid;

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
    /// The node's fabric; a hostile LND rewrites what the engine asks of it
    /// (`crate::driver::tamper`).
    fabric: Tamper<TcpFabric>,
    ep: Endpoint,
    got: Vec<(Nid, Vec<u8>)>,
    done: HashMap<u64, Result<(), TxError>>,
    downs: Vec<(Nid, DownReason)>,
    /// How the node's LNet answers the next rendezvous requests (none left: nothing matched).
    answers: std::collections::VecDeque<Answer>,
    /// Transfers into this node's memory that ended: (cookie, bytes or why not).
    rdma_done: HashMap<u64, Result<u32, TxError>>,
}

/// How a node's LNet answers a rendezvous request.
enum Answer {
    /// PUT_ACK with this sink; the transfer's outcome under this cookie.
    Accept(crate::engine::RdmaSink, u64),
    /// Write these fragments for a GET; its outcome in `done` under this cookie.
    Reply(Vec<LocalFrag>, u64),
}

impl Node {
    fn new(book: &Book, name: &str, incarnation: u64, clock: &MonotonicClock) -> Node {
        Node::with_config(book, name, incarnation, clock, TcpConfig::default())
    }

    /// A node whose fabric has settings `cfg`, listed in `book`, finding its peers there.
    fn with_config(
        book: &Book,
        name: &str,
        incarnation: u64,
        clock: &MonotonicClock,
        cfg: TcpConfig,
    ) -> Node {
        let b = Arc::clone(book);
        let fabric = TcpFabric::bind_with(
            "127.0.0.1:0".parse().unwrap(),
            move |n| b.lock().unwrap().get(&n).copied(),
            cfg,
        )
        .unwrap();
        book.lock().unwrap().insert(nid(name), fabric.local_addr());
        Node {
            fabric: Tamper::new(fabric),
            ep: Endpoint::new(EndpointConfig::new(nid(name), incarnation), clock.now()),
            got: Vec::new(),
            done: HashMap::new(),
            downs: Vec::new(),
            answers: Default::default(),
            rdma_done: HashMap::new(),
        }
    }

    fn step(&mut self, clock: &MonotonicClock) {
        let Node {
            fabric,
            ep,
            got,
            done,
            downs,
            answers,
            rdma_done,
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
            LndEvent::BulkDone { cookie, result, .. } => {
                assert!(
                    rdma_done.insert(cookie, result).is_none(),
                    "transfer {cookie} finished twice"
                );
            }
            LndEvent::BulkRequest { rx, .. } => match answers.pop_front() {
                Some(Answer::Accept(sink, cookie)) => ep.accept_put_rdma(now, rx, sink, cookie),
                Some(Answer::Reply(src, cookie)) => ep.reply_get_rdma(now, rx, src, cookie),
                None => ep.recv_done(now, rx),
            },
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

/// `a` starts a PUT of `src` by rendezvous to `b`, whose LNet answers with `sink`; both sides
/// report the transfer under `cookie`.
fn start_put(
    a: &mut Node,
    b: &mut Node,
    clock: &MonotonicClock,
    src: LocalFrag,
    sink: crate::engine::RdmaSink,
    cookie: u64,
) {
    b.answers.push_back(Answer::Accept(sink, cookie));
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    let h = hdr(an, bn, src.len as usize);
    a.ep.send_put_rdma(clock.now(), bn, h, vec![src], cookie)
        .unwrap();
}

/// Steps every node until `cond` holds or [`MIN_WAIT`] passes; returns whether it held.
fn run_until(
    nodes: &mut [&mut Node],
    clock: &MonotonicClock,
    cond: impl FnMut(&[&mut Node]) -> bool,
) -> bool {
    run_for(nodes, clock, MIN_WAIT, cond)
}

/// [`run_until`] for a condition that may take longer: waits up to `limit` (at least
/// [`MIN_WAIT`]).
fn run_for(
    nodes: &mut [&mut Node],
    clock: &MonotonicClock,
    limit: StdDuration,
    mut cond: impl FnMut(&[&mut Node]) -> bool,
) -> bool {
    let limit = limit.max(MIN_WAIT);
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

/// The first node (`10.0.0.1@o2ib`, incarnation 100) alone in a new book, and the clock it runs
/// on.
fn first_node() -> (MonotonicClock, Book, Node) {
    let clock = MonotonicClock::new();
    let book = Book::default();
    let a = Node::new(&book, "10.0.0.1@o2ib", 100, &clock);
    (clock, book, a)
}

/// Two nodes with one connection between them (one message each way delivered), and the
/// clock they run on.
fn connected_pair() -> (MonotonicClock, Book, Node, Node) {
    let (clock, book, mut a) = first_node();
    let mut b = Node::new(&book, "10.0.0.2@o2ib", 200, &clock);
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    a.send(&clock, bn, 1, payload(0));
    b.send(&clock, an, 1, payload(0));
    assert!(
        run_until(&mut [&mut a, &mut b], &clock, |n| {
            n.iter().all(|n| n.done.len() == 1 && n.got.len() == 1)
        }),
        "pair did not connect"
    );
    assert_eq!(a.done[&1], Ok(()));
    assert_eq!(b.done[&1], Ok(()));
    (clock, book, a, b)
}

fn shut_down_both(a: &mut Node, b: &mut Node, clock: &MonotonicClock) {
    let now = clock.now();
    a.ep.shutdown(now);
    b.ep.shutdown(now);
    assert!(
        run_until(&mut [a, b], clock, |n| {
            n.iter().all(|n| n.ep.is_shut_down())
        }),
        "endpoints did not shut down"
    );
    // The last Destroys reach the fabrics, whose sockets then close.
    assert!(run_until(&mut [a, b], clock, |n| n
        .iter()
        .all(|n| n.fabric.sockets() == 0)));
}

#[test]
fn tcp_exchange_1000_messages_each_way() {
    let (clock, book, mut a) = first_node();
    let mut b = Node::new(&book, "10.0.0.2@o2ib", 200, &clock);
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    const N: u64 = 1000;
    for i in 0..N {
        a.send(&clock, bn, i, payload(i));
        b.send(&clock, an, i, payload(i));
    }
    let ok = run_for(
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
    let (clock, _book, mut a, mut b) = connected_pair();
    let an = a.ep.nid();
    a.ep.shutdown(clock.now());
    let ok = run_until(&mut [&mut a, &mut b], &clock, |n| {
        n[0].ep.is_shut_down() && n[1].conns() == 0
    });
    // "At once": B saw A's DISCONNECT (counted below) within a wait shorter than any LND
    // timeout, not a keepalive or timeout expiring (50 s and more by default).
    assert!(
        ok,
        "a shut down: {}, b conns: {}",
        a.ep.is_shut_down(),
        b.conns()
    );
    assert!(b.fabric.stats().peer_disconnects >= 1);
    assert_eq!(b.fabric.stats().eof_without_disconnect, 0);
    assert!(b.downs.contains(&(an, DownReason::Closed)), "{:?}", b.downs);
    // Both fabrics let go of every socket.
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n
        .iter()
        .all(|n| n.fabric.sockets() == 0)));
    b.ep.shutdown(clock.now());
    assert!(run_until(&mut [&mut b], &clock, |n| n[0].ep.is_shut_down()));
}

#[test]
fn tcp_dropped_fabric_is_seen_at_once_and_messages_end() {
    let (clock, _book, a, mut b) = connected_pair();
    let an = a.ep.nid();
    // The process-equivalent dies: its sockets close without a DISCONNECT frame.
    let Node {
        fabric, ep: a_ep, ..
    } = a;
    drop(fabric);
    // Messages sent right away: on the dying connection or queued behind it.
    for c in 10..15 {
        b.send(&clock, an, c, payload(c));
    }
    let ok = run_until(&mut [&mut b], &clock, |n| n[0].conns() == 0);
    // "At once": the end of the stream (counted below) closed it within a wait shorter than any
    // LND timeout, not a keepalive or timeout expiring (50 s and more by default).
    assert!(ok, "b still has {} conns", b.conns());
    assert_eq!(b.ep.stats().silent_peers, 0, "{:?}", b.ep.stats());
    let s = b.fabric.stats();
    assert!(
        s.eof_without_disconnect + s.resets >= 1,
        "no EOF/RST counted: {s:?}"
    );
    // Every one of them ends with a status.
    assert!(run_until(&mut [&mut b], &clock, |n| {
        (10..15).all(|c| n[0].done.contains_key(&c))
    }));
    // Messages queued now fail: nobody listens any more.
    for c in 20..25 {
        b.send(&clock, an, c, payload(c));
    }
    assert!(run_until(&mut [&mut b], &clock, |n| {
        (20..25).all(|c| n[0].done.contains_key(&c))
    }));
    for c in 20..25 {
        // ECONNREFUSED: refused, not unreachable (o2iblnd's REMOTE_DROPPED).
        assert_eq!(b.done[&c], Err(TxError::ConnectRefused), "message {c}");
    }
    // A peer that vanished is not one that closed (3FS #426): lost (to the EOF itself, or to
    // the send it failed first), never `Closed`.
    let why = b.downs.first().map(|d| d.1);
    assert!(
        matches!(
            why,
            Some(DownReason::ConnectionLost | DownReason::Unreachable)
        ),
        "{:?}",
        b.downs
    );
    let st = b.ep.stats();
    assert_eq!((st.conns_lost, st.graceful_closes), (1, 0), "{st:?}");
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
    let ok = run_until(nodes, clock, |_| {
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
    let (clock, _book, mut a, mut b) = connected_pair();
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    let conn_before: Vec<_> = b.ep.conns().map(|c| c.id).collect();
    let target = b.fabric.local_addr();

    // 1. Random bytes.
    let garbage = testkit::noise(0x2545_f491_4f6c_dd1d, 256);
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
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n
        .iter()
        .all(|n| n.done.len() == 21 && n.got.len() == 21)));
    assert!(a.done.values().chain(b.done.values()).all(|r| *r == Ok(())));
    // Garbage sockets are all gone; one connection each side remains.
    assert_eq!(b.fabric.sockets(), 1);
    shut_down_both(&mut a, &mut b, &clock);
}

#[test]
fn tcp_connect_to_nobody_fails_queued_messages() {
    let (clock, book, mut a) = first_node();
    // A port held by a socket that never listens: a connect to it is refused, and nobody else
    // can take the port while the test runs.
    let (_held, dead) = refusing_addr();
    let nobody = nid("10.0.0.9@o2ib");
    book.lock().unwrap().insert(nobody, dead);
    let unknown = nid("10.0.0.10@o2ib"); // not in the book at all
    for c in 0..3 {
        a.send(&clock, nobody, c, payload(c));
    }
    a.send(&clock, unknown, 7, payload(7));
    assert!(run_until(&mut [&mut a], &clock, |n| {
        n[0].done.len() == 4
    }));
    // Failed by the refusal, not by the connect deadline expiring.
    assert_eq!(a.ep.stats().connect_timeouts, 0, "{:?}", a.ep.stats());
    for c in [0, 1, 2] {
        assert_eq!(a.done[&c], Err(TxError::ConnectRefused), "message {c}");
    }
    // No address for it at all: not reached, rather than refused.
    assert_eq!(a.done[&7], Err(TxError::ConnectFailed), "message 7");
    assert!(a.fabric.stats().connect_failures >= 2);
    // The failed attempts are reaped, and the fabric lets go of them.
    assert!(run_until(&mut [&mut a], &clock, |n| {
        n[0].conns() == 0 && n[0].fabric.sockets() == 0
    }));
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
    let mut n = Node::with_config(&Book::default(), "10.0.0.1@o2ib", 1, &clock, cfg);
    let t0 = std::time::Instant::now();
    let mut raw = TcpStream::connect(n.fabric.local_addr()).unwrap();
    read_until_closed(&mut raw, &mut [&mut n], &clock);
    let took = t0.elapsed();
    // Not before the handshake timeout; closed by it (the counter), however late a loaded
    // machine let the test see the close.
    assert!(took >= StdDuration::from_millis(200), "took {took:?}");
    assert_eq!(n.fabric.stats().handshake_timeouts, 1);
    assert!(run_until(&mut [&mut n], &clock, |n| {
        n[0].fabric.sockets() == 0
    }));
}

/// Sockets accepted on B: connects raw sockets that send nothing and steps B until it holds
/// `expect` of them in their handshake.
fn silent_clients(n: usize, b: &mut Node, clock: &MonotonicClock) -> Vec<TcpStream> {
    let raws: Vec<TcpStream> = (0..n)
        .map(|_| TcpStream::connect(b.fabric.local_addr()).unwrap())
        .collect();
    let accepted0 = b.fabric.stats().accepted;
    assert!(
        run_until(&mut [b], clock, |n| n[0].fabric.stats().accepted
            >= accepted0 + raws.len() as u64),
        "B did not accept the silent clients"
    );
    raws
}

#[test]
fn tcp_handshake_sockets_hold_a_small_buffer_until_established() {
    let (clock, _book, mut a, mut b) = connected_pair();
    let full = TcpConfig::default().recv_buffer;
    let small = TcpConfig::default().handshake_buffer;
    assert!(small <= 1024, "{small}");
    // Every open connection has the full buffer (B's passive side grew once established);
    // both connected at once, so there may be two (the race's loser closing).
    let open_full = |f: &TcpFabric| {
        let open: Vec<usize> = f
            .socks
            .iter()
            .filter(|(_, s)| s.phase == Phase::Open)
            .map(|(_, s)| s.rbuf_len)
            .collect();
        !open.is_empty() && open.iter().all(|&n| n == full)
    };
    assert!(open_full(&a.fabric) && open_full(&b.fabric));
    assert_eq!(b.fabric.handshakes(), 0);
    let before = b.fabric.rx_buffer_bytes();
    assert!(before >= full);

    let raws = silent_clients(10, &mut b, &clock);
    assert_eq!(b.fabric.handshakes(), 10);
    assert_eq!(b.fabric.rx_buffer_bytes(), before + 10 * small);
    let c = b.fabric.counters();
    assert!(c.contains(&("handshakes", 10)), "{c:?}");
    assert!(
        c.contains(&("rx_buffer_bytes", (before + 10 * small) as u64)),
        "{c:?}"
    );

    // The connection still carries messages of every size while they wait.
    let an = a.ep.nid();
    for i in 1..=20 {
        b.send(&clock, an, 100 + i, payload(i * 97));
    }
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n[0].got.len()
        == 21
        && n[1].done.len() == 21));

    // Gone: every handshake buffer is freed (none is kept in the pool).
    drop(raws);
    assert!(
        run_until(&mut [&mut a, &mut b], &clock, |n| n[1].fabric.handshakes()
            == 0
            && n[1].fabric.rx_buffer_bytes() <= before),
        "B still holds {} handshakes",
        b.fabric.handshakes()
    );
    assert!(open_full(&b.fabric));
    assert!(b.fabric.pool.iter().all(|v| v.capacity() >= full));
    assert_eq!(b.fabric.stats().handshake_timeouts, 0);
    shut_down_both(&mut a, &mut b, &clock);
}

#[test]
fn tcp_handshake_limit_refuses_the_excess_and_counts_it() {
    let (clock, book, mut a) = first_node();
    let b_cfg = TcpConfig {
        handshake_limit: 4,
        ..TcpConfig::default()
    };
    let mut b = Node::with_config(&book, "10.0.0.2@o2ib", 200, &clock, b_cfg);
    let mut raws = silent_clients(7, &mut b, &clock);
    assert_eq!(b.fabric.handshakes(), 4);
    assert_eq!(b.fabric.stats().handshakes_refused, 3);
    // The refused ones are closed at once: three of the seven read EOF.
    let mut closed = 0;
    for r in &mut raws {
        r.set_read_timeout(Some(StdDuration::from_millis(200)))
            .unwrap();
        let mut buf = [0u8; 8];
        match r.read(&mut buf) {
            Ok(0) => closed += 1,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => closed += 1,
            _ => {} // still waiting for its CONNREQ
        }
    }
    assert_eq!(closed, 3);
    // Once the silent ones are gone, a real peer connects.
    drop(raws);
    assert!(run_until(&mut [&mut b], &clock, |n| n[0]
        .fabric
        .handshakes()
        == 0));
    let bn = b.ep.nid();
    a.send(&clock, bn, 1, payload(1));
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n[1].got.len() == 1));
    assert_eq!(b.fabric.stats().handshakes_refused, 3);
    let c = b.fabric.counters();
    assert!(c.contains(&("handshakes_refused", 3)), "{c:?}");
    shut_down_both(&mut a, &mut b, &clock);
}

#[test]
fn tcp_bind_retries_an_address_in_use_then_fails_clearly() {
    let holder = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap();
    // No retry: fails at once.
    let cfg = |ms| TcpConfig {
        bind_retry: StdDuration::from_millis(ms),
        ..TcpConfig::default()
    };
    let e = TcpFabric::bind_with(addr, |_| None, cfg(0)).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
    // Still held after the retry: a clear error.
    let t0 = std::time::Instant::now();
    let e = TcpFabric::bind_with(addr, |_| None, cfg(300))
        .err()
        .unwrap();
    assert!(t0.elapsed() >= StdDuration::from_millis(300));
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
    assert!(e.to_string().contains("after retrying"), "{e}");
    // Released while retrying: binds.
    let t = std::thread::spawn(move || {
        std::thread::sleep(StdDuration::from_millis(200));
        drop(holder);
    });
    let f = TcpFabric::bind_with(addr, |_| None, cfg(10_000)).unwrap();
    assert_eq!(f.local_addr(), addr);
    t.join().unwrap();
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
    /// Runs an endpoint for `me` over `f` on this thread until it shut down: `start` queues
    /// its first sends, `on_event` sees every event.
    fn run_to_shutdown(
        mut f: TcpFabric,
        me: (Nid, u64),
        start: impl FnOnce(&mut Endpoint, Instant),
        on_event: impl FnMut(&mut Endpoint, Instant, LndEvent),
    ) {
        let clock = MonotonicClock::new();
        let mut ep = Endpoint::new(EndpointConfig::new(me.0, me.1), clock.now());
        start(&mut ep, clock.now());
        let max_wait = StdDuration::from_millis(5);
        run_endpoint(
            &mut f,
            &mut ep,
            &clock,
            max_wait,
            |ep| ep.is_shut_down(),
            on_event,
        )
        .unwrap();
    }
    let b_thread = std::thread::spawn(move || {
        let mut received = 0u64;
        run_to_shutdown(
            fb,
            (bn, 200),
            |_, _| {},
            |ep, now, ev| match ev {
                LndEvent::Received { payload: p, rx, .. } => {
                    assert_eq!(index_of(&p), received);
                    received += 1;
                    ep.recv_done(now, rx);
                }
                LndEvent::PeerDown { .. } => ep.shutdown(now),
                _ => {}
            },
        );
        tx_b.send(("b", received)).unwrap();
    });
    let a_thread = std::thread::spawn(move || {
        const N: u64 = 200;
        let mut ok = 0u64;
        let mut finished = 0u64;
        run_to_shutdown(
            fa,
            (an, 100),
            |ep, now| {
                for i in 0..N {
                    let p = payload(i);
                    ep.send(now, bn, hdr(an, bn, p.len()), p, i).unwrap();
                }
            },
            |ep, now, ev| {
                if let LndEvent::SendDone { result, .. } = ev {
                    finished += 1;
                    ok += u64::from(result.is_ok());
                    if finished == N {
                        ep.shutdown(now);
                    }
                }
            },
        );
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
        (OpTag::Send, u32::MAX, (1 << GEN_BITS) - 1),
        (OpTag::Cancel, 77, 12345),
        (OpTag::Connect, 1, 3),
        (OpTag::Waker, 0, 0),
        (OpTag::AcceptCancel, 0, 0),
    ] {
        let sock = SockId::from_parts(key, generation);
        assert_eq!(untag(tag(op, sock)), (Some(op), sock));
    }
    assert_eq!(
        untag(tag(OpTag::Accept, NO_SOCK)),
        (Some(OpTag::Accept), NO_SOCK)
    );
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

/// A completion (or a ready or pending-send entry) for a socket that was freed, its slot then
/// reused, is dropped: it must not count down, disarm or hand a buffer to the socket that lives
/// in the slot now. Only the socket's own handle reaches it.
#[test]
fn tcp_stale_completion_for_a_reused_socket_slot_is_ignored() {
    struct Events(usize);
    impl FabricSink for Events {
        fn fabric_event(&mut self, _: Instant, _: crate::fabric::FabricEvent<'_>) {
            self.0 += 1;
        }
        fn recycle(&mut self, _: Vec<u8>) {}
    }
    let mut f = TcpFabric::bind("127.0.0.1:0".parse().unwrap(), |_| None).unwrap();
    // A socket with nothing in flight is freed at once.
    let old = f.new_sock(None, Phase::Closed, false, None);
    f.maybe_free(old);
    assert_eq!(f.sockets(), 0);
    let new = f.new_sock(None, Phase::Closed, false, None);
    assert_eq!(new.index(), old.index(), "the slot is reused");
    assert_ne!(new, old);
    // The new socket has a receive in flight, and is queued to parse and to send.
    {
        let s = &mut f.socks[new];
        s.ops = 1;
        s.recv_armed = true;
        s.in_ready = true;
        s.tx_pending = true;
    }
    let recv = |sock, result| Completion {
        tag: tag(OpTag::Recv, sock),
        result,
        more: false,
        buf: Some(vec![0; 64]),
        fd: None,
    };
    let mut sink = Events(0);
    f.complete(recv(old, 64), &mut sink, Instant::ZERO);
    f.ready.push(old);
    f.run_ready(&mut sink, Instant::ZERO);
    f.tx_pending.push(old);
    f.arm_pending_sends();
    let s = &f.socks[new];
    assert_eq!(
        (
            s.ops,
            s.recv_armed,
            s.rbuf.is_none(),
            s.in_ready,
            s.tx_pending
        ),
        (1, true, true, true, true),
        "untouched by the old socket's completion and entries"
    );
    assert_eq!(sink.0, 0);
    // Its own (cancelled) receive comes back: the shut socket has nothing in flight and goes.
    f.complete(recv(new, -libc::ECANCELED), &mut sink, Instant::ZERO);
    assert!(!f.socks.contains(new));
    assert_eq!((f.sockets(), sink.0), (0, 0));
}

// ------------------------------------------------------------------ RDMA writes

const MIB: usize = 1 << 20;

/// A WrId the engine cannot mistake for its own (as the simulator's injected writes): top bit
/// set, low 32 bits all ones.
fn injected(i: u64) -> WrId {
    WrId(1 << 63 | i << 32 | u64::from(u32::MAX))
}

fn is_injected(wr: WrId) -> bool {
    wr.0 >> 63 == 1 && wr.0 as u32 == u32::MAX
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32 ^ seed).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect()
}

/// The connection `n` uses to reach `peer`.
fn conn_to(n: &Node, peer: Nid) -> ConnId {
    n.ep.conns()
        .find(|c| c.peer == peer && c.state == crate::engine::ConnState::Established)
        .expect("connected to the peer")
        .id
}

/// Opens `n`'s whole region `reg` to RDMA writes from `peer`, as the engine does for the sink
/// of a PUT_ACK or GET_REQ (a raw write without a grant is refused: see
/// `tcp_rdma_write_needs_a_grant_of_its_own_connection`).
fn grant_all(n: &mut Node, clock: &MonotonicClock, peer: Nid, reg: &Registration) -> WrId {
    let conn = conn_to(n, peer);
    let id = WrId(u64::MAX - u64::from(reg.key()));
    let sink = vec![reg.remote_frag(0, reg.len() as u32)];
    n.fabric
        .apply(clock.now(), FabricAction::GrantWrites { conn, id, sink });
    id
}

/// How write (or send) `wr` completed at `n`, if it did; panics if it completed twice.
fn status(n: &Node, wr: WrId) -> Option<WcStatus> {
    let mut it = n.fabric.wc_log.iter().filter(|(_, w, _)| *w == wr);
    let first = it.next().map(|e| e.2);
    assert!(it.next().is_none(), "{wr:?} completed twice");
    first
}

fn post_write(
    n: &mut Node,
    clock: &MonotonicClock,
    conn: ConnId,
    wr: WrId,
    local: Vec<LocalFrag>,
    remote: Vec<RemoteFrag>,
) {
    n.fabric.apply(
        clock.now(),
        FabricAction::RdmaWrite {
            conn,
            wr,
            local,
            remote,
        },
    );
}

/// A write of one fragment each side.
#[allow(clippy::too_many_arguments)]
fn post_write1(
    n: &mut Node,
    clock: &MonotonicClock,
    conn: ConnId,
    wr: WrId,
    src: &Registration,
    local_offset: u64,
    remote: crate::fabric::RemoteRegion,
    len: u32,
) {
    let local = vec![src.local_frag(local_offset, len)];
    post_write(n, clock, conn, wr, local, vec![remote.frag(len)]);
}

/// Remote fragments with other boundaries than `frags_257`'s, still 257 of them for 1 MiB, each
/// 8 KiB apart in the sink (so that a piece landing in the wrong fragment shows).
fn remote_257(sink: &Registration) -> Vec<RemoteFrag> {
    let mut lens = vec![1000u32];
    lens.extend(std::iter::repeat_n(4096, 255));
    lens.push(MIB as u32 - 1000 - 255 * 4096);
    lens.iter()
        .enumerate()
        .map(|(k, &len)| sink.remote_frag(k as u64 * 8192, len))
        .collect()
}

#[test]
fn tcp_rdma_write_257_fragments_then_a_send_arrives_after_the_data() {
    let (clock, _book, mut a, mut b) = connected_pair();
    let bn = b.ep.nid();
    let conn = conn_to(&a, bn);
    let src = a.fabric.register(pattern(1, MIB)).unwrap();
    let sink = b.fabric.register(vec![0; 257 * 8192]).unwrap();
    let local: Vec<LocalFrag> = testkit::frags_257()
        .iter()
        .map(|&(off, len)| src.local_frag(off, len))
        .collect();
    let remote = remote_257(&sink);
    grant_all(&mut b, &clock, a.ep.nid(), &sink);
    assert_eq!((local.len(), remote.len()), (257, 257));
    let want =
        crate::fabric::expected_sink(&pattern(1, MIB), 257 * 8192, sink.addr(), &local, &remote);
    let pieces = crate::fabric::rdma_pieces(&local, &remote).count() as u64;
    assert!(pieces > 257);
    let got_before = b.got.len();
    post_write(&mut a, &clock, conn, injected(0), local, remote);
    // A message behind the write (PUT_DONE-like): it must find the data in place.
    a.send(&clock, bn, 50, payload(50));
    let ok = run_until(&mut [&mut a, &mut b], &clock, |n| {
        if n[1].got.len() > got_before {
            assert!(
                n[1].fabric.region(&sink) == Some(&want[..]),
                "the message arrived before the data"
            );
        }
        n[0].done.contains_key(&50) && n[1].got.len() > got_before
    });
    assert!(ok, "a: {:?}, b got {}", a.fabric.stats(), b.got.len());
    assert_eq!(index_of(&b.got.last().unwrap().1), 50);
    assert_eq!(a.done[&50], Ok(()));
    assert!(b.fabric.contents(&sink).unwrap() == want);
    // The write completed once, Success, before the message behind it.
    let log: Vec<_> = a.fabric.wc_log.iter().filter(|e| e.0 == conn).collect();
    let writes: Vec<_> = log.iter().filter(|e| is_injected(e.1)).collect();
    assert_eq!(writes.len(), 1);
    assert_eq!((writes[0].1, writes[0].2), (injected(0), WcStatus::Success));
    let last_write = log.iter().rposition(|e| is_injected(e.1)).unwrap();
    assert!(
        log[last_write + 1..]
            .iter()
            .any(|e| e.2 == WcStatus::Success),
        "the message completed before the write"
    );
    let (sa, sb) = (a.fabric.stats().clone(), b.fabric.stats().clone());
    assert_eq!((sa.rdma_writes_tx, sa.rdma_bytes_tx), (1, MIB as u64));
    assert_eq!((sb.rdma_frames_rx, sb.rdma_bytes_rx), (pieces, MIB as u64));
    assert_eq!(sb.rdma_access_errors + sb.protocol_errors(), 0);
    assert_eq!(sb.rx_stalls, 0);

    // One 1 MiB write: 16 frames of 64 KiB + 17 bytes, each larger than b's 64 KiB receive
    // buffer (it streams into the region), then a message.
    assert_eq!(b.fabric.config().recv_buffer, 64 * 1024);
    let src2 = a.fabric.register(pattern(2, MIB)).unwrap();
    let sink2 = b.fabric.register(vec![0; MIB]).unwrap();
    grant_all(&mut b, &clock, a.ep.nid(), &sink2);
    post_write1(
        &mut a,
        &clock,
        conn,
        injected(1000),
        &src2,
        0,
        sink2.remote(),
        MIB as u32,
    );
    a.send(&clock, bn, 51, payload(51));
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n[0]
        .done
        .contains_key(&51)
        && n[1].got.len() > got_before + 1));
    assert_eq!(status(&a, injected(1000)), Some(WcStatus::Success));
    assert!(b.fabric.region(&sink2) == a.fabric.region(&src2));
    assert_eq!(b.fabric.stats().rdma_frames_rx, pieces + 16);
    // Deregistering gives the buffer back; the key then names nothing.
    let ghost = Registration::new(sink2.id(), sink2.key(), sink2.addr(), sink2.len());
    assert!(b.fabric.deregister(sink2).unwrap() == pattern(2, MIB));
    assert!(b.fabric.region(&ghost).is_none());
    assert!(b.fabric.deregister(ghost).is_none());
    shut_down_both(&mut a, &mut b, &clock);
}

/// Writes of 3 local fragments onto 4 remote ones with other boundaries and odd lengths land
/// byte-exact, pieces in order; so do the same lists reversed in size.
#[test]
fn tcp_rdma_write_fragment_lists_land_byte_exact() {
    let (clock, _book, mut a, mut b) = connected_pair();
    let bn = b.ep.nid();
    let conn = conn_to(&a, bn);
    let data = pattern(7, 200_000);
    let src = a.fabric.register(data.clone()).unwrap();
    let sink = b.fabric.register(vec![0; 300_000]).unwrap();
    grant_all(&mut b, &clock, a.ep.nid(), &sink);
    // 3 local fragments (out of order in the source), 4 remote ones (with gaps), 150_001 bytes.
    let local = vec![
        src.local_frag(100_003, 70_001),
        src.local_frag(7, 13),
        src.local_frag(1_000, 79_987),
    ];
    let remote = vec![
        sink.remote_frag(5, 33),
        sink.remote_frag(1_001, 65_537),
        sink.remote_frag(80_000, 84_430),
        sink.remote_frag(200_001, 1),
    ];
    let mut want = vec![0; 300_000];
    let mut srcs = vec![];
    for p in crate::fabric::rdma_pieces(&local, &remote) {
        srcs.push((p.local_frag, p.remote_frag));
        let (s, d, n) = (
            p.offset as usize,
            (p.addr - sink.addr()) as usize,
            p.len as usize,
        );
        want[d..d + n].copy_from_slice(&data[s..s + n]);
    }
    assert!(srcs.len() >= 6, "{srcs:?}");
    post_write(
        &mut a,
        &clock,
        conn,
        injected(1),
        local.clone(),
        remote.clone(),
    );
    // The reversed lists, onto a second sink.
    let sink2 = b.fabric.register(vec![0; 300_000]).unwrap();
    grant_all(&mut b, &clock, a.ep.nid(), &sink2);
    let (mut l2, r2): (Vec<_>, Vec<_>) = (
        local.iter().rev().copied().collect(),
        remote
            .iter()
            .rev()
            .map(|f| sink2.remote_frag(f.addr - sink.addr(), f.len))
            .collect(),
    );
    l2.iter_mut().for_each(|f| f.region = src.id());
    let want2 = crate::fabric::expected_sink(&data, 300_000, sink2.addr(), &l2, &r2);
    post_write(&mut a, &clock, conn, injected(2), l2, r2);
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| status(
        n[0],
        injected(2)
    )
    .is_some()));
    assert_eq!(status(&a, injected(1)), Some(WcStatus::Success));
    assert_eq!(status(&a, injected(2)), Some(WcStatus::Success));
    // The peer parsed everything written before a's completion only eventually.
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n[1]
        .fabric
        .stats()
        .rdma_bytes_rx
        == 2 * 150_001));
    assert!(b.fabric.contents(&sink).unwrap() == want);
    assert!(b.fabric.contents(&sink2).unwrap() == want2);
    assert_eq!(a.fabric.stats().rdma_bytes_tx, 2 * 150_001);
    shut_down_both(&mut a, &mut b, &clock);
}

#[test]
fn tcp_rdma_write_outside_the_region_fails_and_writes_nothing() {
    use crate::fabric::RemoteRegion;
    type Frags = (Vec<LocalFrag>, Vec<RemoteFrag>);
    type Aim = fn(&Registration, &Registration) -> Frags;
    fn one(src: &Registration, off: u64, r: RemoteRegion, len: u32) -> Frags {
        (vec![src.local_frag(off, len)], vec![r.frag(len)])
    }
    // (what, the write from a's source onto b's sink, refused by the target (else locally))
    let cases: [(&str, Aim, bool); 10] = [
        (
            "unknown key",
            |s, r| {
                let r = r.remote();
                one(
                    s,
                    0,
                    RemoteRegion {
                        key: r.key ^ 1,
                        ..r
                    },
                    4096,
                )
            },
            true,
        ),
        (
            "past the end",
            |s, r| one(s, 0, r.remote().at(MIB as u64 - 100), 4096),
            true,
        ),
        (
            "below the start",
            |s, r| one(s, 0, r.remote().at(u64::MAX), 4096),
            true,
        ),
        ("deregistered", |s, r| one(s, 0, r.remote(), 4096), true),
        ("huge length", |s, r| one(s, 0, r.remote(), u32::MAX), false),
        (
            "outside the local region",
            |s, r| one(s, MIB as u64 - 8, r.remote(), 4096),
            false,
        ),
        (
            "a later local fragment outside its region",
            |s, r| {
                (
                    vec![
                        s.local_frag(0, 100),
                        s.local_frag(200, 100),
                        s.local_frag(MIB as u64 - 50, 100),
                    ],
                    vec![r.remote_frag(0, 150), r.remote_frag(1000, 150)],
                )
            },
            false,
        ),
        (
            "258 fragments a side",
            |s, r| {
                (
                    (0..258).map(|i| s.local_frag(i * 8, 8)).collect(),
                    (0..258).map(|i| r.remote_frag(i * 16, 8)).collect(),
                )
            },
            false,
        ),
        (
            "totals differ",
            |s, r| {
                (
                    vec![s.local_frag(0, 100), s.local_frag(100, 100)],
                    vec![r.remote_frag(0, 150), r.remote_frag(1000, 49)],
                )
            },
            false,
        ),
        (
            "an empty fragment",
            |s, r| {
                (
                    vec![s.local_frag(0, 100), s.local_frag(100, 0)],
                    vec![r.remote_frag(0, 100)],
                )
            },
            false,
        ),
    ];
    for (what, aim, remote_error) in cases {
        let (clock, _book, mut a, mut b) = connected_pair();
        let (an, bn) = (a.ep.nid(), b.ep.nid());
        let conn = conn_to(&a, bn);
        let src = a.fabric.register(pattern(3, MIB)).unwrap();
        let sink = b.fabric.register(vec![0; MIB]).unwrap();
        // A live region right after it: a write past the end must not spill into it.
        let next = b.fabric.register(vec![0; MIB]).unwrap();
        let (local, remote) = aim(&src, &sink);
        let sink = if what == "deregistered" {
            b.fabric.deregister(sink).unwrap();
            None
        } else {
            Some(sink)
        };
        let got_before = b.got.len();
        let wr = injected(1);
        post_write(&mut a, &clock, conn, wr, local, remote);
        // Queued behind the bad write.
        a.send(&clock, bn, 60, payload(60));
        assert!(
            run_until(&mut [&mut a, &mut b], &clock, |n| {
                status(n[0], wr).is_some()
                    && n[0].done.contains_key(&60)
                    && n[0].downs.iter().any(|d| d.0 == bn)
                    && n[1].conns() == 0
            }),
            "{what}: a {:?} b {:?}",
            a.fabric.stats(),
            b.fabric.stats()
        );
        assert_eq!(
            b.got.len(),
            got_before,
            "{what}: the message behind it was delivered"
        );
        if let Some(sink) = &sink {
            assert!(
                b.fabric.region(sink).unwrap().iter().all(|&x| x == 0),
                "{what}"
            );
        }
        assert!(
            b.fabric.region(&next).unwrap().iter().all(|&x| x == 0),
            "{what}"
        );
        let (sa, sb) = (a.fabric.stats(), b.fabric.stats());
        assert_eq!(sb.rdma_frames_rx + sb.rdma_bytes_rx, 0, "{what}");
        if remote_error {
            // The target refused it and closed the connection. Over TCP the writer's Success
            // means "written to the socket": it may come before the close is seen.
            assert_eq!(sb.rdma_access_errors, 1, "{what}");
            assert_eq!(sa.rdma_local_errors, 0, "{what}");
            assert!(b.downs.iter().any(|d| d.0 == an), "{what}: {:?}", b.downs);
        } else {
            // Refused before a byte left: Error, the message behind it flushed.
            assert_eq!(status(&a, wr), Some(WcStatus::Error), "{what}");
            assert_eq!(sa.rdma_local_errors, 1, "{what}");
            assert_eq!(sb.rdma_access_errors, 0, "{what}");
            assert_eq!(sa.rdma_bytes_tx, 0, "{what}");
            assert!(a.done[&60].is_err(), "{what}");
            let log: Vec<_> = a.fabric.wc_log.iter().filter(|e| e.0 == conn).collect();
            let i = log.iter().position(|e| e.1 == wr).unwrap();
            assert!(
                log[i + 1..].iter().all(|e| e.2 == WcStatus::Flushed),
                "{what}"
            );
        }
        assert_eq!(sa.protocol_errors() + sb.protocol_errors(), 0, "{what}");
    }
}

/// Posts eight 1 MiB writes (`injected(0..8)`) of all of `src` into `remote` on `conn`.
fn post_mib_writes(
    a: &mut Node,
    clock: &MonotonicClock,
    conn: ConnId,
    src: &Registration,
    remote: crate::fabric::RemoteRegion,
) {
    for i in 0..8 {
        post_write1(a, clock, conn, injected(i), src, 0, remote, MIB as u32);
    }
}

/// Runs `nodes` until every write of [`post_mib_writes`] completed at the first (within 5 s):
/// their statuses, in posting order.
fn mib_write_statuses(nodes: &mut [&mut Node], clock: &MonotonicClock) -> Vec<WcStatus> {
    assert!(run_until(nodes, clock, |n| {
        (0..8).all(|i| status(n[0], injected(i)).is_some())
    }));
    (0..8)
        .map(|i| status(nodes[0], injected(i)).unwrap())
        .collect()
}

#[test]
fn tcp_rdma_writes_racing_a_disconnect_flush() {
    // 1. The target dies (its fabric dropped) right after 8 MiB of writes are posted.
    let (clock, _book, mut a, b) = connected_pair();
    let bn = b.ep.nid();
    let conn = conn_to(&a, bn);
    let src = a.fabric.register(pattern(4, MIB)).unwrap();
    let Node {
        fabric: mut fb,
        ep: b_ep,
        ..
    } = b;
    let sink = fb.register(vec![0; MIB]).unwrap();
    let remote = sink.remote();
    post_mib_writes(&mut a, &clock, conn, &src, remote);
    drop(fb);
    let st = mib_write_statuses(&mut [&mut a], &clock);
    let first_bad = st
        .iter()
        .position(|s| *s != WcStatus::Success)
        .expect("some failed");
    assert!(
        matches!(st[first_bad], WcStatus::Error | WcStatus::Flushed),
        "{st:?}"
    );
    assert!(
        st[first_bad + 1..].iter().all(|s| *s == WcStatus::Flushed),
        "{st:?}"
    );
    assert_eq!(st[7], WcStatus::Flushed);
    assert!(a.downs.iter().any(|d| d.0 == bn));
    drop(b_ep); // logs the ungraceful drop, as intended

    // 2. The target closes gracefully: its DISCONNECT flushes what the writer has not finished,
    //    and a write posted on the closing connection flushes at once.
    let (clock, _book, mut a, mut b) = connected_pair();
    let bn = b.ep.nid();
    let conn = conn_to(&a, bn);
    let src = a.fabric.register(pattern(5, MIB)).unwrap();
    let _sink = b.fabric.register(vec![0; MIB]).unwrap();
    let remote = _sink.remote();
    b.ep.shutdown(clock.now());
    b.step(&clock); // b's DISCONNECT goes out first
    post_mib_writes(&mut a, &clock, conn, &src, remote);
    let st = mib_write_statuses(&mut [&mut a, &mut b], &clock);
    assert!(st.iter().all(|s| *s == WcStatus::Flushed), "{st:?}");
    assert!(a.fabric.stats().peer_disconnects >= 1);
    assert_eq!(a.fabric.stats().rdma_writes_tx, 0);
    a.ep.shutdown(clock.now());
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| {
        n.iter().all(|n| n.ep.is_shut_down())
    }));
}

#[test]
fn tcp_garbage_rdma_write_frames_are_counted_and_close_only_that_connection() {
    let (clock, book, mut c, mut b) = connected_pair();
    let (bn, cn) = (b.ep.nid(), c.ep.nid());
    let sink = b.fabric.register(vec![0; 4096]).unwrap();
    let (key, addr) = (sink.key(), sink.addr());
    let write_frame = |key: u32, addr: u64, data: &[u8]| {
        let mut f = Vec::new();
        frame::push_write_head(&mut f, key, addr, data.len());
        f.extend_from_slice(data);
        f
    };
    // (what, bytes on the stream, then the writer dies)
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "write head too short",
            {
                let mut f = Vec::new();
                frame::push_head(&mut f, FrameKind::RdmaWrite, 5);
                f.extend_from_slice(&[0; 5]);
                f
            },
            false,
        ),
        (
            "truncated write head",
            {
                let mut f = Vec::new();
                frame::push_head(&mut f, FrameKind::RdmaWrite, WRITE_HEAD_LEN + 100);
                f.extend_from_slice(&key.to_le_bytes());
                f
            },
            true,
        ),
        (
            "truncated data",
            write_frame(key, addr, &[7; 100])[..60].to_vec(),
            true,
        ),
        (
            "bad key",
            write_frame(key.wrapping_add(1), addr, &[7; 100]),
            false,
        ),
        (
            "bad address",
            write_frame(key, addr + 4000, &[7; 100]),
            false,
        ),
    ];
    for (i, (what, bytes, then_die)) in cases.into_iter().enumerate() {
        let mut a = Node::new(
            &book,
            &format!("10.0.1.{}@o2ib", i + 1),
            300 + i as u64,
            &clock,
        );
        let an = a.ep.nid();
        a.send(&clock, bn, 1, payload(1));
        assert!(run_until(&mut [&mut a, &mut b], &clock, |n| {
            n[0].done.len() == 1
        }));
        b.fabric.region_mut(&sink).unwrap().fill(0);
        let before = b.fabric.stats().clone();
        let conn = conn_to(&a, bn);
        grant_all(&mut b, &clock, an, &sink);
        a.fabric.inject_raw(conn, &bytes);
        if then_die {
            assert!(run_until(&mut [&mut a], &clock, |n| {
                n[0].fabric.socks.iter().all(|(_, s)| s.written == s.queued)
            }));
            let Node { fabric, ep, .. } = a;
            drop(fabric);
            assert!(
                run_until(&mut [&mut b], &clock, |n| {
                    n[0].downs.iter().any(|d| d.0 == an)
                }),
                "{what}"
            );
            drop(ep);
        } else {
            assert!(
                run_until(&mut [&mut a, &mut b], &clock, |n| {
                    n[1].downs.iter().any(|d| d.0 == an) && n[0].downs.iter().any(|d| d.0 == bn)
                }),
                "{what}"
            );
        }
        // Lost to the peer's protocol error, not closed.
        assert!(
            b.downs.contains(&(an, DownReason::ProtocolError)),
            "{what}: {:?}",
            b.downs
        );
        let s = b.fabric.stats();
        let d = |f: fn(&TcpStats) -> u64| f(s) - f(&before);
        match what {
            "write head too short" => assert_eq!(d(|s| s.bad_length), 1, "{what}"),
            "truncated write head" | "truncated data" => {
                assert_eq!(d(|s| s.truncated), 1, "{what}")
            }
            _ => assert_eq!(d(|s| s.rdma_access_errors), 1, "{what}"),
        }
        assert_eq!(d(|s| s.rdma_frames_rx), 0, "{what}");
        if what != "truncated data" {
            assert!(
                b.fabric.region(&sink).unwrap().iter().all(|&x| x == 0),
                "{what}"
            );
        }
        // The other connection never noticed.
        assert!(!b.downs.iter().any(|d| d.0 == cn), "{what}");
    }
    let sent = c.done.len() as u64;
    for i in 100..110 {
        c.send(&clock, bn, i, payload(i));
        b.send(&clock, cn, i, payload(i));
    }
    assert!(run_until(&mut [&mut c, &mut b], &clock, |n| {
        n[0].done.len() as u64 == sent + 10 && n[0].got.len() == 11
    }));
    assert!(c.done.values().all(|r| *r == Ok(())));
    shut_down_both(&mut c, &mut b, &clock);
}

/// A loopback address whose port is held by a TCP socket that is bound but never listens (kept
/// open by the returned stream): a connect to it is refused at once, and no other process can
/// bind the port meanwhile (unlike a port bound, read and released).
fn refusing_addr() -> (TcpStream, SocketAddr) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let fd = uring::tcp_socket(any).unwrap();
    uring::bind(std::os::fd::AsFd::as_fd(&fd), any).unwrap();
    // Only for getsockname: the socket is never connected.
    let s = TcpStream::from(fd);
    let addr = s.local_addr().unwrap();
    (s, addr)
}

/// Bulk data by rendezvous over real sockets: PUTs and GETs of sizes from 1 byte to 1 MiB, not
/// multiples of 8, from and to non-zero offsets, land byte for byte in the registered sinks,
/// nothing around them changes, each side reports its outcome once, and the connection is the
/// same one throughout.
#[test]
fn rendezvous_puts_and_gets_land_byte_exact_over_tcp() {
    use crate::engine::RdmaSink;
    const MIB: usize = 1 << 20;
    let (clock, _book, mut a, mut b) = connected_pair();
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    let a_bytes = pattern(7, MIB + 256);
    let b_bytes = pattern(8, MIB + 256);
    let a_src = a.fabric.register(a_bytes.clone()).unwrap();
    let b_src = b.fabric.register(b_bytes.clone()).unwrap();
    let sizes = testkit::BULK_SWEEP;
    let established = a.ep.stats().established + b.ep.stats().established;
    for (i, &len) in sizes.iter().enumerate() {
        let (src_off, sink_off) = (3 + 11 * i as u64, 1 + 5 * i as u64);
        // a PUTs into b's sink...
        let b_sink = b.fabric.register(vec![0xee; MIB + 64]).unwrap();
        let put_cookie = 1000 + i as u64;
        let into = RdmaSink::of(&b_sink, sink_off, len);
        let from = a_src.local_frag(src_off, len);
        start_put(&mut a, &mut b, &clock, from, into, put_cookie);
        // ...and GETs from b's source into its own sink.
        let a_sink = a.fabric.register(vec![0xee; MIB + 64]).unwrap();
        let get_cookie = 2000 + i as u64;
        b.answers.push_back(Answer::Reply(
            vec![b_src.local_frag(src_off, len)],
            get_cookie,
        ));
        let h = hdr(an, bn, 0);
        let into = RdmaSink::of(&a_sink, sink_off, len);
        a.ep.send_get_rdma(clock.now(), bn, h, into, get_cookie)
            .unwrap();
        assert!(
            run_until(&mut [&mut a, &mut b], &clock, |n| {
                n[0].done.contains_key(&put_cookie)
                    && n[0].rdma_done.contains_key(&get_cookie)
                    && n[1].rdma_done.contains_key(&put_cookie)
                    && n[1].done.contains_key(&get_cookie)
            }),
            "size {len}: not finished"
        );
        assert_eq!(a.done[&put_cookie], Ok(()), "size {len}");
        assert_eq!(b.rdma_done[&put_cookie], Ok(len), "size {len}");
        assert_eq!(a.rdma_done[&get_cookie], Ok(len), "size {len}");
        assert_eq!(b.done[&get_cookie], Ok(()), "size {len}");
        let range = sink_off as usize..(sink_off + u64::from(len)) as usize;
        let src_range = src_off as usize..(src_off + u64::from(len)) as usize;
        for (fabric, sink, want) in [
            (&b.fabric, &b_sink, &a_bytes[src_range.clone()]),
            (&a.fabric, &a_sink, &b_bytes[src_range.clone()]),
        ] {
            let got = fabric.contents(sink).unwrap();
            assert!(got[range.clone()] == *want, "size {len}: bytes differ");
            assert!(got[..range.start].iter().all(|&x| x == 0xee), "size {len}");
            assert!(got[range.end..].iter().all(|&x| x == 0xee), "size {len}");
        }
        assert!(b.fabric.deregister(b_sink).is_some());
        assert!(a.fabric.deregister(a_sink).is_some());
    }
    assert_eq!(
        a.ep.stats().established + b.ep.stats().established,
        established,
        "no reconnect"
    );
    let total: u64 = sizes.iter().map(|&n| u64::from(n)).sum();
    assert_eq!(a.ep.stats().rdma_bytes_sent, total);
    assert_eq!(b.ep.stats().rdma_bytes_sent, total);
    assert!(a.fabric.deregister(a_src).is_some());
    assert!(b.fabric.deregister(b_src).is_some());
    shut_down_both(&mut a, &mut b, &clock);
}

/// Memory registered with two fabrics at once (a router's large buffers): a peer's write
/// through one registration is read through the other's, and a write from the second goes out
/// with those bytes; deregistering one leaves the other working.
#[test]
fn shared_memory_registered_with_two_fabrics_is_one_buffer() {
    use crate::engine::RdmaSink;
    use crate::fabric::SharedMem;
    let (clock, _book, mut a, mut b) = connected_pair();
    let other = TcpFabric::bind("127.0.0.1:0".parse().unwrap(), |_| None);
    let mut other = other.unwrap();
    let mem = SharedMem::new(70_000);
    let at_b = b.fabric.register_shared(&mem).unwrap();
    let at_other = other.register_shared(&mem).unwrap();
    let bytes = pattern(9, 70_000);
    let src = a.fabric.register(bytes.clone()).unwrap();
    let into = RdmaSink::of(&at_b, 0, 70_000);
    start_put(&mut a, &mut b, &clock, src.local_frag(0, 70_000), into, 10);
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n[1]
        .rdma_done
        .contains_key(&10)));
    assert_eq!(b.rdma_done[&10], Ok(70_000));
    assert!(
        other.contents(&at_other).unwrap() == bytes,
        "read through the other fabric"
    );
    assert!(mem.to_vec() == bytes);
    assert!(
        b.fabric.region(&at_b).is_none(),
        "no borrowed view of shared memory"
    );
    // B's registration goes; the other fabric still holds the memory.
    assert_eq!(b.fabric.deregister(at_b), Some(Vec::new()));
    assert!(other.contents(&at_other).unwrap() == bytes);
    shut_down_both(&mut a, &mut b, &clock);
}

/// The hostile-peer audit's data corruption: a peer that once got a PUT_ACK (a router lends its
/// buffers to one peer after another) kept the key and wrote into the buffer later, while it
/// held another peer's data; the fabric checked only key and bounds. Now a write must fall in
/// a grant of its own connection, open from the PUT_ACK to the PUT_DONE: after the transfer
/// the same peer, and at any time another peer, is refused before a byte lands, counted, and
/// loses its connection; the peer the memory is lent to is not disturbed.
#[test]
fn tcp_rdma_write_needs_a_grant_of_its_own_connection() {
    use crate::engine::RdmaSink;
    let (clock, book, mut a, mut b) = connected_pair();
    let bn = b.ep.nid();
    let mut c = Node::new(&book, "10.0.0.3@o2ib", 300, &clock);
    c.send(&clock, bn, 1, payload(1));
    assert!(run_until(&mut [&mut b, &mut c], &clock, |n| n[1]
        .done
        .len()
        == 1));
    let sink = b.fabric.register(vec![0; 8192]).unwrap();
    let a_src = a.fabric.register(pattern(3, 4096)).unwrap();
    let c_src = c.fabric.register(vec![0x5a; 4096]).unwrap();

    // A legitimate PUT by rendezvous: a's writes land while the grant is open.
    let into = RdmaSink::of(&sink, 0, 4096);
    start_put(&mut a, &mut b, &clock, a_src.local_frag(0, 4096), into, 10);
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n[1]
        .rdma_done
        .contains_key(&10)
        && n[0].done.contains_key(&10)));
    assert_eq!(b.rdma_done[&10], Ok(4096));
    let landed = b.fabric.contents(&sink).unwrap();
    assert!(landed[..4096] == pattern(3, 4096)[..]);
    let before = b.fabric.stats().clone();

    // c never was granted this memory: refused at the frame head, nothing lands.
    let s1 = refused_write(&mut b, &mut c, &clock, injected(1), &c_src, &sink);
    assert_eq!(s1.rdma_ungranted - before.rdma_ungranted, 1);
    assert_eq!(s1.rdma_access_errors - before.rdma_access_errors, 1);
    assert_eq!(s1.rdma_frames_rx, before.rdma_frames_rx);
    assert!(
        b.fabric.contents(&sink).unwrap() == landed,
        "c's write landed"
    );

    // a, after its PUT_DONE, with the key it was shown: refused the same way.
    let s2 = refused_write(&mut b, &mut a, &clock, injected(2), &a_src, &sink);
    assert_eq!(s2.rdma_ungranted - s1.rdma_ungranted, 1);
    assert_eq!(s2.rdma_frames_rx, before.rdma_frames_rx);
    assert!(
        b.fabric.contents(&sink).unwrap() == landed,
        "a's late write landed"
    );
}

/// The hostile-peer audit: one host holding 4,096 silent sockets (reopened as they time out)
/// filled the handshake limit and kept every new peer out. A source address may hold at most
/// `handshake_limit_per_source` of them: its excess is closed at once and counted, while
/// another address still gets in.
#[test]
fn tcp_one_source_cannot_take_the_whole_handshake_limit() {
    use rustix::net::{AddressFamily, SocketType};
    let clock = MonotonicClock::new();
    let cfg = TcpConfig {
        handshake_limit: 8,
        handshake_limit_per_source: 2,
        ..TcpConfig::default()
    };
    let mut b = Node::with_config(&Book::default(), "10.0.0.2@o2ib", 200, &clock, cfg);
    let _raws = silent_clients(5, &mut b, &clock);
    assert_eq!(b.fabric.handshakes(), 2);
    assert_eq!(b.fabric.stats().handshakes_refused_source, 3);
    assert_eq!(b.fabric.stats().handshakes_refused, 3);
    // Another source address (127.0.0.2) is not held back by 127.0.0.1's share.
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    let from: SocketAddr = "127.0.0.2:0".parse().unwrap();
    rustix::net::bind(&fd, &from).unwrap();
    rustix::net::connect(&fd, &b.fabric.local_addr()).unwrap();
    let _other = TcpStream::from(fd);
    assert!(
        run_until(&mut [&mut b], &clock, |n| n[0].fabric.handshakes() == 3),
        "{:?}",
        b.fabric.stats()
    );
    assert_eq!(b.fabric.stats().handshakes_refused_source, 3);
    // When 127.0.0.1's silent sockets go, its share is free again.
    drop(_raws);
    assert!(run_until(&mut [&mut b], &clock, |n| n[0]
        .fabric
        .handshakes()
        == 1));
    let _again = silent_clients(2, &mut b, &clock);
    assert_eq!(b.fabric.handshakes(), 3);
    assert_eq!(b.fabric.stats().handshakes_refused_source, 3);
}

/// `w` writes 4096 bytes of `src` onto `b`'s whole `sink`, which `b` must refuse: waits until
/// `b` has dropped `w`'s connection, and gives `b`'s fabric counters then.
fn refused_write(
    b: &mut Node,
    w: &mut Node,
    clock: &MonotonicClock,
    wr: WrId,
    src: &Registration,
    sink: &Registration,
) -> TcpStats {
    let (bn, wn) = (b.ep.nid(), w.ep.nid());
    let to_b = conn_to(w, bn);
    post_write1(w, clock, to_b, wr, src, 0, sink.remote(), 4096);
    assert!(run_until(&mut [&mut *b, &mut *w], clock, |n| n[0]
        .downs
        .iter()
        .any(|d| d.0 == wn)));
    b.fabric.stats().clone()
}

/// The hostile-peer audit's F6: a protocol error the fabric finds after the handshake was
/// counted as a graceful close (`graceful_closes` +1, `conns_lost` unchanged, the peer down as
/// `Closed`). The receiver of a frame of bad length now loses the connection
/// (`conns_lost`, `fabric_protocol_errors`) and reports the peer down as `ProtocolError`; the
/// sender, whose socket the receiver closed without a DISCONNECT, sees a transport failure
/// (`fabric_transport_errors`, `ConnectionLost`): neither is a close. A real close handshake
/// still counts `graceful_closes` and reports `Closed`.
#[test]
fn tcp_fabric_errors_lose_the_connection_and_a_close_stays_graceful() {
    let (clock, book, mut a, mut b) = connected_pair();
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    let (la, lb) = (a.ep.stats().clone(), b.ep.stats().clone());
    let bad_length = b.fabric.stats().bad_length;
    let conn = conn_to(&a, bn);
    let mut f = Vec::new();
    frame::push_head(&mut f, FrameKind::Msg, MSG_SIZE + 1);
    a.fabric.inject_raw(conn, &f);
    assert!(
        run_until(&mut [&mut a, &mut b], &clock, |n| n[0]
            .downs
            .iter()
            .any(|d| d.0 == bn)
            && n[1].downs.iter().any(|d| d.0 == an)),
        "a: {:?} b: {:?}",
        a.downs,
        b.downs
    );
    assert_eq!(b.fabric.stats().bad_length, bad_length + 1);
    let sb = b.ep.stats();
    assert_eq!(sb.conns_lost, lb.conns_lost + 1, "{sb:?}");
    assert_eq!(sb.fabric_protocol_errors, lb.fabric_protocol_errors + 1);
    assert_eq!(sb.graceful_closes, lb.graceful_closes, "{sb:?}");
    assert_eq!(b.downs, vec![(an, DownReason::ProtocolError)]);
    let sa = a.ep.stats();
    assert_eq!(sa.conns_lost, la.conns_lost + 1, "{sa:?}");
    assert_eq!(sa.fabric_transport_errors, la.fabric_transport_errors + 1);
    assert_eq!(sa.graceful_closes, la.graceful_closes, "{sa:?}");
    assert_eq!(a.downs, vec![(bn, DownReason::ConnectionLost)]);

    // A graceful close: c stops, d hears its DISCONNECT.
    let mut c = Node::new(&book, "10.0.0.3@o2ib", 300, &clock);
    let cn = c.ep.nid();
    c.send(&clock, bn, 1, payload(1));
    assert!(run_until(&mut [&mut b, &mut c], &clock, |n| n[1]
        .done
        .len()
        == 1));
    let lb = b.ep.stats().clone();
    c.ep.shutdown(clock.now());
    assert!(run_until(&mut [&mut b, &mut c], &clock, |n| n[1]
        .ep
        .is_shut_down()
        && n[0].downs.iter().any(|d| d.0 == cn)));
    let sb = b.ep.stats();
    assert_eq!(sb.graceful_closes, lb.graceful_closes + 1, "{sb:?}");
    assert_eq!(sb.conns_lost, lb.conns_lost, "{sb:?}");
    assert_eq!(sb.fabric_protocol_errors + sb.fabric_transport_errors, 1);
    assert!(b.downs.contains(&(cn, DownReason::Closed)), "{:?}", b.downs);
    shut_down_both(&mut a, &mut b, &clock);
}

/// A fabric whose ring failed is abandoned (`Driver::abandon`): its sockets are shut by plain
/// system calls, so its peer sees the connection end at once, as a transport failure (not a
/// graceful close, not at its keepalive horizon), and a new connect to its address is refused
/// instead of waiting in a backlog nobody accepts from.
#[test]
fn tcp_an_abandoned_fabric_ends_its_connections_and_listens_no_more() {
    use crate::driver::Driver;
    let (clock, _book, mut a, mut b) = connected_pair();
    let an = a.ep.nid();
    let lb = b.ep.stats().clone();
    let addr = a.fabric.local_addr();
    a.fabric.abandon();
    assert!(
        run_until(&mut [&mut b], &clock, |n| n[0]
            .downs
            .iter()
            .any(|d| d.0 == an)),
        "b did not see a go: {:?}",
        b.downs
    );
    assert_eq!(b.downs, vec![(an, DownReason::ConnectionLost)]);
    let sb = b.ep.stats();
    assert_eq!(sb.conns_lost, lb.conns_lost + 1, "{sb:?}");
    assert_eq!(sb.graceful_closes, lb.graceful_closes, "{sb:?}");
    let refused = TcpStream::connect_timeout(&addr, StdDuration::from_secs(2));
    assert!(
        refused.is_err(),
        "a connect to the abandoned listener: {refused:?}"
    );
}

/// The table from the engine's connection keys to sockets gives back what a storm grew: a
/// connection with a high key (the engine's keys go that high only during a storm) makes it
/// that long, and its destruction makes it short again.
#[test]
fn tcp_the_connection_table_shrinks_when_a_storm_is_over() {
    let (_held, dead) = refusing_addr();
    let mut f = TcpFabric::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        move |_| Some(dead),
        TcpConfig::default(),
    )
    .unwrap();
    let now = Instant::from_nanos(0);
    let connect = |f: &mut TcpFabric, index: u32| {
        let conn = ConnId::from_parts(index, 1);
        f.apply(
            now,
            FabricAction::Connect {
                conn,
                peer: nid("10.0.0.9@o2ib"),
                private: PrivateData::EMPTY,
                recv_slots: 8,
            },
        );
        conn
    };
    let low = connect(&mut f, 3);
    let high = connect(&mut f, 50_000);
    assert_eq!(f.by_conn.len(), 50_001);
    f.apply(now, FabricAction::Destroy { conn: high });
    assert_eq!(
        f.by_conn.len(),
        4,
        "entries above the highest live one were kept"
    );
    assert!(
        f.by_conn.capacity() <= BY_CONN_FLOOR,
        "room for {} entries kept",
        f.by_conn.capacity()
    );
    assert!(f.lookup(low).is_some(), "the live connection was lost");
    f.apply(now, FabricAction::Destroy { conn: low });
    assert!(f.by_conn.is_empty());
}

/// F7: a peer that sends past its credits (more MSG frames than we posted slots) is not held
/// back for ever: once a frame has waited `rnr_horizon` for a slot, the connection breaks as
/// RC's would when its RNR retries are spent, counted in `credit_overruns`, reported as a
/// protocol error; the frames that had slots were delivered. Two bare fabrics, no engine: the
/// receiver posts 2 slots and never reposts.
#[test]
fn tcp_a_peer_sending_past_its_credits_is_disconnected_after_the_rnr_horizon() {
    #[derive(Default)]
    struct Rec {
        requests: Vec<RequestId>,
        established: usize,
        recvs: usize,
        down: Vec<(ConnId, DisconnectReason)>,
    }
    impl FabricSink for Rec {
        fn fabric_event(&mut self, _: Instant, e: crate::fabric::FabricEvent<'_>) {
            use crate::fabric::FabricEvent as E;
            match e {
                E::ConnectRequest { req, .. } => self.requests.push(req),
                E::Established { .. } => self.established += 1,
                E::Recv { .. } => self.recvs += 1,
                E::Disconnected { conn, why } => self.down.push((conn, why)),
                _ => {}
            }
        }
        fn recycle(&mut self, _: Vec<u8>) {}
    }
    let clock = MonotonicClock::new();
    let cfg = TcpConfig {
        rnr_horizon: StdDuration::from_millis(50),
        busy_poll: StdDuration::ZERO,
        ..TcpConfig::default()
    };
    let mut b =
        TcpFabric::bind_with("127.0.0.1:0".parse().unwrap(), |_| None, cfg.clone()).unwrap();
    let b_addr = b.local_addr();
    let mut a =
        TcpFabric::bind_with("127.0.0.1:0".parse().unwrap(), move |_| Some(b_addr), cfg).unwrap();
    let (mut ra, mut rb) = (Rec::default(), Rec::default());
    let ca = ConnId::from_parts(1, 1);
    let cb = ConnId::from_parts(2, 1);
    let now = clock.now();
    a.apply(
        now,
        FabricAction::Connect {
            conn: ca,
            peer: nid("10.0.0.2@o2ib"),
            private: PrivateData::new(b"hello"),
            recv_slots: 8,
        },
    );
    let step = |a: &mut TcpFabric, b: &mut TcpFabric, ra: &mut Rec, rb: &mut Rec| {
        let t = StdDuration::from_millis(1);
        a.poll(Some(t), ra, || clock.now()).unwrap();
        b.poll(Some(t), rb, || clock.now()).unwrap();
    };
    let t0 = std::time::Instant::now();
    while rb.requests.is_empty() && t0.elapsed() < StdDuration::from_secs(5) {
        step(&mut a, &mut b, &mut ra, &mut rb);
    }
    let req = *rb.requests.first().expect("no CONNREQ reached B");
    b.apply(
        clock.now(),
        FabricAction::Accept {
            req,
            conn: cb,
            private: PrivateData::new(b"welcome"),
            recv_slots: 2,
        },
    );
    while ra.established == 0 && t0.elapsed() < StdDuration::from_secs(5) {
        step(&mut a, &mut b, &mut ra, &mut rb);
    }
    assert_eq!(ra.established, 1, "A did not get B's CONNACK");
    // Five messages against two slots.
    for i in 0..5u64 {
        a.apply(
            clock.now(),
            FabricAction::Send {
                conn: ca,
                wr: WrId(i),
                bytes: payload(i),
            },
        );
    }
    let sent = std::time::Instant::now();
    while rb.down.is_empty() && sent.elapsed() < StdDuration::from_secs(5) {
        step(&mut a, &mut b, &mut ra, &mut rb);
    }
    let waited = sent.elapsed();
    assert_eq!(
        rb.down,
        vec![(cb, DisconnectReason::ProtocolError)],
        "B never gave up on the frames past its slots (after {waited:?})"
    );
    assert!(
        waited >= StdDuration::from_millis(50),
        "broke before the horizon: {waited:?}"
    );
    assert_eq!(rb.recvs, 2, "the frames that had slots were delivered");
    let st = b.stats();
    assert_eq!((st.credit_overruns, st.protocol_errors()), (1, 1), "{st:?}");
    assert!(st.rx_stalls >= 1);
    // A sees its connection end.
    while ra.down.is_empty() && sent.elapsed() < StdDuration::from_secs(5) {
        step(&mut a, &mut b, &mut ra, &mut rb);
    }
    assert_eq!(ra.down.len(), 1, "A did not see the connection end");
}

/// A wake-up from another thread is never lost between the busy-poll and the sleep: each of
/// 10,000 wake-ups, sent at a pseudo-random moment of the loop's cycle (while it spins, while it
/// sleeps, while it is between the two), ends the loop's wait and is taken, by the doorbell's
/// flag or by the waker's byte. The loop's waits are 30 s: a lost wake-up shows as a wait that
/// ran out (a wake-up ends one in microseconds).
#[test]
fn tcp_a_wake_up_is_never_lost_between_the_busy_poll_and_the_sleep() {
    use crate::driver::{Driver, Waker};
    use std::sync::atomic::{AtomicU64, Ordering};
    const N: u64 = 10_000;
    let clock = MonotonicClock::new();
    let cfg = TcpConfig {
        busy_poll: StdDuration::from_micros(20),
        ..TcpConfig::default()
    };
    let mut f = TcpFabric::bind_with("127.0.0.1:0".parse().unwrap(), |_| None, cfg).unwrap();
    let (waker, handle) = Waker::new().unwrap();
    Driver::set_waker(&mut f, waker.fd());
    Driver::set_doorbell(&mut f, waker.doorbell());
    let mut ep = Endpoint::new(EndpointConfig::new(nid("10.9.0.1@o2ib"), 1), clock.now());
    let sent = Arc::new(AtomicU64::new(0));
    let taken = Arc::new(AtomicU64::new(0));
    let sender = {
        let (sent, taken) = (Arc::clone(&sent), Arc::clone(&taken));
        std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for i in 1..=N {
                while taken.load(Ordering::Acquire) < i - 1 {
                    std::thread::yield_now();
                }
                // 0-60 us after the loop took the last one: across its 20 us spin and beyond.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let until = std::time::Instant::now() + StdDuration::from_nanos(x % 60_000);
                while std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
                sent.store(i, Ordering::Release);
                handle.wake();
            }
        })
    };
    let (mut by_flag, mut by_byte, mut lost) = (0u64, 0u64, 0u64);
    while taken.load(Ordering::Acquire) < N {
        let t0 = std::time::Instant::now();
        f.poll(Some(StdDuration::from_secs(30)), &mut ep, || clock.now())
            .unwrap();
        if t0.elapsed() >= StdDuration::from_secs(25) {
            lost += 1;
            break;
        }
        let byte = Driver::take_woken(&mut f);
        let flag = if byte {
            waker.drain();
            false
        } else {
            waker.take_pending()
        };
        let s = sent.load(Ordering::Acquire);
        if s > taken.load(Ordering::Acquire) {
            // Neither: the wake-up itself is yet to come (the sender stores before it wakes).
            if byte || flag {
                if byte {
                    by_byte += 1;
                } else {
                    by_flag += 1;
                }
                taken.store(s, Ordering::Release);
            }
        }
    }
    assert_eq!(
        lost,
        0,
        "a wait ran out with wake-up {} sent ({by_flag} taken by flag, {by_byte} by a byte before)",
        sent.load(Ordering::Acquire)
    );
    sender.join().unwrap();
    assert_eq!(by_flag + by_byte, N);
    assert!(
        by_flag > 0 && by_byte > 0,
        "both paths taken: {by_flag} by the flag, {by_byte} by a byte"
    );
}

/// The data of RDMA_WRITE frames that is still in the socket when its head is parsed is read
/// straight into the region, not through the receive buffer and a copy, while the write has at
/// least `DIRECT_MIN` bytes to bring; after such a frame the next read takes only the next
/// frame's heads, so that its data can come straight too. Eight 1 MiB writes of odd sizes and
/// offsets land byte-exact, with a message behind each, and most of their bytes took the direct
/// path; a 64 KiB write does not.
#[test]
fn tcp_rdma_write_data_is_read_from_the_socket_straight_into_the_region() {
    let (clock, _book, mut a, mut b) = connected_pair();
    let bn = b.ep.nid();
    let conn = conn_to(&a, bn);
    let mut total = 0u64;
    for i in 0..8u64 {
        let len = MIB - 1 - 4093 * i as usize;
        let off = 7 * i;
        let src = a.fabric.register(pattern(100 + i as u32, MIB)).unwrap();
        let sink = b.fabric.register(vec![0; MIB + 64]).unwrap();
        grant_all(&mut b, &clock, a.ep.nid(), &sink);
        let mut remote = sink.remote();
        remote.addr += off;
        let got_before = b.got.len();
        post_write1(
            &mut a,
            &clock,
            conn,
            injected(2000 + i),
            &src,
            off,
            remote,
            len as u32,
        );
        a.send(&clock, bn, 60 + i, payload(60 + i));
        assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n[0]
            .done
            .contains_key(&(60 + i))
            && n[1].got.len() > got_before));
        assert_eq!(status(&a, injected(2000 + i)), Some(WcStatus::Success));
        let want = &a.fabric.region(&src).unwrap()[off as usize..off as usize + len];
        let got = b.fabric.region(&sink).unwrap();
        assert!(
            got[off as usize..off as usize + len] == *want,
            "write {i} landed wrong"
        );
        assert!(got[..off as usize]
            .iter()
            .chain(&got[off as usize + len..])
            .all(|&x| x == 0));
        total += len as u64;
    }
    let sb = b.fabric.stats().clone();
    assert_eq!(sb.rdma_bytes_rx, total);
    assert_eq!(sb.rdma_access_errors + sb.protocol_errors(), 0);
    assert!(
        sb.rdma_direct_bytes_rx * 2 > total,
        "{} of {total} bytes read straight into the region",
        sb.rdma_direct_bytes_rx
    );
    // A write of one frame (64 KiB) comes through the receive buffer: for it the extra reads
    // would cost more than the copy (`DIRECT_MIN`).
    let src = a.fabric.register(pattern(200, 64 * 1024)).unwrap();
    let sink = b.fabric.register(vec![0; 64 * 1024]).unwrap();
    grant_all(&mut b, &clock, a.ep.nid(), &sink);
    let got_before = b.got.len();
    post_write1(
        &mut a,
        &clock,
        conn,
        injected(3000),
        &src,
        0,
        sink.remote(),
        64 * 1024,
    );
    a.send(&clock, bn, 70, payload(70));
    assert!(run_until(&mut [&mut a, &mut b], &clock, |n| n[0]
        .done
        .contains_key(&70)
        && n[1].got.len() > got_before));
    assert!(b.fabric.region(&sink) == a.fabric.region(&src));
    assert_eq!(b.fabric.stats().rdma_bytes_rx, total + 64 * 1024);
    assert_eq!(
        b.fabric.stats().rdma_direct_bytes_rx,
        sb.rdma_direct_bytes_rx
    );
    shut_down_both(&mut a, &mut b, &clock);
}

mod coverage;
