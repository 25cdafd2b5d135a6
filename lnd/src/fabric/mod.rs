//! The boundary between the sans-IO engine and a network: reliable-connection queue-pair semantics.
//!
//! This module is the boundary only: the values that cross it. It depends on nothing above it
//! (the engine depends on it; the drivers in `crate::driver` and the simulator sit above the
//! engine). The engine never calls a fabric: it emits [`FabricAction`]s (drained with
//! `Endpoint::poll_action`), a driver applies them to a real or simulated network and pushes what
//! happened as [`FabricEvent`]s into a [`FabricSink`] (the engine's endpoint, or an LNet runtime
//! that owns one), shaped like the connection manager's and the completion queue's events: those
//! of rdma_cm + ibverbs, because that is the hardest fabric to fit. No driver holds the engine:
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
//! | `handle_disconnected(why)`       | RDMA_CM_EVENT_DISCONNECTED (a DREQ: `Closed`; after a QP/WC error: `TransportError`), DEVICE_REMOVAL | disconnect frame (`Closed`); bad frame, bad RDMA write (`ProtocolError`); EOF without disconnect, RST, socket error (`TransportError`) |
//! | `Destroy`                        | destroy QP, CQ, cm_id; deregister buffers          | close the socket, free slots        |
//! | [`Registry`] / [`Registration`]  | ibv_reg_mr (lkey, rkey); ibv_dereg_mr               | buffer in a table keyed by its key  |
//! | `RdmaWrite` (fragment lists)     | IBV_WR_RDMA_WRITE per remote frag, local SGEs, last signaled | a frame per piece: data for the peer's (key, addr) |
//!
//! Ordering contract (what RC guarantees and drivers must keep): messages on one connection arrive
//! in order and at most once; a send completes (success or error) exactly once unless the connection
//! is destroyed first; after `Destroy` nothing more is reported for that connection. An RDMA write
//! is a work request on the same send queue: it completes through `handle_send_complete` like a
//! send, completions come in posting order, and a send posted after a write on the same connection
//! reaches the peer only after the write's data is in place (o2iblnd posts PUT_DONE / GET_DONE
//! right behind its writes and relies on this).

pub mod local;

use core::fmt;

use crate::handle::handle_type;
pub use crate::mem::{RegionId, Registration, SharedMem};
use crate::time::Instant;
use crate::wire::kib::MAX_RDMA_FRAGS;
use crate::wire::Nid;

handle_type! {
    /// The engine's name for one connection (a queue pair and its cm_id): a
    /// [`Handle`](crate::handle::Handle) (slab key with a generation), so an event for a
    /// connection that was already destroyed is recognised and dropped. `as_u64` / `from_u64`
    /// carry it through the kernel (wr_id, io_uring user_data).
    pub type ConnId = Handle<ConnTag>, "conn";
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

/// Where an RDMA write lands in the peer's memory: the remote key of a region the peer registered
/// and advertised (the `key` of an o2iblnd RdmaDesc in PUT_ACK / GET_REQ) and a virtual address
/// inside it (the `addr` of one RdmaFrag).
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

    /// The remote fragment of `len` bytes starting here.
    pub const fn frag(self, len: u32) -> RemoteFrag {
        RemoteFrag {
            key: self.key,
            addr: self.addr,
            len,
        }
    }
}

/// One source fragment of an RDMA write: `len` bytes at `offset` of local region `region`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LocalFrag {
    pub region: RegionId,
    pub offset: u64,
    pub len: u32,
}

/// One sink fragment of an RDMA write (an o2iblnd RdmaFrag with its descriptor's key): `len`
/// bytes at virtual address `addr` of the peer's region registered under `key`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteFrag {
    pub key: u32,
    pub addr: u64,
    pub len: u32,
}

/// Why an [`FabricAction::RdmaWrite`] is malformed (refused with [`WcStatus::Error`] before a
/// byte is sent).
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadRdmaWrite {
    #[error("no local or no remote fragment")]
    NoFragments,
    #[error("more than {MAX_RDMA_FRAGS} fragments on one side")]
    TooManyFragments,
    #[error("an empty fragment")]
    EmptyFragment,
    #[error("a fragment wraps around the address space")]
    Wraps,
    #[error("local and remote totals differ ({local} vs {remote} bytes)")]
    LengthMismatch { local: u64, remote: u64 },
    #[error("more than u32::MAX bytes")]
    TooLong,
}

/// Checks that a write's fragment lists are well-formed (see [`FabricAction::RdmaWrite`]) and
/// returns its length. Regions and keys are the fabric's to check.
pub fn check_rdma_write(local: &[LocalFrag], remote: &[RemoteFrag]) -> Result<u32, BadRdmaWrite> {
    if local.is_empty() || remote.is_empty() {
        return Err(BadRdmaWrite::NoFragments);
    }
    if local.len() > MAX_RDMA_FRAGS || remote.len() > MAX_RDMA_FRAGS {
        return Err(BadRdmaWrite::TooManyFragments);
    }
    // One side's fragments as (start, length): each non-empty and not wrapping; their total.
    fn side_total(mut frags: impl Iterator<Item = (u64, u32)>) -> Result<u64, BadRdmaWrite> {
        frags.try_fold(0u64, |total, (start, len)| {
            if len == 0 {
                return Err(BadRdmaWrite::EmptyFragment);
            }
            start
                .checked_add(u64::from(len))
                .ok_or(BadRdmaWrite::Wraps)?;
            Ok(total + u64::from(len))
        })
    }
    let local_total = side_total(local.iter().map(|f| (f.offset, f.len)))?;
    let remote_total = side_total(remote.iter().map(|f| (f.addr, f.len)))?;
    if local_total != remote_total {
        return Err(BadRdmaWrite::LengthMismatch {
            local: local_total,
            remote: remote_total,
        });
    }
    u32::try_from(local_total).map_err(|_| BadRdmaWrite::TooLong)
}

/// One contiguous piece of an RDMA write: where both a local and a remote fragment overlap.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RdmaPiece {
    /// Index of the local fragment, and where in its region the piece starts.
    pub local_frag: usize,
    pub region: RegionId,
    pub offset: u64,
    /// Index of the remote fragment, its key, and the address the piece lands at.
    pub remote_frag: usize,
    pub key: u32,
    pub addr: u64,
    pub len: u32,
}

/// The pieces of a write, in order: the source split at every boundary of either list (what
/// kiblnd_init_rdma does). Stops at the end of the shorter list; check the lists first
/// ([`check_rdma_write`]).
pub fn rdma_pieces<'a>(
    local: &'a [LocalFrag],
    remote: &'a [RemoteFrag],
) -> impl Iterator<Item = RdmaPiece> + 'a {
    let (mut li, mut lo, mut ri, mut ro) = (0usize, 0u32, 0usize, 0u32);
    core::iter::from_fn(move || {
        // Skip exhausted (or empty) fragments.
        while local.get(li).is_some_and(|f| lo >= f.len) {
            (li, lo) = (li + 1, 0);
        }
        while remote.get(ri).is_some_and(|f| ro >= f.len) {
            (ri, ro) = (ri + 1, 0);
        }
        let (l, r) = (local.get(li)?, remote.get(ri)?);
        let len = (l.len - lo).min(r.len - ro);
        let p = RdmaPiece {
            local_frag: li,
            region: l.region,
            offset: l.offset.wrapping_add(u64::from(lo)),
            remote_frag: ri,
            key: r.key,
            addr: r.addr.wrapping_add(u64::from(ro)),
            len,
        };
        lo += len;
        ro += len;
        Some(p)
    })
}

/// What a zeroed sink region of `sink_len` bytes at `sink_addr` holds after the write of
/// `local` (offsets into `src`) onto `remote`: the answer a fabric's RDMA write is checked
/// against (the simulator's and the tcp driver's tests).
#[cfg(all(test, any(feature = "sim", feature = "tcp")))]
pub(crate) fn expected_sink(
    src: &[u8],
    sink_len: usize,
    sink_addr: u64,
    local: &[LocalFrag],
    remote: &[RemoteFrag],
) -> Vec<u8> {
    let mut v = vec![0; sink_len];
    for p in rdma_pieces(local, remote) {
        let (s, d, n) = (
            p.offset as usize,
            (p.addr - sink_addr) as usize,
            p.len as usize,
        );
        v[d..d + n].copy_from_slice(&src[s..s + n]);
    }
    v
}

impl Registration {
    /// Key and address, for a peer.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            key: self.key,
            addr: self.addr,
        }
    }

    /// The local fragment `[offset, offset + len)` of this region.
    pub fn local_frag(&self, offset: u64, len: u32) -> LocalFrag {
        LocalFrag {
            region: self.id,
            offset,
            len,
        }
    }

    /// The remote fragment a peer writes `[offset, offset + len)` of this region through.
    pub fn remote_frag(&self, offset: u64, len: u32) -> RemoteFrag {
        self.remote().at(offset).frag(len)
    }
}

/// Memory registration, the same on every fabric (the tcp fabric, verbs, the simulator's nodes):
/// a buffer handed over becomes a region peers can write into and writes can read from, until it
/// is deregistered.
pub trait Registry {
    /// Registers `bytes` (taking them over) for local reads and remote writes on this fabric's
    /// device. Fails when the fabric cannot register (verbs: ibv_reg_mr; the simulator: a node
    /// with no running driver).
    fn register(&mut self, bytes: Vec<u8>) -> std::io::Result<Registration>;

    /// Copies `out.len()` bytes at `offset` of the region out; false if the fabric no longer
    /// holds it or the range is outside it. A peer writing at the same time gives torn bytes.
    fn read(&self, reg: &Registration, offset: u64, out: &mut [u8]) -> bool;

    /// Deregisters the region and gives its bytes back: later writes into it fail at the writer
    /// (or cost it the connection, on tcp), later writes from it fail locally. `None` if the
    /// fabric had already dropped it (a crashed simulated node) or could not deregister it
    /// (verbs: a failed ibv_dereg_mr leaks the buffer rather than free memory a peer may still
    /// write into, and counts it). What happens to a write in flight is the fabric's documented
    /// rule.
    fn deregister(&mut self, reg: Registration) -> Option<Vec<u8>>;

    /// Registers memory other fabrics may register too ([`SharedMem`]). Its `deregister` gives
    /// back no bytes (an empty buffer): the memory stays with its other owners. Fabrics that
    /// cannot share memory refuse (the tcp and verbs fabrics can; the simulator does not).
    fn register_shared(&mut self, mem: &SharedMem) -> std::io::Result<Registration> {
        let _ = mem;
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this fabric does not register shared memory",
        ))
    }

    /// The memory behind a region, where it is shared memory LNet can hand an LND that streams
    /// payloads instead of writing them by RDMA (`None`: the fabric keeps its bytes to itself).
    fn shared(&self, reg: &Registration) -> Option<SharedMem> {
        let _ = reg;
        None
    }

    /// The region's whole contents (see [`Registry::read`]).
    fn contents(&self, reg: &Registration) -> Option<Vec<u8>> {
        let mut v = vec![0; usize::try_from(reg.len()).ok()?];
        self.read(reg, 0, &mut v).then_some(v)
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
    /// RDMA-write the local fragments `local`, in order, onto the peer's registered memory
    /// described by the remote fragments `remote`, in order, over `conn`, which must be
    /// established: the bulk-data move of o2iblnd (kiblnd_init_rdma), the data source writing
    /// into the buffer the sink advertised in its PUT_ACK / GET_REQ RdmaDesc. The source bytes are
    /// the concatenation of the local fragments, the sink is the concatenation of the remote
    /// ones; the fabric splits the write at every boundary of either list ([`rdma_pieces`]).
    ///
    /// Well-formed ([`check_rdma_write`]): 1 to [`MAX_RDMA_FRAGS`] fragments on each side, none
    /// empty, none wrapping around, and both lists of the same total length (at most `u32::MAX`
    /// bytes). A malformed write, or one with a local fragment outside its region (unknown or
    /// deregistered region, out of bounds), is refused before anything is sent: it completes
    /// with [`WcStatus::Error`] (IBV_WC_LOC_PROT_ERR) and nothing of it lands.
    ///
    /// It is a work request on `conn`'s send queue: it completes ONCE, with
    /// `handle_send_complete(conn, wr, status)` exactly like a [`FabricAction::Send`], in posting
    /// order with the sends, and a send posted after it is delivered only after all of its data
    /// is in place. Nothing is reported at the peer (no receive slot is consumed). A remote
    /// fragment outside the region registered under its key (unknown or deregistered key, out of
    /// bounds) fails the write with [`WcStatus::Error`] (IBV_WC_REM_ACCESS_ERR; the tcp fabric
    /// reports it as the connection failing, see its docs) and the queue pair goes to error
    /// (what is queued behind it flushes); the pieces before the bad fragment may have landed,
    /// as on RC where each remote fragment is its own work request. An unreachable peer gives
    /// [`WcStatus::RetryExceeded`] and a closing connection [`WcStatus::Flushed`], as for sends.
    /// The local regions must not change until completion.
    RdmaWrite {
        conn: ConnId,
        wr: WrId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    },
    /// From now on `conn`'s peer may RDMA-write into `sink` (fragments of our registered
    /// regions), which we advertised to it in a PUT_ACK or GET_REQ; grant `id` lasts until
    /// [`FabricAction::RevokeWrites`] or the connection's end. A fabric that can tell which
    /// connection a write comes from (tcp) refuses a write that no open grant of that
    /// connection covers, exactly as a write under an unknown key: a key seen once (a router's
    /// buffers are lent to one peer after another) is then no way into memory lent to another
    /// peer, or lent again later. Verbs cannot check per connection with the long-lived keys it
    /// registers (o2iblnd's global-MR mode has the same exposure; per-use keys need FRWR) and
    /// ignores grants; so does the simulator.
    GrantWrites {
        conn: ConnId,
        id: WrId,
        sink: Vec<RemoteFrag>,
    },
    /// Grant `id` of `conn` is over (its PUT_DONE / GET_DONE came, or the transfer failed):
    /// later writes into that memory over `conn` are refused.
    RevokeWrites { conn: ConnId, id: WrId },
    /// Tell the peer this connection is closing (rdma_disconnect). Both sides then see
    /// `handle_disconnected` (with [`DisconnectReason::Closed`] unless the connection failed
    /// meanwhile); posted work flushes.
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

/// Why a connection ended, as far as the fabric can tell ([`FabricEvent::Disconnected`]). The
/// engine counts only [`DisconnectReason::Closed`] as a graceful close; the other two lose the
/// connection (`conns_lost`) and name the cause when the peer is reported down. A peer that
/// vanished without closing must never look like one that closed (the 3FS #426 lesson).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DisconnectReason {
    /// The close handshake: the peer's disconnect (its DREQ, the tcp DISCONNECT frame) or the
    /// confirmation of our own `Disconnect`.
    Closed,
    /// The fabric found the peer breaking the fabric's protocol: a malformed or unexpected frame,
    /// garbage after the handshake, an RDMA write outside the memory granted to it, a message
    /// longer than a receive slot.
    ProtocolError,
    /// The transport failed: a reset, an EOF without a disconnect (the peer process died), a
    /// timeout, a socket error, a queue pair in error (a failed work completion, the device
    /// gone), or a work request of ours the fabric had to refuse.
    TransportError,
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
    use super::*;

    fn l(offset: u64, len: u32) -> LocalFrag {
        LocalFrag {
            region: RegionId(1),
            offset,
            len,
        }
    }

    fn r(addr: u64, len: u32) -> RemoteFrag {
        RemoteFrag { key: 9, addr, len }
    }

    /// The pieces split at every boundary of either list, cover the source in order and land in
    /// the sink in order.
    #[test]
    fn pieces_split_at_both_lists_boundaries() {
        let local = [l(0, 5), l(100, 7), l(200, 3)];
        let remote = [r(1000, 2), r(2000, 6), r(3000, 4), r(4000, 3)];
        assert_eq!(check_rdma_write(&local, &remote), Ok(15));
        let got: Vec<(usize, u64, usize, u64, u32)> = rdma_pieces(&local, &remote)
            .map(|p| (p.local_frag, p.offset, p.remote_frag, p.addr, p.len))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, 0, 1000, 2),
                (0, 2, 1, 2000, 3),
                (1, 100, 1, 2003, 3),
                (1, 103, 2, 3000, 4),
                (2, 200, 3, 4000, 3),
            ]
        );
    }

    #[test]
    fn malformed_writes_are_named() {
        let one = [l(0, 4)];
        assert_eq!(
            check_rdma_write(&[], &[r(0, 4)]),
            Err(BadRdmaWrite::NoFragments)
        );
        assert_eq!(check_rdma_write(&one, &[]), Err(BadRdmaWrite::NoFragments));
        assert_eq!(
            check_rdma_write(&one, &[r(0, 3)]),
            Err(BadRdmaWrite::LengthMismatch {
                local: 4,
                remote: 3
            })
        );
        assert_eq!(
            check_rdma_write(&[l(0, 4), l(4, 0)], &[r(0, 4)]),
            Err(BadRdmaWrite::EmptyFragment)
        );
        assert_eq!(
            check_rdma_write(&one, &[r(u64::MAX - 1, 4)]),
            Err(BadRdmaWrite::Wraps)
        );
        let many: Vec<LocalFrag> = (0..=MAX_RDMA_FRAGS as u64).map(|i| l(i, 1)).collect();
        let sink = [r(0, many.len() as u32)];
        assert_eq!(
            check_rdma_write(&many, &sink),
            Err(BadRdmaWrite::TooManyFragments)
        );
        assert_eq!(
            check_rdma_write(&many[1..], &[r(0, MAX_RDMA_FRAGS as u32)]),
            Ok(MAX_RDMA_FRAGS as u32)
        );
    }

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

/// What a fabric reports: the connection manager's and the completion queue's events, as one
/// value each. Bytes are borrowed from the driver's buffers (a receive is handed over without a
/// copy; the sink copies what it keeps).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FabricEvent<'a> {
    /// A peer asks to connect, with its CONNREQ in the private data (RDMA_CM_EVENT_CONNECT_REQUEST).
    ConnectRequest { req: RequestId, private: &'a [u8] },
    /// A connection is up: on the active side `private` holds the CONNACK, on the passive side it
    /// is empty (RDMA_CM_EVENT_ESTABLISHED).
    Established { conn: ConnId, private: &'a [u8] },
    /// An active connect failed (REJECTED, UNREACHABLE, CONNECT_ERROR, ...).
    ConnectFailed { conn: ConnId, why: ConnectFailure },
    /// A message arrived in receive slot `slot`.
    Recv {
        conn: ConnId,
        slot: u16,
        bytes: &'a [u8],
    },
    /// A posted send or RDMA write completed.
    SendComplete {
        conn: ConnId,
        wr: WrId,
        status: WcStatus,
    },
    /// The connection is disconnected: the peer closed, our close completed, or the connection
    /// failed; `why` says which. Reported at most once per connection.
    Disconnected { conn: ConnId, why: DisconnectReason },
    /// The peer has written every byte of the first `prefix` bytes of grant `id` of `conn` (a
    /// [`FabricAction::GrantWrites`], its fragments in order) at least once. Only a fabric that
    /// sees the writes land (the tcp fabric; verbs cannot, writes being one-sided) reports
    /// it, and always before the message that follows those writes on the connection, so
    /// that a PUT_DONE or GET_DONE is checked against what really arrived: a buffer lent to
    /// one peer after another must never be passed on holding a previous user's bytes.
    WritesCovered { conn: ConnId, id: WrId, prefix: u64 },
}

/// Where a driver pushes what happened on its fabric: the engine's endpoint, or whatever owns
/// one (an LNet runtime, the simulator's node). Drivers see only this, never the engine.
pub trait FabricSink {
    /// One event, at `now` (the driver read its clock once for the batch).
    fn fabric_event(&mut self, now: Instant, ev: FabricEvent<'_>);

    /// A message buffer the fabric is done with (a `FabricAction::Send`'s bytes once copied or
    /// written), given back for reuse so the steady state allocates nothing per message.
    fn recycle(&mut self, buf: Vec<u8>);
}

/// The events as calls, so that a driver reads like the connection manager it wraps.
impl dyn FabricSink + '_ {
    pub fn handle_connect_request(&mut self, now: Instant, req: RequestId, private: &[u8]) {
        self.fabric_event(now, FabricEvent::ConnectRequest { req, private });
    }
    pub fn handle_established(&mut self, now: Instant, conn: ConnId, private: &[u8]) {
        self.fabric_event(now, FabricEvent::Established { conn, private });
    }
    pub fn handle_connect_failed(&mut self, now: Instant, conn: ConnId, why: ConnectFailure) {
        self.fabric_event(now, FabricEvent::ConnectFailed { conn, why });
    }
    pub fn handle_recv(&mut self, now: Instant, conn: ConnId, slot: u16, bytes: &[u8]) {
        self.fabric_event(now, FabricEvent::Recv { conn, slot, bytes });
    }
    pub fn handle_send_complete(&mut self, now: Instant, conn: ConnId, wr: WrId, status: WcStatus) {
        self.fabric_event(now, FabricEvent::SendComplete { conn, wr, status });
    }
    pub fn handle_disconnected(&mut self, now: Instant, conn: ConnId, why: DisconnectReason) {
        self.fabric_event(now, FabricEvent::Disconnected { conn, why });
    }
    pub fn handle_writes_covered(&mut self, now: Instant, conn: ConnId, id: WrId, prefix: u64) {
        self.fabric_event(now, FabricEvent::WritesCovered { conn, id, prefix });
    }
}

/// A network that carries out the engine's [`FabricAction`]s: one method per kind of action, and
/// [`Fabric::apply`], which takes an action apart once for every fabric (the tcp and verbs
/// drivers, the simulator, the router's test fabric). A fabric implements what each action means
/// on its network; the ordering contract above is its to keep. `now` is the time the caller read
/// for this batch of actions (a fabric must not read a clock of its own for it).
pub trait Fabric {
    /// [`FabricAction::Connect`].
    fn connect(
        &mut self,
        now: Instant,
        conn: ConnId,
        peer: Nid,
        private: PrivateData,
        recv_slots: u16,
    );
    /// [`FabricAction::Accept`].
    fn accept(
        &mut self,
        now: Instant,
        req: RequestId,
        conn: ConnId,
        private: PrivateData,
        recv_slots: u16,
    );
    /// [`FabricAction::Reject`].
    fn reject(&mut self, now: Instant, req: RequestId, private: PrivateData);
    /// [`FabricAction::PostRecv`].
    fn post_recv(&mut self, now: Instant, conn: ConnId, slot: u16);
    /// [`FabricAction::Send`]: `bytes` is the fabric's to keep or to give back (recycle).
    fn send(&mut self, now: Instant, conn: ConnId, wr: WrId, bytes: Vec<u8>);
    /// [`FabricAction::RdmaWrite`].
    fn rdma_write(
        &mut self,
        now: Instant,
        conn: ConnId,
        wr: WrId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    );
    /// [`FabricAction::GrantWrites`] (a fabric that cannot tell where a write comes from ignores
    /// it, see there).
    fn grant_writes(&mut self, now: Instant, conn: ConnId, id: WrId, sink: Vec<RemoteFrag>);
    /// [`FabricAction::RevokeWrites`].
    fn revoke_writes(&mut self, now: Instant, conn: ConnId, id: WrId);
    /// [`FabricAction::Disconnect`].
    fn disconnect(&mut self, now: Instant, conn: ConnId);
    /// [`FabricAction::Destroy`].
    fn destroy(&mut self, now: Instant, conn: ConnId);

    /// Carries out one action: the one place an action is taken apart.
    fn apply(&mut self, now: Instant, a: FabricAction) {
        match a {
            FabricAction::Connect {
                conn,
                peer,
                private,
                recv_slots,
            } => self.connect(now, conn, peer, private, recv_slots),
            FabricAction::Accept {
                req,
                conn,
                private,
                recv_slots,
            } => self.accept(now, req, conn, private, recv_slots),
            FabricAction::Reject { req, private } => self.reject(now, req, private),
            FabricAction::PostRecv { conn, slot } => self.post_recv(now, conn, slot),
            FabricAction::Send { conn, wr, bytes } => self.send(now, conn, wr, bytes),
            FabricAction::RdmaWrite {
                conn,
                wr,
                local,
                remote,
            } => self.rdma_write(now, conn, wr, local, remote),
            FabricAction::GrantWrites { conn, id, sink } => self.grant_writes(now, conn, id, sink),
            FabricAction::RevokeWrites { conn, id } => self.revoke_writes(now, conn, id),
            FabricAction::Disconnect { conn } => self.disconnect(now, conn),
            FabricAction::Destroy { conn } => self.destroy(now, conn),
        }
    }
}
