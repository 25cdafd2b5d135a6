//! What a connection's peer may write into our memory, and what it has written (the
//! receiving side of the tcp fabric's RDMA writes).
//!
//! A grant ([`FabricAction::GrantWrites`](crate::fabric::FabricAction::GrantWrites)) is the
//! sink of one PUT_ACK or GET_REQ: fragments of registered regions, in order. A write frame is
//! refused unless an open grant of its connection holds it (see the fabric's docs). Beyond
//! that, the fabric keeps which bytes of each grant were written at least once, and tells the
//! engine how long the written prefix is before the next message of the connection is handed
//! up ([`FabricEvent::WritesCovered`](crate::fabric::FabricEvent::WritesCovered)): a PUT_DONE
//! or GET_DONE that follows writes short of what it accounts for fails, so memory lent to one
//! peer after another (a router's large buffers) is never passed on with bytes its previous
//! user left there. Coverage, not a count: bytes written twice count once.

use crate::fabric::{RemoteFrag, WrId};

/// Disjoint written ranges kept per fragment. A writer cuts its data in address order, so a
/// well-behaved peer leaves one range per fragment; a peer scattering its writes beyond this
/// many disjoint pieces gets no credit for the pieces past it (its transfer then fails).
const MAX_RANGES: usize = 32;

/// One fragment of a grant.
#[derive(Debug)]
pub(super) struct GrantFrag {
    pub(super) id: WrId,
    pub(super) frag: RemoteFrag,
    /// Written bytes of this fragment: sorted, disjoint, non-adjacent `[start, end)` offsets.
    written: Vec<(u32, u32)>,
}

impl GrantFrag {
    /// Records that `[off, off + len)` of this fragment was written (already checked to lie
    /// inside it).
    fn mark(&mut self, off: u32, len: u32) {
        if len == 0 {
            return;
        }
        let (mut start, mut end) = (off, off.saturating_add(len).min(self.frag.len));
        // The ranges touching [start, end) (overlapping or adjacent) merge with it.
        let first = self.written.partition_point(|&(_, e)| e < start);
        let last = self.written.partition_point(|&(s, _)| s <= end);
        if first < last {
            start = start.min(self.written[first].0);
            end = end.max(self.written[last - 1].1);
            self.written.drain(first..last);
        } else if self.written.len() >= MAX_RANGES {
            return;
        }
        self.written.insert(first, (start, end));
    }

    /// Bytes written from the fragment's start without a gap.
    fn prefix(&self) -> u32 {
        match self.written.first() {
            Some(&(0, end)) => end,
            _ => 0,
        }
    }
}

/// A connection's open grants, fragment by fragment (a handful: one grant per PUT_ACK or
/// GET_REQ awaiting its data).
#[derive(Debug, Default)]
pub(super) struct Grants {
    frags: Vec<GrantFrag>,
    /// Grants written into since their coverage was last reported.
    changed: Vec<WrId>,
}

impl Grants {
    /// Opens grant `id` over `sink`'s fragments, in order.
    pub(super) fn open(&mut self, id: WrId, sink: Vec<RemoteFrag>) {
        self.frags.extend(sink.into_iter().map(|frag| GrantFrag {
            id,
            frag,
            written: Vec::new(),
        }));
    }

    /// Closes grant `id`: later writes into its memory are refused.
    pub(super) fn revoke(&mut self, id: WrId) {
        self.frags.retain(|g| g.id != id);
        self.changed.retain(|&g| g != id);
    }

    /// How far past the frame `[addr, addr + len)` under `key` the grant holding it reaches
    /// (the most, if several hold it); `None` when no open grant holds the whole frame.
    pub(super) fn reach_past(&self, key: u32, addr: u64, len: u64) -> Option<u64> {
        self.frags
            .iter()
            .filter(|g| g.frag.key == key)
            .filter_map(|g| {
                let end = addr.checked_sub(g.frag.addr)?.checked_add(len)?;
                u64::from(g.frag.len).checked_sub(end)
            })
            .max()
    }

    /// Records the frame `[addr, addr + len)` under `key` as written into every grant holding
    /// it (its bytes land before anything behind it on the connection is read).
    pub(super) fn mark(&mut self, key: u32, addr: u64, len: u32) {
        for g in self.frags.iter_mut().filter(|g| g.frag.key == key) {
            let Some(off) = addr.checked_sub(g.frag.addr) else {
                continue;
            };
            let fits = off
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= u64::from(g.frag.len));
            if fits {
                g.mark(off as u32, len);
                if !self.changed.contains(&g.id) {
                    self.changed.push(g.id);
                }
            }
        }
    }

    /// Whether a grant was written into since the last [`Grants::take_changed`].
    pub(super) fn has_changed(&self) -> bool {
        !self.changed.is_empty()
    }

    /// Each grant written into since the last call, with the bytes written from its start
    /// without a gap (its fragments taken in order).
    pub(super) fn take_changed(&mut self) -> Vec<(WrId, u64)> {
        let changed = std::mem::take(&mut self.changed);
        changed
            .into_iter()
            .map(|id| {
                let mut prefix = 0u64;
                for g in self.frags.iter().filter(|g| g.id == id) {
                    let p = g.prefix();
                    prefix += u64::from(p);
                    if p < g.frag.len {
                        break;
                    }
                }
                (id, prefix)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(addr: u64, len: u32) -> RemoteFrag {
        RemoteFrag { key: 7, addr, len }
    }

    fn prefix_after(frags: &[RemoteFrag], writes: &[(u64, u32)]) -> u64 {
        let mut g = Grants::default();
        g.open(WrId(1), frags.to_vec());
        for &(addr, len) in writes {
            g.mark(7, addr, len);
        }
        g.take_changed().first().map_or(0, |&(_, p)| p)
    }

    /// The written prefix is coverage: gaps stop it, rewrites do not add to it, order does not
    /// matter, and a grant's fragments count in their order.
    #[test]
    fn the_written_prefix_counts_each_byte_once_and_stops_at_a_gap() {
        let one = [frag(1000, 100)];
        assert_eq!(prefix_after(&one, &[(1000, 100)]), 100);
        assert_eq!(
            prefix_after(&one, &[(1000, 50), (1000, 50)]),
            50,
            "written twice"
        );
        assert_eq!(prefix_after(&one, &[(1000, 40), (1060, 40)]), 40, "a gap");
        assert_eq!(
            prefix_after(&one, &[(1050, 50), (1000, 50)]),
            100,
            "out of order"
        );
        assert_eq!(
            prefix_after(&one, &[(1010, 90)]),
            0,
            "the first bytes unwritten"
        );
        assert_eq!(prefix_after(&one, &[]), 0);
        assert_eq!(
            prefix_after(&one, &[(1000, 30), (1020, 30), (1050, 50)]),
            100
        );
        // Two fragments, far apart: the second counts only once the first is whole.
        let two = [frag(1000, 100), frag(5000, 10)];
        assert_eq!(prefix_after(&two, &[(1000, 100), (5000, 10)]), 110);
        assert_eq!(prefix_after(&two, &[(5000, 10)]), 0);
        assert_eq!(prefix_after(&two, &[(1000, 99), (5000, 10)]), 99);
        // A write outside the grant marks nothing.
        assert_eq!(prefix_after(&one, &[(900, 50), (1100, 5)]), 0);
    }

    /// A peer scattering single bytes cannot grow the table past its bound; what it skipped
    /// is simply not covered.
    #[test]
    fn scattered_writes_are_bounded() {
        let mut g = Grants::default();
        g.open(WrId(1), vec![frag(0, 10_000)]);
        for i in 0..5_000u64 {
            g.mark(7, i * 2 + 1, 1);
        }
        assert!(g.frags[0].written.len() <= MAX_RANGES);
        assert_eq!(g.take_changed(), vec![(WrId(1), 0)]);
        // Filling the whole fragment still covers it.
        g.mark(7, 0, 10_000);
        assert_eq!(g.take_changed(), vec![(WrId(1), 10_000)]);
    }

    #[test]
    fn a_revoked_grant_is_not_reported() {
        let mut g = Grants::default();
        g.open(WrId(1), vec![frag(0, 10)]);
        g.open(WrId(2), vec![frag(100, 10)]);
        g.mark(7, 0, 10);
        g.mark(7, 100, 5);
        g.revoke(WrId(1));
        assert_eq!(g.take_changed(), vec![(WrId(2), 5)]);
        assert!(!g.has_changed());
        assert_eq!(g.reach_past(7, 0, 1), None, "revoked");
        assert_eq!(g.reach_past(7, 100, 4), Some(6));
    }
}
