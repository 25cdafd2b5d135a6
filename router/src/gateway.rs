//! Gateway health as a node using routes sees it (reference sections 6.4 and 6.5; router.c
//! lnet_check_routers, lnet_router_discovery_ping_reply, lnet_notify).
//!
//! Every gateway this node reaches through one of its own NIs is pinged every
//! `alive_router_check_interval`; a reply within `router_ping_timeout` marks it alive and
//! records what it says of itself (RTE_DISABLED: it does not forward; the nets on which it has
//! an NI up), a failure or a timeout marks it dead. The LND's news counts too, at once: the
//! gateway's peer NI going down marks it dead, coming up marks it alive (lnet_notify), and a
//! message the gateway forwards to us revives it (passive revival, lnet_parse). A route is
//! usable when its gateway is alive, forwards, and, with `avoid_asym_router_failure` on, for a
//! single-hop route, lists an NI up on the route's net.
//!
//! A gateway starts alive (Lustre's `check_routers_before_use` = 0), so a node with routes
//! sends at once, and the first ping goes out at once. A dead gateway is pinged again sooner
//! than the interval: after 1 s, then 2, 4 ... up to the interval (Lustre 2.8 had a separate
//! `dead_router_check_interval`), so a router that starts after its clients, or comes back, is
//! used within seconds rather than a minute.

use tracing::info;

use std::collections::{BTreeMap, BTreeSet};

use lnd::time::{Duration, Instant};
use lnd::wire::{Net, Nid};

use crate::ping::PingReply;
use crate::routes::RouteConfig;

/// Lustre's `alive_router_check_interval` default (seconds).
pub const DEFAULT_ROUTER_CHECK_INTERVAL: u32 = 60;
/// Lustre's `router_ping_timeout` default (seconds).
pub const DEFAULT_ROUTER_PING_TIMEOUT: u32 = 50;

/// The most seconds `alive_router_check_interval` and `router_ping_timeout` take, in the
/// configuration file and in an import at run time alike.
pub const MAX_ROUTER_CHECK_SECS: u32 = 86_400;

/// The first re-ping of a gateway whose ping failed.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// How gateways are watched.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GatewayHealthConfig {
    /// `alive_router_check_interval`: how often each gateway is pinged (0: never).
    pub check_interval: Duration,
    /// `router_ping_timeout`: how long a gateway ping may take.
    pub ping_timeout: Duration,
    /// `avoid_asym_router_failure`: do not use a single-hop route whose gateway has no NI up
    /// on the route's net.
    pub avoid_asym: bool,
}

impl Default for GatewayHealthConfig {
    fn default() -> GatewayHealthConfig {
        GatewayHealthConfig {
            check_interval: Duration::from_secs(u64::from(DEFAULT_ROUTER_CHECK_INTERVAL)),
            ping_timeout: Duration::from_secs(u64::from(DEFAULT_ROUTER_PING_TIMEOUT)),
            avoid_asym: true,
        }
    }
}

/// One gateway's health.
#[derive(Clone, Debug)]
struct Gateway {
    alive: bool,
    /// From its last ping reply: it does not forward.
    rte_disabled: bool,
    /// From its last ping reply: the nets on which it lists an NI up (`None` before any reply).
    up_nets: Option<BTreeSet<Net>>,
    /// From its last ping reply: every net on which it lists an NI, up or down (Lustre's
    /// lr_single_hop comes from these, whatever their status): it delivers there directly.
    nets: Option<BTreeSet<Net>>,
    /// When to ping it next.
    next_ping: Instant,
    /// The ping in flight, if any.
    pinging: Option<u64>,
    /// How soon to ping again after a failure (doubles up to the interval).
    retry: Duration,
    pings: u64,
    ping_failures: u64,
    /// Times it went from alive to dead and back.
    downs: u64,
    ups: u64,
}

impl Gateway {
    /// A failure (a ping without a reply, or the connection lost): the next ping in `retry`,
    /// which doubles up to the interval.
    fn retry_soon(&mut self, now: Instant, interval: Duration) {
        self.next_ping = self.next_ping.min(now + self.retry);
        self.retry = (self.retry + self.retry).min(interval.max(FIRST_RETRY));
    }
}

/// What `route show -v` and tests read of a gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayInfo {
    pub nid: Nid,
    pub alive: bool,
    pub rte_disabled: bool,
    pub pings: u64,
    pub ping_failures: u64,
    pub downs: u64,
    pub ups: u64,
}

/// Every gateway of the node's routes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Gateways {
    cfg: GatewayHealthConfig,
    map: BTreeMap<Nid, Gateway>,
}

impl Gateways {
    pub fn new(cfg: GatewayHealthConfig, gateways: &[Nid], now: Instant) -> Gateways {
        let mut g = Gateways {
            cfg,
            map: BTreeMap::new(),
        };
        g.set(gateways, now);
        g
    }

    /// The gateways are now `gateways` (routes changed): new ones start alive and are pinged
    /// at once, gone ones are forgotten, the others keep their state.
    pub fn set(&mut self, gateways: &[Nid], now: Instant) {
        self.map.retain(|g, _| gateways.contains(g));
        for &g in gateways {
            self.map.entry(g).or_insert(Gateway {
                alive: true,
                rte_disabled: false,
                up_nets: None,
                nets: None,
                next_ping: now,
                pinging: None,
                retry: FIRST_RETRY,
                pings: 0,
                ping_failures: 0,
                downs: 0,
                ups: 0,
            });
        }
    }

    pub fn config(&self) -> GatewayHealthConfig {
        self.cfg
    }

    /// New settings at run time (an import's `routing:` module parameters, as a module
    /// parameter written under /sys): a shorter interval brings each gateway's next ping
    /// forward to at most one new interval from `now`; a longer one takes effect after it.
    pub fn set_config(&mut self, cfg: GatewayHealthConfig, now: Instant) {
        if cfg.check_interval != self.cfg.check_interval && cfg.check_interval != Duration::ZERO {
            for g in self.map.values_mut() {
                g.next_ping = g.next_ping.min(now + cfg.check_interval);
            }
        }
        self.cfg = cfg;
    }

    pub fn is_gateway(&self, nid: Nid) -> bool {
        self.map.contains_key(&nid)
    }

    /// Whether route `r` may be used now.
    pub fn route_alive(&self, r: &RouteConfig) -> bool {
        let Some(g) = self.map.get(&r.gateway) else {
            return false;
        };
        if !g.alive || g.rte_disabled {
            return false;
        }
        // From its last ping reply, as lnet_router_discovery_ping_reply decides (router.c);
        // before any reply (or with pings off) the gateway's aliveness alone.
        let (Some(nets), Some(up)) = (&g.nets, &g.up_nets) else {
            return true;
        };
        // Its NI on our net, the one we reach it by, must be up (lnet_is_gateway_net_alive).
        if !up.contains(&r.gateway.net()) {
            return false;
        }
        // avoid_asym_router_failure: a route the gateway ends itself (it lists an NI on the
        // route's net, whatever the configured hops), or one configured as single-hop, needs
        // an NI of the gateway up on that net. A multi-hop route through a gateway with no NI
        // there (undefined hops included: Lustre's LNET_UNDEFINED_HOPS is not 1) does not.
        if self.cfg.avoid_asym && (r.hops == Some(1) || nets.contains(&r.net)) {
            return up.contains(&r.net);
        }
        true
    }

    /// Whether route `r`'s gateway delivers on the route's net itself (the hop rule,
    /// `Leg::of` in node.rs): its last ping reply listed an NI there, up or down (a gateway on
    /// the net delivers directly whatever it says of the NI; a net silent for a while is
    /// reported down); before any reply, or with pings off, the route's hop count says, 1 or
    /// undefined meaning yes, as Lustre takes an undefined count for 1. A gateway this runtime
    /// does not watch (on a sibling runtime's net) passes: the sibling that does decides when
    /// the message reaches it.
    pub fn is_last_hop(&self, r: &RouteConfig) -> bool {
        let Some(g) = self.map.get(&r.gateway) else {
            return true;
        };
        match &g.nets {
            Some(nets) => nets.contains(&r.net),
            None => r.hops.is_none_or(|h| h == 1),
        }
    }

    /// Sets the gateway's aliveness; true when it just died.
    fn mark(nid: Nid, g: &mut Gateway, alive: bool) -> bool {
        if g.alive == alive {
            return false;
        }
        if alive {
            g.ups += 1;
            info!(gateway = %nid, "gateway up");
        } else {
            g.downs += 1;
            info!(gateway = %nid, "gateway down");
        }
        g.alive = alive;
        !alive
    }

    /// The LND (or traffic) says the gateway is reachable, or not (lnet_notify, passive
    /// revival); true when it just died. A gateway found dead this way (its connection lost:
    /// a router restarting, say) is pinged again in `retry` (1 s after a good reply, then 2,
    /// 4 ... as its pings fail), as after a failed ping, not at its next interval: a router
    /// back within seconds is used within seconds, not after up to
    /// `alive_router_check_interval` (found by an operator's audit: 33-57 s at the default
    /// 60 s after a router restart).
    pub fn notify(&mut self, now: Instant, nid: Nid, alive: bool) -> bool {
        let interval = self.cfg.check_interval;
        self.map.get_mut(&nid).is_some_and(|g| {
            if !alive && g.alive {
                g.retry_soon(now, interval);
            }
            Gateways::mark(nid, g, alive)
        })
    }

    /// Gateways whose ping is due at `now` and that `reachable` says we can ping; each is
    /// marked as being pinged by the id `next_id` hands out.
    pub fn due(
        &mut self,
        now: Instant,
        reachable: impl Fn(Nid) -> bool,
        mut next_id: impl FnMut() -> u64,
    ) -> Vec<(Nid, u64)> {
        if self.cfg.check_interval == Duration::ZERO {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (&nid, g) in &mut self.map {
            if g.pinging.is_none() && g.next_ping <= now && reachable(nid) {
                let id = next_id();
                g.pinging = Some(id);
                g.pings += 1;
                g.next_ping = now + self.cfg.check_interval;
                out.push((nid, id));
            }
        }
        out
    }

    /// The earliest time a ping is due (for the node's timer).
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.cfg.check_interval == Duration::ZERO {
            return None;
        }
        self.map
            .values()
            .filter(|g| g.pinging.is_none())
            .map(|g| g.next_ping)
            .min()
    }

    /// Ping `id` of gateway `nid` ended at `now`; true when the gateway just died.
    pub fn ping_done(
        &mut self,
        now: Instant,
        nid: Nid,
        id: u64,
        reply: Option<&PingReply>,
    ) -> bool {
        let interval = self.cfg.check_interval;
        let Some(g) = self.map.get_mut(&nid) else {
            return false;
        };
        if g.pinging != Some(id) {
            return false;
        }
        g.pinging = None;
        match reply {
            Some(r) => {
                g.rte_disabled = r.routing_disabled();
                let down: BTreeSet<Nid> = r.down_nids.iter().copied().collect();
                g.nets = Some(r.nids.iter().map(|n| n.net()).collect());
                g.up_nets = Some(
                    r.nids
                        .iter()
                        .filter(|n| !down.contains(n))
                        .map(|n| n.net())
                        .collect(),
                );
                // A gateway that says it does not forward, or lost the far net, is as good
                // as dead for the routes it no longer serves: `route_alive` tells per route.
                g.retry = FIRST_RETRY;
                g.next_ping = now + interval;
                Gateways::mark(nid, g, true);
                false
            }
            None => {
                g.ping_failures += 1;
                g.retry_soon(now, interval);
                Gateways::mark(nid, g, false)
            }
        }
    }

    pub fn info(&self) -> Vec<GatewayInfo> {
        self.map
            .iter()
            .map(|(&nid, g)| GatewayInfo {
                nid,
                alive: g.alive,
                rte_disabled: g.rte_disabled,
                pings: g.pings,
                ping_failures: g.ping_failures,
                downs: g.downs,
                ups: g.ups,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use testkit::nid;

    fn reply(nids: &[&str], down: &[&str], features: u32) -> PingReply {
        PingReply {
            primary_nid: nid(nids[0]),
            nids: nids.iter().map(|s| nid(s)).collect(),
            pid: 12345,
            features,
            multi_rail: false,
            down_nids: down.iter().map(|s| nid(s)).collect(),
        }
    }

    /// A gateway whose connection is lost (a router restarting) is pinged again within a
    /// second, then 2, 4 ... as pings fail, not at its next interval.
    #[test]
    fn a_gateway_lost_by_its_connection_is_pinged_again_soon() {
        use lnd::wire::ping::feat;
        let t0 = Instant::ZERO;
        let gw = nid("10.0.0.9@o2ib");
        let mut g = Gateways::new(GatewayHealthConfig::default(), &[gw], t0);
        assert_eq!(g.due(t0, |_| true, || 1), vec![(gw, 1)]);
        let up = reply(
            &["10.0.0.9@o2ib", "10.1.0.9@o2ib1"],
            &[],
            feat::BASE | feat::NI_STATUS,
        );
        g.ping_done(t0, gw, 1, Some(&up));
        assert_eq!(g.next_deadline(), Some(t0 + Duration::from_secs(60)));
        let lost = t0 + Duration::from_secs(5);
        assert!(g.notify(lost, gw, false), "it just died");
        assert_eq!(g.next_deadline(), Some(lost + Duration::from_secs(1)));
        // The router is not back yet: the ping fails, the next comes 2 s later.
        let at = lost + Duration::from_secs(1);
        assert_eq!(g.due(at, |_| true, || 2), vec![(gw, 2)]);
        g.ping_done(at, gw, 2, None);
        assert_eq!(g.next_deadline(), Some(at + Duration::from_secs(2)));
        // Back: the reply revives it and the interval applies again.
        let at = at + Duration::from_secs(2);
        assert_eq!(g.due(at, |_| true, || 3), vec![(gw, 3)]);
        g.ping_done(at, gw, 3, Some(&up));
        assert!(g.info()[0].alive);
        assert_eq!(g.next_deadline(), Some(at + Duration::from_secs(60)));
    }

    /// Each input's effect on whether a route through the gateway may be used, as a table.
    #[test]
    fn route_aliveness_follows_pings_and_notifications() {
        use lnd::wire::ping::feat;
        let t0 = Instant::ZERO;
        let gw = nid("10.0.0.9@o2ib");
        let r = RouteConfig {
            net: "o2ib1".parse().unwrap(),
            gateway: gw,
            hops: None,
            priority: 0,
        };
        let base = feat::BASE | feat::NI_STATUS;
        let mut g = Gateways::new(GatewayHealthConfig::default(), &[gw], t0);
        assert!(g.route_alive(&r), "a gateway starts alive");
        let pings = g.due(t0, |_| true, || 7);
        assert_eq!(pings, vec![(gw, 7)]);
        assert!(g.due(t0, |_| true, || 8).is_empty(), "one ping at a time");
        // A reply to ping `id` (made the one in flight, as `due` would), from a gateway with
        // NIs `nids`, those in `down` down, announcing `features`.
        let answer = |g: &mut Gateways, id, nids: &[&str], down: &[&str], features| {
            g.map.get_mut(&gw).unwrap().pinging = Some(id);
            g.ping_done(t0, gw, id, Some(&reply(nids, down, features)));
        };
        enum Input {
            /// Ping `id` got no answer.
            Timeout(u64),
            /// The LND's word on the gateway (up or down).
            Notify(bool),
            Reply(u64, &'static [&'static str], &'static [&'static str], u32),
        }
        use Input::*;
        const BOTH: &[&str] = &["10.0.0.9@o2ib", "10.1.0.9@o2ib1"];
        let rows = [
            ("ping timed out", Timeout(7), false),
            ("LND says up", Notify(true), true),
            ("LND says down", Notify(false), false),
            (
                "reply: routes, up on o2ib1",
                Reply(9, BOTH, &[], base),
                true,
            ),
            (
                "reply: RTE_DISABLED",
                Reply(10, BOTH, &[], base | feat::RTE_DISABLED),
                false,
            ),
            (
                "reply: its o2ib1 NI down (asymmetric failure)",
                Reply(11, BOTH, &["10.1.0.9@o2ib1"], base),
                false,
            ),
            ("stale ping id ignored", Timeout(3), false),
            ("reply: back up", Reply(12, BOTH, &[], base), true),
        ];
        for (what, input, want) in rows {
            match input {
                Timeout(id) => {
                    g.ping_done(t0, gw, id, None);
                }
                Notify(up) => {
                    g.notify(t0, gw, up);
                }
                Reply(id, nids, down, features) => answer(&mut g, id, nids, down, features),
            }
            assert_eq!(g.route_alive(&r), want, "{what}");
        }
        let info = &g.info()[0];
        assert_eq!((info.downs, info.ups, info.ping_failures), (2, 2, 1));
        // The hop rule of lnet_router_discovery_ping_reply. A gateway with no NI on the far
        // net: a route configured single-hop is down; a multi-hop one is not, nor one with
        // undefined hops (`lnetctl route add` without --hop).
        let far = RouteConfig { hops: Some(2), ..r };
        let one = RouteConfig { hops: Some(1), ..r };
        let routes_after = |g: &mut Gateways, id, nids: &[&str], down: &[&str]| {
            answer(g, id, nids, down, base);
            (g.route_alive(&one), g.route_alive(&r), g.route_alive(&far))
        };
        assert_eq!(
            routes_after(&mut g, 13, &["10.0.0.9@o2ib"], &[]),
            (false, true, true),
            "no NI on the far net"
        );
        // An NI there, down: whatever the hops say, the gateway ends the route and cannot.
        assert_eq!(
            routes_after(&mut g, 14, BOTH, &["10.1.0.9@o2ib1"]),
            (false, false, false),
            "its NI on the far net down"
        );
        // Its NI on our net down: no route through it is usable.
        assert_eq!(
            routes_after(&mut g, 15, BOTH, &["10.0.0.9@o2ib"]),
            (false, false, false),
            "its NI on our net down"
        );
        assert_eq!(
            routes_after(&mut g, 16, BOTH, &[]),
            (true, true, true),
            "both up"
        );
        // Without avoid_asym_router_failure only its NI on our net counts.
        g.cfg.avoid_asym = false;
        assert_eq!(
            routes_after(&mut g, 17, BOTH, &["10.1.0.9@o2ib1"]),
            (true, true, true),
            "avoid_asym off"
        );
        g.cfg.avoid_asym = true;
        answer(&mut g, 18, &["10.0.0.9@o2ib"], &[], base);
        // The next ping is due one interval after the last went out...
        assert_eq!(g.next_deadline(), Some(t0 + Duration::from_secs(60)));
        // ... but after a failure, in 1 s, then 2, 4 ..., never later than the interval.
        let mut at = g.next_deadline().unwrap();
        let mut gaps = Vec::new();
        for id in 100..110 {
            let due = g.due(at, |_| true, || id);
            assert_eq!(due.len(), 1, "a ping due at {at:?}");
            g.ping_done(at, gw, id, None);
            let next = g.next_deadline().unwrap();
            gaps.push((next - at).as_secs());
            at = next;
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]);
    }
}
