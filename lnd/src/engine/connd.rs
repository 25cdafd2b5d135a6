//! connd's work, driven by the timer wheel so its cost follows what expired (kiblnd_connd):
//! close, disconnect, reap, reconnect pacing (LU-5718/LU-7569), keepalives, forgetting idle
//! peers, and telling LNet a peer is down.

use super::*;

impl Endpoint {
    /// The connection manager says `conn` is disconnected: the peer closed, our close completed,
    /// or (`why`) the fabric found the connection broken. Only a close the peer began
    /// ([`DisconnectReason::Closed`]) ends an established connection gracefully; a protocol error
    /// or a transport failure loses it (`conns_lost`, and `fabric_protocol_errors` or
    /// `fabric_transport_errors`), and the peer goes down as `ProtocolError` or `ConnectionLost`.
    pub fn handle_disconnected(&mut self, now: Instant, conn: ConnId, why: DisconnectReason) {
        self.advance(now);
        let Some(c) = self.conn(conn) else {
            return;
        };
        match c.state {
            ConnState::Init | ConnState::ActiveConnect | ConnState::PassiveWait => {
                let p = c.peer;
                self.peers[p].refused = false;
                self.handshake_failed(conn, Some(DownReason::ConnectFailed), false, false);
            }
            ConnState::Established => {
                // The peer closed first, or the fabric broke the connection: acknowledge and go.
                let error = match why {
                    DisconnectReason::Closed => None,
                    DisconnectReason::ProtocolError => {
                        self.stats.fabric_protocol_errors += 1;
                        Some(DownReason::ProtocolError)
                    }
                    DisconnectReason::TransportError => {
                        self.stats.fabric_transport_errors += 1;
                        Some(DownReason::ConnectionLost)
                    }
                };
                if error.is_some() {
                    debug!(?conn, ?why, "the fabric broke the connection");
                }
                self.close_conn(conn, error);
                self.finish_close(conn);
            }
            ConnState::Closing => self.finish_close(conn),
            ConnState::Disconnected => {}
        }
    }

    /// Runs every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        while let Some((_, ev)) = self.wheel.poll(self.now) {
            match ev {
                TimerEvent::Conn(id) => self.on_conn_timer(id),
                TimerEvent::Tx(key) => self.on_tx_deadline(key),
                TimerEvent::Grant(key) => self.on_grant_deadline(key),
                TimerEvent::Reap(id) => self.reap(id),
                TimerEvent::Hedge(id) => {
                    if let Some((p, created)) = self.conn(id).map(|c| (c.peer, c.created)) {
                        if self.peers[p].active == Some(id) {
                            // The delay may have grown since this was armed (learned, or a
                            // pair's turn): wait for it.
                            let due = self.hedge_due(p, created);
                            if self.now < due {
                                self.wheel.insert(due, TimerEvent::Hedge(id));
                            } else {
                                self.maybe_hedge(p);
                            }
                        }
                    }
                }
                TimerEvent::Trim => self.trim(),
                TimerEvent::Reconnect(p) => {
                    let Some(peer) = self.peers.get_mut(p) else {
                        continue;
                    };
                    peer.reconnect_timer = None;
                    self.maybe_connect(p);
                    self.maybe_forget(p);
                }
            }
        }
    }

    /// The peer's slot, made if it is new; `None` when it is new and the table is full.
    pub(super) fn peer_idx(&mut self, nid: Nid) -> Option<PeerIdx> {
        if let Some(&p) = self.peer_index.get(&nid) {
            return Some(p);
        }
        if self.peers.len() >= self.cfg.peer_limit {
            return None;
        }
        let qd = self.cfg.tunables.queue_depth();
        let p = self.peers.insert(Peer {
            nid,
            incarnation: 0,
            superseded: [0; SUPERSEDED_KEPT],
            version: VERSION_2,
            queue_depth: qd,
            max_frags: MAX_RDMA_FRAGS as u16,
            tx_queue: VecDeque::new(),
            conns: Vec::new(),
            active: None,
            stalled: None,
            hedge_round: 0,
            accepting: Vec::new(),
            next_conn: 0,
            add_conn_after_reap: false,
            zombies: 0,
            peak_zombies: 0,
            reconnect_wanted: false,
            reconnect_timer: None,
            attempts: 0,
            last_attempt: None,
            races: 0,
            races_received: 0,
            peak_races_received: 0,
            refused: false,
            up: false,
            reported_down: false,
            cksum: None,
            disagreements: 0,
            disagreed_at: None,
        });
        self.peer_index.insert(nid, p);
        self.note_growth(self.peers.capacity());
        Some(p)
    }

    /// Arms the trim once a table has grown past what the last pass left (at first
    /// [`TRIM_FLOOR`]): a table that stays in the band a pass leaves alone (above the floor,
    /// not sparse) does not re-arm it at every insert. Only a compare when it is already armed
    /// or the table is small, so it may sit on the per-message path.
    #[inline]
    pub(super) fn note_growth(&mut self, capacity: usize) {
        if capacity > self.trim_mark && !self.trim_armed {
            self.arm_trim();
        }
    }

    fn arm_trim(&mut self) {
        self.trim_armed = true;
        self.wheel
            .insert(self.now + TRIM_INTERVAL, TimerEvent::Trim);
    }

    /// Gives back the room a burst left in the tables and queues (see [`crate::trim`]), and
    /// looks again in [`TRIM_INTERVAL`] while any is still large (busy, or a slab held at its
    /// size by a live entry near its top: entries are never moved).
    fn trim(&mut self) {
        self.trim_armed = false;
        // The sizes are only for the debug line: a pass on a node with many peers would
        // otherwise walk them twice more for nothing.
        let report = tracing::enabled!(tracing::Level::DEBUG);
        let before = if report { self.state_bytes() } else { 0 };
        let mut large = false;
        large |= self.txs.trim(TRIM_FLOOR);
        large |= self.conns.trim(TRIM_FLOOR);
        large |= self.peers.trim(TRIM_FLOOR);
        large |= self.peer_index.trim(TRIM_FLOOR);
        large |= self.learned_orders.trim(TRIM_FLOOR);
        large |= self.wheel.trim(TRIM_FLOOR);
        large |= self.actions.trim(TRIM_FLOOR);
        large |= self.events.trim(TRIM_FLOOR);
        if let Some(q) = self.capture.as_mut() {
            large |= q.trim(TRIM_FLOOR);
        }
        for (_, c) in self.conns.iter_mut() {
            large |= c.tx_rsrvd.trim(TRIM_FLOOR_SMALL);
            large |= c.tx_cred.trim(TRIM_FLOOR_SMALL);
            large |= c.tx_nocred.trim(TRIM_FLOOR_SMALL);
        }
        for (_, p) in self.peers.iter_mut() {
            large |= p.tx_queue.trim(TRIM_FLOOR_SMALL);
        }
        if report {
            let after = self.state_bytes();
            if after < before {
                debug!(nid = %self.cfg.nid, before, after, "LND tables trimmed after a burst");
            }
        }
        self.trim_mark = TRIM_FLOOR
            .max(self.txs.capacity())
            .max(self.conns.capacity())
            .max(self.peers.capacity());
        if large {
            self.arm_trim();
        }
    }

    /// Forgets a peer that has no connection (not even a zombie), no connect under way and
    /// nothing queued, as o2iblnd frees a peer with no connections: what a peer costs is then
    /// bounded by what it is doing, and a flood of forged NIDs leaves nothing behind.
    pub(super) fn maybe_forget(&mut self, p: PeerIdx) {
        let Some(peer) = self.peers.get(p) else {
            return;
        };
        let idle = peer.conns.is_empty()
            && peer.active.is_none()
            && peer.stalled.is_none()
            && peer.accepting.is_empty()
            && peer.zombies == 0
            && peer.tx_queue.is_empty()
            && peer.reconnect_timer.is_none()
            && !peer.reconnect_wanted;
        // Every connection of the peer is counted above (handshakes as active/accepting,
        // established ones in `conns`, closing and disconnected ones as zombies until reaped), so
        // no connection, message or timer refers to the slot once it is free.
        if !idle {
            return;
        }
        let nid = peer.nid;
        self.peers.remove(p);
        self.peer_index.remove(&nid);
        self.stats.peers_forgotten += 1;
        trace!(peer = %nid, "peer forgotten");
    }

    pub(super) fn arm_conn_timer(&mut self, id: ConnId, at: Instant) {
        let key = self.wheel.insert(at, TimerEvent::Conn(id));
        if let Some(c) = self.conn_mut(id) {
            if let Some(old) = c.timer.replace(key) {
                self.wheel.cancel(old);
            }
        }
    }

    pub(super) fn disarm_conn_timer(&mut self, id: ConnId) {
        if let Some(old) = self.conn_mut(id).and_then(|c| c.timer.take()) {
            self.wheel.cancel(old);
        }
    }

    /// Starts an active connect if the peer needs one and the pacing rule allows it now; otherwise
    /// arranges for it to happen when it may (kiblnd_launch_tx, kiblnd_reconnect_peer, LU-7569).
    pub(super) fn maybe_connect(&mut self, p: PeerIdx) {
        if self.shutting_down {
            return;
        }
        let peer = &mut self.peers[p];
        if peer.tx_queue.is_empty() || !peer.conns.is_empty() || peer.connecting() {
            return;
        }
        // Only one failed connection at a time: reconnect once it is reaped.
        if peer.zombies > 0 {
            peer.reconnect_wanted = true;
            return;
        }
        let t = &self.cfg.tunables;
        if self.cfg.race_policy.adapts_to_peer()
            && peer.attempts >= t.fast_reconnects
            && peer.races_received > 0
            && peer.races_received <= t.race_limit.saturating_add(1)
        {
            // The peer refused us with CONN_RACE: it is alive, holding a connect of its own that
            // may never finish. Retry at a quick bounded pace until it has refused us race_limit
            // + 1 times (a kernel peer lets us win at race_limit), without counting these tries
            // toward the slow path.
            let earliest = peer
                .last_attempt
                .map_or(self.now, |last| last + t.race_retry_interval);
            if earliest > self.now {
                let jitter = jitter(
                    &mut self.rng,
                    Duration::from_nanos(t.race_retry_interval.as_nanos() / 4),
                );
                let key = self
                    .wheel
                    .insert(earliest + jitter, TimerEvent::Reconnect(p));
                self.peers[p].reconnect_timer = Some(key);
                return;
            }
            return self.connect_now(p);
        }
        if peer.attempts >= t.fast_reconnects {
            let earliest = peer
                .last_attempt
                .map_or(self.now, |last| last + t.reconnect_interval);
            if earliest > self.now || peer.attempts == t.fast_reconnects {
                let jitter = jitter(&mut self.rng, t.reconnect_jitter);
                let at = earliest.max(self.now) + jitter;
                let key = self.wheel.insert(at, TimerEvent::Reconnect(p));
                self.peers[p].reconnect_timer = Some(key);
                // Counting this one as scheduled keeps later attempts on the slow path.
                self.peers[p].attempts += 1;
                return;
            }
        }
        self.connect_now(p);
    }

    /// o2iblnd's `conns_per_peer`: once one of our connections to a peer is up, the next one is
    /// opened, one at a time, until `conns_per_peer` of ours are up. The peer's connections to
    /// us are not counted (they carry its credits, not ours), nor a self-connection. One that
    /// fails is not retried until another of ours comes up: the peer is served meanwhile.
    pub(super) fn maybe_add_conn(&mut self, p: PeerIdx) {
        let want = usize::from(self.cfg.tunables.conns_per_peer).min(MAX_CONNS_PER_PEER);
        let peer = &self.peers[p];
        if want < 2
            || self.shutting_down
            || peer.nid == self.cfg.nid
            || peer.active.is_some()
            || peer.stalled.is_some()
        {
            return;
        }
        if peer.zombies > 0 {
            // Not beside a connection being torn down (the loser of a hedged pair, say): once
            // it is reaped (`reap`).
            self.peers[p].add_conn_after_reap = true;
            return;
        }
        let ours = peer
            .conns
            .iter()
            .filter(|&&c| self.conn(c).is_some_and(|c| c.active))
            .count();
        if ours == 0 || ours >= want {
            return;
        }
        trace!(peer = %peer.nid, ours, want, "conns_per_peer: one more");
        self.connect_now(p);
    }

    /// Starts a second active connect beside `active` when it has gone unanswered for
    /// `connect_hedge` while messages wait for it (ours; see `Tunables::connect_hedge`). Never
    /// a third: the earlier attempt must have ended, and its zombie been reaped, first. When
    /// the second goes unanswered as long, the earlier one is given up (as its deadline
    /// would, only sooner): once its zombie is reaped a new second starts beside the one
    /// left, so k connects stuck in a row cost about k hedge delays, not a deadline each
    /// after the second (LU-7646's stuck connect, met again and again in a storm).
    /// How long an active connect may go unanswered before its second: `connect_hedge`, or
    /// four times what connects have been taking if that is longer (a fabric whose connects are
    /// slow, a peer busy with a reboot storm, must not get every request twice), at most half
    /// the connect deadline.
    pub(super) fn hedge_delay(&self) -> Duration {
        let t = &self.cfg.tunables;
        let learned = self
            .connect_srtt
            .map_or(Duration::ZERO, |s| s.saturating_mul(4));
        let cap = Duration::from_nanos(t.connect_timeout().as_nanos() / 2);
        t.connect_hedge.max(learned).min(cap)
    }

    /// When the active connect created at `created` has waited long enough for its peer's
    /// next step: the hedge delay for a second beside it; with a pair in flight, twice that,
    /// doubled again for each earlier attempt given up since the peer was last connected (at
    /// most half the connect deadline), so that a fabric whose connects take longer than the
    /// delay still sees one complete (the window outgrows them) while a stuck one costs a
    /// few of these, not a deadline.
    pub(super) fn hedge_due(&self, p: PeerIdx, created: Instant) -> Instant {
        let d = self.hedge_delay();
        let peer = &self.peers[p];
        if peer.stalled.is_none() {
            return created + d;
        }
        let cap = Duration::from_nanos(self.cfg.tunables.connect_timeout().as_nanos() / 2);
        let rounds = u32::from(peer.hedge_round.min(16)) + 1;
        created + d.saturating_mul(1 << rounds).min(cap.max(d))
    }

    pub(super) fn maybe_hedge(&mut self, p: PeerIdx) {
        let hedge = self.cfg.tunables.connect_hedge;
        if self.shutting_down || hedge.is_zero() || !self.cfg.race_policy.hedges() {
            return;
        }
        let peer = &self.peers[p];
        let Some(active) = peer.active else {
            return;
        };
        if !peer.conns.is_empty() || peer.zombies > 0 || peer.tx_queue.is_empty() {
            return;
        }
        let stalled = peer.stalled;
        let Some(c) = self.conn(active) else {
            return;
        };
        if c.state != ConnState::ActiveConnect || self.now < self.hedge_due(p, c.created) {
            return;
        }
        if let Some(stalled) = stalled {
            // Both unanswered: the earlier goes; `reap` comes back here for the next second.
            self.stats.hedge_abandons += 1;
            let peer = &mut self.peers[p];
            peer.hedge_round = peer.hedge_round.saturating_add(1);
            debug!(peer = %self.peers[p].nid, ?stalled, "both attempts unanswered; giving up the earlier");
            self.handshake_failed(stalled, Some(DownReason::Timeout), false, true);
            return;
        }
        self.stats.connect_hedges += 1;
        debug!(peer = %self.peers[p].nid, stalled = ?active, "active connect unanswered; a second beside it");
        self.peers[p].stalled = self.peers[p].active.take();
        self.connect_now(p);
    }

    /// Closes an established connection: Disconnect first, then wait (bounded) for the fabric to
    /// confirm (kiblnd_close_conn_locked). `error` is `None` for a graceful close.
    pub(super) fn close_conn(&mut self, conn: ConnId, error: Option<DownReason>) {
        let Some(c) = self.conn(conn) else {
            return;
        };
        match c.state {
            ConnState::Established => {}
            ConnState::Init | ConnState::ActiveConnect | ConnState::PassiveWait => {
                return self.handshake_failed(conn, error, false, true);
            }
            ConnState::Closing | ConnState::Disconnected => return,
        }
        let p = c.peer;
        self.transition(conn, ConnInput::Close);
        if let Some(c) = self.conn_mut(conn) {
            c.error = error;
            c.disconnect_sent = true;
        }
        match error {
            None => self.stats.graceful_closes += 1,
            Some(_) => self.stats.conns_lost += 1,
        }
        self.peers[p].conns.retain(|&x| x != conn);
        self.actions.push_back(FabricAction::Disconnect { conn });
        let at = self.now + self.cfg.tunables.close_timeout;
        self.arm_conn_timer(conn, at);
        // Queued messages go now, and those waiting for the peer's side of a rendezvous
        // (kiblnd_abort_txs on ibc_active_txs); posted ones when their completions flush, or at
        // the reap. Queued ones of a connection that timed out were never sent: LNet may send
        // them again.
        let queued = if error == Some(DownReason::Timeout) {
            TxError::ConnTimedOut
        } else {
            TxError::ConnAborted
        };
        self.abort_queued(conn, queued);
        self.abort_waiting(conn);
        self.flush_held(p);
        let peer = &self.peers[p];
        if peer.conns.is_empty() {
            if !peer.tx_queue.is_empty() {
                self.maybe_connect(p);
            } else if !peer.connecting() {
                self.peer_down(p, error.unwrap_or(DownReason::Closed));
            }
        }
    }

    pub(super) fn close_peer_conns(&mut self, p: PeerIdx, reason: DownReason) {
        let conns = self.peers[p].conns.clone();
        for c in conns {
            self.close_conn(c, Some(reason));
        }
    }

    /// The close is complete (the fabric confirmed, or the wait ran out): a zombie now.
    pub(super) fn finish_close(&mut self, conn: ConnId) {
        self.disarm_conn_timer(conn);
        if self.transition(conn, ConnInput::Disconnected).is_some() {
            self.schedule_reap(conn);
        }
    }

    pub(super) fn schedule_reap(&mut self, conn: ConnId) {
        let key = self.wheel.insert(self.now, TimerEvent::Reap(conn));
        if let Some(c) = self.conn_mut(conn) {
            if let Some(old) = c.timer.replace(key) {
                self.wheel.cancel(old);
            }
        }
    }

    /// connd: destroy a zombie, finish whatever it still held, and reconnect if that was wanted
    /// (kiblnd_destroy_conn, then the reconnect list).
    pub(super) fn reap(&mut self, conn: ConnId) {
        let Some(c) = self.conn(conn) else {
            return;
        };
        if c.state != ConnState::Disconnected {
            return;
        }
        let p = c.peer;
        let reconnect = c.reconnect;
        self.abort_queued(conn, TxError::ConnAborted);
        self.abort_waiting(conn);
        // Posted messages whose completions never came.
        self.fail_placed(TxPlace::Posted(conn), TxError::SendFailed);
        self.conns.remove(conn);
        self.actions.push_back(FabricAction::Destroy { conn });
        self.stats.reaped += 1;
        self.stats.zombies = self.stats.zombies.saturating_sub(1);
        let peer = &mut self.peers[p];
        peer.zombies = peer.zombies.saturating_sub(1);
        if reconnect || peer.reconnect_wanted {
            peer.reconnect_wanted = false;
            self.maybe_connect(p);
        }
        // A failed attempt of a pair is gone: the one left may need its second again.
        self.maybe_hedge(p);
        // An extra connection (conns_per_peer) put off while this zombie was torn down.
        if self.peers[p].zombies == 0 && std::mem::take(&mut self.peers[p].add_conn_after_reap) {
            self.maybe_add_conn(p);
        }
        let peer = &self.peers[p];
        if peer.conns.is_empty()
            && !peer.connecting()
            && !peer.tx_queue.is_empty()
            && peer.zombies == 0
        {
            // A reconnect was not allowed (e.g. a fatal reject) and nothing else will come.
            let err = self.connect_error(p);
            self.fail_peer_queue(p, err);
        }
        self.maybe_forget(p);
    }

    pub(super) fn cancel_reconnect(&mut self, p: PeerIdx) {
        if let Some(k) = self.peers[p].reconnect_timer.take() {
            self.wheel.cancel(k);
        }
    }

    /// Tells LNet the peer is down, once per change: after it was up, or the first time a peer we
    /// never reached fails (kiblnd_peer_connect_failed notifies LNet in both cases).
    pub(super) fn peer_down(&mut self, p: PeerIdx, reason: DownReason) {
        let peer = &mut self.peers[p];
        if peer.up || !peer.reported_down {
            peer.up = false;
            peer.reported_down = true;
            self.stats.peers_down += 1;
            let nid = peer.nid;
            debug!(peer = %nid, ?reason, "peer down");
            self.events.push_back(LndEvent::PeerDown { nid, reason });
        }
    }

    pub(super) fn on_conn_timer(&mut self, id: ConnId) {
        let keepalive = self.cfg.tunables.keepalive;
        let Some(c) = self.conn_mut(id) else {
            return;
        };
        c.timer = None;
        match c.state {
            ConnState::ActiveConnect | ConnState::PassiveWait => {
                // LU-17480: an attempt that outlived its deadline is aborted.
                let retry = c.active;
                let p = c.peer;
                self.peers[p].refused = false;
                self.stats.connect_timeouts += 1;
                debug!(conn = ?id, "connect deadline passed");
                self.handshake_failed(id, Some(DownReason::Timeout), retry, true);
            }
            ConnState::Established => {
                // Keepalive only (kiblnd_check_conns): a NOOP when we have sent nothing for
                // `keepalive`, so a crashed peer is found by the transport (EOF/RST on tcp, a
                // failed send on verbs). Silence alone is never fatal: a kernel peer sends
                // NOOPs on its own schedule, or never (keepalive=0), and owes an idle peer
                // nothing. A peer that owes us something is found by the message deadlines.
                let due = c.last_send + keepalive;
                let next = if self.now >= due {
                    self.check_sends(id, true);
                    self.now + keepalive
                } else {
                    due
                };
                self.arm_conn_timer(id, next);
            }
            ConnState::Closing => {
                self.stats.close_timeouts += 1;
                self.finish_close(id);
            }
            ConnState::Init | ConnState::Disconnected => {}
        }
    }
}

/// xorshift64: reproducible jitter from the endpoint's seed.
pub(super) fn jitter(state: &mut u64, max: Duration) -> Duration {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    if max.is_zero() {
        Duration::ZERO
    } else {
        Duration::from_nanos(x % max.as_nanos())
    }
}
