#![allow(unsafe_code)]
//! A small safe wrapper over `rdma-sys` (libibverbs + librdmacm): the only file of the `verbs`
//! fabric with `unsafe` code.
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
    // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in>(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in6>(), sin6) };
        }
    }
    ss
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

impl EventChannel {
    /// Creates a non-blocking event channel (fails with ENODEV when there is no RDMA device).
    pub fn new() -> io::Result<EventChannel> {
        // SAFETY: no arguments; a null result means failure with errno set.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(last_err)?;
        let ch = EventChannel { raw };
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    /// The descriptor to poll(2) for readability.
    pub fn fd(&self) -> RawFd {
        // SAFETY: `raw` is a live channel for as long as `self` exists.
        unsafe { self.raw.as_ref().fd }
    }

    /// The next event, without blocking (`Ok(None)` when there is none).
    pub fn next_event(&self) -> io::Result<Option<CmEvent>> {
        let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
        // SAFETY: a live channel and a valid out-pointer; the channel is non-blocking.
        let rc = unsafe { sys::rdma_get_cm_event(self.raw.as_ptr(), &mut ev) };
        if rc != 0 {
            let e = last_err();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: on success `ev` points at an event owned by librdmacm until it is acked below;
        // we only read plain fields. `param.conn` is the active union member for connection
        // events; for others its private_data is null / len 0, which we check.
        let out = unsafe {
            let e = &*ev;
            let kind = CmEventKind::from_raw(e.event);
            let private = {
                let p = e.param.conn.private_data;
                let n = usize::from(e.param.conn.private_data_len).min(64);
                if p.is_null() || n == 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(p.cast::<u8>(), n).to_vec()
                }
            };
            let (token, new_id) = if kind == CmEventKind::ConnectRequest {
                let token = if e.listen_id.is_null() {
                    0
                } else {
                    (*e.listen_id).context as u64
                };
                (token, NonNull::new(e.id).map(CmId::from_raw))
            } else if e.id.is_null() {
                (0, None)
            } else {
                ((*e.id).context as u64, None)
            };
            CmEvent {
                kind,
                status: e.status,
                token,
                new_id,
                private,
            }
        };
        // SAFETY: `ev` came from rdma_get_cm_event and is acked exactly once; we copied what we
        // need. The new id of a connect request stays valid after the ack (we own it now).
        check(unsafe { sys::rdma_ack_cm_event(ev) })?;
        Ok(Some(out))
    }
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

impl CompChannel {
    /// The descriptor to poll(2).
    pub fn fd(&self) -> RawFd {
        // SAFETY: live channel.
        unsafe { self.raw.as_ref().fd }
    }

    /// Reads and acks every pending notification (non-blocking); returns how many there were.
    pub fn drain(&self) -> usize {
        let mut n = 0;
        loop {
            let mut cq: *mut sys::ibv_cq = ptr::null_mut();
            let mut ctx: *mut libc::c_void = ptr::null_mut();
            // SAFETY: live non-blocking channel, valid out-pointers.
            let rc = unsafe { sys::ibv_get_cq_event(self.raw.as_ptr(), &mut cq, &mut ctx) };
            if rc != 0 || cq.is_null() {
                return n;
            }
            // SAFETY: `cq` is the live CQ the event is for (a CQ holds an Arc of its channel and
            // cannot have been destroyed with an un-acked event); acked exactly once.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }
}

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

impl CompletionQueue {
    /// Arms the CQ: the channel fires at the next completion.
    pub fn req_notify(&self) -> io::Result<()> {
        // SAFETY: live CQ.
        check(unsafe { sys::ibv_req_notify_cq(self.raw.as_ptr(), 0) })
    }

    /// Polls up to `max` raw completions (`(wr_id, status, byte_len)`) into `out`; returns how
    /// many. Private: only [`CmId::poll_cq`] polls, so that it sees every send-queue completion
    /// and can release what the work request pinned.
    fn poll_raw(&self, out: &mut Vec<(u64, u32, u32)>, max: usize) -> io::Result<usize> {
        const BATCH: usize = 32;
        // SAFETY: ibv_wc is plain old data; zeroes are valid.
        let mut wcs: [sys::ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        let n = max.min(BATCH) as i32;
        // SAFETY: live CQ; `wcs` has room for `n` entries.
        let got = unsafe { sys::ibv_poll_cq(self.raw.as_ptr(), n, wcs.as_mut_ptr()) };
        if got < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq failed ({got})")));
        }
        let got = got as usize;
        out.extend(wcs[..got].iter().map(|w| (w.wr_id, w.status, w.byte_len)));
        Ok(got)
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

impl MemoryRegion {
    /// Allocates `len` zeroed bytes and registers them for local write (and remote write when
    /// `remote_write`).
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        remote_write: bool,
    ) -> io::Result<Arc<MemoryRegion>> {
        let len = len.max(1);
        let boxed: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let buf = NonNull::new(Box::into_raw(boxed).cast::<u8>()).expect("Box is non-null");
        // SAFETY: `buf` points at `len` bytes we own until drop (after dereg).
        match unsafe { reg_mr(pd, buf, len, remote_write) } {
            Ok(mr) => Ok(Arc::new(MemoryRegion {
                mr,
                buf,
                len,
                copying: std::sync::atomic::AtomicBool::new(false),
                _pd: Arc::clone(pd),
                shared: None,
            })),
            Err(e) => {
                // SAFETY: re-creates the Box leaked above, exactly once.
                drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(buf.as_ptr(), len)) });
                Err(e)
            }
        }
    }

    /// Registers memory that other fabrics register too (a router's large buffers): the bytes
    /// stay `mem`'s, which this region keeps alive until it is deregistered. `mem` never
    /// reallocates (it hands out slices, never its vector), so its address is stable.
    pub fn shared(
        pd: &Arc<ProtectionDomain>,
        mem: &crate::fabric::SharedMem,
        remote_write: bool,
    ) -> io::Result<Arc<MemoryRegion>> {
        let (ptr, len) = mem.with(|b| (b.as_mut_ptr(), b.len()));
        let Some(buf) = NonNull::new(ptr).filter(|_| len > 0) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot register empty memory",
            ));
        };
        // SAFETY: `buf` points at `len` bytes that `mem` owns and keeps in place for as long as
        // the clone of it stored below lives, which is until after ibv_dereg_mr.
        let mr = unsafe { reg_mr(pd, buf, len, remote_write) }?;
        Ok(Arc::new(MemoryRegion {
            mr,
            buf,
            len,
            copying: std::sync::atomic::AtomicBool::new(false),
            _pd: Arc::clone(pd),
            shared: Some(mem.clone()),
        }))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The protection domain the region is registered on.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self._pd
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { self.mr.as_ref().lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { self.mr.as_ref().rkey }
    }

    /// The address of byte `offset` (for SGEs and remote descriptors).
    pub fn addr(&self, offset: usize) -> u64 {
        self.buf.as_ptr() as u64 + offset as u64
    }

    /// Runs `f` with the region's copy flag held (see the `copying` field).
    fn exclusive<R>(&self, f: impl FnOnce() -> R) -> R {
        use std::sync::atomic::Ordering;
        while self
            .copying
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        let r = f();
        self.copying.store(false, Ordering::Release);
        r
    }

    /// Copies `out.len()` bytes at `offset` out (the range must not be posted for receive).
    /// Panics if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|e| e <= self.len));
        if let Some(mem) = &self.shared {
            // Other fabrics copy under the memory's own lock: take that one.
            return mem.with(|b| out.copy_from_slice(&b[offset..offset + out.len()]));
        }
        self.exclusive(|| {
            // SAFETY: in bounds (checked above); a raw byte copy with the copy flag held, so no
            // other thread copies into these bytes meanwhile (see `Sync`).
            unsafe {
                ptr::copy_nonoverlapping(self.buf.as_ptr().add(offset), out.as_mut_ptr(), out.len())
            }
        });
    }

    /// Copies `data` in at `offset` (the range must not be posted for send). Panics if out of
    /// bounds.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset
            .checked_add(data.len())
            .is_some_and(|e| e <= self.len));
        if let Some(mem) = &self.shared {
            return mem.with(|b| b[offset..offset + data.len()].copy_from_slice(data));
        }
        self.exclusive(|| {
            // SAFETY: in bounds (checked above); a raw byte copy into memory we own, with the
            // copy flag held, so no other thread reads or writes these bytes meanwhile.
            unsafe {
                ptr::copy_nonoverlapping(data.as_ptr(), self.buf.as_ptr().add(offset), data.len())
            }
        });
    }
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

impl DeviceList {
    /// The devices librdmacm sees (an empty list when there are none).
    pub fn new() -> io::Result<Arc<DeviceList>> {
        let mut n: libc::c_int = 0;
        // SAFETY: valid out-pointer; a null result means failure (errno set) or no devices.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| {
            let e = last_err();
            if e.raw_os_error().unwrap_or(0) == 0 {
                io::Error::from_raw_os_error(libc::ENODEV)
            } else {
                e
            }
        })?;
        Ok(Arc::new(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        }))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn ctx(&self, i: usize) -> Option<*mut sys::ibv_context> {
        if i >= self.len {
            return None;
        }
        // SAFETY: `i` is within the `len` entries rdma_get_devices returned.
        let p = unsafe { *self.list.as_ptr().add(i) };
        (!p.is_null()).then_some(p)
    }

    /// The key of device `i` (compare with [`CmId::device_key`]).
    pub fn key(&self, i: usize) -> Option<usize> {
        self.ctx(i).map(|p| p as usize)
    }

    /// The index of the device whose key is `key`.
    pub fn index_of(&self, key: usize) -> Option<usize> {
        (0..self.len).find(|&i| self.key(i) == Some(key))
    }

    /// The name of device `i` (e.g. `rxe0`).
    pub fn name(&self, i: usize) -> Option<String> {
        let ctx = self.ctx(i)?;
        // SAFETY: a live context; `device` is set by ibv_open_device and the name is a
        // NUL-terminated string inside it.
        let p = unsafe { sys::ibv_get_device_name((*ctx).device) };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null NUL-terminated string owned by the device.
        Some(
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// The limits of device `i`.
    pub fn limits(&self, i: usize) -> io::Result<DeviceLimits> {
        let ctx = self
            .ctx(i)
            .ok_or_else(|| io::Error::other("no such device"))?;
        // SAFETY: plain old data, zeroes valid.
        let mut a: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        check(unsafe { sys::ibv_query_device(ctx, &mut a) })?;
        let u = |v: libc::c_int| u32::try_from(v).unwrap_or(0);
        Ok(DeviceLimits {
            max_qp_wr: u(a.max_qp_wr),
            max_cqe: u(a.max_cqe),
            max_sge: u(a.max_sge),
            max_mr_size: a.max_mr_size,
        })
    }

    /// A protection domain on device `i`; it keeps the list (and so the context) alive.
    pub fn alloc_pd(self: &Arc<Self>, i: usize) -> io::Result<Arc<ProtectionDomain>> {
        let ctx = self
            .ctx(i)
            .ok_or_else(|| io::Error::other("no such device"))?;
        // SAFETY: a live context of the list, which the PD keeps alive.
        let raw = unsafe { sys::ibv_alloc_pd(ctx) };
        Ok(Arc::new(ProtectionDomain {
            raw: NonNull::new(raw).ok_or_else(last_err)?,
            _devices: Some(Arc::clone(self)),
        }))
    }
}

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

impl CmId {
    fn from_raw(raw: NonNull<sys::rdma_cm_id>) -> CmId {
        CmId { raw, qp: None }
    }

    /// A new RDMA_PS_TCP id on `ch`, whose events carry `token`.
    pub fn new(ch: &EventChannel, token: u64) -> io::Result<CmId> {
        let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
        // SAFETY: live channel, valid out-pointer; the context is an opaque integer.
        check(unsafe {
            sys::rdma_create_id(
                ch.raw.as_ptr(),
                &mut id,
                token as *mut libc::c_void,
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        })?;
        let raw = NonNull::new(id).ok_or_else(|| io::Error::other("rdma_create_id gave null"))?;
        Ok(CmId::from_raw(raw))
    }

    /// Sets the token carried by this id's events.
    pub fn set_token(&mut self, token: u64) {
        // SAFETY: live id; `context` is ours to set.
        unsafe { (*self.raw.as_ptr()).context = token as *mut libc::c_void };
    }

    pub fn bind(&mut self, addr: SocketAddr) -> io::Result<()> {
        let mut ss = to_sockaddr(addr);
        // SAFETY: live id; `ss` is a valid sockaddr for the call's duration.
        check(unsafe { sys::rdma_bind_addr(self.raw.as_ptr(), ptr::addr_of_mut!(ss).cast()) })
    }

    pub fn listen(&mut self, backlog: i32) -> io::Result<()> {
        // SAFETY: live, bound id.
        check(unsafe { sys::rdma_listen(self.raw.as_ptr(), backlog) })
    }

    /// The port the id is bound to (host order).
    pub fn src_port(&self) -> u16 {
        // SAFETY: live id.
        u16::from_be(unsafe { sys::rdma_get_src_port(self.raw.as_ptr()) })
    }

    pub fn resolve_addr(&mut self, dst: SocketAddr, timeout_ms: i32) -> io::Result<()> {
        let mut ss = to_sockaddr(dst);
        // SAFETY: live id; `ss` outlives the call (librdmacm copies it).
        check(unsafe {
            sys::rdma_resolve_addr(
                self.raw.as_ptr(),
                ptr::null_mut(),
                ptr::addr_of_mut!(ss).cast(),
                timeout_ms,
            )
        })
    }

    pub fn resolve_route(&mut self, timeout_ms: i32) -> io::Result<()> {
        // SAFETY: live id with a resolved address.
        check(unsafe { sys::rdma_resolve_route(self.raw.as_ptr(), timeout_ms) })
    }

    fn verbs(&self) -> io::Result<*mut sys::ibv_context> {
        // SAFETY: live id; `verbs` is set once the address is bound/resolved.
        let v = unsafe { self.raw.as_ref().verbs };
        if v.is_null() {
            Err(io::Error::other("cm_id has no device yet"))
        } else {
            Ok(v)
        }
    }

    /// The key of this id's device (its context), once bound or resolved; see
    /// [`DeviceList::key`].
    pub fn device_key(&self) -> Option<usize> {
        self.verbs().ok().map(|p| p as usize)
    }

    /// A protection domain on this id's device.
    pub fn alloc_pd(&self) -> io::Result<Arc<ProtectionDomain>> {
        let ctx = self.verbs()?;
        // SAFETY: `ctx` is the id's open device context (kept open by librdmacm).
        let raw = unsafe { sys::ibv_alloc_pd(ctx) };
        Ok(Arc::new(ProtectionDomain {
            raw: NonNull::new(raw).ok_or_else(last_err)?,
            _devices: None,
        }))
    }

    /// A non-blocking completion channel on this id's device.
    pub fn comp_channel(&self) -> io::Result<Arc<CompChannel>> {
        let ctx = self.verbs()?;
        // SAFETY: open device context.
        let raw = unsafe { sys::ibv_create_comp_channel(ctx) };
        let ch = CompChannel {
            raw: NonNull::new(raw).ok_or_else(last_err)?,
        };
        set_nonblocking(ch.fd())?;
        Ok(Arc::new(ch))
    }

    /// A CQ of `entries` on this id's device, notifying `channel`.
    pub fn create_cq(
        &self,
        entries: u32,
        channel: &Arc<CompChannel>,
    ) -> io::Result<Arc<CompletionQueue>> {
        let ctx = self.verbs()?;
        // SAFETY: open device context and a live channel of the same device.
        let raw = unsafe {
            sys::ibv_create_cq(
                ctx,
                entries as libc::c_int,
                ptr::null_mut(),
                channel.raw.as_ptr(),
                0,
            )
        };
        Ok(Arc::new(CompletionQueue {
            raw: NonNull::new(raw).ok_or_else(last_err)?,
            _channel: Arc::clone(channel),
        }))
    }

    /// Creates the id's RC QP (send and receive on `cq`, one SGE each); `pd` must be on the id's
    /// device. Returns the capacities created (at least those asked for).
    pub fn create_qp(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        send_wr: u32,
        recv_wr: u32,
    ) -> io::Result<QpCaps> {
        if self.qp.is_some() {
            return Err(io::Error::other("QP exists already"));
        }
        // SAFETY: plain old data, zeroes valid.
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.raw.as_ptr();
        attr.recv_cq = cq.raw.as_ptr();
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = send_wr;
        attr.cap.max_recv_wr = recv_wr;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        // SAFETY: live id, PD and CQ of the id's device; `attr` valid for the call.
        check(unsafe { sys::rdma_create_qp(self.raw.as_ptr(), pd.raw.as_ptr(), &mut attr) })?;
        self.qp = Some(QpDeps {
            _pd: Arc::clone(pd),
            cq: Arc::clone(cq),
            regions: Vec::new(),
            inflight: std::collections::VecDeque::new(),
            next_seq: 0,
            sges: Vec::new(),
            wrs: Vec::new(),
            raw_wcs: Vec::new(),
        });
        // rdma_create_qp writes the capacities it actually created back into `attr.cap`.
        Ok(QpCaps {
            send_wr: attr.cap.max_send_wr.max(send_wr),
            recv_wr: attr.cap.max_recv_wr.max(recv_wr),
        })
    }

    fn qp_for(&mut self, mr: &Arc<MemoryRegion>) -> io::Result<*mut sys::ibv_qp> {
        let deps = self.qp.as_mut().ok_or_else(|| io::Error::other("no QP"))?;
        if !deps.regions.iter().any(|r| Arc::ptr_eq(r, mr)) {
            deps.regions.push(Arc::clone(mr));
        }
        // SAFETY: live id with a QP (created above, not destroyed since `qp` is Some).
        Ok(unsafe { self.raw.as_ref().qp })
    }

    /// Posts a receive of `len` bytes at `offset` of `mr`.
    pub fn post_recv(
        &mut self,
        mr: &Arc<MemoryRegion>,
        offset: usize,
        len: u32,
        wr_id: u64,
    ) -> io::Result<()> {
        if offset
            .checked_add(len as usize)
            .is_none_or(|e| e > mr.len())
        {
            return Err(io::Error::other("receive outside its region"));
        }
        if wr_id & SQ_BIT != 0 {
            return Err(io::Error::other("receive wr_id with the top bit set"));
        }
        let qp = self.qp_for(mr)?;
        let mut sge = sys::ibv_sge {
            addr: mr.addr(offset),
            length: len,
            lkey: mr.lkey(),
        };
        // SAFETY: plain old data, zeroes valid.
        let mut wr: sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: live QP; the SGE names memory of a registered region the QP keeps alive (Arc
        // pinned in `qp_for`), in bounds (checked); `wr` and `sge` live for the call.
        check(unsafe { sys::ibv_post_recv(qp, &mut wr, &mut bad) })
    }

    /// Posts a signaled IBV_WR_SEND of `len` bytes at `offset` of `mr`.
    pub fn post_send(
        &mut self,
        mr: &Arc<MemoryRegion>,
        offset: usize,
        len: u32,
        wr_id: u64,
    ) -> io::Result<()> {
        self.post_sends(&[SendWr {
            wr_id,
            mr,
            offset,
            len,
            op: SendOp::Send,
        }])
        .map_err(|e| e.error)
    }

    /// Posts `wrs` as one chain (one doorbell), every request signaled. Each must lie inside its
    /// region and its region must be on the QP's protection domain; the first that does not, and
    /// everything after it, is not posted. Each request pins its region until
    /// [`CmId::poll_cq`] returns its completion.
    pub fn post_sends(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let fail = |posted, e: io::Error| PostError { posted, error: e };
        let qp = match self.qp_ptr() {
            Ok(qp) => qp,
            Err(e) => return Err(fail(0, e)),
        };
        let deps = self.qp.as_mut().expect("qp_ptr checked");
        // Validate first: only a valid prefix is handed to the device.
        let valid = wrs
            .iter()
            .position(|w| {
                w.offset
                    .checked_add(w.len as usize)
                    .is_none_or(|e| e > w.mr.len())
                    || !Arc::ptr_eq(w.mr.pd(), &deps._pd)
            })
            .unwrap_or(wrs.len());
        let wrs_ok = &wrs[..valid];
        let mut result = Ok(());
        if !wrs_ok.is_empty() {
            deps.sges.clear();
            deps.wrs.clear();
            let first_seq = deps.next_seq;
            for (k, w) in wrs_ok.iter().enumerate() {
                deps.sges.push(sys::ibv_sge {
                    addr: w.mr.addr(w.offset),
                    length: w.len,
                    lkey: w.mr.lkey(),
                });
                // SAFETY: plain old data, zeroes valid.
                let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
                wr.wr_id = SQ_BIT | ((first_seq + k as u64) & !SQ_BIT);
                wr.num_sge = if w.len == 0 { 0 } else { 1 };
                wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                match w.op {
                    SendOp::Send => wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND,
                    SendOp::Write { remote_addr, rkey } => {
                        wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                        wr.wr.rdma = sys::rdma_t { remote_addr, rkey };
                    }
                }
                deps.wrs.push(wr);
            }
            // Link the chain now that neither vector will move again.
            let n = deps.wrs.len();
            let sge_base = deps.sges.as_mut_ptr();
            let wr_base = deps.wrs.as_mut_ptr();
            for k in 0..n {
                // SAFETY: `k` and `k + 1` index the `n` elements just pushed (k + 1 only when
                // k + 1 < n); the vectors are not resized until the post below returns.
                unsafe {
                    let wr = &mut *wr_base.add(k);
                    wr.sg_list = sge_base.add(k);
                    wr.next = if k + 1 < n {
                        wr_base.add(k + 1)
                    } else {
                        ptr::null_mut()
                    };
                }
            }
            let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
            // SAFETY: live QP; every SGE names memory inside a region registered on the QP's PD
            // (checked above), which stays pinned in `inflight` until its completion is polled
            // or the QP is destroyed; the chain and its SGEs live until the call returns (the
            // provider copies them).
            let rc = unsafe { sys::ibv_post_send(qp, wr_base, &mut bad) };
            let posted = if rc == 0 {
                n
            } else if bad.is_null() {
                0
            } else {
                // SAFETY: on failure `bad` points into the chain we passed.
                usize::try_from(unsafe { bad.offset_from(wr_base) })
                    .unwrap_or(0)
                    .min(n)
            };
            for (k, w) in wrs_ok[..posted].iter().enumerate() {
                deps.inflight
                    .push_back((first_seq + k as u64, w.wr_id, Arc::clone(w.mr)));
            }
            deps.next_seq = first_seq + posted as u64;
            if rc != 0 {
                let e = if rc > 0 {
                    io::Error::from_raw_os_error(rc)
                } else {
                    last_err()
                };
                result = Err(fail(posted, e));
            }
        }
        result?;
        if valid < wrs.len() {
            return Err(fail(
                valid,
                io::Error::other("work request outside its region or on another PD"),
            ));
        }
        Ok(())
    }

    /// Polls up to `max` completions of this QP's CQ into `out`; returns how many. Send-queue
    /// completions carry the caller's wr_id back and release what their request pinned.
    pub fn poll_cq(&mut self, out: &mut Vec<Wc>, max: usize) -> io::Result<usize> {
        let Some(deps) = self.qp.as_mut() else {
            return Ok(0);
        };
        deps.raw_wcs.clear();
        let got = deps.cq.poll_raw(&mut deps.raw_wcs, max)?;
        for &(wr_id, status, byte_len) in &deps.raw_wcs {
            if wr_id & SQ_BIT == 0 {
                out.push(Wc {
                    wr_id,
                    status,
                    is_send: false,
                    byte_len,
                });
                continue;
            }
            let seq = wr_id & !SQ_BIT;
            // In order: anything older than `seq` completed too (all are signaled, so there is
            // none unless the provider misbehaves).
            let mut user = None;
            while let Some(&(s, u, _)) = deps.inflight.front() {
                if s > seq {
                    break;
                }
                deps.inflight.pop_front();
                if s == seq {
                    user = Some(u);
                    break;
                }
            }
            if let Some(wr_id) = user {
                out.push(Wc {
                    wr_id,
                    status,
                    is_send: true,
                    byte_len,
                });
            }
        }
        Ok(got)
    }

    /// Send-queue work requests posted and not yet completed.
    pub fn sends_outstanding(&self) -> usize {
        self.qp.as_ref().map_or(0, |d| d.inflight.len())
    }

    /// Arms the QP's CQ (see [`CompletionQueue::req_notify`]).
    pub fn req_notify(&self) -> io::Result<()> {
        match self.qp.as_ref() {
            Some(d) => d.cq.req_notify(),
            None => Ok(()),
        }
    }

    fn qp_ptr(&self) -> io::Result<*mut sys::ibv_qp> {
        if self.qp.is_none() {
            return Err(io::Error::other("no QP"));
        }
        // SAFETY: live id with a QP (created, not destroyed since `qp` is Some).
        Ok(unsafe { self.raw.as_ref().qp })
    }

    fn conn_param(private: &[u8], p: ConnParam) -> sys::rdma_conn_param {
        // SAFETY: plain old data, zeroes valid.
        let mut cp: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        cp.private_data = private.as_ptr().cast();
        cp.private_data_len = private.len().min(255) as u8;
        cp.responder_resources = 0;
        cp.initiator_depth = 0;
        cp.flow_control = 1;
        cp.retry_count = p.retry_count;
        cp.rnr_retry_count = p.rnr_retry_count;
        cp
    }

    pub fn connect(&mut self, private: &[u8], p: ConnParam) -> io::Result<()> {
        let mut cp = CmId::conn_param(private, p);
        // SAFETY: live id with a resolved route and a QP; `private` outlives the call.
        check(unsafe { sys::rdma_connect(self.raw.as_ptr(), &mut cp) })
    }

    pub fn accept(&mut self, private: &[u8], p: ConnParam) -> io::Result<()> {
        let mut cp = CmId::conn_param(private, p);
        // SAFETY: live id of a connect request, with a QP; `private` outlives the call.
        check(unsafe { sys::rdma_accept(self.raw.as_ptr(), &mut cp) })
    }

    pub fn reject(&mut self, private: &[u8]) -> io::Result<()> {
        // SAFETY: live id of a connect request; `private` outlives the call.
        check(unsafe {
            sys::rdma_reject(
                self.raw.as_ptr(),
                private.as_ptr().cast(),
                private.len().min(255) as u8,
            )
        })
    }

    pub fn disconnect(&mut self) -> io::Result<()> {
        // SAFETY: live id.
        check(unsafe { sys::rdma_disconnect(self.raw.as_ptr()) })
    }

    /// Tells the CM the connection is up although its RTU has not come: a message arrived on
    /// the accepted queue pair (InfiniBand's COMM_EST). The CM then reports ESTABLISHED rather
    /// than fail the accept if the RTU is lost (o2iblnd: kiblnd_qp_event calls rdma_notify).
    pub fn notify_established(&mut self) -> io::Result<()> {
        // SAFETY: live id of an accepted connection, with a QP.
        check(unsafe {
            sys::rdma_notify(self.raw.as_ptr(), sys::ibv_event_type::IBV_EVENT_COMM_EST)
        })
    }

    /// Destroys the QP (if any), then releases what it pinned (CQ, MRs, PD references).
    pub fn destroy_qp(&mut self) {
        if self.qp.is_some() {
            // SAFETY: live id with a QP; after this no work request references any region.
            unsafe { sys::rdma_destroy_qp(self.raw.as_ptr()) };
            // Only now: the pins (regions, CQ, PD) may be the last references to them.
            self.qp = None;
        }
    }
}

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
