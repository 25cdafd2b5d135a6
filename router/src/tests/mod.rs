//! Unit tests with a tiny driver: a few `LnetNode`s whose endpoints are wired by an instant,
//! lossless fabric (the idea of lnd's engine test `Pair`, for whole nodes with several NIs).

use std::collections::{HashMap, VecDeque};

use lnd::fabric::{
    ConnId, ConnectFailure, DisconnectReason, FabricAction, LocalFrag, PrivateData, RemoteFrag,
    RequestId, WcStatus, WrId,
};
use lnd::time::{Duration, Instant};
use lnd::wire::lnet::{LNET_PID_LUSTRE, LNET_PING_MATCHBITS, LNET_RESERVED_PORTAL};
use lnd::wire::{LnetBody, LnetHdr, Nid, WireHandle};
use proptest::prelude::*;

use crate::*;

mod bulk;
mod bulk_hostile;
mod health;
mod inline_lnd;
mod routing;
mod selftest;

use testkit::nid;

/// (node, NI, connection)
type End = (usize, usize, ConnId);

/// A fabric event as this fabric queues it: owning its bytes until it is delivered.
#[derive(Clone, Debug)]
enum Ev {
    ConnectRequest {
        req: RequestId,
        private: PrivateData,
    },
    Established {
        conn: ConnId,
        private: PrivateData,
    },
    ConnectFailed {
        conn: ConnId,
        why: ConnectFailure,
    },
    Recv {
        conn: ConnId,
        slot: u16,
        bytes: Vec<u8>,
    },
    SendComplete {
        conn: ConnId,
        wr: WrId,
        status: WcStatus,
    },
    Disconnected {
        conn: ConnId,
    },
}

impl Ev {
    fn as_event(&self) -> FabricEvent<'_> {
        match self {
            Ev::ConnectRequest { req, private } => FabricEvent::ConnectRequest {
                req: *req,
                private: private.as_bytes(),
            },
            Ev::Established { conn, private } => FabricEvent::Established {
                conn: *conn,
                private: private.as_bytes(),
            },
            Ev::ConnectFailed { conn, why } => FabricEvent::ConnectFailed {
                conn: *conn,
                why: *why,
            },
            Ev::Recv { conn, slot, bytes } => FabricEvent::Recv {
                conn: *conn,
                slot: *slot,
                bytes,
            },
            Ev::SendComplete { conn, wr, status } => FabricEvent::SendComplete {
                conn: *conn,
                wr: *wr,
                status: *status,
            },
            Ev::Disconnected { conn } => FabricEvent::Disconnected {
                conn: *conn,
                why: DisconnectReason::Closed,
            },
        }
    }
}

struct Fabric {
    nodes: Vec<LnetNode>,
    now: Instant,
    queue: VecDeque<(usize, usize, Ev)>,
    links: HashMap<End, End>,
    pending: HashMap<u64, End>,
    next_req: u64,
    /// Connects to a NID no node has are never answered (else: Unreachable at once).
    blackhole: bool,
    /// Nodes that were killed: nothing reaches them, nothing leaves them, connects to them
    /// are never answered (a powered-off host).
    dead: Vec<usize>,
    /// Every event of every node, with the time it was drained.
    events: Vec<Vec<(Instant, LnetEvent)>>,
    actions: Vec<u64>,
    /// The receive slot each end's next message lands in: a fresh one each time (a slot is
    /// never reused while the engine may still hold it, as with real posted receives).
    next_slot: HashMap<End, u16>,
    /// Each node's registered memory (one protection domain per node, shared by its NIs).
    mem: Vec<Memory>,
    /// Each node's selftest, if it runs one: it takes the node's events first.
    selftests: Vec<Option<crate::selftest::Selftest>>,
    /// Flip a byte of every RDMA write into these nodes (data corrupted in flight, for the
    /// data checks).
    corrupt_writes: Vec<usize>,
    /// Hostile writers: the RDMA writes of these nodes carry only the first half of their
    /// data (the rest of the sink keeps what it held), yet complete as whole.
    short_writes: Vec<usize>,
    /// Hostile writers: the RDMA writes of these nodes are never done nor completed, so their
    /// PUT_DONE never comes (a grant pinned).
    stalled_writes: Vec<usize>,
}

/// A split node's runtimes in the fabric, as the relay reaches them: `runs[i]`, the node that
/// runs `nids[i]`, takes a handover at once.
struct Siblings<'a> {
    nodes: &'a mut [LnetNode],
    nids: &'a [Nid],
    runs: &'a [Option<usize>],
    board: &'a crate::alive::NetAlive,
    now: Instant,
}

impl crate::relay::Links for Siblings<'_> {
    fn nids(&self) -> &[Nid] {
        self.nids
    }

    fn board(&self) -> &crate::alive::NetAlive {
        self.board
    }

    fn try_hand(&mut self, to: crate::relay::Dest, h: Handover) -> crate::relay::Handed {
        match to {
            crate::relay::Dest::Sibling(i) => match self.runs.get(i).copied().flatten() {
                Some(n) => {
                    self.nodes[n].handle_handover(self.now, h);
                    crate::relay::Handed::Taken
                }
                None => crate::relay::Handed::Gone(h),
            },
            crate::relay::Dest::Leaving(_) => crate::relay::Handed::Gone(h),
        }
    }

    /// Nothing to wake: [`Fabric::drain`] passes every node until none has anything.
    fn wake(&mut self, _: crate::relay::Dest) {}
}

/// The first `len` bytes of a fragment list (a hostile writer's short write).
fn cut_frags<F: Copy>(frags: &[F], len: u64, size: impl Fn(&mut F) -> &mut u32) -> Vec<F> {
    let mut left = len;
    let mut out = Vec::new();
    for &f in frags {
        if left == 0 {
            break;
        }
        let mut f = f;
        let n = u64::from(*size(&mut f)).min(left);
        *size(&mut f) = n as u32;
        out.push(f);
        left -= n;
    }
    out
}

/// A node's memory as the fabric's registry, for a selftest on it.
struct NodeRegistry<'a>(&'a mut Memory);

impl lnd::fabric::Registry for NodeRegistry<'_> {
    fn register(&mut self, bytes: Vec<u8>) -> std::io::Result<lnd::fabric::Registration> {
        let mem = lnd::fabric::SharedMem::new(bytes.len());
        mem.with(|b| b.copy_from_slice(&bytes));
        self.register_shared(&mem)
    }

    fn read(&self, reg: &lnd::fabric::Registration, offset: u64, out: &mut [u8]) -> bool {
        match self.0.read_id(reg.id().0, offset, out.len() as u32) {
            Some(b) => {
                out.copy_from_slice(&b);
                true
            }
            None => false,
        }
    }

    fn deregister(&mut self, reg: lnd::fabric::Registration) -> Option<Vec<u8>> {
        self.0.regions.remove(&reg.id().0).map(|_| Vec::new())
    }

    fn register_shared(
        &mut self,
        mem: &lnd::fabric::SharedMem,
    ) -> std::io::Result<lnd::fabric::Registration> {
        let m = &mut *self.0;
        m.next += 1;
        let (id, key, addr) = (m.next, 0x5000 + m.next as u32, m.next << 32);
        m.regions.insert(id, (key, addr, mem.clone()));
        Ok(lnd::fabric::Registration::new(
            lnd::fabric::RegionId(id),
            key,
            addr,
            mem.len() as u64,
        ))
    }
}

/// A node's registered regions: by local id, with their key and address; memory of its own,
/// or shared with other nodes (a router's runtimes share their large buffers).
#[derive(Default)]
struct Memory {
    regions: HashMap<u64, (u32, u64, lnd::fabric::SharedMem)>,
    next: u64,
}

impl Memory {
    /// Copies `bytes` into `[addr, ..)` of the region registered under `key`; false if outside.
    fn write_key(&self, key: u32, addr: u64, bytes: &[u8]) -> bool {
        let Some((_, base, mem)) = self.regions.values().find(|r| r.0 == key) else {
            return false;
        };
        let Some(start) = addr
            .checked_sub(*base)
            .and_then(|s| usize::try_from(s).ok())
        else {
            return false;
        };
        mem.with(|b| {
            b.get_mut(start..start + bytes.len())
                .map(|d| d.copy_from_slice(bytes))
                .is_some()
        })
    }

    fn fits_key(&self, key: u32, addr: u64, len: usize) -> bool {
        self.regions.values().any(|(k, base, mem)| {
            *k == key
                && addr
                    .checked_sub(*base)
                    .is_some_and(|s| s.saturating_add(len as u64) <= mem.len() as u64)
        })
    }

    fn read_id(&self, id: u64, offset: u64, len: u32) -> Option<Vec<u8>> {
        let (_, _, mem) = self.regions.get(&id)?;
        let start = usize::try_from(offset).ok()?;
        mem.with(|b| {
            b.get(start..start.checked_add(len as usize)?)
                .map(<[u8]>::to_vec)
        })
    }
}

impl Fabric {
    fn new(nodes: &[&[&str]]) -> Fabric {
        Fabric::with(nodes, |_| {})
    }

    /// Nodes from whole configurations (routes, routing); NI incarnations must be set.
    fn from_configs(cfgs: Vec<NodeConfig>) -> Fabric {
        let now = Instant::from_secs(1);
        let nodes: Vec<LnetNode> = cfgs.into_iter().map(|c| LnetNode::new(c, now)).collect();
        Fabric::hosting(nodes, now)
    }

    fn hosting(nodes: Vec<LnetNode>, now: Instant) -> Fabric {
        let n = nodes.len();
        Fabric {
            nodes,
            now,
            queue: VecDeque::new(),
            links: HashMap::new(),
            pending: HashMap::new(),
            next_req: 0,
            blackhole: false,
            dead: Vec::new(),
            events: vec![Vec::new(); n],
            actions: vec![0; n],
            mem: (0..n).map(|_| Memory::default()).collect(),
            next_slot: HashMap::new(),
            selftests: (0..n).map(|_| None).collect(),
            corrupt_writes: Vec::new(),
            short_writes: Vec::new(),
            stalled_writes: Vec::new(),
        }
    }

    fn with(nodes: &[&[&str]], tweak: impl Fn(&mut NiConfig)) -> Fabric {
        let now = Instant::from_secs(1);
        let mut inc = 100;
        let nodes: Vec<LnetNode> = nodes
            .iter()
            .map(|nids| {
                let nis = nids
                    .iter()
                    .map(|s| {
                        inc += 1;
                        let mut c = NiConfig::new(nid(s), inc);
                        tweak(&mut c);
                        c
                    })
                    .collect();
                LnetNode::new(NodeConfig::new(nis), now)
            })
            .collect();
        Fabric::hosting(nodes, now)
    }

    fn locate(&self, peer: Nid) -> Option<(usize, usize)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(n, _)| !self.dead.contains(n))
            .find_map(|(n, node)| {
                node.nids()
                    .iter()
                    .position(|&x| x == peer)
                    .map(|ni| (n, ni))
            })
    }

    /// Kills node `n` without a word to anyone: its connections go silent.
    fn kill(&mut self, n: usize) {
        self.dead.push(n);
    }

    /// Relays what node `from` handed its siblings with the daemon's relay
    /// ([`crate::relay`]), delivered at once to the sibling runtime (a node whose `node_nids`
    /// are the same and that runs the target NID); what no sibling takes fails back at
    /// `from`. True if there was anything.
    fn relay(&mut self, from: usize) -> bool {
        let mut relay = crate::relay::Relay::new();
        relay.take(&mut self.nodes[from]);
        if relay.waiting() == 0 {
            return false;
        }
        let family = self.nodes[from].node_nids().to_vec();
        let runs: Vec<Option<usize>> = family
            .iter()
            .map(|nid| {
                self.nodes.iter().position(|node| {
                    node.node_nids() == family.as_slice() && node.nids().contains(nid)
                })
            })
            .collect();
        let board = self.nodes[from].net_alive().clone();
        let now = self.now;
        let back = relay.hand_out(&mut Siblings {
            nodes: &mut self.nodes,
            nids: &family,
            runs: &runs,
            board: &board,
            now,
        });
        // Delivered at once: nothing waits for a full link here.
        assert_eq!(relay.waiting(), 0);
        for h in back {
            self.nodes[from].handle_handover(now, h);
        }
        true
    }

    /// Moves every handover, action and event until a whole pass finds none (a handover to a
    /// node already passed makes it act again).
    fn drain(&mut self) {
        loop {
            let mut progressed = false;
            for n in 0..self.nodes.len() {
                progressed |= self.relay(n);
                while let Some((NiIndex(ni), a)) = self.nodes[n].poll_action() {
                    progressed = true;
                    self.actions[n] += 1;
                    if self.dead.contains(&n) {
                        continue;
                    }
                    self.apply(n, ni, a);
                }
                while let Some(e) = self.nodes[n].poll_event() {
                    progressed = true;
                    if let Some(st) = self.selftests[n].as_mut() {
                        let mut reg = NodeRegistry(&mut self.mem[n]);
                        if st.handle_event(self.now, &mut self.nodes[n], &mut reg, &e) {
                            continue;
                        }
                    }
                    self.events[n].push((self.now, e));
                }
            }
            // As a daemon's loop does once the fabric has its actions.
            for node in &mut self.nodes {
                if node.has_bulk_to_scrub() {
                    progressed = true;
                    node.scrub_bulk(self.now, usize::MAX);
                }
            }
            if !progressed {
                return;
            }
        }
    }

    fn apply(&mut self, n: usize, ni: usize, a: FabricAction) {
        let now = self.now;
        lnd::fabric::Fabric::apply(&mut NiFabric { w: self, n, ni }, now, a);
    }

    /// Registers `bytes` as node `n`'s memory.
    fn register(&mut self, n: usize, bytes: Vec<u8>) -> lnd::fabric::Registration {
        let mem = {
            let m = lnd::fabric::SharedMem::new(bytes.len());
            m.with(|b| b.copy_from_slice(&bytes));
            m
        };
        self.register_shared(n, &mem)
    }

    /// Registers `bytes` as node `n`'s memory and describes all of it for its NI 0: a bulk
    /// buffer the test does not read back.
    fn bulk_buf(&mut self, n: usize, bytes: Vec<u8>) -> BulkBuf {
        let len = bytes.len() as u32;
        let reg = self.register(n, bytes);
        BulkBuf::new(NiIndex(0), &reg, 0, len).unwrap()
    }

    /// Registers `mem` with node `n` (several nodes may register the same memory).
    fn register_shared(
        &mut self,
        n: usize,
        mem: &lnd::fabric::SharedMem,
    ) -> lnd::fabric::Registration {
        let m = &mut self.mem[n];
        m.next += 1;
        let (id, key, addr) = (m.next, 0x5000 + m.next as u32, m.next << 32);
        m.regions.insert(id, (key, addr, mem.clone()));
        lnd::fabric::Registration::new(lnd::fabric::RegionId(id), key, addr, mem.len() as u64)
    }

    /// Node `n`'s region `reg` as it is now.
    fn region(&self, n: usize, reg: &lnd::fabric::Registration) -> Vec<u8> {
        self.mem[n].regions[&reg.id().0].2.to_vec()
    }

    /// Copies a write from node `from`'s memory into node `to`'s, all or nothing.
    fn write(
        &mut self,
        from: usize,
        to: usize,
        local: &[lnd::fabric::LocalFrag],
        remote: &[lnd::fabric::RemoteFrag],
    ) -> WcStatus {
        if lnd::fabric::check_rdma_write(local, remote).is_err() {
            return WcStatus::Error;
        }
        let mut pieces = Vec::new();
        for p in lnd::fabric::rdma_pieces(local, remote) {
            let Some(src) = self.mem[from].read_id(p.region.0, p.offset, p.len) else {
                return WcStatus::Error;
            };
            pieces.push((p.key, p.addr, src));
        }
        if !pieces
            .iter()
            .all(|(key, addr, b)| self.mem[to].fits_key(*key, *addr, b.len()))
        {
            return WcStatus::Error;
        }
        for (key, addr, mut bytes) in pieces {
            if self.corrupt_writes.contains(&to) {
                if let Some(b) = bytes.last_mut() {
                    *b ^= 0x5a;
                }
            }
            self.mem[to].write_key(key, addr, &bytes);
        }
        WcStatus::Success
    }

    /// Starts a selftest on node `n` (its first NI).
    fn start_selftest(&mut self, n: usize) {
        let own = self.nodes[n].nids()[0];
        self.selftests[n] = Some(crate::selftest::Selftest::new(
            NiIndex(0),
            own,
            1000 + n as u64,
            crate::selftest::DEFAULT_BUFFER_LIMIT,
        ));
    }

    /// Runs a console command on node `n`'s selftest to its answer, moving virtual time on
    /// (at most `limit`).
    fn lst(
        &mut self,
        n: usize,
        cmd: crate::selftest::LstCommand,
        limit: Duration,
    ) -> Result<crate::selftest::LstReply, crate::selftest::LstError> {
        let now = self.now;
        let st = self.selftests[n].as_mut().expect("a selftest on that node");
        let mut reg = NodeRegistry(&mut self.mem[n]);
        let id = match st.console(now, &mut self.nodes[n], &mut reg, cmd) {
            crate::selftest::ConsoleStart::Done(r) => return r,
            crate::selftest::ConsoleStart::Pending(id) => id,
        };
        let end = self.now + limit;
        loop {
            let step = self.now + Duration::from_millis(10);
            self.run_until(step.min(end));
            let st = self.selftests[n].as_mut().expect("selftest");
            if let Some((got, r)) = st.poll_console() {
                assert_eq!(got, id, "answers come in order here");
                return r;
            }
            assert!(
                self.now < end,
                "console command {id} got no answer in {limit:?}"
            );
        }
    }

    fn selftest(&self, n: usize) -> &crate::selftest::Selftest {
        self.selftests[n].as_ref().expect("selftest")
    }

    /// Delivers everything, running timers as virtual time passes, up to `until`.
    fn run_until(&mut self, until: Instant) {
        for _ in 0..1_000_000 {
            self.drain();
            if let Some((n, ni, ev)) = self.queue.pop_front() {
                if !self.dead.contains(&n) {
                    self.nodes[n].handle_fabric(self.now, NiIndex(ni), ev.as_event());
                }
                continue;
            }
            let next = self
                .nodes
                .iter()
                .filter_map(|n| n.poll_timeout())
                .chain(self.selftests.iter().flatten().flat_map(|s| {
                    [s.poll_timeout(), s.console_timeout()]
                        .into_iter()
                        .flatten()
                }))
                .min();
            match next {
                Some(t) if t <= until => {
                    self.now = self.now.max(t);
                    for node in &mut self.nodes {
                        node.handle_timeout(self.now);
                    }
                    for (n, st) in self.selftests.iter_mut().enumerate() {
                        if let Some(st) = st.as_mut() {
                            let mut reg = NodeRegistry(&mut self.mem[n]);
                            st.handle_timeout(self.now, &mut self.nodes[n], &mut reg);
                            st.console_tick(self.now, &mut self.nodes[n], &mut reg);
                        }
                    }
                }
                _ => {
                    self.now = self.now.max(until);
                    return;
                }
            }
        }
        panic!("did not settle");
    }

    /// Brings killed node `n` back as a new instance of `cfg` (NI incarnations from `inc`):
    /// the fabric forgets its old connections, so its peers' sends on them fail.
    fn restart(&mut self, n: usize, mut cfg: NodeConfig, inc: u64) {
        for (i, ni) in cfg.nis.iter_mut().enumerate() {
            ni.incarnation = inc + i as u64;
        }
        self.links.retain(|a, b| a.0 != n && b.0 != n);
        self.queue.retain(|(to, _, _)| *to != n);
        self.nodes[n] = LnetNode::new(cfg, self.now);
        self.dead.retain(|&d| d != n);
    }

    fn is_dead_nid(&self, peer: Nid) -> bool {
        self.dead
            .iter()
            .any(|&n| self.nodes[n].nids().contains(&peer))
    }

    fn run_for(&mut self, d: Duration) {
        self.run_until(self.now + d);
    }

    fn take_events(&mut self, n: usize) -> Vec<(Instant, LnetEvent)> {
        std::mem::take(&mut self.events[n])
    }
}

/// Node `n`'s NI `ni` on the test fabric: what its LND's actions do.
struct NiFabric<'f> {
    w: &'f mut Fabric,
    n: usize,
    ni: usize,
}

impl lnd::fabric::Fabric for NiFabric<'_> {
    fn connect(&mut self, _: Instant, conn: ConnId, peer: Nid, private: PrivateData, _: u16) {
        let (n, ni) = (self.n, self.ni);
        match self.w.locate(peer) {
            Some((tn, tni)) => {
                self.w.next_req += 1;
                self.w.pending.insert(self.w.next_req, (n, ni, conn));
                let req = RequestId(self.w.next_req);
                self.w
                    .queue
                    .push_back((tn, tni, Ev::ConnectRequest { req, private }));
            }
            None if self.w.blackhole || self.w.is_dead_nid(peer) => {}
            None => {
                let why = ConnectFailure::Unreachable;
                self.w
                    .queue
                    .push_back((n, ni, Ev::ConnectFailed { conn, why }));
            }
        }
    }

    fn accept(&mut self, _: Instant, req: RequestId, conn: ConnId, private: PrivateData, _: u16) {
        let (n, ni) = (self.n, self.ni);
        let from = self.w.pending.remove(&req.0).unwrap();
        self.w.links.insert(from, (n, ni, conn));
        self.w.links.insert((n, ni, conn), from);
        self.w.queue.push_back((
            from.0,
            from.1,
            Ev::Established {
                conn: from.2,
                private,
            },
        ));
        let private = lnd::fabric::PrivateData::EMPTY;
        self.w
            .queue
            .push_back((n, ni, Ev::Established { conn, private }));
    }

    fn reject(&mut self, _: Instant, req: RequestId, private: PrivateData) {
        let (fnode, fni, conn) = self.w.pending.remove(&req.0).unwrap();
        let why = ConnectFailure::Rejected(private);
        self.w
            .queue
            .push_back((fnode, fni, Ev::ConnectFailed { conn, why }));
    }

    fn post_recv(&mut self, _: Instant, _: ConnId, _: u16) {}

    fn send(&mut self, _: Instant, conn: ConnId, wr: WrId, bytes: Vec<u8>) {
        let (n, ni) = (self.n, self.ni);
        let done = matches!(
            lnd::wire::kib::KibMsg::parse(&bytes).map(|(m, _)| m.body),
            Ok(lnd::wire::kib::KibBody::PutDone(_))
        );
        if done && self.w.stalled_writes.contains(&n) {
            // The stalled writer's PUT_DONE goes nowhere; its LND thinks it sent it.
            let status = WcStatus::Success;
            self.w
                .queue
                .push_back((n, ni, Ev::SendComplete { conn, wr, status }));
            return;
        }
        let status = match self.w.links.get(&(n, ni, conn)) {
            // A dead peer's HCA answers nothing: the send hangs until the transport
            // gives up, which this fabric leaves to the LND's timeouts.
            Some(&(tn, _, _)) if self.w.dead.contains(&tn) => return,
            Some(&(tn, tni, tconn)) => {
                let next = self.w.next_slot.entry((tn, tni, tconn)).or_insert(0);
                let slot = *next;
                *next = next.wrapping_add(1);
                self.w.queue.push_back((
                    tn,
                    tni,
                    Ev::Recv {
                        conn: tconn,
                        slot,
                        bytes,
                    },
                ));
                WcStatus::Success
            }
            None => WcStatus::Flushed,
        };
        self.w
            .queue
            .push_back((n, ni, Ev::SendComplete { conn, wr, status }));
    }

    fn rdma_write(
        &mut self,
        now: Instant,
        conn: ConnId,
        wr: WrId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    ) {
        let (n, ni) = (self.n, self.ni);
        if self.w.stalled_writes.contains(&n) {
            // Nothing lands, yet the writer's LND is told it did.
            let status = WcStatus::Success;
            self.w
                .queue
                .push_back((n, ni, Ev::SendComplete { conn, wr, status }));
            return;
        }
        let (local, remote) = if self.w.short_writes.contains(&n) {
            let half = local.iter().map(|f| u64::from(f.len)).sum::<u64>() / 2;
            (
                cut_frags(&local, half, |f| &mut f.len),
                cut_frags(&remote, half, |f| &mut f.len),
            )
        } else {
            (local, remote)
        };
        // The data lands now, ahead of anything posted after it (RC order); a fragment
        // outside a region fails the write before a byte lands, and the QP with it.
        let status = match self.w.links.get(&(n, ni, conn)) {
            Some(&(tn, _, _)) if self.w.dead.contains(&tn) => return,
            Some(&(tn, _, _)) => self.w.write(n, tn, &local, &remote),
            None => WcStatus::Flushed,
        };
        if status == WcStatus::Error {
            lnd::fabric::Fabric::disconnect(self, now, conn);
        }
        self.w
            .queue
            .push_back((n, ni, Ev::SendComplete { conn, wr, status }));
    }

    fn grant_writes(&mut self, _: Instant, _: ConnId, _: WrId, _: Vec<RemoteFrag>) {}

    fn revoke_writes(&mut self, _: Instant, _: ConnId, _: WrId) {}

    fn disconnect(&mut self, _: Instant, conn: ConnId) {
        let (n, ni) = (self.n, self.ni);
        if let Some(&(tn, tni, tconn)) = self.w.links.get(&(n, ni, conn)) {
            self.w
                .queue
                .push_back((tn, tni, Ev::Disconnected { conn: tconn }));
        }
        self.w.queue.push_back((n, ni, Ev::Disconnected { conn }));
    }

    fn destroy(&mut self, _: Instant, conn: ConnId) {
        let (n, ni) = (self.n, self.ni);
        self.w.links.remove(&(n, ni, conn));
    }
}

/// Two nodes, 10.0.0.1 and 10.0.0.2@o2ib, connected by a ping from the first (its events
/// taken); the second's NID.
fn pinged_pair() -> (Fabric, Nid) {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"], &["10.0.0.2@o2ib"]]);
    let b = nid("10.0.0.2@o2ib");
    let now = f.now;
    f.nodes[0].ping(now, b, Duration::from_secs(5)).unwrap();
    f.run_for(Duration::from_secs(2));
    f.take_events(0);
    (f, b)
}

/// Node 0 (the client) pings `server` and node 1 (the server) pings `client`, at once.
fn ping_both_ways(f: &mut Fabric, client: Nid, server: Nid) {
    let now = f.now;
    f.nodes[0]
        .ping(now, server, Duration::from_secs(5))
        .unwrap();
    f.nodes[1]
        .ping(now, client, Duration::from_secs(5))
        .unwrap();
}

/// What `pick` takes from each of the events `evs`, in order.
fn picked<T>(evs: &[(Instant, LnetEvent)], pick: impl FnMut(&LnetEvent) -> Option<T>) -> Vec<T> {
    evs.iter().map(|(_, e)| e).filter_map(pick).collect()
}

fn ping_results(evs: &[(Instant, LnetEvent)]) -> Vec<(Instant, Nid, Result<PingReply, LnetError>)> {
    evs.iter()
        .filter_map(|(t, e)| match e {
            LnetEvent::PingDone { target, result, .. } => Some((*t, *target, result.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn two_nodes_ping_each_other() {
    let mut f = Fabric::new(&[
        &["10.0.0.1@o2ib", "10.0.1.1@o2ib1"],
        &["10.0.0.2@o2ib", "10.0.1.2@o2ib1"],
    ]);
    let now = f.now;
    let b0 = nid("10.0.0.2@o2ib");
    let a1 = nid("10.0.1.1@o2ib1");
    f.nodes[0].ping(now, b0, Duration::from_secs(5)).unwrap();
    f.nodes[1].ping(now, a1, Duration::from_secs(5)).unwrap();
    f.run_for(Duration::from_secs(1));

    let a = ping_results(&f.take_events(0));
    assert_eq!(a.len(), 1);
    let reply = a[0].2.clone().unwrap();
    assert_eq!(reply.nids, f.nodes[1].nids());
    assert!(!reply.nids.contains(&Nid::LO_0));
    assert_eq!(reply.primary_nid, b0);
    assert_eq!(reply.pid, LNET_PID_LUSTRE);
    assert_eq!(reply.features, OUR_FEATURES);
    assert!(!reply.multi_rail);

    let b = ping_results(&f.take_events(1));
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].2.clone().unwrap().nids, f.nodes[0].nids());

    // The GET and the REPLY went through the LND; credits are all back.
    for node in &f.nodes {
        assert_eq!(node.pending_pings(), 0);
        assert_eq!(node.messages_in_flight(), 0);
        assert_eq!(node.stats().msgs_alloc, 0);
        assert_eq!(node.stats().loopback_count, 0);
        assert_eq!(node.stats().send_count, 2, "GET + REPLY");
        assert_eq!(node.stats().recv_count, 2);
        for p in node.peers() {
            assert_eq!(p.available_tx_credits, p.max_ni_tx_credits);
            assert_eq!(p.min_tx_credits, p.max_ni_tx_credits - 1);
            assert_eq!(p.state, PeerState::Up);
        }
        for n in node.nets() {
            assert_eq!(n.available_tx_credits, i64::from(n.credits));
        }
    }
    let p = f.nodes[0].peer(b0).unwrap();
    assert_eq!((p.send_count, p.recv_count), (1, 1));
    assert_eq!(f.nodes[0].endpoint(NiIndex(0)).unwrap().stats().connects, 1);
}

#[test]
fn self_ping_never_touches_the_lnd() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib", "10.0.1.1@o2ib1"]]);
    let node = &mut f.nodes[0];
    let own = node.nids();
    let mut targets = own.clone();
    targets.push(Nid::LO_0);
    let mut now = f.now;
    for i in 0..10_000u64 {
        for &t in &targets {
            let id = node.ping(now, t, Duration::from_secs(1)).unwrap();
            // Answered within the call.
            match node.poll_event() {
                Some(LnetEvent::PingDone {
                    id: got,
                    target,
                    result: Ok(reply),
                }) => {
                    assert_eq!((got, target), (id, t));
                    assert_eq!(reply.nids, own);
                    assert_eq!(reply.primary_nid, own[0]);
                }
                other => panic!("{other:?}"),
            }
            assert!(node.poll_event().is_none());
            let m = node.send_put(now, t, 4, i, vec![7; 16]).unwrap();
            let evs: Vec<_> = std::iter::from_fn(|| node.poll_event()).collect();
            assert!(
                matches!(&evs[0], LnetEvent::Put { from, to, match_bits, .. }
                             if *from == t && *to == t && *match_bits == i)
            );
            assert_eq!(
                evs[1],
                LnetEvent::PutDone {
                    id: m,
                    result: Ok(())
                }
            );
            assert!(node.poll_action().is_none());
        }
        now += Duration::from_micros(1);
    }
    for ni in 0..2 {
        let s = node.endpoint(NiIndex(ni)).unwrap().stats();
        assert_eq!(s.msgs_sent, 0);
        assert_eq!(s.connects, 0);
        assert_eq!(s.accepts, 0);
    }
    let s = node.stats();
    assert_eq!(s.loopback_count, 30_000 * 3, "GET, REPLY and PUT per round");
    assert_eq!(s.send_count, s.loopback_count);
    assert_eq!(s.recv_count, s.loopback_count);
    assert_eq!(s.errors, 0);
    assert_eq!(s.msgs_alloc, 0);
    assert!(node.peers().is_empty());
    assert_eq!(node.poll_timeout(), None);
    assert_eq!(f.actions[0], 0);
}

#[test]
fn puts_queue_on_peer_credits_and_recover() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"], &["10.0.0.2@o2ib"]]);
    let (now, b) = (f.now, nid("10.0.0.2@o2ib"));
    let ids: Vec<MsgId> = (0..50u64)
        .map(|i| {
            f.nodes[0]
                .send_put(now, b, 9, i, vec![i as u8; 100])
                .unwrap()
        })
        .collect();
    let p = f.nodes[0].peer(b).unwrap();
    assert_eq!(p.max_ni_tx_credits, 8);
    assert_eq!(p.available_tx_credits, 8 - 50);
    assert_eq!(p.min_tx_credits, -42);
    assert_eq!(p.tx_q_num_of_buf, 42 * (100 + 72));
    assert_eq!(p.send_count, 8, "only the credited ones reached the LND");
    let ni = &f.nodes[0].nets()[0];
    assert_eq!((ni.available_tx_credits, ni.min_tx_credits), (248, 248));
    assert_eq!(f.nodes[0].stats().msgs_alloc, 50);

    f.run_for(Duration::from_secs(1));

    let puts: Vec<u64> = f
        .take_events(1)
        .into_iter()
        .filter_map(|(_, e)| match e {
            LnetEvent::Put {
                match_bits,
                payload,
                portal: 9,
                ..
            } => {
                assert_eq!(payload, vec![match_bits as u8; 100]);
                Some(match_bits)
            }
            _ => None,
        })
        .collect();
    assert_eq!(puts, (0..50).collect::<Vec<_>>(), "all delivered, in order");
    let done: Vec<MsgId> = f
        .take_events(0)
        .into_iter()
        .filter_map(|(_, e)| match e {
            LnetEvent::PutDone { id, result } => {
                assert_eq!(result, Ok(()));
                Some(id)
            }
            _ => None,
        })
        .collect();
    assert_eq!(done, ids);

    // At rest: every credit back, the low-water mark kept.
    let p = f.nodes[0].peer(b).unwrap();
    assert_eq!(p.available_tx_credits, 8);
    assert_eq!(p.min_tx_credits, -42);
    assert_eq!(p.tx_q_num_of_buf, 0);
    assert_eq!(p.send_count, 50);
    let ni = &f.nodes[0].nets()[0];
    assert_eq!(ni.available_tx_credits, 256);
    assert_eq!(ni.send_count, 50);
    let s = f.nodes[0].stats();
    assert_eq!((s.msgs_alloc, s.msgs_max), (0, 50));
    assert_eq!((s.send_count, s.send_length), (50, 5000));
    let r = f.nodes[1].stats();
    assert_eq!((r.recv_count, r.recv_length), (50, 5000));
    assert_eq!(
        f.nodes[1].peer(nid("10.0.0.1@o2ib")).unwrap().recv_count,
        50
    );
}

#[test]
fn ni_credits_queue_across_peers_and_recover() {
    let mut f = Fabric::with(
        &[&["10.0.0.1@o2ib"], &["10.0.0.2@o2ib"], &["10.0.0.3@o2ib"]],
        |c| c.credits = 10,
    );
    let now = f.now;
    let (b, c) = (nid("10.0.0.2@o2ib"), nid("10.0.0.3@o2ib"));
    for i in 0..20u64 {
        f.nodes[0].send_put(now, b, 5, i, vec![1; 10]).unwrap();
    }
    for i in 0..20u64 {
        f.nodes[0].send_put(now, c, 5, i, vec![2; 10]).unwrap();
    }
    // b: 8 credited, 12 waiting on the peer. c: 8 credited, of which 2 got NI credits and 6
    // wait on the NI; 12 wait on the peer.
    let ni = &f.nodes[0].nets()[0];
    assert_eq!(ni.available_tx_credits, 10 - 16);
    let pc = f.nodes[0].peer(c).unwrap();
    assert_eq!((pc.available_tx_credits, pc.send_count), (-12, 2));

    f.run_for(Duration::from_secs(1));
    let ni = &f.nodes[0].nets()[0];
    assert_eq!((ni.available_tx_credits, ni.min_tx_credits), (10, -6));
    for p in f.nodes[0].peers() {
        assert_eq!((p.available_tx_credits, p.min_tx_credits), (8, -12));
        assert_eq!((p.send_count, p.tx_q_num_of_buf), (20, 0));
    }
    let ok = f.events[0]
        .iter()
        .filter(|(_, e)| matches!(e, LnetEvent::PutDone { result: Ok(()), .. }))
        .count();
    assert_eq!(ok, 40);
    assert_eq!(f.nodes[1].stats().recv_count, 20);
    assert_eq!(f.nodes[2].stats().recv_count, 20);
}

#[test]
fn ping_to_a_silent_peer_times_out_within_its_timeout() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"]]);
    f.blackhole = true;
    let start = f.now;
    let dead = nid("10.0.0.9@o2ib");
    let timeout = Duration::from_secs(2);
    let id = f.nodes[0].ping(start, dead, timeout).unwrap();
    f.run_for(Duration::from_secs(3));
    let r = ping_results(&f.take_events(0));
    assert_eq!(r.len(), 1);
    let (at, target, result) = r[0].clone();
    assert_eq!((target, result), (dead, Err(LnetError::Timeout)));
    assert!(at <= start + timeout, "{at:?}");
    assert_eq!(f.nodes[0].stats().response_timeout_count, 1);
    let _ = id;

    // The GET itself ends at the LND's tx timeout (50 s; the connect attempts in between each
    // end at their deadline and are retried): nothing is left hanging.
    f.run_for(Duration::from_secs(60));
    let node = &f.nodes[0];
    assert_eq!(node.pending_pings(), 0);
    assert_eq!(node.messages_in_flight(), 0);
    assert_eq!(node.stats().msgs_alloc, 0);
    let s = node.stats();
    // o2iblnd reports a message that waited for a connection that never came as a network
    // timeout (kiblnd_peer_connect_failed).
    assert_eq!(s.network_timeout_count, 1, "the GET timed out in the LND");
    assert_eq!(s.errors, 2, "the ping and its GET");
    let p = node.peer(dead).unwrap();
    assert_eq!(p.available_tx_credits, 8);
    assert_eq!(p.drop_count, 1);
    assert_eq!(node.nets()[0].available_tx_credits, 256);
    // No late PingDone.
    assert!(ping_results(&f.take_events(0)).is_empty());
}

#[test]
fn ping_to_an_unreachable_peer_fails_with_the_connect_error() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"]]);
    let start = f.now;
    let dead = nid("10.0.0.9@o2ib");
    f.nodes[0]
        .ping(start, dead, Duration::from_secs(5))
        .unwrap();
    f.run_for(Duration::from_secs(10));
    let r = ping_results(&f.take_events(0));
    assert_eq!(r.len(), 1);
    assert_eq!(
        r[0].2,
        Err(LnetError::Lnd(lnd::engine::TxError::ConnectFailed))
    );
    assert!(r[0].0 < start + Duration::from_secs(5));
    assert_eq!(f.nodes[0].stats().response_timeout_count, 0);
    // A peer that could never be reached is reported down, as kiblnd_peer_connect_failed does.
    assert_eq!(f.nodes[0].peer(dead).unwrap().state, PeerState::Down);
}

#[test]
fn no_route_to_a_net_without_an_ni() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"]]);
    let now = f.now;
    let far = nid("10.0.0.2@tcp");
    let node = &mut f.nodes[0];
    assert_eq!(
        node.send_put(now, far, 4, 0, vec![1]),
        Err(LnetError::NoRoute(far))
    );
    assert_eq!(
        node.ping(now, far, Duration::from_secs(1)),
        Err(LnetError::NoRoute(far))
    );
    assert_eq!(
        node.ping(now, nid("10.0.0.2@o2ib1"), Duration::from_secs(1))
            .unwrap_err(),
        LnetError::NoRoute(nid("10.0.0.2@o2ib1"))
    );
    let s = node.stats();
    assert_eq!((s.local_no_route_count, s.errors), (3, 3));
    assert!(node.poll_event().is_none());
    assert!(node.poll_action().is_none());
    assert_eq!(node.pending_pings(), 0);
}

#[test]
fn payload_limits() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"]]);
    let now = f.now;
    let node = &mut f.nodes[0];
    let big = vec![0u8; 4000];
    assert_eq!(
        node.send_put(now, nid("10.0.0.2@o2ib"), 4, 0, big.clone()),
        Err(LnetError::PayloadTooLarge {
            len: 4000,
            max: 3976
        })
    );
    // In memory, up to LNET_MTU.
    node.send_put(now, Nid::LO_0, 4, 0, big).unwrap();
    assert!(
        matches!(node.poll_event(), Some(LnetEvent::Put { payload, .. }) if payload.len() == 4000)
    );
}

#[test]
fn messages_not_for_us_are_dropped_and_counted() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"], &["10.0.0.2@o2ib"]]);
    let now = f.now;
    let (a, b) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let hdr = |dest: Nid, portal: u32| LnetHdr {
        dest_nid: dest,
        src_nid: a,
        dest_pid: LNET_PID_LUSTRE,
        src_pid: LNET_PID_LUSTRE,
        payload_length: 3,
        body: LnetBody::Put {
            ack_wmd: WireHandle::NONE,
            match_bits: 1,
            hdr_data: 0,
            ptl_index: portal,
            offset: 0,
        },
    };
    // A misbehaving sender, below LNet: a PUT for a node on another net (b does not route),
    // one on the reserved portal, and a good one.
    let n0 = &mut f.nodes[0];
    n0.send_raw(
        now,
        NiIndex(0),
        b,
        hdr(nid("10.9.0.77@o2ib9"), 4),
        vec![1; 3],
    );
    n0.send_raw(now, NiIndex(0), b, hdr(b, 0), vec![1; 3]);
    n0.send_raw(now, NiIndex(0), b, hdr(b, 4), vec![1; 3]);
    f.run_for(Duration::from_secs(1));
    let s = f.nodes[1].stats();
    assert_eq!((s.drop_count, s.drop_length), (2, 6));
    assert_eq!((s.recv_count, s.route_count), (1, 0));
    let r = f.nodes[1].routing_info();
    assert_eq!(r.stats.received, 1);
    assert_eq!(r.stats.dropped_for(FwdDrop::RoutingDisabled), 1);
    assert!(r.stats.reconciles());
    let p = f.nodes[1].peer(a).unwrap();
    assert_eq!((p.recv_count, p.drop_count), (3, 2));
    assert_eq!(f.nodes[1].nets()[0].drop_count, 2);
    // Every receive was handed back: the connection's credits are whole again, and a drop
    // for routing being off does not close the connection.
    let ep = f.nodes[1].endpoint(NiIndex(0)).unwrap();
    assert_eq!(ep.stats().rx_refused, 0);
    assert_eq!(ep.conns().count(), 1);
    for c in ep.conns() {
        assert_eq!(c.sends_posted, 0);
    }
    let puts = f.events[1]
        .iter()
        .filter(|(_, e)| matches!(e, LnetEvent::Put { .. }))
        .count();
    assert_eq!(puts, 1);
}

#[test]
fn put_with_ack_request_is_acked() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"], &["10.0.0.2@o2ib"]]);
    let now = f.now;
    let (a, b) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let hdr = LnetHdr {
        dest_nid: b,
        src_nid: a,
        dest_pid: LNET_PID_LUSTRE,
        src_pid: LNET_PID_LUSTRE,
        payload_length: 5,
        body: LnetBody::Put {
            ack_wmd: WireHandle {
                interface_cookie: 1,
                object_cookie: 2,
            },
            match_bits: 3,
            hdr_data: 0,
            ptl_index: 4,
            offset: 0,
        },
    };
    f.nodes[0].send_raw(now, NiIndex(0), b, hdr, vec![0; 5]);
    f.run_for(Duration::from_secs(1));
    // b sent the ACK; a (which never asks for ACKs) dropped it as unmatched.
    assert_eq!(f.nodes[1].stats().send_count, 1);
    assert_eq!(f.nodes[0].stats().drop_count, 1);
}

/// A kernel node that takes us for Multi-Rail (`lnetctl peer add` without --non_mr) pushes its
/// ping buffer to us, a PUT on portal 0 with the ping match bits, and asks for an ACK; its
/// router checker does so to its gateways every interval. Dropping it failed the sender's
/// discovery, and the kernel marked the gateway dead with every route through it.
#[test]
fn a_discovery_push_is_acked_not_dropped() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"], &["10.0.0.2@o2ib"]]);
    let now = f.now;
    let (a, b) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let push = |match_bits| LnetHdr {
        dest_nid: b,
        src_nid: a,
        dest_pid: LNET_PID_LUSTRE,
        src_pid: LNET_PID_LUSTRE,
        payload_length: 48,
        body: LnetBody::Put {
            ack_wmd: WireHandle {
                interface_cookie: 1,
                object_cookie: 2,
            },
            match_bits,
            hdr_data: 0,
            ptl_index: LNET_RESERVED_PORTAL,
            offset: 0,
        },
    };
    f.nodes[0].send_raw(now, NiIndex(0), b, push(LNET_PING_MATCHBITS), vec![0; 48]);
    f.run_for(Duration::from_secs(1));
    let s = f.nodes[1].stats();
    assert_eq!((s.recv_count, s.drop_count), (1, 0), "{s:?}");
    // b sent the ACK (a, which never asks for one, drops it as unmatched) ...
    assert_eq!(s.send_count, 1);
    assert_eq!(f.nodes[0].stats().drop_count, 1);
    // ... and nothing went up to b's user: a push is LNet's own.
    assert!(!f.events[1]
        .iter()
        .any(|(_, e)| matches!(e, LnetEvent::Put { .. })));
    // Other match bits on the reserved portal are still dropped, unacknowledged.
    f.nodes[0].send_raw(now, NiIndex(0), b, push(7), vec![0; 48]);
    f.run_for(Duration::from_secs(1));
    let s = f.nodes[1].stats();
    assert_eq!(
        (s.recv_count, s.drop_count, s.send_count),
        (1, 1, 1),
        "{s:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Whatever the credits and the mix of destinations, every PUT ends exactly once, in order
    /// per destination, and every credit comes back.
    #[test]
    fn credits_are_conserved(
        credits in 1u32..24,
        peer_credits in 1u32..12,
        sends in proptest::collection::vec((0usize..4, 0usize..300), 1..120),
        steps in proptest::collection::vec(0usize..8, 1..120),
    ) {
        let mut f = Fabric::with(
            &[&["10.0.0.1@o2ib", "10.0.1.1@o2ib1"], &["10.0.0.2@o2ib"], &["10.0.1.3@o2ib1"]],
            |c| { c.credits = credits; c.peer_credits = peer_credits; },
        );
        let dests = [nid("10.0.0.2@o2ib"), nid("10.0.1.3@o2ib1"), Nid::LO_0, nid("10.0.1.1@o2ib1")];
        let mut expected: HashMap<Nid, Vec<u64>> = HashMap::new();
        let mut ids = Vec::new();
        for (i, &(d, len)) in sends.iter().enumerate() {
            let now = f.now;
            let id = f.nodes[0].send_put(now, dests[d], 6, i as u64, vec![0; len]).unwrap();
            ids.push(id);
            expected.entry(dests[d]).or_default().push(i as u64);
            // Interleave some fabric work with the sends.
            for _ in 0..steps[i % steps.len()] {
                f.drain();
                if let Some((n, ni, ev)) = f.queue.pop_front() {
                    f.nodes[n].handle_fabric(now, NiIndex(ni), ev.as_event());
                }
            }
        }
        f.run_for(Duration::from_secs(1));
        let mut done: Vec<MsgId> = Vec::new();
        let mut got: HashMap<Nid, Vec<u64>> = HashMap::new();
        for n in 0..3 {
            for (_, e) in f.take_events(n) {
                match e {
                    LnetEvent::Put { to, match_bits, .. } => {
                        got.entry(to).or_default().push(match_bits);
                    }
                    LnetEvent::PutDone { id, result } => {
                        prop_assert_eq!(result, Ok(()));
                        done.push(id);
                    }
                    _ => {}
                }
            }
        }
        done.sort();
        prop_assert_eq!(done, ids);
        prop_assert_eq!(got, expected);
        let node = &f.nodes[0];
        prop_assert_eq!(node.stats().msgs_alloc, 0);
        for p in node.peers() {
            prop_assert_eq!(p.available_tx_credits, p.max_ni_tx_credits);
            prop_assert_eq!(p.tx_q_num_of_buf, 0);
            prop_assert!(p.min_tx_credits <= p.max_ni_tx_credits);
        }
        for n in node.nets() {
            prop_assert_eq!(n.available_tx_credits, i64::from(n.credits));
            prop_assert!(n.peer_credits <= n.credits);
        }
    }
}

/// LNet forgets a peer NI that had no traffic for peer_timeout and holds nothing (our rule),
/// whether or not its connection is still up; a peer NI in use is kept; a forgotten one comes
/// back, with its state from the LND, on its next message.
#[test]
fn idle_peers_age_out_after_peer_timeout() {
    let mut f = Fabric::with(&[&["10.0.0.1@o2ib"], &["10.0.0.2@o2ib"]], |c| {
        c.peer_timeout = Duration::from_secs(10);
    });
    let (a, b) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let now = f.now;
    f.nodes[0].ping(now, b, Duration::from_secs(5)).unwrap();
    f.run_for(Duration::from_secs(1));
    assert_eq!(f.nodes[0].peer_count(), 1);
    assert_eq!(f.nodes[1].peer_count(), 1);
    // Traffic every 4 s keeps the peer; then silence ages it out.
    for _ in 0..5 {
        f.run_for(Duration::from_secs(4));
        let now = f.now;
        f.nodes[0].ping(now, b, Duration::from_secs(2)).unwrap();
    }
    f.run_for(Duration::from_secs(1));
    assert_eq!(f.nodes[0].peer_count(), 1, "a peer in use was aged out");
    assert_eq!(f.nodes[0].stats().peers_aged, 0);
    f.run_for(Duration::from_secs(12));
    assert_eq!(
        f.nodes[0].peer_count(),
        0,
        "an idle peer stayed past peer_timeout"
    );
    assert_eq!(f.nodes[1].peer_count(), 0);
    assert_eq!(f.nodes[0].stats().peers_aged, 1);
    // The LND connection may stay (its own rule); the next ping re-creates the peer as up.
    let now = f.now;
    f.nodes[0].ping(now, b, Duration::from_secs(2)).unwrap();
    f.run_for(Duration::from_secs(1));
    let p = f.nodes[0].peer(b).expect("back on its next message");
    assert_eq!(p.state, PeerState::Up);
    assert_eq!(f.nodes[1].peer(a).map(|p| p.state), Some(PeerState::Up));
}

/// The peer table is bounded per NI: a send to a new peer beyond the limit fails with a status
/// (never queued without bound), counted; peers already known keep working.
#[test]
fn peer_table_is_bounded() {
    let mut f = Fabric::with(&[&["10.0.0.1@o2ib"], &["10.0.0.2@o2ib"]], |c| {
        c.peer_limit = 2;
    });
    f.blackhole = true;
    let now = f.now;
    let b = nid("10.0.0.2@o2ib");
    f.nodes[0].ping(now, b, Duration::from_secs(5)).unwrap();
    f.nodes[0]
        .ping(now, nid("10.0.0.3@o2ib"), Duration::from_secs(1))
        .unwrap();
    let full = f.nodes[0].ping(now, nid("10.0.0.4@o2ib"), Duration::from_secs(1));
    f.run_for(Duration::from_millis(100));
    assert!(full.is_ok(), "the ping is accepted and fails with a status");
    let results = ping_results(&f.take_events(0));
    let refused = results
        .iter()
        .find(|(_, t, _)| *t == nid("10.0.0.4@o2ib"))
        .expect("the ping to the third peer ended at once");
    assert!(
        matches!(
            refused.2,
            Err(LnetError::Refused(lnd::engine::SendError::PeerTableFull(_)))
        ),
        "{refused:?}"
    );
    assert_eq!(f.nodes[0].stats().peer_table_full, 1);
    assert_eq!(f.nodes[0].peer_count(), 2);
    assert!(
        results.iter().any(|(_, t, r)| *t == b && r.is_ok()),
        "{results:?}"
    );
}

/// One runtime per NI: a runtime that runs only NI 0 of a two-NI node knows the other NI's NID
/// as its own. A ping of it is answered in memory (never through the LND), and its reply, like
/// any ping reply of ours, lists every NID of the node in order.
#[test]
fn a_runtime_knows_its_siblings_nids_as_its_own() {
    let (a0, a1) = (nid("10.0.0.1@o2ib"), nid("10.0.1.1@o2ib1"));
    let now = Instant::from_secs(1);
    let mut cfg = NodeConfig::new(vec![NiConfig::new(a0, 1)]);
    cfg.node_nids = vec![a0, a1];
    let mut node = LnetNode::new(cfg, now);
    assert_eq!(node.nids(), vec![a0], "it runs only NI 0");
    for t in [a0, a1, Nid::LO_0] {
        let id = node.ping(now, t, Duration::from_secs(1)).unwrap();
        match node.poll_event() {
            Some(LnetEvent::PingDone {
                id: got,
                result: Ok(reply),
                ..
            }) => {
                assert_eq!(got, id);
                assert_eq!(reply.nids, vec![a0, a1], "the reply lists the whole node");
            }
            other => panic!("{t}: {other:?}"),
        }
    }
    assert!(node.poll_action().is_none(), "nothing went to the LND");
    assert_eq!(node.endpoint(NiIndex(0)).unwrap().stats().connects, 0);
    // A net neither NI is on has no route.
    assert!(matches!(
        node.ping(now, nid("10.0.2.1@o2ib2"), Duration::from_secs(1)),
        Err(LnetError::NoRoute(_))
    ));
}

/// Issue 32, item 2: two runtimes of one node (one per NI, as the daemon runs them). A PUT from
/// one to the other's NID goes to that runtime (a `Handover::Local`) and reaches its user
/// there, from our NID, never this runtime's own user; a GET of memory the other posted with
/// `post_source_shared` is answered in memory by it with an inline REPLY; a PUT inline into
/// a posted sink lands there. Nothing goes through an LND.
#[test]
fn a_message_to_a_sibling_nis_nid_is_delivered_by_that_runtime() {
    let (a0, a1) = (nid("10.0.0.1@o2ib"), nid("10.0.1.1@o2ib1"));
    let cfg = |own: Nid, inc: u64| {
        let mut c = NodeConfig::new(vec![NiConfig::new(own, inc)]);
        c.node_nids = vec![a0, a1];
        c
    };
    let mut f = Fabric::from_configs(vec![cfg(a0, 101), cfg(a1, 102)]);
    let now = f.now;
    let id = f.nodes[0].send_put(now, a1, 9, 7, vec![1, 2, 3]).unwrap();
    f.run_for(Duration::from_millis(10));
    let got: Vec<_> = f.take_events(1).into_iter().map(|(_, e)| e).collect();
    assert!(
        got.iter().any(
            |e| matches!(e, LnetEvent::Put { from, to, portal: 9, match_bits: 7, payload, .. }
            if *from == a0 && *to == a1 && payload == &[1, 2, 3])
        ),
        "{got:?}"
    );
    let mine: Vec<_> = f.take_events(0).into_iter().map(|(_, e)| e).collect();
    assert!(
        mine.iter()
            .any(|e| matches!(e, LnetEvent::PutDone { id: i, result: Ok(()) } if *i == id)),
        "{mine:?}"
    );
    assert!(
        !mine.iter().any(|e| matches!(e, LnetEvent::Put { .. })),
        "not to our own user: {mine:?}"
    );

    // A GET of a source the other runtime posted with its memory.
    let src = lnd::fabric::SharedMem::new(64);
    src.with(|b| b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8));
    let reg1 = f.register_shared(1, &src);
    let md = f.nodes[1].post_source_shared(
        52,
        5,
        BulkBuf::new(NiIndex(0), &reg1, 8, 16).unwrap(),
        src.clone(),
    );
    let sink = f.bulk_buf(0, vec![0; 32]);
    let get = f.nodes[0].send_get_bulk(now, a1, 52, 5, sink).unwrap();
    f.run_for(Duration::from_millis(10));
    let mine: Vec<_> = f.take_events(0).into_iter().map(|(_, e)| e).collect();
    let want: Vec<u8> = (8..24).collect();
    assert!(
        mine.iter()
            .any(|e| matches!(e, LnetEvent::GetDoneInline { id, payload }
            if *id == get && *payload == want)),
        "{mine:?}"
    );
    let theirs: Vec<_> = f.take_events(1).into_iter().map(|(_, e)| e).collect();
    assert!(
        theirs.iter().any(
            |e| matches!(e, LnetEvent::BulkGetServed { md: m, to, result: Ok(16) }
            if *m == md && *to == a0)
        ),
        "{theirs:?}"
    );

    // A PUT inline into a sink the other runtime posted.
    let md = f.nodes[1].post_sink(52, 6, BulkBuf::new(NiIndex(0), &reg1, 0, 4).unwrap());
    f.nodes[0].send_put(now, a1, 52, 6, vec![9; 10]).unwrap();
    f.run_for(Duration::from_millis(10));
    let theirs: Vec<_> = f.take_events(1).into_iter().map(|(_, e)| e).collect();
    assert!(
        theirs.iter().any(
            |e| matches!(e, LnetEvent::BulkPutInline { md: m, from, payload, .. }
            if *m == md && *from == a0 && payload == &[9; 4])
        ),
        "{theirs:?}"
    );
    for n in 0..2 {
        assert_eq!(f.nodes[n].endpoint(NiIndex(0)).unwrap().stats().connects, 0);
        assert_eq!(f.nodes[n].messages_in_flight(), 0);
    }
}

/// `lnetctl net add|del` at run time: the daemon tells every runtime the node's NIDs now. An
/// added sibling's NID is ours at once (answered in memory, listed in our ping reply); a
/// removed one is not, and its net has no route any more; our own NI stays ours whatever the
/// list says.
#[test]
fn a_runtime_follows_the_node_nids_as_nis_come_and_go() {
    let (a0, a1, a2) = (
        nid("10.0.0.1@o2ib"),
        nid("10.0.1.1@o2ib1"),
        nid("10.0.2.1@o2ib2"),
    );
    let now = Instant::from_secs(1);
    let mut cfg = NodeConfig::new(vec![NiConfig::new(a0, 1)]);
    cfg.node_nids = vec![a0, a1];
    let mut node = LnetNode::new(cfg, now);
    let ping_nids = |node: &mut LnetNode, t: Nid| -> Result<Vec<Nid>, LnetError> {
        node.ping(now, t, Duration::from_secs(1))?;
        match node.poll_event() {
            Some(LnetEvent::PingDone {
                result: Ok(reply), ..
            }) => Ok(reply.nids),
            other => panic!("{t}: {other:?}"),
        }
    };
    assert_eq!(ping_nids(&mut node, a1).unwrap(), vec![a0, a1]);

    // o2ib2 added, o2ib1 removed; the list forgets our own NID, which stays ours.
    let board = crate::alive::NetAlive::new(1);
    node.set_node_nids(vec![a2], board);
    assert_eq!(node.node_nids(), &[a2, a0]);
    assert_eq!(ping_nids(&mut node, a2).unwrap(), vec![a2, a0]);
    assert_eq!(ping_nids(&mut node, a0).unwrap(), vec![a2, a0]);
    assert!(matches!(
        node.ping(now, a1, Duration::from_secs(1)),
        Err(LnetError::NoRoute(_))
    ));
    assert_eq!(node.endpoint(NiIndex(0)).unwrap().stats().connects, 0);
}

/// The hostile-peer audit: messages waiting for credits to a peer that went silent drained a
/// few per reconnect (each failed connect fails only those holding the peer's credits), ~7 a
/// second: millions would take days. As lnet_post_send_locked does, one whose transaction
/// deadline passed while it waited is dropped when its turn comes (its credit comes back at
/// once, so the next is looked at too): the whole stale queue fails together, as `Expired`,
/// counted as drops and network timeouts, and nothing is left.
#[test]
fn messages_queued_past_their_deadline_fail_together() {
    let (mut f, b) = pinged_pair();
    f.kill(1);
    let now = f.now;
    let n = 300u64;
    for i in 0..n {
        f.nodes[0].send_put(now, b, 4, i, vec![0; 64]).unwrap();
    }
    let drops0 = f.nodes[0].stats().drop_count;
    f.run_for(Duration::from_secs(250));
    let results = routing::put_results(&f.take_events(0));
    assert_eq!(results.len() as u64, n, "every PUT ended");
    let expired = results
        .iter()
        .filter(|r| **r == Err(LnetError::Expired))
        .count() as u64;
    assert!(results.iter().all(|r| r.is_err()));
    // Those holding the peer's 8 credits failed in the LND; every other one expired.
    assert!(
        expired >= n - 16,
        "only {expired} of {n} expired: {results:?}"
    );
    let s = f.nodes[0].stats();
    assert_eq!(s.drop_count - drops0, expired);
    assert!(s.network_timeout_count >= expired);
    assert_eq!(s.msgs_alloc, 0);
}

/// The review of the hostile-peer fixes: RESPONSE_BACKLOG counts every message waiting for credits to the next hop,
/// our own requests included, so a node that merely has a burst of its own PUTs queued to a
/// healthy peer (a send window above 4,096) does not answer that peer's ping: the REPLY is
/// shed as `Backlog` and the peer's ping times out, though the queue drains in moments.
#[test]
fn our_own_queued_puts_do_not_shed_the_answer_to_a_healthy_peer() {
    let mut f = Fabric::new(&[&["10.0.0.1@o2ib"], &["10.0.0.2@o2ib"]]);
    let (a, b) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let now = f.now;
    f.nodes[1].ping(now, a, Duration::from_secs(5)).unwrap();
    f.run_for(Duration::from_secs(2));
    f.take_events(1);
    let now = f.now;
    for i in 0..5000u64 {
        f.nodes[0].send_put(now, b, 4, i, vec![0; 64]).unwrap();
    }
    f.nodes[1].ping(now, a, Duration::from_secs(5)).unwrap();
    f.run_for(Duration::from_secs(10));
    let pings = ping_results(&f.take_events(1));
    assert_eq!(pings.len(), 1);
    assert!(
        pings[0].2.is_ok(),
        "B's ping of a healthy A: {:?}",
        pings[0].2
    );
}

/// Audit F5: a burst of PUTs queued behind the peer's credits (to a healthy peer: delivered) or
/// behind a peer that died (failed, most as expired) used to leave the node's message slab and
/// queues, and its LND's, at their peak for good: hundreds of MB for a daemon that once
/// absorbed one. Once the burst is over and the node has been quiet a while, every table is
/// back near its floor, on the node and in the LND.
#[test]
fn a_burst_of_queued_puts_leaves_no_peak_capacity_behind() {
    use lnd::trim::{TRIM_FLOOR, TRIM_INTERVAL};
    const BURST: u64 = 50_000;
    for dead in [false, true] {
        let (mut f, b) = pinged_pair();
        if dead {
            f.kill(1);
        }
        let now = f.now;
        for i in 0..BURST {
            f.nodes[0].send_put(now, b, 4, i, vec![0; 64]).unwrap();
        }
        let peak = f.nodes[0].capacities();
        let msgs = peak.iter().find(|c| c.name == "msgs").unwrap();
        assert!(msgs.capacity >= BURST as usize, "{peak:?}");
        f.run_for(Duration::from_secs(250));
        let results = routing::put_results(&f.take_events(0));
        assert_eq!(results.len() as u64, BURST, "every PUT ended");
        assert_eq!(results.iter().all(|r| r.is_ok()), !dead);
        assert_eq!(f.nodes[0].stats().msgs_alloc, 0);
        // Quiet for a few trim intervals.
        f.run_for(TRIM_INTERVAL * 4);
        let node = &f.nodes[0];
        let lnd = node.endpoint(NiIndex(0)).unwrap();
        for c in node.capacities().iter().chain(&lnd.capacities()) {
            assert!(
                c.capacity <= 2 * TRIM_FLOOR,
                "dead {dead}: {} keeps room for {} after the burst: node {:?}, LND {:?}",
                c.name,
                c.capacity,
                node.capacities(),
                lnd.capacities()
            );
        }
    }
}
