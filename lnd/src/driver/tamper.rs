//! A driver that misbehaves on purpose, for tests and benches: a hostile LND (a peer that
//! writes less than it announces, or takes a grant and never fills it) without a fabric of its
//! own. [`Tamper`] wraps any [`Driver`] and passes each of the engine's actions through a
//! rewrite first: what it returns is applied, what it swallows is reported done.

use std::io;

use super::{Doorbell, Driver};
use crate::fabric::{
    ConnId, FabricAction, FabricSink, LocalFrag, Registry, RemoteFrag, WcStatus, WrId,
};
use crate::time::Instant;

/// What a [`Tamper`] does with each action: `Some` (the action, changed or not) is applied;
/// `None` swallows it, and a swallowed send or RDMA write completes with
/// [`WcStatus::Success`] at the next poll, so the engine goes on as if it had left.
pub type Rewrite = Box<dyn FnMut(FabricAction) -> Option<FabricAction> + Send>;

/// How a hostile source writes the data of each RDMA write (the sink's side of a rendezvous
/// must catch every one but `Honest`: the data it was promised did not all arrive). Used by the
/// tcp fabric's coverage tests and by the router's hostile-bulk process test.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ShortWrite {
    /// As the engine asked: the control case.
    Honest,
    /// The first half of the first fragment only.
    Half,
    /// Nothing: the write is swallowed and reported done.
    Nothing,
    /// The first half of the first fragment, twice: as many bytes as owed for a one-fragment
    /// write, but half the sink untouched.
    HalfTwice,
    /// The first fragment but its last byte.
    AllButOne,
}

impl ShortWrite {
    /// `action` as this source would write it: RDMA writes shortened (or swallowed: `None`),
    /// every other action as it is.
    pub fn rewrite(self, action: FabricAction) -> Option<FabricAction> {
        let FabricAction::RdmaWrite {
            conn,
            wr,
            local,
            remote,
        } = action
        else {
            return Some(action);
        };
        let cut = |n: u32| {
            (
                LocalFrag { len: n, ..local[0] },
                RemoteFrag {
                    len: n,
                    ..remote[0]
                },
            )
        };
        let (local, remote) = match self {
            ShortWrite::Honest => (local, remote),
            ShortWrite::Nothing => return None,
            ShortWrite::Half | ShortWrite::HalfTwice => {
                let (l, r) = cut(local[0].len / 2);
                match self {
                    ShortWrite::Half => (vec![l], vec![r]),
                    _ => (vec![l, l], vec![r, r]),
                }
            }
            ShortWrite::AllButOne => {
                let (l, r) = cut(local[0].len.saturating_sub(1));
                (vec![l], vec![r])
            }
        };
        Some(FabricAction::RdmaWrite {
            conn,
            wr,
            local,
            remote,
        })
    }
}

/// `D`, with the engine's actions rewritten by a [`Rewrite`] while one is set (none: `D` as
/// it is). Everything else is `D`'s, and `D` itself is reached through `Deref`.
pub struct Tamper<D> {
    inner: D,
    rewrite: Option<Rewrite>,
    /// Swallowed work requests, reported done at the next poll.
    swallowed: Vec<(ConnId, WrId)>,
}

impl<D: Driver> Tamper<D> {
    /// `inner`, honest until [`Tamper::set`].
    pub fn new(inner: D) -> Tamper<D> {
        Tamper {
            inner,
            rewrite: None,
            swallowed: Vec::new(),
        }
    }

    /// Rewrites every action from now on (`None`: none).
    pub fn set(&mut self, rewrite: Option<Rewrite>) {
        self.rewrite = rewrite;
    }
}

impl<D> std::ops::Deref for Tamper<D> {
    type Target = D;
    fn deref(&self) -> &D {
        &self.inner
    }
}

impl<D> std::ops::DerefMut for Tamper<D> {
    fn deref_mut(&mut self) -> &mut D {
        &mut self.inner
    }
}

impl<D: Driver> Driver for Tamper<D> {
    fn apply(&mut self, now: Instant, action: FabricAction) {
        let Some(rewrite) = self.rewrite.as_mut() else {
            return self.inner.apply(now, action);
        };
        let work = match &action {
            FabricAction::Send { conn, wr, .. } | FabricAction::RdmaWrite { conn, wr, .. } => {
                Some((*conn, *wr))
            }
            _ => None,
        };
        match rewrite(action) {
            Some(a) => self.inner.apply(now, a),
            None => self.swallowed.extend(work),
        }
    }

    fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        sink: &mut dyn FabricSink,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()> {
        let mut timeout = timeout;
        if !self.swallowed.is_empty() {
            let t = now();
            for (conn, wr) in self.swallowed.drain(..) {
                sink.handle_send_complete(t, conn, wr, WcStatus::Success);
            }
            timeout = Some(std::time::Duration::ZERO);
        }
        self.inner.poll(timeout, sink, now)
    }

    fn set_waker(&mut self, fd: std::os::fd::RawFd) {
        self.inner.set_waker(fd)
    }

    fn set_doorbell(&mut self, bell: Doorbell) {
        self.inner.set_doorbell(bell)
    }

    fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.readiness_fd()
    }

    fn watch(&mut self, fd: std::os::fd::RawFd) -> bool {
        self.inner.watch(fd)
    }

    fn has_queued_work(&self) -> bool {
        !self.swallowed.is_empty() || self.inner.has_queued_work()
    }

    fn take_woken(&mut self) -> bool {
        self.inner.take_woken()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.inner.counters()
    }

    fn abandon(&mut self) {
        self.inner.abandon()
    }

    fn registry(&mut self) -> Option<&mut dyn Registry> {
        self.inner.registry()
    }

    fn sees_writes(&self) -> bool {
        self.inner.sees_writes()
    }
}
