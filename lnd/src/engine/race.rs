//! The connection-race rule as a pure function, so it can be tested over all of its inputs.
//!
//! o2iblnd (kiblnd_passive_connect): when a connect request arrives from a peer to which we have
//! our own active connect in flight, the higher NID wins: the passive side rejects with CONN_RACE
//! only if the requester's NID is strictly lower than its own. Equal NIDs (a node connecting to
//! itself) are always accepted; the reverted first LU-7646 patch rejected them and deadlocked a
//! self-ping. LU-7646 added a counter so a stuck active connect cannot win forever.

use super::config::RacePolicy;
use crate::wire::Nid;

/// What the passive side knows when a connect request arrives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RaceInput {
    pub my_nid: Nid,
    pub peer_nid: Nid,
    /// We have our own active connect to this peer in flight.
    pub active_in_flight: bool,
    /// Our in-flight attempt is proven stale: it names an incarnation of the peer that the request
    /// shows is gone, so the peer is certain to refuse it.
    pub active_proven_stale: bool,
    /// CONN_RACE rejects this peer has had from us since our last accept.
    pub races: u32,
    pub race_limit: u32,
    pub policy: RacePolicy,
}

/// The outcome.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RaceDecision {
    /// No race, or the requester wins it.
    Accept,
    /// Our attempt is stale: abandon it and accept (ours only).
    AbandonActiveAndAccept,
    /// We win, but have refused this peer `race_limit` times: let it win (LU-7646).
    Yield,
    /// We win: refuse with CONN_RACE.
    RejectRace,
}

/// Settles a connection race.
pub fn resolve_race(i: RaceInput) -> RaceDecision {
    if !i.active_in_flight {
        return RaceDecision::Accept;
    }
    if i.active_proven_stale && i.policy.abandons_stale() {
        return RaceDecision::AbandonActiveAndAccept;
    }
    // Strict comparison of the 64-bit NIDs, as Lustre 2.8 did; any total order works if both
    // sides compute the same one, and equality must accept.
    if i.peer_nid.raw() >= i.my_nid.raw() {
        return RaceDecision::Accept;
    }
    if i.policy.counts_races() && i.races >= i.race_limit {
        return RaceDecision::Yield;
    }
    RaceDecision::RejectRace
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination over a small domain, checked against the rule written out plainly.
    #[test]
    fn exhaustive() {
        let nids = [Nid::from_raw(1), Nid::from_raw(2), Nid::from_raw(3)];
        let mut seen = std::collections::HashSet::new();
        for policy in RacePolicy::ALL {
            for my_nid in nids {
                for peer_nid in nids {
                    for active_in_flight in [false, true] {
                        for active_proven_stale in [false, true] {
                            for races in 0..=22 {
                                let i = RaceInput {
                                    my_nid,
                                    peer_nid,
                                    active_in_flight,
                                    active_proven_stale,
                                    races,
                                    race_limit: 20,
                                    policy,
                                };
                                let d = resolve_race(i);
                                seen.insert(d);
                                let expected = if !active_in_flight {
                                    RaceDecision::Accept
                                } else if active_proven_stale && policy == RacePolicy::Ulnet {
                                    RaceDecision::AbandonActiveAndAccept
                                } else if peer_nid >= my_nid {
                                    RaceDecision::Accept
                                } else if policy != RacePolicy::Lustre28 && races >= 20 {
                                    RaceDecision::Yield
                                } else {
                                    RaceDecision::RejectRace
                                };
                                assert_eq!(d, expected, "{i:?}");
                                // The properties the seeds depend on:
                                if peer_nid == my_nid {
                                    assert_ne!(d, RaceDecision::RejectRace, "self-connect refused");
                                }
                                if policy != RacePolicy::Lustre28 && races >= 20 {
                                    assert_ne!(d, RaceDecision::RejectRace, "more than 20 rejects");
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len(), 4, "every decision is reachable");
    }

    /// Two nodes connecting to each other at once: exactly one side refuses.
    #[test]
    fn exactly_one_side_wins() {
        for (a, b) in [(1u64, 2u64), (2, 1), (7, 9)] {
            let at = |me: u64, them: u64| {
                resolve_race(RaceInput {
                    my_nid: Nid::from_raw(me),
                    peer_nid: Nid::from_raw(them),
                    active_in_flight: true,
                    active_proven_stale: false,
                    races: 0,
                    race_limit: 20,
                    policy: RacePolicy::Ulnet,
                })
            };
            let decisions = [at(a, b), at(b, a)];
            assert_eq!(
                decisions
                    .iter()
                    .filter(|d| **d == RaceDecision::RejectRace)
                    .count(),
                1,
                "{a} vs {b}: {decisions:?}"
            );
        }
    }
}
