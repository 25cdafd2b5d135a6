//! One NI's loop ([`NiLoop`]): its runtime's turns, the NI set's changes it adopts, the router
//! buffers for bulk data it registers, its control requests, its bounded graceful shutdown; on
//! a thread of its own, or with every other NI on one ([`run_shared`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use crate::bulk_pool::{BulkPlan, LoopId};
use crate::control::{Control, Request, Response};
use crate::runtime::{shared_round, NiRuntime, SharedLoop};
use crate::yaml_config::FabricKind;
use crate::BufferCounts;
use lnd::driver::LndDriver;
use lnd::time::Duration;
use lnd::wire::Nid;
use tracing::{debug, error, warn};

use super::capture::LoopCapture;
use super::events::{drain_events, PeerLog};
use super::handovers::Handovers;
use super::metrics::snapshot::LoopMetrics;
use super::selftest::NiSelftest;
use super::state::{
    lock, shutting_down, ControlMsg, Daemon, Members, NodeSettings, ADOPT_BOUND, MAX_WAIT,
    SHUTDOWN_BOUND,
};

/// How often a loop whose node has router buffers still to give back looks for them.
pub(super) const RELEASE_CHECK: StdDuration = StdDuration::from_millis(50);

/// One NI's loop: its runtime's turns, its control requests, its capture, until a stop and a
/// finished (bounded) graceful shutdown. It runs on a thread of its own ([`NiLoop::run`]) or
/// beside other NIs' loops on one thread ([`run_shared`]).
pub(super) struct NiLoop {
    pub(super) nid: Nid,
    pub(super) rt: NiRuntime<Box<dyn LndDriver + Send>>,
    pub(super) kind: FabricKind,
    pub(super) control: Control<SyncSender<Response>>,
    pub(super) req_rx: Receiver<ControlMsg>,
    pub(super) hands: Handovers,
    pub(super) daemon: Arc<Daemon>,
    /// The [`NiSet`](super::state::NiSet) epoch this loop last adopted (the daemon reads it:
    /// [`Member::adopted`](super::state::Member::adopted)).
    pub(super) adopted: Arc<AtomicU64>,
    /// [`Member::running`](super::state::Member::running): cleared when this loop ends.
    pub(super) running: Arc<AtomicBool>,
    /// The node-wide settings last applied, and the NI count its buffer share was for.
    pub(super) applied: Option<(Arc<NodeSettings>, usize)>,
    /// This NI alone is to stop (`net del`).
    pub(super) stop: Arc<AtomicBool>,
    /// The epoch that removed this NI, once it noticed: it ends only after every other loop
    /// has adopted it, so that none can hand it anything it would not answer.
    pub(super) removed_at: Option<u64>,
    pub(super) shutdown_deadline: Option<lnd::time::Instant>,
    pub(super) failed: bool,
    pub(super) capture: LoopCapture,
    pub(super) lst: NiSelftest,
    pub(super) peer_log: PeerLog,
    pub(super) bulk: LoopBulk,
    /// Its counters for the metrics endpoint, copied at most once a second.
    pub(super) metrics: LoopMetrics,
}

/// One NI loop's side of the router buffers for bulk data (`crate::bulk_pool`): its fabric's
/// registrations of them, and the plan it last took.
pub(super) struct LoopBulk {
    pub(super) id: LoopId,
    pub(super) regs: HashMap<usize, lnd::fabric::Registration>,
    pub(super) views: HashMap<usize, crate::BulkRegion>,
    pub(super) plan: Option<Arc<BulkPlan>>,
    /// The table revision last handed to the node.
    pub(super) rev: Option<u64>,
    /// The plan generation at which a registration failed: not tried again before the next
    /// change (a failing registration is not retried every round).
    pub(super) failed_gen: Option<u64>,
    pub(super) next_release_check: std::time::Instant,
}

impl LoopBulk {
    pub(super) fn new(id: LoopId) -> LoopBulk {
        LoopBulk {
            id,
            regs: HashMap::new(),
            views: HashMap::new(),
            plan: None,
            rev: None,
            failed_gen: None,
            next_release_check: std::time::Instant::now(),
        }
    }
}

/// Ends an NI loop's run, however it ends: its member no longer counts as running, and a
/// panic stops the daemon (every other NI closes gracefully) rather than leave a dead NI
/// in the tables.
pub(super) struct LoopEnd {
    pub(super) nid: Nid,
    pub(super) running: Arc<AtomicBool>,
    pub(super) daemon: Arc<Daemon>,
}

impl Drop for LoopEnd {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Release);
        if std::thread::panicking() {
            self.daemon
                .shared
                .fail(format!("the thread of NI {} panicked", self.nid));
            self.daemon.wake_all();
        }
    }
}

impl NiLoop {
    pub(super) fn run(mut self) {
        let _end = LoopEnd {
            nid: self.nid,
            running: Arc::clone(&self.running),
            daemon: Arc::clone(&self.daemon),
        };
        while !self.step(MAX_WAIT) {}
    }

    /// Takes the NIs and the node-wide settings as they are now, if they changed since.
    pub(super) fn adopt(&mut self) {
        let epoch = self.daemon.set.epoch.load(Ordering::Acquire);
        if epoch == self.adopted.load(Ordering::Relaxed) {
            return;
        }
        let m = self.daemon.set.snapshot();
        self.rt.node_mut().set_node_nids(m.nids(), m.board.clone());
        self.apply_settings(&m);
        self.adopt_bulk(&m);
        let e = m.epoch;
        self.hands.adopt(m);
        self.adopted.store(e, Ordering::Release);
    }

    /// Takes the bulk buffers' plan of `m`: registers with this NI's fabric every buffer it
    /// lists (not when this NI is leaving), deregisters the ones it retired, tells the pool,
    /// and gives the node the table and its share when they changed. A registration that
    /// fails: one warning, and this NI stays out of the table (bulk through it is refused as
    /// `no_bulk_buffer`) until the next change tries again.
    pub(super) fn adopt_bulk(&mut self, m: &Members) {
        let plan = &m.bulk;
        let b = &mut self.bulk;
        if b.plan.as_ref().is_some_and(|p| Arc::ptr_eq(p, plan)) {
            return;
        }
        b.plan = Some(Arc::clone(plan));
        let member = m.list.iter().any(|x| x.id == b.id);
        let live: std::collections::HashSet<usize> = plan.slots.iter().map(|(k, _)| *k).collect();
        let mut changed = false;
        let retired: Vec<usize> = b
            .regs
            .keys()
            .copied()
            .filter(|k| !live.contains(k))
            .collect();
        for k in retired {
            if let (Some(reg), Some(r)) = (b.regs.remove(&k), self.rt.driver_mut().registry()) {
                r.deregister(reg);
            }
            b.views.remove(&k);
            changed = true;
        }
        if member && b.failed_gen != Some(plan.gen) {
            changed |= b.failed_gen.take().is_some();
            for (k, mem) in &plan.slots {
                if b.regs.contains_key(k) {
                    continue;
                }
                let reg = match self.rt.driver_mut().registry() {
                    Some(r) => r.register_shared(mem),
                    None => Err(std::io::Error::other("this fabric registers no memory")),
                };
                changed = true;
                match reg {
                    Ok(reg) => {
                        b.views.insert(*k, crate::BulkRegion::of(&reg));
                        b.regs.insert(*k, reg);
                    }
                    Err(e) => {
                        warn!(
                            nid = %self.nid,
                            registered = b.regs.len(),
                            wanted = plan.slots.len(),
                            "cannot register the router buffers for bulk data ({e}): bulk PUTs \
                             forwarded through this NI are refused (no_bulk_buffer)"
                        );
                        b.failed_gen = Some(plan.gen);
                        break;
                    }
                }
            }
        }
        if changed {
            lock(&self.daemon.bulk).set_registered(b.id, b.views.clone(), b.failed_gen.is_some());
        }
        if b.rev != Some(plan.rev) {
            b.rev = Some(plan.rev);
            let owned = match member {
                true => plan.owned.get(&b.id).cloned().unwrap_or_default(),
                false => Vec::new(),
            };
            let now = self.rt.now();
            self.rt
                .node_mut()
                .set_bulk_buffers(now, Arc::clone(&plan.table), owned);
            self.report_released();
        }
    }

    /// Hands the pool the router buffers the node let go since the last look.
    pub(super) fn report_released(&mut self) {
        let ks = self.rt.node_mut().take_released_bulk();
        if !ks.is_empty() {
            lock(&self.daemon.bulk).release(self.bulk.id, &ks);
        }
    }

    /// The loop is ending: the buffers its node lends go back to the pool, but the ones a
    /// forward still holds (it may still be written on from them by another NI) are never lent
    /// again.
    pub(super) fn end_bulk(&mut self) {
        if let Some(plan) = self.bulk.plan.clone() {
            let now = self.rt.now();
            self.rt
                .node_mut()
                .set_bulk_buffers(now, Arc::clone(&plan.table), Vec::new());
        }
        self.report_released();
        let held = self.rt.node().bulk_held();
        let stranded = lock(&self.daemon.bulk).end(self.bulk.id, &held);
        if stranded > 0 {
            warn!(nid = %self.nid, stranded, "router buffers for bulk data still held by forwards when this NI ended: not lent again");
        }
    }

    /// Takes the node-wide settings of `m` (what changed since the last ones): the route
    /// table, the globals, routing on or off, and this NI's share of the router buffers.
    pub(super) fn apply_settings(&mut self, m: &Members) {
        let n = m.list.len().max(1);
        let s = &m.settings;
        let before = self.applied.take();
        let unchanged = before
            .as_ref()
            .is_some_and(|(a, count)| (Arc::ptr_eq(a, s) || **a == **s) && *count == n);
        self.applied = Some((Arc::clone(s), n));
        if unchanged {
            return;
        }
        let now = self.rt.now();
        let node = self.rt.node_mut();
        if !node.routes().routes().copied().eq(s.routes.iter().copied()) {
            let mut table = crate::RouteTable::default();
            for r in &s.routes {
                // Checked by the template against the same NIDs.
                if let Err(e) = table.add(*r, node.node_nids()) {
                    warn!(net = %r.net, gateway = %r.gateway, "route not taken: {e}");
                }
            }
            node.set_routes(now, table);
        }
        node.adopt_globals(s.globals.clone());
        node.set_routing(now, s.routing);
        if node.gateway_health() != s.gateway_health {
            node.set_gateway_health(now, s.gateway_health);
        }
        let share = s.buffers.share(n);
        let had = before.map(|(a, count)| a.buffers.share(count));
        let has = node.routing_info().buffers();
        for (class, pick) in [
            (
                crate::PoolClass::Tiny,
                (|b| b.tiny) as fn(BufferCounts) -> u32,
            ),
            (crate::PoolClass::Small, |b| b.small),
            (crate::PoolClass::Large, |b| b.large),
        ] {
            let want = pick(share);
            // Only a change of the share: a large pool capped at its registered buffers is
            // not asked again every time.
            if had.map(pick) != Some(want) && pick(has) != want {
                node.set_buffers(now, class, want);
            }
        }
    }

    /// One turn (waiting at most `wait`) and what follows it: handovers, events, control
    /// requests, the capture, the shutdown. True once this loop is finished.
    pub(super) fn step(&mut self, wait: StdDuration) -> bool {
        // An NI added or removed, or a node-wide setting changed: adopt them as they are now.
        self.adopt();
        // Handovers from the other NIs first, so that what they produce (a forward's send) goes
        // out in this turn's submission rather than a turn later; and out, what the last step
        // produced after its relay (a selftest's answer to a sibling NI, made from the events
        // or timers that step handled), which else waited for whatever woke this loop next
        // (RPCs between two NIs of a daemon took 20-40 ms).
        self.hands.relay(&mut self.rt);
        if !self.failed {
            let wait = self.lst.bound(wait, &self.rt);
            if let Err(e) = self.rt.turn(wait) {
                self.fabric_failed(&e.to_string());
            }
        } else {
            std::thread::sleep(wait);
        }
        // A change published during the turn is taken before the requests are answered (a
        // `route show` right after a `route add` sees it).
        self.adopt();
        if self.rt.node().bulk_leaving() {
            let now = std::time::Instant::now();
            if now >= self.bulk.next_release_check {
                self.bulk.next_release_check = now + RELEASE_CHECK;
                self.report_released();
            }
        }
        self.hands.relay(&mut self.rt);
        self.drain_events();
        self.lst.tick(&mut self.rt);
        self.serve_requests();
        self.metrics.maybe_publish(&self.rt, self.kind.as_str());
        // The clock only for what needs it: a loop comes here every turn.
        if self.capture.active() {
            let now = self.rt.now();
            self.capture.step(self.rt.node_mut(), now);
        }
        self.shutdown_step()
    }

    /// This NI's fabric failed (`e`). The daemon stops only when this was its last working
    /// NI: one published (not being added or removed) and no other NI of the set still has
    /// its fabric.
    fn fabric_failed(&mut self, e: &str) {
        let nid = self.nid;
        let m = self.daemon.set.snapshot();
        let published = m.list.iter().any(|x| x.nid == nid);
        let others = m
            .list
            .iter()
            .enumerate()
            .any(|(i, x)| x.nid != nid && !m.board.failed(i));
        if others || !published {
            // The NI is down (its siblings' ping replies say so, as Lustre reports an
            // NI with a fatal HCA error), what it held fails, and the daemon's other
            // NIs go on.
            error!(%nid, "fabric failed: {e}; this NI is down, the other NIs go on (net del and net add it to start it again)");
            self.rt.lose_fabric();
        } else {
            // The daemon's only NI: its peers must still see a graceful close of
            // anything left (not find out at their keepalive horizon), so it shuts
            // down as on SIGTERM, then the daemon exits with the error.
            error!(%nid, "fabric failed: {e}; closing every other connection");
            self.failed = true;
            self.daemon.shared.fail(format!("fabric of NI {nid}: {e}"));
            self.daemon.wake_all();
        }
    }

    /// The node's events: to the selftest, the log and the control requests waiting on them.
    fn drain_events(&mut self) {
        drain_events(
            &mut self.rt,
            &mut self.control,
            &mut self.lst,
            &mut self.peer_log,
        );
    }

    /// Answers the control requests queued for this loop: the capture's and the selftest's
    /// here, the rest by the node's control service ([`Control::handle`]).
    fn serve_requests(&mut self) {
        let mut refreshed = false;
        while let Ok((req, reply)) = self.req_rx.try_recv() {
            debug!(?req, "control request");
            if !refreshed {
                let counters = self.rt.driver().counters();
                self.control
                    .set_fabric_counters(0, self.kind.as_str(), counters);
                refreshed = true;
            }
            let now = self.rt.now();
            let shutting = self.shutdown_deadline.is_some();
            match req {
                Request::CaptureStart { duration_secs } => {
                    let node = self.rt.node_mut();
                    let resp = self
                        .capture
                        .start(node, now, duration_secs, &reply, shutting);
                    let _ = reply.try_send(resp);
                }
                Request::CaptureStop { id } => {
                    let resp = self.capture.stop(self.rt.node_mut(), id);
                    let _ = reply.try_send(resp);
                }
                Request::Selftest { .. } if shutting => {
                    let _ = reply.try_send(shutting_down());
                }
                Request::Selftest { cmd } => self.lst.command(&mut self.rt, cmd, reply),
                req => {
                    if matches!(req, Request::StatsReset) {
                        // The exported totals carry what the reset clears.
                        self.metrics.before_stats_reset(self.rt.node());
                    }
                    let node = self.rt.node_mut();
                    if let Some((reply, resp)) = self.control.handle(now, node, req, reply) {
                        let _ = reply.try_send(resp);
                    }
                }
            }
            self.drain_events();
        }
    }

    /// The stop (the daemon's, or this NI's alone: `net del`): starts the node's graceful
    /// shutdown, then ends the loop once it finished or its bound passed. True once ended.
    fn shutdown_step(&mut self) -> bool {
        if self.removed_at.is_none() && self.stop.load(Ordering::Acquire) {
            // `net del` published the set without this NI before it asked it to stop.
            self.removed_at = Some(self.daemon.set.epoch.load(Ordering::Acquire));
        }
        if self.shutdown_deadline.is_none()
            && (self.daemon.shared.stop.load(Ordering::Relaxed) || self.removed_at.is_some())
        {
            let now = self.rt.now();
            self.rt.node_mut().shutdown(now);
            self.shutdown_deadline = Some(now.saturating_add(SHUTDOWN_BOUND));
        }
        let Some(deadline) = self.shutdown_deadline else {
            return false;
        };
        let now = self.rt.now();
        if !self.rt.node().is_shut_down() && now < deadline {
            return false;
        }
        // Removed alone (`net del`): not before every other loop has stopped handing this one
        // work (bounded: a loop takes a change at its next turn).
        if let Some(removed) = self.removed_at {
            let others = self.daemon.set.snapshot();
            let pending = others
                .list
                .iter()
                .chain(&others.leaving)
                .any(|m| m.nid != self.nid && m.behind(removed));
            let bound =
                deadline.saturating_add(Duration::from_nanos(ADOPT_BOUND.as_nanos() as u64));
            if pending && now < bound && !self.daemon.shared.stop.load(Ordering::Relaxed) {
                return false;
            }
        }
        self.finish();
        true
    }

    /// The loop's end, its node shut down (or its bound passed): the last actions out, what
    /// it owes the other loops handed back, and every request still waiting answered.
    fn finish(&mut self) {
        let node = self.rt.node_mut();
        if !node.is_shut_down() {
            warn!(
                nid = %self.nid,
                in_flight = node.messages_in_flight(),
                "graceful shutdown did not finish within {SHUTDOWN_BOUND:?}; exiting anyway"
            );
        }
        // The last actions (Destroys), and one more poll so they reach the wire.
        if !self.failed {
            self.rt.flush();
        }
        self.drain_events();
        // Whatever this runtime still sends for the other loops is failed back to them (their
        // router buffers and credits come back), as is what they handed it before they let it
        // go; then the last of it is handed out before the channel closes (bounded: a full
        // channel is retried, a loop that is gone takes nothing).
        if !self.rt.node().is_shut_down() {
            self.rt.node_mut().abandon_forwards();
        }
        let started = std::time::Instant::now();
        loop {
            self.hands.relay(&mut self.rt);
            if (self.hands.relay.waiting() == 0 && self.hands.rx.is_empty())
                || started.elapsed() >= ADOPT_BOUND
            {
                break;
            }
            std::thread::sleep(StdDuration::from_millis(1));
        }
        self.capture.end(self.rt.node_mut());
        // Requests still queued get an answer rather than a dropped channel.
        while let Ok((_, reply)) = self.req_rx.try_recv() {
            let _ = reply.try_send(shutting_down());
        }
        for (_, reply) in self.lst.pending.drain() {
            let _ = reply.try_send(shutting_down());
        }
        self.end_bulk();
    }
}

/// Every NI's loop on the calling thread (`--ni-threads shared`), in rounds of
/// [`crate::runtime::shared_round`]: the first loop sleeps, for as long as the least any loop
/// may (its own deadline, the others' deadlines and queued work, and not at all while a
/// handover waits for any loop), and its driver watches the others' readiness descriptors, so
/// that work for any NI ends the sleep; the others are polled without waiting. Messages
/// forwarded between NIs then never cross threads. Needs drivers that can be watched (tcp).
pub(super) fn run_shared(loops: Vec<NiLoop>) {
    let mut loops: Vec<SharedNi> = loops
        .into_iter()
        .map(|l| SharedNi { l, done: false })
        .collect();
    while loops.iter().any(|l| !l.done) {
        match shared_round(&mut loops, MAX_WAIT) {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }
    // Dropped together: a finished loop's ring stays open while another still watches it.
    drop(loops);
}

/// An NI loop in a shared thread's rounds: stepped until it has finished.
pub(super) struct SharedNi {
    pub(super) l: NiLoop,
    pub(super) done: bool,
}

impl SharedLoop for SharedNi {
    type Error = std::convert::Infallible;

    fn turn(&mut self, wait: StdDuration) -> Result<(), Self::Error> {
        self.done = self.l.step(wait);
        Ok(())
    }

    fn wait_hint(&mut self, max_wait: StdDuration) -> StdDuration {
        self.l.rt.wait_hint(max_wait)
    }

    /// Handovers waiting for this loop, not only the sleeper's: a loop stepped before the one
    /// that handed it something (three NIs or more) takes it only in the next round, which
    /// must not wait out the sleep (found in review: up to MAX_WAIT per forward).
    fn has_pending(&self) -> bool {
        !self.l.hands.rx.is_empty()
    }

    fn finished(&self) -> bool {
        self.done
    }
}
