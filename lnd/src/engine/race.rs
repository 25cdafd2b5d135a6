//! The connection-race rule as a pure function, so it can be tested over all of its inputs.
//!
//! o2iblnd (kiblnd_passive_connect): when a connect request arrives from a peer to which we have
//! our own active connect in flight, the higher NID wins: the passive side rejects with CONN_RACE
//! only if the requester's NID is strictly lower than its own. Equal NIDs (a node connecting to
//! itself) are always accepted; the reverted first LU-7646 patch rejected them and deadlocked a
//! self-ping. LU-7646 added a counter so a stuck active connect cannot win forever.
//!
//! "Lower" is under a [`RaceOrder`]: the raw NID up to Lustre 2.15, `nidhash` since 2.16. Two
//! peers that order differently either both refuse (a double reject) or both accept (two
//! connections). A double reject is evidence (a double accept is not: from one side it looks the
//! same as a slow request the peer accepted after its own handshake finished, and two
//! connections are harmless): [`adopts_peer_order`] says when we switch to the
//! peer's order for that peer, breaking the symmetry so that two ulnet nodes never both switch.

use super::config::{RaceOrder, RacePolicy};
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
    /// The order in use with this peer (the NI's, or the one learned for the peer).
    pub order: RaceOrder,
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
    // Strict comparison, as o2iblnd does; any order works if both sides compute the same one,
    // and equality (a self-connect, or two NIDs with one hash) must accept.
    if !i.order.lower(i.peer_nid, i.my_nid) {
        return RaceDecision::Accept;
    }
    if i.policy.counts_races() && i.races >= i.race_limit {
        return RaceDecision::Yield;
    }
    RaceDecision::RejectRace
}

/// Whether to switch to the peer's order after `disagreements` races in which we and the peer
/// both refused each other with CONN_RACE (it computes the other order). The side with the
/// lower raw NID switches at the first such race, the other only at a second one: two ulnet nodes
/// configured differently never both switch (which would leave them disagreeing again), while
/// against a kernel, which never switches, we always end up switching.
pub fn adopts_peer_order(my_nid: Nid, peer_nid: Nid, disagreements: u32) -> bool {
    let needed = if my_nid.raw() < peer_nid.raw() { 1 } else { 2 };
    disagreements >= needed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination over a small domain, checked against the rule written out plainly.
    #[test]
    fn exhaustive() {
        let nids = [Nid::from_raw(1), Nid::from_raw(2), Nid::from_raw(3)];
        let mut seen = std::collections::HashSet::new();
        for (policy, order) in RacePolicy::ALL
            .into_iter()
            .flat_map(|p| RaceOrder::ALL.map(|o| (p, o)))
        {
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
                                    order,
                                };
                                let d = resolve_race(i);
                                seen.insert(d);
                                let expected = if !active_in_flight {
                                    RaceDecision::Accept
                                } else if active_proven_stale && policy == RacePolicy::Ulnet {
                                    RaceDecision::AbandonActiveAndAccept
                                } else if order.key(peer_nid) >= order.key(my_nid) {
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
                    order: RaceOrder::Nid,
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

    use testkit::nid;

    /// The hash order with the reference's pair (kernel-interop.md): the raw order and the hash
    /// order disagree on 10.0.0.2@o2ib vs 10.0.1.1@o2ib.
    #[test]
    fn nidhash_order_of_the_reference_pair() {
        let (a, b): (Nid, Nid) = (nid("10.0.0.2@o2ib"), nid("10.0.1.1@o2ib"));
        assert_eq!(a.nidhash(), 0x0205_000a);
        assert_eq!(b.nidhash(), 0x0104_000a);
        assert!(RaceOrder::NidHash.lower(b, a), "2.16: 10.0.1.1 is lower");
        assert!(RaceOrder::Nid.lower(a, b), "2.15: 10.0.0.2 is lower");
        assert!(!RaceOrder::NidHash.lower(a, b));
        assert!(!RaceOrder::Nid.lower(b, a));
    }

    /// 0@lo, another o2ib net and tcp: the net is `lnd type << 16 | number`, XORed with the
    /// address as a little-endian host reads its network-order bytes.
    #[test]
    fn nidhash_of_lo_o2ib1_and_tcp() {
        assert_eq!(nid::<Nid>("0@lo").nidhash(), 0x0009_0000);
        // o2ib1: net 0x00050001.
        assert_eq!(nid::<Nid>("10.0.0.2@o2ib1").nidhash(), 0x0205_000b);
        assert_eq!(nid::<Nid>("10.0.1.1@o2ib1").nidhash(), 0x0104_000b);
        // tcp: net 0x00020000; 192.168.1.5 is c0 a8 01 05 on the wire, 0x0501a8c0 as read.
        assert_eq!(nid::<Nid>("192.168.1.5@tcp").nidhash(), 0x0503_a8c0);
        assert_eq!(nid::<Nid>("192.168.1.5@tcp3").nidhash(), 0x0503_a8c3);
        // Equal hashes accept both ways: 11.0.0.2@o2ib and 10.0.0.2@o2ib1 collide (the address
        // word differs in its low bit, the net in its number's).
        let (x, y): (Nid, Nid) = (nid("11.0.0.2@o2ib"), nid("10.0.0.2@o2ib1"));
        assert_eq!(x.nidhash(), y.nidhash());
        assert!(!RaceOrder::NidHash.lower(x, y) && !RaceOrder::NidHash.lower(y, x));
    }

    /// Under each order, exactly one side of a simultaneous connect refuses; under different
    /// orders both may refuse (the disagreement ulnet detects) or both accept.
    #[test]
    fn orders_agree_with_themselves_and_disagree_with_each_other() {
        let (a, b): (Nid, Nid) = (nid("10.0.0.2@o2ib"), nid("10.0.1.1@o2ib"));
        let at = |me: Nid, them: Nid, order: RaceOrder| {
            resolve_race(RaceInput {
                my_nid: me,
                peer_nid: them,
                active_in_flight: true,
                active_proven_stale: false,
                races: 0,
                race_limit: 20,
                policy: RacePolicy::Ulnet,
                order,
            })
        };
        for order in RaceOrder::ALL {
            let rejects = [at(a, b, order), at(b, a, order)]
                .iter()
                .filter(|d| **d == RaceDecision::RejectRace)
                .count();
            assert_eq!(rejects, 1, "{order:?}");
        }
        // a on 2.15's order, b on 2.16's: each thinks it is higher, both refuse.
        assert_eq!(at(a, b, RaceOrder::Nid), RaceDecision::Accept);
        assert_eq!(at(b, a, RaceOrder::NidHash), RaceDecision::Accept);
        assert_eq!(at(a, b, RaceOrder::NidHash), RaceDecision::RejectRace);
        assert_eq!(at(b, a, RaceOrder::Nid), RaceDecision::RejectRace);
    }

    /// The lower raw NID switches at the first double reject, the higher only at the second.
    #[test]
    fn adoption_breaks_the_symmetry() {
        let (lo, hi) = (nid("10.0.0.2@o2ib"), nid("10.0.1.1@o2ib"));
        assert!(!adopts_peer_order(lo, hi, 0));
        assert!(adopts_peer_order(lo, hi, 1));
        assert!(!adopts_peer_order(hi, lo, 1));
        assert!(adopts_peer_order(hi, lo, 2));
        // At the first double reject exactly one side switches, so the second race agrees.
        assert_ne!(adopts_peer_order(lo, hi, 1), adopts_peer_order(hi, lo, 1));
    }
}
