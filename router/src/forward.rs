//! Forwarding's public types: router buffer pools, the books of the messages a router holds for
//! others, a held message's key, and what one NI runtime hands to another (reference sections
//! 3.4 and 6.3). The pipeline itself, stage by stage (admission, router credit, buffer, commit,
//! egress, send, completion and the books), is `node/forwarding.rs`.
//!
//! In short: a message for another node keeps its LND receive slot until it has a router credit
//! of the peer that sent it and a buffer of its size (the back pressure upstream); then it goes
//! to the egress NI, in this node or, as a [`Handover`], in a sibling runtime on another thread
//! (handed over by [`crate::relay`]). Its buffer and router credit come back when the egress is
//! done with it, whatever the outcome; the ingress node is the one that counts the outcome, so
//! `received = forwarded + dropped + in flight` holds in one place.

use std::collections::VecDeque;
use std::fmt;

use lnd::handle::{Handle, Tag};
use lnd::wire::lnet::LNET_MTU;
use lnd::wire::{LnetHdr, Net, Nid};

use crate::config::BufferCounts;
/// Kept here too, where it was first (`router::forward::BulkScrub`).
pub use crate::config::BulkScrub;
use crate::error::LnetError;

/// Bytes in a router buffer page.
pub const PAGE_SIZE: usize = 4096;

/// Which router buffer pool a message needs, by payload size (lnet_msg2bufpool).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum PoolClass {
    /// No payload.
    Tiny,
    /// Up to one page.
    Small,
    /// Up to LNET_MTU.
    Large,
}

impl PoolClass {
    /// Every class, in `routing show` order.
    pub const ALL: [PoolClass; 3] = [PoolClass::Tiny, PoolClass::Small, PoolClass::Large];

    /// The class for a payload of `len` bytes; `None` beyond LNET_MTU.
    pub fn for_len(len: usize) -> Option<PoolClass> {
        match len {
            0 => Some(PoolClass::Tiny),
            l if l <= PAGE_SIZE => Some(PoolClass::Small),
            l if l <= LNET_MTU as usize => Some(PoolClass::Large),
            _ => None,
        }
    }

    /// Pages of one buffer (`npages` in `routing show`).
    pub fn npages(self) -> u32 {
        match self {
            PoolClass::Tiny => 0,
            PoolClass::Small => 1,
            PoolClass::Large => LNET_MTU / PAGE_SIZE as u32,
        }
    }

    /// `tiny`, `small`, `large`.
    pub fn name(self) -> &'static str {
        match self {
            PoolClass::Tiny => "tiny",
            PoolClass::Small => "small",
            PoolClass::Large => "large",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            PoolClass::Tiny => 0,
            PoolClass::Small => 1,
            PoolClass::Large => 2,
        }
    }
}

/// One pool of router buffers (struct lnet_rtrbufpool): its credits go negative by the number
/// of messages waiting for a buffer.
#[derive(Debug)]
pub(crate) struct Pool {
    pub nbuffers: u32,
    pub credits: i64,
    pub min_credits: i64,
    /// Messages holding a router credit, waiting for a buffer of this pool (rbp_msgs).
    pub waiting: VecDeque<FwdKey>,
}

impl Pool {
    pub fn new(nbuffers: u32) -> Pool {
        Pool {
            nbuffers,
            credits: i64::from(nbuffers),
            min_credits: i64::from(nbuffers),
            waiting: VecDeque::new(),
        }
    }

    /// Resizes the pool (lnetctl set ..._buffers): the credits move by the difference, so
    /// buffers in use stay counted and a shrink below what is in use leaves the pool negative
    /// until they come back.
    pub fn resize(&mut self, nbuffers: u32) {
        self.credits += i64::from(nbuffers) - i64::from(self.nbuffers);
        self.nbuffers = nbuffers;
        self.min_credits = self.min_credits.min(self.credits);
    }
}

/// The three pools.
#[derive(Debug)]
pub(crate) struct Pools(pub [Pool; 3]);

impl Pools {
    pub fn new(b: BufferCounts) -> Pools {
        Pools([Pool::new(b.tiny), Pool::new(b.small), Pool::new(b.large)])
    }

    pub fn get_mut(&mut self, c: PoolClass) -> &mut Pool {
        &mut self.0[c.index()]
    }
}

/// One pool as `routing show` prints it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PoolInfo {
    pub class: PoolClass,
    pub npages: u32,
    pub nbuffers: u32,
    /// Buffers free now (negative: that many messages wait for one).
    pub credits: i64,
    /// Low-water mark of `credits`.
    pub min_credits: i64,
}

/// The tag of a held message's handle.
#[derive(Debug)]
pub(crate) enum FwdTag {}

impl Tag for FwdTag {
    const NAME: &'static str = "forward";
}

/// Names a message a router holds for another node, from its arrival until its egress is done:
/// the handle of its slot in the ingress runtime's table of held messages (a slab index and a
/// generation, so a late [`Handover::Done`] for a message gone since finds nothing). Opaque
/// outside the node; the relay between NI runtimes only carries it back to its `origin`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct FwdKey(pub(crate) Handle<FwdTag>);

/// A router's large buffers in registered memory, shared by the node's NI runtimes: buffer `k`
/// as each NI's fabric registered it. A bulk PUT to forward is written into buffer `k` by its
/// ingress NI's fabric and written onward from the same memory by the egress NI's: no copy in
/// the router (the fabrics do what they must).
#[derive(Clone, Debug, Default)]
pub struct BulkBuffers {
    /// For each buffer, (NI NID, the registration on that NI's fabric: id, key, address,
    /// length).
    pub bufs: Vec<Vec<(Nid, BulkRegion)>>,
    /// Each buffer's memory, for scrubbing it before it is lent again (see
    /// [`BulkScrub`]); `mem[k]` is buffer `k` (`None` where `bufs[k]` names no buffer).
    pub mem: Vec<Option<lnd::mem::SharedMem>>,
}

/// One registration of a router buffer (`lnd::mem::Registration` without its ownership: the
/// daemon keeps those to deregister at exit).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BulkRegion {
    pub region: lnd::mem::RegionId,
    pub key: u32,
    pub addr: u64,
    pub len: u64,
}

impl BulkRegion {
    pub fn of(reg: &lnd::mem::Registration) -> BulkRegion {
        BulkRegion {
            region: reg.id(),
            key: reg.key(),
            addr: reg.addr(),
            len: reg.len(),
        }
    }
}

impl BulkBuffers {
    /// Buffer `k` as NI `nid`'s fabric registered it.
    pub fn view(&self, k: usize, nid: Nid) -> Option<BulkRegion> {
        self.bufs
            .get(k)?
            .iter()
            .find_map(|&(n, r)| (n == nid).then_some(r))
    }
}

/// A message one NI runtime hands to another of the same node (the daemon carries them over
/// bounded channels between NI threads).
#[derive(Debug)]
pub enum Handover {
    /// Send this message for another node out of the runtime on `via` (the net of its next
    /// hop).
    Forward { via: Net, fwd: HandedForward },
    /// The egress is done with forwarded message `key` of the runtime whose NID is `origin`.
    Done {
        origin: Nid,
        key: FwdKey,
        result: Result<(), LnetError>,
    },
    /// A message of this node for one of its own NIDs that another runtime runs
    /// (`hdr.dest_nid`): that runtime delivers it in memory, as Lustre's lolnd delivers to a
    /// local NI. Nothing comes back but what its users answer.
    Local { hdr: LnetHdr, payload: Vec<u8> },
}

/// A message for another node that its ingress runtime hands to the egress runtime, as the
/// egress takes it ([`Handover::Forward`]).
#[derive(Debug)]
pub struct HandedForward {
    /// The ingress runtime's NID: it gets a [`Handover::Done`] for `key`.
    pub origin: Nid,
    /// The peer it came from (never sent back there: see [`FwdDrop::Loop`]).
    pub from: Nid,
    pub key: FwdKey,
    pub hdr: LnetHdr,
    pub payload: Vec<u8>,
    /// A bulk message: the router buffer (see [`BulkBuffers`]) that holds its payload.
    pub bulk: Option<usize>,
}

impl Handover {
    /// The NI runtime it is for: the NID of the ingress for `Done`, else any NI on `via`.
    pub fn target(&self) -> HandoverTarget {
        match self {
            Handover::Forward { via, .. } => HandoverTarget::Net(*via),
            Handover::Done { origin, .. } => HandoverTarget::Nid(*origin),
            Handover::Local { hdr, .. } => HandoverTarget::Nid(hdr.dest_nid),
        }
    }
}

/// Where a [`Handover`] goes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HandoverTarget {
    /// The runtime of the NI with this NID.
    Nid(Nid),
    /// The (first) runtime with an NI on this net.
    Net(Net),
}

/// Why a message for another node was not forwarded.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum FwdDrop {
    /// Routing is off (`routing: enable: 0`).
    RoutingDisabled,
    /// Addressed to a peer on the net it arrived on, or to another of our own NIDs: the
    /// sender should have sent it directly (lnet_parse: -EPROTO; its connection is closed).
    WrongNet,
    /// Larger than LNET_MTU, or shorter than its header says.
    Malformed,
    /// No route to its destination's net, or none alive.
    NoRoute,
    /// Its next hop is the peer it came from (two routers that route a net through each
    /// other: split horizon), or it has crossed a router already and no gateway on its
    /// destination's net is in reach (the hop rule, which cuts longer loops). Cut here rather
    /// than passed around for good: LNet has no TTL.
    Loop,
    /// The egress LND could not deliver it to the next hop.
    SendFailed,
    /// The node is shutting down, or the fabric it came in on failed.
    Shutdown,
    /// Its next hop is a peer NI the LND reported down (lnet_check_message_drop).
    PeerDown,
    /// A bulk PUT (PUT_REQ) with no large router buffer in registered memory to take it: refused
    /// with -EPROTO, so that its sender fails it. An optimized GET (GET_REQ) is never routed and
    /// counts as malformed.
    NoBulkBuffer,
    /// A bulk PUT whose sender did not fill the large buffer it was lent (and send PUT_DONE)
    /// within the LND's `grant_timeout`: the buffer was reclaimed.
    BulkStalled,
    /// A bulk PUT whose sender's PUT_DONE came with less of its data written than it
    /// accounts for (the fabric saw the writes): nothing of it is forwarded.
    BulkShort,
    /// A bulk PUT refused before any buffer was lent: its sender stalled or short-wrote the
    /// buffers it was lent lately and is refused for a while (doubling per strike).
    BulkRefused,
}

impl FwdDrop {
    pub const ALL: [FwdDrop; 12] = [
        FwdDrop::RoutingDisabled,
        FwdDrop::WrongNet,
        FwdDrop::Malformed,
        FwdDrop::NoRoute,
        FwdDrop::Loop,
        FwdDrop::SendFailed,
        FwdDrop::Shutdown,
        FwdDrop::PeerDown,
        FwdDrop::NoBulkBuffer,
        FwdDrop::BulkStalled,
        FwdDrop::BulkShort,
        FwdDrop::BulkRefused,
    ];

    /// The counter's name in `stats show -v`.
    pub fn name(self) -> &'static str {
        match self {
            FwdDrop::RoutingDisabled => "routing_disabled",
            FwdDrop::WrongNet => "wrong_net",
            FwdDrop::Malformed => "malformed",
            FwdDrop::NoRoute => "no_route",
            FwdDrop::Loop => "loop",
            FwdDrop::SendFailed => "send_failed",
            FwdDrop::Shutdown => "shutdown",
            FwdDrop::PeerDown => "peer_down",
            FwdDrop::NoBulkBuffer => "no_bulk_buffer",
            FwdDrop::BulkStalled => "bulk_stalled",
            FwdDrop::BulkShort => "bulk_short",
            FwdDrop::BulkRefused => "bulk_refused",
        }
    }

    fn index(self) -> usize {
        match self {
            FwdDrop::RoutingDisabled => 0,
            FwdDrop::WrongNet => 1,
            FwdDrop::Malformed => 2,
            FwdDrop::NoRoute => 3,
            FwdDrop::SendFailed => 4,
            FwdDrop::Shutdown => 5,
            FwdDrop::Loop => 6,
            FwdDrop::PeerDown => 7,
            FwdDrop::NoBulkBuffer => 8,
            FwdDrop::BulkStalled => 9,
            FwdDrop::BulkShort => 10,
            FwdDrop::BulkRefused => 11,
        }
    }

    /// The reason an egress failure maps to.
    pub(crate) fn of(e: &LnetError) -> FwdDrop {
        match e {
            LnetError::NoRoute(_) => FwdDrop::NoRoute,
            LnetError::Loop(_) | LnetError::HopLimit(_) => FwdDrop::Loop,
            LnetError::PeerDown(_) => FwdDrop::PeerDown,
            LnetError::Shutdown => FwdDrop::Shutdown,
            LnetError::PayloadTooLarge { .. } => FwdDrop::Malformed,
            _ => FwdDrop::SendFailed,
        }
    }
}

impl fmt::Display for FwdDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A router's account of the messages it accepted for others: every one is forwarded,
/// dropped for a counted reason, or still held (`in_flight`), and
/// `received == forwarded + dropped() + in_flight` at every moment the node is not inside a
/// call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardStats {
    /// Messages for other nodes that arrived on this node's NIs.
    pub received: u64,
    /// Forwarded: the next hop's LND has them (`route_count`), and their payload bytes.
    pub forwarded: u64,
    pub forwarded_bytes: u64,
    /// Dropped, by reason (see [`FwdDrop::ALL`] for the order).
    pub dropped: [u64; FwdDrop::ALL.len()],
    /// Held now: waiting for a router credit or a buffer, or with an egress.
    pub in_flight: u64,
    /// Messages that had to wait for a router credit of their sender, or for a buffer.
    pub waited_rtr_credit: u64,
    pub waited_buffer: u64,
    /// Bulk PUTs that waited because their senders, not yet proven, had filled the unproven
    /// share of the large buffers (or held one already).
    pub waited_unproven: u64,
    /// Large buffers scrubbed before being lent again, and the bytes cleared.
    pub scrubbed: u64,
    pub scrubbed_bytes: u64,
}

impl ForwardStats {
    pub fn dropped_for(&self, why: FwdDrop) -> u64 {
        self.dropped[why.index()]
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.iter().sum()
    }

    pub(crate) fn count_drop(&mut self, why: FwdDrop) {
        self.dropped[why.index()] += 1;
    }

    /// The books balance.
    pub fn reconciles(&self) -> bool {
        self.received == self.forwarded + self.dropped() + self.in_flight
    }
}

/// `routing show` of one node (one CPT per runtime in the daemon).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingInfo {
    pub enabled: bool,
    pub pools: Vec<PoolInfo>,
    pub stats: ForwardStats,
}

impl RoutingInfo {
    /// The pools' sizes.
    pub fn buffers(&self) -> crate::BufferCounts {
        let size = |class| {
            self.pools
                .iter()
                .find(|p| p.class == class)
                .map_or(0, |p| p.nbuffers)
        };
        crate::BufferCounts {
            tiny: size(PoolClass::Tiny),
            small: size(PoolClass::Small),
            large: size(PoolClass::Large),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_class_by_size_is_lustres() {
        let rows = [
            (0, Some(PoolClass::Tiny)),
            (1, Some(PoolClass::Small)),
            (4096, Some(PoolClass::Small)),
            (4097, Some(PoolClass::Large)),
            (LNET_MTU as usize, Some(PoolClass::Large)),
            (LNET_MTU as usize + 1, None),
        ];
        for (len, want) in rows {
            assert_eq!(PoolClass::for_len(len), want, "{len}");
        }
        assert_eq!(PoolClass::Large.npages(), 256);
    }

    #[test]
    fn a_pool_resized_below_its_use_goes_negative_then_recovers() {
        let mut p = Pool::new(4);
        p.credits -= 3; // three in use
        p.resize(2);
        assert_eq!((p.nbuffers, p.credits, p.min_credits), (2, -1, -1));
        p.credits += 3;
        assert_eq!(p.credits, 2);
        p.resize(8);
        assert_eq!(p.credits, 8);
    }
}
