//! The bulk state an [`LnetNode`](crate::LnetNode) holds: the ranges of registered memory it
//! moves ([`BulkBuf`]), its posted memory descriptors, its routed GETs and how it lends its large
//! buffers. Types only, below both `node.rs`, which holds them, and `node/bulk.rs`, which is
//! their behaviour (they were defined there, which made the two files a cycle).

use std::collections::{HashMap, VecDeque};

use lnd::iface::BulkMem;
use lnd::mem::{RegionId, Registration, SharedMem};
use lnd::wheel::TimerKey;
use lnd::wire::lnet::LNET_MTU;
use lnd::wire::Nid;

use crate::config::BulkScrub;
use crate::ids::{MdId, MsgId, NiIndex};

/// A range of memory registered with one NI's fabric, for LNet to move bulk data from (a
/// source) or into (a sink): the registration's local name, key and address, and the range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BulkBuf {
    /// The NI whose fabric the memory is registered with.
    pub ni: NiIndex,
    pub region: RegionId,
    pub key: u32,
    /// The registration's first byte's address.
    pub addr: u64,
    pub offset: u64,
    pub len: u32,
    /// The memory itself where LNet shares it ([`BulkBuf::shared`]): an LND that streams
    /// payloads (socklnd) reads and writes it; one that moves them by RDMA needs only the
    /// registration.
    pub shared: Option<SharedMem>,
}

impl BulkBuf {
    /// `[offset, offset + len)` of `reg`, registered with NI `ni`'s fabric; `None` if the range
    /// is not inside the registration, empty, or larger than LNET_MTU.
    pub fn new(ni: NiIndex, reg: &Registration, offset: u64, len: u32) -> Option<BulkBuf> {
        let end = offset.checked_add(u64::from(len))?;
        (len > 0 && end <= reg.len() && len <= LNET_MTU).then_some(BulkBuf {
            ni,
            region: reg.id(),
            key: reg.key(),
            addr: reg.addr(),
            offset,
            len,
            shared: None,
        })
    }

    /// The same range, with the memory the registration names (its offsets are the
    /// registration's), for an LND that streams payloads.
    pub fn shared(mut self, mem: SharedMem) -> BulkBuf {
        self.shared = Some(mem);
        self
    }

    /// Its first `len` bytes, for the LND to move a payload from or into; `shared` is the
    /// memory itself where LNet shares it (an LND that streams payloads needs it).
    pub(super) fn mem(&self, len: u32, shared: Option<SharedMem>) -> BulkMem {
        BulkMem {
            region: self.region,
            key: self.key,
            addr: self.addr,
            offset: self.offset,
            len: len.min(self.len),
            mem: shared.or_else(|| self.shared.clone()),
        }
    }
}

/// A posted one-shot MD.
#[derive(Clone, Debug)]
pub(super) struct Md {
    pub(super) portal: u32,
    pub(super) match_bits: u64,
    pub(super) buf: BulkBuf,
    /// PUTs write into it; else GETs read from it.
    pub(super) sink: bool,
    /// The registered memory `buf` names, lent for a GET from a sibling runtime's NI: that
    /// one is answered in memory ([`LnetNode::post_source_shared`](crate::LnetNode::post_source_shared)).
    pub(super) mem: Option<SharedMem>,
}

/// The posted MDs, matched in posting order on (portal, match bits, sink or source).
#[derive(Default)]
pub(super) struct Mds {
    posted: HashMap<u64, Md>,
    /// The MDs' ids by what matches them, oldest first: matching a message is a lookup, not a
    /// scan of every posted MD.
    by_match: HashMap<MatchKey, VecDeque<u64>>,
    next: u64,
}

/// What an MD matches on: its NI, portal, match bits, and whether PUTs write into it.
type MatchKey = (usize, u32, u64, bool);

impl Mds {
    /// Gives back the room a burst of posted MDs left (see `lnd::trim`); whether any table is
    /// still large.
    pub(super) fn trim(&mut self) -> bool {
        use lnd::trim::{Trim, TRIM_FLOOR, TRIM_FLOOR_SMALL};
        let mut large = self.posted.trim(TRIM_FLOOR);
        large |= self.by_match.trim(TRIM_FLOOR);
        for ids in self.by_match.values_mut() {
            large |= ids.trim(TRIM_FLOOR_SMALL);
        }
        large
    }

    pub(super) fn capacities(&self, r: &mut lnd::trim::CapacityReport) {
        r.add("mds", &self.posted);
        r.add("md_match", &self.by_match);
        for ids in self.by_match.values() {
            r.add("md_match_queues", ids);
        }
    }

    pub(super) fn post(&mut self, md: Md) -> MdId {
        self.next += 1;
        let key = (md.buf.ni.0, md.portal, md.match_bits, md.sink);
        self.by_match.entry(key).or_default().push_back(self.next);
        self.posted.insert(self.next, md);
        MdId(self.next)
    }

    /// Takes the oldest MD matching, on NI `ni`.
    pub(super) fn take(
        &mut self,
        ni: usize,
        portal: u32,
        match_bits: u64,
        sink: bool,
    ) -> Option<(MdId, Md)> {
        let key = (ni, portal, match_bits, sink);
        let ids = self.by_match.get_mut(&key)?;
        let found = std::iter::from_fn(|| ids.pop_front())
            .find_map(|id| self.posted.remove(&id).map(|m| (MdId(id), m)));
        if ids.is_empty() {
            self.by_match.remove(&key);
        }
        found
    }

    /// Takes back an MD nothing matched yet.
    pub(super) fn unlink(&mut self, md: MdId) -> bool {
        let Some(m) = self.posted.remove(&md.0) else {
            return false;
        };
        let key = (m.buf.ni.0, m.portal, m.match_bits, m.sink);
        if let Some(ids) = self.by_match.get_mut(&key) {
            ids.retain(|&id| id != md.0);
            if ids.is_empty() {
                self.by_match.remove(&key);
            }
        }
        true
    }

    pub(super) fn len(&self) -> usize {
        self.posted.len()
    }
}

/// A GET into registered memory sent through a router, waiting for its REPLY.
pub(super) struct RoutedGet {
    pub(super) id: MsgId,
    pub(super) buf: BulkBuf,
    /// Whom it went to: only a REPLY from there is its answer (a wire handle alone is
    /// guessable, and the REPLY writes into the user's memory).
    pub(super) dst: Nid,
    /// Its deadline on the node's timer table.
    pub(super) timer: TimerKey,
}

/// Bytes scrubbed per [`LnetNode::scrub_bulk`](crate::LnetNode::scrub_bulk) call at most, so that a loop goes back to its
/// fabric between buffers (4 MiB: a few hundred microseconds of memset).
pub const SCRUB_BUDGET: usize = 4 << 20;

/// How the large buffers are lent (see the notes above).
#[derive(Debug, Default)]
pub(crate) struct Lending {
    pub(super) scrub: BulkScrub,
    /// Buffers done with, to scrub before they go back to the pool: (buffer, bytes, its
    /// memory).
    pub(super) dirty: VecDeque<(usize, u32, Option<lnd::mem::SharedMem>)>,
    /// Large buffers held now by bulk PUTs admitted under the unproven share.
    pub(super) unproven_held: u32,
    /// Bulk PUTs of unproven senders waiting for room in that share (held messages' keys).
    pub(super) unproven_wait: VecDeque<crate::forward::FwdKey>,
}

impl Lending {
    pub(crate) fn new(scrub: BulkScrub) -> Lending {
        Lending {
            scrub,
            ..Lending::default()
        }
    }
}

/// The node's large router buffers as this runtime lends them, one of the sub-states an
/// [`LnetNode`](crate::LnetNode) is built from: the node-wide table (shared with the sibling
/// runtimes), the ones this runtime owns and has free, those leaving it, and how they are lent
/// (scrubbing, the unproven share: see "lending large buffers" in `node/bulk.rs`).
pub(super) struct LargeBuffers {
    /// The node's large router buffers in registered memory, each as every NI's fabric
    /// registered it.
    pub(super) table: std::sync::Arc<crate::forward::BulkBuffers>,
    /// The ones this runtime lends out and has free now.
    pub(super) free: Vec<usize>,
    /// How many it lends out (the most its large pool can have).
    pub(super) owned: u32,
    /// How they are lent: scrubbing, and the share of peers not yet proven.
    pub(super) lending: Lending,
    /// Every buffer this runtime may have lent: the ones it owns and the ones leaving it.
    pub(super) mine: Vec<usize>,
    /// Buffers no longer this runtime's that were lent when the daemon took them back: each
    /// is released once it is free again (`LnetNode::take_released_bulk`).
    pub(super) leaving: Vec<usize>,
    /// Buffers released and not yet reported to the daemon.
    pub(super) released: Vec<usize>,
}

impl LargeBuffers {
    pub(super) fn new(scrub: BulkScrub) -> LargeBuffers {
        LargeBuffers {
            table: Default::default(),
            free: Vec::new(),
            owned: 0,
            lending: Lending::new(scrub),
            mine: Vec::new(),
            leaving: Vec::new(),
            released: Vec::new(),
        }
    }
}
