//! What the engine tells LNet: the LND interface's types (`crate::iface`), re-exported here
//! for the engine's own code, and its counters (`crate::iface::o2ib::LndStats`).

pub use crate::iface::o2ib::LndStats;
pub use crate::iface::{BulkOp, DownReason, LndEvent, RxToken, SendError, TxError};

use crate::fabric::ConnId;

/// The engine's names in a token: a connection's handle and a receive slot.
impl RxToken {
    pub(crate) fn of(conn: ConnId, slot: u16) -> RxToken {
        RxToken::new(conn.as_u64(), u32::from(slot))
    }

    /// The connection; a token not made by [`RxToken::of`] names none that exists (the
    /// handle's generation does not match), so it finds nothing.
    pub(crate) fn conn_id(self) -> ConnId {
        ConnId::from_u64(self.parts().0)
    }

    /// The slot (a slot past the largest queue finds nothing either).
    pub(crate) fn slot16(self) -> u16 {
        u16::try_from(self.parts().1).unwrap_or(u16::MAX)
    }
}
