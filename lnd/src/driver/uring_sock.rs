//! What the two drivers on plain sockets over io_uring (`tcp` and `socket`) share.
//!
//! The io_uring user_data: which operation completed, for which socket, packed in the 64 bits
//! the kernel hands back with the completion. The op kind takes the top 4 bits and the socket's
//! handle the rest (its generation, cut to [`GEN_BITS`], above its slab index), so a late
//! completion for a socket already freed never reaches the next socket in its slot.
//!
//! What a failed accept means for the listener ([`accept_failed`]).

use tracing::debug;

use super::Coded;
use crate::handle::Handle;

/// Bits of a socket generation: the op kind takes the top 4 bits of user_data, the slab index
/// the low 32.
pub(crate) const GEN_BITS: u32 = 28;

/// The bits of user_data below the op kind: the handle's `as_u64` (generation above the index).
const HANDLE_MASK: u64 = (1 << (32 + GEN_BITS)) - 1;

/// The user_data of operation `op` on the socket (or listener, or watched descriptor) `h`.
pub(crate) fn tag<K: Coded, T>(op: K, h: Handle<T>) -> u64 {
    u64::from(op.code()) << 60 | (h.as_u64() & HANDLE_MASK)
}

/// The inverse of [`tag`]: the op kind (`None` for a code no op has) and the handle.
pub(crate) fn untag<K: Coded, T>(t: u64) -> (Option<K>, Handle<T>) {
    (
        K::from_code((t >> 60) as u8),
        Handle::from_u64(t & HANDLE_MASK),
    )
}

/// Counts a failed accept completion (`result`, a negative errno; our own cancel is not a
/// failure) in `errors`, and returns the errno to pause accepting for when the process is out of
/// descriptors or memory: re-arming at once would fail again at once, and spin the loop. Another
/// error is logged under `what` (the driver's name) and accepting goes on.
pub(crate) fn accept_failed(result: i32, errors: &mut u64, what: &'static str) -> Option<i32> {
    if result == -libc::ECANCELED {
        return None;
    }
    *errors += 1;
    let errno = -result;
    if matches!(
        errno,
        libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM
    ) {
        Some(errno)
    } else {
        debug!(errno, "{what}: accept failed");
        None
    }
}
