//! The router pinger (router.c lnet_router_checker: each gateway pinged on its schedule, its
//! liveness from the reply) and the routing updates that change the way to other nets: the
//! route table, handovers from sibling runtimes, gateway health.

use super::*;

impl LnetNode {
    /// Pings every gateway that is due (`alive_router_check_interval`), with
    /// `router_ping_timeout`. Never one of our own NIDs: a gateway is never ours (routes are
    /// checked), and a ping to ourselves would not go through an LND anyway.
    pub(super) fn ping_gateways(&mut self) {
        if self.shutting_down {
            return;
        }
        let now = self.now;
        let mut next = self.pings.next;
        let nis: Vec<Net> = self.nis.iter().map(|n| n.nid.net()).collect();
        let due = self.paths.gateways.due(
            now,
            |g| nis.contains(&g.net()),
            || {
                let id = next;
                next += 1;
                id
            },
        );
        self.pings.next = next;
        let timeout = self.paths.gateways.config().ping_timeout;
        for (gw, id) in due {
            let Some(ni) = self.ni_on(gw.net()) else {
                continue;
            };
            let deadline = now.saturating_add(timeout);
            trace!(gateway = %gw, "router ping");
            self.launch_ping(
                id,
                gw,
                Route::Remote { ni, next: gw },
                deadline,
                PingKind::Gateway,
            );
        }
    }

    /// Registers ping `id` of `dst`, answered by `deadline` at the latest, and sends its GET
    /// on `route`: a user's ping, or the router pinger's (`gateway`).
    pub(super) fn launch_ping(
        &mut self,
        id: u64,
        dst: Nid,
        route: Route,
        deadline: Instant,
        kind: PingKind,
    ) {
        let timer = self.timers.arm(deadline, NodeTimer::Ping(id));
        self.pings.start(
            id,
            PendingPing {
                target: dst,
                kind,
                timer,
            },
        );
        let wmd = WireHandle {
            interface_cookie: self.interface_cookie,
            object_cookie: id,
        };
        let hdr = LnetHdr {
            src_pid: self.pid,
            ..LnetHdr::get(
                self.src_nid(route),
                dst,
                wmd,
                LNET_RESERVED_PORTAL,
                LNET_PING_MATCHBITS,
                PING_SINK_LEN,
            )
        };
        let purpose = if kind == PingKind::Gateway {
            Purpose::GatewayPing(PingId(id))
        } else {
            Purpose::PingGet(PingId(id))
        };
        self.launch(route, hdr, Vec::new(), purpose);
    }

    /// Gateway `gw` just died: the routed messages still waiting in LNet for one of its
    /// credits (never handed to its LND, so never sent) go by another route now, or fail with
    /// no route; those already in its LND end there (completion or LND timeout).
    pub(super) fn reroute_queued(&mut self, gw: Nid) {
        let Some(p) = self.peers.get_mut(&gw) else {
            return;
        };
        let queued: Vec<u64> = p.txq.drain(..).collect();
        p.txqnob = 0;
        let mut keep = VecDeque::new();
        let mut moved = Vec::new();
        for cookie in queued {
            match self.msgs.get(&cookie) {
                Some(m) if m.hdr.dest_nid != gw => moved.push(cookie),
                Some(_) => keep.push_back(cookie),
                None => {}
            }
        }
        if let Some(p) = self.peers.get_mut(&gw) {
            // Each moved message had taken a credit it never used.
            p.tx_credits += moved.len() as i64;
            for &c in &keep {
                let len = self.msgs.get(&c).map_or(0, |m| m.len);
                p.txqnob += (len + LNET_HDR_LEN) as u64;
            }
            p.txq_responses = keep
                .iter()
                .filter(|c| self.msgs.get(c).is_some_and(OutMsg::is_own_answer))
                .count();
            p.txq = keep;
        }
        if !moved.is_empty() {
            debug!(gateway = %gw, messages = moved.len(), "rerouting messages queued for a dead gateway");
        }
        for cookie in moved {
            let Some(m) = self.msgs.remove(&cookie) else {
                continue;
            };
            self.free_msg();
            // A forward moves under the hop rule, as when it first left.
            let route = match m.purpose {
                Purpose::Forward { leg, .. } => self.route_leg(m.hdr.dest_nid, leg),
                _ => self.route(m.hdr.dest_nid),
            };
            match route {
                Ok(r @ Route::Remote { .. }) if m.bulk.is_none() => {
                    self.launch(r, m.hdr, m.payload, m.purpose)
                }
                // A bulk message keeps its registered memory, which belongs to its NI: it may
                // move to another gateway on that NI only.
                Ok(Route::Remote { ni, next }) if ni == m.ni => {
                    let purpose = m.purpose;
                    let bulk = m.bulk.expect("checked above");
                    self.launch_bulk(ni, next, m.hdr, bulk, purpose);
                }
                route => {
                    let cookie = self.msgs.insert(OutMsg {
                        peer_credit: false,
                        ni_credit: false,
                        retries: 0,
                        born: self.now,
                        rendezvous: false,
                        ..m
                    });
                    self.alloc_msg();
                    let dest = self.msgs.get(&cookie).map_or(gw, |m| m.hdr.dest_nid);
                    let e = match route {
                        Err(e @ LnetError::HopLimit(_)) => e,
                        _ => LnetError::NoRoute(dest),
                    };
                    self.refused.push_back((cookie, e));
                }
            }
        }
    }

    // ------------------------------------------------------------------ routing, upper layer

    /// Replaces the route table (`lnetctl route add|del`); the gateways follow it.
    pub fn set_routes(&mut self, now: Instant, routes: RouteTable) {
        self.advance(now);
        let mine: Vec<Nid> = routes
            .gateways()
            .into_iter()
            .filter(|g| self.ni_on(g.net()).is_some())
            .collect();
        self.paths.gateways.set(&mine, now);
        self.paths.routes = routes;
    }

    /// A message from a sibling runtime: a forward to send out of this NI, the end of one of
    /// ours that a sibling sent (both `forwarding`), or a message for our NI.
    pub fn handle_handover(&mut self, now: Instant, h: Handover) {
        self.advance(now);
        match h {
            Handover::Forward { fwd, .. } => self.forward_handed(fwd),
            Handover::Done { key, result, .. } => {
                self.forward_done(key, result.map_err(|e| FwdDrop::of(&e)));
            }
            Handover::Local { hdr, payload } => {
                self.alloc_msg();
                self.local.push_back(LocalMsg {
                    hdr,
                    payload,
                    purpose: Purpose::Response,
                    from_sibling: true,
                });
            }
        }
        self.process(now);
    }

    /// How the gateways of the routes are watched (`routing:`'s module parameters).
    pub fn gateway_health(&self) -> crate::GatewayHealthConfig {
        self.paths.gateways.config()
    }

    /// Changes how the gateways are watched, at run time (see `Gateways::set_config`).
    pub fn set_gateway_health(&mut self, now: Instant, cfg: crate::GatewayHealthConfig) {
        self.advance(now);
        self.paths.gateways.set_config(cfg, now);
    }

    /// The route table.
    pub fn routes(&self) -> &RouteTable {
        &self.paths.routes
    }

    /// Whether a route may be used now, as far as this runtime knows (a route through a
    /// sibling's gateway: `None`).
    pub fn route_state(&self, r: &RouteConfig) -> Option<bool> {
        self.paths
            .gateways
            .is_gateway(r.gateway)
            .then(|| self.paths.gateways.route_alive(r))
    }

    /// The gateways this runtime watches.
    pub fn gateways(&self) -> Vec<GatewayInfo> {
        self.paths.gateways.info()
    }
}
