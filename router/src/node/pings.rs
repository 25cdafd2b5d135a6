//! The ping service's state, one of the sub-states an [`LnetNode`](crate::LnetNode) is built
//! from: the pings this node sent (a user's, the router pinger's, LNet health's recovery pings)
//! waiting for their REPLY, each until its deadline, and the ping buffer it answers others
//! with. The node sends and matches; this keeps the books, so that every ping ends exactly once
//! (a REPLY, a failure, or its deadline: lib-move.c's lnet_ping and router.c's
//! lnet_router_checker give each ping its own MD with a timeout; ours share this table, their
//! deadlines on the node's timer table).

use std::collections::HashMap;

use lnd::trim::{CapacityReport, Trim, TRIM_FLOOR};
use lnd::wheel::TimerKey;
use lnd::wire::Nid;

/// One ping waiting for its REPLY.
pub(super) struct PendingPing {
    pub(super) target: Nid,
    pub(super) kind: PingKind,
    /// Its deadline on the node's timer table (cancelled when it ends first).
    pub(super) timer: TimerKey,
}

/// Whose a ping is, and so where its outcome goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PingKind {
    /// A user's (`lnetctl ping`): a `PingDone` event.
    User,
    /// The router pinger's: the gateway's liveness.
    Gateway,
    /// LNet health's recovery ping of a peer NI below the maximum: its health.
    Recovery,
    /// LNet health's recovery ping of our NI `.0` below the maximum (lnet_recover_local_nis),
    /// to a live peer on its net, never to our own NID: its health.
    LocalRecovery(usize),
}

/// Pings in flight by id, and the ids handed out.
pub(super) struct Pings {
    pending: HashMap<u64, PendingPing>,
    /// The next id (also the object cookie of a routed GET's wire handle: one cookie space, so
    /// a REPLY names one or the other).
    pub(super) next: u64,
    /// Our ping reply while we do not route (RTE_DISABLED, every NI UP), built once: the NI
    /// list never changes. While routing, each reply is built afresh with the nets' liveness.
    pub(super) buffer: Vec<u8>,
}

impl Pings {
    pub(super) fn new(buffer: Vec<u8>) -> Pings {
        Pings {
            pending: HashMap::new(),
            // From 1, as before: no ping or routed GET carries cookie 0.
            next: 1,
            buffer,
        }
    }

    /// A fresh id.
    pub(super) fn next_id(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        id
    }

    /// Ping `id` is on its way.
    pub(super) fn start(&mut self, id: u64, p: PendingPing) {
        self.pending.insert(id, p);
    }

    /// Whom ping `id` went to, while it waits.
    pub(super) fn target(&self, id: u64) -> Option<Nid> {
        self.pending.get(&id).map(|p| p.target)
    }

    /// Whose ping `id` is, while it waits.
    pub(super) fn kind(&self, id: u64) -> Option<PingKind> {
        self.pending.get(&id).map(|p| p.kind)
    }

    /// Ping `id` has its outcome: out of the books (once; `None` after). The caller cancels
    /// its timer.
    pub(super) fn finish(&mut self, id: u64) -> Option<PendingPing> {
        self.pending.remove(&id)
    }

    /// Pings waiting.
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Gives back the room a burst left; true while still large.
    pub(super) fn trim(&mut self) -> bool {
        self.pending.trim(TRIM_FLOOR)
    }

    pub(super) fn capacities(&self, r: &mut CapacityReport) {
        r.add("pings", &self.pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lnd::time::{Duration, Instant};
    use lnd::wheel::TimerWheel;

    /// Every ping ends once, and ids never repeat.
    #[test]
    fn a_ping_ends_once() {
        let mut wheel = TimerWheel::new(Instant::from_secs(0), Duration::from_millis(1));
        let mut p = Pings::new(Vec::new());
        let (a, b) = (p.next_id(), p.next_id());
        assert_eq!((a, b), (1, 2));
        for id in [a, b] {
            let timer = wheel.insert(Instant::from_secs(5), id);
            let target = "10.0.0.1@o2ib".parse().unwrap();
            let kind = PingKind::User;
            p.start(
                id,
                PendingPing {
                    target,
                    kind,
                    timer,
                },
            );
        }
        assert_eq!(p.kind(a), Some(PingKind::User));
        assert!(p.finish(b).is_some());
        assert!(p.finish(b).is_none(), "once");
        assert_eq!(p.target(b), None);
        assert_eq!(p.len(), 1);
        assert_eq!(
            p.target(a).map(|n| n.to_string()).as_deref(),
            Some("10.0.0.1@o2ib")
        );
    }
}
