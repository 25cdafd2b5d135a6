//! The drivers: what moves bytes, above the engine. `tcp` (TCP on io_uring) and `verbs`
//! (rdma_cm + ibverbs, feature `verbs`) implement [`Driver`]; this module also holds the event
//! loop they share: the driver's clock, and one turn of an NI's loop (apply the engine's actions,
//! wait on the fabric until the next deadline, run due timers, hand events on). A driver pushes
//! what happened into a [`FabricSink`]; it never holds the engine. `socket` is the stream
//! driver below socklnd (`crate::stream`): plain TCP on io_uring, with the same methods as
//! [`Driver`] over stream actions and events.

/// Writes methods that only pass their arguments on, one per signature in the list:
/// `fn name(&mut self, a: A) -> R;` becomes `fn name(&mut self, a: A) -> R { $via::name($m, a) }`,
/// a `&self` one calls `$via::name($r, a)`, and one whose first argument is `_: Instant` (a
/// fabric whose inherent method reads no clock) drops it. Written once so that every forwarding
/// family below is its list of signatures. `self` is handed in as `$s` so that `$m` and `$r` may
/// name it (macro hygiene).
macro_rules! forward_fns {
    ($s:ident, $via:ident, $m:expr, $r:expr;) => {};
    ($s:ident, $via:ident, $m:expr, $r:expr;
        fn $name:ident(&mut self, _: Instant $(, $arg:ident: $ty:ty)*); $($rest:tt)*) => {
        fn $name(&mut $s, _: $crate::time::Instant $(, $arg: $ty)*) {
            $via::$name($m $(, $arg)*)
        }
        forward_fns!($s, $via, $m, $r; $($rest)*);
    };
    ($s:ident, $via:ident, $m:expr, $r:expr;
        fn $name:ident(&mut self $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)?; $($rest:tt)*) => {
        fn $name(&mut $s $(, $arg: $ty)*) $(-> $ret)? {
            $via::$name($m $(, $arg)*)
        }
        forward_fns!($s, $via, $m, $r; $($rest)*);
    };
    ($s:ident, $via:ident, $m:expr, $r:expr;
        fn $name:ident(&self $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)?; $($rest:tt)*) => {
        fn $name(&$s $(, $arg: $ty)*) $(-> $ret)? {
            $via::$name($r $(, $arg)*)
        }
        forward_fns!($s, $via, $m, $r; $($rest)*);
    };
}

/// Writes the methods of [`Driver`] and [`LndDriver`] that every wrapper only passes on (they
/// share names and signatures): `forward_driver_methods!(self, Via, mut_recv, recv)` calls
/// `Via::method(mut_recv, ..)` from a `&mut self` method and `Via::method(recv, ..)` from a
/// `&self` one. With `, registry` it also forwards [`Driver::registry`] and
/// [`Driver::sees_writes`], which a stream driver answers itself; with `, lnd` (first) also
/// [`LndDriver::apply_from`] and [`LndDriver::poll_into`].
macro_rules! forward_driver_methods {
    ($s:ident, $via:ident, $m:expr, $r:expr, registry) => {
        forward_driver_methods!($s, $via, $m, $r);
        forward_fns!($s, $via, $m, $r;
            fn registry(&mut self) -> Option<&mut dyn $crate::fabric::Registry>;
            fn sees_writes(&self) -> bool;
        );
    };
    ($s:ident, $via:ident, $m:expr, $r:expr, lnd $(, $more:ident)?) => {
        forward_fns!($s, $via, $m, $r;
            fn apply_from(&mut self, now: $crate::time::Instant, lnd: &mut dyn $crate::iface::Lnd);
            fn poll_into(
                &mut self,
                timeout: Option<std::time::Duration>,
                lnd: &mut dyn $crate::iface::Lnd,
                now: &dyn Fn() -> $crate::time::Instant
            ) -> std::io::Result<()>;
        );
        forward_driver_methods!($s, $via, $m, $r $(, $more)?);
    };
    ($s:ident, $via:ident, $m:expr, $r:expr) => {
        forward_fns!($s, $via, $m, $r;
            fn set_waker(&mut self, fd: std::os::fd::RawFd);
            fn set_doorbell(&mut self, bell: $crate::driver::Doorbell);
            fn readiness_fd(&self) -> Option<std::os::fd::RawFd>;
            fn watch(&mut self, fd: std::os::fd::RawFd) -> bool;
            fn has_queued_work(&self) -> bool;
            fn take_woken(&mut self) -> bool;
            fn counters(&self) -> Vec<(&'static str, u64)>;
            fn abandon(&mut self);
        );
    };
}

/// Writes [`Driver::apply`] and [`Driver::poll`] for a driver that only passes them on, as
/// `$via::apply($m, ..)` and `$via::poll($m, ..)` (see [`forward_driver_methods`]).
macro_rules! forward_driver_io {
    ($s:ident, $via:ident, $m:expr) => {
        forward_fns!($s, $via, $m, $m;
            fn apply(&mut self, now: $crate::time::Instant, action: $crate::fabric::FabricAction);
            fn poll(
                &mut self,
                timeout: Option<std::time::Duration>,
                sink: &mut dyn $crate::fabric::FabricSink,
                now: &dyn Fn() -> $crate::time::Instant
            ) -> std::io::Result<()>;
        );
    };
}

/// Writes the connection-manager methods of [`crate::fabric::Fabric`] for a fabric whose
/// inherent methods of the same names do the work and read no clock (connect, accept, reject,
/// post_recv, disconnect, destroy): `$via::method(self, ..)` without the `now` argument.
#[cfg(any(feature = "tcp", feature = "verbs"))]
macro_rules! forward_fabric_cm {
    ($s:ident, $via:ident) => {
        forward_fns!($s, $via, $s, $s;
            fn connect(
                &mut self,
                _: Instant,
                conn: $crate::fabric::ConnId,
                peer: $crate::wire::Nid,
                private: $crate::fabric::PrivateData,
                slots: u16
            );
            fn accept(
                &mut self,
                _: Instant,
                req: $crate::fabric::RequestId,
                conn: $crate::fabric::ConnId,
                private: $crate::fabric::PrivateData,
                slots: u16
            );
            fn reject(
                &mut self,
                _: Instant,
                req: $crate::fabric::RequestId,
                private: $crate::fabric::PrivateData
            );
            fn post_recv(&mut self, _: Instant, conn: $crate::fabric::ConnId, slot: u16);
            fn disconnect(&mut self, _: Instant, conn: $crate::fabric::ConnId);
            fn destroy(&mut self, _: Instant, conn: $crate::fabric::ConnId);
        );
    };
}

/// Writes [`LndDriver::apply_from`] and [`LndDriver::poll_into`] for a driver that serves one
/// kind of LND, `$lnd`: both find it behind `dyn Lnd` and pass its actions to `$via::apply`, it
/// to `$via::poll` as the sink; an LND of another kind gets [`wrong_lnd`] from `poll_into`
/// (`$what` names the driver there) and nothing from `apply_from` (it has no actions of ours).
macro_rules! lnd_driver_serving {
    ($s:ident, $via:ident, $lnd:ty, $what:literal) => {
        fn apply_from(&mut $s, now: $crate::time::Instant, lnd: &mut dyn $crate::iface::Lnd) {
            if let Some(engine) = lnd.as_any_mut().downcast_mut::<$lnd>() {
                while let Some(a) = engine.poll_action() {
                    $via::apply($s, now, a);
                }
            }
        }
        fn poll_into(
            &mut $s,
            timeout: Option<std::time::Duration>,
            lnd: &mut dyn $crate::iface::Lnd,
            now: &dyn Fn() -> $crate::time::Instant,
        ) -> std::io::Result<()> {
            let name = lnd.name();
            match lnd.as_any_mut().downcast_mut::<$lnd>() {
                Some(engine) => $via::poll($s, timeout, engine, now),
                None => Err($crate::driver::wrong_lnd($what, name)),
            }
        }
    };
}

/// Declares a driver's counters, a struct of `u64` fields, with its `counters()`: every counter
/// under its field name, in declaration order (for `lnetctl net show -v`), so that a new counter
/// is shown once it is declared and the list cannot drift from the struct.
#[cfg(any(feature = "tcp", feature = "verbs"))]
macro_rules! counter_struct {
    ($(#[$meta:meta])* pub struct $name:ident {
        $($(#[$fmeta:meta])* pub $field:ident: u64,)*
    }) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$fmeta])* pub $field: u64,)*
        }

        impl $name {
            /// Every counter under its field name (for `lnetctl net show -v`).
            pub fn counters(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field),)*]
            }
        }
    };
}

/// Declares a fieldless enum whose variants stand for fixed byte codes (a frame's kind byte, an
/// io_uring op kind) through [`wire_enum!`](crate::wire_enum) (one code table, its decoder
/// `from_code`), and implements [`Coded`] for it, which the user_data packing is generic over.
#[cfg(feature = "tcp")]
macro_rules! coded_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident {
        $($(#[$vmeta:meta])* $variant:ident = $code:literal,)*
    }) => {
        $crate::wire_enum! {
            $(#[$meta])*
            #[repr(u8)]
            $vis enum $name: from_code(u8) {
                $($(#[$vmeta])* $variant = $code,)*
            }
        }

        impl $crate::driver::Coded for $name {
            fn code(self) -> u8 {
                self as u8
            }
            fn from_code(code: u8) -> Option<$name> {
                $name::from_code(code)
            }
        }
    };
}

/// An enum that stands for a small code (see [`coded_enum`]).
#[cfg(feature = "tcp")]
pub(crate) trait Coded: Copy + Sized {
    /// The variant's code.
    fn code(self) -> u8;
    /// The variant of this code, if any.
    fn from_code(code: u8) -> Option<Self>;
}

#[cfg(any(feature = "tcp", feature = "verbs"))]
mod report;
#[cfg(feature = "tcp")]
pub mod socket;
pub mod tamper;
#[cfg(feature = "tcp")]
pub mod tcp;
#[cfg(feature = "tcp")]
mod uring_sock;
#[cfg(feature = "verbs")]
pub mod verbs;

use std::io;

use crate::engine::{Endpoint, LndEvent};
use crate::fabric::{FabricAction, FabricSink};
use crate::iface::Lnd;
use crate::time::Instant;

/// A real fabric, as the event loop drives it.
pub trait Driver {
    /// Queues one action from the engine (nothing blocks here).
    fn apply(&mut self, now: Instant, action: FabricAction);

    /// Submits queued work, waits for something to happen (at most `timeout`), reads the clock
    /// once with `now` and pushes everything that happened into `sink`.
    fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        sink: &mut dyn FabricSink,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()>;

    /// Makes `poll` return early whenever `fd` becomes readable. `fd` is the read end of a
    /// [`Waker`]; the fabric only watches it, and after every `poll` the loop calls
    /// [`Waker::drain`] when the watch fired ([`Driver::take_woken`]), else
    /// [`Waker::take_pending`] (so a level-triggered watch does not fire again for the same
    /// wake-up, and one taken by the [`Doorbell`]'s flag is consumed too). This is how
    /// work arriving from other threads (a control request) cuts a wait short instead of
    /// waiting out the loop's bound.
    fn set_waker(&mut self, fd: std::os::fd::RawFd);

    /// Lets the driver's busy-poll take wake-ups from the [`Waker`] it watches without a byte
    /// (see [`Doorbell`] for the protocol the driver must follow). A driver that ignores it
    /// (the default) is woken by the byte, as before.
    fn set_doorbell(&mut self, _bell: Doorbell) {}

    /// A descriptor readable whenever the driver has work for its loop (tcp: its io_uring),
    /// so that a loop running several NIs on one thread can sleep in one of them and wake for
    /// any (`None`: this driver cannot be shared that way).
    fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Ends this driver's waits also when `fd` becomes readable (another driver's
    /// [`Driver::readiness_fd`]); false when the driver cannot watch descriptors.
    fn watch(&mut self, _fd: std::os::fd::RawFd) -> bool {
        false
    }

    /// Whether work is queued that the next `poll` does without waiting (actions applied since
    /// the last poll, reports not yet handed on), so that a loop sharing its thread with this
    /// driver does not sleep on another one meanwhile. A driver that cannot tell says `true`.
    fn has_queued_work(&self) -> bool {
        true
    }

    /// Whether the waker became readable during the polls since the last call, so that the
    /// loop drains it only then (a read per turn otherwise). A driver that cannot tell says
    /// `true`, which is always safe.
    fn take_woken(&mut self) -> bool {
        true
    }

    /// The fabric's counters under stable snake_case names, for `lnetctl net show -v`.
    fn counters(&self) -> Vec<(&'static str, u64)>;

    /// The driver failed for good (`poll` returned an error) and will not be polled again:
    /// end what the operating system still holds for it that peers would otherwise wait on
    /// (connected and listening sockets), without the failed machinery. Counters stay.
    fn abandon(&mut self) {}

    /// The fabric's memory registration, for the memory LNet moves bulk data from and into
    /// (`None`: this driver registers nothing).
    fn registry(&mut self) -> Option<&mut dyn crate::fabric::Registry> {
        None
    }

    /// Whether the fabric sees every peer's RDMA write land and reports which granted bytes
    /// were written ([`crate::fabric::FabricEvent::WritesCovered`]), so that the engine can
    /// fail a PUT_DONE or GET_DONE whose data did not all arrive
    /// ([`crate::engine::Endpoint::set_fabric_sees_writes`]). The tcp fabric does; verbs
    /// cannot (a one-sided write is invisible to the receiver), and there a reused buffer is
    /// scrubbed instead.
    fn sees_writes(&self) -> bool {
        false
    }
}

/// A boxed driver is a driver (the daemon keeps each NI's behind `Box<dyn Driver + Send>`).
impl<T: Driver + ?Sized> Driver for Box<T> {
    forward_driver_io!(self, Driver, &mut **self);
    forward_driver_methods!(self, Driver, &mut **self, &**self, registry);
}

/// What an NI's loop drives, whichever LND the NI runs: a driver together with the LND it moves
/// bytes for. The loop (`router::runtime::NiRuntime`) holds the LND as `dyn Lnd` and hands it
/// here; the driver reaches its own engine's actions and events through it. Every o2ib fabric
/// driver ([`Driver`]) is one, for an o2ib [`Endpoint`]; a stream driver is one for a socklnd
/// engine. The other methods are [`Driver`]'s, with the same meaning.
pub trait LndDriver {
    /// Hands every action `lnd` has queued to the wire (nothing blocks here).
    fn apply_from(&mut self, now: Instant, lnd: &mut dyn Lnd);

    /// Submits queued work, waits at most `timeout` for something to happen, reads the clock
    /// once with `now` and pushes everything that happened into `lnd`. An LND of a kind this
    /// driver does not serve is an error (`InvalidInput`), never a silent drop.
    fn poll_into(
        &mut self,
        timeout: Option<std::time::Duration>,
        lnd: &mut dyn Lnd,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()>;

    /// See [`Driver::set_waker`].
    fn set_waker(&mut self, fd: std::os::fd::RawFd);
    /// See [`Driver::set_doorbell`].
    fn set_doorbell(&mut self, bell: Doorbell);
    /// See [`Driver::readiness_fd`].
    fn readiness_fd(&self) -> Option<std::os::fd::RawFd>;
    /// See [`Driver::watch`].
    fn watch(&mut self, fd: std::os::fd::RawFd) -> bool;
    /// See [`Driver::has_queued_work`].
    fn has_queued_work(&self) -> bool;
    /// See [`Driver::take_woken`].
    fn take_woken(&mut self) -> bool;
    /// See [`Driver::counters`].
    fn counters(&self) -> Vec<(&'static str, u64)>;
    /// See [`Driver::abandon`].
    fn abandon(&mut self);
    /// See [`Driver::registry`].
    fn registry(&mut self) -> Option<&mut dyn crate::fabric::Registry>;
    /// See [`Driver::sees_writes`].
    fn sees_writes(&self) -> bool;
}

/// The error of a driver (`what`) handed an LND it does not serve (`name`).
fn wrong_lnd(what: &str, name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what} under a {name} LND"),
    )
}

/// Every o2ib fabric driver drives an o2ib [`Endpoint`].
impl<D: Driver> LndDriver for D {
    lnd_driver_serving!(self, Driver, Endpoint, "an o2ib fabric driver");
    forward_driver_methods!(self, Driver, self, self, registry);
}

/// A boxed driver of any LND is one (the daemon keeps each NI's behind
/// `Box<dyn LndDriver + Send>`).
impl LndDriver for Box<dyn LndDriver + Send> {
    forward_driver_methods!(self, LndDriver, &mut **self, &**self, lnd, registry);
}

/// Busy-polls `ring` for at most `spin` before an NI loop sleeps in the kernel (the tcp fabric
/// and the socket driver alike): on a loaded link the next completion is microseconds away, and
/// sleeping in the kernel and being woken costs more than that. Whether a completion arrived or
/// the [`Doorbell`] rang, so that the caller sleeps only if neither did.
///
/// Each round enters the kernel without waiting: the ring is set up with COOP_TASKRUN, so socket
/// completions are posted when we enter, not by an IPI. Between rounds the thread yields the
/// CPU: with as many spinning threads as cores or more (a router beside its clients, a shared
/// login node, a CI box) the spinning must not starve the peer, or the kernel work that produces
/// the very completion it waits for. With a core to itself, the yield returns at once. Measured
/// on 2 vCPUs (lnet_perf, client, router and server processes): yielding from the first round
/// against yielding only after 15 us of spinning, routed 64-B PUT rate +35-60%, routed ping RTT
/// -30-45%, the direct PUT rate within 10% (noise). Under CPU hogs (`yes` on every core) any
/// spinning collapses: give a busy-polling router its own cores. A wake-up from another thread
/// (a handover to this NI) is seen as the doorbell's flag in each round, not as a byte on the
/// waker.
#[cfg(feature = "tcp")]
fn spin_on_ring(
    ring: &mut crate::sys::uring::Ring,
    bell: Option<&Doorbell>,
    spin: std::time::Duration,
) -> io::Result<bool> {
    if spin.is_zero() {
        return Ok(false);
    }
    let start = std::time::Instant::now();
    if let Some(b) = bell {
        b.spin_begin();
    }
    let spun = loop {
        if let Err(e) = ring.submit_and_wait(Some(std::time::Duration::ZERO)) {
            break Err(e);
        }
        if ring.has_completions() || bell.is_some_and(Doorbell::rung) || start.elapsed() >= spin {
            break Ok(());
        }
        std::thread::yield_now();
    };
    let rung = bell.is_some_and(Doorbell::spin_end);
    spun?;
    Ok(rung || ring.has_completions())
}

/// A watched descriptor's poll completed with `result` (`w`: the descriptor and whether its
/// poll is armed, in a ring's watch list). Disarms it (the loop re-arms it at its next poll) and
/// says whether it is the loop's own waker (`waker_fd`), which the owner drains after this
/// poll; another loop's descriptor, watched when several loops share a thread, is drained by
/// its own poll. A failed poll would complete at once on every poll and spin the loop, so the
/// descriptor stops being watched (the loop's own bound still brings control requests in);
/// `driver` names the driver in that log line.
#[cfg(feature = "tcp")]
fn watch_fired(
    w: &mut (std::os::fd::RawFd, bool),
    waker_fd: Option<std::os::fd::RawFd>,
    result: i32,
    driver: &str,
) -> bool {
    w.1 = false;
    let woken = Some(w.0) == waker_fd;
    if result < 0 && result != -libc::ECANCELED {
        tracing::error!(
            errno = -result,
            "{driver}: waker poll failed; no longer watching it"
        );
        w.0 = -1;
    }
    woken
}

/// Wakes an NI loop from another thread: one end of a Unix socket pair. The loop's fabric watches
/// [`Waker::fd`] (through [`Driver::set_waker`]); [`WakeHandle::wake`] writes one byte (a full
/// buffer means a wake-up is already pending, so nothing is lost), and only when no wake-up is
/// pending yet: a loop handed many messages between two of its turns (a busy router's egress)
/// costs its senders one write, not one per message. And none while the loop busy-polls: a
/// fabric given the [`Doorbell`] ([`Driver::set_doorbell`]) says when it spins and looks at the
/// pending flag in every round, so the wake-up of a spinning loop (a router's egress NI between
/// two forwards) costs an atomic store instead of a write, an io_uring poll completion, its
/// re-arming and the drain's read.
#[derive(Debug)]
pub struct Waker {
    rx: std::os::unix::net::UnixStream,
    /// The write end, held too: once every handle is dropped the read end would otherwise be
    /// at end of file, readable for ever, and the loop watching it would never sleep.
    _tx: std::sync::Arc<std::os::unix::net::UnixStream>,
    state: std::sync::Arc<WakeState>,
}

/// The writing side of a [`Waker`]; cheap to clone, `Send`.
#[derive(Debug, Clone)]
pub struct WakeHandle {
    tx: std::sync::Arc<std::os::unix::net::UnixStream>,
    state: std::sync::Arc<WakeState>,
}

/// What a [`Waker`], its handles and its fabric's [`Doorbell`] share.
#[derive(Debug, Default)]
struct WakeState {
    /// A wake-up was asked for and the loop has not taken it yet.
    pending: std::sync::atomic::AtomicBool,
    /// The loop busy-polls and looks at `pending` before it next sleeps: no byte needed.
    spinning: std::sync::atomic::AtomicBool,
    /// A byte was (or is about to be) written: the loop reads it when it takes the wake-up,
    /// whether or not its watch fired (a verbs fabric whose spin saw the flag never reaches the
    /// poll(2) that would have told), so that no byte outlives its wake-up and ends a later sleep
    /// for nothing.
    byte: std::sync::atomic::AtomicBool,
}

/// The fabric's side of a [`Waker`]: lets its busy-poll see wake-ups without the descriptor.
///
/// The protocol, a Dekker handshake on two flags (both sides sequentially consistent): the
/// waker sets `pending`, then writes a byte only if it does not see `spinning`; the fabric sets
/// `spinning` before its busy-poll, looks at `pending` in every round, and after clearing
/// `spinning` looks at `pending` once more before it sleeps ([`Doorbell::spin_end`]). A waker
/// that saw `spinning` and wrote nothing set `pending` before the fabric cleared `spinning`, so
/// the fabric's last look sees it and does not sleep. A waker that did not see `spinning`
/// writes the byte, which ends any sleep.
#[derive(Debug, Clone)]
pub struct Doorbell {
    state: std::sync::Arc<WakeState>,
}

impl Doorbell {
    /// The busy-poll begins: wakers from now on only set the flag.
    pub fn spin_begin(&self) {
        self.state
            .spinning
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a wake-up is pending (a look in a busy-poll round).
    pub fn rung(&self) -> bool {
        self.state.pending.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The busy-poll ends: wakers write their byte again. True when a wake-up is pending, so
    /// the fabric must not sleep.
    pub fn spin_end(&self) -> bool {
        self.state
            .spinning
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.rung()
    }
}

impl Waker {
    /// A waker and the handle that wakes it.
    pub fn new() -> io::Result<(Waker, WakeHandle)> {
        let (rx, tx) = std::os::unix::net::UnixStream::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        let state = std::sync::Arc::new(WakeState::default());
        let tx = std::sync::Arc::new(tx);
        Ok((
            Waker {
                rx,
                _tx: tx.clone(),
                state: state.clone(),
            },
            WakeHandle { tx, state },
        ))
    }

    /// The descriptor to hand to [`Driver::set_waker`].
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.rx.as_raw_fd()
    }

    /// The flags to hand to [`Driver::set_doorbell`].
    pub fn doorbell(&self) -> Doorbell {
        Doorbell {
            state: self.state.clone(),
        }
    }

    /// Consumes every pending wake-up. Call it before looking at what the wakers' owners sent
    /// (the bytes first, then the flag: a wake-up after this call writes a byte again, one
    /// before it is seen by the look that follows).
    pub fn drain(&self) {
        self.state
            .byte
            .store(false, std::sync::atomic::Ordering::Release);
        self.read_bytes();
        self.take_pending();
    }

    /// Consumes a wake-up whether its watch fired or not (the fabric may have seen only the
    /// flag while it spun), reading the waker's bytes only if one was written. Call it, like
    /// `drain`, before looking at what the wakers' owners sent. True if one was pending.
    pub fn take_pending(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.state.byte.load(Ordering::Acquire) && self.state.byte.swap(false, Ordering::AcqRel)
        {
            self.read_bytes();
        }
        self.state.pending.load(Ordering::Acquire)
            && self.state.pending.swap(false, Ordering::AcqRel)
    }

    fn read_bytes(&self) {
        use std::io::Read;
        let mut buf = [0u8; 64];
        while matches!((&self.rx).read(&mut buf), Ok(n) if n > 0) {}
    }
}

impl WakeHandle {
    /// Wakes the loop (never blocks); nothing to do when a wake-up is already pending, and
    /// only the flag while the loop busy-polls (see [`Doorbell`]).
    pub fn wake(&self) {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        if self.state.pending.swap(true, Ordering::SeqCst)
            || self.state.spinning.load(Ordering::SeqCst)
        {
            return;
        }
        // Flagged before the write: a take that sees the flag and reads before the byte lands
        // leaves that byte to the watch, as before the flag existed; never the other way round.
        self.state.byte.store(true, Ordering::Release);
        // WouldBlock: the buffer is full of earlier wake-ups, so the loop will wake anyway.
        let _ = (&*self.tx).write(&[1]);
    }
}

/// The driver's clock: CLOCK_MONOTONIC (through `std::time::Instant`) as our [`Instant`],
/// nanoseconds since the clock was made. The driver is the only place that reads a clock.
#[derive(Copy, Clone, Debug)]
pub struct MonotonicClock {
    origin: std::time::Instant,
}

impl Default for MonotonicClock {
    fn default() -> MonotonicClock {
        MonotonicClock::new()
    }
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> MonotonicClock {
        MonotonicClock {
            origin: std::time::Instant::now(),
        }
    }

    /// The current time.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

/// One turn of an NI's event loop: apply the endpoint's pending actions, poll the fabric until
/// the endpoint's next deadline (at most `max_wait`), run the timers that are due, and hand every
/// endpoint event to `on_event` (which may call `send`, `recv_done`, `shutdown` on the endpoint).
pub fn turn<D: Driver + ?Sized>(
    fabric: &mut D,
    ep: &mut Endpoint,
    clock: &MonotonicClock,
    max_wait: std::time::Duration,
    on_event: &mut dyn FnMut(&mut Endpoint, Instant, LndEvent),
) -> io::Result<()> {
    let now = clock.now();
    if ep.fabric_sees_writes() != fabric.sees_writes() {
        ep.set_fabric_sees_writes(fabric.sees_writes());
    }
    while let Some(a) = ep.poll_action() {
        fabric.apply(now, a);
    }
    let wait = match ep.poll_timeout() {
        Some(deadline) => {
            std::time::Duration::from(deadline.saturating_duration_since(now)).min(max_wait)
        }
        None => max_wait,
    };
    fabric.poll(Some(wait), ep, &|| clock.now())?;
    let now = clock.now();
    if ep.poll_timeout().is_some_and(|d| d <= now) {
        ep.handle_timeout(now);
    }
    while let Some(ev) = ep.poll_event() {
        on_event(ep, now, ev);
    }
    Ok(())
}

/// Runs [`turn`] until `done(ep)` (e.g. `Endpoint::is_shut_down`), each wait bounded by
/// `max_wait` so that `done` is checked at least that often.
pub fn run_endpoint<D: Driver + ?Sized>(
    fabric: &mut D,
    ep: &mut Endpoint,
    clock: &MonotonicClock,
    max_wait: std::time::Duration,
    mut done: impl FnMut(&Endpoint) -> bool,
    mut on_event: impl FnMut(&mut Endpoint, Instant, LndEvent),
) -> io::Result<()> {
    while !done(ep) {
        turn(fabric, ep, clock, max_wait, &mut on_event)?;
    }
    // Hand the last actions (the final Destroys) to the fabric.
    let now = clock.now();
    while let Some(a) = ep.poll_action() {
        fabric.apply(now, a);
    }
    Ok(())
}

/// Each NI's runtime runs on its own thread, so its driver moves there.
#[cfg(all(test, any(feature = "tcp", feature = "verbs")))]
mod send_check {
    fn is_send<T: Send>() {}
    #[test]
    fn drivers_are_send() {
        #[cfg(feature = "tcp")]
        is_send::<super::tcp::TcpFabric>();
        #[cfg(feature = "tcp")]
        is_send::<super::socket::SocketDriver>();
        #[cfg(feature = "verbs")]
        is_send::<super::verbs::VerbsFabric>();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn has_byte(w: &Waker) -> bool {
        let mut b = [0u8; 8];
        matches!((&w.rx).read(&mut b), Ok(n) if n > 0)
    }

    /// The two ways a wake-up reaches its loop: while the fabric busy-polls, only the flag
    /// (no byte to write, watch and drain); otherwise the byte, as before. Either way the loop
    /// takes it once.
    #[test]
    fn a_spinning_loop_is_woken_by_the_flag_a_sleeping_one_by_a_byte() {
        let (w, h) = Waker::new().unwrap();
        let bell = w.doorbell();

        bell.spin_begin();
        h.wake();
        assert!(bell.rung(), "the busy-poll sees the wake-up");
        assert!(!has_byte(&w), "no byte while the loop spins");
        assert!(
            bell.spin_end(),
            "the look after the spin sees it too: no sleep"
        );
        assert!(w.take_pending());
        assert!(!w.take_pending(), "taken once");

        h.wake();
        assert!(has_byte(&w), "a loop that is not spinning gets the byte");
        h.wake();
        assert!(!has_byte(&w), "one byte while a wake-up is pending");
        w.drain();
        assert!(!w.take_pending(), "drain took the flag with the byte");

        // A wake-up between two spins of a loop that did not take it yet: the next spin sees
        // it at once.
        h.wake();
        w.drain();
        bell.spin_begin();
        assert!(!bell.rung());
        assert!(!bell.spin_end());
        h.wake();
        bell.spin_begin();
        assert!(bell.rung());
    }

    /// A wake-up that wrote its byte but was taken by its flag (a verbs fabric's spin saw it
    /// and never reached the poll(2) that watches the byte) takes its byte too: left in the
    /// socket, it would end the next sleep at once, for nothing, one per such wake-up.
    #[test]
    fn a_wake_up_taken_by_its_flag_takes_its_byte_too() {
        let (w, h) = Waker::new().unwrap();
        h.wake();
        assert!(w.take_pending());
        assert!(!has_byte(&w), "the byte was left behind");
        // A flag-only wake-up (the loop spun) reads nothing and takes the flag.
        let bell = w.doorbell();
        bell.spin_begin();
        h.wake();
        assert!(bell.spin_end());
        assert!(w.take_pending());
        assert!(!w.take_pending());
    }

    /// Dropping every handle does not leave the watched end at end of file (readable for ever,
    /// so a loop watching it would never sleep): the waker holds the write end too.
    #[test]
    fn a_waker_whose_handles_are_gone_is_not_readable() {
        let (w, h) = Waker::new().unwrap();
        drop(h);
        let mut b = [0u8; 8];
        let r = (&w.rx).read(&mut b);
        assert!(
            matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "the waker reads {r:?}, not WouldBlock"
        );
    }
}
