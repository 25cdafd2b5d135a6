//! A test-only LND that streams payloads inline behind their header, as ksocklnd does (no
//! rendezvous, no registered memory of the peer's), and a routed test through it: the proof that
//! LNet is written against `lnd::iface::Lnd` alone. A router joins an o2ib net to a net of this
//! LND and receives an o2ib PUT by RDMA into a large router buffer, then streams it on from that
//! same memory; the next router receives the stream into its own large buffer and writes it on by
//! RDMA. Every byte must land where it was meant to.
//!
//! The wire is a hub of per-NID queues shared by every instance (a lossless, instant network).
//! A payload above [`INLINE_MAX`] comes up to LNet as a bulk request, so that LNet chooses where
//! it lands (`accept_bulk`: a posted MD, a router's large buffer), as kernel LNet's lnet_parse
//! hands ksocklnd the buffer to receive the payload into (lnd_recv).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use lnd::iface::{BulkMem, BulkOp, BulkSend, Lnd, LndEvent, LndInfo, RxToken, SendError, TxError};
use lnd::trim::Capacity;
use lnd::wire::kib::EPROTO;
use lnd::wire::lnet::LNET_MTU;
use lnd::wire::LndType;

use super::routing::{give_bulk_buffers, node, route, split, StubDriver};
use super::*;

/// Payloads up to this come up as `Received`, larger ones as a bulk request.
const INLINE_MAX: usize = 4096;

/// One message on the wire: its sender, header and the payload streamed behind it.
struct Frame {
    from: Nid,
    hdr: LnetHdr,
    payload: Vec<u8>,
}

/// The shared wire: what is queued for each NID, and which NIDs are attached.
#[derive(Clone, Default)]
struct Hub(Arc<Mutex<HashMap<Nid, VecDeque<Frame>>>>);

impl Hub {
    fn attach(&self, nid: Nid) {
        self.0.lock().unwrap().entry(nid).or_default();
    }

    /// Queues `f` for `to`; false if nothing is attached there.
    fn deliver(&self, to: Nid, f: Frame) -> bool {
        match self.0.lock().unwrap().get_mut(&to) {
            Some(q) => {
                q.push_back(f);
                true
            }
            None => false,
        }
    }

    fn take(&self, nid: Nid) -> Vec<Frame> {
        self.0
            .lock()
            .unwrap()
            .get_mut(&nid)
            .map(|q| q.drain(..).collect())
            .unwrap_or_default()
    }

    fn has_for(&self, nid: Nid) -> bool {
        self.0
            .lock()
            .unwrap()
            .get(&nid)
            .is_some_and(|q| !q.is_empty())
    }

    fn attached(&self, nid: Nid) -> bool {
        self.0.lock().unwrap().contains_key(&nid)
    }
}

/// Counters the test reads back through `Lnd::as_any`.
#[derive(Default, Debug)]
struct Counts {
    sent: u64,
    streamed_bytes_out: u64,
    streamed_bytes_in: u64,
    bulk_requests: u64,
}

struct InlineLnd {
    nid: Nid,
    hub: Hub,
    now: Instant,
    events: VecDeque<LndEvent>,
    /// Messages LNet holds, by token: answered exactly once.
    held: HashMap<u64, Frame>,
    next_rx: u64,
    peers: HashSet<Nid>,
    shut: bool,
    counts: Counts,
}

impl InlineLnd {
    fn new(nid: Nid, hub: Hub, now: Instant) -> InlineLnd {
        hub.attach(nid);
        InlineLnd {
            nid,
            hub,
            now,
            events: VecDeque::new(),
            held: HashMap::new(),
            next_rx: 0,
            peers: HashSet::new(),
            shut: false,
            counts: Counts::default(),
        }
    }

    fn check_peer(&self, peer: Nid) -> Result<(), SendError> {
        if self.shut {
            return Err(SendError::Shutdown);
        }
        if peer.is_any() || peer.net() != self.nid.net() {
            return Err(SendError::BadPeer(peer));
        }
        Ok(())
    }

    /// Puts a frame on the wire; the send is done once it is there (ksocklnd: once the socket
    /// took the bytes), or fails if nobody is attached at `peer`.
    fn emit(&mut self, peer: Nid, hdr: LnetHdr, payload: Vec<u8>, cookie: u64) {
        self.peers.insert(peer);
        self.counts.sent += 1;
        let from = self.nid;
        let result = if self.hub.deliver(peer, Frame { from, hdr, payload }) {
            Ok(())
        } else {
            Err(TxError::ConnectFailed)
        };
        self.events.push_back(LndEvent::SendDone {
            cookie,
            peer,
            result,
            returned: Vec::new(),
        });
    }

    /// Takes what the wire brought: each frame goes up once, held until LNet answers it.
    fn pull(&mut self) {
        if self.shut {
            return;
        }
        for f in self.hub.take(self.nid) {
            self.peers.insert(f.from);
            let id = self.next_rx;
            self.next_rx += 1;
            let rx = RxToken::new(id, 0);
            let ev = if f.payload.len() > INLINE_MAX {
                self.counts.bulk_requests += 1;
                LndEvent::BulkRequest {
                    from: f.from,
                    hdr: f.hdr,
                    op: BulkOp::Put,
                    rx,
                }
            } else {
                LndEvent::Received {
                    from: f.from,
                    hdr: f.hdr,
                    payload: f.payload.clone(),
                    rx,
                }
            };
            self.held.insert(id, f);
            self.events.push_back(ev);
        }
    }

    fn release(&mut self, rx: RxToken) -> Option<Frame> {
        self.held.remove(&rx.parts().0)
    }
}

impl Lnd for InlineLnd {
    fn name(&self) -> &'static str {
        "inline"
    }

    fn nid(&self) -> Nid {
        self.nid
    }

    fn max_inline(&self) -> usize {
        INLINE_MAX
    }

    fn send(
        &mut self,
        now: Instant,
        peer: Nid,
        hdr: LnetHdr,
        payload: Vec<u8>,
        cookie: u64,
    ) -> Result<(), SendError> {
        self.now = self.now.max(now);
        self.check_peer(peer)?;
        if payload.len() > INLINE_MAX {
            return Err(SendError::PayloadTooLarge(payload.len()));
        }
        self.emit(peer, hdr, payload, cookie);
        Ok(())
    }

    /// A PUT streams its payload from LNet's memory (a copy here; the real socklnd sends it
    /// without one). A GET into LNet's memory is not this LND's: its REPLY comes back as a
    /// message like any other.
    fn send_bulk(
        &mut self,
        now: Instant,
        peer: Nid,
        hdr: LnetHdr,
        bulk: BulkSend,
        cookie: u64,
    ) -> Result<(), SendError> {
        self.now = self.now.max(now);
        self.check_peer(peer)?;
        let BulkSend::Put(src) = bulk else {
            return Err(SendError::BadBulk);
        };
        let Some(mem) = src.mem.as_ref() else {
            return Err(SendError::BadBulk);
        };
        if src.len != hdr.payload_length {
            return Err(SendError::BadBulk);
        }
        let start = src.offset as usize;
        let end = start + src.len as usize;
        let payload = mem.with(|b| b.get(start..end).map(<[u8]>::to_vec));
        let Some(payload) = payload else {
            return Err(SendError::BadBulk);
        };
        self.counts.streamed_bytes_out += payload.len() as u64;
        self.emit(peer, hdr, payload, cookie);
        Ok(())
    }

    fn recv_done(&mut self, now: Instant, rx: RxToken) {
        self.now = self.now.max(now);
        // Nothing matched a streamed payload: it is skipped, as ksocklnd skips the bytes.
        self.release(rx);
    }

    fn recv_failed(&mut self, now: Instant, rx: RxToken) {
        self.now = self.now.max(now);
        self.release(rx);
    }

    fn accept_bulk(&mut self, now: Instant, rx: RxToken, sink: BulkMem, cookie: u64) {
        self.now = self.now.max(now);
        let Some(f) = self.release(rx) else {
            return;
        };
        let n = sink.len.min(f.payload.len() as u32) as usize;
        let start = sink.offset as usize;
        let landed = sink.mem.as_ref().is_some_and(|m| {
            m.with(|b| match b.get_mut(start..start + n) {
                Some(dst) => {
                    dst.copy_from_slice(&f.payload[..n]);
                    true
                }
                None => false,
            })
        });
        self.counts.streamed_bytes_in += if landed { n as u64 } else { 0 };
        self.events.push_back(LndEvent::BulkDone {
            cookie,
            peer: f.from,
            result: if landed {
                Ok(n as u32)
            } else {
                Err(TxError::Rdma(-EPROTO))
            },
        });
    }

    /// Never asked: this LND raises no GET by rendezvous. Accounted all the same.
    fn reply_bulk(&mut self, now: Instant, rx: RxToken, _src: BulkMem, cookie: u64) {
        self.now = self.now.max(now);
        let peer = self.release(rx).map_or(self.nid, |f| f.from);
        self.events.push_back(LndEvent::SendDone {
            cookie,
            peer,
            result: Err(TxError::Rdma(-EPROTO)),
            returned: Vec::new(),
        });
    }

    fn refuse_bulk(&mut self, now: Instant, rx: RxToken, _errno: i32) {
        self.now = self.now.max(now);
        self.release(rx);
    }

    fn poll_event(&mut self) -> Option<LndEvent> {
        if self.events.is_empty() {
            self.pull();
        }
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        (!self.shut && self.hub.has_for(self.nid)).then_some(self.now)
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    fn shutdown(&mut self, now: Instant) {
        self.now = self.now.max(now);
        self.shut = true;
    }

    fn is_shut_down(&self) -> bool {
        self.shut
    }

    fn fabric_lost(&mut self, now: Instant) {
        self.shutdown(now);
    }

    fn peer_up(&self, peer: Nid) -> bool {
        self.hub.attached(peer)
    }

    fn peer_count(&self) -> usize {
        self.peers.len()
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(50)
    }

    fn grant_timeout(&self) -> Duration {
        Duration::ZERO
    }

    fn sees_writes(&self) -> bool {
        true
    }

    fn set_fabric_sees_writes(&mut self, _on: bool) {}

    fn info(&self) -> LndInfo {
        LndInfo::Plain { name: "inline" }
    }

    fn capacities(&self) -> Vec<Capacity> {
        Vec::new()
    }

    fn recycle(&mut self, _buf: Vec<u8>) {}

    fn take_buffer(&mut self) -> Vec<u8> {
        Vec::new()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

// Two routers in a row, o2ib - tcp - o2ib1: the first's o2ib NI and the second's o2ib1 NI
// stand where the one router of the routed topology does.
use testkit::topo::{CLIENT, R_A as R1_IB, R_B as R2_IB, SERVER};
const R1_TCP: &str = "10.2.0.1@tcp";
const R2_TCP: &str = "10.2.0.2@tcp";

/// A node whose `tcp` NIs run the inline LND and the others o2ib.
fn start(cfg: NodeConfig, hub: &Hub, now: Instant) -> LnetNode {
    let lnds = cfg
        .nis
        .iter()
        .map(|c| -> Box<dyn Lnd> {
            if c.nid.net().lnd() == LndType::Tcp {
                Box::new(InlineLnd::new(c.nid, hub.clone(), now))
            } else {
                crate::o2ib::o2ib_lnd(c, now)
            }
        })
        .collect();
    LnetNode::with_lnds(cfg, lnds, now)
}

/// The counts of the one inline NI among `nodes` (a router, whole or split per NI).
fn inline_counts<'a>(f: &'a Fabric, nodes: &[usize]) -> &'a Counts {
    let mut found = nodes.iter().flat_map(|&n| {
        (0..f.nodes[n].ni_count()).filter_map(move |i| {
            f.nodes[n]
                .lnd(NiIndex(i))?
                .as_any()
                .downcast_ref::<InlineLnd>()
        })
    });
    let lnd = found.next().expect("an inline NI");
    assert!(found.next().is_none(), "one inline NI per router");
    &lnd.counts
}

/// client (o2ib) -> R1 (o2ib | inline tcp) -> R2 (inline tcp | o2ib1) -> server (o2ib1), and
/// PUTs of 1 MiB (and odd sizes) both ways: each crosses an o2ib rendezvous into a large router
/// buffer, a stream out of that buffer, a stream into the next router's buffer and a rendezvous
/// out of it. Every byte lands in the posted sink and nothing beside it; every PUT ends once on
/// both sides; the routers' books balance with every buffer back. Each router runs as one node
/// with both NIs (an o2ib LND and the streaming one side by side), and as the daemon runs it: a
/// node per NI, the forward crossing from one LND's runtime to the other's through the relay.
#[test]
fn bulk_puts_cross_o2ib_then_a_streaming_lnd_then_o2ib_byte_exact() {
    for split_routers in [false, true] {
        o2ib_stream_o2ib(split_routers);
    }
}

fn o2ib_stream_o2ib(split_routers: bool) {
    let hub = Hub::default();
    let now = Instant::from_secs(1);
    let [client_cfg, server_cfg, r1, r2] = [
        node(
            &[CLIENT],
            &[route("tcp", R1_IB), route("o2ib1", R1_IB)],
            false,
            10,
        ),
        node(
            &[SERVER],
            &[route("tcp", R2_IB), route("o2ib", R2_IB)],
            false,
            20,
        ),
        node(&[R1_IB, R1_TCP], &[route("o2ib1", R2_TCP)], true, 30),
        node(&[R2_TCP, R2_IB], &[route("o2ib", R1_TCP)], true, 40),
    ];
    let (r1, r2) = if split_routers {
        (split(r1), split(r2))
    } else {
        (vec![r1], vec![r2])
    };
    let r1_nodes: Vec<usize> = (2..2 + r1.len()).collect();
    let r2_nodes: Vec<usize> = (2 + r1.len()..2 + r1.len() + r2.len()).collect();
    let cfgs = [vec![client_cfg, server_cfg], r1, r2].concat();
    let nodes = cfgs.into_iter().map(|c| start(c, &hub, now)).collect();
    let mut f = Fabric::hosting(nodes, now);
    give_bulk_buffers(&mut f, &r1_nodes, 3);
    give_bulk_buffers(&mut f, &r2_nodes, 3);
    let (client, server) = (nid(CLIENT), nid(SERVER));
    ping_both_ways(&mut f, client, server);
    f.run_for(Duration::from_secs(3));
    for n in [0, 1] {
        let pings = ping_results(&f.take_events(n));
        assert_eq!(pings.len(), 1, "node {n}, split {split_routers}");
        assert!(pings[0].2.is_ok(), "node {n}: {:?}", pings[0].2);
    }

    const MIB: usize = 1 << 20;
    let sizes = [MIB as u32, 1, 4097, 300_001, MIB as u32 - 3, MIB as u32];
    // (sender, receiver, their NIDs)
    for (from, to, dst) in [(0usize, 1usize, server), (1, 0, client)] {
        let bytes: Vec<u8> = (0..MIB as u32 + 64)
            .map(|i| (i.wrapping_add(from as u32 * 7).wrapping_mul(2_654_435_761) >> 9) as u8)
            .collect();
        let src = f.register(from, bytes.clone());
        let mut sinks = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let sink = f.register(to, vec![0xee; MIB + 64]);
            let buf = BulkBuf::new(NiIndex(0), &sink, 5, len).unwrap();
            f.nodes[to].post_sink(4, 100 + i as u64, buf);
            sinks.push(sink);
        }
        // All at once: six PUTs, three buffers in each router.
        let now = f.now;
        let ids: Vec<MsgId> = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let b = BulkBuf::new(NiIndex(0), &src, 3 + i as u64, len).unwrap();
                f.nodes[from]
                    .send_put_bulk(now, dst, 4, 100 + i as u64, b)
                    .unwrap()
            })
            .collect();
        f.run_for(Duration::from_secs(10));
        let sent = f.take_events(from);
        for id in &ids {
            let done: Vec<_> = picked(&sent, |e| match e {
                LnetEvent::PutDone { id: i, result } if i == id => Some(*result),
                _ => None,
            });
            assert_eq!(done, vec![Ok(())], "{from} -> {to}, split {split_routers}");
        }
        // A payload the streaming net carried inline (up to INLINE_MAX) reaches the server as
        // an immediate PUT, which LNet matches to the posted sink and hands up with its bytes
        // (BulkPutInline: the user copies them in); the others land by RDMA (BulkPut).
        let mut landed: Vec<(u64, Result<u32, LnetError>)> = Vec::new();
        let mut inline: HashMap<u64, Vec<u8>> = HashMap::new();
        for (_, e) in f.take_events(to) {
            match e {
                LnetEvent::BulkPut {
                    match_bits, result, ..
                } => landed.push((match_bits, result)),
                LnetEvent::BulkPutInline {
                    match_bits,
                    payload,
                    ..
                } => {
                    landed.push((match_bits, Ok(payload.len() as u32)));
                    inline.insert(match_bits, payload);
                }
                _ => {}
            }
        }
        landed.sort_by_key(|&(mb, _)| mb);
        let want: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| (100 + i as u64, Ok(len)))
            .collect();
        assert_eq!(landed, want, "{from} -> {to}, split {split_routers}");
        for (i, (&len, sink)) in sizes.iter().zip(&sinks).enumerate() {
            let off = 3 + i;
            let sent = &bytes[off..off + len as usize];
            if let Some(p) = inline.get(&(100 + i as u64)) {
                assert!(len as usize <= INLINE_MAX, "{from} -> {to}: PUT {i}");
                assert!(
                    p[..] == *sent,
                    "{from} -> {to}: PUT {i} ({len} bytes) differs"
                );
                continue;
            }
            let got = f.region(to, sink);
            assert!(
                got[5..5 + len as usize] == *sent,
                "{from} -> {to}: PUT {i} ({len} bytes) differs"
            );
            assert!(got[..5].iter().all(|&b| b == 0xee), "touched before");
            assert!(
                got[5 + len as usize..].iter().all(|&b| b == 0xee),
                "touched after"
            );
        }
    }

    // Every PUT crossed both routers' streaming NIs as a stream, both ways.
    // (A payload carried inline comes in with its header, not into a router buffer.)
    let total: u64 = sizes.iter().map(|&l| u64::from(l)).sum();
    let into_buffers: u64 = sizes
        .iter()
        .filter(|&&l| l as usize > INLINE_MAX)
        .map(|&l| u64::from(l))
        .sum();
    for r in [&r1_nodes, &r2_nodes] {
        let c = inline_counts(&f, r);
        assert_eq!(c.streamed_bytes_out, total, "router {r:?}: {c:?}");
        assert_eq!(c.streamed_bytes_in, into_buffers, "router {r:?}: {c:?}");
        let large = sizes.iter().filter(|&&l| l as usize > INLINE_MAX).count() as u64;
        assert_eq!(c.bulk_requests, large, "router {r:?}: {c:?}");
    }
    // The routers' books: everything forwarded, nothing held, every buffer back.
    let books = super::routing::assert_router_quiescent(&f, &[r1_nodes, r2_nodes].concat());
    assert_eq!(books.dropped(), 0, "{books:?}");
    assert!(books.forwarded >= 2 * 2 * sizes.len() as u64, "{books:?}");
    assert!(LNET_MTU as usize >= MIB);
}

/// A runtime whose driver serves another LND than its NI runs (an o2ib fabric under a streaming
/// NI: a wiring mistake of the layer that builds them) fails its turn with `InvalidInput`
/// instead of running an NI whose bytes go nowhere.
#[test]
fn an_o2ib_driver_under_another_lnd_fails_its_turn() {
    use lnd::driver::MonotonicClock;
    let hub = Hub::default();
    let clock = MonotonicClock::new();
    let inline = start(node(&[R1_TCP], &[], false, 30), &hub, clock.now());
    let (mut rt, _wake) =
        crate::runtime::NiRuntime::new(inline, StubDriver { fails: false }, clock).unwrap();
    let err = rt.turn(std::time::Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
    // The same driver under an o2ib NI turns.
    let o2ib = start(node(&[R1_IB], &[], false, 30), &hub, clock.now());
    let (mut rt, _wake) =
        crate::runtime::NiRuntime::new(o2ib, StubDriver { fails: false }, clock).unwrap();
    rt.turn(std::time::Duration::ZERO).unwrap();
}
