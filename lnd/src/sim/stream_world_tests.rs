//! The world hosting stream nodes: a small stream-echo node (not an LND) shows the plumbing: the
//! world applies a node's stream actions, hands it its reports, runs the stream network's dues
//! in turn with its own, and its faults reach the streams.

use super::*;
use crate::handle::HandleSlab;
use crate::stream::{
    CloseMode, DialError, EndReason, RecvTarget, SendId, SendPayload, SockOpts, StreamId, StreamTag,
};
use std::net::SocketAddrV4;

const PORT: u16 = 988;

#[derive(Clone, Debug)]
struct EchoCfg {
    nid: Nid,
    ip: Ipv4Addr,
    incarnation: u64,
    /// Echo back what arrives (a server), or keep it (a client).
    echo: bool,
    opts: SockOpts,
}

/// What an echo node heard, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Heard {
    Listening,
    Incoming(SocketAddrV4),
    Connected(StreamId),
    DialFailed(StreamId, DialError),
    Sent(StreamId, SendId, Result<(), EndReason>),
    Ended(StreamId, EndReason),
    /// Bytes of a read (how many).
    Data(StreamId, usize),
}

/// A stream node: listens on 988, adopts every connection, reads with 64 KiB reads, echoes
/// (server) or keeps (client) what arrives, closes a stream that ended, and closes everything
/// gracefully at shutdown.
struct Echo {
    cfg: EchoCfg,
    ids: HandleSlab<(), StreamTag>,
    open: Vec<StreamId>,
    actions: VecDeque<StreamAction>,
    heard: Vec<(Instant, Heard)>,
    received: FxMap<StreamId, Vec<u8>>,
    next_send: u64,
    stopped: bool,
    leaks: Arc<AtomicU64>,
}

impl Echo {
    fn dial(&mut self, to: Ipv4Addr) -> StreamId {
        let stream = self.ids.insert(());
        self.actions.push_back(StreamAction::Dial {
            stream,
            local: self.cfg.ip,
            ports_from: 1023,
            ports_to: 512,
            remote: SocketAddrV4::new(to, PORT),
        });
        stream
    }

    fn send(&mut self, stream: StreamId, bytes: Vec<u8>) -> SendId {
        let id = SendId(self.next_send);
        self.next_send += 1;
        self.actions.push_back(StreamAction::Send {
            stream,
            id,
            head: Vec::new(),
            payload: SendPayload::Bytes(bytes),
        });
        id
    }

    fn opened(&mut self, stream: StreamId) {
        self.open.push(stream);
        self.actions.push_back(StreamAction::Configure {
            stream,
            opts: self.cfg.opts,
        });
        self.recv(stream);
    }

    fn recv(&mut self, stream: StreamId) {
        self.actions.push_back(StreamAction::Recv {
            stream,
            target: RecvTarget::Bytes { max: 65536 },
        });
    }

    fn heard(&self) -> Vec<Heard> {
        self.heard.iter().map(|(_, h)| h.clone()).collect()
    }

    /// Whether any of its streams ended.
    fn heard_an_end(&self) -> bool {
        self.heard
            .iter()
            .any(|(_, h)| matches!(h, Heard::Ended(..)))
    }

    fn received(&self, s: StreamId) -> &[u8] {
        self.received.get(&s).map_or(&[], |v| v.as_slice())
    }
}

impl FabricSink for Echo {
    fn fabric_event(&mut self, _now: Instant, _ev: FabricEvent<'_>) {}
    fn recycle(&mut self, _buf: Vec<u8>) {}
}

impl SimNode for Echo {
    type Config = EchoCfg;
    type Event = ();

    fn start(cfg: &EchoCfg, _now: Instant) -> Echo {
        let mut e = Echo {
            cfg: cfg.clone(),
            ids: HandleSlab::new(),
            open: Vec::new(),
            actions: VecDeque::new(),
            heard: Vec::new(),
            received: FxMap::default(),
            next_send: 1,
            stopped: false,
            leaks: Arc::new(AtomicU64::new(0)),
        };
        e.actions.push_back(StreamAction::Listen {
            addr: SocketAddrV4::new(cfg.ip, PORT),
            backlog: 16,
        });
        e
    }
    fn config_nid(cfg: &EchoCfg) -> Nid {
        cfg.nid
    }
    fn config_incarnation(cfg: &EchoCfg) -> u64 {
        cfg.incarnation
    }
    fn reincarnate(cfg: &mut EchoCfg, incarnation: u64) {
        cfg.incarnation = incarnation;
    }
    fn poll_action(&mut self) -> Option<FabricAction> {
        None
    }
    fn poll_event(&mut self) -> Option<()> {
        None
    }
    fn book(ev: ()) -> Booking<()> {
        Booking::Other(ev)
    }
    fn recv_done(&mut self, _now: Instant, _rx: RxToken) {}
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _now: Instant) {}
    fn shutdown(&mut self, _now: Instant) {
        self.actions.push_back(StreamAction::Unlisten);
        for stream in self.open.drain(..) {
            self.actions.push_back(StreamAction::Close {
                stream,
                mode: CloseMode::Graceful,
            });
        }
        self.stopped = true;
    }
    fn is_shut_down(&self) -> bool {
        self.stopped && self.actions.is_empty()
    }
    fn leak_counter(&self) -> Arc<AtomicU64> {
        self.leaks.clone()
    }
    fn invalid_transitions(&self) -> u64 {
        0
    }

    fn stream_addr(cfg: &EchoCfg) -> Option<Ipv4Addr> {
        Some(cfg.ip)
    }
    fn poll_stream_action(&mut self) -> Option<StreamAction> {
        self.actions.pop_front()
    }
    fn stream_event(&mut self, now: Instant, ev: StreamEvent<'_>) {
        let heard = match ev {
            StreamEvent::Listening { .. } => Heard::Listening,
            StreamEvent::ListenFailed { errno } => panic!("listen failed: {errno}"),
            StreamEvent::Incoming { incoming, peer, .. } => {
                let stream = self.ids.insert(());
                self.actions
                    .push_back(StreamAction::Adopt { incoming, stream });
                self.opened(stream);
                Heard::Incoming(peer)
            }
            StreamEvent::Connected { stream, .. } => {
                self.opened(stream);
                Heard::Connected(stream)
            }
            StreamEvent::DialFailed { stream, error } => Heard::DialFailed(stream, error),
            StreamEvent::Data { stream, bytes } => {
                if self.cfg.echo {
                    self.send(stream, bytes.to_vec());
                } else {
                    self.received
                        .entry(stream)
                        .or_default()
                        .extend_from_slice(bytes);
                }
                self.recv(stream);
                Heard::Data(stream, bytes.len())
            }
            StreamEvent::Filled { .. } => unreachable!("no Mem receives posted"),
            StreamEvent::Sent { stream, id, result } => Heard::Sent(stream, id, result),
            StreamEvent::Ended { stream, why } => {
                self.open.retain(|s| *s != stream);
                self.actions.push_back(StreamAction::Close {
                    stream,
                    mode: CloseMode::Graceful,
                });
                Heard::Ended(stream, why)
            }
        };
        self.heard.push((now, heard));
    }
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 3, 0, last)
}

fn echo_cfg(last: u8, echo: bool) -> EchoCfg {
    EchoCfg {
        nid: format!("{}@tcp", ip(last)).parse().unwrap(),
        ip: ip(last),
        incarnation: 1,
        echo,
        opts: SockOpts::default(),
    }
}

fn echo_world(seed: u64) -> (World<Echo>, NodeId, NodeId) {
    let mut w: World<Echo> = World::hosting(SimConfig::with_seed(seed));
    let client = w.add_node(echo_cfg(1, false));
    let server = w.add_node(echo_cfg(2, true));
    (w, client, server)
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) as u8) ^ salt ^ (i >> 11) as u8)
        .collect()
}

/// The client dials the server and sends `bytes` in `chunk`-byte sends.
fn dial_and_send(w: &mut World<Echo>, c: NodeId, bytes: &[u8], chunk: usize) -> StreamId {
    let chunks: Vec<Vec<u8>> = bytes.chunks(chunk).map(<[u8]>::to_vec).collect();
    w.with_node(c, |e, _| {
        let s = e.dial(ip(2));
        for ch in chunks {
            e.send(s, ch);
        }
        s
    })
    .unwrap()
}

/// The client dials the server and sends `bytes`, which the server echoes back: run to idle.
fn exchange(w: &mut World<Echo>, c: NodeId, bytes: &[u8]) -> StreamId {
    let s = dial_and_send(w, c, bytes, 64);
    assert!(w.run_until_idle(limit(w, 1)));
    s
}

/// The server `s` shuts down and is removed; the client `c` hears EOF on `stream` last.
#[track_caller]
fn assert_shutdown_heard_as_eof(w: &mut World<Echo>, s: NodeId, c: NodeId, stream: StreamId) {
    w.shutdown(s);
    assert_eq!(w.node_state(s), NodeState::Stopped);
    assert!(w.run_until_idle(limit(w, 1)));
    w.run_for(Duration::from_secs(3));
    assert_eq!(
        w.node(c).unwrap().heard().last(),
        Some(&Heard::Ended(stream, EndReason::Eof))
    );
}

fn limit(w: &World<Echo>, secs: u64) -> Instant {
    w.now() + Duration::from_secs(secs)
}

/// Hosts are made from the nodes' stream addresses; what the client sends comes back
/// byte-exact through partial reads and writes, every send completes, and the world is idle
/// only once the last byte is in.
#[test]
fn a_stream_echo_round_trip_is_byte_exact_through_partial_io() {
    let (mut w, c, s) = echo_world(11);
    assert_eq!(w.stream_host(c), Some(HostId(0)));
    assert_eq!(w.stream_host(s), Some(HostId(1)));
    w.stream_partial_io(0.5);
    let payload = pattern(1 << 20, 7);
    let stream = dial_and_send(&mut w, c, &payload, 100_000);
    assert!(!w.is_idle(), "a dial and sends in flight");
    assert!(w.run_until_idle(limit(&w, 10)));
    let client = w.node(c).unwrap();
    assert_eq!(client.received(stream).len(), payload.len());
    assert!(client.received(stream) == payload.as_slice(), "byte-exact");
    let sent_ok = client
        .heard()
        .iter()
        .filter(|h| matches!(h, Heard::Sent(x, _, Ok(()))  if *x == stream))
        .count();
    assert_eq!(sent_ok, payload.len().div_ceil(100_000));
    // Partial reads: the 1 MiB came back in more reads than 64 KiB reads would need.
    let reads = client
        .heard()
        .iter()
        .filter(|h| matches!(h, Heard::Data(..)))
        .count();
    assert!(reads > (1 << 20) / 65536, "{reads} reads");
    let server = w.node(s).unwrap();
    assert_eq!(server.heard()[0], Heard::Listening);
    assert!(server
        .heard()
        .contains(&Heard::Incoming(SocketAddrV4::new(ip(1), 1023))));
    assert_eq!(w.streams().stats().bytes_delivered, 2 << 20);
}

/// A world of stream hosts replays from its seed: the same seed gives the same reports at the
/// same times; another seed other partial reads. The fabric's RNG is not drawn from by the
/// streams (a fabric-only world replays as before).
#[test]
fn a_world_of_stream_hosts_is_a_function_of_its_seed() {
    let trace = |seed| {
        let (mut w, c, _) = echo_world(seed);
        w.stream_partial_io(0.7);
        dial_and_send(&mut w, c, &pattern(200_000, 1), 30_000);
        assert!(w.run_until_idle(limit(&w, 10)));
        let events = w.stats().events;
        (w.node(c).unwrap().heard.clone(), events, w.rng().next_u64())
    };
    let (t3, e3, r3) = trace(3);
    assert_eq!((t3.clone(), e3, r3), trace(3));
    let (t4, _, r4) = trace(4);
    assert_ne!(t3, t4);
    assert_eq!(r3, SimRng::new(3).next_u64(), "the world's RNG untouched");
    assert_eq!(r4, SimRng::new(4).next_u64());
}

/// A crash takes the host down with the node: a peer with keepalive finds out (TimedOut) when
/// its probes run out, not before; the reboot brings a fresh node whose listener is up again
/// and which never hears of its old life's streams; the peer redials and talks to it.
#[test]
fn a_crashed_host_is_found_by_keepalive_and_a_reboot_listens_again() {
    let mut w: World<Echo> = World::hosting(SimConfig::with_seed(5));
    let c = w.add_node(EchoCfg {
        opts: SockOpts {
            keepalive: Some((30, 5, 5)),
            ..SockOpts::default()
        },
        ..echo_cfg(1, false)
    });
    let s = w.add_node(echo_cfg(2, true));
    let first = exchange(&mut w, c, b"before");
    assert_eq!(w.node(c).unwrap().received(first), b"before");
    assert_eq!(w.stream_ends_of(s), 1);
    w.reboot(s, Duration::from_secs(20), 2);
    assert_eq!(w.node_state(s), NodeState::Crashed);
    assert_eq!(w.stream_ends_of(s), 0, "its connections vanished");
    assert_eq!(
        w.streams().in_flight(),
        0,
        "a keepalive is a timer, not work"
    );
    w.run_for(Duration::from_secs(54));
    assert!(!w.node(c).unwrap().heard_an_end());
    w.run_for(Duration::from_secs(2));
    assert_eq!(
        w.node(c).unwrap().heard().last(),
        Some(&Heard::Ended(first, EndReason::TimedOut))
    );
    // Back since 20 s: a fresh node, listening, that heard nothing else.
    assert_eq!(w.node_state(s), NodeState::Up);
    assert_eq!(w.node(s).unwrap().heard(), vec![Heard::Listening]);
    let second = exchange(&mut w, c, b"after");
    assert_eq!(w.node(c).unwrap().received(second), b"after");
    assert_eq!(w.streams().stats().timeouts, 1);
}

/// A connection without keepalive hears nothing of a crash until it sends; the host being back
/// by then answers with RST.
#[test]
fn a_silent_connection_to_a_rebooted_host_is_reset_when_it_sends() {
    let (mut w, c, s) = echo_world(6);
    let stream = exchange(&mut w, c, b"one");
    w.reboot(s, Duration::from_secs(1), 2);
    w.run_for(Duration::from_secs(100));
    assert!(!w.node(c).unwrap().heard_an_end());
    w.with_node(c, |e, _| e.send(stream, b"two".to_vec()));
    assert!(w.run_until_idle(limit(&w, 1)));
    assert_eq!(
        w.node(c).unwrap().heard().last(),
        Some(&Heard::Ended(stream, EndReason::Reset))
    );
}

/// A graceful shutdown closes the node's streams itself: its peer hears EOF after every byte,
/// the node is removed, the host keeps nothing; a restart on the same host listens again.
#[test]
fn a_shutdown_is_heard_as_eof_and_leaves_nothing_behind() {
    let (mut w, c, s) = echo_world(7);
    let stream = exchange(&mut w, c, b"hello");
    assert_shutdown_heard_as_eof(&mut w, s, c, stream);
    assert_eq!(w.stream_ends_of(s) + w.stream_ends_of(c), 0);
    assert!(w.restart(s, 2));
    let again = exchange(&mut w, c, b"again");
    assert_eq!(w.node(c).unwrap().received(again), b"again");
}

/// A node removed with streams it never closed (a shutdown that forgets them) has them closed
/// by its host's kernel: the peer still hears EOF, and nothing is left on the host.
#[test]
fn streams_a_stopped_node_left_open_are_closed_by_its_host() {
    let (mut w, c, s) = echo_world(8);
    let stream = exchange(&mut w, c, b"x");
    // The server forgets its streams, so its shutdown closes nothing.
    w.with_node(s, |e, _| e.open.clear());
    assert_shutdown_heard_as_eof(&mut w, s, c, stream);
    assert_eq!(w.stream_ends_of(s), 0);
}

/// A partition cuts streams too: a dial across it fails as unreachable, bytes on a live
/// connection are held, not lost, and arrive once healed.
#[test]
fn a_partition_holds_stream_bytes_and_fails_dials_until_healed() {
    let (mut w, c, s) = echo_world(9);
    let stream = exchange(&mut w, c, b"first");
    let p = w.partition(&[c], &[s]);
    w.with_node(c, |e, _| e.send(stream, b"held".to_vec()));
    let dial = w.with_node(c, |e, _| e.dial(ip(2))).unwrap();
    w.run_for(Duration::from_secs(5));
    let client = w.node(c).unwrap();
    assert_eq!(client.received(stream), b"first");
    assert!(client
        .heard()
        .contains(&Heard::DialFailed(dial, DialError::Unreachable)));
    w.heal_partition(p);
    assert!(w.run_until_idle(limit(&w, 1)));
    assert_eq!(w.node(c).unwrap().received(stream), b"firstheld");
}

/// A stall holds one direction: the client's send never completes while the server's bytes
/// still flow; with TCP_USER_TIMEOUT the client's stack gives up (TimedOut) that long after;
/// without one, the end of the stall lets the bytes go.
#[test]
fn a_stall_holds_one_direction_until_the_user_timeout_or_its_end() {
    for user_timeout in [Some(Duration::from_secs(30)), None] {
        let mut w: World<Echo> = World::hosting(SimConfig::with_seed(10));
        let c = w.add_node(EchoCfg {
            opts: SockOpts {
                user_timeout,
                ..SockOpts::default()
            },
            ..echo_cfg(1, false)
        });
        let s = w.add_node(echo_cfg(2, true));
        let stream = exchange(&mut w, c, b"ping");
        let server_stream = w.node(s).unwrap().open[0];
        w.stall_streams(c, s);
        let id = w
            .with_node(c, |e, _| e.send(stream, b"stuck".to_vec()))
            .unwrap();
        // The other way flows.
        w.with_node(s, |e, _| e.send(server_stream, b"pong".to_vec()));
        w.run_for(Duration::from_secs(29));
        let client = w.node(c).unwrap();
        assert_eq!(client.received(stream), b"pingpong");
        assert!(!client
            .heard()
            .iter()
            .any(|h| matches!(h, Heard::Sent(_, x, _) if *x == id)));
        w.run_for(Duration::from_secs(2));
        let client = w.node(c).unwrap();
        if user_timeout.is_some() {
            assert_eq!(
                client.heard()[client.heard().len() - 2..],
                [
                    Heard::Sent(stream, id, Err(EndReason::TimedOut)),
                    Heard::Ended(stream, EndReason::TimedOut)
                ]
            );
        } else {
            assert!(!client.heard_an_end());
            w.unstall_streams(c, s);
            assert!(w.run_until_idle(limit(&w, 1)));
            let client = w.node(c).unwrap();
            assert!(client.heard().contains(&Heard::Sent(stream, id, Ok(()))));
            assert_eq!(client.received(stream), b"pingpongstuck");
        }
    }
}

/// A reset between two nodes reaches both ends of every stream between them, dialled either
/// way, and only those.
#[test]
fn a_reset_between_two_nodes_is_heard_by_both_sides() {
    let mut w: World<Echo> = World::hosting(SimConfig::with_seed(12));
    let c = w.add_node(echo_cfg(1, false));
    let s = w.add_node(echo_cfg(2, true));
    let other = w.add_node(echo_cfg(3, true));
    let stream = dial_and_send(&mut w, c, b"a", 64);
    let bystander = w
        .with_node(c, |e, _| {
            let x = e.dial(ip(3));
            e.send(x, b"b".to_vec());
            x
        })
        .unwrap();
    assert!(w.run_until_idle(limit(&w, 1)));
    w.reset_streams(s, c);
    let client = w.node(c).unwrap();
    assert!(client
        .heard()
        .contains(&Heard::Ended(stream, EndReason::Reset)));
    assert!(!client
        .heard()
        .contains(&Heard::Ended(bystander, EndReason::Reset)));
    let server = w.node(s).unwrap();
    assert!(matches!(
        server.heard().last(),
        Some(Heard::Ended(_, EndReason::Reset))
    ));
    assert!(!w.node(other).unwrap().heard_an_end());
}
