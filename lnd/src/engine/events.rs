//! What the engine tells LNet, the errors it returns, and the counters an operator reads.

use core::fmt;

use crate::fabric::ConnId;
use crate::wire::{LnetHdr, Nid, RejectReason};

/// A received message held by LNet: hand it back with `Endpoint::recv_done` exactly once. Until
/// then its receive slot stays unposted and its credit unreturned: that is the back-pressure a
/// router applies upstream when it has no buffer (o2iblnd's IBLND_POSTRX_DONT_POST).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RxToken {
    pub(crate) conn: ConnId,
    pub(crate) slot: u16,
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
pub enum RdmaOp {
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
    /// answers it exactly once through `rx` (see [`RdmaOp`]); until then the request's slot
    /// stays unposted, as for [`LndEvent::Received`].
    RdmaRequest {
        from: Nid,
        hdr: LnetHdr,
        op: RdmaOp,
        rx: RxToken,
    },
    /// A bulk transfer into our memory is finished: the sink of `accept_put_rdma` got its
    /// PUT_DONE, or the sink of `send_get_rdma` its GET_DONE. `Ok` carries the bytes the peer
    /// says it wrote. Exactly once per cookie.
    RdmaDone {
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

/// Counters for `lnetctl`. All only grow, except the gauges marked so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LndStats {
    /// Active connects started (first attempts and reconnects).
    pub connects: u64,
    /// Of those, reconnects after a failed or rejected attempt.
    pub reconnects: u64,
    /// Connect requests accepted.
    pub accepts: u64,
    /// Connections that reached ESTABLISHED.
    pub established: u64,
    /// Rejects we sent, by reason code (index = IBLND_REJECT_* value, 0 = other).
    pub rejects_sent: [u64; 10],
    /// Rejects we received, by reason code.
    pub rejects_received: [u64; 10],
    /// CONN_RACE rejects we sent (the higher NID keeping its own attempt).
    pub races: u64,
    /// Times we let a lower NID win after `race_limit` races (LU-7646).
    pub race_yields: u64,
    /// Active connects abandoned because a request proved them stale (ours).
    pub stale_abandons: u64,
    /// Second active connects started beside one that went unanswered (ours, `connect_hedge`).
    pub connect_hedges: u64,
    /// The earlier of two attempts given up when the second went unanswered as long (ours,
    /// `connect_hedge`): a third starts beside the second instead of waiting out a deadline.
    pub hedge_abandons: u64,
    /// Active or passive handshakes that passed their deadline (LU-17480).
    pub connect_timeouts: u64,
    /// Connect attempts that failed at the fabric (unreachable, no listener, errors).
    pub connect_failures: u64,
    /// Zombie connections right now (gauge).
    pub zombies: u64,
    /// Connections reaped (destroyed).
    pub reaped: u64,
    /// Messages that passed the LND timeout.
    pub tx_timeouts: u64,
    /// Keepalive NOOPs sent.
    pub keepalives: u64,
    /// NOOPs sent to return credits.
    pub credit_noops: u64,
    /// Messages sent and received (all kib types, NOOPs included).
    pub msgs_sent: u64,
    pub msgs_received: u64,
    /// Payload bytes handed to and from LNet.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Connections closed gracefully: by us without an error, or by the peer's close handshake
    /// (the fabric reported `DisconnectReason::Closed`).
    pub graceful_closes: u64,
    /// Connections we lost to an error (timeout, retry exceeded, protocol error, a connection
    /// the fabric found broken).
    pub conns_lost: u64,
    /// Established connections the fabric ended for a protocol error it found (a bad frame, an
    /// RDMA write outside a granted region, garbage): each is in `conns_lost` too.
    pub fabric_protocol_errors: u64,
    /// Established connections the fabric ended because the transport failed (a reset, an EOF
    /// without a disconnect, a timeout, a queue pair in error): each is in `conns_lost` too.
    pub fabric_transport_errors: u64,
    /// Closes that waited the full close timeout for the peer.
    pub close_timeouts: u64,
    /// Connections torn down without a close: only possible if the endpoint is dropped while it
    /// owns connections (the 3FS #426 failure). Counted through `Endpoint::leak_counter` too.
    pub ungraceful_drops: u64,
    /// Messages refused by the parser, with the connection closed.
    pub bad_msgs: u64,
    /// Messages LNet refused as a protocol violation (`Endpoint::recv_failed`), with the
    /// connection closed.
    pub rx_refused: u64,
    /// Messages whose stamps named another instance (kiblnd "Stale rx").
    pub stale_rx: u64,
    /// Peers that returned more credits than the queue depth.
    pub credit_overflows: u64,
    /// Connect requests refused because they could not be parsed or were not for us.
    pub bad_connreqs: u64,
    /// RDMA completions (PUT_ACK, PUT_NAK, PUT_DONE, GET_DONE) matching no message of ours
    /// waiting for one on that connection, by (cookie, type): each closes its connection
    /// (EPROTO), as an unmatched completion does in o2iblnd (kiblnd_handle_completion).
    pub unmatched_completions: u64,
    /// Rendezvous requests (PUT_REQ, GET_REQ) answered without a transfer: nothing matched
    /// (PUT_NAK 0, GET_DONE -ENODATA) or LNet refused it (its errno).
    pub rdma_refused: u64,
    /// Rendezvous finished, by role: PUTs whose data we wrote (source), PUTs written into us
    /// (sink), GETs answered by our write, GETs written into us; and the bytes moved each way.
    pub rdma_puts_sent: u64,
    pub rdma_puts_received: u64,
    pub rdma_gets_served: u64,
    pub rdma_gets_received: u64,
    pub rdma_bytes_sent: u64,
    pub rdma_bytes_received: u64,
    /// Rendezvous whose peer advertised a sink larger than our source (PUT_DONE / GET_DONE
    /// -EPROTO, nothing written), or needing more fragments than the connection allows
    /// (-EMSGSIZE): that message fails, the connection stays.
    pub rdma_bad_sinks: u64,
    /// Malformed rendezvous descriptors or completions: a PUT_ACK's descriptor with an empty or
    /// wrapping fragment (the connection is closed), a GET_REQ's (answered GET_DONE -EPROTO),
    /// a PUT_DONE or GET_DONE claiming more bytes than our sink holds (the connection is closed).
    pub rdma_bad_descs: u64,
    /// PUT_DONEs and GET_DONEs with a success status whose data did not all arrive (a fabric
    /// that sees writes reported fewer bytes of the sink written, from its start, than the
    /// completion accounts for): the transfer fails with -EPROTO and the connection is closed,
    /// so a buffer lent before is never passed on with its previous user's bytes.
    pub rdma_short_writes: u64,
    /// Grants of our memory (PUT_ACK, GET_REQ sinks) reclaimed after `grant_timeout` without
    /// their completion; on a fabric that cannot see writes, each closed its connection.
    pub grants_reclaimed: u64,
    /// Connections closed because a message to the peer missed its LND deadline while the peer
    /// had said nothing since it was queued: a peer that owed us credits or a completion and
    /// went silent. (A peer that owes us nothing may stay silent forever, as in o2iblnd.)
    pub silent_peers: u64,
    /// Peers reported down.
    pub peers_down: u64,
    /// Peers whose incarnation changed (a reboot seen).
    pub peer_reboots: u64,
    /// Connect requests (or their answers) from an instance of the peer that a newer one had
    /// already replaced, refused as stale instead of taken for a restart back to it.
    pub superseded_connreqs: u64,
    /// Captured messages dropped because the driver did not drain the capture fast enough.
    pub capture_drops: u64,
    /// Races in which we refused the peer with CONN_RACE and it refused us too: it orders NIDs
    /// the other way (a Lustre 2.15 peer among 2.16 ones, or the reverse).
    pub race_order_disagreements: u64,
    /// Peers for which we switched to the other race order after such races.
    pub race_order_adoptions: u64,
    /// Peers whose checksum flavour we learned from their checksummed messages, by flavour.
    pub cksum_signed_peers: u64,
    pub cksum_unsigned_peers: u64,
    /// Peers forgotten once they had no connection and nothing queued (as o2iblnd frees its
    /// peer), and connect requests or sends refused because the peer table was full.
    pub peers_forgotten: u64,
    pub peer_table_full: u64,
    /// Connection state changes the transition table refused (a bug if ever non-zero: chaos
    /// tests assert 0).
    pub invalid_transitions: u64,
}

impl LndStats {
    pub(crate) fn count_reject(table: &mut [u64; 10], why: RejectReason) {
        let i = usize::from(why.code());
        if let Some(c) = table.get_mut(i) {
            *c += 1;
        } else {
            table[0] += 1;
        }
    }
}
