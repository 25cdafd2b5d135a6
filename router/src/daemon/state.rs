//! What the daemon's threads share ([`Daemon`]): the NI set and its epochs ([`Members`]), the
//! node-wide settings every NI holds, the router buffers' pool, the stop and the first fatal
//! error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use crate::alive::NetAlive;
use crate::bulk_pool::{BulkPlan, BulkPool, LoopId};
use crate::control::{errno, ControlError, Request, Response};
use crate::relay::ChannelLink;
use crate::yaml_config::{DaemonConfig, FabricKind};
use crate::{BufferCounts, LnetNode};
use lnd::driver::{MonotonicClock, WakeHandle};
use lnd::time::Duration;
use lnd::wire::Nid;
use tracing::warn;

use super::args::NiThreads;
use super::fabric::PeerAddrs;

/// How long the loop may block before it looks at control requests and signals again.
pub(super) const MAX_WAIT: StdDuration = StdDuration::from_millis(20);
/// How long a graceful shutdown may take before the daemon exits anyway.
pub(super) const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);
/// How long a change of the NIs or the node-wide settings waits for every NI loop to take it
/// (each is woken for it: a turn or two).
pub(super) const ADOPT_BOUND: StdDuration = StdDuration::from_secs(2);
/// The most rounds a change publishes for the router buffers for bulk data: the buffers, the
/// table once every NI has them, what an NI gave back handed to another, and one to spare
/// (`crate::bulk_pool`; what is still lent then follows when it comes back).
pub(super) const BULK_ROUNDS: usize = 4;
/// A request and where its answer goes: one response, or for a capture the whole stream
/// (bounded: the loop never blocks on a slow client).
pub(super) type ControlMsg = (Request, SyncSender<Response>);

/// A lock that a panicked holder left poisoned is still the daemon's state: taken anyway.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The daemon as its threads share it: the NIs it runs, the stop, the settings an NI added at
/// run time starts with.
pub(super) struct Daemon {
    pub(super) set: NiSet,
    pub(super) shared: Shutdown,
    /// The configuration the daemon started with: what an added NI takes from it besides its
    /// own settings (gateway health, selftest, where peers listen).
    pub(super) base: DaemonConfig,
    pub(super) clock: MonotonicClock,
    /// The next NI's incarnation: every NI started gets its own, so that a NID removed and
    /// added again is a new instance to its peers (they drop what they held for the old one).
    pub(super) next_incarnation: AtomicU64,
    pub(super) threading: NiThreads,
    /// Where peers listen: the file's `peers:` and every imported document's since, read by
    /// every NI's fabric at each connect.
    pub(super) peers: PeerAddrs,
    /// The router's large buffers for bulk data, for the whole node: planned here, registered
    /// by each NI loop with its own fabric (see `crate::bulk_pool`).
    pub(super) bulk: Mutex<BulkPool>,
    /// The next NI loop's id in the pool (a NID removed and added again is another loop).
    pub(super) next_loop: AtomicU64,
    /// A node with no NI of its own that knows every NID: it checks and keeps the node-wide
    /// settings (`route`, `set`, `routing`, buffers), which every NI then adopts
    /// ([`NodeSettings`]), and answers while the daemon runs no NI.
    pub(super) template: Mutex<LnetNode>,
}

/// The NIs the daemon runs now, as the control side and every NI loop reach them. `net
/// add|del` change it at run time: each change publishes a new [`Members`] and bumps
/// `epoch`, so that a loop notices with one load per turn and then adopts it (its node's
/// NIDs, its handover links).
#[derive(Default)]
pub(super) struct NiSet {
    pub(super) epoch: AtomicU64,
    pub(super) members: Mutex<Arc<Members>>,
    /// Every NI thread not yet joined: the main thread joins them at the end, `net del` the
    /// ones it stopped. A thread is added only while no stop is asked, under this lock.
    pub(super) threads: Mutex<Vec<NiThread>>,
    /// One NI change at a time (held through a whole `net add|del`, its join included).
    pub(super) change: Mutex<()>,
}

pub(super) struct NiThread {
    /// `None`: the one thread of `--ni-threads shared`.
    pub(super) nid: Option<Nid>,
    pub(super) handle: std::thread::JoinHandle<()>,
}

/// The NIs at one epoch, in order (the configuration's, then as added), their nets' liveness
/// board (one slot per NID, in the same order; see `crate::alive`), and the node-wide
/// settings every one of them holds.
pub(super) struct Members {
    pub(super) epoch: u64,
    pub(super) list: Vec<Member>,
    /// NIs being removed: gone from every table, but still closing, and owed the ends of
    /// what they forwarded (only `Handover::Done`s go to them).
    pub(super) leaving: Vec<Member>,
    pub(super) board: NetAlive,
    pub(super) settings: Arc<NodeSettings>,
    /// The router buffers for bulk data: what each NI registers and lends out.
    pub(super) bulk: Arc<BulkPlan>,
}

impl Default for Members {
    fn default() -> Members {
        Members {
            epoch: 0,
            list: Vec::new(),
            leaving: Vec::new(),
            board: NetAlive::new(0),
            settings: Arc::default(),
            bulk: Arc::default(),
        }
    }
}

/// What every NI runtime of the daemon holds the same: the routes, LNet's globals, whether it
/// routes, and the router buffers' totals (each runtime is a CPT with an equal share). The
/// template node checks and keeps them; a change is published with the NIs and each loop
/// adopts it at its next turn, so an NI added later starts with them too, and no loop can
/// miss a change another took.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct NodeSettings {
    pub(super) routes: Vec<crate::RouteConfig>,
    pub(super) globals: crate::GlobalTunables,
    pub(super) routing: bool,
    pub(super) buffers: BufferCounts,
    /// `routing:`'s module parameters (the router pinger's).
    pub(super) gateway_health: crate::GatewayHealthConfig,
}

impl NodeSettings {
    pub(super) fn of(t: &LnetNode) -> NodeSettings {
        NodeSettings {
            routes: t.routes().routes().copied().collect(),
            globals: t.globals().clone(),
            routing: t.routing_enabled(),
            buffers: t.routing_info().buffers(),
            gateway_health: t.gateway_health(),
        }
    }
}

/// The NI loops of `list` as the bulk pool knows them.
pub(super) fn pool_members(list: &[Member]) -> Vec<(LoopId, Nid)> {
    list.iter().map(|m| (m.id, m.nid)).collect()
}

impl Members {
    pub(super) fn nids(&self) -> Vec<Nid> {
        self.list.iter().map(|m| m.nid).collect()
    }

    pub(super) fn index_of(&self, nid: &str) -> Option<usize> {
        self.list.iter().position(|l| l.nid.to_string() == nid)
    }
}

/// One NI's loop as the control side and the other loops reach it.
#[derive(Clone)]
pub(super) struct Member {
    pub(super) nid: Nid,
    /// Its loop, in the bulk pool.
    pub(super) id: LoopId,
    /// Its fabric, and the address it listens on, as bound (`net add` refuses another NI on it).
    pub(super) kind: FabricKind,
    pub(super) listen: Option<std::net::SocketAddr>,
    /// Its control requests, and its waker.
    pub(super) ctl: SyncSender<ControlMsg>,
    pub(super) wake: WakeHandle,
    /// Its handovers (forwarded messages and their releases), and whether a handover wakes
    /// it (not when every loop shares one thread: each is stepped every round).
    pub(super) hand: ChannelLink,
    /// Set by `net del`: the loop shuts its NI down gracefully and ends.
    pub(super) stop: Arc<AtomicBool>,
    /// The last epoch this loop adopted: once every loop has adopted a change, none acts on
    /// what it replaced (a removed NI is handed nothing more).
    pub(super) adopted: Arc<AtomicU64>,
    /// Cleared when the loop ends, however it ends: nobody waits for it to adopt anything.
    pub(super) running: Arc<AtomicBool>,
    /// Where the loop publishes its counters for the metrics endpoint (`super::metrics`).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(super) metrics: Arc<super::metrics::snapshot::SnapshotSlot>,
}

impl Member {
    /// Whether this loop has yet to adopt `epoch` (false for one that has ended).
    pub(super) fn behind(&self, epoch: u64) -> bool {
        self.running.load(Ordering::Acquire) && self.adopted.load(Ordering::Acquire) < epoch
    }
}

impl Member {
    /// Hands a request to this loop and wakes it; the answer comes on `reply`.
    pub(super) fn submit(
        &self,
        req: Request,
        reply: SyncSender<Response>,
    ) -> Result<(), ControlError> {
        match self.ctl.try_send((req, reply)) {
            Ok(()) => {
                self.wake.wake();
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(ControlError::new(
                errno::EIO,
                "the daemon is busy (control queue full); try again",
            )),
            Err(TrySendError::Disconnected(_)) => Err(ControlError::new(
                errno::ESHUTDOWN,
                "the daemon is shutting down",
            )),
        }
    }
}

impl NiSet {
    pub(super) fn snapshot(&self) -> Arc<Members> {
        Arc::clone(&lock(&self.members))
    }

    /// Publishes these NIs (and those leaving) with these settings and this plan of the bulk
    /// buffers as the next epoch; returns it.
    pub(super) fn publish(
        &self,
        list: Vec<Member>,
        leaving: Vec<Member>,
        board: NetAlive,
        settings: Arc<NodeSettings>,
        bulk: Arc<BulkPlan>,
    ) -> u64 {
        let mut m = lock(&self.members);
        let epoch = m.epoch + 1;
        *m = Arc::new(Members {
            epoch,
            list,
            leaving,
            board,
            settings,
            bulk,
        });
        self.epoch.store(epoch, Ordering::Release);
        epoch
    }
}

impl Daemon {
    pub(super) fn wake_all(&self) {
        for m in &self.set.snapshot().list {
            m.wake.wake();
        }
    }

    /// Publishes `list` (on `board`; `leaving` as in [`Members`]) with the template's
    /// settings, wakes every loop and waits (bounded) until each has adopted it, so that what
    /// the caller answers is what every NI holds. The router buffers for bulk data follow in
    /// a few more rounds, each waited for the same way: every NI registers the buffers the
    /// change needs, then the table that names them (with every NI that has them) is
    /// published, then what an NI gave back goes to another (`crate::bulk_pool`). Called
    /// with `set.change` held.
    pub(super) fn publish(&self, list: Vec<Member>, leaving: Vec<Member>, board: NetAlive) {
        let settings = Arc::new(NodeSettings::of(&lock(&self.template)));
        let waiting: Vec<Member> = list.iter().chain(&leaving).cloned().collect();
        let started = std::time::Instant::now();
        for round in 0..BULK_ROUNDS {
            let plan = lock(&self.bulk).plan(
                &pool_members(&list),
                &leaving.iter().map(|m| m.id).collect::<Vec<_>>(),
                settings.routing,
                settings.buffers.large,
                round == 0,
            );
            let Some(plan) = plan else { break };
            let epoch = self.set.publish(
                list.clone(),
                leaving.clone(),
                board.clone(),
                Arc::clone(&settings),
                plan,
            );
            for m in &waiting {
                m.wake.wake();
            }
            for m in &waiting {
                while m.behind(epoch) {
                    if started.elapsed() >= ADOPT_BOUND || self.shared.stop.load(Ordering::Relaxed)
                    {
                        warn!(nid = %m.nid, "an NI loop has not taken the daemon's change yet; it will at its next turn");
                        return;
                    }
                    std::thread::sleep(StdDuration::from_millis(1));
                }
            }
        }
    }

    /// The bulk buffers' next round outside any change: what NIs released or registered since
    /// (a buffer lent when `set large_buffers` shrank the pool, an NI slow to adopt) is handed
    /// on or retired. Published without waiting; skipped while a change is under way (its own
    /// rounds see it).
    pub(super) fn tidy_bulk(&self) {
        let _one = match self.set.change.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        let m = self.set.snapshot();
        let plan = lock(&self.bulk).plan(
            &pool_members(&m.list),
            &m.leaving.iter().map(|m| m.id).collect::<Vec<_>>(),
            m.settings.routing,
            m.settings.buffers.large,
            false,
        );
        if let Some(plan) = plan {
            self.set.publish(
                m.list.clone(),
                m.leaving.clone(),
                m.board.clone(),
                Arc::clone(&m.settings),
                plan,
            );
            for x in m.list.iter().chain(&m.leaving) {
                x.wake.wake();
            }
        }
    }
}

/// What the NI threads share: the stop every one of them obeys, and the first fatal error.
#[derive(Default)]
pub(super) struct Shutdown {
    pub(super) stop: AtomicBool,
    pub(super) fatal: Mutex<Option<String>>,
}

impl Shutdown {
    /// Records a fatal error (the first one is reported) and stops every NI.
    pub(super) fn fail(&self, e: String) {
        lock(&self.fatal).get_or_insert(e);
        self.stop.store(true, Ordering::Relaxed);
    }
}

pub(super) fn shutting_down() -> Response {
    Response::Error(ControlError::new(
        errno::ESHUTDOWN,
        "the daemon is shutting down",
    ))
}
