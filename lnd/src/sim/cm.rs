//! The connection manager: what a node's actions do (through [`Fabric`]) and how the events
//! they start are played out (requests, replies, rejects, disconnects).

use super::*;

impl<N: SimNode> World<N> {
    /// Applies one action of node `n` to the fabric. Never calls into an endpoint.
    pub(super) fn apply(&mut self, n: NodeId, action: FabricAction) {
        let now = self.now;
        NodeFabric { w: self, n }.apply(now, action);
    }

    // ------------------------------------------------------------------ internals: events

    /// The passive end `end` is up (its RTU came, or its first message: COMM_EST); its
    /// endpoint gets `handle_established` with empty private data. The caller drains the node.
    pub(super) fn establish_passive(&mut self, end: u64, what: &'static str) {
        let Some(e) = self.ends.get_mut(&end) else {
            return;
        };
        e.state = EndState::Established;
        let (n, conn) = (e.node, e.conn);
        trace!(at = %self.now, node = %self.nid_of(n), ?conn, "{what}");
        if let Some(ep) = self.nodes[n.idx()].ep.as_mut() {
            ep.fabric_event(self.now, FabricEvent::Established { conn, private: &[] });
        }
    }

    pub(super) fn late(&mut self, what: &str) {
        self.stats.dropped_late_events += 1;
        trace!(at = %self.now, what, "event for a gone end dropped");
    }

    pub(super) fn dispatch(&mut self, at: Instant, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Timer { node, epoch } => {
                let nd = &mut self.nodes[node.idx()];
                if nd.epoch != epoch || nd.timer_at != Some(at) {
                    self.stats.stale_timers += 1;
                    return;
                }
                nd.timer_at = None;
                let Some(ep) = nd.ep.as_mut() else {
                    return;
                };
                ep.handle_timeout(now);
                self.drain(node, true);
            }
            Ev::Request {
                active,
                active_node,
                target,
                private,
                started,
            } => {
                if !self.host_reachable(active_node, target) {
                    self.connect_unreachable(now, started, active);
                    return;
                }
                if self.nodes[target.idx()].ep.is_none() {
                    // The host is up but nothing listens.
                    let back = self.cfg.cm_latency;
                    self.push(
                        now + back,
                        Ev::ConnFailed {
                            end: active,
                            why: ConnectFailure::NoListener,
                        },
                    );
                    return;
                }
                let id = self.next_req;
                self.next_req += 1;
                self.reqs.insert(
                    id,
                    PendingReq {
                        active,
                        active_node,
                        target,
                        started,
                    },
                );
                self.stats.requests += 1;
                if let Some(ep) = self.nodes[target.idx()].ep.as_mut() {
                    ep.fabric_event(
                        now,
                        FabricEvent::ConnectRequest {
                            req: RequestId(id),
                            private: private.as_bytes(),
                        },
                    );
                }
                self.drain(target, false);
            }
            Ev::Reply {
                active,
                active_node,
                passive,
                passive_node,
                private,
                started,
            } => {
                let passive_ok = self
                    .ends
                    .get(&passive)
                    .is_some_and(|e| e.state == EndState::Accepting);
                let active_ok = self
                    .ends
                    .get(&active)
                    .is_some_and(|e| e.state == EndState::Connecting);
                if self.blocked(active_node, passive_node) {
                    // Lost on the way: both sides time out.
                    self.connect_unreachable(now, started, active);
                    self.push(
                        now + self.cfg.unreachable_after,
                        Ev::Disconnected {
                            end: passive,
                            why: LOST,
                        },
                    );
                    return;
                }
                if !active_ok {
                    // Nobody waits for this reply any more: the active CM rejects it, or, if its
                    // host is down, the passive side times out.
                    self.late("reply");
                    let d = if self.host_reachable(passive_node, active_node) {
                        self.cfg.cm_latency
                    } else {
                        self.cfg.unreachable_after
                    };
                    self.push(
                        now + d,
                        Ev::Disconnected {
                            end: passive,
                            why: LOST,
                        },
                    );
                    return;
                }
                if !passive_ok {
                    // The passive side gave up (or closed) before its reply arrived.
                    self.deliver_connect_failed(active, ConnectFailure::Error);
                    return;
                }
                let e = self.ends.get_mut(&active).expect("checked above");
                e.state = EndState::Established;
                e.peer = Some(passive);
                e.peer_node = Some(passive_node);
                let conn = e.conn;
                self.stats.established += 1;
                trace!(at = %now, node = %self.nid_of(active_node), ?conn, "established (active)");
                if let Some(ep) = self.nodes[active_node.idx()].ep.as_mut() {
                    ep.fabric_event(
                        now,
                        FabricEvent::Established {
                            conn,
                            private: private.as_bytes(),
                        },
                    );
                }
                self.drain(active_node, false);
                match self.cm_hop() {
                    Some(d) => self.push(
                        now + d,
                        Ev::Rtu {
                            passive,
                            active_node,
                        },
                    ),
                    None => self.push(now + self.cfg.unreachable_after, Ev::RtuLost { passive }),
                }
            }
            Ev::Rtu {
                passive,
                active_node,
            } => {
                let Some(e) = self.ends.get_mut(&passive) else {
                    return self.late("rtu");
                };
                if e.state != EndState::Accepting {
                    return self.late("rtu");
                }
                let pn = e.node;
                if self.blocked(active_node, pn) {
                    self.push(now + self.cfg.unreachable_after, Ev::RtuLost { passive });
                    return;
                }
                self.establish_passive(passive, "established (passive)");
                self.drain(pn, false);
            }
            Ev::Rejected {
                active,
                active_node,
                passive_node,
                private,
                started,
            } => {
                if self.blocked(active_node, passive_node) {
                    self.connect_unreachable(now, started, active);
                    return;
                }
                self.deliver_connect_failed(active, ConnectFailure::Rejected(private));
            }
            Ev::ConnFailed { end, why } => self.deliver_connect_failed(end, why),
            Ev::RtuLost { passive } => match self.ends.get(&passive) {
                Some(e) if e.state == EndState::Accepting => {
                    self.dispatch(
                        at,
                        Ev::Disconnected {
                            end: passive,
                            why: LOST,
                        },
                    );
                }
                _ => self.late("rtu lost"),
            },
            Ev::Disconnected { end, why } => {
                let Some(e) = self.ends.get_mut(&end) else {
                    return self.late("disconnected");
                };
                if e.disconnect_reported {
                    return;
                }
                e.disconnect_reported = true;
                let (n, conn) = (e.node, e.conn);
                self.qp_error(end);
                trace!(at = %now, node = %self.nid_of(n), ?conn, "disconnected");
                if let Some(ep) = self.nodes[n.idx()].ep.as_mut() {
                    ep.fabric_event(now, FabricEvent::Disconnected { conn, why });
                }
                self.drain(n, false);
            }
            Ev::Pump { end } => {
                let Some(e) = self.ends.get_mut(&end) else {
                    return self.late("pump");
                };
                if e.pump_at != Some(at) {
                    return;
                }
                e.pump_at = None;
                self.pump(end);
            }
            Ev::SendDone { end, wr, status } => {
                let Some(e) = self.ends.get(&end) else {
                    return self.late("send completion");
                };
                let (n, conn) = (e.node, e.conn);
                if let Some(r) = self.rdma.get_mut(&wr.0).filter(|r| r.end == end) {
                    r.status.get_or_insert(status);
                }
                // An injected write's WrId is unknown to the engine, which ignores it.
                if let Some(ep) = self.nodes[n.idx()].ep.as_mut() {
                    ep.fabric_event(now, FabricEvent::SendComplete { conn, wr, status });
                }
                self.drain(n, false);
            }
            Ev::RecvDone { node, epoch, rx } => {
                let nd = &mut self.nodes[node.idx()];
                if nd.epoch != epoch {
                    return self.late("recv_done");
                }
                let Some(ep) = nd.ep.as_mut() else {
                    return;
                };
                ep.recv_done(now, rx);
                self.drain(node, false);
            }
            Ev::Restart {
                node,
                epoch,
                incarnation,
            } => {
                if self.nodes[node.idx()].epoch == epoch {
                    self.restart(node, incarnation);
                }
            }
        }
    }

    pub(super) fn deliver_connect_failed(&mut self, end: u64, why: ConnectFailure) {
        let now = self.now;
        let Some(e) = self.ends.get_mut(&end) else {
            return self.late("connect failure");
        };
        if e.state != EndState::Connecting {
            return self.late("connect failure");
        }
        e.state = EndState::Error;
        let (n, conn) = (e.node, e.conn);
        trace!(at = %now, node = %self.nid_of(n), ?conn, ?why, "connect failed");
        if let Some(ep) = self.nodes[n.idx()].ep.as_mut() {
            ep.fabric_event(now, FabricEvent::ConnectFailed { conn, why });
        }
        self.drain(n, false);
    }
}

/// Node `n`'s side of the simulated fabric: what its engine's actions do to the world. Never
/// calls into an endpoint.
struct NodeFabric<'w, N: SimNode> {
    w: &'w mut World<N>,
    n: NodeId,
}

impl<N: SimNode> Fabric for NodeFabric<'_, N> {
    fn connect(
        &mut self,
        now: Instant,
        conn: ConnId,
        peer: Nid,
        private: PrivateData,
        recv_slots: u16,
    ) {
        let n = self.n;
        self.w.stats.connects += 1;
        self.w.nodes[n.idx()].connects.push((now, peer));
        let uid = self.w.new_end(n, conn, EndState::Connecting, recv_slots);
        let target = self.w.node_of(peer);
        if let Some(e) = self.w.ends.get_mut(&uid) {
            e.peer_node = target;
        }
        let node = &mut self.w.nodes[n.idx()];
        let stuck = if let Some(i) = node.stuck_next.iter().position(|&x| x == peer) {
            node.stuck_next.swap_remove(i);
            true
        } else {
            let p = node.stuck_prob;
            self.w.rng.chance(p)
        };
        if stuck {
            self.w.stats.stuck_connects += 1;
            debug!(at = %now, node = %self.w.nid_of(n), %peer, ?conn, "connect stuck");
            return;
        }
        trace!(at = %now, node = %self.w.nid_of(n), %peer, ?conn, "connect");
        let Some(target) = target else {
            self.w.connect_unreachable(now, now, uid);
            return;
        };
        match self.w.cm_hop() {
            Some(d) => self.w.push(
                now + d,
                Ev::Request {
                    active: uid,
                    active_node: n,
                    target,
                    private,
                    started: now,
                },
            ),
            None => self.w.connect_unreachable(now, now, uid),
        }
    }

    fn accept(
        &mut self,
        now: Instant,
        req: RequestId,
        conn: ConnId,
        private: PrivateData,
        recv_slots: u16,
    ) {
        let n = self.n;
        let Some(r) = self.w.reqs.remove(&req.0) else {
            self.w.stats.unknown_actions += 1;
            debug!(node = %self.w.nid_of(n), ?req, "accept of an unknown request");
            return;
        };
        if r.target != n {
            self.w.stats.unknown_actions += 1;
            self.w.reqs.insert(req.0, r);
            return;
        }
        self.w.stats.accepts += 1;
        let uid = self.w.new_end(n, conn, EndState::Accepting, recv_slots);
        if let Some(e) = self.w.ends.get_mut(&uid) {
            e.peer = Some(r.active);
            e.peer_node = Some(r.active_node);
        }
        match self.w.cm_hop() {
            Some(d) => self.w.push(
                now + d,
                Ev::Reply {
                    active: r.active,
                    active_node: r.active_node,
                    passive: uid,
                    passive_node: n,
                    private,
                    started: r.started,
                },
            ),
            None => {
                // The reply is lost: both sides time out.
                self.w.connect_unreachable(now, r.started, r.active);
                self.w.push(
                    now + self.w.cfg.unreachable_after,
                    Ev::Disconnected {
                        end: uid,
                        why: LOST,
                    },
                );
            }
        }
    }

    fn reject(&mut self, now: Instant, req: RequestId, private: PrivateData) {
        let n = self.n;
        let Some(r) = self.w.reqs.remove(&req.0) else {
            self.w.stats.unknown_actions += 1;
            return;
        };
        self.w.stats.rejects += 1;
        if matches!(KibRej::parse(private.as_bytes()), Ok((rej, _)) if rej.why == RejectReason::ConnRace)
        {
            let key = (n.0.min(r.active_node.0), n.0.max(r.active_node.0));
            *self.w.race_rejects.entry(key).or_default() += 1;
        }
        match self.w.cm_hop() {
            Some(d) => self.w.push(
                now + d,
                Ev::Rejected {
                    active: r.active,
                    active_node: r.active_node,
                    passive_node: n,
                    private,
                    started: r.started,
                },
            ),
            None => self.w.connect_unreachable(now, r.started, r.active),
        }
    }

    fn post_recv(&mut self, _: Instant, conn: ConnId, slot: u16) {
        let n = self.n;
        let Some(e) = self
            .w
            .end_uid(n, conn)
            .and_then(|u| self.w.ends.get_mut(&u))
        else {
            self.w.stats.unknown_actions += 1;
            return;
        };
        if !e.posted.insert(slot) {
            self.w.stats.double_posts += 1;
            debug!(node = %self.w.nid_of(n), ?conn, slot, "slot posted twice");
        }
    }

    fn send(&mut self, _: Instant, conn: ConnId, wr: WrId, bytes: Vec<u8>) {
        let n = self.n;
        self.w.post(n, conn, wr, WqeOp::Send(bytes));
    }

    fn rdma_write(
        &mut self,
        _: Instant,
        conn: ConnId,
        wr: WrId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    ) {
        let n = self.n;
        let len = check_rdma_write(&local, &remote).ok();
        let w = Write { local, remote, len };
        self.w.post(n, conn, wr, WqeOp::Write(w));
    }

    // Writes are checked by key and bounds only (see `FabricAction::GrantWrites`).
    fn grant_writes(&mut self, _: Instant, _: ConnId, _: WrId, _: Vec<RemoteFrag>) {}

    fn revoke_writes(&mut self, _: Instant, _: ConnId, _: WrId) {}

    fn disconnect(&mut self, now: Instant, conn: ConnId) {
        let n = self.n;
        let Some(uid) = self.w.end_uid(n, conn) else {
            self.w.stats.unknown_actions += 1;
            return;
        };
        let e = self.w.ends.get_mut(&uid).expect("indexed end exists");
        if e.disconnect_issued {
            return;
        }
        e.disconnect_issued = true;
        self.w.stats.disconnects += 1;
        let (peer, peer_node) = (e.peer, e.peer_node);
        trace!(at = %now, node = %self.w.nid_of(n), ?conn, "disconnect");
        self.w.qp_error(uid);
        let cm = self.w.cfg.cm_latency;
        match (peer, peer_node) {
            (Some(p), Some(pn)) if self.w.host_reachable(n, pn) => {
                // DREQ to the peer, DREP back; a lost DREQ is retried until the horizon.
                match self.w.cm_hop() {
                    Some(d) => {
                        if self.w.ends.contains_key(&p) {
                            self.w.push(
                                now + d,
                                Ev::Disconnected {
                                    end: p,
                                    why: CLOSED,
                                },
                            );
                        }
                        self.w.push(
                            now + d + cm,
                            Ev::Disconnected {
                                end: uid,
                                why: CLOSED,
                            },
                        );
                    }
                    None => self.w.push(
                        now + self.w.cfg.retry_horizon,
                        Ev::Disconnected {
                            end: uid,
                            why: LOST,
                        },
                    ),
                }
            }
            (Some(_), _) => self.w.push(
                now + self.w.cfg.retry_horizon,
                Ev::Disconnected {
                    end: uid,
                    why: LOST,
                },
            ),
            // Not connected at the fabric level: only the local side hears.
            (None, _) => self.w.push(
                now + cm,
                Ev::Disconnected {
                    end: uid,
                    why: CLOSED,
                },
            ),
        }
    }

    fn destroy(&mut self, now: Instant, conn: ConnId) {
        let n = self.n;
        let Some(uid) = self.w.nodes[n.idx()].ends.remove(&conn) else {
            self.w.stats.unknown_actions += 1;
            return;
        };
        self.w.stats.destroys += 1;
        let Some(e) = self.w.ends.remove(&uid) else {
            return;
        };
        let peer_connected = e
            .peer
            .and_then(|p| self.w.ends.get(&p))
            .is_some_and(|p| matches!(p.state, EndState::Established | EndState::Accepting));
        if !e.disconnect_issued && !e.disconnect_reported && peer_connected {
            self.w.stats.orphaned += 1;
            debug!(at = %now, node = %self.w.nid_of(n), ?conn,
                   "connection destroyed without a disconnect: the peer is not told");
        }
        trace!(at = %now, node = %self.w.nid_of(n), ?conn, "destroy");
    }
}
