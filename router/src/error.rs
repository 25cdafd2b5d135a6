//! Why an LNet operation failed.

use core::fmt;

use lnd::iface::{SendError, TxError};
use lnd::wire::{Nid, WireError};

/// Why a send or a ping failed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LnetError {
    /// The destination is not ours and not on the net of any of our NIs (no routes in this
    /// slice): Lustre's -EHOSTUNREACH from lnet_select_pathway.
    NoRoute(Nid),
    /// The payload is larger than this path can carry: the LND's 3976-byte inline limit (the RDMA
    /// rendezvous is not driven yet), or LNET_MTU for local delivery.
    PayloadTooLarge { len: usize, max: usize },
    /// The ping got no reply within its timeout.
    Timeout,
    /// The LND could not deliver the message (connect failed, timed out, aborted ...).
    Lnd(TxError),
    /// The LND refused the message on the spot.
    Refused(SendError),
    /// The ping reply could not be parsed.
    BadReply(WireError),
    /// The node is shutting down.
    Shutdown,
    /// A message for another node would go back to the peer it came from (a routing loop).
    Loop(Nid),
    /// A message for this destination has already crossed a router, and no route leads from
    /// here to a gateway on its net (the hop rule: a routing loop, or a path of more than
    /// three routers).
    HopLimit(Nid),
    /// A message forwarded for another node would go to a peer NI the LND reported down
    /// (lnet_check_message_drop: -EHOSTUNREACH rather than waiting on a dead peer).
    PeerDown(Nid),
    /// A bulk operation this node cannot do (the text says which).
    BulkUnsupported(&'static str),
    /// It waited for a peer credit past its deadline (`transaction_timeout` after it was
    /// sent): dropped when its turn came, as lnet_post_send_locked does ("exceeded message
    /// deadline"). Forwarded messages never expire (a router cannot know its senders' timeouts).
    Expired,
    /// A REPLY or ACK not queued because this many messages already wait for credits to the
    /// peer (see `RESPONSE_BACKLOG`): a peer that keeps asking while not taking what it asked
    /// for (not returning credits) is not answered without bound; its requests time out.
    Backlog(Nid),
}

impl fmt::Display for LnetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LnetError::NoRoute(nid) => write!(f, "no route to {nid}"),
            LnetError::PayloadTooLarge { len, max } => {
                write!(f, "{len}-byte payload exceeds the {max}-byte limit")
            }
            LnetError::Timeout => f.write_str("timed out"),
            LnetError::Lnd(e) => write!(f, "send failed: {e}"),
            LnetError::Refused(e) => write!(f, "send refused: {e}"),
            LnetError::BadReply(e) => write!(f, "bad ping reply: {e}"),
            LnetError::Shutdown => f.write_str("shutting down"),
            LnetError::Loop(nid) => {
                write!(f, "would go back to {nid}, which sent it (a routing loop)")
            }
            LnetError::HopLimit(nid) => write!(
                f,
                "no gateway on the net of {nid} for a message that has crossed a router already \
                 (a routing loop, or more than three routers)"
            ),
            LnetError::PeerDown(nid) => write!(f, "next hop {nid} is down"),
            LnetError::BulkUnsupported(what) => write!(f, "not supported: {what}"),
            LnetError::Expired => {
                f.write_str("dropped: waited for a peer credit past its transaction deadline")
            }
            LnetError::Backlog(nid) => {
                write!(
                    f,
                    "dropped: too many messages already wait for credits to {nid}"
                )
            }
        }
    }
}

impl std::error::Error for LnetError {}
