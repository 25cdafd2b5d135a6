//! The selftest RPC layer over an [`LnetNode`] (rpc.c in Lustre): client RPCs (a 160-byte
//! request PUT to the server's portal, an optional bulk buffer posted on the RDMA portal, the
//! reply PUT back on the RDMA portal), the server's replies and bulk transfers, and the
//! registered memory they move data from and into.
//!
//! A client RPC ends once, when its reply and its bulk (if any) are both in, or on the first
//! failure (request not sent, reply status, timeout, shutdown); its bulk buffer is never given
//! back while a transfer may still be writing into it (srpc_client_rpc waits for the bulk
//! event as this does).
//!
//! **Loopback bulk.** The node moves registered memory only through an LND, but a selftest
//! node is often its own peer: the console GETs a test's destination list from itself when it
//! is also a test client, and `lst add_test --from g --to g` makes a node its own brw server.
//! Bulk to our own NID is therefore copied here, between this layer's buffers, and reported by
//! the same events the node would give (as lolnd copies in memory in Lustre), so that the
//! rest of the selftest has one path.

use std::collections::{BTreeSet, HashMap, VecDeque};

use lnd::fabric::{Registration, Registry, SharedMem};
use lnd::time::{Duration, Instant};
use lnd::wire::{ByteOrder, Nid};

use super::wire::{
    MsgType, ServiceId, SrpcBody, SrpcCounters, SrpcHeader, SrpcMsg, SRPC_MSG_LEN, SRPC_RDMA_PORTAL,
};
use crate::{BulkBuf, LnetError, LnetEvent, LnetNode, MdId, MsgId, NiIndex};

/// Ids of what this layer makes up for loopback bulk: far from the node's own counters.
const LOOPBACK_ID: u64 = 1 << 63;

/// A buffer of registered memory this layer owns.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SlotId(usize);

struct Slot {
    mem: SharedMem,
    reg: Registration,
}

/// Registered buffers, reused by length: a brw server keeps LNET_MTU-sized ones across
/// RPCs, a test client one per unit for the test's life. Bounded by `limit` bytes in all.
pub(crate) struct Buffers {
    ni: NiIndex,
    slots: Vec<Option<Slot>>,
    free: HashMap<usize, Vec<usize>>,
    unused: Vec<usize>,
    bytes: u64,
    limit: u64,
}

/// Why no buffer could be had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BufferError {
    /// The selftest's memory limit is reached.
    Limit { limit: u64 },
    /// The fabric refused to register it.
    Register(String),
}

impl Buffers {
    pub(crate) fn new(ni: NiIndex, limit: u64) -> Buffers {
        Buffers {
            ni,
            slots: Vec::new(),
            free: HashMap::new(),
            unused: Vec::new(),
            bytes: 0,
            limit,
        }
    }

    /// A buffer of `len` bytes: a free one of that length, or a new registration.
    pub(crate) fn take(
        &mut self,
        reg: &mut dyn Registry,
        len: usize,
    ) -> Result<SlotId, BufferError> {
        if let Some(i) = self.free.get_mut(&len).and_then(|v| v.pop()) {
            return Ok(SlotId(i));
        }
        if self.bytes + len as u64 > self.limit {
            return Err(BufferError::Limit { limit: self.limit });
        }
        let mem = SharedMem::new(len);
        let r = reg
            .register_shared(&mem)
            .map_err(|e| BufferError::Register(e.to_string()))?;
        self.bytes += len as u64;
        let slot = Slot { mem, reg: r };
        let i = match self.unused.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        Ok(SlotId(i))
    }

    /// Gives a buffer back for reuse.
    pub(crate) fn give(&mut self, id: SlotId) {
        if let Some(Some(s)) = self.slots.get(id.0) {
            let len = s.mem.len();
            self.free.entry(len).or_default().push(id.0);
        }
    }

    /// Deregisters every buffer given back (a session's end): memory stays flat between
    /// sessions.
    pub(crate) fn trim(&mut self, reg: &mut dyn Registry) {
        for (_, ids) in self.free.drain() {
            for i in ids {
                if let Some(s) = self.slots.get_mut(i).and_then(Option::take) {
                    self.bytes -= s.mem.len() as u64;
                    let _ = reg.deregister(s.reg);
                    self.unused.push(i);
                }
            }
        }
    }

    /// `[off, off + len)` of buffer `id`.
    pub(crate) fn span(&self, id: SlotId, off: usize, len: usize) -> Option<Span> {
        let s = self.slots.get(id.0)?.as_ref()?;
        let buf = BulkBuf::new(self.ni, &s.reg, off as u64, u32::try_from(len).ok()?)?
            .shared(s.mem.clone());
        Some(Span {
            mem: s.mem.clone(),
            buf,
        })
    }

    /// Runs `f` on buffer `id`'s bytes.
    pub(crate) fn with<R>(&self, id: SlotId, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let s = self.slots.get(id.0)?.as_ref()?;
        Some(s.mem.with(f))
    }

    /// Bytes registered now.
    pub(crate) fn registered_bytes(&self) -> u64 {
        self.bytes
    }
}

/// A range of one of our buffers: its memory (for loopback copies and checks) and its name
/// for the node.
#[derive(Clone, Debug)]
pub(crate) struct Span {
    pub(crate) mem: SharedMem,
    pub(crate) buf: BulkBuf,
}

impl Span {
    fn range(&self) -> std::ops::Range<usize> {
        let off = self.buf.offset as usize;
        off..off + self.buf.len as usize
    }
}

/// Which way a client's bulk goes: the server PUTs into it (`Sink`: brw read) or GETs from
/// it (`Source`: brw write, a test's destination list).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum BulkDir {
    Sink,
    Source,
}

/// Why a client RPC failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RpcError {
    /// LNet could not send the request or move the bulk.
    Lnet(LnetError),
    /// No reply within the RPC's timeout.
    Timeout,
    /// The reply is not a selftest message of the expected type.
    BadReply(String),
    /// The selftest on this node is stopping.
    Aborted,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Lnet(e) => write!(f, "{e}"),
            RpcError::Timeout => f.write_str("RPC timed out"),
            RpcError::BadReply(s) => write!(f, "bad reply: {s}"),
            RpcError::Aborted => f.write_str("aborted"),
        }
    }
}

/// Who waits for a client RPC (the selftest dispatches its end by this).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    /// A console transaction: (operation, index of the node in it).
    Console { op: u64, node: usize },
    /// A test unit: (test instance key, unit index).
    Unit { test: u64, unit: usize },
}

/// A finished client RPC.
#[derive(Debug)]
pub(crate) struct RpcDone {
    pub(crate) owner: Owner,
    pub(crate) dst: Nid,
    pub(crate) started: Instant,
    /// The reply (its status is the caller's to judge), or why there is none.
    pub(crate) result: Result<(SrpcBody, ByteOrder), RpcError>,
    /// Bytes the bulk moved (0 without bulk).
    pub(crate) bulk_len: u32,
}

/// A request for us from a client.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) from: Nid,
    pub(crate) msg: SrpcMsg,
    pub(crate) order: ByteOrder,
    pub(crate) rpyid: u64,
    pub(crate) bulkid: u64,
}

/// What this layer reports up.
#[derive(Debug)]
pub(crate) enum SrpcEvent {
    Request(Incoming),
    /// A request we could not parse, from `from`: answered already if it could be (its
    /// `rpyid` was readable), counted as dropped.
    Rpc(RpcDone),
    /// A server-side bulk transfer ([`Srpc::server_bulk`]) ended.
    ServerBulk {
        op: u64,
        result: Result<u32, LnetError>,
    },
}

struct ClientRpc {
    dst: Nid,
    owner: Owner,
    expect: MsgType,
    started: Instant,
    deadline: Instant,
    reply: Option<(SrpcBody, ByteOrder)>,
    bulk: Option<ClientBulk>,
    failed: Option<RpcError>,
}

struct ClientBulk {
    md: MdId,
    /// Where the data is: a PUT that comes inline is copied here.
    span: Span,
    done: Option<Result<u32, LnetError>>,
}

/// What an LNet completion belongs to.
#[derive(Copy, Clone, Debug)]
enum Wait {
    Request(u64),
    ClientBulk(u64),
    ServerBulk(u64),
    Reply,
}

struct LocalMd {
    id: MdId,
    span: Span,
    sink: bool,
}

/// The RPC layer: see the module documentation.
pub(crate) struct Srpc {
    own: Nid,
    next_id: u64,
    rpcs: HashMap<u64, ClientRpc>,
    deadlines: BTreeSet<(Instant, u64)>,
    msgs: HashMap<MsgId, Wait>,
    /// The memory of the server GETs in `msgs`, for a REPLY that comes inline.
    server_spans: HashMap<MsgId, Span>,
    mds: HashMap<MdId, Wait>,
    local: HashMap<(u32, u64), LocalMd>,
    next_loop: u64,
    loop_events: VecDeque<LnetEvent>,
    events: VecDeque<SrpcEvent>,
    pub(crate) buffers: Buffers,
    pub(crate) counters: SrpcCounters,
    /// Of `counters.rpcs_sent`, the RPCs this node's console sent (its framework RPCs): what
    /// a console subtracts from its own node's count to know the test RPCs it sent.
    pub(crate) console_sent: u32,
}

impl Srpc {
    /// The layer for NI `ni` whose NID is `own`; `seed` makes this instance's match bits
    /// differ from an earlier one's (a restarted daemon must not take a late reply meant for
    /// its previous life as its own).
    pub(crate) fn new(ni: NiIndex, own: Nid, seed: u64, buffer_limit: u64) -> Srpc {
        Srpc {
            own,
            next_id: seed << 24,
            rpcs: HashMap::new(),
            deadlines: BTreeSet::new(),
            msgs: HashMap::new(),
            server_spans: HashMap::new(),
            mds: HashMap::new(),
            local: HashMap::new(),
            next_loop: LOOPBACK_ID,
            loop_events: VecDeque::new(),
            events: VecDeque::new(),
            buffers: Buffers::new(ni, buffer_limit),
            counters: SrpcCounters::default(),
            console_sent: 0,
        }
    }

    pub(crate) fn own(&self) -> Nid {
        self.own
    }

    fn is_local(&self, dst: Nid) -> bool {
        dst == self.own || dst == Nid::LO_0
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }

    /// Client RPCs in flight.
    pub(crate) fn rpcs_in_flight(&self) -> usize {
        self.rpcs.len()
    }

    /// Starts a client RPC to `dst`'s `service`: `make(rpyid, bulkid)` builds the request
    /// body. With `bulk`, that span is posted for the server on the RDMA portal under `bulkid`.
    /// `features` goes in the header's `msg_ses_feats` (a test RPC carries its session's, as
    /// sfw_create_test_rpc does); `None`: the body's implied features. Its end comes as
    /// [`SrpcEvent::Rpc`]; an error here means nothing was sent.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        dst: Nid,
        service: ServiceId,
        make: impl FnOnce(u64, u64) -> SrpcBody,
        bulk: Option<(Span, BulkDir)>,
        timeout: Duration,
        owner: Owner,
        features: Option<u32>,
    ) -> Result<u64, RpcError> {
        let rpyid = self.fresh_id();
        let bulkid = if bulk.is_some() { self.fresh_id() } else { 0 };
        let body = make(rpyid, bulkid);
        let mut payload = vec![0u8; SRPC_MSG_LEN];
        let mut msg = SrpcMsg::new(body);
        if let Some(f) = features {
            msg.features = f;
        }
        msg.emit(&mut payload, ByteOrder::Little)
            .map_err(|e| RpcError::BadReply(format!("cannot build the request: {e}")))?;
        let cb = match bulk {
            Some((span, dir)) => {
                let md = self.post(node, dst, SRPC_RDMA_PORTAL, bulkid, span.clone(), dir);
                self.mds.insert(md, Wait::ClientBulk(rpyid));
                Some(ClientBulk {
                    md,
                    span,
                    done: None,
                })
            }
            None => None,
        };
        let id = match node.send_put(now, dst, service.portal(), service as u64, payload) {
            Ok(id) => id,
            Err(e) => {
                if let Some(b) = cb {
                    // Nothing was sent: the MD is unused, and nothing will report on it.
                    self.unlink(node, b.md);
                    self.mds.remove(&b.md);
                }
                self.counters.errors += 1;
                return Err(RpcError::Lnet(e));
            }
        };
        self.counters.rpcs_sent += 1;
        if matches!(owner, Owner::Console { .. }) {
            self.console_sent = self.console_sent.wrapping_add(1);
        }
        self.msgs.insert(id, Wait::Request(rpyid));
        let deadline = now.saturating_add(timeout);
        self.deadlines.insert((deadline, rpyid));
        self.rpcs.insert(
            rpyid,
            ClientRpc {
                dst,
                owner,
                expect: service.reply_type(),
                started: now,
                deadline,
                reply: None,
                bulk: cb,
                failed: None,
            },
        );
        Ok(rpyid)
    }

    /// Sends the reply `body` to a request from `to` whose reply buffer is `rpyid`, with the
    /// header's session features `features`.
    pub(crate) fn reply(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        to: Nid,
        rpyid: u64,
        body: SrpcBody,
        features: u32,
    ) {
        let mut payload = vec![0u8; SRPC_MSG_LEN];
        let mut msg = SrpcMsg::new(body);
        msg.features = features;
        if msg.emit(&mut payload, ByteOrder::Little).is_err() {
            self.counters.errors += 1;
            return;
        }
        match node.send_put(now, to, SRPC_RDMA_PORTAL, rpyid, payload) {
            Ok(id) => {
                self.msgs.insert(id, Wait::Reply);
            }
            Err(e) => {
                tracing::debug!(%to, %e, "selftest reply not sent");
                self.counters.errors += 1;
            }
        }
    }

    /// Moves a server's bulk: PUTs `span` into (`peer`, RDMA portal, `bulkid`) (`Sink` on the
    /// client: brw read) or GETs it from there into `span` (`Source`: brw write, destination
    /// lists). Its end comes as [`SrpcEvent::ServerBulk`] with `op`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn server_bulk(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        peer: Nid,
        bulkid: u64,
        span: Span,
        client_dir: BulkDir,
        op: u64,
    ) -> Result<(), LnetError> {
        let len = span.buf.len;
        let keep = span.clone();
        let id = if self.is_local(peer) {
            self.local_transfer(peer, bulkid, span, client_dir)
        } else if client_dir == BulkDir::Sink && node.is_sibling_nid(peer) {
            // Another NI of this node, run by another runtime: no LND moves memory between
            // the two runtimes' fabrics, so the bytes go inline, in memory, into the sink the
            // client posted (the GET the other way is answered in memory by the node).
            let bytes = span
                .mem
                .with(|b| b.get(span.range()).map(<[u8]>::to_vec))
                .ok_or(LnetError::BulkUnsupported("bulk outside its buffer"))?;
            node.send_put(now, peer, SRPC_RDMA_PORTAL, bulkid, bytes)?
        } else {
            match client_dir {
                BulkDir::Sink => node.send_put_bulk(now, peer, SRPC_RDMA_PORTAL, bulkid, span.buf),
                BulkDir::Source => {
                    node.send_get_bulk(now, peer, SRPC_RDMA_PORTAL, bulkid, span.buf)
                }
            }?
        };
        match client_dir {
            BulkDir::Sink => self.counters.bulk_put += u64::from(len),
            BulkDir::Source => self.counters.bulk_get += u64::from(len),
        }
        self.msgs.insert(id, Wait::ServerBulk(op));
        if client_dir == BulkDir::Source {
            // A routed GET's REPLY may come inline: copied here then.
            self.server_spans.insert(id, keep);
        }
        Ok(())
    }

    /// Posts `span` for `peer` on (`portal`, `mb`): in the node, or here when the peer is us.
    fn post(
        &mut self,
        node: &mut LnetNode,
        peer: Nid,
        portal: u32,
        mb: u64,
        span: Span,
        dir: BulkDir,
    ) -> MdId {
        if self.is_local(peer) {
            let id = MdId(self.next_loop);
            self.next_loop += 1;
            let sink = dir == BulkDir::Sink;
            self.local.insert((portal, mb), LocalMd { id, span, sink });
            id
        } else {
            match dir {
                BulkDir::Sink => node.post_sink(portal, mb, span.buf),
                // A sibling runtime's NI GETs it in memory: the node reads it then.
                BulkDir::Source if node.is_sibling_nid(peer) => {
                    node.post_source_shared(portal, mb, span.buf, span.mem)
                }
                BulkDir::Source => node.post_source(portal, mb, span.buf),
            }
        }
    }

    /// Takes back an MD nothing used; false if it is in use or done.
    fn unlink(&mut self, node: &mut LnetNode, md: MdId) -> bool {
        if md.0 >= LOOPBACK_ID {
            let key = self.local.iter().find(|(_, m)| m.id == md).map(|(k, _)| *k);
            key.is_some_and(|k| self.local.remove(&k).is_some())
        } else {
            node.unlink_md(md)
        }
    }

    /// A bulk transfer between two of our own spans: copied now, reported as the node
    /// would report it, at the next [`Srpc::handle_event`] round.
    fn local_transfer(&mut self, peer: Nid, bulkid: u64, span: Span, client_dir: BulkDir) -> MsgId {
        let id = MsgId(self.next_loop);
        self.next_loop += 1;
        let want_sink = client_dir == BulkDir::Sink;
        let md = match self.local.get(&(SRPC_RDMA_PORTAL, bulkid)) {
            Some(m) if m.sink == want_sink => self.local.remove(&(SRPC_RDMA_PORTAL, bulkid)),
            _ => None,
        };
        let Some(md) = md else {
            // Nothing posted: as the node reports it (a PUT is not acknowledged; a GET of
            // nothing is -ENODATA).
            let ev = match client_dir {
                BulkDir::Sink => LnetEvent::PutDone { id, result: Ok(()) },
                BulkDir::Source => LnetEvent::GetDone {
                    id,
                    result: Err(LnetError::Lnd(lnd::engine::TxError::Rdma(
                        -lnd::wire::errno::ENODATA,
                    ))),
                },
            };
            self.loop_events.push_back(ev);
            return id;
        };
        let (from, to) = match client_dir {
            BulkDir::Sink => (&span, &md.span),
            BulkDir::Source => (&md.span, &span),
        };
        let n = from.buf.len.min(to.buf.len);
        let bytes = from
            .mem
            .with(|b| b.get(from.range()).map(|s| s[..n as usize].to_vec()));
        let copied = bytes.is_some_and(|bytes| {
            to.mem.with(|b| {
                let r = to.range();
                b.get_mut(r.start..r.start + n as usize)
                    .map(|d| d.copy_from_slice(&bytes))
                    .is_some()
            })
        });
        let result = if copied {
            Ok(n)
        } else {
            Err(LnetError::BulkUnsupported(
                "loopback bulk outside its buffer",
            ))
        };
        match client_dir {
            BulkDir::Sink => {
                self.loop_events.push_back(LnetEvent::BulkPut {
                    md: md.id,
                    from: peer,
                    match_bits: bulkid,
                    hdr_data: 0,
                    result,
                });
                self.loop_events.push_back(LnetEvent::PutDone {
                    id,
                    result: result.map(|_| ()),
                });
            }
            BulkDir::Source => {
                self.loop_events.push_back(LnetEvent::BulkGetServed {
                    md: md.id,
                    to: peer,
                    result,
                });
                self.loop_events
                    .push_back(LnetEvent::GetDone { id, result });
            }
        }
        id
    }

    /// Takes an event of the node; false if it is not this layer's (the caller hands it on).
    pub(crate) fn handle_event(&mut self, node: &mut LnetNode, ev: &LnetEvent) -> bool {
        let taken = self.take_event(node, ev);
        self.flush(node);
        taken
    }

    /// Loopback events still to be taken (the caller runs [`Srpc::handle_event`] rounds until
    /// none are left; `flush` does it with no outside event).
    pub(crate) fn flush(&mut self, node: &mut LnetNode) {
        while let Some(ev) = self.loop_events.pop_front() {
            self.take_event(node, &ev);
        }
    }

    fn take_event(&mut self, node: &mut LnetNode, ev: &LnetEvent) -> bool {
        match ev {
            LnetEvent::Put {
                from,
                portal,
                match_bits,
                payload,
                ..
            } => match *portal {
                SRPC_RDMA_PORTAL => {
                    let Some(rpc) = self.rpcs.get_mut(match_bits) else {
                        // A late reply (its RPC timed out) or a stranger's: dropped.
                        self.counters.rpcs_dropped += 1;
                        return true;
                    };
                    if rpc.dst != *from || rpc.reply.is_some() {
                        self.counters.rpcs_dropped += 1;
                        return true;
                    }
                    rpc.reply = Some(match SrpcMsg::parse(payload) {
                        Ok((m, order)) if m.msg_type() == rpc.expect => (m.body, order),
                        Ok((m, _)) => {
                            rpc.failed.get_or_insert(RpcError::BadReply(format!(
                                "a {:?} where a {:?} was due",
                                m.msg_type(),
                                rpc.expect
                            )));
                            return self.finish_if_done(node, *match_bits);
                        }
                        Err(e) => {
                            rpc.failed.get_or_insert(RpcError::BadReply(e.to_string()));
                            return self.finish_if_done(node, *match_bits);
                        }
                    });
                    self.finish_if_done(node, *match_bits)
                }
                p if p == super::wire::SRPC_REQUEST_PORTAL
                    || p == super::wire::SRPC_FRAMEWORK_REQUEST_PORTAL =>
                {
                    self.incoming(*from, *portal, *match_bits, payload);
                    true
                }
                _ => false,
            },
            LnetEvent::PutDone { id, result } => {
                let Some(w) = self.msgs.remove(id) else {
                    return false;
                };
                self.lnet_done(node, w, (*result).map(|()| 0));
                true
            }
            LnetEvent::GetDone { id, result } => {
                let Some(w) = self.msgs.remove(id) else {
                    return false;
                };
                self.server_spans.remove(id);
                self.lnet_done(node, w, *result);
                true
            }
            LnetEvent::GetDoneInline { id, payload } => {
                let Some(w) = self.msgs.remove(id) else {
                    return false;
                };
                let result = match self.server_spans.remove(id) {
                    Some(span) => copy_into(&span, payload),
                    None => Err(LnetError::BulkUnsupported("an inline REPLY with no memory")),
                };
                self.lnet_done(node, w, result);
                true
            }
            LnetEvent::BulkPutInline { md, payload, .. } => {
                let Some(w) = self.mds.remove(md) else {
                    return false;
                };
                let span = match w {
                    Wait::ClientBulk(rpyid) => self
                        .rpcs
                        .get(&rpyid)
                        .and_then(|r| r.bulk.as_ref())
                        .map(|b| b.span.clone()),
                    _ => None,
                };
                let result = match span {
                    Some(span) => copy_into(&span, payload),
                    None => Err(LnetError::BulkUnsupported("an inline PUT with no memory")),
                };
                self.lnet_done(node, w, result);
                true
            }
            LnetEvent::BulkPut { md, result, .. } | LnetEvent::BulkGetServed { md, result, .. } => {
                let Some(w) = self.mds.remove(md) else {
                    return false;
                };
                self.lnet_done(node, w, *result);
                true
            }
            _ => false,
        }
    }

    fn incoming(&mut self, from: Nid, portal: u32, match_bits: u64, payload: &[u8]) {
        self.counters.rpcs_rcvd += 1;
        let ok_service = ServiceId::from_u32(match_bits as u32)
            .filter(|s| u64::from(*s as u32) == match_bits && s.portal() == portal);
        match (SrpcMsg::parse(payload), ok_service) {
            (Ok((msg, order)), Some(s)) if msg.msg_type() == s.request_type() => {
                let (h, _) = match SrpcHeader::parse(payload) {
                    Ok(h) => h,
                    Err(_) => {
                        self.counters.rpcs_dropped += 1;
                        return;
                    }
                };
                self.events.push_back(SrpcEvent::Request(Incoming {
                    from,
                    msg,
                    order,
                    rpyid: h.rpyid,
                    bulkid: h.bulkid,
                }));
            }
            (r, _) => {
                // Malformed, of another version, or on the wrong service: Lustre's server
                // drops what it cannot unpack (srpc_handle_rpc answers EPROTO only to a
                // version it can read); so do we, counted.
                tracing::debug!(%from, portal, match_bits, ok = r.is_ok(), "selftest request dropped");
                self.counters.rpcs_dropped += 1;
            }
        }
    }

    fn lnet_done(&mut self, node: &mut LnetNode, w: Wait, result: Result<u32, LnetError>) {
        match w {
            Wait::Request(rpyid) => {
                if let Err(e) = result {
                    if let Some(rpc) = self.rpcs.get_mut(&rpyid) {
                        rpc.failed.get_or_insert(RpcError::Lnet(e));
                    }
                    self.finish_if_done(node, rpyid);
                }
            }
            Wait::ClientBulk(rpyid) => {
                if let Some(b) = self.rpcs.get_mut(&rpyid).and_then(|r| r.bulk.as_mut()) {
                    b.done = Some(result);
                }
                self.finish_if_done(node, rpyid);
            }
            Wait::ServerBulk(op) => {
                if result.is_err() {
                    self.counters.errors += 1;
                }
                self.events.push_back(SrpcEvent::ServerBulk { op, result });
            }
            Wait::Reply => {
                if result.is_err() {
                    self.counters.errors += 1;
                }
            }
        }
    }

    /// Ends RPC `rpyid` if it can end: a failure or a bad status with its bulk taken back or
    /// finished, or a good reply with its bulk finished. Always true (for `take_event`).
    fn finish_if_done(&mut self, node: &mut LnetNode, rpyid: u64) -> bool {
        let Some(rpc) = self.rpcs.get_mut(&rpyid) else {
            return true;
        };
        let status = rpc.reply.as_ref().map(|(b, _)| reply_status(b));
        let bulk_pending = rpc.bulk.as_ref().is_some_and(|b| b.done.is_none());
        let ending = rpc.failed.is_some() || status.is_some_and(|s| s != 0);
        if bulk_pending {
            if !ending {
                return true;
            }
            let md = rpc.bulk.as_ref().map(|b| b.md);
            if let Some(md) = md {
                if !self.unlink(node, md) {
                    // The bulk is being moved: its event comes, and the buffer is not free
                    // before it.
                    return true;
                }
                self.mds.remove(&md);
            }
        } else if !ending && status.is_none() {
            return true;
        }
        let Some(rpc) = self.rpcs.remove(&rpyid) else {
            return true;
        };
        self.deadlines.remove(&(rpc.deadline, rpyid));
        let bulk_result = rpc.bulk.as_ref().and_then(|b| b.done);
        let result = match (rpc.failed, rpc.reply) {
            (Some(e), _) => Err(e),
            (None, Some(reply)) => match bulk_result {
                Some(Err(e)) if reply_status(&reply.0) == 0 => Err(RpcError::Lnet(e)),
                _ => Ok(reply),
            },
            (None, None) => Err(RpcError::Aborted),
        };
        if result.is_err() {
            self.counters.errors += 1;
        }
        let bulk_len = match bulk_result {
            Some(Ok(n)) => n,
            _ => 0,
        };
        self.events.push_back(SrpcEvent::Rpc(RpcDone {
            owner: rpc.owner,
            dst: rpc.dst,
            started: rpc.started,
            result,
            bulk_len,
        }));
        true
    }

    /// Expires the client RPCs whose time is up.
    pub(crate) fn handle_timeout(&mut self, now: Instant, node: &mut LnetNode) {
        while let Some(&(at, rpyid)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.remove(&(at, rpyid));
            if let Some(rpc) = self.rpcs.get_mut(&rpyid) {
                if rpc.failed.is_none() && rpc.reply.is_none() {
                    self.counters.rpcs_expired += 1;
                }
                rpc.failed.get_or_insert(RpcError::Timeout);
                // Re-armed far out: an RPC waiting on its bulk's event is not expired twice.
                rpc.deadline = Instant::MAX;
            }
            self.finish_if_done(node, rpyid);
        }
        self.flush(node);
    }

    /// Fails every client RPC owned by `pred` (a stopped test, an ended session).
    pub(crate) fn abort(&mut self, node: &mut LnetNode, pred: impl Fn(Owner) -> bool) {
        let ids: Vec<u64> = self
            .rpcs
            .iter()
            .filter(|(_, r)| pred(r.owner))
            .map(|(k, _)| *k)
            .collect();
        for rpyid in ids {
            if let Some(rpc) = self.rpcs.get_mut(&rpyid) {
                rpc.failed.get_or_insert(RpcError::Aborted);
            }
            self.finish_if_done(node, rpyid);
        }
    }

    /// What this layer tracks, by map (for leak checks in tests).
    #[cfg(test)]
    pub(crate) fn census(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("rpcs", self.rpcs.len()),
            ("deadlines", self.deadlines.len()),
            ("msgs", self.msgs.len()),
            ("server_spans", self.server_spans.len()),
            ("mds", self.mds.len()),
            ("local", self.local.len()),
            ("loop_events", self.loop_events.len()),
            ("events", self.events.len()),
        ]
    }

    /// The next deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// The next thing this layer has to report.
    pub(crate) fn poll_event(&mut self) -> Option<SrpcEvent> {
        self.events.pop_front()
    }
}

/// Copies the bytes of a transfer that came inline into `span` (at most its length).
fn copy_into(span: &Span, bytes: &[u8]) -> Result<u32, LnetError> {
    let r = span.range();
    let n = bytes.len().min(r.len());
    let landed = span.mem.with(|b| {
        b.get_mut(r.start..r.start + n)
            .map(|d| d.copy_from_slice(&bytes[..n]))
            .is_some()
    });
    if landed {
        Ok(n as u32)
    } else {
        Err(LnetError::BulkUnsupported("inline data outside its buffer"))
    }
}

/// The status of a reply body (a positive errno, 0 for success); requests have none (0).
pub(crate) fn reply_status(b: &SrpcBody) -> u32 {
    match b {
        SrpcBody::MakeSessionReply(r) => r.status,
        SrpcBody::RemoveSessionReply(r) => r.status,
        SrpcBody::BatchReply(r) => r.status,
        SrpcBody::StatReply(r) => r.status,
        SrpcBody::TestReply(r) => r.status,
        SrpcBody::DebugReply(r) => r.status,
        SrpcBody::BrwReply(r) => r.status,
        SrpcBody::PingReply(r) => r.status,
        SrpcBody::JoinReply(r) => r.status,
        _ => 0,
    }
}
