//! The LND interface: what LNet sees of a network driver, as kernel LNet sees its LNDs through
//! `struct lnet_lnd` (lnd_send, lnd_recv and lnd_eager_recv, lnd_notify_peer_down, lnd_query,
//! lnd_shutdown). LNet (the `router` crate's node) is written against [`Lnd`] alone, as one
//! trait object per NI, and never names an LND's own types; the o2ib engine
//! (`crate::engine::Endpoint`) is one implementation, a socklnd-compatible engine the next.
//!
//! The contract, one call at a time (`now` passed in, nothing read from a clock):
//! - **Send**: [`Lnd::send`] takes a header and an inline payload; [`Lnd::send_bulk`] a header and
//!   LNet's memory by reference ([`BulkMem`]): a PUT's source, or a GET's sink for its REPLY.
//!   Each accepted send ends in exactly one [`LndEvent::SendDone`] (a GET's data in
//!   [`LndEvent::BulkDone`]) with its cookie; a refused one returns [`SendError`] and no event.
//! - **Receive**: a message comes up as [`LndEvent::Received`] (payload inline) or, when its
//!   payload is bulk, as [`LndEvent::BulkRequest`]: LNet chooses where it lands
//!   ([`Lnd::accept_bulk`]: a posted MD, a router's large buffer; the eager receive of a router),
//!   serves a GET from its memory ([`Lnd::reply_bulk`]), or refuses. Every received message is
//!   answered exactly once ([`Lnd::recv_done`], [`Lnd::recv_failed`] or a bulk answer); until
//!   then the LND holds back the peer's credit, which is how a router without a buffer pushes
//!   back on its sender.
//! - **News**: [`LndEvent::PeerUp`] / [`LndEvent::PeerDown`] (lnet_notify), and the LND's own
//!   timers ([`Lnd::poll_timeout`], [`Lnd::handle_timeout`]).
//! - **What LNet shows**: the peer's liveness as the LND sees it, the LND timeout LNet's health
//!   works with, and the tunables and counters `net show -v` prints ([`Lnd::info`]).
//!
//! How a bulk payload moves is the LND's affair: o2ib by RDMA rendezvous (PUT_REQ / PUT_ACK /
//! PUT_DONE), a streaming LND inline behind the header. Either reads or writes the same
//! [`BulkMem`]: a registered region for a fabric that writes by RDMA, and the memory itself
//! ([`SharedMem`]) for an LND that copies from the socket, so a router's large buffers serve both.
//!
//! Below this module: `wire`, `time`, `mem`, `trim` only (checked by `tests/module_graph.rs`).

pub mod o2ib;
pub mod sock;

use core::any::Any;
use core::fmt;

use crate::mem::{RegionId, SharedMem};
use crate::time::{Duration, Instant};
use crate::trim::Capacity;
use crate::wire::{LnetHdr, Nid};

/// The most payload an LND hands LNet inline ([`LndEvent::Received`]); larger ones come up as
/// [`LndEvent::BulkRequest`]. It is o2iblnd's IMMEDIATE limit, the smallest `max_inline` of our
/// LNDs, so whatever one LND hands up inline a router can send on inline by any other (a 4 KiB
/// REPLY from a tcp net to o2ib was dropped when socklnd handed 4 KiB up inline).
pub const INLINE_LIMIT: usize = crate::wire::kib::MAX_INLINE;

/// A received message held by LNet: hand it back with [`Lnd::recv_done`] (or another answer) exactly once. Until
/// then its receive slot stays unposted and its credit unreturned: that is the back-pressure a
/// router applies upstream when it has no buffer (o2iblnd's IBLND_POSTRX_DONT_POST).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RxToken {
    /// The LND's name for the connection or stream it came on.
    pub(crate) conn: u64,
    /// Its place there (o2ib: the receive slot).
    pub(crate) slot: u32,
}

impl RxToken {
    /// Made by an LND from its own names; LNet only hands it back. Public so that an LND outside
    /// this crate (a test's) can implement [`Lnd`].
    pub const fn new(conn: u64, slot: u32) -> RxToken {
        RxToken { conn, slot }
    }

    /// The LND's names, as given to [`RxToken::new`].
    pub const fn parts(self) -> (u64, u32) {
        (self.conn, self.slot)
    }
}

/// Why a message failed. Each maps to an LNet health status.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TxError {
    /// It waited longer than the LND timeout, queued or in flight (o2iblnd -ETIMEDOUT).
    Timeout,
    /// The connection it was on closed before it was posted, or while it waited for the
    /// peer's side of a rendezvous (-ECONNABORTED; o2iblnd's kiblnd_abort_txs: LOCAL_ERROR).
    ConnAborted,
    /// It was still queued on a connection closed because something on it timed out
    /// (kiblnd_abort_txs with ibc_comms_error -ETIMEDOUT: LOCAL_TIMEOUT); nothing of it was
    /// sent, so LNet may send it again.
    ConnTimedOut,
    /// It was posted and its send failed, or never completed before its connection went
    /// (kiblnd_tx_complete: REMOTE_DROPPED); the peer may or may not have it.
    SendFailed,
    /// The peer could not be connected: unreachable, or the connect deadline passed with no
    /// connection (-EHOSTUNREACH / -ETIMEDOUT / -ENETDOWN).
    ConnectFailed,
    /// The peer refused the connection: nothing listens, or it rejected the request for good
    /// (-ECONNREFUSED).
    ConnectRefused,
    /// The transport gave up on the peer (retry exceeded).
    PeerUnreachable,
    /// The endpoint is shutting down.
    Shutdown,
    /// The bulk transfer failed with this Linux errno, negated: the peer's completion said so
    /// (PUT_NAK, PUT_DONE or GET_DONE with a status below 0; -ENODATA when a GET matched
    /// nothing), or we did (-EPROTO when the sink advertised more than the source holds,
    /// -EMSGSIZE when the write needs more fragments than the connection allows).
    Rdma(i32),
    /// Memory we granted the peer (our PUT_ACK or GET_REQ) was not filled and completed within
    /// `Tunables::grant_timeout`: the grant was reclaimed.
    GrantExpired,
}

impl fmt::Display for TxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TxError::Timeout => "timed out",
            TxError::ConnAborted => "connection aborted",
            TxError::ConnTimedOut => "connection timed out before it was sent",
            TxError::SendFailed => "send failed",
            TxError::ConnectFailed => "could not connect",
            TxError::ConnectRefused => "connection refused",
            TxError::PeerUnreachable => "peer unreachable",
            TxError::Shutdown => "shutting down",
            TxError::GrantExpired => "the peer did not fill its grant in time",
            TxError::Rdma(status) => return write!(f, "bulk transfer failed (errno {status})"),
        })
    }
}

/// Why a send was refused on the spot.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum SendError {
    /// More than 3976 bytes inline: send it by rendezvous (`Endpoint::send_put_rdma`).
    PayloadTooLarge(usize),
    /// A bulk source or sink with no fragment, more than 257, an empty one, or a source whose
    /// length is not the header's payload length.
    BadBulk,
    /// The endpoint is shutting down.
    Shutdown,
    /// LNET_NID_ANY or another network's NID.
    BadPeer(Nid),
    /// The peer is new and the LND's peer table is at its limit.
    PeerTableFull(Nid),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::PayloadTooLarge(n) => {
                write!(f, "{n}-byte payload exceeds the 3976-byte inline limit")
            }
            SendError::BadBulk => f.write_str("malformed bulk source or sink"),
            SendError::Shutdown => f.write_str("endpoint is shutting down"),
            SendError::BadPeer(n) => write!(f, "cannot send to {n}"),
            SendError::PeerTableFull(n) => {
                write!(f, "cannot send to {n}: the LND's peer table is full")
            }
        }
    }
}

impl std::error::Error for SendError {}

/// Why the LND reports a peer down.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DownReason {
    /// The peer closed its connections (a graceful stop).
    Closed,
    /// Messages or a keepalive timed out.
    Timeout,
    /// The transport gave up (retry exceeded) or a completion failed.
    Unreachable,
    /// The peer restarted: a new incarnation replaced the one we knew.
    Rebooted,
    /// Connecting failed and nothing else is pending.
    ConnectFailed,
    /// The peer broke the protocol (bad credits, stale stamps, garbage), the LND's or the
    /// fabric's (a bad frame, an RDMA write outside the memory granted to it).
    ProtocolError,
    /// The connection failed under us without a close: a reset, an EOF without a disconnect (the
    /// peer process died), a queue pair in error. Never a graceful stop (3FS #426).
    ConnectionLost,
}

/// Which bulk rendezvous a peer asks for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BulkOp {
    /// PUT_REQ: the peer has a PUT (or REPLY) for us too large to go inline. Answer with
    /// `Endpoint::accept_put_rdma` (a sink it writes into), or `recv_done` (nothing matched).
    Put,
    /// GET_REQ: the peer wants data written into its sink, `sink_len` bytes advertised. Answer
    /// with `Endpoint::reply_get_rdma` (the source to write from), or `recv_done` (nothing
    /// matched: it gets -ENODATA).
    Get { sink_len: u64 },
}

/// What the engine reports to LNet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LndEvent {
    /// A message for LNet; call `recv_done(rx)` when finished with it.
    Received {
        from: Nid,
        hdr: LnetHdr,
        payload: Vec<u8>,
        rx: RxToken,
    },
    /// A peer's bulk rendezvous request (o2iblnd PUT_REQ / GET_REQ): LNet matches `hdr` and
    /// answers it exactly once through `rx` (see [`BulkOp`]); until then the request's slot
    /// stays unposted, as for [`LndEvent::Received`].
    BulkRequest {
        from: Nid,
        hdr: LnetHdr,
        op: BulkOp,
        rx: RxToken,
    },
    /// A bulk transfer into our memory is finished: the sink of `accept_put_rdma` got its
    /// PUT_DONE, or the sink of `send_get_rdma` its GET_DONE. `Ok` carries the bytes the peer
    /// says it wrote. Exactly once per cookie.
    BulkDone {
        cookie: u64,
        peer: Nid,
        result: Result<u32, TxError>,
    },
    /// A message handed to `send` (or `send_put_rdma`, `reply_get_rdma`) is finished: delivered
    /// to the peer's LND (for a rendezvous, its data written and the completion sent), or failed.
    SendDone {
        cookie: u64,
        peer: Nid,
        result: Result<(), TxError>,
        /// The payload of an immediate message that failed, given back so that LNet can send
        /// it again (a resend, lib-msg.c lnet_attempt_msg_resend) without having kept a copy;
        /// empty otherwise (a success recycles it into the LND's buffers).
        returned: Vec<u8>,
    },
    /// We have a working connection to the peer (lnet_notify alive).
    PeerUp { nid: Nid },
    /// We lost the peer and have nothing pending for it (lnet_notify dead).
    PeerDown { nid: Nid, reason: DownReason },
}

/// Memory LNet lends an LND for one bulk payload: `len` bytes at `offset` of a region registered
/// with the NI's fabric (its local name, and the key and address a peer writes it under), and,
/// where LNet shares the memory itself (a router's large buffers, selftest's buffers), that
/// memory, for an LND that streams payloads instead of writing them by RDMA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BulkMem {
    pub region: RegionId,
    pub key: u32,
    /// The registration's first byte's address.
    pub addr: u64,
    pub offset: u64,
    pub len: u32,
    pub mem: Option<SharedMem>,
}

/// What a bulk send moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BulkSend {
    /// A PUT (or REPLY) whose payload is read from here.
    Put(BulkMem),
    /// A GET whose REPLY's payload is written here ([`LndEvent::BulkDone`] says how much).
    Get(BulkMem),
}

/// What `net show -v` prints of an NI's LND: its tunables and counters, one variant per LND (as
/// kernel LNet's `lnet_lnd_tunables` is a union of each LND's).
#[derive(Clone, Debug, PartialEq)]
pub enum LndInfo {
    /// Boxed: the o2ib counters are most of a kilobyte, the other variants a pointer.
    O2ib {
        config: Box<o2ib::EndpointConfig>,
        stats: Box<o2ib::LndStats>,
    },
    /// socklnd (the `sock` module's `SockEngine`).
    Sock {
        config: Box<sock::SockConfig>,
        stats: Box<sock::SockStats>,
    },
    /// An LND with nothing of its own to show (a test's).
    Plain { name: &'static str },
}

/// The life-cycle methods an LND ([`Lnd`]), a simulated node (`lnd::sim::SimNode`) and LNet's
/// node share under the same names (`poll_event`, `poll_timeout`, `handle_timeout`, `shutdown`,
/// `is_shut_down`), written in a trait impl as calls of `$to`'s methods of those names (`$to`:
/// the implementing type, for its inherent methods, or a trait it implements): every adapter
/// from one of these interfaces to another forwards them, and one list keeps the adapters alike.
/// `$event` is what `poll_event` yields.
#[macro_export]
macro_rules! forward_lifecycle {
    ($to:ident, $event:ty) => {
        fn poll_event(&mut self) -> Option<$event> {
            $to::poll_event(self)
        }
        fn poll_timeout(&self) -> Option<$crate::time::Instant> {
            $to::poll_timeout(self)
        }
        fn handle_timeout(&mut self, now: $crate::time::Instant) {
            $to::handle_timeout(self, now);
        }
        fn shutdown(&mut self, now: $crate::time::Instant) {
            $to::shutdown(self, now);
        }
        fn is_shut_down(&self) -> bool {
            $to::is_shut_down(self)
        }
    };
}

/// A network driver as LNet drives it: one per NI. Object-safe: LNet holds a `Box<dyn Lnd>` per
/// NI and calls through it, as kernel LNet calls `ni->ni_net->net_lnd->lnd_send`. The layer that
/// built the LND (and knows its fabric) reaches its own type again with [`Lnd::as_any_mut`].
pub trait Lnd: Any + Send {
    /// The LND's name as `net show` prints it (`o2ib`, `tcp`).
    fn name(&self) -> &'static str;

    /// The NI's NID.
    fn nid(&self) -> Nid;

    /// The most payload [`Lnd::send`] takes inline; larger ones go by [`Lnd::send_bulk`].
    fn max_inline(&self) -> usize;

    /// Queues a message with its payload inline. Ends in [`LndEvent::SendDone`] with `cookie`,
    /// exactly once, unless this returns an error.
    fn send(
        &mut self,
        now: Instant,
        peer: Nid,
        hdr: LnetHdr,
        payload: Vec<u8>,
        cookie: u64,
    ) -> Result<(), SendError>;

    /// Queues a message whose payload is LNet's memory: a PUT from it, or a GET into it.
    fn send_bulk(
        &mut self,
        now: Instant,
        peer: Nid,
        hdr: LnetHdr,
        bulk: BulkSend,
        cookie: u64,
    ) -> Result<(), SendError>;

    /// LNet is done with a received message (for a [`LndEvent::BulkRequest`]: nothing matched).
    fn recv_done(&mut self, now: Instant, rx: RxToken);

    /// LNet refused a received message as a protocol violation: the LND drops the connection
    /// it came on (lnet_parse's -EPROTO).
    fn recv_failed(&mut self, now: Instant, rx: RxToken);

    /// The payload of a [`BulkOp::Put`] request lands in `sink`; [`LndEvent::BulkDone`] with
    /// `cookie` says when (and how much).
    fn accept_bulk(&mut self, now: Instant, rx: RxToken, sink: BulkMem, cookie: u64);

    /// A [`BulkOp::Get`] request is served from `src`; [`LndEvent::SendDone`] with `cookie`
    /// says when.
    fn reply_bulk(&mut self, now: Instant, rx: RxToken, src: BulkMem, cookie: u64);

    /// A bulk request is refused with a Linux errno (positive); the peer's transfer fails
    /// with it.
    fn refuse_bulk(&mut self, now: Instant, rx: RxToken, errno: i32);

    /// The next piece of news for LNet.
    fn poll_event(&mut self) -> Option<LndEvent>;

    /// When [`Lnd::handle_timeout`] is next due.
    fn poll_timeout(&self) -> Option<Instant>;

    /// Runs the LND's timers due at `now`.
    fn handle_timeout(&mut self, now: Instant);

    /// Stops the LND: new sends refused, what is queued fails, every connection closed
    /// gracefully, bounded.
    fn shutdown(&mut self, now: Instant);

    /// True once shut down with nothing left.
    fn is_shut_down(&self) -> bool;

    /// The fabric under the LND failed for good: every connection is lost at once (what it held
    /// fails as on a transport error) and the LND shuts down.
    fn fabric_lost(&mut self, now: Instant);

    /// Whether the LND has a working connection to `peer` now.
    fn peer_up(&self, peer: Nid) -> bool;

    /// Peers the LND keeps now.
    fn peer_count(&self) -> usize;

    /// The LND timeout (`timeout`): how long a message may wait in the LND.
    fn timeout(&self) -> Duration;

    /// How long a grant of our memory to a peer may stay unfilled before the LND reclaims it
    /// (zero: only the LND timeout).
    fn grant_timeout(&self) -> Duration;

    /// Whether the LND sees every byte a peer puts into our memory land (so a transfer that
    /// came in short fails) rather than only the peer's word for it (RDMA writes).
    fn sees_writes(&self) -> bool;

    /// Tells the LND whether the fabric below it reports the writes it sees land.
    fn set_fabric_sees_writes(&mut self, on: bool);

    /// Tunables and counters for `net show -v`.
    fn info(&self) -> LndInfo;

    /// What the LND's tables hold and the room they keep.
    fn capacities(&self) -> Vec<Capacity>;

    /// Gives a message buffer back for reuse.
    fn recycle(&mut self, buf: Vec<u8>);

    /// An empty buffer for a payload, from the LND's pool when it has one.
    fn take_buffer(&mut self) -> Vec<u8>;

    /// The LND as its own type, for the layer that built it (its driver's events and actions).
    fn as_any(&self) -> &dyn Any;

    /// See [`Lnd::as_any`].
    fn as_any_mut(&mut self) -> &mut dyn Any;
}
