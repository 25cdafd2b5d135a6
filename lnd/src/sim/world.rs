//! The world itself: building it, asking it, running it, and the plumbing every part shares
//! (the event queue, nodes going up and down, the upper layer of each node).

use super::*;
use crate::iface::Lnd;

impl World {
    /// An empty world of LND endpoints at `cfg.start`.
    pub fn new(cfg: SimConfig) -> World {
        World::hosting(cfg)
    }

    /// Node `n`'s endpoint, if it runs.
    pub fn endpoint(&self, n: NodeId) -> Option<&Endpoint> {
        self.node(n)
    }

    /// Node `n`'s endpoint, mutably. If you give it an input, call [`World::poll_node`] afterwards
    /// so its actions and events are processed (or use [`World::with_endpoint`], which does).
    pub fn endpoint_mut(&mut self, n: NodeId) -> Option<&mut Endpoint> {
        self.node_mut(n)
    }

    /// Runs `f` on node `n`'s endpoint with the current time, then processes whatever it produced.
    /// (To stop a node use [`World::shutdown`], which also retires the endpoint once it is shut
    /// down; `Endpoint::shutdown` called through here does not.)
    pub fn with_endpoint<R>(
        &mut self,
        n: NodeId,
        f: impl FnOnce(&mut Endpoint, Instant) -> R,
    ) -> Option<R> {
        self.with_node(n, f)
    }

    // ------------------------------------------------------------------ upper layer

    /// Node `from` sends an LNet message to `to` now. Returns the cookie under which its outcome
    /// is recorded; a refusal by `Endpoint::send` (or a node without endpoint) is recorded as the
    /// outcome at once.
    pub fn send(&mut self, from: NodeId, to: Nid, hdr: LnetHdr, payload: Vec<u8>) -> u64 {
        self.start_send(from, to, |ep, now, cookie| {
            ep.send(now, to, hdr, payload, cookie)
        })
    }

    /// Node `from` PUTs the registered fragments `src` to `to` by rendezvous
    /// (`Endpoint::send_put_rdma`); recorded as [`World::send`] records its messages. The sink's
    /// side is the test's to play: its `LndEvent::BulkRequest` is in [`World::node_events`].
    pub fn send_put_rdma(
        &mut self,
        from: NodeId,
        to: Nid,
        hdr: LnetHdr,
        src: Vec<crate::fabric::LocalFrag>,
    ) -> u64 {
        self.start_send(from, to, |ep, now, cookie| {
            ep.send_put_rdma(now, to, hdr, src, cookie)
        })
    }
}

impl<N: SimNode> World<N> {
    /// Records a send from `from` to `to` under a new cookie and starts it with `start`; a
    /// refusal (or a node without endpoint) is its outcome at once.
    pub(super) fn start_send(
        &mut self,
        from: NodeId,
        to: Nid,
        start: impl FnOnce(&mut N, Instant, u64) -> Result<(), SendError>,
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.stats.sends += 1;
        self.sends.insert(
            cookie,
            SendRecord {
                from,
                to,
                queued_at: self.now,
                done: None,
            },
        );
        self.pending_sends += 1;
        let now = self.now;
        let node = &mut self.nodes[from.idx()];
        let Some(ep) = node.ep.as_mut() else {
            self.finish_send(cookie, SendOutcome::NodeDown);
            return cookie;
        };
        trace!(at = %now, from = %node.nid, %to, cookie, "send");
        match start(ep, now, cookie) {
            Ok(()) => {
                node.pending.insert(cookie, ());
            }
            Err(e) => self.finish_send(cookie, SendOutcome::Refused(e)),
        }
        self.drain(from, false);
        cookie
    }

    // ------------------------------------------------------------------ construction, queries

    /// An empty world of `N` nodes at `cfg.start` (`World::new` for endpoints).
    pub fn hosting(cfg: SimConfig) -> World<N> {
        World {
            now: cfg.start,
            seq: 0,
            queue: BinaryHeap::new(),
            in_flight: 0,
            rng: SimRng::new(cfg.seed),
            nodes: Vec::new(),
            by_nid: FxMap::default(),
            ends: FxMap::default(),
            next_uid: 1,
            reqs: FxMap::default(),
            next_req: 1,
            cm_loss: 0.0,
            cm_delay: Duration::ZERO,
            partitions_used: 0,
            sends: FxMap::default(),
            next_cookie: 1,
            pending_sends: 0,
            next_region: 0,
            next_region_addr: REGION_BASE,
            next_rdma: 0,
            rdma: FxMap::default(),
            race_rejects: FxMap::default(),
            stats: SimStats::default(),
            streams: {
                let mut net = StreamNet::new(StreamNetConfig {
                    // Its own numbers, derived from the world's seed.
                    seed: cfg.seed ^ 0x5354_5245_414d_5321,
                    ..cfg.streams.clone()
                });
                net.set_now(cfg.start);
                net
            },
            host_nodes: Vec::new(),
            stream_cuts: FxMap::default(),
            delivering: false,
            cfg,
        }
    }

    /// Adds a node and starts it now. Connects to its NID are routed to it; a node with a
    /// stream address ([`SimNode::stream_addr`]) is a host of the stream network there.
    ///
    /// # Panics
    /// If another node already has that NID, or that stream address.
    pub fn add_node(&mut self, cfg: N::Config) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        let nid = N::config_nid(&cfg);
        let prev = self.by_nid.insert(nid, id);
        assert!(prev.is_none(), "two simulated nodes with NID {nid}");
        let host = N::stream_addr(&cfg).map(|ip| {
            assert!(
                self.streams.host_at(ip).is_none(),
                "two simulated stream hosts at {ip}"
            );
            let h = self.streams.add_host(ip);
            debug_assert_eq!(h.0 as usize, self.host_nodes.len());
            self.host_nodes.push(id);
            h
        });
        self.nodes.push(Node {
            cfg,
            nid,
            state: NodeState::Crashed,
            ep: None,
            epoch: 0,
            timer_at: None,
            ends: FxMap::default(),
            recv_delay: Duration::ZERO,
            stuck_prob: 0.0,
            stuck_next: Vec::new(),
            received: Vec::new(),
            received_count: 0,
            peer_events: Vec::new(),
            connects: Vec::new(),
            pending: FxMap::default(),
            part_a: 0,
            part_b: 0,
            leaked: 0,
            regions: FxMap::default(),
            rkeys: FxMap::default(),
            events: Vec::new(),
            host,
        });
        self.start_node(id);
        id
    }

    /// The simulator's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// Virtual now.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The world's RNG, for workloads that should derive from the same seed.
    pub fn rng(&mut self) -> &mut SimRng {
        &mut self.rng
    }

    /// Number of nodes ever added.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Every node id.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// The node that has `nid`.
    pub fn node_of(&self, nid: Nid) -> Option<NodeId> {
        self.by_nid.get(&nid).copied()
    }

    /// The NID of node `n`.
    pub fn nid_of(&self, n: NodeId) -> Nid {
        self.nodes[n.idx()].nid
    }

    /// Where node `n` is in its life.
    pub fn node_state(&self, n: NodeId) -> NodeState {
        self.nodes[n.idx()].state
    }

    /// Node `n`'s running instance, if it runs.
    pub fn node(&self, n: NodeId) -> Option<&N> {
        self.nodes.get(n.idx())?.ep.as_ref()
    }

    /// Node `n`'s running instance, mutably. If you give it an input, call [`World::poll_node`]
    /// afterwards so its actions and events are processed (or use [`World::with_node`], which
    /// does).
    pub fn node_mut(&mut self, n: NodeId) -> Option<&mut N> {
        self.nodes.get_mut(n.idx())?.ep.as_mut()
    }

    /// Runs `f` on node `n`'s running instance with the current time, then processes whatever it
    /// produced. (To stop a node use [`World::shutdown`], which also retires it once it is shut
    /// down; a shutdown called through here does not.)
    pub fn with_node<R>(&mut self, n: NodeId, f: impl FnOnce(&mut N, Instant) -> R) -> Option<R> {
        let now = self.now;
        let r = f(self.nodes.get_mut(n.idx())?.ep.as_mut()?, now);
        self.drain(n, false);
        Some(r)
    }

    /// Processes node `n`'s pending actions and events and re-arms its timer.
    pub fn poll_node(&mut self, n: NodeId) {
        self.drain(n, false);
    }

    /// Counters.
    pub fn stats(&self) -> &SimStats {
        &self.stats
    }

    /// Messages received by node `n`'s upper layer, in order (empty unless `keep_logs`).
    pub fn received(&self, n: NodeId) -> &[ReceivedMsg] {
        &self.nodes[n.idx()].received
    }

    /// How many messages node `n`'s upper layer received (kept even without `keep_logs`).
    pub fn received_count(&self, n: NodeId) -> u64 {
        self.nodes[n.idx()].received_count
    }

    /// Peer up/down events node `n`'s upper layer got, in order (empty unless `keep_logs`).
    pub fn peer_events(&self, n: NodeId) -> &[PeerEvent] {
        &self.nodes[n.idx()].peer_events
    }

    /// Node `n`'s events booked as [`Booking::Other`] (all its instances), with when, in order
    /// (empty unless `keep_logs`; an endpoint has none).
    pub fn node_events(&self, n: NodeId) -> &[(Instant, N::Event)] {
        &self.nodes[n.idx()].events
    }

    /// Every active connect node `n` started (all its endpoint instances): when, and to which NID.
    /// Kept even without `keep_logs` (connect storms are what the simulator is for).
    pub fn connect_log(&self, n: NodeId) -> &[(Instant, Nid)] {
        &self.nodes[n.idx()].connects
    }

    /// Connections that node `n`'s dropped endpoints still owned (crashes).
    pub fn leaked_conns(&self, n: NodeId) -> u64 {
        self.nodes[n.idx()].leaked
    }

    /// CONN_RACE rejects the fabric has carried between `a` and `b`, in both directions
    /// together (each counted when the passive side sends it, whether or not it arrives).
    pub fn race_rejects_between(&self, a: NodeId, b: NodeId) -> u64 {
        let key = (a.0.min(b.0), a.0.max(b.0));
        self.race_rejects.get(&key).copied().unwrap_or(0)
    }

    /// Every pair of nodes that exchanged CONN_RACE rejects, with the count (lower id first).
    pub fn race_rejects_by_pair(&self) -> impl Iterator<Item = ((NodeId, NodeId), u64)> + '_ {
        self.race_rejects
            .iter()
            .map(|(&(a, b), &n)| ((NodeId(a), NodeId(b)), n))
    }

    /// How the message with `cookie` finished, and when; `None` while pending (or if unknown, or
    /// finished while `keep_logs` was off).
    pub fn outcome(&self, cookie: u64) -> Option<(Instant, SendOutcome)> {
        self.sends.get(&cookie)?.done
    }

    /// The record of the message with `cookie`.
    pub fn send_record(&self, cookie: u64) -> Option<&SendRecord> {
        self.sends.get(&cookie)
    }

    /// Connection state changes any endpoint's transition table refused, live or dropped.
    pub fn invalid_transitions(&self) -> u64 {
        self.stats.invalid_transitions_dropped
            + self
                .nodes
                .iter()
                .filter_map(|n| n.ep.as_ref())
                .map(|e| e.invalid_transitions())
                .sum::<u64>()
    }

    /// Messages handed to [`World::send`] that have no outcome yet.
    pub fn pending_sends(&self) -> usize {
        self.pending_sends
    }

    /// Fabric ends (connection halves) that exist now, over all nodes.
    pub fn live_ends(&self) -> usize {
        self.ends.len()
    }

    /// Fabric ends that node `n` holds now.
    pub fn ends_of(&self, n: NodeId) -> usize {
        self.nodes[n.idx()].ends.len()
    }

    /// Receive slots posted on node `n`'s end for `conn` (`None` if the fabric has no such end).
    pub fn posted_slots(&self, n: NodeId, conn: ConnId) -> Option<usize> {
        let uid = self.nodes[n.idx()].ends.get(&conn)?;
        Some(self.ends.get(uid)?.posted.len())
    }

    /// Events in the queue that are not timers (messages, CM traffic, completions, ...).
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Whether nothing is in flight (fabric or streams) and no message is pending (only timers
    /// remain, a stream stack's keepalive among them).
    pub fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.pending_sends == 0 && self.streams.in_flight() == 0
    }

    /// When the next event is due (the world's queue or the stream network's).
    pub fn next_event_at(&self) -> Option<Instant> {
        let world = self.queue.peek().map(|s| s.at);
        match (world, self.streams.next_event_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ------------------------------------------------------------------ upper layer

    /// Node `n`'s upper layer returns received messages after a random delay in `[0, max]`
    /// instead of at once (zero restores "at once"). Varies repost and credit-return schedules.
    pub fn set_recv_delay(&mut self, n: NodeId, max: Duration) {
        self.nodes[n.idx()].recv_delay = max;
    }

    // ------------------------------------------------------------------ running

    /// Processes the next event. False if there is none.
    pub fn step(&mut self) -> bool {
        // The stream network's next due goes first only if strictly earlier: at a tie the
        // world's event does, so the order is a function of the seed and the calls alone.
        let world_at = self.queue.peek().map(|s| s.at);
        if let Some(t) = self.streams.next_event_at() {
            if world_at.is_none_or(|w| t < w) {
                if t > self.now {
                    self.now = t;
                }
                self.stats.events += 1;
                self.streams.advance(t);
                self.deliver_streams();
                return true;
            }
        }
        let Some(s) = self.queue.pop() else {
            return false;
        };
        if s.at > self.now {
            self.now = s.at;
        }
        self.stats.events += 1;
        if !matches!(s.ev, Ev::Timer { .. }) {
            self.in_flight -= 1;
        }
        self.dispatch(s.at, s.ev);
        true
    }

    /// Processes every event due at or before `t`, then sets the clock to `t` (if later).
    pub fn run_until(&mut self, t: Instant) {
        while self.next_event_at().is_some_and(|at| at <= t) {
            self.step();
        }
        if t > self.now {
            self.now = t;
        }
    }

    /// [`World::run_until`] `now + d`.
    pub fn run_for(&mut self, d: Duration) {
        let t = self.now + d;
        self.run_until(t);
    }

    /// Runs until the world is idle ([`World::is_idle`]: nothing in flight, every message
    /// finished; timers may remain) or the next event is after `limit` (then the clock is set to
    /// `limit`). Returns whether it became idle. Endpoints reap failed connections on their next
    /// timer tick, so run a little longer (`run_for`) before checking that fabric ends are gone.
    pub fn run_until_idle(&mut self, limit: Instant) -> bool {
        loop {
            if self.is_idle() {
                return true;
            }
            match self.next_event_at() {
                Some(at) if at <= limit => {
                    self.step();
                }
                _ => {
                    if limit > self.now {
                        self.now = limit;
                    }
                    return self.is_idle();
                }
            }
        }
    }

    // ------------------------------------------------------------------ internals: plumbing

    /// The connect `end` started at `started` never reaches its peer (lost on the way, no
    /// route, an unreachable host): it fails as unreachable `unreachable_after` after it
    /// started, and not before `now`.
    pub(super) fn connect_unreachable(&mut self, now: Instant, started: Instant, end: u64) {
        let at = now.max(started + self.cfg.unreachable_after);
        let why = ConnectFailure::Unreachable;
        self.push(at, Ev::ConnFailed { end, why });
    }

    pub(super) fn push(&mut self, at: Instant, ev: Ev) {
        let at = at.max(self.now);
        if !matches!(ev, Ev::Timer { .. }) {
            self.in_flight += 1;
        }
        let seq = self.seq;
        self.seq += 1;
        self.queue.push(Scheduled { at, seq, ev });
    }

    /// One connection-manager message's delay, or `None` if it is lost.
    pub(super) fn cm_hop(&mut self) -> Option<Duration> {
        if self.rng.chance(self.cm_loss) {
            self.stats.cm_lost += 1;
            return None;
        }
        Some(self.cfg.cm_latency + self.rng.duration_up_to(self.cm_delay))
    }

    pub(super) fn blocked(&self, x: NodeId, y: NodeId) -> bool {
        if x == y || self.partitions_used == 0 {
            return false;
        }
        let (a, b) = (&self.nodes[x.idx()], &self.nodes[y.idx()]);
        (a.part_a & b.part_b) | (a.part_b & b.part_a) != 0
    }

    /// Whether node `n`'s host answers connection-manager traffic from `from`.
    pub(super) fn host_reachable(&self, from: NodeId, n: NodeId) -> bool {
        self.nodes[n.idx()].state != NodeState::Crashed && !self.blocked(from, n)
    }

    pub(super) fn start_node(&mut self, n: NodeId) {
        let now = self.now;
        let node = &mut self.nodes[n.idx()];
        node.epoch = node.epoch.wrapping_add(1);
        node.state = NodeState::Up;
        node.timer_at = None;
        node.ep = Some(N::start(&node.cfg, now));
        debug!(at = %now, node = %node.nid, incarnation = N::config_incarnation(&node.cfg),
               "node up");
        self.drain(n, false);
    }

    /// Removes node `n`'s endpoint and every end it had.
    pub(super) fn take_down(&mut self, n: NodeId, state: NodeState) {
        let now = self.now;
        let node = &mut self.nodes[n.idx()];
        node.state = state;
        node.epoch = node.epoch.wrapping_add(1);
        node.timer_at = None;
        let mut leaked = 0;
        if let Some(ep) = node.ep.take() {
            self.stats.invalid_transitions_dropped += ep.invalid_transitions();
            let leaks = ep.leak_counter();
            drop(ep);
            leaked = leaks.load(std::sync::atomic::Ordering::Relaxed);
            node.leaked += leaked;
        }
        node.regions.clear();
        node.rkeys.clear();
        let ends: Vec<u64> = node.ends.drain().map(|(_, uid)| uid).collect();
        let mut pending: Vec<u64> = node.pending.drain().map(|(c, ())| c).collect();
        pending.sort_unstable();
        self.stats.leaked_conns += leaked;
        for uid in ends {
            self.ends.remove(&uid);
        }
        for cookie in pending {
            self.finish_send(cookie, SendOutcome::LostInCrash);
        }
        if let Some(h) = self.nodes[n.idx()].host {
            if state == NodeState::Crashed {
                self.streams.crash(h);
            } else {
                // The process is gone, the host stays: its kernel closes what it left open.
                self.streams.close_host(h);
            }
        }
        // Requests this node received but never answered: the requester times out.
        let mut orphan_reqs: Vec<u64> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.target == n)
            .map(|(&id, _)| id)
            .collect();
        orphan_reqs.sort_unstable();
        for id in orphan_reqs {
            if let Some(r) = self.reqs.remove(&id) {
                self.connect_unreachable(now, r.started, r.active);
            }
        }
    }

    pub(super) fn finish_send(&mut self, cookie: u64, outcome: SendOutcome) {
        let now = self.now;
        let Some(rec) = self.sends.get_mut(&cookie) else {
            self.stats.unexpected_send_done += 1;
            return;
        };
        if rec.done.is_some() {
            self.stats.unexpected_send_done += 1;
            return;
        }
        rec.done = Some((now, outcome));
        let from = rec.from;
        self.pending_sends -= 1;
        match outcome {
            SendOutcome::Delivered => self.stats.sends_delivered += 1,
            SendOutcome::Failed(_) => self.stats.sends_failed += 1,
            SendOutcome::Refused(_) | SendOutcome::NodeDown => self.stats.sends_refused += 1,
            SendOutcome::LostInCrash => self.stats.sends_lost += 1,
        }
        self.nodes[from.idx()].pending.remove(&cookie);
        if !self.cfg.keep_logs {
            self.sends.remove(&cookie);
        }
    }

    /// After an input to node `n`: apply its actions, play its upper layer, re-arm its timer, and
    /// retire it if a shutdown completed; then hand out what the stream network reported
    /// meanwhile. `after_timer` means the input was a timer at `now`.
    pub(super) fn drain(&mut self, n: NodeId, after_timer: bool) {
        self.drain_node(n, after_timer);
        self.deliver_streams();
    }

    pub(super) fn drain_node(&mut self, n: NodeId, after_timer: bool) {
        loop {
            let Some(ep) = self.nodes[n.idx()].ep.as_mut() else {
                return;
            };
            if let Some(a) = ep.poll_action() {
                self.apply(n, a);
                continue;
            }
            if let Some(a) = ep.poll_stream_action() {
                self.apply_stream(n, a);
                continue;
            }
            if let Some(e) = ep.poll_event() {
                self.upper(n, e);
                continue;
            }
            break;
        }
        let now = self.now;
        let node = &mut self.nodes[n.idx()];
        let Some(ep) = node.ep.as_ref() else {
            return;
        };
        if node.state == NodeState::Stopping && ep.is_shut_down() {
            debug!(at = %now, node = %node.nid, "shut down");
            if !node.ends.is_empty() {
                debug!(node = %node.nid, ends = node.ends.len(), "ends left after shutdown");
            }
            self.take_down(n, NodeState::Stopped);
            return;
        }
        // Re-arm: keep at most one pending timer event, the earliest wanted. A later deadline
        // leaves the earlier event in place (a spurious handle_timeout is harmless).
        if let Some(deadline) = ep.poll_timeout() {
            let floor = if after_timer {
                now + Duration::from_nanos(1)
            } else {
                now
            };
            let at = deadline.max(floor);
            if node.timer_at.is_none_or(|t| at < t) {
                node.timer_at = Some(at);
                let epoch = node.epoch;
                self.push(at, Ev::Timer { node: n, epoch });
            }
        }
    }

    /// The upper-layer model (LNet, for a bare endpoint) of node `n`: books `ev`.
    pub(super) fn upper(&mut self, n: NodeId, ev: N::Event) {
        let now = self.now;
        let keep = self.cfg.keep_logs;
        match N::book(ev) {
            Booking::Received { from, hdr, len, rx } => {
                self.stats.received += 1;
                let node = &mut self.nodes[n.idx()];
                node.received_count += 1;
                trace!(at = %now, node = %node.nid, %from, len, "received");
                if keep {
                    node.received.push(ReceivedMsg {
                        at: now,
                        from,
                        hdr,
                        len,
                    });
                }
                let Some(rx) = rx else {
                    return;
                };
                let max = node.recv_delay;
                if max.is_zero() {
                    if let Some(ep) = node.ep.as_mut() {
                        ep.recv_done(now, rx);
                    }
                } else {
                    let epoch = node.epoch;
                    let d = self.rng.duration_up_to(max);
                    self.push(now + d, Ev::RecvDone { node: n, epoch, rx });
                }
            }
            Booking::SendDone { cookie, result } => {
                let outcome = match result {
                    Ok(()) => SendOutcome::Delivered,
                    Err(e) => SendOutcome::Failed(e),
                };
                trace!(at = %now, node = %self.nodes[n.idx()].nid, cookie, ?outcome, "send done");
                if self.nodes[n.idx()].pending.remove(&cookie).is_none() {
                    self.stats.unexpected_send_done += 1;
                    return;
                }
                self.finish_send(cookie, outcome);
            }
            Booking::PeerUp { nid } => {
                let node = &mut self.nodes[n.idx()];
                debug!(at = %now, node = %node.nid, peer = %nid, "peer up");
                if keep {
                    node.peer_events.push(PeerEvent {
                        at: now,
                        nid,
                        down: None,
                    });
                }
            }
            Booking::PeerDown { nid, reason } => {
                let node = &mut self.nodes[n.idx()];
                debug!(at = %now, node = %node.nid, peer = %nid, ?reason, "peer down");
                if keep {
                    node.peer_events.push(PeerEvent {
                        at: now,
                        nid,
                        down: Some(reason),
                    });
                }
            }
            Booking::Other(ev) => {
                if keep {
                    self.nodes[n.idx()].events.push((now, ev));
                }
            }
        }
    }

    pub(super) fn end_uid(&self, n: NodeId, conn: ConnId) -> Option<u64> {
        self.nodes[n.idx()].ends.get(&conn).copied()
    }

    pub(super) fn new_end(&mut self, n: NodeId, conn: ConnId, state: EndState, slots: u16) -> u64 {
        let uid = self.next_uid;
        self.next_uid += 1;
        self.ends.insert(
            uid,
            End {
                node: n,
                conn,
                state,
                peer: None,
                peer_node: None,
                posted: SlotSet::with_first(slots),
                sq: VecDeque::new(),
                link_free: self.now,
                pump_at: None,
                retry_deadline: None,
                last_cq: self.now,
                disconnect_issued: false,
                disconnect_reported: false,
            },
        );
        if let Some(old) = self.nodes[n.idx()].ends.insert(conn, uid) {
            // The engine reused a live ConnId: drop the old end rather than confuse the two.
            self.stats.unknown_actions += 1;
            self.ends.remove(&old);
        }
        uid
    }
}
