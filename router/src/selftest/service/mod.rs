//! The selftest service a node runs (framework.c, brw_test.c, ping_test.c in Lustre, in our
//! words): the session a console makes on it, the batches of tests the console adds, the
//! client side of those tests (units sending ping or brw RPCs to their destinations), and the
//! server side of the test services (answering pings, moving brw data).
//!
//! One [`Selftest`] runs beside one NI's [`LnetNode`] and drives it as any upper layer does:
//! the node's events go through [`Selftest::handle_event`] first, and time through
//! [`Selftest::handle_timeout`]. Sans-IO like the node: no clock, thread or I/O; registered
//! memory comes from the fabric's [`Registry`] the caller passes in.

use std::collections::{HashMap, VecDeque};

use hdrhistogram::Histogram;
use lnd::fabric::Registry;
use lnd::time::{Duration, Instant};
use lnd::wire::errno;
use lnd::wire::{ByteOrder, Nid};

use super::console_types::Console;
use super::pattern;
use super::srpc::{BufferError, BulkDir, Incoming, Owner, RpcDone, SlotId, Srpc, SrpcEvent};
use super::wire::*;
use crate::{LnetEvent, LnetNode, NiIndex};

/// How long a test RPC may take (lnet_selftest's `rpc_timeout`, 64 s by default).
pub const TEST_RPC_TIMEOUT: Duration = Duration::from_secs(64);

/// Registered memory the selftest of one NI may hold, in all (brw buffers of its test units
/// and of its server side, destination lists).
pub const DEFAULT_BUFFER_LIMIT: u64 = 256 << 20;

/// A brw server buffer: the largest transfer and the largest client offset.
const SERVER_BUF: usize = LNET_MTU as usize + PAGE_SIZE_4K;

/// Seconds a node keeps a session whose console is silent (lnet_selftest's `session_timeout`).
pub const SESSION_TIMEOUT: u32 = 100;

/// Test units one client test may have (destinations x concurrency): a TEST asking for more
/// is answered ENOMEM rather than allocated.
const MAX_UNITS: u64 = 65_536;

/// brw requests that may wait for a server buffer at once.
const MAX_WAITING: usize = 4096;

mod client;

/// What a test does, as the node runs it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum TestKind {
    Ping,
    Brw {
        op: BrwOp,
        check: BrwCheck,
        len: u32,
        /// The client's in-page offset.
        off: u32,
    },
}

/// One test unit: RPCs to one destination, one at a time.
struct Unit {
    dest: Nid,
    /// RPCs still to send (`None`: until stopped).
    left: Option<u64>,
    rpc: Option<u64>,
    slot: Option<SlotId>,
}

/// A test on this node as a client (sfw_test_instance).
struct TestInstance {
    kind: TestKind,
    features: u32,
    stop_onerr: bool,
    units: Vec<Unit>,
    loop_count: Option<u64>,
    running: bool,
    /// Its session ended: it goes once its RPCs in flight are back.
    dead: bool,
    errors: u64,
}

impl TestInstance {
    fn in_flight(&self) -> usize {
        self.units.iter().filter(|u| u.rpc.is_some()).count()
    }

    fn active(&self) -> bool {
        self.running || self.in_flight() > 0
    }
}

/// The session a console made on this node (sfw_session).
struct Session {
    sid: LstSid,
    name: LstName,
    timeout: u32,
    features: u32,
    started: Instant,
    /// The session ends if its console is silent this long (0: never).
    expires: Option<Instant>,
    /// Batches by id: their client tests' keys.
    batches: HashMap<LstBid, Vec<u64>>,
}

/// A server-side operation waiting for its bulk.
enum ServerOp {
    Brw {
        from: Nid,
        rpyid: u64,
        slot: SlotId,
        op: BrwOp,
        check: BrwCheck,
        len: u32,
        order: ByteOrder,
        /// The request's session features, echoed in the reply.
        features: u32,
    },
    DestList {
        from: Nid,
        rpyid: u64,
        slot: SlotId,
        req: TestRequest,
        features: u32,
        order: ByteOrder,
    },
}

/// Latency of this node's test RPCs, by test kind, in microseconds.
pub(crate) struct Latency {
    pub(crate) ping: Histogram<u64>,
    pub(crate) brw_read: Histogram<u64>,
    pub(crate) brw_write: Histogram<u64>,
}

impl Latency {
    fn new() -> Latency {
        let h = || Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static bounds");
        Latency {
            ping: h(),
            brw_read: h(),
            brw_write: h(),
        }
    }

    fn record(&mut self, kind: TestKind, us: u64) {
        let h = match kind {
            TestKind::Ping => &mut self.ping,
            TestKind::Brw {
                op: BrwOp::Read, ..
            } => &mut self.brw_read,
            TestKind::Brw { .. } => &mut self.brw_write,
        };
        let _ = h.record(us.max(1));
    }
}

/// The selftest of one NI: service, test client, and the console (see the module docs).
pub struct Selftest {
    pub(crate) srpc: Srpc,
    session: Option<Session>,
    tests: HashMap<u64, TestInstance>,
    next_key: u64,
    ops: HashMap<u64, ServerOp>,
    /// brw requests waiting for a server buffer (the buffer limit is reached).
    waiting: VecDeque<Incoming>,
    brw_errors: u32,
    ping_errors: u32,
    ping_seq: u32,
    latency: Latency,
    pub(crate) console: Console,
    /// Units whose RPC finished, to start their next at the next [`Selftest::handle_timeout`]
    /// (the same turn for a remote peer) rather than inside [`Selftest::run`]: to our own NID
    /// an RPC completes in memory at once, so a unit restarted there never let `run` return,
    /// and with `now` fixed inside it a timed test never reached its end (the NI thread spun
    /// for good, deaf to lnetctl and SIGTERM; found by an operator's audit).
    next_units: Vec<(u64, usize)>,
    /// The console RPCs this node had sent (`Srpc::console_sent`) when it last answered a
    /// QUERY_STAT of its own console: the console's share of that answer's `rpcs_sent`.
    pub(crate) own_stat_console_rpcs: u32,
}

impl Selftest {
    /// The selftest of NI `ni` (NID `own`); `seed` should differ between lives of the daemon
    /// (its start time), `buffer_limit` bounds its registered memory.
    pub fn new(ni: NiIndex, own: Nid, seed: u64, buffer_limit: u64) -> Selftest {
        Selftest {
            srpc: Srpc::new(ni, own, seed, buffer_limit),
            session: None,
            tests: HashMap::new(),
            next_key: 1,
            ops: HashMap::new(),
            waiting: VecDeque::new(),
            brw_errors: 0,
            ping_errors: 0,
            ping_seq: 0,
            latency: Latency::new(),
            console: Console::new(seed),
            next_units: Vec::new(),
            own_stat_console_rpcs: 0,
        }
    }

    /// Takes one of the node's events; false if it is not the selftest's (hand it on).
    pub fn handle_event(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        reg: &mut dyn Registry,
        ev: &LnetEvent,
    ) -> bool {
        let taken = self.srpc.handle_event(node, ev);
        if taken {
            self.run(now, node, reg);
        }
        taken
    }

    /// Runs what is due at `now`: expired RPCs, an expired session.
    pub fn handle_timeout(&mut self, now: Instant, node: &mut LnetNode, reg: &mut dyn Registry) {
        self.srpc.handle_timeout(now, node);
        if self
            .session
            .as_ref()
            .and_then(|s| s.expires)
            .is_some_and(|at| at <= now)
        {
            tracing::info!("selftest session expired: its console went silent");
            self.end_session(now, node, reg);
        }
        for (key, i) in std::mem::take(&mut self.next_units) {
            self.unit_next(now, node, key, i);
        }
        self.run(now, node, reg);
    }

    /// When [`Selftest::handle_timeout`] should run next: now, while units wait to start
    /// their next RPC.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.next_units.is_empty() {
            return Some(Instant::ZERO);
        }
        let s = self.session.as_ref().and_then(|s| s.expires);
        match (self.srpc.poll_timeout(), s) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Bytes of registered memory the selftest holds.
    pub fn registered_bytes(&self) -> u64 {
        self.srpc.buffers.registered_bytes()
    }

    /// Client RPCs in flight (test units' and the console's).
    pub fn rpcs_in_flight(&self) -> usize {
        self.srpc.rpcs_in_flight()
    }

    /// What the selftest tracks, by map (for leak checks in tests): the RPC layer's, then
    /// the server ops, the brw requests waiting for a buffer, and the test instances.
    #[cfg(test)]
    pub(crate) fn census(&self) -> Vec<(&'static str, usize)> {
        let mut c = self.srpc.census();
        c.push(("ops", self.ops.len()));
        c.push(("waiting", self.waiting.len()));
        c.push(("tests", self.tests.len()));
        c
    }

    /// This node's selftest counters, as a QUERY_STAT reply carries them.
    pub fn counters(&self, now: Instant) -> (SfwCounters, SrpcCounters) {
        let running_ms = self.session.as_ref().map_or(0, |s| {
            now.saturating_duration_since(s.started).as_millis() as u32
        });
        let active = self.session.as_ref().map_or(0, |s| {
            s.batches
                .values()
                .filter(|keys| {
                    keys.iter()
                        .any(|k| self.tests.get(k).is_some_and(|t| t.active()))
                })
                .count() as u32
        });
        let zombies = u32::from(self.tests.values().any(|t| t.dead));
        (
            SfwCounters {
                running_ms,
                active_batches: active,
                zombie_sessions: zombies,
                brw_errors: self.brw_errors,
                ping_errors: self.ping_errors,
            },
            self.srpc.counters,
        )
    }

    /// The latency of this node's test RPCs since its session began.
    pub(crate) fn latency(&self) -> &Latency {
        &self.latency
    }

    /// Everything the RPC layer reported, until it has nothing more.
    pub(crate) fn run(&mut self, now: Instant, node: &mut LnetNode, reg: &mut dyn Registry) {
        loop {
            self.srpc.flush(node);
            let Some(ev) = self.srpc.poll_event() else {
                break;
            };
            match ev {
                SrpcEvent::Request(inc) => self.serve(now, node, reg, inc),
                SrpcEvent::Rpc(done) => match done.owner {
                    Owner::Unit { test, unit } => self.unit_done(now, reg, test, unit, done),
                    Owner::Console { .. } => self.console_rpc_done(done),
                },
                SrpcEvent::ServerBulk { op, result } => {
                    self.server_bulk_done(now, node, reg, op, result)
                }
            }
        }
    }

    // ------------------------------------------------------------------ server side

    fn serve(&mut self, now: Instant, node: &mut LnetNode, reg: &mut dyn Registry, inc: Incoming) {
        let from = inc.from;
        let rpyid = inc.rpyid;
        let req_features = inc.msg.features;
        let our = self.session.as_ref().map_or(LstSid::NONE, |s| s.sid);
        let body: Option<SrpcBody> = match inc.msg.body {
            SrpcBody::MakeSessionRequest(r) => Some(self.make_session(now, node, reg, &inc, r)),
            SrpcBody::RemoveSessionRequest(r) => {
                // sfw_remove_session: ESRCH without a session, EBUSY for another console's.
                let status = if self.sid_ok(r.sid, now) {
                    self.end_session(now, node, reg);
                    0
                } else if self.session.is_some() {
                    errno::EBUSY as u32
                } else {
                    errno::ESRCH as u32
                };
                Some(RemoveSessionReply { status, sid: our }.into())
            }
            SrpcBody::DebugRequest(r) => {
                // sfw_debug_session: whatever session the node is in, with its id (the console
                // compares it with its own); ESRCH only without one.
                self.sid_ok(r.sid, now);
                let status = if self.session.is_some() {
                    0
                } else {
                    errno::ESRCH as u32
                };
                let s = self.session.as_ref();
                Some(
                    DebugReply {
                        status,
                        sid: our,
                        timeout: s.map_or(0, |s| s.timeout),
                        nbatch: s.map_or(0, |s| s.batches.len() as u32),
                        name: s.map_or(LstName::EMPTY, |s| s.name),
                    }
                    .into(),
                )
            }
            SrpcBody::StatRequest(r) => {
                let status = if self.sid_ok(r.sid, now) {
                    0
                } else {
                    errno::ESRCH as u32
                };
                let (fw, rpc) = self.counters(now);
                if from == self.srpc.own() {
                    // Taken with the counters, on this thread: exact for this answer.
                    self.own_stat_console_rpcs = self.srpc.console_sent;
                }
                Some(
                    StatReply {
                        status,
                        sid: our,
                        fw,
                        rpc,
                        lnet: lnet_counters(node),
                    }
                    .into(),
                )
            }
            SrpcBody::BatchRequest(r) => Some(self.batch(now, node, r).into()),
            SrpcBody::TestRequest(r) => self.add_test(now, node, reg, &inc, r),
            SrpcBody::PingRequest(r) => {
                let status = if r.magic == LST_PING_TEST_MAGIC {
                    0
                } else {
                    errno::EINVAL as u32
                };
                Some(
                    PingReply {
                        status,
                        magic: LST_PING_TEST_MAGIC,
                        seq: r.seq,
                    }
                    .into(),
                )
            }
            SrpcBody::BrwRequest(_) => {
                self.brw_serve(now, node, reg, inc);
                None
            }
            // JOIN is not served (no kernel console sends it); replies never come as requests.
            _ => {
                self.srpc.counters.rpcs_dropped += 1;
                None
            }
        };
        if let Some(b) = body {
            // Framework replies carry the session's features, test replies the request's
            // (sfw_handle_server_rpc, srpc_send_reply).
            let features = match (&b, &self.session) {
                (SrpcBody::PingReply(_) | SrpcBody::BrwReply(_), _) | (_, None) => req_features,
                (_, Some(s)) => s.features,
            };
            self.srpc.reply(now, node, from, rpyid, b, features);
        }
    }

    /// The session id a framework request names is ours; a good one keeps the session alive.
    fn sid_ok(&mut self, sid: LstSid, now: Instant) -> bool {
        match &mut self.session {
            Some(s) if s.sid == sid => {
                if s.timeout > 0 {
                    s.expires = Some(now.saturating_add(Duration::from_secs(u64::from(s.timeout))));
                }
                true
            }
            _ => false,
        }
    }

    fn make_session(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        reg: &mut dyn Registry,
        inc: &Incoming,
        r: MakeSessionRequest,
    ) -> SrpcBody {
        let reply = |status, s: Option<&Session>| -> SrpcBody {
            MakeSessionReply {
                status,
                sid: s.map_or(LstSid::NONE, |s| s.sid),
                timeout: s.map_or(0, |s| s.timeout),
                name: s.map_or(LstName::EMPTY, |s| s.name),
            }
            .into()
        };
        if inc.msg.features & !LST_FEATS_MASK != 0 {
            return reply(errno::EPROTO as u32, self.session.as_ref());
        }
        if self.sid_ok(r.sid, now) {
            return reply(0, self.session.as_ref());
        }
        if self.session.is_some() && r.force == 0 {
            return reply(errno::EBUSY as u32, self.session.as_ref());
        }
        if self.session.is_some() {
            tracing::info!(console = %r.sid.nid, "selftest session taken over (forced)");
            self.end_session(now, node, reg);
        }
        // A node ends a session its console has not touched for this long (lnet_selftest's
        // session_timeout, 100 s); our console pings every 8 s.
        let timeout = SESSION_TIMEOUT;
        self.session = Some(Session {
            sid: r.sid,
            name: r.name,
            timeout,
            features: inc.msg.features,
            started: now,
            expires: Some(now.saturating_add(Duration::from_secs(u64::from(timeout)))),
            batches: HashMap::new(),
        });
        self.latency = Latency::new();
        tracing::info!(console = %r.sid.nid, name = %r.name.to_string_lossy(), "selftest session made");
        reply(0, self.session.as_ref())
    }

    /// Ends the session: its tests stop, their RPCs are aborted, their buffers go once those
    /// are back, and idle buffers are deregistered.
    fn end_session(&mut self, now: Instant, node: &mut LnetNode, reg: &mut dyn Registry) {
        if self.session.take().is_none() {
            return;
        }
        for t in self.tests.values_mut() {
            t.running = false;
            t.dead = true;
        }
        self.srpc.abort(node, |o| matches!(o, Owner::Unit { .. }));
        // brw requests still waiting for a buffer: answered (no session to serve them in).
        for inc in std::mem::take(&mut self.waiting) {
            let body = BrwReply {
                status: errno::ESRCH as u32,
            }
            .into();
            let features = inc.msg.features;
            self.srpc
                .reply(now, node, inc.from, inc.rpyid, body, features);
        }
        let keys: Vec<u64> = self.tests.keys().copied().collect();
        for k in keys {
            self.reap(k);
        }
        self.srpc.buffers.trim(reg);
    }

    /// Without a session, deregisters the buffers given back since it ended (the aborted RPCs
    /// of its tests and its server ops come back after `end_session` trimmed).
    fn trim_if_idle(&mut self, reg: &mut dyn Registry) {
        if self.session.is_none() {
            self.srpc.buffers.trim(reg);
        }
    }

    /// Removes a dead test whose RPCs are all back, giving its buffers back.
    fn reap(&mut self, key: u64) {
        let gone = self
            .tests
            .get(&key)
            .is_some_and(|t| t.dead && t.in_flight() == 0);
        if gone {
            if let Some(t) = self.tests.remove(&key) {
                for u in t.units {
                    if let Some(s) = u.slot {
                        self.srpc.buffers.give(s);
                    }
                }
            }
        }
    }

    fn batch(&mut self, now: Instant, node: &mut LnetNode, r: BatchRequest) -> BatchReply {
        let sid = self.session.as_ref().map_or(LstSid::NONE, |s| s.sid);
        let reply = |status, active| BatchReply {
            status,
            sid,
            active,
            time: 0,
        };
        if !self.sid_ok(r.sid, now) {
            return reply(errno::ESRCH as u32, 0);
        }
        let Some(keys) = self
            .session
            .as_ref()
            .and_then(|s| s.batches.get(&r.bid))
            .cloned()
        else {
            return reply(errno::ENOENT as u32, 0);
        };
        match r.opc {
            SRPC_BATCH_OPC_RUN => {
                // sfw_run_batch: running a batch that runs is no error, and changes nothing.
                if keys
                    .iter()
                    .any(|k| self.tests.get(k).is_some_and(|t| t.active()))
                {
                    return reply(0, 0);
                }
                for k in &keys {
                    self.start_test(now, node, *k);
                }
                reply(0, 0)
            }
            SRPC_BATCH_OPC_STOP => {
                for k in &keys {
                    if let Some(t) = self.tests.get_mut(k) {
                        t.running = false;
                    }
                }
                if r.arg != 0 {
                    let ks = keys.clone();
                    self.srpc.abort(
                        node,
                        |o| matches!(o, Owner::Unit { test, .. } if ks.contains(&test)),
                    );
                }
                reply(0, 0)
            }
            SRPC_BATCH_OPC_QUERY => {
                if r.testidx == 0 {
                    let active = keys
                        .iter()
                        .filter(|k| self.tests.get(k).is_some_and(|t| t.active()))
                        .count() as u32;
                    return reply(0, active);
                }
                match keys
                    .get(r.testidx as usize - 1)
                    .and_then(|k| self.tests.get(k))
                {
                    Some(t) => reply(0, u32::from(t.active())),
                    None => reply(errno::ENOENT as u32, 0),
                }
            }
            _ => reply(errno::EINVAL as u32, 0),
        }
    }

    /// A TEST request: checked; a client side GETs its destinations from the console first.
    fn add_test(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        reg: &mut dyn Registry,
        inc: &Incoming,
        r: TestRequest,
    ) -> Option<SrpcBody> {
        let sid = self.session.as_ref().map_or(LstSid::NONE, |s| s.sid);
        let reply = |status| -> Option<SrpcBody> { Some(TestReply { status, sid }.into()) };
        if !self.sid_ok(r.sid, now) {
            return reply(errno::ESRCH as u32);
        }
        let features = self.session.as_ref().map_or(0, |s| s.features);
        if inc.msg.features != features {
            return reply(errno::EPROTO as u32);
        }
        let busy = self
            .session
            .as_ref()
            .and_then(|s| s.batches.get(&r.bid))
            .is_some_and(|keys| {
                keys.iter()
                    .any(|k| self.tests.get(k).is_some_and(|t| t.active()))
            });
        if busy {
            return reply(errno::EBUSY as u32);
        }
        if test_kind(&r.params).is_none() || r.concur == 0 || r.concur > LST_MAX_CONCUR {
            return reply(errno::EINVAL as u32);
        }
        if !r.is_client {
            // The server side needs nothing ahead: brw buffers are taken per request.
            if let Some(s) = self.session.as_mut() {
                s.batches.entry(r.bid).or_default();
            }
            return reply(0);
        }
        if r.ndest == 0 || r.ndest as usize > SFW_MAX_NDESTS_4K || r.loop_count == 0 {
            return reply(errno::EINVAL as u32);
        }
        if u64::from(r.ndest) * u64::from(r.concur) > MAX_UNITS {
            return reply(errno::ENOMEM as u32);
        }
        let len = dest_ids_len(r.ndest as usize, PAGE_SIZE_4K, features);
        if len > LNET_MTU as usize {
            return reply(errno::EINVAL as u32);
        }
        let slot = match self.srpc.buffers.take(reg, len) {
            Ok(s) => s,
            Err(_) => return reply(errno::ENOMEM as u32),
        };
        let Some(span) = self.srpc.buffers.span(slot, 0, len) else {
            self.srpc.buffers.give(slot);
            return reply(errno::ENOMEM as u32);
        };
        let op = self.fresh_key();
        match self
            .srpc
            .server_bulk(now, node, inc.from, inc.bulkid, span, BulkDir::Source, op)
        {
            Ok(()) => {
                self.ops.insert(
                    op,
                    ServerOp::DestList {
                        from: inc.from,
                        rpyid: inc.rpyid,
                        slot,
                        req: r,
                        features,
                        order: inc.order,
                    },
                );
                None
            }
            Err(_) => {
                self.srpc.buffers.give(slot);
                reply(errno::EIO as u32)
            }
        }
    }

    fn fresh_key(&mut self) -> u64 {
        self.next_key += 1;
        self.next_key
    }

    fn brw_serve(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        reg: &mut dyn Registry,
        inc: Incoming,
    ) {
        let SrpcBody::BrwRequest(r) = inc.msg.body else {
            return;
        };
        let req_features = inc.msg.features;
        let fail = |me: &mut Selftest, node: &mut LnetNode, status| {
            let body = BrwReply { status }.into();
            me.srpc
                .reply(now, node, inc.from, inc.rpyid, body, req_features);
        };
        let Some(features) = self.session.as_ref().map(|s| s.features) else {
            return fail(self, node, errno::ESRCH as u32);
        };
        if inc.msg.features != features {
            return fail(self, node, errno::EPROTO as u32);
        }
        let (Some(op), Some(check)) = (r.op(), r.check()) else {
            return fail(self, node, errno::EINVAL as u32);
        };
        // brw_len is bytes with or without LST_FEAT_BULK_LEN; without it, whole pages
        // (brw_client_prep_rpc, brw_server_handle).
        let len = r.len as usize;
        if features & LST_FEAT_BULK_LEN == 0 && len % PAGE_SIZE_4K != 0 {
            return fail(self, node, errno::EINVAL as u32);
        }
        if len == 0 || len > LNET_MTU as usize {
            return fail(self, node, errno::EINVAL as u32);
        }
        let slot = match self.srpc.buffers.take(reg, SERVER_BUF) {
            Ok(s) => s,
            Err(BufferError::Limit { .. })
                if self.waiting.len() < MAX_WAITING
                    && self.ops.values().any(|o| matches!(o, ServerOp::Brw { .. })) =>
            {
                // Every server buffer is in use: the request waits for the next one a brw
                // op in flight gives back (a stranger cannot queue without bound).
                self.waiting.push_back(inc);
                return;
            }
            // No buffer will come back (the limit is held by other buffers, or the fabric
            // registers nothing): answered now rather than left to the client's timeout.
            Err(_) => return fail(self, node, errno::ENOMEM as u32),
        };
        let Some(span) = self.srpc.buffers.span(slot, 0, len) else {
            self.srpc.buffers.give(slot);
            return fail(self, node, errno::ENOMEM as u32);
        };
        // A server lays its buffer out from offset 0 (brw_server_handle).
        let magic = if op == BrwOp::Read {
            BRW_MAGIC
        } else {
            BRW_POISON
        };
        if check != BrwCheck::None && check != BrwCheck::Discard {
            let _ = self.srpc.buffers.with(slot, |b| {
                pattern::fill(
                    &mut b[..len],
                    0,
                    PAGE_SIZE_4K,
                    check,
                    magic,
                    ByteOrder::Little,
                )
            });
        }
        let key = self.fresh_key();
        let dir = if op == BrwOp::Read {
            BulkDir::Sink
        } else {
            BulkDir::Source
        };
        match self
            .srpc
            .server_bulk(now, node, inc.from, inc.bulkid, span, dir, key)
        {
            Ok(()) => {
                self.ops.insert(
                    key,
                    ServerOp::Brw {
                        from: inc.from,
                        rpyid: inc.rpyid,
                        slot,
                        op,
                        check,
                        len: len as u32,
                        order: inc.order,
                        features: req_features,
                    },
                );
            }
            Err(_) => {
                self.srpc.buffers.give(slot);
                fail(self, node, errno::EIO as u32);
            }
        }
    }

    /// Serves the brw requests waiting for a buffer, until one has to wait again.
    fn serve_waiting(&mut self, now: Instant, node: &mut LnetNode, reg: &mut dyn Registry) {
        while let Some(next) = self.waiting.pop_front() {
            let before = self.waiting.len();
            self.brw_serve(now, node, reg, next);
            if self.waiting.len() > before {
                break;
            }
        }
    }

    fn server_bulk_done(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        reg: &mut dyn Registry,
        key: u64,
        result: Result<u32, crate::LnetError>,
    ) {
        let Some(op) = self.ops.remove(&key) else {
            return;
        };
        match op {
            ServerOp::Brw {
                from,
                rpyid,
                slot,
                op,
                check,
                len,
                order,
                features,
            } => {
                let status = match (&result, op) {
                    (Err(e), _) => {
                        tracing::debug!(%from, %e, "brw bulk failed");
                        errno::EIO as u32
                    }
                    (Ok(n), BrwOp::Write) if *n != len => errno::EBADMSG as u32,
                    (Ok(_), BrwOp::Write) => {
                        let ok = self.srpc.buffers.with(slot, |b| {
                            pattern::check(
                                &b[..len as usize],
                                0,
                                PAGE_SIZE_4K,
                                check,
                                BRW_MAGIC,
                                order,
                            )
                        });
                        if matches!(ok, Some(Ok(()))) {
                            0
                        } else {
                            errno::EBADMSG as u32
                        }
                    }
                    (Ok(_), BrwOp::Read) => 0,
                };
                self.srpc.buffers.give(slot);
                let body = BrwReply { status }.into();
                self.srpc.reply(now, node, from, rpyid, body, features);
                self.serve_waiting(now, node, reg);
                self.trim_if_idle(reg);
            }
            ServerOp::DestList {
                from,
                rpyid,
                slot,
                req,
                features,
                order,
            } => {
                let sid = self.session.as_ref().map_or(LstSid::NONE, |s| s.sid);
                let dests = match result {
                    Ok(_) => self
                        .srpc
                        .buffers
                        .with(slot, |b| {
                            parse_dest_ids(b, req.ndest as usize, PAGE_SIZE_4K, order)
                        })
                        .and_then(|r| r.ok()),
                    Err(_) => None,
                };
                self.srpc.buffers.give(slot);
                self.trim_if_idle(reg);
                let status = match dests {
                    None => errno::EIO as u32,
                    Some(_) if self.session.as_ref().map(|s| s.sid) != Some(req.sid) => {
                        errno::ESRCH as u32
                    }
                    Some(d) => self.create_test(reg, req, features, &d),
                };
                let body = TestReply { status, sid }.into();
                self.srpc.reply(now, node, from, rpyid, body, features);
            }
        }
    }

    /// Makes a client test instance of `req` with destinations `dests` in its batch; its
    /// units get their buffers now, so that a run never fails for memory.
    fn create_test(
        &mut self,
        reg: &mut dyn Registry,
        req: TestRequest,
        features: u32,
        dests: &[ProcessId],
    ) -> u32 {
        let Some(kind) = test_kind(&req.params) else {
            return errno::EINVAL as u32;
        };
        let mut units = Vec::new();
        for d in dests {
            for _ in 0..req.concur {
                units.push(Unit {
                    dest: d.nid,
                    left: None,
                    rpc: None,
                    slot: None,
                });
            }
        }
        if let TestKind::Brw { len, off, .. } = kind {
            let need = (off + len) as usize;
            for i in 0..units.len() {
                match self.srpc.buffers.take(reg, need) {
                    Ok(s) => units[i].slot = Some(s),
                    Err(_) => {
                        for u in &units {
                            if let Some(s) = u.slot {
                                self.srpc.buffers.give(s);
                            }
                        }
                        return errno::ENOMEM as u32;
                    }
                }
            }
        }
        // tsr_loop: -1 (all ones) is "until stopped" (0 was refused).
        let loop_count = match req.loop_count {
            u32::MAX => None,
            n => Some(u64::from(n)),
        };
        let key = self.fresh_key();
        self.tests.insert(
            key,
            TestInstance {
                kind,
                features,
                stop_onerr: req.stop_onerr,
                units,
                loop_count,
                running: false,
                dead: false,
                errors: 0,
            },
        );
        if let Some(s) = self.session.as_mut() {
            s.batches.entry(req.bid).or_default().push(key);
        }
        0
    }
}

/// What a test request's parameters ask for; `None` if this node does not do that.
fn test_kind(p: &TestParams) -> Option<TestKind> {
    match *p {
        TestParams::Ping { .. } => Some(TestKind::Ping),
        TestParams::BulkV0 { opc, npg, flags } => {
            let len = npg.checked_mul(PAGE_SIZE_4K as u32)?;
            brw_kind(opc, flags, len, 0)
        }
        TestParams::BulkV1 {
            opc,
            flags,
            len,
            offset,
        } => brw_kind(u32::from(opc), u32::from(flags), len, offset),
        TestParams::Other { .. } => None,
    }
}

fn brw_kind(opc: u32, flags: u32, len: u32, off: u32) -> Option<TestKind> {
    let op = BrwOp::from_u32(opc)?;
    let check = BrwCheck::from_u32(flags)?;
    let ok = len > 0 && len <= LNET_MTU && off % 8 == 0 && (off as usize) < PAGE_SIZE_4K;
    ok.then_some(TestKind::Brw {
        op,
        check,
        len,
        off,
    })
}

/// The node's LNet counters in the 32-bit form a stat reply carries (they wrap, as Lustre's
/// do on the wire).
fn lnet_counters(node: &LnetNode) -> LnetCounters {
    let s = node.stats();
    LnetCounters {
        msgs_alloc: s.msgs_alloc as u32,
        msgs_max: s.msgs_max as u32,
        errors: s.errors as u32,
        send_count: s.send_count as u32,
        recv_count: s.recv_count as u32,
        route_count: s.route_count as u32,
        drop_count: s.drop_count as u32,
        send_length: s.send_length,
        recv_length: s.recv_length,
        route_length: s.route_length,
        drop_length: s.drop_length,
    }
}
