#![allow(unsafe_code)]
//! A safe ownership wrapper over the `io-uring` crate for socket I/O, and the raw socket calls
//! std lacks. All of `lnd`'s unsafe code lives in this file.
//!
//! # Ownership model
//!
//! An io_uring operation lets the kernel read or write user memory until its completion is reaped.
//! [`Ring`] makes that safe by *owning* everything an operation points at for exactly that long:
//!
//! - a receive or send buffer is a `Vec<u8>` moved into the ring ([`Ring::recv`], [`Ring::send`])
//!   and handed back in the [`Completion`] (its heap block never moves while the kernel uses it;
//!   the caller reuses it, so steady-state I/O allocates nothing);
//! - a connect's socket address is boxed inside the ring until the connect completes;
//! - every operation sits in a slab (`ops`) keyed by the SQE's `user_data`; the caller's own tag
//!   (conventionally op kind, slab key and generation) rides along and comes back in the
//!   completion;
//! - SQEs that do not fit in a full submission queue wait in a backlog `VecDeque` and go in at the
//!   next submit, in order;
//! - on drop, the ring cancels everything in flight and waits (bounded) for the kernel to let go;
//!   whatever it did not let go of in time is leaked rather than freed under the kernel's feet.
//!
//! File descriptors are passed as plain numbers: a stale descriptor is a correctness bug (the
//! caller keeps a socket open while it has operations on it), never a memory-safety one.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use slab::Slab;

/// `user_data` of SQEs the ring issues for itself (the cancel-all on drop).
const UNTRACKED: u64 = u64::MAX;

/// How long [`Ring`]'s drop waits for the kernel to finish cancelled operations.
const DROP_WAIT: Duration = Duration::from_secs(2);

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum OpKind {
    Accept,
    Connect,
    Recv,
    Send,
    Cancel,
    Poll,
    SendZc,
}

/// A socket address in the C layout, boxed so its address is stable while a connect is in flight.
struct SockAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

/// One operation the kernel may still be working on, with everything its SQE points at.
struct Op {
    tag: u64,
    kind: OpKind,
    /// Kept only so that the memory outlives the kernel's use of it.
    buf: Option<Vec<u8>>,
    #[allow(dead_code)]
    addr: Option<Box<SockAddr>>,
    /// The memory a zero-copy send reads, held (an `Arc` clone) until its notification.
    #[allow(dead_code)]
    hold: Option<crate::mem::SharedMem>,
}

/// A reaped completion.
#[derive(Debug)]
pub struct Completion {
    /// The caller's tag given when the operation was queued.
    pub tag: u64,
    /// The CQE result: a byte count, a new descriptor, 0, or `-errno`.
    pub result: i32,
    /// More completions will come for this (multishot) operation.
    pub more: bool,
    /// The buffer of a receive or send, handed back (receives: the bytes landed at the offset given
    /// to [`Ring::recv`]).
    pub buf: Option<Vec<u8>>,
    /// The connection of a successful accept.
    pub fd: Option<OwnedFd>,
}

/// Counters of the ring itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// SQEs queued.
    pub sqes: u64,
    /// SQEs that found the submission queue full and waited in the backlog.
    pub backlogged: u64,
    /// Calls into the kernel (io_uring_enter).
    pub enters: u64,
    /// CQEs reaped.
    pub cqes: u64,
}

/// An io_uring instance with owned operations (see the module doc). Single-threaded; may be moved
/// between threads.
pub struct Ring {
    ring: IoUring,
    ops: Slab<Op>,
    backlog: VecDeque<squeue::Entry>,
    stats: RingStats,
    /// Entries were queued since the last submit.
    unsubmitted: bool,
}

impl Ring {
    /// A ring with `entries` submission slots (the completion queue gets twice that).
    /// Fails with `Unsupported` on a kernel without `IORING_FEAT_EXT_ARG` (5.11).
    pub fn new(entries: u32) -> io::Result<Ring> {
        let ring = IoUring::<squeue::Entry, cqueue::Entry>::builder()
            .setup_coop_taskrun()
            .build(entries)
            .or_else(|_| IoUring::new(entries))?;
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring without IORING_FEAT_EXT_ARG (kernel < 5.11)",
            ));
        }
        Ok(Ring {
            ring,
            ops: Slab::with_capacity(entries as usize),
            backlog: VecDeque::new(),
            stats: RingStats::default(),
            unsubmitted: false,
        })
    }

    /// The ring's descriptor: readable when completions (or work that will produce them)
    /// are pending.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.ring.as_raw_fd()
    }

    /// Entries queued that no submit has handed to the kernel yet.
    pub fn has_unsubmitted(&self) -> bool {
        self.unsubmitted || !self.backlog.is_empty()
    }

    /// Operations queued or in flight.
    pub fn in_flight(&self) -> usize {
        self.ops.len()
    }

    /// Counters.
    pub fn stats(&self) -> &RingStats {
        &self.stats
    }

    /// Multishot accept on `listener`: one completion per accepted connection (its descriptor in
    /// [`Completion::fd`]) until one arrives with `more == false`, after which it must be re-armed.
    pub fn accept_multi(&mut self, listener: BorrowedFd<'_>, tag: u64) {
        let entry = opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build();
        self.queue(entry, tag, OpKind::Accept, None, None);
    }

    /// One accept on `listener` (the completion carries the new descriptor, or `-errno`).
    pub fn accept_one(&mut self, listener: BorrowedFd<'_>, tag: u64) {
        let entry = opcode::Accept::new(
            types::Fd(listener.as_raw_fd()),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        )
        .flags(libc::SOCK_CLOEXEC)
        .build();
        self.queue(entry, tag, OpKind::Accept, None, None);
    }

    /// Connects `sock` to `addr`; the result is 0 or `-errno`.
    pub fn connect(&mut self, sock: BorrowedFd<'_>, addr: SocketAddr, tag: u64) {
        let addr = sockaddr(addr);
        let entry = opcode::Connect::new(
            types::Fd(sock.as_raw_fd()),
            core::ptr::addr_of!(addr.storage).cast::<libc::sockaddr>(),
            addr.len,
        )
        .build();
        self.queue(entry, tag, OpKind::Connect, None, Some(addr));
    }

    /// Receives into `buf[offset..]`, at most `max` bytes; the result is the byte count (0 = end
    /// of stream) or `-errno`. `buf` comes back in the completion.
    pub fn recv(
        &mut self,
        sock: BorrowedFd<'_>,
        mut buf: Vec<u8>,
        offset: usize,
        max: usize,
        tag: u64,
    ) {
        let offset = offset.min(buf.len());
        let len = u32::try_from((buf.len() - offset).min(max)).unwrap_or(u32::MAX);
        let ptr = buf.as_mut_ptr().wrapping_add(offset);
        let entry = opcode::Recv::new(types::Fd(sock.as_raw_fd()), ptr, len).build();
        self.queue(entry, tag, OpKind::Recv, Some(buf), None);
    }

    /// Sends `buf[offset..]` (MSG_NOSIGNAL); the result is the byte count written (possibly
    /// short) or `-errno`. `buf` comes back in the completion.
    pub fn send(&mut self, sock: BorrowedFd<'_>, buf: Vec<u8>, offset: usize, tag: u64) {
        let offset = offset.min(buf.len());
        let len = u32::try_from(buf.len() - offset).unwrap_or(u32::MAX);
        let ptr = buf.as_ptr().wrapping_add(offset);
        let entry = opcode::Send::new(types::Fd(sock.as_raw_fd()), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build();
        self.queue(entry, tag, OpKind::Send, Some(buf), None);
    }

    /// One-shot readiness watch: completes (with the poll mask, or `-errno`) once `fd` is
    /// readable. Re-arm after each completion.
    pub fn poll_readable(&mut self, fd: std::os::fd::RawFd, tag: u64) {
        let entry = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build();
        self.queue(entry, tag, OpKind::Poll, None, None);
    }

    /// One-shot readiness watch for the poll events in `mask` (POLLIN, POLLOUT, ...): completes
    /// with the events that fired (POLLERR / POLLHUP always count), or `-errno`.
    pub fn poll_mask(&mut self, fd: BorrowedFd<'_>, mask: u32, tag: u64) {
        let entry = opcode::PollAdd::new(types::Fd(fd.as_raw_fd()), mask).build();
        self.queue(entry, tag, OpKind::Poll, None, None);
    }

    /// Sends `mem[offset..offset + len]` without copying it (IORING_OP_SEND_ZC, MSG_NOSIGNAL,
    /// asking the kernel to report whether it copied after all). Two completions come: the
    /// send's (bytes written or `-errno`, `more` set when a notification follows), then, once
    /// the kernel no longer reads the memory, the notification (`more` clear; its result has
    /// [`ZC_COPIED`] set when the kernel copied the bytes anyway, as on loopback). A send that
    /// failed at once may come alone, with `more` clear. A range outside `mem` is clamped to it.
    pub fn send_zc(
        &mut self,
        sock: BorrowedFd<'_>,
        mem: crate::mem::SharedMem,
        offset: usize,
        len: usize,
        tag: u64,
    ) {
        let (ptr, len) = mem.with(|b| {
            let start = offset.min(b.len());
            let len = len.min(b.len() - start);
            (b.as_ptr().wrapping_add(start), len)
        });
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        let entry = opcode::SendZc::new(types::Fd(sock.as_raw_fd()), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .zc_flags(IORING_SEND_ZC_REPORT_USAGE)
            .build();
        let idx = self.queue_entry(OpKind::SendZc, tag, Some(mem));
        self.push_entry(entry, idx);
    }

    /// Cancels every operation on `sock` (IORING_ASYNC_CANCEL_FD | ALL); the cancelled ones
    /// complete with `-ECANCELED`, this one with the number cancelled or `-ENOENT`.
    pub fn cancel_fd(&mut self, sock: BorrowedFd<'_>, tag: u64) {
        let entry =
            opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(sock.as_raw_fd())).all())
                .build();
        self.queue(entry, tag, OpKind::Cancel, None, None);
    }

    fn queue(
        &mut self,
        entry: squeue::Entry,
        tag: u64,
        kind: OpKind,
        buf: Option<Vec<u8>>,
        addr: Option<Box<SockAddr>>,
    ) {
        let idx = self.ops.insert(Op {
            tag,
            kind,
            buf,
            addr,
            hold: None,
        });
        self.push_entry(entry, idx);
    }

    /// Registers an operation that owns only `hold`; its SQE goes in with `push_entry`.
    fn queue_entry(
        &mut self,
        kind: OpKind,
        tag: u64,
        hold: Option<crate::mem::SharedMem>,
    ) -> usize {
        self.ops.insert(Op {
            tag,
            kind,
            buf: None,
            addr: None,
            hold,
        })
    }

    fn push_entry(&mut self, entry: squeue::Entry, idx: usize) {
        self.stats.sqes += 1;
        self.unsubmitted = true;
        let entry = entry.user_data(idx as u64);
        if self.backlog.is_empty() && self.push_sq(&entry) {
            return;
        }
        self.stats.backlogged += 1;
        self.backlog.push_back(entry);
    }

    /// Pushes one entry into the submission queue; false if it is full.
    fn push_sq(&mut self, entry: &squeue::Entry) -> bool {
        // SAFETY: every pointer in an entry built by this type refers to memory owned by the
        // matching `ops` slot (a `Vec`'s heap block, or a boxed socket address), which is neither
        // dropped, moved nor accessed until the final CQE for that slot is reaped in `reap` (or
        // the drop path has seen the kernel let go of it, or leaks it). A zero-copy send's
        // pointer is into a `SharedMem`'s bytes, in bounds (clamped in `send_zc`): the slot holds
        // an `Arc` clone of it, so the heap block is not freed before the final CQE (the
        // notification), and it never moves, because `SharedMem` hands out only `&mut [u8]`
        // (nothing can resize or replace its `Vec`). The kernel only reads through that
        // pointer; another holder writing the bytes meanwhile (which the stream contract rules
        // out) could change what is sent, not corrupt memory. Descriptors are plain integers
        // the kernel validates.
        unsafe { self.ring.submission().push(entry).is_ok() }
    }

    /// Moves backlogged entries into the submission queue, submitting to make room as needed.
    fn flush_backlog(&mut self) -> io::Result<()> {
        while let Some(entry) = self.backlog.front().cloned() {
            if self.push_sq(&entry) {
                self.backlog.pop_front();
                continue;
            }
            self.stats.enters += 1;
            match self.ring.submit() {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if is_transient(&e) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Submits everything queued, then waits for at least one completion for up to `timeout`
    /// (`None`: without limit; zero: not at all). Timeouts and interrupted waits are not errors.
    pub fn submit_and_wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.flush_backlog()?;
        self.stats.enters += 1;
        let res = match timeout {
            Some(t) if t.is_zero() => self.ring.submit(),
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            None => self.ring.submit_and_wait(1),
        };
        match res {
            Ok(_) => {
                self.unsubmitted = false;
                Ok(())
            }
            Err(e) if is_transient(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// True if a completion is waiting to be reaped (no system call).
    pub fn has_completions(&mut self) -> bool {
        !self.ring.completion().is_empty()
    }

    /// Appends every completion waiting in the completion queue to `out`.
    pub fn reap(&mut self, out: &mut Vec<Completion>) {
        let ops = &mut self.ops;
        let stats = &mut self.stats;
        for cqe in self.ring.completion() {
            stats.cqes += 1;
            let idx = cqe.user_data();
            if idx == UNTRACKED {
                continue;
            }
            let more = cqueue::more(cqe.flags());
            let result = cqe.result();
            let Some(op) = ops.get(idx as usize) else {
                continue;
            };
            let (tag, kind) = (op.tag, op.kind);
            let buf = if more {
                None
            } else {
                ops.try_remove(idx as usize).and_then(|op| op.buf)
            };
            let fd = (kind == OpKind::Accept && result >= 0).then(|| {
                // SAFETY: a successful accept CQE's result is a descriptor the kernel just
                // installed in our table for us, owned by nobody else.
                unsafe { OwnedFd::from_raw_fd(result) }
            });
            out.push(Completion {
                tag,
                result,
                more,
                buf,
                fd,
            });
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Entries still in the backlog never reached the kernel: their memory can go.
        for entry in self.backlog.drain(..) {
            self.ops.try_remove(entry.get_user_data() as usize);
        }
        if self.ops.is_empty() {
            return;
        }
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(UNTRACKED);
        if !self.push_sq(&cancel) {
            let _ = self.ring.submit();
            let _ = self.push_sq(&cancel);
        }
        let deadline = Instant::now() + DROP_WAIT;
        while !self.ops.is_empty() && Instant::now() < deadline {
            let ts = types::Timespec::from(Duration::from_millis(20));
            let args = types::SubmitArgs::new().timespec(&ts);
            if let Err(e) = self.ring.submitter().submit_with_args(1, &args) {
                if !is_transient(&e) {
                    break;
                }
            }
            let ops = &mut self.ops;
            for cqe in self.ring.completion() {
                let idx = cqe.user_data();
                if idx == UNTRACKED {
                    continue;
                }
                let kind = ops.get(idx as usize).map(|op| op.kind);
                if kind == Some(OpKind::Accept) && cqe.result() >= 0 {
                    // SAFETY: as in `reap`: a fresh descriptor nobody else owns; dropping it
                    // closes it.
                    drop(unsafe { OwnedFd::from_raw_fd(cqe.result()) });
                }
                if !cqueue::more(cqe.flags()) {
                    ops.try_remove(idx as usize);
                }
            }
        }
        if !self.ops.is_empty() {
            // The kernel may still use these buffers: leak them rather than free them.
            tracing::error!(
                ops = self.ops.len(),
                "io_uring operations did not finish cancelling; leaking their buffers"
            );
            std::mem::forget(std::mem::take(&mut self.ops));
        }
    }
}

/// `IORING_SEND_ZC_REPORT_USAGE` (Linux 6.2): the notification says whether the kernel copied.
const IORING_SEND_ZC_REPORT_USAGE: u16 = 1 << 3;

/// `IORING_NOTIF_USAGE_ZC_COPIED`, in a zero-copy send's notification result: the kernel
/// copied the bytes after all (loopback always does; so does a device without scatter-gather).
pub const ZC_COPIED: i32 = i32::MIN;

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
    )
}

fn sockaddr(addr: SocketAddr) -> Box<SockAddr> {
    let (storage, len) = super::sockaddr::sockaddr_storage(addr);
    Box::new(SockAddr { storage, len })
}

/// A new, unconnected TCP socket for `addr`'s family (blocking mode: io_uring polls it).
pub fn tcp_socket(addr: SocketAddr) -> io::Result<OwnedFd> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain system call with constant arguments; no memory is passed.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `socket` just returned this descriptor; we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds `sock` to `addr` without listening (tests: a port that stays taken while every
/// connect to it is refused).
#[cfg(test)]
pub fn bind(sock: BorrowedFd<'_>, addr: SocketAddr) -> io::Result<()> {
    let a = sockaddr(addr);
    // SAFETY: the address points at a live, boxed sockaddr of the length passed; the descriptor
    // is borrowed, so open.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            core::ptr::addr_of!(a.storage).cast::<libc::sockaddr>(),
            a.len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the listen backlog of an already listening socket (Linux applies a second `listen` to
/// the queue's length; the kernel caps it at net.core.somaxconn).
pub fn set_listen_backlog(sock: BorrowedFd<'_>, backlog: u32) -> io::Result<()> {
    let n = libc::c_int::try_from(backlog).unwrap_or(libc::c_int::MAX);
    // SAFETY: plain system call on a borrowed (so open) descriptor; no memory is passed.
    if unsafe { libc::listen(sock.as_raw_fd(), n) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The soft limit on this process's open descriptors (RLIMIT_NOFILE), `None` when unlimited.
pub fn nofile_limit() -> io::Result<Option<u64>> {
    Ok(rustix::process::getrlimit(rustix::process::Resource::Nofile).current)
}

/// Sets TCP_USER_TIMEOUT: how long transmitted data may stay unacknowledged before the kernel
/// fails the connection with ETIMEDOUT (zero = the system default).
pub fn set_tcp_user_timeout(sock: BorrowedFd<'_>, timeout: Duration) -> io::Result<()> {
    let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    rustix::net::sockopt::set_tcp_user_timeout(sock, ms).map_err(io::Error::from)
}

/// Reads TCP_USER_TIMEOUT back (for tests and `lnetctl`).
pub fn tcp_user_timeout(sock: BorrowedFd<'_>) -> io::Result<Duration> {
    let ms = rustix::net::sockopt::tcp_user_timeout(sock).map_err(io::Error::from)?;
    Ok(Duration::from_millis(u64::from(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    #[test]
    fn uring_accept_connect_send_recv_roundtrip() {
        let mut ring = Ring::new(8).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        ring.accept_multi(listener.as_fd(), 1);
        let sock = tcp_socket(addr).unwrap();
        ring.connect(sock.as_fd(), addr, 2);
        let mut out = Vec::new();
        let mut accepted = None;
        let mut connected = false;
        let deadline = Instant::now() + Duration::from_secs(5);
        while (accepted.is_none() || !connected) && Instant::now() < deadline {
            ring.submit_and_wait(Some(Duration::from_millis(50)))
                .unwrap();
            ring.reap(&mut out);
            for c in out.drain(..) {
                match c.tag {
                    1 => accepted = c.fd,
                    2 => {
                        assert_eq!(c.result, 0);
                        connected = true;
                    }
                    _ => unreachable!(),
                }
            }
        }
        let mut server = TcpStream::from(accepted.expect("accepted"));
        ring.send(sock.as_fd(), b"hello".to_vec(), 1, 3);
        ring.submit_and_wait(Some(Duration::from_secs(1))).unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ello");
        server.write_all(b"world").unwrap();
        ring.recv(sock.as_fd(), vec![0u8; 16], 3, usize::MAX, 4);
        let mut n = None;
        while n.is_none() && Instant::now() < deadline {
            ring.submit_and_wait(Some(Duration::from_millis(50)))
                .unwrap();
            ring.reap(&mut out);
            for c in out.drain(..) {
                if c.tag == 4 {
                    let buf = c.buf.unwrap();
                    let k = c.result as usize;
                    assert_eq!(&buf[3..3 + k], &b"world"[..k]);
                    n = Some(k);
                }
            }
        }
        assert!(n.unwrap() > 0);
        set_tcp_user_timeout(sock.as_fd(), Duration::from_millis(1500)).unwrap();
        assert_eq!(
            tcp_user_timeout(sock.as_fd()).unwrap(),
            Duration::from_millis(1500)
        );
        // The multishot accept is still armed: drop must cancel it and return promptly.
        let t = Instant::now();
        drop(ring);
        assert!(t.elapsed() < DROP_WAIT);
    }
}
