//! The `socket` stream driver: plain TCP byte streams on io_uring, below a streaming LND (the
//! socklnd engine). It applies [`StreamAction`]s and pushes what happened as [`StreamEvent`]s
//! into a [`StreamSink`] (the contract is `crate::stream`'s); its methods mirror
//! [`crate::driver::Driver`]'s, so an NI's runtime drives either kind the same way.
//!
//! Design:
//! - **Readiness on the ring, I/O in place.** Sockets are non-blocking; the ring carries the
//!   accepts, the connects, one-shot POLLIN / POLLOUT watches and zero-copy sends. A read or a
//!   write is a non-blocking `recv` / `sendmsg` issued in `poll` when the stream has work (an
//!   optimistic try first; a watch only on EAGAIN). So a stream lends the kernel no buffer while
//!   it waits: an idle established stream holds its bookkeeping only, and a socket before its
//!   HELLO the same, whatever `Recv` the engine posted (measured at 10,000 loopback connections
//!   in the tests: about 250 bytes of driver memory per socket, 260 bytes of RSS growth).
//!   An io_uring receive would pin a buffer per posted read (or need provided-buffer rings,
//!   whose buffers are then held by whichever socket has data queued); reading on readiness
//!   costs one extra completion per wait and nothing per idle socket.
//! - **`Recv { Bytes }`** reads into the driver's one read buffer (`SocketConfig::read_buffer`,
//!   reused for every read of every stream) and hands it over as `Data`.
//! - **`Recv { Mem }`** reads straight into LNet's memory: the `recv` runs under the
//!   `SharedMem`'s lock, into the slice where the bytes belong (no intermediate buffer and no
//!   copy; the lock is held for one non-blocking system call). Sound without any `unsafe`, which
//!   an io_uring receive into that memory would have needed while other threads may lock it.
//! - **Sends** go out in order, one at a time per stream: head and payload as one `sendmsg`
//!   with two iovecs (a `Mem` payload read under its lock, again without a copy of ours),
//!   partial writes continued on POLLOUT. With `SocketConfig::zero_copy`, a `Mem` payload of at
//!   least `zc_threshold` bytes goes with IORING_OP_SEND_ZC after its head, and `Sent` waits
//!   for the kernel's notification that it let go of the memory. On loopback the kernel copies
//!   anyway (each notification says so: `zc_copied`), so it is off by default. Measured
//!   (`socket_throughput` in the tests, release, 2 vCPUs, both ends on one thread, 1 MiB
//!   messages, medians of 5 alternated runs): read straight into `Mem` 3.5 GB/s, through the
//!   read buffer and a copy 2.7 GB/s, zero-copy send 2.0 GB/s (the kernel copies on loopback,
//!   and `Sent` waits for the notification).
//! - **Close**: `Graceful` flushes the queued sends, shuts the write side (FIN), reads and
//!   drops to the peer's EOF, then closes; all within `close_bound`, past which the socket is
//!   reset (counted). `Abort` (and `Refuse`) set SO_LINGER 0 and close: the peer sees RST. A
//!   socket with ring operations in flight is closed only once they are cancelled, since the
//!   ring holds a reference to the file (the RST would otherwise wait for them).
//! - **Dial** binds the local address to the first free port of `ports_from` down to
//!   `ports_to`, with SO_REUSEADDR + SO_REUSEPORT as the kernel's connector
//!   (`acceptor.c:lnet_connect`): a port in use toward another peer is shared; one in use toward
//!   this peer fails the connect with EADDRNOTAVAIL, and the next port is tried, so a peer's
//!   typed connections get 1023, 1022, ...
//! - **Descriptors**: EMFILE / ENFILE at accept pauses accepting with a doubling back-off (no
//!   busy loop), and a connection accepted into the last `fd_reserve` descriptors is shed, as
//!   the tcp fabric does.

mod config;
mod lnd_driver;
pub use lnd_driver::SockFabric;
#[cfg(test)]
mod tests;

pub use config::*;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use tracing::{debug, trace, warn};

use crate::driver::uring_sock::{accept_failed, tag, untag, GEN_BITS};
use crate::driver::Doorbell;
use crate::handle::{Handle, HandleSlab, Tag};
use crate::stream::{
    CloseMode, DialError, EndReason, IncomingId, RecvTarget, SendId, SendPayload, SockOpts,
    StreamAction, StreamEvent, StreamId, StreamSink,
};
use crate::sys::uring::{self, Completion, Ring, RingStats};
use crate::time::Instant;

/// The tag of [`SockId`].
#[derive(Debug)]
enum SockTag {}

impl Tag for SockTag {
    const NAME: &'static str = "socket";
}

/// A socket's slot and generation: a late completion for a freed socket never reaches the
/// next one in its slot. Also the [`IncomingId`] of an accepted socket.
type SockId = Handle<SockTag>;

coded_enum! {
    /// The kind of an io_uring operation, in the top bits of its user_data.
    enum OpTag {
        /// An accept; the handle's index is the listener's number.
        Accept = 1,
        Connect = 2,
        PollIn = 3,
        PollOut = 4,
        Cancel = 5,
        /// A watched descriptor; the handle's index is its place in `watched`.
        Waker = 6,
        SendZc = 7,
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum State {
    /// Accepted; waiting for the engine's `Adopt` or `Refuse`.
    Incoming,
    /// A dial's connect is in flight.
    Connecting,
    /// Connected and the engine's.
    Open,
    /// Closed gracefully by the engine: flushing, then (`shut_wr`) reading to EOF, until
    /// `deadline`.
    Closing {
        deadline: std::time::Instant,
        shut_wr: bool,
    },
    /// Done: the descriptor closes once the ring let go of it.
    Dead,
}

/// A posted receive, and the bytes of a `Mem` target already in.
#[derive(Debug)]
struct Rx {
    target: RecvTarget,
    filled: u32,
}

/// A send not yet wholly in the socket.
#[derive(Debug)]
struct Tx {
    id: SendId,
    head: Vec<u8>,
    payload: SendPayload,
    /// Bytes of head + payload written.
    off: usize,
}

impl Tx {
    fn total(&self) -> usize {
        self.head.len() + self.payload.len()
    }
}

/// What a dial is trying: the next source port, down to `ports_to` (`next` 0: the system
/// picks).
#[derive(Debug)]
struct Dial {
    local: Ipv4Addr,
    next: u16,
    ports_to: u16,
    remote: SocketAddrV4,
}

struct Sock {
    fd: Option<OwnedFd>,
    state: State,
    /// The engine's name for it (adopted or dialled, until `Close`): reports go out under it.
    stream: Option<StreamId>,
    /// Ring operations in flight on the descriptor: it is closed only when this is zero.
    ops: u32,
    poll_in: bool,
    poll_out: bool,
    cancelled: bool,
    /// `Ended` was reported (or the stream failed under a send): no more I/O but the close.
    ended: bool,
    in_ready: bool,
    recv: Option<Rx>,
    sends: VecDeque<Tx>,
    /// The front send's zero-copy part: a send completion still to come, and notifications.
    zc_result: bool,
    zc_notifs: u32,
    dial: Option<Box<Dial>>,
}

impl Sock {
    fn new(fd: OwnedFd, state: State, stream: Option<StreamId>) -> Sock {
        Sock {
            fd: Some(fd),
            ..Sock::new_empty(state, stream)
        }
    }

    /// Heap bytes this socket holds beyond its slot (queued sends and their buffers).
    fn heap_bytes(&self) -> usize {
        let sends: usize = self
            .sends
            .iter()
            .map(|t| {
                t.head.capacity()
                    + match &t.payload {
                        SendPayload::Bytes(b) => b.capacity(),
                        _ => 0,
                    }
            })
            .sum();
        sends
            + self.sends.capacity() * std::mem::size_of::<Tx>()
            + self
                .dial
                .as_ref()
                .map_or(0, |_| std::mem::size_of::<Dial>())
    }
}

/// A report decided in `apply`, delivered at the start of the next `poll` (if the stream is
/// still the engine's then).
#[derive(Debug)]
enum Report {
    Listening(SocketAddrV4),
    ListenFailed(i32),
    DialFailed(SockId, StreamId, DialError),
    Sent(SockId, StreamId, SendId, Result<(), EndReason>),
    Ended(SockId, StreamId, EndReason),
}

/// Stream driver over TCP sockets on io_uring (see the module doc).
pub struct SocketDriver {
    /// First field, so it drops first: in-flight operations are cancelled before the sockets
    /// and the memory they use go.
    ring: Ring,
    cfg: SocketConfig,
    socks: HandleSlab<Sock, SockTag>,
    by_stream: HashMap<StreamId, SockId>,
    listener: Option<OwnedFd>,
    /// The listener's number (in the accept's tag), so an accept of a replaced listener is
    /// recognised.
    listener_no: u32,
    accept_armed: bool,
    /// Listeners closed while their accept was in flight, and how many such accepts remain.
    retired: Vec<OwnedFd>,
    retired_accepts: u32,
    accept_pause: Option<std::time::Instant>,
    accept_backoff: std::time::Duration,
    /// After a pause, accept one connection at a time until one is kept: a multishot accept
    /// would take the whole backlog at once only for it to be shed.
    accept_probe: bool,
    fd_warned: Option<std::time::Instant>,
    out: VecDeque<Report>,
    ready: Vec<SockId>,
    /// Gracefully closing sockets (checked against their deadline in each poll).
    closing: Vec<SockId>,
    cqes: Vec<Completion>,
    /// The one read buffer of `Recv { Bytes }`.
    rbuf: Vec<u8>,
    watched: Vec<(RawFd, bool)>,
    waker_fd: Option<RawFd>,
    woken: bool,
    bell: Option<Doorbell>,
    stats: SocketStats,
}

impl SocketDriver {
    /// A driver with its own io_uring; it listens and dials only when told to.
    pub fn new(cfg: SocketConfig) -> io::Result<SocketDriver> {
        let ring = Ring::new(cfg.ring_entries.max(8))?;
        let rbuf = vec![0; cfg.read_buffer.max(1)];
        Ok(SocketDriver {
            ring,
            cfg,
            socks: HandleSlab::with_generation_bits(GEN_BITS),
            by_stream: HashMap::new(),
            listener: None,
            listener_no: 0,
            accept_armed: false,
            retired: Vec::new(),
            retired_accepts: 0,
            accept_pause: None,
            accept_backoff: ACCEPT_BACKOFF_MIN,
            accept_probe: false,
            fd_warned: None,
            out: VecDeque::new(),
            ready: Vec::new(),
            closing: Vec::new(),
            cqes: Vec::new(),
            rbuf,
            watched: Vec::new(),
            waker_fd: None,
            woken: false,
            bell: None,
            stats: SocketStats::default(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> &SocketStats {
        &self.stats
    }

    /// The io_uring counters.
    pub fn ring_stats(&self) -> &RingStats {
        self.ring.stats()
    }

    /// Sockets held (incoming, streams, closing).
    pub fn sockets(&self) -> usize {
        self.socks.len()
    }

    /// User-space bytes the driver holds for its sockets: the socket table, the stream map and
    /// what each socket queues (not the one read buffer, which is shared by all). Divided by
    /// [`SocketDriver::sockets`], the memory of one socket.
    pub fn socket_memory(&self) -> usize {
        let table = self.socks.capacity() * std::mem::size_of::<Option<(u32, Sock)>>();
        // A hashbrown entry plus its control byte.
        let map = self.by_stream.capacity() * (std::mem::size_of::<(StreamId, SockId)>() + 1);
        let heap: usize = self.socks.iter().map(|(_, s)| s.heap_bytes()).sum();
        table + map + heap
    }

    /// The counters of [`SocketStats::counters`], then the gauges `sockets` and
    /// `socket_memory`.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.stats.counters();
        v.push(("sockets", self.socks.len() as u64));
        v.push(("socket_memory", self.socket_memory() as u64));
        v
    }

    /// See `Driver::set_waker`.
    pub fn set_waker(&mut self, fd: RawFd) {
        self.waker_fd = Some(fd);
        self.watch(fd);
    }

    /// See `Driver::set_doorbell`: the busy-poll looks at its flag in every round.
    pub fn set_doorbell(&mut self, bell: Doorbell) {
        self.bell = Some(bell);
    }

    /// See `Driver::readiness_fd`: the ring.
    pub fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.ring.raw_fd())
    }

    /// See `Driver::watch`.
    pub fn watch(&mut self, fd: RawFd) -> bool {
        self.watched.push((fd, false));
        true
    }

    /// See `Driver::has_queued_work`.
    pub fn has_queued_work(&self) -> bool {
        !self.out.is_empty() || !self.ready.is_empty() || self.ring.has_unsubmitted()
    }

    /// See `Driver::take_woken`.
    pub fn take_woken(&mut self) -> bool {
        std::mem::take(&mut self.woken)
    }

    /// See `Driver::abandon`: every socket and the listener are shut down by plain system
    /// calls, so that peers see the end at once; descriptors close when the driver drops.
    pub fn abandon(&mut self) {
        if let Some(l) = &self.listener {
            let _ = rustix::net::shutdown(l, rustix::net::Shutdown::Both);
        }
        for (_, s) in self.socks.iter() {
            if let Some(fd) = &s.fd {
                let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
            }
        }
        self.accept_armed = false;
    }

    // -----------------------------------------------------------------------------------------
    // Actions

    /// Queues one action from the engine. Nothing blocks: sockets are created and bound here,
    /// I/O happens in [`SocketDriver::poll`], which also reports what `apply` decided.
    pub fn apply(&mut self, now: Instant, action: StreamAction) {
        trace!(%now, ?action, "socket driver apply");
        match action {
            StreamAction::Listen { addr, backlog } => self.listen(addr, backlog),
            StreamAction::Unlisten => self.unlisten(),
            StreamAction::Adopt { incoming, stream } => self.adopt(incoming, stream),
            StreamAction::Refuse { incoming } => self.refuse(incoming),
            StreamAction::Dial {
                stream,
                local,
                ports_from,
                ports_to,
                remote,
            } => self.dial(stream, local, ports_from, ports_to, remote),
            StreamAction::Configure { stream, opts } => self.configure(stream, opts),
            StreamAction::Recv { stream, target } => self.post_recv(stream, target),
            StreamAction::Send {
                stream,
                id,
                head,
                payload,
            } => self.send(stream, id, head, payload),
            StreamAction::Close { stream, mode } => self.close(stream, mode),
        }
    }

    fn lookup(&mut self, stream: StreamId) -> Option<SockId> {
        let sock = self.by_stream.get(&stream).copied();
        if sock.is_none() {
            self.stats.unknown_actions += 1;
        }
        sock
    }

    fn listen(&mut self, addr: SocketAddrV4, backlog: u32) {
        self.unlisten();
        match listen_socket(addr, backlog) {
            Ok((fd, local)) => {
                self.listener = Some(fd);
                self.listener_no = self.listener_no.wrapping_add(1);
                self.accept_pause = None;
                self.accept_backoff = ACCEPT_BACKOFF_MIN;
                self.out.push_back(Report::Listening(local));
            }
            Err(e) => {
                debug!(%addr, error = %e, "socket driver: cannot listen");
                self.out
                    .push_back(Report::ListenFailed(e.raw_os_error().unwrap_or(libc::EIO)));
            }
        }
    }

    fn unlisten(&mut self) {
        let Some(fd) = self.listener.take() else {
            return;
        };
        if self.accept_armed {
            // The ring holds the listener until its accept ends: cancel it, close after.
            self.ring.cancel_fd(fd.as_fd(), tag(OpTag::Cancel, NO_SOCK));
            self.accept_armed = false;
            self.retired_accepts += 1;
            self.retired.push(fd);
        }
    }

    fn adopt(&mut self, incoming: IncomingId, stream: StreamId) {
        let sock = SockId::from_u64(incoming.0);
        let taken = self.by_stream.contains_key(&stream);
        match self.socks.get_mut(sock) {
            Some(s) if s.state == State::Incoming && !taken => {
                s.state = State::Open;
                s.stream = Some(stream);
                self.by_stream.insert(stream, sock);
            }
            _ => {
                self.stats.unknown_actions += 1;
                if !taken {
                    // Nothing to adopt (refused or shed meanwhile): the engine learns at once.
                    self.out
                        .push_back(Report::Ended(NO_SOCK, stream, EndReason::Reset));
                }
            }
        }
    }

    fn refuse(&mut self, incoming: IncomingId) {
        let sock = SockId::from_u64(incoming.0);
        match self.socks.get(sock) {
            Some(s) if s.state == State::Incoming => {
                self.stats.refused += 1;
                self.kill(sock, true);
            }
            _ => self.stats.unknown_actions += 1,
        }
    }

    fn dial(
        &mut self,
        stream: StreamId,
        local: Ipv4Addr,
        ports_from: u16,
        ports_to: u16,
        remote: SocketAddrV4,
    ) {
        self.stats.dials += 1;
        if self.by_stream.contains_key(&stream) {
            self.stats.bad_actions += 1;
            return;
        }
        let dial = Box::new(Dial {
            local,
            next: ports_from,
            ports_to: ports_to.min(ports_from),
            remote,
        });
        let sock = self.socks.insert(Sock {
            dial: Some(dial),
            ..Sock::new_empty(State::Connecting, Some(stream))
        });
        self.by_stream.insert(stream, sock);
        self.try_dial(sock);
    }

    /// Binds a new socket to the dial's next free port and starts its connect; or fails the
    /// dial.
    fn try_dial(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        let Some(d) = s.dial.as_mut() else {
            return;
        };
        let res = bind_from(d.local, &mut d.next, d.ports_to, &mut self.stats);
        let remote = d.remote;
        match res {
            Ok(fd) => {
                self.ring
                    .connect(fd.as_fd(), remote.into(), tag(OpTag::Connect, sock));
                s.fd = Some(fd);
                s.ops += 1;
            }
            Err(e) => self.dial_failed(sock, e),
        }
    }

    fn dial_failed(&mut self, sock: SockId, e: DialError) {
        match e {
            DialError::NoPorts => self.stats.dial_no_ports += 1,
            DialError::NotPermitted => self.stats.dial_not_permitted += 1,
            DialError::Refused => self.stats.dial_refused += 1,
            DialError::Unreachable => self.stats.dial_unreachable += 1,
            DialError::Other(_) => self.stats.dial_other += 1,
        }
        // The stream stays mapped until the report goes out, so that a Close before that
        // drops it (nothing is reported after Close).
        if let Some(stream) = self.socks[sock].stream {
            self.out.push_back(Report::DialFailed(sock, stream, e));
        }
        self.kill(sock, false);
    }

    fn configure(&mut self, stream: StreamId, opts: SockOpts) {
        let Some(sock) = self.lookup(stream) else {
            return;
        };
        let Some(fd) = self.socks[sock].fd.as_ref() else {
            return;
        };
        if let Err(e) = set_options(fd.as_fd(), &opts) {
            self.stats.option_errors += 1;
            debug!(?stream, error = %e, "socket driver: a socket option failed");
        }
    }

    fn post_recv(&mut self, stream: StreamId, target: RecvTarget) {
        let Some(sock) = self.lookup(stream) else {
            return;
        };
        let s = &mut self.socks[sock];
        let bad = match &target {
            RecvTarget::Bytes { max } => *max == 0,
            RecvTarget::Mem { mem, offset, len } => {
                *len == 0 || span(mem.len(), *offset, u64::from(*len)).is_none()
            }
        };
        if s.recv.is_some() || bad {
            // A second Recv, or memory that is not there: the engine's bug, not the peer's.
            self.stats.bad_actions += 1;
            debug!(
                ?stream,
                ?target,
                "socket driver: bad Recv, the stream fails"
            );
            if !s.ended {
                s.ended = true;
                self.out
                    .push_back(Report::Ended(sock, stream, EndReason::Error(libc::EINVAL)));
            }
            return;
        }
        if s.ended {
            return;
        }
        s.recv = Some(Rx { target, filled: 0 });
        self.make_ready(sock);
    }

    fn send(&mut self, stream: StreamId, id: SendId, head: Vec<u8>, payload: SendPayload) {
        let Some(sock) = self.lookup(stream) else {
            return;
        };
        let bad = match &payload {
            SendPayload::Mem { mem, offset, len } => {
                span(mem.len(), *offset, u64::from(*len)).is_none()
            }
            _ => false,
        } || head.len() + payload.len() == 0;
        let s = &mut self.socks[sock];
        if bad || s.ended {
            if bad {
                self.stats.bad_actions += 1;
            }
            let why = if bad {
                EndReason::Error(libc::EINVAL)
            } else {
                EndReason::Reset
            };
            self.out.push_back(Report::Sent(sock, stream, id, Err(why)));
            return;
        }
        s.sends.push_back(Tx {
            id,
            head,
            payload,
            off: 0,
        });
        self.make_ready(sock);
    }

    fn close(&mut self, stream: StreamId, mode: CloseMode) {
        let Some(sock) = self.by_stream.remove(&stream) else {
            // A dial whose failure was reported is forgotten then: closing it is no error.
            return;
        };
        let Some(s) = self.socks.get_mut(sock).filter(|s| s.state != State::Dead) else {
            return; // a failed dial whose report is dropped now
        };
        s.stream = None;
        s.recv = None;
        let graceful = mode == CloseMode::Graceful && s.state == State::Open && s.fd.is_some();
        if !graceful {
            self.stats.aborted_closes += 1;
            self.kill(sock, true);
            return;
        }
        self.stats.graceful_closes += 1;
        s.state = State::Closing {
            deadline: std::time::Instant::now() + self.cfg.close_bound,
            shut_wr: false,
        };
        self.closing.push(sock);
        self.make_ready(sock);
    }

    /// Ends the socket: (with `reset`, SO_LINGER 0 first, so the close sends RST) cancels its
    /// ring operations and closes it once they are over.
    fn kill(&mut self, sock: SockId, reset: bool) {
        let s = &mut self.socks[sock];
        s.state = State::Dead;
        s.stream = None;
        s.recv = None;
        s.sends.clear();
        if let Some(fd) = &s.fd {
            if reset {
                let _ =
                    rustix::net::sockopt::set_socket_linger(fd, Some(std::time::Duration::ZERO));
            }
            if s.ops > 0 && !s.cancelled {
                s.cancelled = true;
                self.ring.cancel_fd(fd.as_fd(), tag(OpTag::Cancel, sock));
                s.ops += 1;
            }
        }
        self.maybe_free(sock);
    }

    fn maybe_free(&mut self, sock: SockId) {
        if let Some(s) = self.socks.get(sock) {
            if s.state == State::Dead && s.ops == 0 {
                // Dropping the descriptor closes it (a FIN, or RST after SO_LINGER 0).
                self.socks.remove(sock);
            }
        }
    }

    fn make_ready(&mut self, sock: SockId) {
        if let Some(s) = self.socks.get_mut(sock) {
            if !s.in_ready {
                s.in_ready = true;
                self.ready.push(sock);
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // The poll loop

    /// Submits queued work, waits up to `timeout` for something to happen (not at all when
    /// actions applied since the last poll left work), reads the clock once with `now`, does
    /// the reads and writes the sockets allow and pushes everything that happened into `sink`.
    /// Drain the sink's actions into [`SocketDriver::apply`] before calling it again.
    pub fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        sink: &mut dyn StreamSink,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()> {
        // Work applied since the last poll (reports, sockets to read or write) is done after
        // a wait of zero, so that the clock is read once, after the wait, as `Driver::poll`
        // says.
        let mut timeout = if !self.out.is_empty() || !self.ready.is_empty() {
            Some(std::time::Duration::ZERO)
        } else {
            timeout
        };
        let at = std::time::Instant::now();
        if let Some(until) = self.accept_pause {
            if until <= at {
                self.accept_pause = None;
            } else {
                timeout = Some(timeout.map_or(until - at, |t| t.min(until - at)));
            }
        }
        if let Some(d) = self.next_close_deadline() {
            let left = d.saturating_duration_since(at);
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        if !self.accept_armed && self.accept_pause.is_none() {
            if let Some(l) = &self.listener {
                let t = tag(OpTag::Accept, SockId::from_parts(self.listener_no, 0));
                if self.accept_probe {
                    self.ring.accept_one(l.as_fd(), t);
                } else {
                    self.ring.accept_multi(l.as_fd(), t);
                }
                self.accept_armed = true;
            }
        }
        for (i, w) in self.watched.iter_mut().enumerate() {
            if w.0 >= 0 && !w.1 {
                self.ring
                    .poll_readable(w.0, tag(OpTag::Waker, SockId::from_parts(i as u32, 0)));
                w.1 = true;
            }
        }
        self.wait(timeout)?;
        let t = now();
        self.flush_out(sink, t);
        let mut cqes = std::mem::take(&mut self.cqes);
        self.ring.reap(&mut cqes);
        for c in cqes.drain(..) {
            self.complete(c, sink, t);
        }
        self.cqes = cqes;
        self.run_ready(sink, t);
        self.flush_out(sink, t);
        self.check_close_deadlines();
        // A storm of connections leaves the tables' capacity behind when it is over: give it
        // back (live handles stay valid; the slab shrinks down to its highest live key).
        if self.socks.capacity() > 1024 && self.socks.len() * 4 < self.socks.capacity() {
            self.socks.shrink_to_fit();
        }
        if self.by_stream.capacity() > 1024 && self.by_stream.len() * 4 < self.by_stream.capacity()
        {
            self.by_stream.shrink_to(self.by_stream.len() * 2);
        }
        // What the last pass armed goes to the kernel now, not at the next wait.
        if self.ring.has_unsubmitted() {
            self.ring.submit_and_wait(Some(std::time::Duration::ZERO))?;
        }
        Ok(())
    }

    /// Busy-polls the ring first (bounded by `busy_poll` and `timeout`), as the tcp fabric
    /// does and for the same reasons (`crate::driver::spin_on_ring`: yielding between rounds,
    /// and looking at the doorbell in each, so a wake-up from another thread costs no byte
    /// while the loop spins). Then sleeps in the kernel for the rest.
    fn wait(&mut self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        let spin = timeout.map_or(self.cfg.busy_poll, |t| t.min(self.cfg.busy_poll));
        if crate::driver::spin_on_ring(&mut self.ring, self.bell.as_ref(), spin)? {
            return Ok(());
        }
        self.ring
            .submit_and_wait(timeout.map(|t| t.saturating_sub(spin)))
    }

    fn flush_out(&mut self, sink: &mut dyn StreamSink, now: Instant) -> usize {
        let mut n = 0;
        while let Some(r) = self.out.pop_front() {
            // A report for a stream closed since is dropped: nothing after Close.
            let live = |sock: SockId, stream: StreamId| {
                sock == NO_SOCK && !self.by_stream.contains_key(&stream)
                    || self.by_stream.get(&stream) == Some(&sock)
            };
            let ev = match r {
                Report::Listening(local) => StreamEvent::Listening { local },
                Report::ListenFailed(errno) => StreamEvent::ListenFailed { errno },
                Report::DialFailed(sock, stream, error) if live(sock, stream) => {
                    self.by_stream.remove(&stream);
                    StreamEvent::DialFailed { stream, error }
                }
                Report::Sent(sock, stream, id, result) if live(sock, stream) => {
                    StreamEvent::Sent { stream, id, result }
                }
                Report::Ended(sock, stream, why) if live(sock, stream) => {
                    self.count_end(why);
                    StreamEvent::Ended { stream, why }
                }
                Report::DialFailed(..) | Report::Sent(..) | Report::Ended(..) => continue,
            };
            sink.stream_event(now, ev);
            n += 1;
        }
        n
    }

    fn count_end(&mut self, why: EndReason) {
        match why {
            EndReason::Eof => self.stats.ended_eof += 1,
            EndReason::Reset => self.stats.ended_reset += 1,
            EndReason::TimedOut => self.stats.ended_timeout += 1,
            EndReason::Error(_) => self.stats.ended_error += 1,
        }
    }

    fn next_close_deadline(&self) -> Option<std::time::Instant> {
        self.closing
            .iter()
            .filter_map(|&s| match self.socks.get(s).map(|s| s.state) {
                Some(State::Closing { deadline, .. }) => Some(deadline),
                _ => None,
            })
            .min()
    }

    /// Resets the graceful closes that outlived `close_bound` (a peer that does not read, or
    /// does not close), and forgets the finished ones.
    fn check_close_deadlines(&mut self) {
        if self.closing.is_empty() {
            return;
        }
        let at = std::time::Instant::now();
        let mut closing = std::mem::take(&mut self.closing);
        closing.retain(|&sock| match self.socks.get(sock).map(|s| s.state) {
            Some(State::Closing { deadline, .. }) if deadline <= at => {
                self.stats.close_bound_hits += 1;
                debug!(?sock, "socket driver: graceful close hit its bound, reset");
                self.kill(sock, true);
                false
            }
            Some(State::Closing { .. }) => true,
            _ => false,
        });
        self.closing = closing;
    }

    fn run_ready(&mut self, sink: &mut dyn StreamSink, now: Instant) -> usize {
        let mut n = 0;
        let mut ready = std::mem::take(&mut self.ready);
        for sock in ready.drain(..) {
            let Some(s) = self.socks.get_mut(sock) else {
                continue;
            };
            s.in_ready = false;
            n += self.service(sock, sink, now);
        }
        if self.ready.is_empty() {
            self.ready = ready;
        }
        n
    }

    /// Moves what the socket can move now: queued sends, then the posted receive (or, while
    /// closing, the drain to EOF). Arms a readiness watch where it would block. Returns the
    /// number of events reported.
    fn service(&mut self, sock: SockId, sink: &mut dyn StreamSink, now: Instant) -> usize {
        let state = self.socks[sock].state;
        if !matches!(state, State::Open | State::Closing { .. }) || self.socks[sock].fd.is_none() {
            return 0;
        }
        let mut n = self.write(sock, sink, now);
        let s = &mut self.socks[sock];
        if s.state == State::Dead {
            return n;
        }
        if let State::Closing { deadline, shut_wr } = s.state {
            if !shut_wr && s.sends.is_empty() && s.zc_notifs == 0 && !s.zc_result {
                if let Some(fd) = &s.fd {
                    let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Write);
                }
                s.state = State::Closing {
                    deadline,
                    shut_wr: true,
                };
            }
            if matches!(s.state, State::Closing { shut_wr: true, .. }) {
                self.drain(sock);
            }
            return n;
        }
        if !s.ended && s.recv.is_some() {
            n += self.read(sock, sink, now);
        }
        n
    }

    fn arm_poll(&mut self, sock: SockId, out: bool) {
        let s = &mut self.socks[sock];
        let Some(fd) = &s.fd else {
            return;
        };
        let armed = if out { &mut s.poll_out } else { &mut s.poll_in };
        if *armed {
            return;
        }
        *armed = true;
        let (op, mask) = if out {
            (OpTag::PollOut, libc::POLLOUT as u32)
        } else {
            (OpTag::PollIn, libc::POLLIN as u32)
        };
        self.ring.poll_mask(fd.as_fd(), mask, tag(op, sock));
        s.ops += 1;
    }

    /// Reads for the posted receive until it is served or the socket has nothing more.
    fn read(&mut self, sock: SockId, sink: &mut dyn StreamSink, now: Instant) -> usize {
        let mut n = 0;
        loop {
            let s = &mut self.socks[sock];
            let (Some(fd), Some(rx), Some(stream)) = (&s.fd, &mut s.recv, s.stream) else {
                return n;
            };
            let res = match &rx.target {
                RecvTarget::Bytes { max } => {
                    let max = (*max as usize).min(self.rbuf.len());
                    recv_into(fd, &mut self.rbuf[..max])
                }
                RecvTarget::Mem { mem, offset, len } => {
                    let start = *offset as usize + rx.filled as usize;
                    let end = *offset as usize + *len as usize;
                    // Straight into LNet's memory, under its lock, for one non-blocking call.
                    mem.with(|b| recv_into(fd, &mut b[start..end]))
                }
            };
            match res {
                Ok(0) => {
                    self.ended(sock, stream, EndReason::Eof, sink, now);
                    return n + 1;
                }
                Ok(k) => {
                    self.stats.bytes_in += k as u64;
                    n += 1;
                    let done = match &rx.target {
                        RecvTarget::Bytes { .. } => true,
                        RecvTarget::Mem { len, .. } => {
                            rx.filled += k as u32;
                            rx.filled >= *len
                        }
                    };
                    let ev = match &rx.target {
                        RecvTarget::Bytes { .. } => StreamEvent::Data {
                            stream,
                            bytes: &self.rbuf[..k],
                        },
                        RecvTarget::Mem { .. } => StreamEvent::Filled {
                            stream,
                            n: k as u32,
                        },
                    };
                    if done {
                        s.recv = None;
                    }
                    sink.stream_event(now, ev);
                    if done {
                        return n;
                    }
                }
                Err(Errno::AGAIN) => {
                    self.arm_poll(sock, false);
                    return n;
                }
                Err(Errno::INTR) => {}
                Err(e) => {
                    self.ended(sock, stream, end_reason(e.raw_os_error()), sink, now);
                    return n + 1;
                }
            }
        }
    }

    /// A gracefully closing socket whose FIN is out: reads and drops until the peer's EOF (or
    /// an error), then closes.
    fn drain(&mut self, sock: SockId) {
        loop {
            let s = &mut self.socks[sock];
            let Some(fd) = &s.fd else {
                return;
            };
            match recv_into(fd, &mut self.rbuf) {
                Ok(0) => return self.kill(sock, false),
                Ok(k) => self.stats.bytes_in += k as u64,
                Err(Errno::AGAIN) => return self.arm_poll(sock, false),
                Err(Errno::INTR) => {}
                Err(_) => return self.kill(sock, false),
            }
        }
    }

    /// Writes the queued sends, in order, until the socket is full or the queue empty.
    fn write(&mut self, sock: SockId, sink: &mut dyn StreamSink, now: Instant) -> usize {
        let mut n = 0;
        let (zc, threshold) = (self.cfg.zero_copy, self.cfg.zc_threshold as usize);
        loop {
            let s = &mut self.socks[sock];
            if s.zc_result || s.zc_notifs > 0 || (s.ended && s.stream.is_some()) {
                return n; // a zero-copy send in flight, or the stream failed
            }
            let (Some(fd), Some(tx)) = (&s.fd, s.sends.front_mut()) else {
                return n;
            };
            let total = tx.total();
            if tx.off >= total {
                // Wholly in the socket (and the kernel let go of any zero-copy memory).
                let Some(tx) = s.sends.pop_front() else {
                    return n;
                };
                if let Some(stream) = s.stream {
                    sink.stream_event(
                        now,
                        StreamEvent::Sent {
                            stream,
                            id: tx.id,
                            result: Ok(()),
                        },
                    );
                    n += 1;
                }
                continue;
            }
            let hl = tx.head.len();
            let res = match &tx.payload {
                SendPayload::Mem { mem, offset, len }
                    if zc && *len as usize >= threshold && tx.off >= hl =>
                {
                    let from = *offset as usize + (tx.off - hl);
                    let left = total - tx.off;
                    self.ring.send_zc(
                        fd.as_fd(),
                        mem.clone(),
                        from,
                        left,
                        tag(OpTag::SendZc, sock),
                    );
                    s.ops += 1;
                    s.zc_result = true;
                    self.stats.zc_sends += 1;
                    return n;
                }
                SendPayload::Mem { mem, offset, len } => {
                    // Head then payload, one call; the payload read in place under its lock.
                    let zc_next = zc && *len as usize >= threshold;
                    mem.with(|b| {
                        let p = &b[*offset as usize..*offset as usize + *len as usize];
                        if zc_next {
                            // Only the head: the payload goes zero-copy after it.
                            send_two(fd, &tx.head[tx.off..], &[], true)
                        } else if tx.off < hl {
                            send_two(fd, &tx.head[tx.off..], p, false)
                        } else {
                            send_two(fd, &p[tx.off - hl..], &[], false)
                        }
                    })
                }
                SendPayload::Bytes(p) => {
                    if tx.off < hl {
                        send_two(fd, &tx.head[tx.off..], p, false)
                    } else {
                        send_two(fd, &p[tx.off - hl..], &[], false)
                    }
                }
                SendPayload::None => send_two(fd, &tx.head[tx.off..], &[], false),
            };
            match res {
                Ok(k) => {
                    tx.off += k;
                    self.stats.bytes_out += k as u64;
                }
                Err(Errno::AGAIN) => {
                    self.arm_poll(sock, true);
                    return n;
                }
                Err(Errno::INTR) => {}
                Err(e) => {
                    let why = end_reason(e.raw_os_error());
                    return n + self.send_failed(sock, why, sink, now);
                }
            }
        }
    }

    /// A write failed: every queued send fails with `why`, and the stream ends.
    fn send_failed(
        &mut self,
        sock: SockId,
        why: EndReason,
        sink: &mut dyn StreamSink,
        now: Instant,
    ) -> usize {
        let s = &mut self.socks[sock];
        let sends = std::mem::take(&mut s.sends);
        let Some(stream) = s.stream else {
            // Closing: nothing more is reported; the socket goes.
            self.kill(sock, false);
            return 0;
        };
        let mut n = 0;
        for tx in sends {
            sink.stream_event(
                now,
                StreamEvent::Sent {
                    stream,
                    id: tx.id,
                    result: Err(why),
                },
            );
            n += 1;
        }
        self.ended(sock, stream, why, sink, now);
        n + 1
    }

    /// The stream ended under the engine: reported once; no more I/O until its Close.
    fn ended(
        &mut self,
        sock: SockId,
        stream: StreamId,
        why: EndReason,
        sink: &mut dyn StreamSink,
        now: Instant,
    ) {
        let s = &mut self.socks[sock];
        s.recv = None;
        if std::mem::replace(&mut s.ended, true) {
            return;
        }
        self.count_end(why);
        sink.stream_event(now, StreamEvent::Ended { stream, why });
    }

    fn complete(&mut self, c: Completion, sink: &mut dyn StreamSink, now: Instant) {
        let (op, sock): (Option<OpTag>, SockId) = untag(c.tag);
        match op {
            Some(OpTag::Accept) => return self.on_accept(c, sock.index(), sink, now),
            Some(OpTag::Waker) => {
                let Some(w) = self.watched.get_mut(sock.index() as usize) else {
                    return;
                };
                self.woken |=
                    crate::driver::watch_fired(w, self.waker_fd, c.result, "socket driver");
                return;
            }
            _ => {}
        }
        let Some(s) = self.socks.get_mut(sock) else {
            return; // a listener's cancel, or a late completion for a freed socket
        };
        if !c.more {
            s.ops = s.ops.saturating_sub(1);
        }
        match op {
            Some(OpTag::PollIn) => {
                s.poll_in = false;
                self.make_ready(sock);
            }
            Some(OpTag::PollOut) => {
                s.poll_out = false;
                self.make_ready(sock);
            }
            Some(OpTag::Connect) => self.on_connect(sock, c.result, sink, now),
            Some(OpTag::SendZc) => self.on_send_zc(sock, &c, sink, now),
            _ => {}
        }
        self.maybe_free(sock);
    }

    fn on_send_zc(
        &mut self,
        sock: SockId,
        c: &Completion,
        sink: &mut dyn StreamSink,
        now: Instant,
    ) {
        let s = &mut self.socks[sock];
        if s.zc_result {
            // The send's own completion (a notification follows when `more`).
            s.zc_result = false;
            if c.more {
                s.zc_notifs += 1;
            }
            if c.result < 0 {
                if s.state != State::Dead {
                    let why = end_reason(-c.result);
                    self.send_failed(sock, why, sink, now);
                }
                return;
            }
            self.stats.bytes_out += c.result as u64;
            if let Some(tx) = s.sends.front_mut() {
                tx.off += c.result as usize;
            }
        } else {
            // The notification: the kernel no longer reads the memory.
            s.zc_notifs = s.zc_notifs.saturating_sub(1);
            if c.result & uring::ZC_COPIED != 0 {
                self.stats.zc_copied += 1;
            }
        }
        self.make_ready(sock);
    }

    fn on_connect(&mut self, sock: SockId, res: i32, sink: &mut dyn StreamSink, now: Instant) {
        let s = &mut self.socks[sock];
        if s.state != State::Connecting {
            return;
        }
        if res == 0 {
            s.state = State::Open;
            s.dial = None;
            let local =
                s.fd.as_ref()
                    .and_then(|fd| rustix::net::getsockname(fd).ok())
                    .and_then(|a| SocketAddrV4::try_from(a).ok())
                    .unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
            if let Some(stream) = s.stream {
                sink.stream_event(now, StreamEvent::Connected { stream, local });
            }
            self.make_ready(sock);
            return;
        }
        let errno = -res;
        let ranged = s
            .dial
            .as_ref()
            .is_some_and(|d| d.next != 0 && d.next > d.ports_to);
        if matches!(errno, libc::EADDRINUSE | libc::EADDRNOTAVAIL) && ranged {
            // This port already carries a connection to that peer: the next one.
            self.stats.dial_ports_skipped += 1;
            s.fd = None;
            if let Some(d) = s.dial.as_mut() {
                d.next -= 1;
            }
            return self.try_dial(sock);
        }
        let e = match errno {
            libc::ECONNREFUSED => DialError::Refused,
            libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH => DialError::Unreachable,
            libc::EADDRINUSE | libc::EADDRNOTAVAIL
                if s.dial.as_ref().is_some_and(|d| d.next != 0) =>
            {
                DialError::NoPorts
            }
            e => DialError::Other(e),
        };
        debug!(errno, "socket driver: dial failed");
        self.dial_failed(sock, e);
        // Reported at the end of this poll with the rest.
        self.flush_out(sink, now);
    }

    fn on_accept(
        &mut self,
        c: Completion,
        listener_no: u32,
        sink: &mut dyn StreamSink,
        now: Instant,
    ) {
        let current = listener_no == self.listener_no && self.listener.is_some();
        if !c.more {
            if current {
                self.accept_armed = false;
            } else {
                self.retired_accepts = self.retired_accepts.saturating_sub(1);
                if self.retired_accepts == 0 {
                    self.retired.clear();
                }
            }
        }
        let Some(fd) = c.fd else {
            if current {
                let errors = &mut self.stats.accept_errors;
                if let Some(errno) = accept_failed(c.result, errors, "socket driver") {
                    self.pause_accept(errno);
                }
            }
            return;
        };
        if !current {
            return; // accepted by a listener closed since: dropped
        }
        self.stats.accepted += 1;
        if fd_short(fd.as_raw_fd(), self.cfg.fd_reserve) {
            self.stats.accepts_shed += 1;
            let _ = rustix::net::sockopt::set_socket_linger(&fd, Some(std::time::Duration::ZERO));
            drop(fd);
            self.pause_accept(libc::EMFILE);
            return;
        }
        if self.accept_pause.is_none() {
            self.accept_backoff = ACCEPT_BACKOFF_MIN;
            self.accept_probe = false;
        }
        let addrs = rustix::io::ioctl_fionbio(&fd, true).ok().and_then(|()| {
            let peer = rustix::net::getpeername(&fd).ok()??;
            let local = rustix::net::getsockname(&fd).ok()?;
            Some((
                SocketAddrV4::try_from(peer).ok()?,
                SocketAddrV4::try_from(local).ok()?,
            ))
        });
        let Some((peer, local)) = addrs else {
            // Gone already (reset before we looked), or not IPv4.
            return;
        };
        let sock = self.socks.insert(Sock::new(fd, State::Incoming, None));
        sink.stream_event(
            now,
            StreamEvent::Incoming {
                incoming: IncomingId(sock.as_u64()),
                peer,
                local,
            },
        );
    }

    /// Stops accepting for the current back-off (then doubles it), as the tcp fabric does:
    /// re-arming at once would fail again at once and spin the loop. Connections wait in the
    /// listen backlog meanwhile.
    fn pause_accept(&mut self, errno: i32) {
        if self.accept_pause.is_some() {
            return;
        }
        self.stats.emfile += 1;
        let pause = self.accept_backoff;
        self.accept_backoff = (pause * 2).min(ACCEPT_BACKOFF_MAX);
        let t = std::time::Instant::now();
        self.accept_pause = Some(t + pause);
        self.accept_probe = true;
        if self.accept_armed {
            if let Some(l) = &self.listener {
                self.ring.cancel_fd(l.as_fd(), tag(OpTag::Cancel, NO_SOCK));
            }
        }
        if self
            .fd_warned
            .is_none_or(|w| t.duration_since(w) >= std::time::Duration::from_secs(10))
        {
            warn!(
                errno,
                pause_ms = pause.as_millis() as u64,
                emfile = self.stats.emfile,
                "socket driver: at the descriptor limit (RLIMIT_NOFILE); accepting paused \
                 (logged at most every 10 s)"
            );
            self.fd_warned = Some(t);
        }
    }
}

impl Sock {
    fn new_empty(state: State, stream: Option<StreamId>) -> Sock {
        Sock {
            fd: None,
            state,
            stream,
            ops: 0,
            poll_in: false,
            poll_out: false,
            cancelled: false,
            ended: false,
            in_ready: false,
            recv: None,
            sends: VecDeque::new(),
            zc_result: false,
            zc_notifs: 0,
            dial: None,
        }
    }
}

/// The handle in user_data of operations that are no socket's: generation 0, which no socket
/// has.
const NO_SOCK: SockId = Handle::from_parts(0, 0);

/// The slice `[off, off + len)` of a buffer of `size` bytes, if it lies inside.
fn span(size: usize, off: u64, len: u64) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(off).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    (end <= size).then_some(start..end)
}

fn end_reason(errno: i32) -> EndReason {
    match errno {
        libc::ECONNRESET | libc::EPIPE => EndReason::Reset,
        libc::ETIMEDOUT => EndReason::TimedOut,
        e => EndReason::Error(e),
    }
}

/// True if descriptor `fd` leaves fewer than `reserve` descriptors under RLIMIT_NOFILE
/// (descriptors are allocated lowest first, so every number below `fd` is open).
fn fd_short(fd: RawFd, reserve: u32) -> bool {
    if reserve == 0 {
        return false;
    }
    match uring::nofile_limit() {
        Ok(Some(limit)) => u64::try_from(fd).unwrap_or(0) + u64::from(reserve) >= limit,
        _ => false,
    }
}

fn recv_into(fd: &OwnedFd, buf: &mut [u8]) -> Result<usize, Errno> {
    rustix::net::recv(fd, buf, RecvFlags::DONTWAIT).map(|(n, _)| n)
}

/// One non-blocking `sendmsg` of `a` then `b` (MSG_MORE when more follows at once).
fn send_two(fd: &OwnedFd, a: &[u8], b: &[u8], more: bool) -> Result<usize, Errno> {
    let iov = [io::IoSlice::new(a), io::IoSlice::new(b)];
    let iov = if b.is_empty() { &iov[..1] } else { &iov[..] };
    let mut flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
    if more {
        flags |= SendFlags::MORE;
    }
    rustix::net::sendmsg(fd, iov, &mut Default::default(), flags)
}

/// A non-blocking TCP socket with SO_REUSEADDR and SO_REUSEPORT, as LNet makes every socket
/// (`lib-socket.c:lnet_sock_create`).
fn tcp_socket() -> io::Result<OwnedFd> {
    let fd = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::sockopt::set_socket_reuseport(&fd, true)?;
    Ok(fd)
}

fn listen_socket(addr: SocketAddrV4, backlog: u32) -> io::Result<(OwnedFd, SocketAddrV4)> {
    let fd = tcp_socket()?;
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, i32::try_from(backlog).unwrap_or(i32::MAX))?;
    let local = SocketAddrV4::try_from(rustix::net::getsockname(&fd)?)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    Ok((fd, local))
}

/// A socket bound to `local` at the first free port of `*next` down to `ports_to` (`*next` 0:
/// a port the system picks); `*next` is left at the port bound.
fn bind_from(
    local: Ipv4Addr,
    next: &mut u16,
    ports_to: u16,
    stats: &mut SocketStats,
) -> Result<OwnedFd, DialError> {
    let errno = |e: io::Error| DialError::Other(e.raw_os_error().unwrap_or(libc::EIO));
    loop {
        let fd = tcp_socket().map_err(errno)?;
        match rustix::net::bind(&fd, &SocketAddrV4::new(local, *next)) {
            Ok(()) => return Ok(fd),
            Err(Errno::ACCESS | Errno::PERM) => return Err(DialError::NotPermitted),
            Err(Errno::ADDRINUSE | Errno::ADDRNOTAVAIL) if *next != 0 => {
                if *next <= ports_to {
                    return Err(DialError::NoPorts);
                }
                stats.dial_ports_skipped += 1;
                *next -= 1;
            }
            Err(e) => return Err(DialError::Other(e.raw_os_error())),
        }
    }
}

/// Applies `opts` as ksocklnd does after the HELLO (`socklnd_lib.c:ksocknal_lib_setup_sock`).
fn set_options(fd: std::os::fd::BorrowedFd<'_>, opts: &SockOpts) -> io::Result<()> {
    use rustix::net::sockopt as so;
    so::set_tcp_nodelay(fd, opts.nodelay)?;
    match opts.keepalive {
        Some((idle, intvl, cnt)) if idle > 0 && intvl > 0 && cnt > 0 => {
            so::set_tcp_keepidle(fd, std::time::Duration::from_secs(idle.into()))?;
            so::set_tcp_keepintvl(fd, std::time::Duration::from_secs(intvl.into()))?;
            so::set_tcp_keepcnt(fd, cnt)?;
            so::set_socket_keepalive(fd, true)?;
        }
        _ => so::set_socket_keepalive(fd, false)?,
    }
    if let Some(tos) = opts.tos {
        so::set_ip_tos(fd, tos)?;
    }
    if let Some(t) = opts.user_timeout {
        uring::set_tcp_user_timeout(fd, t.into())?;
    }
    if let Some(n) = opts.send_buffer {
        so::set_socket_send_buffer_size(fd, n as usize)?;
    }
    if let Some(n) = opts.recv_buffer {
        so::set_socket_recv_buffer_size(fd, n as usize)?;
    }
    Ok(())
}
