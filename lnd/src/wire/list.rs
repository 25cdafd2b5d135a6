//! Arrays of fixed-size records inside a message (RDMA fragments, ping NI entries), readable in place.
//!
//! A parsed message borrows its records straight from the receive buffer (no allocation on the
//! receive path); a message being built borrows them from the caller's slice. Both compare equal when
//! they hold the same records, which is what round-trip tests need.

use core::fmt;

use super::ByteOrder;

/// A fixed-size record that appears in arrays on the wire.
pub trait WireRecord: Copy + PartialEq + fmt::Debug {
    /// Bytes one record takes on the wire.
    const WIRE_LEN: usize;
    /// Reads one record from exactly `WIRE_LEN` bytes.
    fn read(b: &[u8], order: ByteOrder) -> Self;
    /// Writes one record into exactly `WIRE_LEN` bytes.
    fn write(&self, b: &mut [u8], order: ByteOrder);
}

/// Records either still on the wire, or supplied by the caller.
#[derive(Copy, Clone)]
pub enum WireList<'a, T> {
    /// `bytes.len()` is a whole multiple of `T::WIRE_LEN` (checked by the parser).
    Wire { bytes: &'a [u8], order: ByteOrder },
    /// Records to emit.
    Slice(&'a [T]),
}

impl<'a, T: WireRecord> WireList<'a, T> {
    /// How many records there are.
    pub fn len(&self) -> usize {
        match self {
            WireList::Wire { bytes, .. } => bytes.len() / T::WIRE_LEN,
            WireList::Slice(s) => s.len(),
        }
    }

    /// True when there are no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Record `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<T> {
        match *self {
            WireList::Wire { bytes, order } => {
                let at = i.checked_mul(T::WIRE_LEN)?;
                bytes
                    .get(at..at.checked_add(T::WIRE_LEN)?)
                    .map(|b| T::read(b, order))
            }
            WireList::Slice(s) => s.get(i).copied(),
        }
    }

    /// Iterates the records in order.
    pub fn iter(&self) -> Iter<'a, T> {
        match *self {
            WireList::Wire { bytes, order } => Iter::Wire(bytes.chunks_exact(T::WIRE_LEN), order),
            WireList::Slice(s) => Iter::Slice(s.iter()),
        }
    }

    /// Writes every record back to back from the start of `out`, which must hold them all.
    pub(crate) fn write_all(&self, out: &mut [u8], order: ByteOrder) {
        for (rec, chunk) in self.iter().zip(out.chunks_exact_mut(T::WIRE_LEN)) {
            rec.write(chunk, order);
        }
    }
}

impl<T: WireRecord> PartialEq for WireList<'_, T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: WireRecord> Eq for WireList<'_, T> where T: Eq {}

impl<T: WireRecord> fmt::Debug for WireList<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over a [`WireList`].
pub enum Iter<'a, T> {
    Wire(core::slice::ChunksExact<'a, u8>, ByteOrder),
    Slice(core::slice::Iter<'a, T>),
}

impl<T: WireRecord> Iterator for Iter<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match self {
            Iter::Wire(chunks, order) => chunks.next().map(|b| T::read(b, *order)),
            Iter::Slice(it) => it.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Iter::Wire(chunks, _) => chunks.size_hint(),
            Iter::Slice(it) => it.size_hint(),
        }
    }
}

impl<T: WireRecord> ExactSizeIterator for Iter<'_, T> {}
