//! Connection setup (o2iblnd_cb.c: kiblnd_active_connect, kiblnd_passive_connect,
//! kiblnd_check_connreply, kiblnd_rejected, kiblnd_connreq_done): connect requests, the race rule
//! and what we learn from a race (the peer's NID order), the CONNACK, rejects, and what a
//! connection does once it is up.

use super::*;

impl Endpoint {
    /// A peer asks to connect (the passive side of the handshake, kiblnd_passive_connect).
    pub fn handle_connect_request(&mut self, now: Instant, req: RequestId, private: &[u8]) {
        self.advance(now);
        let my_cp = self.my_connparams();
        let (msg, framing) = match KibMsg::parse(private) {
            Ok(m) => m,
            Err(e) => {
                self.stats.bad_connreqs += 1;
                debug!(error = %e, "unparseable connect request");
                return self.reject(req, RejectReason::Fatal);
            }
        };
        if self.capture.is_some() {
            // Recorded before any check, so a capture shows the requests we refuse too. It has no
            // connection yet: conn is the never-allocated id 0.0.
            self.record(
                CaptureDir::Received,
                ConnId::from_u64(0),
                msg.src_nid,
                private,
            );
        }
        let KibBody::ConnReq(cp) = msg.body else {
            self.stats.bad_connreqs += 1;
            return self.reject(req, RejectReason::Fatal);
        };
        if msg.dst_nid != self.cfg.nid || msg.version != VERSION_2 {
            self.stats.bad_connreqs += 1;
            return self.reject(req, RejectReason::Fatal);
        }
        if self.shutting_down {
            return self.reject(req, RejectReason::NoResources);
        }
        // The requester thinks we are an instance that is gone.
        if msg.dst_stamp != 0 && msg.dst_stamp != self.cfg.incarnation {
            return self.reject(req, RejectReason::ConnStale);
        }
        if cp.queue_depth > my_cp.queue_depth || cp.queue_depth < 2 {
            return self.reject(req, RejectReason::MsgQueueSize);
        }
        if usize::from(cp.max_frags) > MAX_RDMA_FRAGS || cp.max_frags == 0 {
            return self.reject(req, RejectReason::RdmaFrags);
        }
        if cp.max_msg_size as usize > MSG_SIZE {
            return self.reject(req, RejectReason::Fatal);
        }
        let Some(p) = self.peer_idx(msg.src_nid) else {
            self.stats.peer_table_full += 1;
            debug!(peer = %msg.src_nid, limit = self.cfg.peer_limit, "peer table full, refusing");
            return self.reject(req, RejectReason::NoResources);
        };
        self.learn_cksum(p, &framing);
        let policy = self.cfg.race_policy;

        // A request from an instance of the peer that a newer one already replaced: it was in
        // flight across the peer's restart (a slow CM, or the second of a hedged pair). It is
        // not a "restart" back to that instance, which would close the new one's connections;
        // the requester is gone, refuse it as stale.
        if self.names_replaced_instance(p, msg.src_stamp) {
            self.stats.superseded_connreqs += 1;
            debug!(peer = %msg.src_nid, stamp = msg.src_stamp, "request from a replaced instance, refusing");
            return self.reject(req, RejectReason::ConnStale);
        }
        // A new instance of a peer we knew: everything to the old one is dead (kiblnd step 10).
        let known = self.peers[p].incarnation;
        if known != 0 && known != msg.src_stamp {
            self.stats.peer_reboots += 1;
            debug!(peer = %msg.src_nid, old = known, new = msg.src_stamp, "peer restarted");
            self.peers[p].set_incarnation(msg.src_stamp);
            self.close_peer_conns(p, DownReason::Rebooted);
            if !policy.abandons_stale() {
                // Lustre refuses this one and lets the peer retry once the old connections are
                // gone; we close synchronously, so we can accept at once.
                return self.reject(req, RejectReason::ConnStale);
            }
        }

        let active = self.peers[p].active;
        let active_proven_stale = active
            .and_then(|a| self.conn(a))
            .is_some_and(|c| c.sent_dst_stamp != 0 && c.sent_dst_stamp != msg.src_stamp);
        let decision = resolve_race(RaceInput {
            my_nid: self.cfg.nid,
            peer_nid: msg.src_nid,
            active_in_flight: active.is_some(),
            active_proven_stale,
            races: self.peers[p].races,
            race_limit: self.cfg.tunables.race_limit,
            policy,
            order: self.race_order_for(msg.src_nid),
        });
        match decision {
            RaceDecision::RejectRace => {
                if let Some(c) = active.and_then(|a| self.conn_mut(a)) {
                    c.refused_peer_race = true;
                }
                self.peers[p].races += 1;
                self.stats.races += 1;
                trace!(peer = %msg.src_nid, races = self.peers[p].races, "conn race");
                return self.reject(req, RejectReason::ConnRace);
            }
            RaceDecision::Yield => {
                self.stats.race_yields += 1;
                debug!(peer = %msg.src_nid, "conn race unresolved after the limit, letting the lower NID win");
            }
            RaceDecision::AbandonActiveAndAccept => {
                // A stalled attempt beside it names the gone instance too, but is left to end
                // on its own (the new instance refuses it as stale, or its deadline passes):
                // one zombie at a time.
                if let Some(a) = active {
                    self.stats.stale_abandons += 1;
                    debug!(peer = %msg.src_nid, "abandoning an active connect to a gone instance");
                    self.handshake_failed(a, None, true, true);
                }
            }
            // Accepting while our own attempt is in flight teaches nothing about the peer's
            // NID order: both sides accepting each other (it orders NIDs the other way) looks
            // the same from here as our slow request accepted as a plain connect after the
            // peer's own handshake finished. Two connections are harmless; only a double
            // refusal, which can livelock, is evidence (`refused_peer_race`).
            RaceDecision::Accept => {}
        }

        // A newer request from the instance we are connected to does not make its older
        // attempts or connections dead (o2iblnd keeps them: ibp_accepting counts handshakes,
        // ibp_conns lists connections). It may be a second attempt beside a slow one, both sides
        // connecting at once, or o2iblnd's conns_per_peer; closing the older one would drop what
        // the peer already sent on it and counts delivered. So they stay, bounded.
        if self.peers[p].accepting.len() >= MAX_ACCEPTING {
            let oldest = self.peers[p].accepting[0];
            debug!(peer = %msg.src_nid, ?oldest, "too many handshakes from one peer: the oldest is superseded");
            self.handshake_failed(oldest, None, true, true);
        }
        // The cap holds for connections claiming our own NID too (the hostile-peer audit kept
        // 300 of them): the passive ends are theirs whoever they claim to be.
        let theirs: Vec<ConnId> = self.peers[p]
            .conns
            .iter()
            .copied()
            .filter(|&c| self.conn(c).is_some_and(|c| !c.active))
            .collect();
        if theirs.len() >= MAX_CONNS_PER_PEER {
            debug!(peer = %msg.src_nid, "too many connections from one peer: the oldest is closed");
            self.close_conn(theirs[0], Some(DownReason::Closed));
        }
        // A self-connection's other end is our own active one: not a sign that we lost it.
        let self_connect = msg.src_nid == self.cfg.nid;
        let established: Vec<ConnId> = if self_connect {
            Vec::new()
        } else {
            self.peers[p].conns.clone()
        };
        // But the peer may also have lost them (our close of its side was lost with the
        // partition that cut it off), and one that waits for credits would then hold our
        // messages until the LND timeout. Each goes on probation (new messages take another
        // connection until the peer is heard on it) and is probed with a keepalive NOOP (it
        // needs no credit): a live end ignores it, a gone one fails the send and the connection
        // closes.
        // One already on probation was probed when it went on it (its NOOP, or the peer heard
        // on it, settles it): probing it again for every new connect would cost n x n NOOPs
        // for n connects from one NID (the hostile-peer audit).
        for c in established {
            let now = self.now;
            match self.conn_mut(c) {
                Some(conn) if !conn.probation => {
                    conn.probation = true;
                    conn.probation_since = now;
                }
                _ => continue,
            }
            self.check_sends(c, true);
        }

        let peer = &mut self.peers[p];
        peer.races = 0;
        peer.incarnation = msg.src_stamp;
        peer.version = msg.version;
        let qd = cp.queue_depth;
        let id = self.new_conn(p, false, qd, cp.max_frags.min(MAX_RDMA_FRAGS as u16));
        self.transition(id, ConnInput::StartAccept);
        if let Some(c) = self.conn_mut(id) {
            c.peer_stamp = msg.src_stamp;
        }
        self.peers[p].accepting.push(id);
        self.stats.accepts += 1;
        let frags = cp.max_frags.min(MAX_RDMA_FRAGS as u16);
        let ack = KibBody::ConnAck(our_params(qd, frags));
        let private = self.handshake_private(p, id, (msg.src_nid, msg.src_stamp), ack);
        self.actions.push_back(FabricAction::Accept {
            req,
            conn: id,
            private,
            recv_slots: recv_slots(qd),
        });
        self.arm_conn_timer(id, now + self.cfg.tunables.connect_timeout());
    }

    /// The connection manager says `conn` is established; on the active side `private` holds the
    /// CONNACK (kiblnd_check_connreply), on the passive side it is empty.
    pub fn handle_established(&mut self, now: Instant, conn: ConnId, private: &[u8]) {
        self.advance(now);
        let Some(c) = self.conn(conn) else {
            return;
        };
        match c.state {
            ConnState::ActiveConnect => {}
            ConnState::PassiveWait => return self.passive_established(conn),
            // LU-18260 / LU-18899: an event for an attempt already abandoned or closed.
            _ => return,
        }
        let p = c.peer;
        if self.capture.is_some() && !private.is_empty() {
            let peer = self.peers[p].nid;
            self.record(CaptureDir::Received, conn, peer, private);
        }
        let parsed = KibMsg::parse(private);
        if let Ok((_, framing)) = &parsed {
            self.learn_cksum(p, framing);
        }
        let Some(c) = self.conn(conn) else {
            return;
        };
        let checked = match parsed {
            Ok((msg, _)) => match msg.body {
                KibBody::ConnAck(cp)
                    if msg.version == VERSION_2
                        && cp.queue_depth <= c.queue_depth
                        && cp.queue_depth >= 2
                        && cp.max_frags <= c.max_frags
                        && cp.max_frags > 0
                        && cp.max_msg_size as usize <= MSG_SIZE
                        && msg.src_nid == self.peers[p].nid =>
                {
                    if msg.dst_nid != self.cfg.nid || msg.dst_stamp != self.cfg.incarnation {
                        Err(DownReason::ProtocolError)
                    } else {
                        Ok((msg.src_stamp, cp))
                    }
                }
                _ => Err(DownReason::ProtocolError),
            },
            Err(_) => Err(DownReason::ProtocolError),
        };
        let (stamp, cp) = match checked {
            Ok(v) => v,
            Err(reason) => {
                // The queue pair is up: go through ESTABLISHED and close at once (as o2iblnd).
                self.stats.bad_msgs += 1;
                self.clear_attempt(p, conn);
                self.transition(conn, ConnInput::Established);
                self.close_conn(conn, Some(reason));
                return;
            }
        };
        if self.names_replaced_instance(p, stamp) {
            // An answer from an instance a newer one replaced (our request named none): the
            // connection leads nowhere.
            self.stats.superseded_connreqs += 1;
            self.clear_attempt(p, conn);
            self.transition(conn, ConnInput::Established);
            self.close_conn(conn, Some(DownReason::Rebooted));
            return;
        }
        let known = self.peers[p].incarnation;
        if known != 0 && known != stamp {
            self.stats.peer_reboots += 1;
            self.close_peer_conns(p, DownReason::Rebooted);
        }
        self.peers[p].set_incarnation(stamp);
        self.clear_attempt(p, conn);
        if let Some(c) = self.conn_mut(conn) {
            c.peer_stamp = stamp;
            c.queue_depth = cp.queue_depth;
            c.max_frags = cp.max_frags;
            c.credits = cp.queue_depth;
            c.reserved = cp.queue_depth;
        }
        // What connects take, for the hedge delay.
        if let Some(c) = self.conn(conn) {
            let took = self.now.saturating_duration_since(c.created);
            self.connect_srtt = Some(match self.connect_srtt {
                None => took,
                Some(s) => Duration::from_nanos(s.as_nanos() / 8 * 7 + took.as_nanos() / 8),
            });
        }
        self.established(conn);
        self.peers[p].hedge_round = 0;
        // One of a hedged pair won: the other is not needed (see `Tunables::connect_hedge`).
        if let Some(other) = self.peers[p].active.filter(|&o| o != conn) {
            debug!(peer = %self.peers[p].nid, ?other, "the other attempt of the pair is not needed");
            self.handshake_failed(other, None, false, true);
        }
        self.maybe_add_conn(p);
    }

    /// `conn` is no longer one of the peer's active connects in flight.
    fn clear_attempt(&mut self, p: PeerIdx, conn: ConnId) {
        let peer = &mut self.peers[p];
        if peer.active == Some(conn) {
            peer.active = peer.stalled.take();
        } else if peer.stalled == Some(conn) {
            peer.stalled = None;
        }
    }

    /// The active connect `conn` failed (kiblnd_rejected and the CM error events).
    pub fn handle_connect_failed(&mut self, now: Instant, conn: ConnId, why: ConnectFailure) {
        self.advance(now);
        let Some(c) = self.conn(conn) else {
            return;
        };
        if c.state != ConnState::ActiveConnect {
            return;
        }
        let p = c.peer;
        // Refused (nothing listens, or a reject), or not reached at all: what waits for the
        // peer fails with the one or the other (kiblnd_peer_connect_failed).
        self.peers[p].refused = matches!(
            why,
            ConnectFailure::Rejected(_) | ConnectFailure::NoListener
        );
        let retry = match why {
            ConnectFailure::Rejected(private) => match KibRej::parse(private.as_bytes()) {
                Ok((rej, _)) => {
                    LndStats::count_reject(&mut self.stats.rejects_received, rej.why);
                    let replaced = self.names_replaced_instance(p, rej.incarnation);
                    let peer = &mut self.peers[p];
                    match rej.why {
                        RejectReason::ConnStale => {
                            // Learn who the peer is now, so the retry names it (not from a late
                            // answer of an instance the one we are connected to replaced).
                            if rej.incarnation != 0 && !replaced {
                                peer.set_incarnation(rej.incarnation);
                            }
                            true
                        }
                        RejectReason::MsgQueueSize => {
                            if rej.cp.queue_depth >= 2 && rej.cp.queue_depth < peer.queue_depth {
                                peer.queue_depth = rej.cp.queue_depth;
                            }
                            true
                        }
                        RejectReason::RdmaFrags => {
                            if rej.cp.max_frags > 0 && rej.cp.max_frags < peer.max_frags {
                                peer.max_frags = rej.cp.max_frags;
                            }
                            true
                        }
                        RejectReason::ConnRace => {
                            peer.races_received += 1;
                            peer.peak_races_received =
                                peer.peak_races_received.max(peer.races_received);
                            let since = self.peers[p].disagreed_at;
                            if self.conn(conn).is_some_and(|c| {
                                c.refused_peer_race && since.is_none_or(|t| c.created > t)
                            }) {
                                // one disagreement per race, not one per attempt in it.
                                self.peers[p].disagreed_at = Some(self.now);
                                self.orders_disagree(p);
                            }
                            true
                        }
                        RejectReason::ConnUncompat => true,
                        _ => false,
                    }
                }
                Err(_) => {
                    LndStats::count_reject(
                        &mut self.stats.rejects_received,
                        RejectReason::Other(0),
                    );
                    false
                }
            },
            ConnectFailure::StaleConn => true,
            ConnectFailure::NoListener | ConnectFailure::Unreachable | ConnectFailure::Error => {
                self.stats.connect_failures += 1;
                false
            }
        };
        self.handshake_failed(conn, Some(DownReason::ConnectFailed), retry, false);
    }

    /// The race order in use with `nid`: the one learned for it, or our NI's.
    pub(super) fn race_order_for(&self, nid: Nid) -> RaceOrder {
        self.learned_orders
            .get(&nid)
            .copied()
            .unwrap_or(self.cfg.race_order)
    }

    /// Both sides refused each other in one race: the peer orders NIDs the
    /// other way. Switch to its order for this peer when [`adopts_peer_order`] says so.
    pub(super) fn orders_disagree(&mut self, p: PeerIdx) {
        let nid = self.peers[p].nid;
        self.stats.race_order_disagreements += 1;
        self.peers[p].disagreements += 1;
        let n = self.peers[p].disagreements;
        if !self.cfg.race_policy.adapts_to_peer() || !adopts_peer_order(self.cfg.nid, nid, n) {
            debug!(peer = %nid, disagreements = n, "the peer orders NIDs the other way");
            return;
        }
        let adopted = self.race_order_for(nid).other();
        if adopted == self.cfg.race_order {
            self.learned_orders.remove(&nid);
        } else if self.learned_orders.len() < self.cfg.peer_limit {
            self.learned_orders.insert(nid, adopted);
        }
        self.peers[p].disagreements = 0;
        // Refusals made under the order just dropped are no evidence about the new one.
        for a in [self.peers[p].active, self.peers[p].stalled]
            .into_iter()
            .flatten()
        {
            if let Some(c) = self.conn_mut(a) {
                c.refused_peer_race = false;
            }
        }
        self.stats.race_order_adoptions += 1;
        debug!(peer = %nid, order = adopted.name(), "the peer orders NIDs the other way: adopting its order");
    }

    /// Remembers the flavour of a peer's checksum from a message that carried one.
    pub(super) fn learn_cksum(&mut self, p: PeerIdx, framing: &Framing) {
        let Some(flavour) = framing.cksum.and_then(|c| c.flavour) else {
            return;
        };
        let peer = &mut self.peers[p];
        if peer.cksum != Some(flavour) {
            peer.cksum = Some(flavour);
            match flavour {
                CksumFlavour::Signed => self.stats.cksum_signed_peers += 1,
                CksumFlavour::Unsigned => self.stats.cksum_unsigned_peers += 1,
            }
        }
    }

    pub(super) fn my_connparams(&self) -> ConnParams {
        ConnParams {
            queue_depth: self.cfg.tunables.queue_depth(),
            max_frags: MAX_RDMA_FRAGS as u16,
            max_msg_size: MSG_SIZE as u32,
        }
    }

    /// Whether `stamp` names an instance of the peer that the one we are connected to
    /// replaced: a request (or answer) of it was in flight across the peer's restart. Only
    /// while an established connection to the current instance, not on probation, shows that
    /// one is alive: without it the current one may itself be the older (its late request
    /// reached us after the newer one's), and refusing the newer would wedge the pair.
    pub(super) fn names_replaced_instance(&self, p: PeerIdx, stamp: u64) -> bool {
        let peer = &self.peers[p];
        peer.is_superseded(stamp)
            && peer.conns.iter().any(|&c| {
                self.conn(c).is_some_and(|c| {
                    c.state == ConnState::Established
                        && !c.probation
                        && c.peer_stamp == peer.incarnation
                })
            })
    }

    pub(super) fn reject(&mut self, req: RequestId, why: RejectReason) {
        LndStats::count_reject(&mut self.stats.rejects_sent, why);
        let rej = KibRej {
            version: VERSION_2,
            why,
            incarnation: self.cfg.incarnation,
            cp: self.my_connparams(),
        };
        let mut private = PrivateData::EMPTY;
        if let Ok(n) = rej.emit(private.buf_mut(), Default::default()) {
            private.set_len(n);
        }
        self.actions
            .push_back(FabricAction::Reject { req, private });
    }

    pub(super) fn new_conn(
        &mut self,
        peer: PeerIdx,
        active: bool,
        queue_depth: u16,
        max_frags: u16,
    ) -> ConnId {
        let id = self.conns.insert(Conn {
            peer,
            state: ConnState::Init,
            active,
            peer_stamp: 0,
            sent_dst_stamp: 0,
            refused_peer_race: false,
            probation: false,
            probation_since: self.now,
            queue_depth,
            max_frags,
            credits: queue_depth,
            outstanding: 0,
            reserved: queue_depth,
            nsends_posted: 0,
            noops_posted: 0,
            tx_rsrvd: VecDeque::new(),
            tx_cred: VecDeque::new(),
            tx_nocred: VecDeque::new(),
            last_send: self.now,
            last_recv: self.now,
            timer: None,
            error: None,
            reconnect: false,
            disconnect_sent: false,
            early_rx: Vec::new(),
            rdma_rx: Vec::new(),
            created: self.now,
        });
        // After the insert: the one that grows the table arms the trim.
        self.note_growth(self.conns.capacity());
        id
    }

    pub(super) fn connect_now(&mut self, p: PeerIdx) {
        let peer = &mut self.peers[p];
        let reconnect = peer.attempts > 0;
        if peer.attempts < self.cfg.tunables.fast_reconnects {
            peer.attempts += 1;
        }
        peer.last_attempt = Some(self.now);
        peer.reconnect_wanted = false;
        let (nid, qd, frags, dst_stamp) =
            (peer.nid, peer.queue_depth, peer.max_frags, peer.incarnation);
        let id = self.new_conn(p, true, qd, frags);
        self.transition(id, ConnInput::StartConnect);
        if let Some(c) = self.conn_mut(id) {
            c.sent_dst_stamp = dst_stamp;
        }
        self.peers[p].active = Some(id);
        self.stats.connects += 1;
        if self.cfg.race_policy.hedges() && !self.cfg.tunables.connect_hedge.is_zero() {
            let at = self.now + self.hedge_delay();
            self.wheel.insert(at, TimerEvent::Hedge(id));
        }
        if reconnect {
            self.stats.reconnects += 1;
        }
        trace!(peer = %nid, conn = ?id, "active connect");
        let req = KibBody::ConnReq(our_params(qd, frags));
        let private = self.handshake_private(p, id, (nid, dst_stamp), req);
        self.actions.push_back(FabricAction::Connect {
            conn: id,
            peer: nid,
            private,
            recv_slots: recv_slots(qd),
        });
        if self.cfg.race_policy.bounds_connects() {
            let at = self.now + self.cfg.tunables.connect_timeout();
            self.arm_conn_timer(id, at);
        }
    }

    pub(super) fn passive_established(&mut self, conn: ConnId) {
        let Some(c) = self.conn(conn) else {
            return;
        };
        let p = c.peer;
        self.peers[p].accepting.retain(|&a| a != conn);
        self.established(conn);
        let early = self
            .conn_mut(conn)
            .map(|c| std::mem::take(&mut c.early_rx))
            .unwrap_or_default();
        for (slot, bytes) in early {
            self.handle_recv(self.now, conn, slot, &bytes);
        }
    }

    /// Common to both sides once a connection is up (kiblnd_connreq_done).
    pub(super) fn established(&mut self, conn: ConnId) {
        self.disarm_conn_timer(conn);
        if self.transition(conn, ConnInput::Established).is_none() {
            return;
        }
        let now = self.now;
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        c.last_send = now;
        c.last_recv = now;
        let (p, stamp) = (c.peer, c.peer_stamp);
        self.stats.established += 1;
        // Connections to an older instance of this peer are dead.
        let stale: Vec<ConnId> = self.peers[p]
            .conns
            .iter()
            .copied()
            .filter(|&o| self.conn(o).is_some_and(|oc| oc.peer_stamp != stamp))
            .collect();
        for o in stale {
            self.close_conn(o, Some(DownReason::Rebooted));
        }
        let peer = &mut self.peers[p];
        peer.conns.push(conn);
        peer.attempts = 0;
        peer.races = 0;
        peer.races_received = 0;
        self.cancel_reconnect(p);
        if !self.cfg.tunables.keepalive.is_zero() {
            let keepalive = self.now + self.cfg.tunables.keepalive;
            self.arm_conn_timer(conn, keepalive);
        }
        let nid = self.peers[p].nid;
        if !self.peers[p].up {
            self.peers[p].up = true;
            self.peers[p].reported_down = false;
            self.events.push_back(LndEvent::PeerUp { nid });
        }
        trace!(peer = %nid, conn = ?conn, "established");
        self.flush_held(p);
        self.check_sends(conn, false);
    }

    /// A handshake that did not complete: the connection becomes a zombie for connd to reap, and
    /// the peer's queued messages fail unless another attempt is on its way
    /// (kiblnd_connreq_done with an error, kiblnd_peer_connect_failed).
    ///
    /// `notify_peer` is set when we give up on our own (deadline, stale, shutdown, superseded):
    /// the peer may already consider the connection made, so it is told with a Disconnect before
    /// the teardown; a failure the fabric reported needs none.
    pub(super) fn handshake_failed(
        &mut self,
        conn: ConnId,
        reason: Option<DownReason>,
        retry: bool,
        notify_peer: bool,
    ) {
        self.disarm_conn_timer(conn);
        let Some(c) = self.conn(conn) else {
            return;
        };
        let p = c.peer;
        if self.transition(conn, ConnInput::HandshakeFailed).is_none() {
            return;
        }
        if notify_peer {
            if let Some(c) = self.conn_mut(conn) {
                c.disconnect_sent = true;
            }
            self.actions.push_back(FabricAction::Disconnect { conn });
        }
        self.clear_attempt(p, conn);
        let peer = &mut self.peers[p];
        peer.accepting.retain(|&a| a != conn);
        if let Some(c) = self.conn_mut(conn) {
            c.reconnect = retry;
            c.error = reason;
        }
        self.schedule_reap(conn);
        let peer = &self.peers[p];
        if !peer.conns.is_empty() && !peer.tx_queue.is_empty() {
            self.flush_held(p);
        }
        let peer = &self.peers[p];
        if !retry && peer.conns.is_empty() && !peer.connecting() {
            let err = self.connect_error(p);
            self.fail_peer_queue(p, err);
            if let Some(reason) = reason {
                self.peer_down(p, reason);
            }
        }
    }
}

pub(super) fn recv_slots(queue_depth: u16) -> u16 {
    queue_depth.saturating_mul(2).saturating_add(OOB_SLOTS)
}

/// The parameters we offer (CONNREQ) or accept (CONNACK): `queue_depth` and `max_frags` as
/// negotiated, our message size.
fn our_params(queue_depth: u16, max_frags: u16) -> ConnParams {
    ConnParams {
        queue_depth,
        max_frags,
        max_msg_size: MSG_SIZE as u32,
    }
}

impl Endpoint {
    /// Our side of a connection handshake (`body`: CONNREQ or CONNACK) on `id` with peer `p`,
    /// `(nid, stamp)` on the wire, as the connect's or accept's private data; recorded as sent
    /// when capturing.
    fn handshake_private(
        &mut self,
        p: PeerIdx,
        id: ConnId,
        (nid, stamp): (Nid, u64),
        body: KibBody<'_>,
    ) -> PrivateData {
        let msg = KibMsg::v2((self.cfg.nid, self.cfg.incarnation), (nid, stamp), body);
        let private = encode_private(&msg, self.emit_opts(p));
        if self.capture.is_some() {
            self.record(CaptureDir::Sent, id, nid, private.as_bytes());
        }
        private
    }
}

pub(super) fn encode_private(msg: &KibMsg<'_>, opts: EmitOpts) -> PrivateData {
    let mut p = PrivateData::EMPTY;
    match msg.emit(p.buf_mut(), opts) {
        Ok(n) => p.set_len(n),
        Err(e) => error!(error = %e, "cannot encode connection private data"),
    }
    p
}
