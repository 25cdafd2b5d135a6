//! The boundary between a streaming LND (the socklnd engine, `crate::sock`) and byte streams: TCP
//! sockets on io_uring, or the simulator's streams. It is to socklnd what [`crate::fabric`] is to
//! o2ib: only the values that cross, nothing above it. The engine never touches a socket: it
//! emits [`StreamAction`]s, a driver applies them and pushes what happened as [`StreamEvent`]s
//! into a [`StreamSink`].
//!
//! | engine action / input        | io_uring over sockets                                   |
//! |------------------------------|---------------------------------------------------------|
//! | `Listen`                     | socket, SO_REUSEADDR + SO_REUSEPORT, bind, listen       |
//! | `Incoming` -> `Adopt`/`Refuse` | accept; `Refuse` closes with RST (SO_LINGER 0)        |
//! | `Dial` -> `Connected`/`DialFailed` | socket, bind(local, port p) for p = hi down to lo (next on EADDRINUSE/EADDRNOTAVAIL), connect |
//! | `Configure`                  | setsockopt: TCP_NODELAY, SO_KEEPALIVE + TCP_KEEPIDLE/INTVL/CNT, IP_TOS, TCP_USER_TIMEOUT, buffers |
//! | `Recv` -> `Data` / `Filled`  | recv into the driver's buffer (`Bytes`) or straight into LNet's memory (`Mem`) |
//! | `Send` -> `Sent`             | send / sendmsg (or SEND_ZC for a large `Mem` payload); `Sent` once every byte is in the socket (after a zero-copy send, once the kernel let go of the memory) |
//! | `Close` (graceful)           | flush queued sends, shutdown(SHUT_WR), read to EOF (bounded), close |
//! | `Close` (abort)              | SO_LINGER 0, close: the peer sees RST                   |
//! | `Ended`                      | EOF, ECONNRESET, ETIMEDOUT (TCP keepalive / user timeout), other socket errors |
//!
//! Contract (what drivers keep):
//! - One [`StreamAction::Recv`] at a time per stream: the driver reads nothing of a stream that has
//!   none posted. That is socklnd's back-pressure (`socklnd_cb.c:ksocknal_process_receive`: until
//!   LNet supplies a buffer, nothing more is read from that socket), and it is what bounds the
//!   memory of a stream before its HELLO (the engine asks for exactly the bytes it expects).
//! - `Bytes { max }` is answered by one [`StreamEvent::Data`] of 1..=max bytes (whatever one read
//!   returned); `Mem` by [`StreamEvent::Filled`] as bytes land (possibly several, each with the
//!   bytes of that read), until `len` bytes are in. Then the engine posts the next `Recv`.
//! - Sends on one stream leave in the order given, each whole: a stream never interleaves two
//!   sends' bytes. Each accepted `Send` ends in exactly one [`StreamEvent::Sent`], unless the
//!   stream is closed first.
//! - After [`StreamAction::Close`] nothing more is reported for that stream: its pending sends
//!   and receives are dropped by the driver (the engine has already failed them).
//! - [`StreamEvent::Ended`] is reported at most once per stream; the engine answers with `Close`.

use core::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::handle::handle_type;
use crate::mem::SharedMem;
use crate::time::{Duration, Instant};

handle_type! {
    /// The engine's name for one TCP connection (a generational slab key), so a report for a
    /// stream already closed is recognised and dropped.
    pub type StreamId = Handle<StreamTag>, "stream";
}

/// The driver's name for an accepted connection the engine has not adopted or refused yet.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IncomingId(pub u64);

/// The engine's name for one send on a stream, unique on that stream until its `Sent`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SendId(pub u64);

/// Where the next bytes of a stream go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecvTarget {
    /// Into a buffer of the driver's, handed over as [`StreamEvent::Data`]: at most `max` bytes.
    Bytes { max: u32 },
    /// Exactly `len` bytes straight into LNet's memory at `offset` (a posted MD, a router's
    /// large buffer): a payload lands where it is meant to without a copy through the engine.
    Mem {
        mem: SharedMem,
        offset: u64,
        len: u32,
    },
}

/// A payload that follows a send's head bytes on the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendPayload {
    /// No payload (a NOOP, a HELLO, a GET, an ACK).
    None,
    /// Bytes the engine owns (a small message's payload, copied once from LNet).
    Bytes(Vec<u8>),
    /// `len` bytes at `offset` of LNet's memory, read by the driver at send time (and sent
    /// without a copy where the driver finds that it pays).
    Mem {
        mem: SharedMem,
        offset: u64,
        len: u32,
    },
}

impl SendPayload {
    /// The payload's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            SendPayload::None => 0,
            SendPayload::Bytes(b) => b.len(),
            SendPayload::Mem { len, .. } => *len as usize,
        }
    }

    /// True when there is nothing after the head.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Socket options applied once a connection's HELLO exchange is over, as ksocklnd applies
/// them (`socklnd_lib.c:ksocknal_lib_setup_sock`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct SockOpts {
    /// TCP_NODELAY (ksocklnd's `nagle` = 0, the default).
    pub nodelay: bool,
    /// SO_KEEPALIVE with TCP_KEEPIDLE / TCP_KEEPINTVL / TCP_KEEPCNT in seconds (`None`: off).
    pub keepalive: Option<(u32, u32, u32)>,
    /// IP_TOS (`None`: leave the system's).
    pub tos: Option<u8>,
    /// TCP_USER_TIMEOUT: how long sent data may stay unacknowledged before the kernel resets
    /// the connection (the kernel LND's "no TCP-ACK progress for sock_timeout" deadline).
    pub user_timeout: Option<Duration>,
    /// SO_SNDBUF / SO_RCVBUF in bytes (`None`: the system's default).
    pub send_buffer: Option<u32>,
    pub recv_buffer: Option<u32>,
}

/// How a stream is closed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CloseMode {
    /// Send what is queued, then FIN; the driver reads to the peer's EOF within its own bound,
    /// then lets go. The peer sees a close at a message boundary at once (3FS #426: never leave
    /// a peer to find out by timeout).
    Graceful,
    /// Reset at once (a refusal, a protocol error, a hostile peer): the peer sees RST.
    Abort,
}

/// Work the engine hands a stream driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamAction {
    /// Listen for connections (the LNet acceptor) on the NI's address and the `accept_port`
    /// (988; 0 lets the system pick, for tests: [`StreamEvent::Listening`] says which).
    Listen { addr: SocketAddrV4, backlog: u32 },
    /// Stop listening (the NI is shutting down).
    Unlisten,
    /// Take an incoming connection as `stream`.
    Adopt {
        incoming: IncomingId,
        stream: StreamId,
    },
    /// Close an incoming connection at once (the secure-port rule, the limit of unauthenticated
    /// connections).
    Refuse { incoming: IncomingId },
    /// Connect `stream` to `remote` from `local`, the source port the first free one of
    /// `ports_from` down to `ports_to` (the kernel's connector tries 1023 down to 512:
    /// `acceptor.c:lnet_connect`). `ports_from` 0: any port the system picks (an unprivileged
    /// test or demo; a kernel peer treats such a dialer as a second-class userspace peer).
    Dial {
        stream: StreamId,
        local: Ipv4Addr,
        ports_from: u16,
        ports_to: u16,
        remote: SocketAddrV4,
    },
    /// Apply socket options to a connected stream.
    Configure { stream: StreamId, opts: SockOpts },
    /// Read the next bytes of `stream` into `target`.
    Recv {
        stream: StreamId,
        target: RecvTarget,
    },
    /// Write `head` then `payload` to `stream`, as one unit.
    Send {
        stream: StreamId,
        id: SendId,
        head: Vec<u8>,
        payload: SendPayload,
    },
    /// Close `stream`; nothing more is reported for it.
    Close { stream: StreamId, mode: CloseMode },
}

/// Why a dial failed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DialError {
    /// Every source port of the range is taken ("No privileged ports available").
    NoPorts,
    /// Binding a privileged port was not permitted (no CAP_NET_BIND_SERVICE).
    NotPermitted,
    /// Nothing listens there (ECONNREFUSED).
    Refused,
    /// No route, host unreachable, or the connect timed out.
    Unreachable,
    /// Another error, as a positive Linux errno.
    Other(i32),
}

impl fmt::Display for DialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DialError::NoPorts => f.write_str("no source port of the range is free"),
            DialError::NotPermitted => {
                f.write_str("binding a privileged source port not permitted")
            }
            DialError::Refused => f.write_str("connection refused"),
            DialError::Unreachable => f.write_str("unreachable"),
            DialError::Other(e) => write!(f, "errno {e}"),
        }
    }
}

/// Why a stream ended under the engine.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum EndReason {
    /// The peer closed its side (EOF).
    Eof,
    /// The peer reset the connection (ECONNRESET, EPIPE).
    Reset,
    /// TCP gave up: keepalive probes or retransmissions unanswered, or TCP_USER_TIMEOUT.
    TimedOut,
    /// Another socket error, as a positive Linux errno.
    Error(i32),
}

/// What a driver reports.
#[derive(Debug, PartialEq, Eq)]
pub enum StreamEvent<'a> {
    /// A connection arrived at the listener; answer with `Adopt` or `Refuse`.
    Incoming {
        incoming: IncomingId,
        peer: SocketAddrV4,
        local: SocketAddrV4,
    },
    /// The listener is up, at `local`.
    Listening { local: SocketAddrV4 },
    /// The listener could not be set up or failed (a positive errno): the NI accepts nothing.
    ListenFailed { errno: i32 },
    /// A dial connected, from `local`.
    Connected {
        stream: StreamId,
        local: SocketAddrV4,
    },
    /// A dial failed.
    DialFailed { stream: StreamId, error: DialError },
    /// Bytes for a `Recv { target: Bytes }`.
    Data { stream: StreamId, bytes: &'a [u8] },
    /// `n` more bytes landed in a `Recv { target: Mem }`'s memory.
    Filled { stream: StreamId, n: u32 },
    /// A send left whole (`Ok`), or the stream failed under it.
    Sent {
        stream: StreamId,
        id: SendId,
        result: Result<(), EndReason>,
    },
    /// The stream ended (EOF, reset, error); answer with `Close`.
    Ended { stream: StreamId, why: EndReason },
}

/// A [`StreamEvent`] owned (its bytes copied): what a simulated stream network queues until
/// delivery, and what a test keeps of what a host heard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamReport {
    Listening(SocketAddrV4),
    ListenFailed(i32),
    Incoming {
        incoming: IncomingId,
        peer: SocketAddrV4,
        local: SocketAddrV4,
    },
    Connected(StreamId, SocketAddrV4),
    DialFailed(StreamId, DialError),
    Data(StreamId, Vec<u8>),
    Filled(StreamId, u32),
    Sent(StreamId, SendId, Result<(), EndReason>),
    Ended(StreamId, EndReason),
}

impl StreamReport {
    /// The event, borrowing the bytes.
    pub fn as_event(&self) -> StreamEvent<'_> {
        match self {
            StreamReport::Listening(local) => StreamEvent::Listening { local: *local },
            StreamReport::ListenFailed(errno) => StreamEvent::ListenFailed { errno: *errno },
            StreamReport::Incoming {
                incoming,
                peer,
                local,
            } => StreamEvent::Incoming {
                incoming: *incoming,
                peer: *peer,
                local: *local,
            },
            StreamReport::Connected(stream, local) => StreamEvent::Connected {
                stream: *stream,
                local: *local,
            },
            StreamReport::DialFailed(stream, error) => StreamEvent::DialFailed {
                stream: *stream,
                error: *error,
            },
            StreamReport::Data(stream, bytes) => StreamEvent::Data {
                stream: *stream,
                bytes,
            },
            StreamReport::Filled(stream, n) => StreamEvent::Filled {
                stream: *stream,
                n: *n,
            },
            StreamReport::Sent(stream, id, result) => StreamEvent::Sent {
                stream: *stream,
                id: *id,
                result: *result,
            },
            StreamReport::Ended(stream, why) => StreamEvent::Ended {
                stream: *stream,
                why: *why,
            },
        }
    }
}

impl From<StreamEvent<'_>> for StreamReport {
    fn from(ev: StreamEvent<'_>) -> StreamReport {
        match ev {
            StreamEvent::Listening { local } => StreamReport::Listening(local),
            StreamEvent::ListenFailed { errno } => StreamReport::ListenFailed(errno),
            StreamEvent::Incoming {
                incoming,
                peer,
                local,
            } => StreamReport::Incoming {
                incoming,
                peer,
                local,
            },
            StreamEvent::Connected { stream, local } => StreamReport::Connected(stream, local),
            StreamEvent::DialFailed { stream, error } => StreamReport::DialFailed(stream, error),
            StreamEvent::Data { stream, bytes } => StreamReport::Data(stream, bytes.to_vec()),
            StreamEvent::Filled { stream, n } => StreamReport::Filled(stream, n),
            StreamEvent::Sent { stream, id, result } => StreamReport::Sent(stream, id, result),
            StreamEvent::Ended { stream, why } => StreamReport::Ended(stream, why),
        }
    }
}

/// Where a driver pushes what happened: a socklnd engine, or the LNet runtime that owns one.
pub trait StreamSink {
    /// One event, at `now`.
    fn stream_event(&mut self, now: Instant, ev: StreamEvent<'_>);
}
