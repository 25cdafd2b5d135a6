#![allow(unsafe_code)]
//! A small safe wrapper over `rdma-sys` (libibverbs + librdmacm): the only part of the `verbs`
//! fabric with `unsafe` code (this module and its files).
//!
//! # Ownership model
//!
//! - [`EventChannel`] owns an `rdma_event_channel` (non-blocking fd). [`EventChannel::next_event`]
//!   copies everything we need out of an `rdma_cm_event` (kind, status, the id's token, the
//!   private data) and acks it at once, so no event is ever held across calls and
//!   `rdma_destroy_id` never waits on us.
//! - [`CmId`] owns an `rdma_cm_id` and, once [`CmId::create_qp`] ran, its RC queue pair. The QP
//!   keeps `Arc`s of its protection domain, its completion queue and every [`MemoryRegion`] a
//!   receive was posted into, so none of them can be freed while the device may still use them:
//!   they are released only after the QP is destroyed ([`CmId::destroy_qp`] or drop).
//! - Send-queue work requests (SEND and RDMA WRITE, [`CmId::post_sends`]) pin the region they read
//!   from only while they are outstanding: the id numbers them itself (the caller's `wr_id` is
//!   kept beside), every one is signaled, and [`CmId::poll_cq`] (the only way to poll a QP's CQ)
//!   releases the pin of each send-queue completion it sees, in posting order (RC completes a send
//!   queue in order, errors and flushes included). A region the caller dropped is thus
//!   deregistered as soon as its last write completes, or when the QP is destroyed.
//! - [`DeviceList`] owns librdmacm's device list (`rdma_get_devices`): the contexts every cm_id
//!   uses. A [`ProtectionDomain`] allocated on one of them keeps the list alive, so one PD per
//!   device serves every connection and every registered region of a fabric (as o2iblnd keeps one
//!   PD per HCA).
//! - [`ProtectionDomain`], [`CompChannel`], [`CompletionQueue`], [`MemoryRegion`] free their
//!   object on drop; dependents hold `Arc`s of what they need (a CQ its channel, an MR its PD).
//! - A [`MemoryRegion`]'s bytes are shared with the device: they are only copied in and out with
//!   raw copies ([`MemoryRegion::read`], [`MemoryRegion::write`]), never borrowed as Rust slices,
//!   because the HCA may DMA into a posted range at any time.
//!
//! Device contexts (`ibv_context`) are opened and kept by librdmacm; we borrow them through a
//! cm_id (`id->verbs`) or the [`DeviceList`].
//!
//! Layout: the types and their `Send`/`Sync` reasoning are here; their operations are in `events`
//! (the CM event channel), `cq` (completion channels and queues), `mr` (memory regions), `device`
//! (the device list) and `cm_id` (an rdma_cm id and its queue pair).

mod cm_id;
mod cq;
mod device;
mod events;
mod mr;

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys as sys;

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

fn check(rc: i32) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else if rc > 0 {
        // Some verbs return a positive errno instead of setting errno.
        Err(io::Error::from_raw_os_error(rc))
    } else {
        Err(last_err())
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own (the channel's), with plain integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(last_err());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(last_err());
    }
    Ok(())
}

/// How many RDMA devices libibverbs sees (0 on a host with no RDMA NIC and no rdma_rxe).
pub fn device_count() -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the returned list is freed right away and not used.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return 0;
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed exactly once.
    unsafe { sys::ibv_free_device_list(list) };
    usize::try_from(n).unwrap_or(0)
}

/// Writes `addr` into a `sockaddr_storage`.
fn to_sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    super::sockaddr::sockaddr_storage(addr).0
}

// ---------------------------------------------------------------------------------------------
// Connection-manager events

/// An rdma_cm event channel.
pub struct EventChannel {
    raw: NonNull<sys::rdma_event_channel>,
}

// SAFETY: the channel is a file descriptor wrapper; librdmacm allows using it from any thread,
// and we never share it (`!Sync` keeps `&self` on one thread at a time).
unsafe impl Send for EventChannel {}

/// What happened, as `rdma_cm_event_type`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    TimewaitExit,
    Other(u32),
}

impl CmEventKind {
    fn from_raw(t: u32) -> CmEventKind {
        use sys::rdma_cm_event_type as t_;
        match t {
            t_::RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            t_::RDMA_CM_EVENT_ADDR_ERROR => CmEventKind::AddrError,
            t_::RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            t_::RDMA_CM_EVENT_ROUTE_ERROR => CmEventKind::RouteError,
            t_::RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            t_::RDMA_CM_EVENT_CONNECT_RESPONSE => CmEventKind::ConnectResponse,
            t_::RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
            t_::RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Unreachable,
            t_::RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            t_::RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            t_::RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            t_::RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            t_::RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            other => CmEventKind::Other(other),
        }
    }
}

/// A connection-manager event, copied out and already acked.
pub struct CmEvent {
    pub kind: CmEventKind,
    /// `event->status`: an errno (negative) or, for REJECTED, the IB CM reject reason.
    pub status: i32,
    /// The token of the id the event is for ([`CmId::set_token`]); a connect request carries the
    /// listener's token.
    pub token: u64,
    /// For a connect request: the new id, now owned by the caller (its token is the listener's
    /// until [`CmId::set_token`]).
    pub new_id: Option<CmId>,
    /// The private data (truncated to 64 bytes; IB CM pads it with zeroes).
    pub private: Vec<u8>,
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: the channel is destroyed once; ids created on it are owned by `CmId`s that the
        // fabric drops first (field order), and no event is held un-acked.
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

// ---------------------------------------------------------------------------------------------
// Verbs objects

/// A protection domain on a cm_id's device.
pub struct ProtectionDomain {
    raw: NonNull<sys::ibv_pd>,
    /// The list whose context the PD was allocated on, kept open until the PD is gone.
    _devices: Option<Arc<DeviceList>>,
}

// SAFETY: verbs objects may be used from any thread; the wrappers are not shared mutably.
unsafe impl Send for ProtectionDomain {}
// SAFETY: the only `&self` operation is reading the pointer.
unsafe impl Sync for ProtectionDomain {}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR and QP on this PD holds an Arc of it, so none is left.
        unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}

/// A completion channel: a file descriptor that becomes readable when an armed CQ has a
/// completion.
pub struct CompChannel {
    raw: NonNull<sys::ibv_comp_channel>,
}

// SAFETY: as for ProtectionDomain.
unsafe impl Send for CompChannel {}
// SAFETY: `get_cq_event` on a channel is thread-safe in libibverbs.
unsafe impl Sync for CompChannel {}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ on this channel holds an Arc of it, so none is left.
        unsafe { sys::ibv_destroy_comp_channel(self.raw.as_ptr()) };
    }
}

/// A completion queue bound to a [`CompChannel`].
pub struct CompletionQueue {
    raw: NonNull<sys::ibv_cq>,
    _channel: Arc<CompChannel>,
}

// SAFETY: as for ProtectionDomain.
unsafe impl Send for CompletionQueue {}
// SAFETY: polling and arming a CQ are thread-safe in libibverbs providers.
unsafe impl Sync for CompletionQueue {}

/// One work completion, as [`CmId::poll_cq`] returns it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The caller's `wr_id` of the work request.
    pub wr_id: u64,
    /// `ibv_wc_status` (see [`wc`]).
    pub status: u32,
    /// True for a send-queue completion (SEND or RDMA WRITE), false for a receive. Known from the
    /// id's own numbering, so it holds for error completions too (whose opcode is undefined).
    pub is_send: bool,
    pub byte_len: u32,
}

/// Work-completion status codes.
pub mod wc {
    use rdma_sys::ibv_wc_status as s;
    pub const SUCCESS: u32 = s::IBV_WC_SUCCESS;
    pub const WR_FLUSH_ERR: u32 = s::IBV_WC_WR_FLUSH_ERR;
    pub const RETRY_EXC_ERR: u32 = s::IBV_WC_RETRY_EXC_ERR;
    pub const REM_ACCESS_ERR: u32 = s::IBV_WC_REM_ACCESS_ERR;
    pub const LOC_PROT_ERR: u32 = s::IBV_WC_LOC_PROT_ERR;
    pub const RNR_RETRY_EXC_ERR: u32 = s::IBV_WC_RNR_RETRY_EXC_ERR;
    pub const LOC_LEN_ERR: u32 = s::IBV_WC_LOC_LEN_ERR;

    /// libibverbs' name of a status.
    pub fn name(status: u32) -> String {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static NUL-terminated string
        // ("unknown" for values it does not know).
        let p = unsafe { rdma_sys::ibv_wc_status_str(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: the QP using this CQ holds an Arc of it, so it is destroyed already.
        unsafe { sys::ibv_destroy_cq(self.raw.as_ptr()) };
    }
}

/// A registered buffer (ibv_reg_mr); deregistered, then freed, on drop.
pub struct MemoryRegion {
    mr: NonNull<sys::ibv_mr>,
    buf: NonNull<u8>,
    len: usize,
    /// Held for the duration of every CPU copy in or out (`read`, `write`): two threads sharing
    /// the region can never copy into the same bytes at once. Never contended in practice (a
    /// fabric is driven by one thread); it exists so that `Sync` is sound, not for speed.
    copying: std::sync::atomic::AtomicBool,
    _pd: Arc<ProtectionDomain>,
    /// Memory owned elsewhere (`MemoryRegion::shared`): kept alive by this clone, never freed
    /// here, and copied in or out under its own lock.
    shared: Option<crate::fabric::SharedMem>,
}

// SAFETY: the MR pointer is only read (lkey, rkey) and the buffer only reached through `read` /
// `write`, which are safe to call from any thread (see `Sync`).
unsafe impl Send for MemoryRegion {}
// SAFETY: the only CPU accesses to the buffer are the copies in `read` and `write`, and both run
// under the `copying` flag (acquire/release), so no two threads ever touch it concurrently. The
// device's DMA is outside Rust's memory model; which ranges the device may be using is the
// fabric's bookkeeping (posted slots are not copied into).
unsafe impl Sync for MemoryRegion {}

/// ibv_reg_mr of `len` bytes at `buf` for local write (and remote write when `remote_write`).
///
/// # Safety
/// `buf` must point at `len` bytes that stay allocated, in place, until the returned MR is
/// deregistered.
unsafe fn reg_mr(
    pd: &Arc<ProtectionDomain>,
    buf: NonNull<u8>,
    len: usize,
    remote_write: bool,
) -> io::Result<NonNull<sys::ibv_mr>> {
    let mut access = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if remote_write {
        access |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    // SAFETY: live PD; the caller guarantees `buf` holds `len` bytes for the MR's lifetime.
    let mr = unsafe {
        sys::ibv_reg_mr(
            pd.raw.as_ptr(),
            buf.as_ptr().cast(),
            len,
            access as libc::c_int,
        )
    };
    NonNull::new(mr).ok_or_else(last_err)
}

/// Memory regions whose deregistration failed: their buffers were leaked rather than freed,
/// since a peer holding the rkey could still write into them.
static DEREG_FAILURES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many memory regions could not be deregistered (and were leaked) in this process.
pub fn dereg_failures() -> u64 {
    DEREG_FAILURES.load(std::sync::atomic::Ordering::Relaxed)
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: no QP can still use the MR: every QP it was posted on holds an Arc of it and is
        // destroyed before releasing it. Deregister first, then free the memory.
        let rc = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            // Still registered: freeing the buffer would let a remote write land in memory the
            // allocator hands to someone else. Leak it, loudly.
            DEREG_FAILURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!(
                rc,
                len = self.len,
                "ibv_dereg_mr failed: leaking the region's buffer rather than freeing memory a \
                 peer may still write into"
            );
            // Shared memory too: its other owners must never free it now.
            if let Some(mem) = self.shared.take() {
                std::mem::forget(mem);
            }
            return;
        }
        if self.shared.is_some() {
            // Not ours to free: dropping our clone lets its owners do that.
            return;
        }
        // SAFETY: re-creates the Box leaked in `new`, exactly once, after deregistration.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.buf.as_ptr(), self.len)) });
    }
}

// ---------------------------------------------------------------------------------------------
// cm_id + QP

/// Everything the QP references, released only after it is destroyed.
struct QpDeps {
    _pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    /// Regions receives were posted into (pinned until the QP is destroyed).
    regions: Vec<Arc<MemoryRegion>>,
    /// Outstanding send-queue work requests in posting order: our sequence number, the caller's
    /// wr_id, and the region the request reads from (pinned until its completion is polled).
    inflight: std::collections::VecDeque<(u64, u64, Arc<MemoryRegion>)>,
    next_seq: u64,
    /// Scratch space for building work-request chains (reused, so posting does not allocate).
    sges: Vec<sys::ibv_sge>,
    wrs: Vec<sys::ibv_send_wr>,
    raw_wcs: Vec<(u64, u32, u32)>,
}

/// Set in the wr_id of every send-queue work request the id posts (its own numbering); receive
/// wr_ids must have it clear.
const SQ_BIT: u64 = 1 << 63;

/// What a send-queue work request does.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// IBV_WR_SEND: the bytes land in the peer's next posted receive.
    Send,
    /// IBV_WR_RDMA_WRITE into the peer's memory at `remote_addr`, under `rkey`.
    Write { remote_addr: u64, rkey: u32 },
}

/// One send-queue work request: `len` bytes at `offset` of `mr`, always signaled.
pub struct SendWr<'a> {
    /// Returned in the completion's [`Wc::wr_id`].
    pub wr_id: u64,
    pub mr: &'a Arc<MemoryRegion>,
    pub offset: usize,
    pub len: u32,
    pub op: SendOp,
}

/// A chain that was only partly posted: the first `posted` requests are on the queue, the rest
/// are not.
#[derive(Debug)]
pub struct PostError {
    pub posted: usize,
    pub error: io::Error,
}

/// The capacities a QP was created with (the provider may round the requested ones up).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpCaps {
    pub send_wr: u32,
    pub recv_wr: u32,
}

/// The limits of a device that size queue pairs (ibv_query_device).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    pub max_sge: u32,
    pub max_mr_size: u64,
}

// ---------------------------------------------------------------------------------------------
// Devices

/// librdmacm's list of device contexts (`rdma_get_devices`), freed on drop. The contexts are the
/// ones cm_ids bind to, so a PD allocated here serves any cm_id on the same device.
pub struct DeviceList {
    list: NonNull<*mut sys::ibv_context>,
    len: usize,
}

// SAFETY: the list is an array of context pointers that librdmacm keeps open while the list is
// held; verbs calls on a context are thread-safe.
unsafe impl Send for DeviceList {}
// SAFETY: as above; `&self` methods only read the array.
unsafe impl Sync for DeviceList {}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and is freed once; every PD allocated on
        // one of its contexts holds an Arc of it, so none is left.
        unsafe { sys::rdma_free_devices(self.list.as_ptr()) };
    }
}

/// Connection parameters of rdma_connect / rdma_accept.
#[derive(Copy, Clone, Debug)]
pub struct ConnParam {
    pub retry_count: u8,
    pub rnr_retry_count: u8,
}

/// An rdma_cm id (and its QP).
pub struct CmId {
    raw: NonNull<sys::rdma_cm_id>,
    qp: Option<QpDeps>,
}

// SAFETY: librdmacm ids may be used from any thread; the wrapper is not Sync.
unsafe impl Send for CmId {}

impl Drop for CmId {
    fn drop(&mut self) {
        // Release order: QP (and what it pinned) first, then the id.
        if self.qp.is_some() {
            // SAFETY: live id with a QP.
            unsafe { sys::rdma_destroy_qp(self.raw.as_ptr()) };
        }
        let deps = self.qp.take();
        // SAFETY: the id is destroyed once; we hold no un-acked event for it.
        unsafe { sys::rdma_destroy_id(self.raw.as_ptr()) };
        drop(deps);
    }
}

/// Waits until one of `fds` is readable or `timeout_ms` passes (-1: forever). Returns the number
/// of ready descriptors; EINTR counts as 0.
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<usize> {
    Ok(poll_ready(fds, timeout_ms)?.iter().filter(|&&r| r).count())
}

/// As [`poll_readable`], saying which of `fds` became readable (or hung up or failed: a read
/// will not block), in their order; EINTR: none.
pub fn poll_ready(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of `len` pollfds for the call's duration.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = last_err();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}
