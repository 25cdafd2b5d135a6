//! LNet health, as Lustre 2.16 keeps it (lib-msg.c, lnet_health_check; lib-lnet.h, the
//! health value helpers): each local NI and each peer NI has a health value, at most
//! [`MAX_HEALTH`]. A failed message costs the NI (local failures) or the peer NI (remote
//! failures) `health_sensitivity`; a message that worked gives it back; a peer NI below the
//! maximum is in recovery and gets recovery pings, 1, 2, 4 ... s apart up to
//! `max_recovery_ping_interval`, for at most `recovery_limit` seconds (0: for ever); a local
//! NI below the maximum gets them too, to its own NID through its own LND
//! (lnet_recover_local_nis), until it is back.
//! `health_sensitivity` 0 turns it off: values stay at the maximum (the counters still count).
//!
//! Which failures touch a peer NI's health follows lnet_health_check for single-rail peers
//! (every ulnet peer has one NI): only when the peer is a gateway or this node routes, where
//! health is what judges a router or a routed-to peer. A local NI's health is judged only on
//! a node with two NIs or more (Lustre 2.16: one NI is the only path), and never for a failed
//! recovery ping. A remote failure is never resent (that
//! needs a peer with a second NI); a local one (still queued on a connection that timed out)
//! is, up to `retry_count` times, each attempt within `transaction_timeout`, on a node with
//! two NIs or more, as lnet_attempt_msg_resend does (`LnetNode::resend`).

use lnd::iface::TxError;
use std::collections::BTreeSet;

use lnd::time::{Duration, Instant};
use lnd::wire::Nid;

use crate::LnetError;

/// LNET_MAX_HEALTH_VALUE.
pub const MAX_HEALTH: u32 = 1000;

/// How a message ended, as LNet health sorts it (enum lnet_msg_hstatus).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HStatus {
    LocalInterrupt,
    LocalDropped,
    LocalAborted,
    LocalNoRoute,
    LocalTimeout,
    LocalError,
    RemoteDropped,
    RemoteError,
    RemoteTimeout,
    NetworkTimeout,
}

impl HStatus {
    /// The health status of a failed message; `None` for failures health does not judge (a
    /// payload too large, a malformed reply, an LNet-level response timeout).
    pub fn of(e: &LnetError) -> Option<HStatus> {
        Some(match e {
            LnetError::NoRoute(_) | LnetError::HopLimit(_) => HStatus::LocalNoRoute,
            // Dropped for a next hop LNet holds down (lnet_check_message_drop): the peer is
            // not alive, REMOTE_DROPPED (lib-move.c).
            LnetError::PeerDown(_) => HStatus::RemoteDropped,
            LnetError::Lnd(TxError::Shutdown) | LnetError::Shutdown => HStatus::LocalAborted,
            // o2iblnd's kiblnd_abort_txs: what was queued on a connection that closed is
            // LOCAL_ERROR, or LOCAL_TIMEOUT when the connection closed on a timeout (never
            // sent: LNet may resend it); what was posted and failed is REMOTE_DROPPED
            // (kiblnd_tx_complete).
            LnetError::Lnd(TxError::ConnAborted)
            | LnetError::Refused(_)
            | LnetError::Loop(_)
            | LnetError::BulkUnsupported(_) => HStatus::LocalError,
            LnetError::Lnd(TxError::ConnTimedOut) => HStatus::LocalTimeout,
            LnetError::Lnd(TxError::SendFailed) => HStatus::RemoteDropped,
            // o2iblnd fails with NETWORK_TIMEOUT what waited for a connection that never came
            // (kiblnd_peer_connect_failed), what was in flight on a connection that timed out
            // (kiblnd_abort_txs, kiblnd_check_conns) and what its transport gave up on.
            LnetError::Lnd(
                TxError::ConnectFailed | TxError::PeerUnreachable | TxError::Timeout,
            ) => HStatus::NetworkTimeout,
            // A refused connect: the peer is there and said no (ECONNREFUSED, REMOTE_DROPPED).
            LnetError::Lnd(TxError::ConnectRefused) => HStatus::RemoteDropped,
            LnetError::Lnd(TxError::Rdma(_)) => HStatus::RemoteError,
            // The peer did not fill memory we granted it in time: it is there but failing
            // (our grant_timeout, where o2iblnd would wait for its LND timeout).
            LnetError::Lnd(TxError::GrantExpired) => HStatus::RemoteTimeout,
            // Lustre's deadline drop (lnet_post_send_locked) is NETWORK_TIMEOUT.
            LnetError::Expired => HStatus::NetworkTimeout,
            // Our own shedding of answers to a peer that does not take them: no path failed.
            LnetError::Timeout
            | LnetError::PayloadTooLarge { .. }
            | LnetError::BadReply(_)
            | LnetError::Backlog(_) => return None,
        })
    }

    /// Whether a node with another NI may send the message again (lnet_health_check's
    /// attempt_local_resend): the local statuses of a message that was never sent. Not
    /// LOCAL_ERROR, and nothing remote.
    pub fn is_resendable(self) -> bool {
        matches!(
            self,
            HStatus::LocalInterrupt
                | HStatus::LocalDropped
                | HStatus::LocalAborted
                | HStatus::LocalNoRoute
                | HStatus::LocalTimeout
        )
    }

    /// Whether it costs the local NI health (lnet_handle_local_failure). Not LOCAL_NO_ROUTE:
    /// a message without a route never had an NI (Lustre sets it before any NI is chosen).
    pub fn is_local(self) -> bool {
        matches!(
            self,
            HStatus::LocalInterrupt
                | HStatus::LocalDropped
                | HStatus::LocalAborted
                | HStatus::LocalTimeout
                | HStatus::LocalError
                | HStatus::NetworkTimeout
        )
    }

    /// Whether it costs the peer NI health (lnet_handle_remote_failure).
    pub fn is_remote(self) -> bool {
        matches!(
            self,
            HStatus::RemoteDropped
                | HStatus::RemoteError
                | HStatus::RemoteTimeout
                | HStatus::NetworkTimeout
        )
    }
}

/// One health value and its recovery state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Health {
    pub value: u32,
    /// Recovery pings sent since it last worked.
    pub ping_count: u32,
    /// When the next recovery ping is due, while in recovery.
    pub next_ping: Option<Instant>,
    /// A recovery ping is out (LNET_PEER_NI_RECOVERY_PENDING): no other goes until it ends.
    pub pending: bool,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            value: MAX_HEALTH,
            ping_count: 0,
            next_ping: None,
            pending: false,
        }
    }
}

impl Health {
    /// A failure: `sensitivity` less, down to 0 (lnet_dec_healthv_locked).
    pub fn fail(&mut self, sensitivity: u32) {
        self.value = self.value.saturating_sub(sensitivity);
    }

    /// Into recovery if below the maximum and not there yet (lnet_peer_ni_add_to_recoveryq):
    /// the first recovery ping after 2^ping_count s, at most `max_interval_secs`.
    pub fn enter_recovery(&mut self, now: Instant, max_interval_secs: u32) {
        if self.value < MAX_HEALTH && self.next_ping.is_none() {
            self.next_ping = Some(next_recovery_ping(self.ping_count, now, max_interval_secs));
        }
    }

    /// A success: `sensitivity` more, up to the maximum (lnet_inc_healthv); out of recovery at
    /// the maximum.
    pub fn succeed(&mut self, sensitivity: u32) {
        self.value = self.value.saturating_add(sensitivity).min(MAX_HEALTH);
        self.ping_count = 0;
        if self.value == MAX_HEALTH {
            self.leave_recovery();
        }
    }

    /// Straight to the maximum: a message from a router, or any message while routing
    /// (lnet_set_lpni_healthv_locked in lnet_health_check).
    pub fn restore(&mut self) {
        self.value = MAX_HEALTH;
        self.ping_count = 0;
        self.leave_recovery();
    }

    fn leave_recovery(&mut self) {
        self.next_ping = None;
    }

    /// In the recovery queue.
    pub fn in_recovery(&self) -> bool {
        self.next_ping.is_some()
    }

    /// A recovery ping goes now: count it, and set when the next one is due.
    pub fn pinged(&mut self, now: Instant, max_interval_secs: u32) {
        self.ping_count = self.ping_count.saturating_add(1);
        if self.next_ping.is_some() {
            self.next_ping = Some(next_recovery_ping(self.ping_count, now, max_interval_secs));
        }
    }

    /// Gives up recovering (recovery_limit): the value stays where it is, the ping count
    /// starts again (lnet_recover_peer_nis).
    pub fn stop_recovery(&mut self) {
        self.leave_recovery();
        self.ping_count = 0;
    }
}

/// Whether `recovery_limit` (seconds, 0: none) has run out for a peer NI last heard from at
/// `last_alive` (never: `None`): measured from lpni_last_alive, as lnet_recover_peer_nis and
/// lnet_peer_ni_add_to_recoveryq_locked do.
pub fn recovery_expired(last_alive: Option<Instant>, now: Instant, limit_secs: u32) -> bool {
    if limit_secs == 0 {
        return false;
    }
    match last_alive {
        None => true,
        Some(t) => now.saturating_duration_since(t) > Duration::from_secs(u64::from(limit_secs)),
    }
}

/// lnet_get_next_recovery_ping: 2^ping_count seconds from now, at most `max_interval_secs`.
pub fn next_recovery_ping(ping_count: u32, now: Instant, max_interval_secs: u32) -> Instant {
    let secs = if ping_count >= 31 {
        u64::from(max_interval_secs)
    } else {
        (1u64 << ping_count).min(u64::from(max_interval_secs.max(1)))
    };
    now.saturating_add(Duration::from_secs(secs))
}

/// A health counter struct: a `u64` per status it counts, and `count` (lnet_incr_hstats) to
/// add one; the statuses it does not list are another struct's to count.
macro_rules! health_counters {
    ($(#[$doc:meta])* $name:ident { $($field:ident: $status:ident,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $(pub $field: u64,)*
        }

        impl $name {
            /// Counts a status (lnet_incr_hstats).
            pub fn count(&mut self, h: HStatus) {
                match h {
                    $(HStatus::$status => self.$field += 1,)*
                    _ => {}
                }
            }
        }
    };
}

health_counters! {
    /// A local NI's health counters, under `net show`'s `health stats` names.
    NiHealthStats {
        interrupts: LocalInterrupt,
        dropped: LocalDropped,
        aborted: LocalAborted,
        no_route: LocalNoRoute,
        timeouts: LocalTimeout,
        error: LocalError,
    }
}

health_counters! {
    /// A peer NI's health counters, under `peer show`'s `health stats` names.
    PeerHealthStats {
        dropped: RemoteDropped,
        timeout: RemoteTimeout,
        error: RemoteError,
        network_timeout: NetworkTimeout,
    }
}

// ---------------------------------------------------------------------- the node's sub-state

/// The health tunables and the peer NIs in recovery (below the maximum), pinged at the
/// recovery tick.
pub(crate) struct Recovery {
    pub(crate) cfg: HealthCfg,
    pub(crate) peers: BTreeSet<Nid>,
}

impl Recovery {
    pub(crate) fn new(cfg: HealthCfg) -> Recovery {
        Recovery {
            cfg,
            peers: BTreeSet::new(),
        }
    }
}

/// The health tunables, read on the per-message path, cached from the globals.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HealthCfg {
    pub(crate) sensitivity: u32,
    /// retry_count: resends of a local failure (0: none).
    pub(crate) retry_count: u32,
    pub(crate) recovery_limit: u32,
    pub(crate) max_ping_interval: u32,
    pub(crate) transaction_timeout: u64,
}

impl HealthCfg {
    pub(crate) fn of(g: &crate::GlobalTunables) -> HealthCfg {
        let get = |n: &str| g.get(n).map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX));
        HealthCfg {
            sensitivity: get("health_sensitivity"),
            retry_count: get("retry_count"),
            recovery_limit: get("recovery_limit"),
            max_ping_interval: get("max_recovery_ping_interval").max(1),
            transaction_timeout: u64::from(get("transaction_timeout").max(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's health after one failure at sensitivity 100, in recovery since `t0` (pings
    /// at most every 900 s).
    fn failed_once(t0: Instant) -> Health {
        let mut h = Health::default();
        h.fail(100);
        h.enter_recovery(t0, 900);
        h
    }

    #[test]
    fn a_failure_costs_the_sensitivity_and_a_success_gives_it_back() {
        let t0 = Instant::from_secs(10);
        let mut h = failed_once(t0);
        assert_eq!(h.value, 900);
        assert!(h.in_recovery());
        assert_eq!(h.next_ping, Some(Instant::from_secs(11)), "2^0 s");
        for _ in 0..20 {
            h.fail(100);
        }
        assert_eq!(h.value, 0, "never below 0");
        h.succeed(100);
        assert_eq!(h.value, 100);
        assert!(h.in_recovery());
        h.restore();
        assert_eq!((h.value, h.in_recovery()), (MAX_HEALTH, false));
        // Sensitivity 0: health off, nothing moves.
        let mut off = Health::default();
        off.fail(0);
        off.enter_recovery(t0, 900);
        assert_eq!((off.value, off.in_recovery()), (MAX_HEALTH, false));
    }

    #[test]
    fn recovery_pings_back_off_to_the_maximum_interval() {
        let t0 = Instant::from_secs(100);
        let mut h = failed_once(t0);
        let mut gaps = Vec::new();
        let mut now = t0;
        for _ in 0..12 {
            h.pinged(now, 900);
            let next = h.next_ping.unwrap();
            gaps.push(next.saturating_duration_since(now).as_secs());
            now = next;
        }
        assert_eq!(gaps, [2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900, 900]);
        // A limit counts from when the peer was last heard from; never heard: expired.
        assert!(!recovery_expired(Some(t0), now, 0), "no limit");
        assert!(recovery_expired(Some(t0), now, 60));
        assert!(!recovery_expired(Some(t0), t0, 60));
        assert!(recovery_expired(None, t0, 60));
        assert!(!recovery_expired(None, t0, 0));
        // Re-entering after a stop starts the backoff again, capped by the maximum.
        h.stop_recovery();
        h.enter_recovery(now, 900);
        assert_eq!(
            h.next_ping,
            Some(now.saturating_add(Duration::from_secs(1)))
        );
    }

    #[test]
    fn failures_sort_as_lnet_health_sorts_them() {
        use HStatus::*;
        let cases = [
            (LnetError::Lnd(TxError::Timeout), Some(NetworkTimeout)),
            (
                LnetError::Lnd(TxError::PeerUnreachable),
                Some(NetworkTimeout),
            ),
            (LnetError::Lnd(TxError::ConnectFailed), Some(NetworkTimeout)),
            (LnetError::Lnd(TxError::ConnectRefused), Some(RemoteDropped)),
            (LnetError::Lnd(TxError::ConnAborted), Some(LocalError)),
            (LnetError::Lnd(TxError::ConnTimedOut), Some(LocalTimeout)),
            (LnetError::Lnd(TxError::SendFailed), Some(RemoteDropped)),
            (LnetError::Lnd(TxError::Shutdown), Some(LocalAborted)),
            (LnetError::Timeout, None),
        ];
        for (e, want) in cases {
            assert_eq!(HStatus::of(&e), want, "{e:?}");
        }
        assert!(NetworkTimeout.is_local() && NetworkTimeout.is_remote());
        assert!(LocalAborted.is_local() && !LocalAborted.is_remote());
        assert!(RemoteError.is_remote() && !RemoteError.is_local());
    }
}
