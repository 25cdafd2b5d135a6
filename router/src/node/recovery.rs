//! LNet health's recovery, one of the sub-states an [`LnetNode`](crate::LnetNode) is built from
//! (lib-msg.c lnet_health_check, lnet_handle_local_failure and lnet_handle_remote_failure_locked;
//! lib-move.c lnet_recover_peer_nis and lnet_recover_local_nis, run by lnet_monitor_thread): the
//! health tunables as the per-message path reads them, the queue of peer NIs in recovery, and
//! the judging and recovery pings over the node's NIs and peer table. Its tick is on the node's
//! timer table (`NodeTimer::Recovery`).

use super::*;

impl LnetNode {
    /// LNet health after a message to `peer` on NI `ni` ended (lnet_health_check, for a
    /// single-rail peer): a success gives the NI back `health_sensitivity`; a local failure
    /// costs the NI, a remote one the peer NI, the latter only when the peer is a gateway or
    /// this node routes. Each failure is counted in `health stats` whatever the sensitivity.
    pub(super) fn judge_health(
        &mut self,
        ni: usize,
        peer: Nid,
        err: Option<&LnetError>,
        recovery: bool,
    ) {
        let sens = self.recovery.cfg.sensitivity;
        let Some(e) = err else {
            if let Some(n) = self.nis.get_mut(ni).filter(|n| n.health.value < MAX_HEALTH) {
                n.health.succeed(sens);
            }
            return;
        };
        let Some(h) = HStatus::of(e) else {
            return;
        };
        // Lustre 2.16's lnet_health_check: the counters always count; a recovery ping that
        // failed costs the NI nothing more; a node with one NI (lo aside) has no other path,
        // so its NI's health is not judged (lnet_ping_at_least_two_entries). (A peer NI's
        // recovery ping that fails still costs the peer NI here, as before: see
        // `complete_ping`.)
        let local_health = !recovery && self.node_nids.len() >= 2;
        if h.is_local() {
            // lnet_handle_local_failure: the NI's health falls and it goes into local
            // recovery, pinged through its own LND until it is back at the maximum.
            let (now, max) = (self.now, self.recovery.cfg.max_ping_interval);
            if let Some(n) = self.nis.get_mut(ni) {
                n.hstats.count(h);
                if local_health {
                    n.health.fail(sens);
                    n.health.enter_recovery(now, max);
                    if let Some(t) = n.health.next_ping {
                        self.arm_recovery(t);
                    }
                }
            }
        }
        // Our own NIs are recovered as local NIs, never as peer NIs (lnet_health_check).
        if h.is_remote() && !self.node_nids.contains(&peer) {
            if let Some(p) = self.peers.get_mut(&peer) {
                p.hstats.count(h);
            }
            if self.fwd.on || self.paths.gateways.is_gateway(peer) {
                self.peer_failed(peer);
            }
        }
    }

    /// A remote failure judged against `peer` (lnet_handle_remote_failure_locked): its health
    /// falls, and it goes into recovery unless `recovery_limit` says it has been silent too
    /// long already.
    pub(super) fn peer_failed(&mut self, peer: Nid) {
        let (cfg, now) = (self.recovery.cfg, self.now);
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        p.health.fail(cfg.sensitivity);
        if crate::health::recovery_expired(p.last_heard, now, cfg.recovery_limit) {
            return;
        }
        p.health.enter_recovery(now, cfg.max_ping_interval);
        if p.health.in_recovery() && self.recovery.peers.insert(peer) {
            self.arm_recovery(now.saturating_add(Duration::from_secs(1)));
        }
    }

    /// The recovery queue is looked at again by `at` at the latest.
    pub(super) fn arm_recovery(&mut self, at: Instant) {
        self.timers.arm_recovery(at);
    }

    /// A message from `from` came in on NI `ni` (lnet_health_check's OK path for a receive):
    /// the sure sign a peer NI works. A router's, or any while we route, sets it to the
    /// maximum; otherwise it gains the sensitivity. The NI gains it too.
    pub(super) fn heard_from(&mut self, ni: usize, from: Nid) {
        let sens = self.recovery.cfg.sensitivity;
        if self.nis[ni].health.value < MAX_HEALTH {
            self.nis[ni].health.succeed(sens);
        }
        let Some(p) = self
            .peers
            .get_mut(&from)
            .filter(|p| p.health.value < MAX_HEALTH)
        else {
            return;
        };
        if self.fwd.on || self.paths.gateways.is_gateway(from) {
            p.health.restore();
        } else {
            p.health.succeed(sens);
        }
    }

    /// The recovery queue's turn (lnet_recover_peer_nis): each peer NI still below the
    /// maximum whose next recovery ping is due, and that has none out, gets one, answered
    /// within transaction_timeout; one silent past `recovery_limit` leaves the queue as it is.
    pub(super) fn recover_peers(&mut self) {
        let now = self.now;
        if self.shutting_down {
            self.recovery.peers.clear();
            return;
        }
        let cfg = self.recovery.cfg;
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        let peers = &mut self.peers;
        self.recovery.peers.retain(|nid| {
            let Some(p) = peers.get_mut(nid) else {
                return false;
            };
            if !p.health.in_recovery() {
                return false;
            }
            if crate::health::recovery_expired(p.last_heard, now, cfg.recovery_limit) {
                debug!(peer = %nid, "recovery_limit reached: no more recovery pings");
                p.health.stop_recovery();
                return false;
            }
            if !p.health.pending && p.health.next_ping.is_some_and(|t| t <= now) {
                p.health.pinged(now, cfg.max_ping_interval);
                p.health.pending = true;
                due.push((*nid, p.ni.0, PingKind::Recovery));
            }
            if let Some(t) = p.health.next_ping {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
            true
        });
        // lnet_recover_local_nis: each of our NIs below the maximum, one ping at a time with
        // the same backoff; one back at the maximum leaves the queue. Lustre pings the NI's
        // own NID through its own LND; a node here never pings its own NIDs through the LND
        // (LU-7646's first fix deadlocked exactly there), so the ping goes through the NI to
        // the peer on its net that the LND holds up and was heard from (then used) most
        // recently: its GET going
        // out and its REPLY coming in prove the NI as well. With no such peer the NI waits;
        // any message that goes through it raises its health too (`judge_health`).
        let witnesses: Vec<Option<Nid>> = (0..self.nis.len())
            .map(|i| {
                self.peers
                    .values()
                    .filter(|p| {
                        p.ni.0 == i && p.state == PeerState::Up && !self.node_nids.contains(&p.nid)
                    })
                    .max_by_key(|p| (p.last_heard, p.last_active))
                    .map(|p| p.nid)
            })
            .collect();
        for (i, n) in self.nis.iter_mut().enumerate() {
            if !n.health.in_recovery() {
                continue;
            }
            if n.health.value >= MAX_HEALTH || cfg.sensitivity == 0 {
                n.health.stop_recovery();
                continue;
            }
            if !n.health.pending && n.health.next_ping.is_some_and(|t| t <= now) {
                if let Some(w) = witnesses[i] {
                    n.health.pinged(now, cfg.max_ping_interval);
                    n.health.pending = true;
                    due.push((w, i, PingKind::LocalRecovery(i)));
                }
            }
            if let Some(t) = n.health.next_ping {
                next = Some(next.map_or(t, |x: Instant| x.min(t)));
            }
        }
        let deadline = now.saturating_add(Duration::from_secs(cfg.transaction_timeout));
        // A peer NI's, or one of ours through a peer on its net: the same ping through NI `ni`.
        for (nid, ni, kind) in due {
            let id = self.pings.next_id();
            trace!(%nid, ?kind, "recovery ping");
            self.launch_ping(id, nid, Route::Remote { ni, next: nid }, deadline, kind);
        }
        if let Some(t) = next {
            // At least a second apart, as the monitor thread runs.
            self.arm_recovery(t.max(now.saturating_add(Duration::from_secs(1))));
        }
    }

    /// The NIDs in LNet health's recovery: our NIs (`local`) or peer NIs below the maximum
    /// (`lnetctl debug recovery --local|--peer`).
    pub fn recovery_queue(&self, local: bool) -> Vec<Nid> {
        if local {
            self.nis
                .iter()
                .filter(|n| n.health.value < MAX_HEALTH)
                .map(|n| n.nid)
                .collect()
        } else {
            self.recovery
                .peers
                .iter()
                .copied()
                .filter(|n| self.peers.get(n).is_some_and(|p| p.health.in_recovery()))
                .collect()
        }
    }
}
