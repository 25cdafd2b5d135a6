//! The brw data check over any length: Lustre's pattern ([`fill_pattern`], [`check_pattern`])
//! covers whole 8-byte words; a bulk whose length is not a multiple of 8 (which ulnet's console
//! allows, so that integrity is checked at every size) gets the leading bytes of the magic, in
//! the sender's byte order, in its last partial word.

use lnd::wire::ByteOrder;

use super::wire::{check_pattern, fill_pattern, BrwCheck, SelftestWireError, BRW_MSIZE};

/// `magic` as the 8 bytes a node of byte order `order` writes.
fn word(magic: u64, order: ByteOrder) -> [u8; BRW_MSIZE] {
    let mut w = [0u8; BRW_MSIZE];
    order.put_u64(&mut w, 0, magic);
    w
}

/// Writes the pattern of `check` into `buf` (a bulk starting at in-page offset `offset`).
pub(crate) fn fill(
    buf: &mut [u8],
    offset: usize,
    page: usize,
    check: BrwCheck,
    magic: u64,
    order: ByteOrder,
) -> Result<(), SelftestWireError> {
    let whole = buf.len() / BRW_MSIZE * BRW_MSIZE;
    let (words, tail) = buf.split_at_mut(whole);
    fill_pattern(words, offset, page, check, magic, order)?;
    if matches!(check, BrwCheck::Simple | BrwCheck::Full) && !tail.is_empty() {
        tail.copy_from_slice(&word(magic, order)[..tail.len()]);
    }
    Ok(())
}

/// Checks the pattern of `check` in `buf`, written by a node of byte order `order`.
pub(crate) fn check(
    buf: &[u8],
    offset: usize,
    page: usize,
    check: BrwCheck,
    magic: u64,
    order: ByteOrder,
) -> Result<(), SelftestWireError> {
    let whole = buf.len() / BRW_MSIZE * BRW_MSIZE;
    let (words, tail) = buf.split_at(whole);
    check_pattern(words, offset, page, check, magic, order)?;
    let checked = matches!(check, BrwCheck::Simple | BrwCheck::Full);
    if checked && !tail.is_empty() && tail != &word(magic, order)[..tail.len()] {
        let mut found = [0u8; BRW_MSIZE];
        found[..tail.len()].copy_from_slice(tail);
        return Err(SelftestWireError::BadBulkData {
            at: whole,
            found: order.get_u64(&found, 0),
            expected: magic,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selftest::wire::{BRW_MAGIC, BRW_POISON};

    #[test]
    fn every_length_and_offset_round_trips_and_a_flipped_byte_is_caught() {
        for len in [1usize, 7, 8, 9, 4095, 4096, 4097, 8191, 12_345] {
            for off in [0usize, 8, 4088] {
                for ck in [BrwCheck::Simple, BrwCheck::Full] {
                    let mut b = vec![0u8; len];
                    fill(&mut b, off, 4096, ck, BRW_MAGIC, ByteOrder::Little).unwrap();
                    check(&b, off, 4096, ck, BRW_MAGIC, ByteOrder::Little).unwrap();
                    // The last byte is always checked (tail or last word of the last page).
                    let last = len - 1;
                    b[last] ^= 0x40;
                    assert!(
                        check(&b, off, 4096, ck, BRW_MAGIC, ByteOrder::Little).is_err(),
                        "len {len} off {off} {ck:?}"
                    );
                }
                // A poisoned buffer fails the full check.
                let mut p = vec![0u8; len];
                fill(
                    &mut p,
                    off,
                    4096,
                    BrwCheck::Full,
                    BRW_POISON,
                    ByteOrder::Little,
                )
                .unwrap();
                assert!(
                    check(&p, off, 4096, BrwCheck::Full, BRW_MAGIC, ByteOrder::Little).is_err()
                );
            }
        }
    }
}
