//! The boundary between the sans-IO engine and a network: reliable-connection queue-pair semantics.
//!
//! The engine never calls a fabric. It emits [`FabricAction`]s (drained with
//! `Endpoint::poll_action`) and a driver applies them to a real or simulated network, then feeds
//! what happened back as `Endpoint::handle_*` calls, shaped like the connection manager's and the
//! completion queue's events: those of rdma_cm + ibverbs, because that is the hardest fabric to
//! fit:
//!
//! | engine action / input            | rdma_cm + verbs                                   | tcp fabric                          |
//! |----------------------------------|---------------------------------------------------|-------------------------------------|
//! | `Connect { private }`            | resolve addr + route (5 s bounds), rdma_connect    | connect(), first frame = private    |
//! | `handle_connect_request`         | RDMA_CM_EVENT_CONNECT_REQUEST with private data   | first frame on an accepted socket   |
//! | `Accept` / `Reject { private }`  | rdma_accept / rdma_reject (consumer-defined data)  | reply frame, then close on reject   |
//! | `handle_established`             | RDMA_CM_EVENT_ESTABLISHED (+ CONNACK private data) | reply frame read                    |
//! | `handle_connect_failed`          | REJECTED / UNREACHABLE / CONNECT_ERROR / timeout   | refused, reset, or reject frame     |
//! | `PostRecv`                       | ibv_post_recv of one 4 KiB slot                    | slot made available to the reader   |
//! | `Send`                           | ibv_post_send IBV_WR_SEND, signaled                | frame written                       |
//! | `handle_send_complete`           | send/write completion: success, flush, retry-exc. | written / socket error              |
//! | `Disconnect`                     | rdma_disconnect (DREQ)                             | disconnect frame, shutdown(WR)      |
//! | `handle_disconnected`            | RDMA_CM_EVENT_DISCONNECTED                         | disconnect frame or EOF/RST         |
//! | `Destroy`                        | destroy QP, CQ, cm_id; deregister buffers          | close the socket, free slots        |
//! | [`RegionId`] (driver-side)       | ibv_reg_mr (lkey, rkey); ibv_dereg_mr on drop      | buffer in a table keyed by its key  |
//! | `RdmaWrite`                      | IBV_WR_RDMA_WRITE to (rkey, addr), desc chained    | frame: data for the peer's (key, addr) |
//!
//! Ordering contract (what RC guarantees and drivers must keep): messages on one connection arrive
//! in order and at most once; a send completes (success or error) exactly once unless the connection
//! is destroyed first; after `Destroy` nothing more is reported for that connection. An RDMA write
//! is a work request on the same send queue: it completes through `handle_send_complete` like a
//! send, completions come in posting order, and a send posted after a write on the same connection
//! reaches the peer only after the write's data is in place (o2iblnd posts PUT_DONE / GET_DONE
//! right behind its writes and relies on this).

pub mod driver;
pub mod sim;
#[cfg(feature = "tcp")]
pub mod tcp;
#[cfg(feature = "verbs")]
pub mod verbs;

use core::fmt;

use crate::wire::Nid;

/// The engine's name for one connection (a queue pair and its cm_id): a slab key with a generation,
/// so an event for a connection that was already destroyed is recognised and dropped.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl ConnId {
    /// A stable integer for tables and logs (index in the low half, generation in the high).
    pub const fn as_u64(self) -> u64 {
        (self.generation as u64) << 32 | self.index as u64
    }

    /// The inverse of [`ConnId::as_u64`], for drivers that carry ids through the kernel (wr_id,
    /// io_uring user_data).
    pub const fn from_u64(v: u64) -> ConnId {
        ConnId {
            index: v as u32,
            generation: (v >> 32) as u32,
        }
    }
}

impl fmt::Debug for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn#{}.{}", self.index, self.generation)
    }
}

/// The fabric's name for an incoming connect request that is not yet accepted or rejected.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// A work-request id for a posted send or RDMA write, unique per connection until it completes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WrId(pub u64);

impl WrId {
    /// Set in the ids of RDMA writes a test or bench posts directly through a fabric
    /// (`World::rdma_write`, `VerbsFabric::rdma_write`), not through the engine.
    const INJECTED: u64 = 1 << 63;

    /// The id of the `seq`th directly posted write. Its low 32 bits are all ones: the engine
    /// reads a WrId as (generation << 32 | tx slab index) and never has a tx at index
    /// `u32::MAX`, so it cannot mistake one of these for its own.
    pub const fn injected(seq: u64) -> WrId {
        WrId(Self::INJECTED | (seq & 0x7fff_ffff) << 32 | u32::MAX as u64)
    }

    /// True for an id made by [`WrId::injected`].
    pub const fn is_injected(self) -> bool {
        self.0 & Self::INJECTED != 0
    }
}

/// A local buffer registered with the fabric for RDMA (an LNet MD's pages, or a bounce buffer):
/// the source of an [`FabricAction::RdmaWrite`], or, advertised to the peer as a key and an
/// address ([`RemoteRegion`]), the sink of the peer's writes.
///
/// The driver owns the memory registration (ibv_reg_mr on the connection's protection domain; on
/// the tcp fabric, an entry in the table that incoming write frames are looked up in) and
/// deregisters it when the region is dropped or the driver shuts down; the engine only names
/// regions. A write whose remote side was deregistered fails with [`WcStatus::Error`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u64);

/// Where an RDMA write lands in the peer's memory: the remote key of a region the peer registered
/// and advertised (the `key` of an o2iblnd RdmaDesc in PUT_ACK / GET_REQ) and a virtual address
/// inside it (the `addr` of one RdmaFrag; the frag's `nob` is the write's length). A write of `len`
/// bytes is valid only if `[addr, addr + len)` lies inside the region registered under `key`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The rkey.
    pub key: u32,
    /// The target virtual address.
    pub addr: u64,
}

impl RemoteRegion {
    /// The same region `by` bytes further on (the next fragment of a descriptor).
    pub const fn at(self, by: u64) -> RemoteRegion {
        RemoteRegion {
            key: self.key,
            addr: self.addr.wrapping_add(by),
        }
    }
}

/// Connection-manager private data: at most 56 bytes are ours (CONNREQ/CONNACK), 24 for a reject.
/// Held inline so that connection setup never allocates.
#[derive(Copy, Clone, PartialEq, Eq)]
pub struct PrivateData {
    len: u8,
    bytes: [u8; PrivateData::MAX],
}

impl PrivateData {
    /// The most private data carried (InfiniBand CM allows 92 bytes in a REQ; we need 56).
    pub const MAX: usize = 64;

    /// Empty private data.
    pub const EMPTY: PrivateData = PrivateData {
        len: 0,
        bytes: [0; PrivateData::MAX],
    };

    /// Private data holding `b`, truncated to [`PrivateData::MAX`] bytes (a fabric delivering more
    /// than that delivers something we would refuse anyway).
    pub fn new(b: &[u8]) -> PrivateData {
        let mut p = PrivateData::EMPTY;
        let n = b.len().min(PrivateData::MAX);
        p.bytes[..n].copy_from_slice(&b[..n]);
        p.len = n as u8;
        p
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// A buffer to emit into; call [`PrivateData::set_len`] afterwards.
    pub(crate) fn buf_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    pub(crate) fn set_len(&mut self, n: usize) {
        self.len = n.min(PrivateData::MAX) as u8;
    }
}

impl fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateData({} bytes)", self.len)
    }
}

/// What the engine asks the fabric to do.
#[derive(Debug, PartialEq, Eq)]
pub enum FabricAction {
    /// Start an active connect to `peer` carrying a CONNREQ. The fabric answers with
    /// `handle_established` or `handle_connect_failed` for `conn`, or nothing at all (a connect that
    /// never gets an event is a real failure mode, LU-7646: the engine's connect deadline covers it).
    Connect {
        conn: ConnId,
        peer: Nid,
        private: PrivateData,
        /// Receive slots 0..recv_slots to post before connecting (2 x queue depth + 2).
        recv_slots: u16,
    },
    /// Accept request `req` as connection `conn`, replying with a CONNACK.
    Accept {
        req: RequestId,
        conn: ConnId,
        private: PrivateData,
        /// Receive slots 0..recv_slots to post before accepting.
        recv_slots: u16,
    },
    /// Refuse request `req` with a reject in the private data.
    Reject {
        req: RequestId,
        private: PrivateData,
    },
    /// Post receive slot `slot` (4 KiB) of `conn`. Posted slots are where the peer's sends land;
    /// a slot is reposted only when the engine is done with what it held (back-pressure).
    PostRecv { conn: ConnId, slot: u16 },
    /// Send one message (already encoded) on `conn`; completes with `handle_send_complete(wr)`.
    Send {
        conn: ConnId,
        wr: WrId,
        bytes: Vec<u8>,
    },
    /// RDMA-write `len` bytes from `local` (starting `local_offset` bytes into it) into the peer's
    /// registered memory at (`remote_key`, `remote_addr`) over `conn`, which must be established.
    /// The bulk-data move of o2iblnd: the data source writes into the buffer the sink advertised,
    /// one write per RdmaFrag (up to 257 per descriptor, chained, one rkey).
    ///
    /// It is a work request on `conn`'s send queue: it completes with
    /// `handle_send_complete(conn, wr, status)` exactly like a [`FabricAction::Send`], in posting
    /// order with the sends, and a send posted after it is delivered only after its data is in
    /// place. Nothing is reported at the peer (no receive slot is consumed). A write that falls
    /// outside the region registered under `remote_key` (unknown or deregistered key, out of
    /// bounds), or outside `local`, completes with [`WcStatus::Error`] (IBV_WC_REM_ACCESS_ERR /
    /// IBV_WC_LOC_PROT_ERR), nothing is written, and the queue pair goes to error (what is queued
    /// behind it flushes). An unreachable peer gives [`WcStatus::RetryExceeded`] and a closing
    /// connection [`WcStatus::Flushed`], as for sends. `local` must not change until completion.
    RdmaWrite {
        conn: ConnId,
        wr: WrId,
        local: RegionId,
        local_offset: u64,
        remote_key: u32,
        remote_addr: u64,
        len: u32,
    },
    /// Tell the peer this connection is closing (rdma_disconnect). Both sides then see
    /// `handle_disconnected`; posted work flushes.
    Disconnect { conn: ConnId },
    /// Free everything the fabric holds for `conn`. Always preceded by `Disconnect`, except for a
    /// connection that never reached the peer (a failed or abandoned connect).
    Destroy { conn: ConnId },
}

/// Why an active connect failed, as the connection manager reports it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The peer's LND refused, with a reject in the private data (IB_CM_REJ_CONSUMER_DEFINED).
    Rejected(PrivateData),
    /// Nothing listens at the peer's service (IB_CM_REJ_INVALID_SERVICE_ID): do not retry at the
    /// LND level (LU-14536).
    NoListener,
    /// The peer's CM still holds an old connection (IB_CM_REJ_STALE_CONN): retry like CONN_STALE.
    StaleConn,
    /// Address or route resolution failed, or the peer is unreachable.
    Unreachable,
    /// The connect reported a transport error.
    Error,
}

/// How a posted send completed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// Delivered to the peer's receive queue (a send), or placed in the peer's memory (an RDMA
    /// write).
    Success,
    /// Flushed because the queue pair went to error (our close or a peer failure).
    Flushed,
    /// The transport retried up to its limit without an answer: the peer is gone
    /// (IBV_WC_RETRY_EXC_ERR, or TCP_USER_TIMEOUT on the tcp fabric).
    RetryExceeded,
    /// Any other error completion, among them an RDMA write outside the peer's registered region
    /// (IBV_WC_REM_ACCESS_ERR) or outside the local one (IBV_WC_LOC_PROT_ERR), and a receiver with
    /// no posted slot (RNR).
    Error,
}

#[cfg(test)]
mod tests {
    use super::WrId;

    /// Directly posted writes can never be taken for one of the engine's messages (its ids are
    /// generation << 32 | tx index, and no tx has index u32::MAX), and stay distinct.
    #[test]
    fn injected_write_ids_are_not_engine_ids() {
        let (a, b) = (WrId::injected(5), WrId::injected(6));
        assert_eq!(a.0 as u32, u32::MAX);
        assert!(a.is_injected() && b.is_injected());
        assert_ne!(a, b);
        let engine = WrId(7 << 32 | 12);
        assert!(!engine.is_injected());
    }
}
