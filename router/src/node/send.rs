//! The node's send path: where a message goes (our own NIDs and `0@lo` in memory, a local net
//! through its NI, another net through a gateway: lnet_select_pathway and lnet_find_route_locked
//! in our own words), a message's life in the node's table, LNet's peer and NI tx credits
//! (lnet_post_send_locked, lnet_return_tx_credits_locked), its end with a status, and resends
//! of local failures (lnet_attempt_msg_resend).

use super::*;

impl LnetNode {
    pub(super) fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    pub(super) fn is_own(&self, nid: Nid) -> bool {
        self.node_nids.contains(&nid)
    }

    /// Whether `nid` is one of the node's NIDs that a sibling runtime runs, not this one (a
    /// message to it goes to that runtime: see [`Handover::Local`]).
    pub fn is_sibling_nid(&self, nid: Nid) -> bool {
        self.is_own(nid) && !self.nis.iter().any(|n| n.nid == nid)
    }

    /// Where a message to `dst` goes (lnet_select_pathway, without Multi-Rail): ourselves in
    /// memory; a peer on the net of one of our NIs directly; a peer on a sibling runtime's net
    /// through that runtime; else through the best live route's gateway
    /// ([`RouteTable::select`]), which this call records as used (round robin).
    pub(super) fn route(&mut self, dst: Nid) -> Result<Route, LnetError> {
        self.route_leg(dst, Leg::Any)
    }

    /// Where `dst` is reached from here by a message that may take `leg` ([`Leg::of`]); the
    /// gateway chosen, if any, is recorded as used (round robin).
    pub(super) fn route_leg(&mut self, dst: Nid, leg: Leg) -> Result<Route, LnetError> {
        let (route, gw) = self.peek_route(dst, leg)?;
        if let Some(gw) = gw {
            self.paths.seq += 1;
            self.paths.used.insert(gw, self.paths.seq);
        }
        Ok(route)
    }

    /// What `route_leg` would choose, without stamping the gateway as used (the round-robin
    /// tie-breaker): the route and, through a gateway, which.
    pub(super) fn peek_route(&self, dst: Nid, leg: Leg) -> Result<(Route, Option<Nid>), LnetError> {
        if dst == Nid::LO_0 || self.nis.iter().any(|n| n.nid == dst) {
            return Ok((Route::Local(dst), None));
        }
        if self.is_own(dst) {
            // Another runtime's NI: delivered in memory there, not here (where it reached
            // this runtime's users in its sibling's name: a selftest from a second NI failed).
            return Ok((Route::SiblingNi, None));
        }
        if let Some(ni) = self.ni_on(dst.net()) {
            return Ok((Route::Remote { ni, next: dst }, None));
        }
        if self.node_nids.iter().any(|n| n.net() == dst.net()) {
            return Ok((Route::Sibling(dst.net()), None));
        }
        let select = |leg: Leg| {
            let (nis, peers, gateways, used) = (
                &self.nis,
                &self.peers,
                &self.paths.gateways,
                &self.paths.used,
            );
            let node_nids = &self.node_nids;
            self.paths
                .routes
                .select(
                    dst.net(),
                    |gw| {
                        if nis.iter().any(|n| n.nid.net() == gw.net()) {
                            let p = peers.get(&gw);
                            Some(GatewayState {
                                alive: true,
                                queued_bytes: p.map_or(0, |p| p.txqnob),
                                credits: p.map_or(i64::MAX, |p| p.tx_credits),
                                health: p.map_or(MAX_HEALTH, |p| p.health.value),
                            })
                        } else if node_nids.iter().any(|n| n.net() == gw.net()) {
                            // A sibling's gateway: usable, after our own at equal rank.
                            Some(GatewayState {
                                alive: true,
                                queued_bytes: u64::MAX,
                                credits: i64::MIN,
                                health: 0,
                            })
                        } else {
                            None
                        }
                    },
                    |gw| used.get(&gw).copied().unwrap_or(0),
                    |r| {
                        (!gateways.is_gateway(r.gateway) || gateways.route_alive(r))
                            && (leg == Leg::Any || gateways.is_last_hop(r))
                    },
                )
                .map(|r| r.gateway)
        };
        let Some(gw) = select(leg) else {
            return Err(if leg == Leg::Last && select(Leg::Any).is_some() {
                LnetError::HopLimit(dst)
            } else {
                LnetError::NoRoute(dst)
            });
        };
        Ok((
            match self.ni_on(gw.net()) {
                Some(ni) => Route::Remote { ni, next: gw },
                None => Route::Sibling(gw.net()),
            },
            Some(gw),
        ))
    }

    /// Our first NI on `net`.
    pub(super) fn ni_on(&self, net: Net) -> Option<usize> {
        self.nis.iter().position(|n| n.nid.net() == net)
    }

    /// Routes a new user message and checks what the path can carry; a refusal is counted.
    pub(super) fn route_checked(&mut self, dst: Nid, len: usize) -> Result<Route, LnetError> {
        let checked = if self.shutting_down {
            Err(LnetError::Shutdown)
        } else {
            self.route(dst).and_then(|r| {
                let max = match r {
                    Route::Local(_) | Route::SiblingNi => LNET_MTU as usize,
                    Route::Remote { ni, .. } => self.nis[ni].lnd.max_inline(),
                    // The daemon hands a user's message to the runtime on the right net; a
                    // runtime does not relay its own user's messages through a sibling.
                    Route::Sibling(_) => return Err(LnetError::NoRoute(dst)),
                };
                if len > max {
                    Err(LnetError::PayloadTooLarge { len, max })
                } else {
                    Ok(r)
                }
            })
        };
        if let Err(e) = &checked {
            self.count_error(e);
        }
        checked
    }

    pub(super) fn src_nid(&self, route: Route) -> Nid {
        match route {
            Route::Local(src) => src,
            Route::Remote { ni, .. } => self.nis[ni].nid,
            // From this runtime's NI, so that the answer comes back here.
            Route::SiblingNi => self.nis.first().map_or(Nid::ANY, |n| n.nid),
            // Not sent from here (see `route_checked`).
            Route::Sibling(_) => Nid::ANY,
        }
    }

    pub(super) fn alloc_msg(&mut self) {
        self.stats.msgs_alloc += 1;
        self.stats.msgs_max = self.stats.msgs_max.max(self.stats.msgs_alloc);
    }

    pub(super) fn free_msg(&mut self) {
        self.stats.msgs_alloc = self.stats.msgs_alloc.saturating_sub(1);
    }

    /// Starts a message on `route` (never `Route::Sibling`: callers hand those over).
    pub(super) fn launch(
        &mut self,
        route: Route,
        hdr: LnetHdr,
        payload: Vec<u8>,
        purpose: Purpose,
    ) {
        self.alloc_msg();
        match route {
            Route::Local(_) => self.local.push_back(LocalMsg {
                hdr,
                payload,
                purpose,
                from_sibling: false,
            }),
            Route::SiblingNi => {
                // Sent as lolnd sends (no credits), the sibling runtime receives it in memory;
                // nobody waits for more than the handover (a GET's REPLY comes back the same
                // way, or its deadline ends it).
                let len = payload.len() as u64;
                self.stats.send_count += 1;
                self.stats.send_length += len;
                self.stats.loopback_count += 1;
                self.stats.loopback_length += len;
                self.free_msg();
                self.fwd
                    .handovers
                    .push_back(Handover::Local { hdr, payload });
                if let Purpose::Put(id) = purpose {
                    self.events
                        .push_back(LnetEvent::PutDone { id, result: Ok(()) });
                }
            }
            route => {
                // Why it cannot be sent, if it cannot: finished in `process` with that status,
                // holding no credit. A sibling's NI is not ours to send on (the daemon hands such
                // messages over before they get here).
                let (peer, ni, refusal) = match route {
                    Route::Remote { ni, next } => {
                        let known = self.peer_entry(next, ni).is_some();
                        let e = LnetError::Refused(SendError::PeerTableFull(next));
                        (next, ni, (!known).then_some(e))
                    }
                    _ => (hdr.dest_nid, 0, Some(LnetError::NoRoute(hdr.dest_nid))),
                };
                let cookie = self.msgs.insert(OutMsg {
                    len: payload.len(),
                    payload,
                    ..OutMsg::new(peer, ni, hdr, purpose, self.now)
                });
                match refusal {
                    None => self.post_send(cookie),
                    Some(e) => self.refused.push_back((cookie, e)),
                }
            }
        }
    }

    /// Takes the credits a message still lacks, peer first, then NI (lnet_post_send_locked); a
    /// counter that goes negative parks the message. With both, the message goes to the LND.
    pub(super) fn post_send(&mut self, cookie: u64) {
        let Some(m) = self.msgs.get_mut(&cookie) else {
            return;
        };
        let (peer_nid, ni, len) = (m.peer, m.ni, m.len);
        if !m.peer_credit {
            // Our own answers only: what a router forwards is bounded by its buffers and
            // router credits already.
            let response = m.is_own_answer();
            let Some(p) = self.peers.get_mut(&peer_nid) else {
                return;
            };
            if response && p.txq_responses >= RESPONSE_BACKLOG {
                self.stats.drop_count += 1;
                self.stats.drop_length += len as u64;
                self.refused
                    .push_back((cookie, LnetError::Backlog(peer_nid)));
                return;
            }
            m.peer_credit = true;
            p.tx_credits -= 1;
            p.min_tx_credits = p.min_tx_credits.min(p.tx_credits);
            if p.tx_credits < 0 {
                p.txq.push_back(cookie);
                p.txq_responses += usize::from(response);
                p.txqnob += (len + LNET_HDR_LEN) as u64;
                trace!(peer = %peer_nid, credits = p.tx_credits, "waiting for a peer credit");
                return;
            }
        }
        if !m.ni_credit {
            m.ni_credit = true;
            let n = &mut self.nis[ni];
            n.tx_credits -= 1;
            n.min_tx_credits = n.min_tx_credits.min(n.tx_credits);
            if n.tx_credits < 0 {
                n.delayed.push_back(cookie);
                trace!(ni = %n.nid, credits = n.tx_credits, "waiting for an NI credit");
                return;
            }
        }
        let payload = std::mem::take(&mut m.payload);
        let bulk = m.bulk.take();
        m.rendezvous |= bulk.is_some();
        let hdr = m.hdr;
        let now = self.now;
        let lnd = &mut self.nis[ni].lnd;
        let sent = match bulk {
            None => lnd.send(now, peer_nid, hdr, payload, cookie),
            Some(b) => lnd.send_bulk(now, peer_nid, hdr, b, cookie),
        };
        match sent {
            Ok(()) => {
                self.stats.send_count += 1;
                self.stats.send_length += len as u64;
                self.nis[ni].send_count += 1;
                if let Some(p) = self.peers.get_mut(&peer_nid) {
                    p.send_count += 1;
                }
            }
            Err(e) => self.refused.push_back((cookie, LnetError::Refused(e))),
        }
    }

    /// The LND is done with a message: return its credits, count, and tell whoever waits.
    pub(super) fn finish_out(&mut self, cookie: u64, result: Result<(), LnetError>) {
        self.finish_out_returning(cookie, result, Vec::new());
    }

    /// [`LnetNode::finish_out`], with the payload the LND gave back if it failed the message
    /// (for a resend).
    pub(super) fn finish_out_returning(
        &mut self,
        cookie: u64,
        result: Result<(), LnetError>,
        returned: Vec<u8>,
    ) {
        let Some(mut m) = self.msgs.remove(&cookie) else {
            debug!(cookie, "completion for an unknown message");
            self.recycle(returned);
            return;
        };
        match &result {
            Err(e) => match self.resend(m, e, returned) {
                None => return,
                Some(back) => m = back,
            },
            Ok(()) if m.retries > 0 => self.stats.successful_resends += 1,
            Ok(()) => {}
        }
        self.free_msg();
        self.return_credits(&m);
        // A bulk PUT to forward that did not come in is counted as the forward's drop.
        let forwarding = matches!(m.purpose, Purpose::ForwardIn(_));
        let recovery = match m.purpose {
            Purpose::PingGet(PingId(id)) => self
                .pings
                .kind(id)
                .is_some_and(|k| matches!(k, PingKind::Recovery | PingKind::LocalRecovery(_))),
            _ => false,
        };
        self.judge_health(m.ni, m.peer, result.as_ref().err(), recovery);
        if let Err(e) = &result {
            self.count_error(e);
            if !forwarding {
                self.nis[m.ni].drop_count += 1;
            }
            let routing = self.fwd.on;
            if let Some(p) = self.peers.get_mut(&m.peer).filter(|_| !forwarding) {
                p.drop_count += 1;
                // On a router, the LND failing to reach a peer (o2iblnd notifies LNet of a
                // failed connect, kiblnd_peer_connect_failed -> lnet_notify) marks it down until
                // the LND reports it up: lnet_check_message_drop then drops what is routed to it
                // (`drops_for_down_peer`). The LND reports a peer it never reached only once its
                // retries end, too late to spare the router's buffers.
                if routing
                    && matches!(
                        e,
                        LnetError::Lnd(
                            TxError::ConnectFailed
                                | TxError::ConnectRefused
                                | TxError::PeerUnreachable
                                | TxError::Timeout
                        )
                    )
                {
                    p.state = PeerState::Down;
                }
            }
        }
        let len = m.len as u32;
        match m.purpose {
            Purpose::Put(id) => self.events.push_back(LnetEvent::PutDone { id, result }),
            Purpose::GetBulk(id) => {
                if result.is_ok() {
                    self.stats.recv_count += 1;
                    self.stats.recv_length += u64::from(len);
                }
                let result = result.map(|()| len);
                self.events.push_back(LnetEvent::GetDone { id, result });
            }
            Purpose::SinkPut {
                md,
                match_bits,
                hdr_data,
                ack,
            } => {
                if result.is_ok() {
                    self.stats.recv_count += 1;
                    self.stats.recv_length += u64::from(len);
                    self.nis[m.ni].recv_count += 1;
                }
                if result.is_ok() {
                    // lnet_finalize -> lnet_ack: the PUT is in, tell its sender.
                    self.ack(&m.hdr, None, ack, match_bits, len as usize);
                }
                self.events.push_back(LnetEvent::BulkPut {
                    md,
                    from: m.hdr.src_nid,
                    match_bits,
                    hdr_data,
                    result: result.map(|()| len),
                });
            }
            Purpose::ForwardIn(key) => self.forward_received(key, result),
            Purpose::GetRouted(cookie) => {
                if let Err(e) = result {
                    self.end_bulk_get(cookie, Err(e), true);
                }
            }
            Purpose::ServeReply(md) => {
                self.events.push_back(LnetEvent::BulkGetServed {
                    md,
                    to: m.hdr.dest_nid,
                    result: result.map(|()| len),
                });
            }
            Purpose::ServeGet(md) => {
                if result.is_ok() {
                    self.stats.send_count += 1;
                    self.stats.send_length += u64::from(len);
                    self.nis[m.ni].send_count += 1;
                }
                self.events.push_back(LnetEvent::BulkGetServed {
                    md,
                    to: m.hdr.src_nid,
                    result: result.map(|()| len),
                });
            }
            Purpose::PingGet(PingId(id)) | Purpose::GatewayPing(PingId(id)) => {
                if let Err(e) = result {
                    // The GET never made it: fail the ping now rather than at its timeout.
                    self.complete_ping(id, Err(e));
                }
            }
            Purpose::Response => {}
            Purpose::Forward { origin, key, .. } => self.forward_sent(origin, key, result),
        }
    }

    /// A message failed locally: sent again if Lustre would (lib-msg.c lnet_health_check and
    /// lnet_attempt_msg_resend), else given back (`Some`) to be finished with its failure.
    /// Lustre resends a local failure only on a node with more than one NI, at most
    /// `retry_count` times, each attempt within `transaction_timeout` of its own start
    /// (msg_deadline is set at every commit), never a recovery ping and never while shutting
    /// down. With o2iblnd's statuses (kiblnd_abort_txs) the local failure that leaves a
    /// message unsent is LOCAL_TIMEOUT: it was still queued on a connection that timed out.
    /// One that was posted and failed is REMOTE_DROPPED (the peer may have it), and a remote
    /// failure is resent only to a peer with a second NI (Multi-Rail), which ulnet's peers
    /// never have. The new attempt picks its path again (another gateway, after health
    /// judged this one); a forward goes again to the next hop it had, unless LNet now holds
    /// that hop down. Messages by rendezvous (bulk) are not resent by ulnet.
    pub(super) fn resend(
        &mut self,
        mut m: OutMsg,
        e: &LnetError,
        returned: Vec<u8>,
    ) -> Option<OutMsg> {
        let local = HStatus::of(e).is_some_and(HStatus::is_resendable);
        let shutdown = matches!(e, LnetError::Shutdown | LnetError::Lnd(TxError::Shutdown));
        let forward = matches!(m.purpose, Purpose::Forward { .. });
        let kind_ok = match m.purpose {
            Purpose::Put(_) | Purpose::Response | Purpose::Forward { .. } => true,
            Purpose::PingGet(PingId(id)) => {
                self.pings.kind(id).is_some_and(|k| k == PingKind::User)
            }
            _ => false,
        };
        let retry = self.recovery.cfg.retry_count;
        if !local
            || shutdown
            || self.shutting_down
            || !kind_ok
            || m.rendezvous
            || m.bulk.is_some()
            || retry == 0
            || self.node_nids.len() < 2
        {
            self.recycle(returned);
            return Some(m);
        }
        if m.retries >= retry {
            self.stats.failed_resends += 1;
            self.recycle(returned);
            return Some(m);
        }
        let deadline = m
            .born
            .saturating_add(Duration::from_secs(self.recovery.cfg.transaction_timeout));
        // Queued here, or given back by the LND: the payload to send again.
        let payload = if m.payload.is_empty() {
            returned
        } else {
            self.recycle(returned);
            std::mem::take(&mut m.payload)
        };
        let path = if self.now >= deadline || payload.len() != m.len {
            None
        } else if forward {
            // The hop it had (the one it came from was checked then), unless held down.
            (!self.drops_for_down_peer(m.peer, m.ni)).then_some((m.ni, m.peer))
        } else {
            match self.route(m.hdr.dest_nid) {
                Ok(Route::Remote { ni, next }) => Some((ni, next)),
                _ => None,
            }
        };
        let path = path.filter(|&(ni, next)| self.peer_entry(next, ni).is_some());
        let Some((ni, next)) = path else {
            m.payload = payload;
            return Some(m);
        };
        // This attempt's failure is judged and counted, as lnet_health_check does before it
        // queues the resend; its credits go back (lnet_msg_decommit_tx).
        self.judge_health(m.ni, m.peer, Some(e), false);
        self.count_status(e);
        self.return_credits(&m);
        debug!(dst = %m.hdr.dest_nid, via = %next, retry = m.retries + 1, "resending after {e}");
        if !forward && ni != m.ni {
            // Our own message leaves from the NI it now takes.
            m.hdr.src_nid = self.nis[ni].nid;
        }
        m.peer_credit = false;
        m.ni_credit = false;
        m.retries = m.retries.saturating_add(1);
        m.born = self.now;
        m.ni = ni;
        m.peer = next;
        m.payload = payload;
        let cookie = self.msgs.insert(m);
        self.stats.resend_count += 1;
        self.post_send(cookie);
        None
    }

    /// lnet_return_tx_credits_locked: give back the NI credit, then the peer credit; a counter
    /// still at or below zero after the return means someone waits, and the oldest goes now.
    pub(super) fn return_credits(&mut self, m: &OutMsg) {
        if m.ni_credit {
            let n = &mut self.nis[m.ni];
            n.tx_credits += 1;
            if n.tx_credits <= 0 {
                if let Some(next) = n.delayed.pop_front() {
                    self.post_send(next);
                }
            }
        }
        if m.peer_credit {
            let Some(p) = self.peers.get_mut(&m.peer) else {
                return;
            };
            p.tx_credits += 1;
            // The oldest waiting goes now; one past its deadline is dropped instead (its
            // credit comes back with it) and the next is tried (lnet_post_send_locked's
            // lnet_check_message_drop). A loop, not a recursion: a peer that returned no
            // credit for a while may have a long queue of them.
            let timeout = Duration::from_secs(self.recovery.cfg.transaction_timeout);
            let now = self.now;
            while p.tx_credits <= 0 {
                let Some(next) = p.txq.pop_front() else {
                    break;
                };
                let Some(n) = self.msgs.get_mut(&next) else {
                    continue;
                };
                p.txqnob = p.txqnob.saturating_sub((n.len + LNET_HDR_LEN) as u64);
                let forward = matches!(n.purpose, Purpose::Forward { .. });
                if n.is_own_answer() {
                    p.txq_responses = p.txq_responses.saturating_sub(1);
                }
                if forward || now < n.born.saturating_add(timeout) {
                    self.post_send(next);
                    break;
                }
                n.peer_credit = false;
                p.tx_credits += 1;
                self.stats.drop_count += 1;
                self.stats.drop_length += n.len as u64;
                self.refused.push_back((next, LnetError::Expired));
            }
        }
    }

    pub(super) fn count_error(&mut self, e: &LnetError) {
        let s = &mut self.stats;
        s.errors += 1;
        if matches!(e, LnetError::Timeout) {
            s.response_timeout_count += 1;
        }
        self.count_status(e);
    }

    /// The health status's counter of a failed attempt (lnet_incr_hstats: every attempt,
    /// resent or not).
    pub(super) fn count_status(&mut self, e: &LnetError) {
        let s = &mut self.stats;
        // The health status's counter (lnet_incr_hstats), one mapping for these and for
        // the NI's and peer NI's `health stats` (`HStatus::of`).
        match HStatus::of(e) {
            Some(HStatus::LocalInterrupt) => s.local_interrupt_count += 1,
            Some(HStatus::LocalDropped) => s.local_dropped_count += 1,
            Some(HStatus::LocalAborted) => s.local_aborted_count += 1,
            Some(HStatus::LocalNoRoute) => s.local_no_route_count += 1,
            Some(HStatus::LocalTimeout) => s.local_timeout_count += 1,
            Some(HStatus::LocalError) => s.local_error_count += 1,
            Some(HStatus::RemoteDropped) => s.remote_dropped_count += 1,
            Some(HStatus::RemoteError) => s.remote_error_count += 1,
            Some(HStatus::RemoteTimeout) => s.remote_timeout_count += 1,
            Some(HStatus::NetworkTimeout) => s.network_timeout_count += 1,
            None => {}
        }
    }
}
