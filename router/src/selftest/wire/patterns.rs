//! The data patterns a brw test writes and checks in its bulk pages (brw_test.c).

use lnd::wire::ByteOrder;

use super::messages::*;

// ---------------------------------------------------------------------------------------------
// Bulk data patterns (brw_test.c)
// ---------------------------------------------------------------------------------------------

/// Number of pages a brw bulk of `len` bytes spans when it starts at in-page offset `offset`
/// (brw_client_prep_rpc).
pub fn brw_page_count(offset: usize, len: usize, page_size: usize) -> usize {
    offset.saturating_add(len).div_ceil(page_size.max(1))
}

/// Splits a bulk of `len` bytes starting at in-page `offset` into per-page segments
/// `(start, len)` in bulk coordinates, as srpc_init_bulk lays out its iovecs.
fn segments(
    len: usize,
    offset: usize,
    page_size: usize,
) -> Result<impl Iterator<Item = (usize, usize)>, SelftestWireError> {
    if page_size == 0
        || page_size % BRW_MSIZE != 0
        || offset >= page_size
        || offset % BRW_MSIZE != 0
        || len % BRW_MSIZE != 0
    {
        return Err(SelftestWireError::Misaligned {
            page_size,
            offset,
            len,
        });
    }
    let mut pos = 0usize;
    let mut in_page = offset;
    Ok(core::iter::from_fn(move || {
        if pos >= len {
            return None;
        }
        let seg = (page_size - in_page).min(len - pos);
        let item = (pos, seg);
        pos += seg;
        in_page = 0;
        Some(item)
    }))
}

/// The word offsets (within one page segment of `seg` bytes at `start`) a check looks at.
fn pattern_words(check: BrwCheck, start: usize, seg: usize) -> impl Iterator<Item = usize> {
    let (first, step, count) = match check {
        BrwCheck::None | BrwCheck::Discard => (start, BRW_MSIZE, 0),
        // The first word, and the last one when the segment has more than one.
        BrwCheck::Simple if seg > BRW_MSIZE => (start, seg - BRW_MSIZE, 2),
        BrwCheck::Simple => (start, BRW_MSIZE, seg / BRW_MSIZE),
        BrwCheck::Full => (start, BRW_MSIZE, seg / BRW_MSIZE),
    };
    (0..count).map(move |k| first + k * step)
}

/// Writes the brw pattern of `check` into `buf`, a bulk whose first byte sits at in-page offset
/// `offset` in pages of `page_size` bytes (brw_fill_bulk): each page segment gets `magic` in its
/// first and last 8-byte word ([`BrwCheck::Simple`]) or in every word ([`BrwCheck::Full`]);
/// `None` and `Discard` write nothing. The word is written in `order`, the byte order of the
/// node sending the data (Lustre copies it from memory). Use [`BRW_MAGIC`] for data and
/// [`BRW_POISON`] to poison a sink before it is filled.
pub fn fill_pattern(
    buf: &mut [u8],
    offset: usize,
    page_size: usize,
    check: BrwCheck,
    magic: u64,
    order: ByteOrder,
) -> Result<(), SelftestWireError> {
    for (start, seg) in segments(buf.len(), offset, page_size)? {
        for at in pattern_words(check, start, seg) {
            order.put_u64(buf, at, magic);
        }
    }
    Ok(())
}

/// Checks the brw pattern of `check` in `buf` (brw_check_bulk), laid out as for
/// [`fill_pattern`]; `order` is the byte order of the node that sent the data (the order its
/// srpc messages came in: Lustre compares against the byte-swapped magic when the message was
/// swapped). Returns the first bad word. `None` and `Discard` always pass.
///
/// The segmenting follows the *checking* node's layout: a Lustre brw server always lays out its
/// buffer from page offset 0 while a v1 client may use a non-zero offset, so with
/// [`BrwCheck::Simple`] and an offset the two ends look at different words (a write would then
/// fail the server's check unless the client's pages happen to hold the magic there). We mirror
/// that; the service decides which offset each side uses.
pub fn check_pattern(
    buf: &[u8],
    offset: usize,
    page_size: usize,
    check: BrwCheck,
    magic: u64,
    order: ByteOrder,
) -> Result<(), SelftestWireError> {
    for (start, seg) in segments(buf.len(), offset, page_size)? {
        for at in pattern_words(check, start, seg) {
            let found = order.get_u64(buf, at);
            if found != magic {
                return Err(SelftestWireError::BadBulkData {
                    at,
                    found,
                    expected: magic,
                });
            }
        }
    }
    Ok(())
}
