//! The ping service's state, one of the sub-states an [`LnetNode`](super::LnetNode) is built
//! from: the pings this node sent (a user's, the router pinger's, LNet health's recovery pings)
//! waiting for their REPLY, each until its deadline, and the ping buffer it answers others
//! with. The node sends and matches; this keeps the books, so that every ping ends exactly once
//! (a REPLY, a failure, or its deadline: lib-move.c's lnet_ping and router.c's
//! lnet_router_checker give each ping its own MD with a timeout, ours share this table).

use std::collections::{BTreeSet, HashMap};

use lnd::time::Instant;
use lnd::trim::{CapacityReport, Trim, TRIM_FLOOR};
use lnd::wire::Nid;

/// One ping waiting for its REPLY.
pub(super) struct PendingPing {
    pub(super) target: Nid,
    pub(super) deadline: Instant,
    pub(super) kind: PingKind,
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

/// Pings in flight by id, their deadlines in order, and the ids handed out.
pub(super) struct Pings {
    pending: HashMap<u64, PendingPing>,
    deadlines: BTreeSet<(Instant, u64)>,
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
            deadlines: BTreeSet::new(),
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
        self.deadlines.insert((p.deadline, id));
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

    /// Ping `id` has its outcome: out of the books (once; `None` after).
    pub(super) fn finish(&mut self, id: u64) -> Option<PendingPing> {
        let p = self.pending.remove(&id)?;
        self.deadlines.remove(&(p.deadline, id));
        Some(p)
    }

    /// A ping still waiting whose deadline is `now` or earlier, taken off the deadline list
    /// (the caller fails it with [`Pings::finish`]); `None` once none is due.
    pub(super) fn expired(&mut self, now: Instant) -> Option<u64> {
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                return None;
            }
            self.deadlines.remove(&(at, id));
            if self.pending.contains_key(&id) {
                // Back on the list so that `finish` finds it (and takes it off once).
                self.deadlines.insert((at, id));
                return Some(id);
            }
        }
        None
    }

    /// The earliest deadline.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(t, _)| t)
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

    fn ping(deadline_s: u64) -> PendingPing {
        PendingPing {
            target: "10.0.0.1@o2ib".parse().unwrap(),
            deadline: Instant::from_secs(deadline_s),
            kind: PingKind::User,
        }
    }

    /// Every ping ends once: by its outcome or by its deadline, in deadline order, and a
    /// finished ping's deadline no longer counts.
    #[test]
    fn a_ping_ends_once_by_outcome_or_deadline() {
        let mut p = Pings::new(Vec::new());
        let (a, b, c) = (p.next_id(), p.next_id(), p.next_id());
        assert_eq!((a, b, c), (1, 2, 3));
        p.start(a, ping(5));
        p.start(b, ping(3));
        p.start(c, ping(9));
        assert_eq!(p.next_deadline(), Some(Instant::from_secs(3)));
        assert!(p.finish(b).is_some());
        assert!(p.finish(b).is_none(), "once");
        assert_eq!(p.next_deadline(), Some(Instant::from_secs(5)));
        let now = Instant::from_secs(6);
        assert_eq!(p.expired(now), Some(a));
        assert_eq!(p.expired(now), Some(a), "due until it is finished");
        assert!(p.finish(a).is_some());
        assert_eq!(p.expired(now), None);
        assert_eq!(p.len(), 1);
        assert_eq!(
            p.target(c).map(|n| n.to_string()).as_deref(),
            Some("10.0.0.1@o2ib")
        );
    }
}
