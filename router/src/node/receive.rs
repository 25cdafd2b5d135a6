//! The node's receive path: what an LND brings up (lnet_parse), answered to the LND exactly
//! once; delivery in memory to our own NIDs; matching a message addressed to us (the ping
//! service, PUTs into posted MDs, REPLYs to our pings and GETs, ACKs) and the responses; a
//! message for another node goes to the forwarding pipeline (`node/forwarding.rs`).

use super::*;

impl LnetNode {
    pub(super) fn on_lnd_event(&mut self, ni: usize, ev: LndEvent) {
        let now = self.now;
        match ev {
            LndEvent::Received {
                from,
                hdr,
                payload,
                rx,
            } => {
                // The contract: hand every received message back exactly once. A message for
                // us goes back at once; one for another node when it has a router buffer
                // (`forwarding`).
                self.note_arrival(ni, from, &hdr);
                if hdr.dest_nid == self.nis[ni].nid {
                    self.nis[ni].lnd.recv_done(now, rx);
                    self.parse(Some(ni), from, hdr, payload);
                } else {
                    self.forward_arrived(ni, from, hdr, Arrival::Inline(payload), rx);
                }
            }
            LndEvent::SendDone {
                cookie,
                result,
                returned,
                ..
            } => {
                self.finish_out_returning(cookie, result.map_err(LnetError::Lnd), returned);
            }
            LndEvent::BulkRequest { from, hdr, op, rx } => {
                self.on_rdma_request(ni, from, hdr, op, rx);
            }
            LndEvent::BulkDone { cookie, result, .. } => self.on_rdma_done(cookie, result),
            LndEvent::PeerUp { nid } => {
                self.paths.gateways.notify(self.now, nid, true);
                if let Some(p) = self.peer_entry(nid, ni) {
                    p.state = PeerState::Up;
                }
                self.events.push_back(LnetEvent::PeerUp {
                    ni: NiIndex(ni),
                    nid,
                });
            }
            LndEvent::PeerDown { nid, reason } => {
                if self.paths.gateways.notify(self.now, nid, false) {
                    self.reroute_queued(nid);
                }
                if let Some(p) = self.peer_entry(nid, ni) {
                    p.state = PeerState::Down;
                }
                self.events.push_back(LnetEvent::PeerDown {
                    ni: NiIndex(ni),
                    nid,
                    reason,
                });
            }
        }
    }

    /// What every message from a peer tells us, whatever it carries and whoever it is for
    /// (lnet_parse): the peer NI heard from (its health's recovery may end), our net alive
    /// (net_last_alive), and a gateway that forwards to us alive (passive revival).
    pub(super) fn note_arrival(&mut self, ni: usize, from: Nid, hdr: &LnetHdr) {
        let now = self.now;
        let mut unhealthy = self.nis[ni].health.value < MAX_HEALTH;
        if let Some(p) = self.peer_entry(from, ni) {
            p.recv_count += 1;
            p.last_heard = Some(now);
            unhealthy |= p.health.value < MAX_HEALTH;
        }
        if unhealthy {
            self.heard_from(ni, from);
        }
        self.alive.board.heard(self.alive.slot[ni], now);
        if hdr.src_nid != from && self.paths.gateways.is_gateway(from) {
            self.paths.gateways.notify(now, from, true);
        }
    }

    /// A message short-circuited in memory: sent and received at once, no credits (as Lustre's
    /// loopback LND: "no send credit hassles").
    pub(super) fn deliver_local(&mut self, m: LocalMsg) {
        let len = m.payload.len() as u64;
        if !m.from_sibling {
            self.stats.send_count += 1;
            self.stats.send_length += len;
            self.stats.loopback_count += 1;
            self.stats.loopback_length += len;
        }
        let from = m.hdr.src_nid;
        self.parse(None, from, m.hdr, m.payload);
        self.free_msg();
        if let Purpose::Put(id) = m.purpose {
            self.events
                .push_back(LnetEvent::PutDone { id, result: Ok(()) });
        }
    }

    /// What we answer a ping with. A router reports each of its nets DOWN once it has heard
    /// no message on it for router_ping_timeout + alive_router_check_interval (router.c
    /// lnet_update_ni_status_locked), so that nodes routing through it to that net stop
    /// (`avoid_asym_router_failure`); a node that does not route says every NI is UP.
    pub(super) fn ping_reply(&self) -> Vec<u8> {
        let down = self.nets_down(self.now);
        if !self.fwd.on && !down.contains(&true) {
            return self.pings.buffer.clone();
        }
        ping::ping_buffer(
            self.pid,
            &self.node_nids,
            ping::our_features(self.fwd.on),
            |i| down[i],
        )
    }

    /// For each NID of the node, whether a router would report it DOWN at `now` (a sibling's
    /// NI that this runtime cannot see, never).
    /// Its fabric failed ([`LnetNode::fabric_lost`]) on any node; on a router, also its net
    /// silent for too long.
    pub(super) fn nets_down(&self, now: Instant) -> Vec<bool> {
        let cfg = self.paths.gateways.config();
        let bound = cfg.ping_timeout.saturating_add(cfg.check_interval);
        (0..self.node_nids.len())
            .map(|i| {
                self.alive.board.failed(i)
                    || (self.fwd.on
                        && self.alive.judged[i]
                        && !alive::net_alive(
                            self.alive.started,
                            self.alive.board.last(i),
                            now,
                            bound,
                        ))
            })
            .collect()
    }

    /// The NIDs of the node reported DOWN in its ping reply at `now`: a failed fabric, or on a
    /// router a net silent too long.
    pub fn silent_nids(&self, now: Instant) -> Vec<Nid> {
        let down = self.nets_down(now);
        self.node_nids
            .iter()
            .zip(down)
            .filter_map(|(&n, d)| d.then_some(n))
            .collect()
    }

    /// lnet_parse and the matching that follows, for one message (from the LND of NI `via`, or
    /// local when `None`).
    pub(super) fn parse(
        &mut self,
        via: Option<usize>,
        from: Nid,
        hdr: LnetHdr,
        mut payload: Vec<u8>,
    ) {
        self.alloc_msg();
        let for_me = match via {
            Some(ni) => hdr.dest_nid == self.nis[ni].nid,
            None => self.is_own(hdr.dest_nid) || hdr.dest_nid == Nid::LO_0,
        };
        let announced = hdr.payload_length as usize;
        let verdict = if !for_me {
            // `on_lnd_event` sends everything else to `forward_arrived`.
            Err("not addressed to us")
        } else if payload.len() < announced {
            Err("payload shorter than its header says")
        } else {
            payload.truncate(announced);
            Ok(())
        };
        let verdict = verdict.and_then(|()| self.match_msg(via, from, &hdr, payload));
        match verdict {
            Ok(len) => {
                self.stats.recv_count += 1;
                self.stats.recv_length += len as u64;
                if let Some(ni) = via {
                    self.nis[ni].recv_count += 1;
                }
            }
            Err(why) => {
                debug!(%from, dest = %hdr.dest_nid, kind = ?hdr.msg_type(), why, "dropping a message");
                self.count_rx_drop(via, from, u64::from(hdr.payload_length));
            }
        }
        self.free_msg();
    }

    /// Counts a message from `from` dropped on arrival (`len` bytes): in the node's totals,
    /// and in its NI's and the peer's when it came through an NI (`via`).
    pub(super) fn count_rx_drop(&mut self, via: Option<usize>, from: Nid, len: u64) {
        self.stats.drop_count += 1;
        self.stats.drop_length += len;
        if let Some(ni) = via {
            self.nis[ni].drop_count += 1;
            if let Some(p) = self.peers.get_mut(&from) {
                p.drop_count += 1;
            }
        }
    }

    /// Delivers a message addressed to us; returns its length, or why it was dropped.
    pub(super) fn match_msg(
        &mut self,
        via: Option<usize>,
        from: Nid,
        hdr: &LnetHdr,
        payload: Vec<u8>,
    ) -> Result<usize, &'static str> {
        let len = payload.len();
        // The way the request came, for our response (see `respond`).
        let back = via.map(|ni| (ni, from));
        match hdr.body {
            LnetBody::Put {
                ptl_index: LNET_RESERVED_PORTAL,
                match_bits: LNET_PING_MATCHBITS,
                ack_wmd,
                ..
            } => {
                // A discovery push: the sender's ping buffer, sent to a peer it takes for
                // Multi-Rail (a kernel `lnetctl peer add` without --non_mr, and its router
                // checker then pushes to its gateways every interval). The kernel's push target
                // takes it and lnet_parse_put ACKs it; without the ACK the sender's discovery
                // fails and it marks us dead with every route through us. We are not
                // Multi-Rail: its NIDs teach us nothing we use, so the payload is dropped here.
                self.ack(hdr, back, ack_wmd, LNET_PING_MATCHBITS, len);
                Ok(len)
            }
            LnetBody::Put {
                ptl_index: LNET_RESERVED_PORTAL,
                ..
            } => Err("PUT on the reserved portal that is not a discovery push"),
            LnetBody::Put {
                ack_wmd,
                match_bits,
                hdr_data,
                ptl_index,
                ..
            } => {
                // lnet_parse_put: a posted sink on (portal, match bits) takes it first, cut to
                // its length; else it goes up as a plain PUT.
                // In memory (from a sibling runtime), a sink on any NI of ours.
                let md = match via {
                    Some(ni) => self.mds.take(ni, ptl_index, match_bits, true),
                    None => (0..self.nis.len())
                        .find_map(|ni| self.mds.take(ni, ptl_index, match_bits, true)),
                };
                if let Some((md, m)) = md {
                    let mut payload = payload;
                    payload.truncate(m.buf.len as usize);
                    let n = payload.len();
                    self.events.push_back(LnetEvent::BulkPutInline {
                        md,
                        from: hdr.src_nid,
                        match_bits,
                        hdr_data,
                        payload,
                    });
                    self.ack(hdr, back, ack_wmd, match_bits, n);
                    return Ok(len);
                }
                self.events.push_back(LnetEvent::Put {
                    from: hdr.src_nid,
                    to: hdr.dest_nid,
                    portal: ptl_index,
                    match_bits,
                    hdr_data,
                    payload,
                });
                // lnet_parse_put then lnet_ack: when the sender asked for an ACK.
                self.ack(hdr, back, ack_wmd, match_bits, len);
                Ok(len)
            }
            LnetBody::Get {
                return_wmd,
                match_bits: LNET_PING_MATCHBITS,
                ptl_index: LNET_RESERVED_PORTAL,
                sink_length,
                ..
            } => {
                // The ping service: answer from the ping buffer, cut to the requester's sink
                // (the ping target MD truncates).
                let mut reply = self.ping_reply();
                let n = reply.len().min(sink_length as usize);
                reply.truncate(n);
                self.respond(
                    hdr,
                    back,
                    n as u32,
                    LnetBody::Reply {
                        dst_wmd: return_wmd,
                    },
                    reply,
                );
                Ok(0)
            }
            LnetBody::Get { .. } => match via {
                // A GET that came through a router (LNet never routes an optimized one): its
                // REPLY comes from a posted source, by rendezvous.
                Some(ni) => self.serve_get_by_reply(ni, hdr),
                None => self.serve_get_in_memory(hdr),
            },
            LnetBody::Reply { dst_wmd } => {
                if dst_wmd.interface_cookie != self.interface_cookie {
                    return Err("REPLY for another instance");
                }
                let id = dst_wmd.object_cookie;
                let ours = self.bulk_gets.get(&id).map(|g| g.dst == hdr.src_nid);
                if ours == Some(false) {
                    return Err("REPLY for a GET of ours from another node");
                }
                if ours == Some(true) {
                    if len == 0 {
                        // Nothing to write: an empty REPLY is a complete one.
                        self.end_bulk_get(id, Ok(0), false);
                        return Ok(0);
                    }
                    // Answered inline: the user copies it into the GET's memory.
                    self.end_bulk_get_inline(id, payload);
                    return Ok(len);
                }
                let Some(target) = self.pings.target(id) else {
                    return Err("REPLY for no pending ping (late or unknown)");
                };
                let result = ping::parse_reply(target, &payload).map_err(LnetError::BadReply);
                if let Err(e) = &result {
                    self.count_error(e);
                }
                self.complete_ping(id, result);
                Ok(len)
            }
            LnetBody::Ack { .. } => Err("ACK, but we never ask for one"),
            LnetBody::Hello { .. } => Err("HELLO (only byte-stream LNDs use it)"),
        }
    }

    /// An ACK for a PUT of `mlength` bytes, if its sender asked for one (`ack_wmd`).
    pub(super) fn ack(
        &mut self,
        req: &LnetHdr,
        back: Option<(usize, Nid)>,
        ack_wmd: WireHandle,
        match_bits: u64,
        mlength: usize,
    ) {
        if ack_wmd == WireHandle::NONE {
            return;
        }
        let body = LnetBody::Ack {
            dst_wmd: ack_wmd,
            match_bits,
            mlength: mlength as u32,
        };
        self.respond(req, back, 0, body, Vec::new());
    }

    /// Sends a REPLY or ACK back to the originator of `req`, from the NID it addressed;
    /// `back` is the NI and the hop the request came by, when known.
    pub(super) fn respond(
        &mut self,
        req: &LnetHdr,
        back: Option<(usize, Nid)>,
        len: u32,
        body: LnetBody,
        payload: Vec<u8>,
    ) {
        let dst = req.src_nid;
        let route = match self.route(dst) {
            // The way back leaves by another runtime's NI, which a response of ours cannot
            // take: back through the router that brought the request, as the kernel sends a
            // response through the gateway the request came from (lnet_select_pathway, for
            // REPLY and ACK). A remote node's ping of us failed with an asymmetric route.
            Ok(Route::Sibling(net)) => match back.filter(|&(_, hop)| hop != dst) {
                Some((ni, hop)) => Route::Remote { ni, next: hop },
                None => Route::Sibling(net),
            },
            Ok(r) => r,
            Err(e) => {
                self.count_error(&e);
                return;
            }
        };
        let src = match route {
            Route::Local(_) | Route::SiblingNi => req.dest_nid,
            Route::Remote { ni, .. } => self.nis[ni].nid,
            Route::Sibling(_) => {
                // The way back is through another runtime's NI: not for a response of ours.
                self.count_error(&LnetError::NoRoute(dst));
                return;
            }
        };
        let hdr = LnetHdr {
            dest_nid: dst,
            src_nid: src,
            dest_pid: req.src_pid,
            src_pid: self.pid,
            payload_length: len,
            body,
        };
        self.launch(route, hdr, payload, Purpose::Response);
    }

    pub(super) fn complete_ping(&mut self, id: u64, result: Result<PingReply, LnetError>) {
        if let Some(p) = self.pings.finish(id) {
            self.timers.cancel(p.timer);
            if let PingKind::LocalRecovery(ni) = p.kind {
                // The GET's send and the REPLY's receipt raised the NI's health as they
                // happened; a failed ping costs it nothing more (lnet_health_check skips
                // recovery messages), the next one goes at its backoff.
                if let Some(n) = self.nis.get_mut(ni) {
                    n.health.pending = false;
                }
                if let Err(e) = &result {
                    debug!(nid = %p.target, "local NI recovery ping failed: {e}");
                }
                return;
            }
            if p.kind == PingKind::Recovery {
                if let Some(peer) = self.peers.get_mut(&p.target) {
                    peer.health.pending = false;
                }
                // A reply raised the peer NI's health when it came in (`heard_from`); a GET
                // the LND failed was judged when it ended (`judge_health`). What is left is a
                // GET that went and got no reply: the peer's failure, once.
                if let Err(e) = &result {
                    debug!(peer = %p.target, "recovery ping failed: {e}");
                    if matches!(e, LnetError::Timeout) {
                        self.peer_failed(p.target);
                    }
                }
                return;
            }
            if p.kind == PingKind::Gateway {
                if let Err(e) = &result {
                    debug!(gateway = %p.target, "gateway ping failed: {e}");
                }
                let now = self.now;
                if self
                    .paths
                    .gateways
                    .ping_done(now, p.target, id, result.as_ref().ok())
                {
                    self.reroute_queued(p.target);
                }
                return;
            }
            self.events.push_back(LnetEvent::PingDone {
                id: PingId(id),
                target: p.target,
                result,
            });
        }
    }
}
