//! The route table: which gateway reaches a remote net (reference section 6; router.c
//! lnet_add_route, lib-move.c lnet_find_route_locked and lnet_compare_routes).
//!
//! A route is (remote net, gateway NID on one of our nets, hops, priority). The table is
//! built once from the configuration (or from `lnetctl route add|del`, which replace the
//! whole table) and read on every send to a remote net, so it is a plain sorted list per
//! net; what changes per message (the round-robin sequence) lives beside it in the node that
//! sends. Gateway health is not the table's business either: selection asks its caller how
//! each gateway is doing.

use std::collections::BTreeMap;
use std::fmt;

use lnd::wire::{errno, Net, Nid};

/// Hops as configured: 1..=255, or undefined (Lustre's LNET_UNDEFINED_HOPS, which counts as 1
/// when routes are compared).
pub const MAX_HOPS: u32 = 255;

/// One configured route.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RouteConfig {
    /// The remote net it reaches.
    pub net: Net,
    /// The gateway: a router's NID on one of our local nets.
    pub gateway: Nid,
    /// Hops to the remote net through this gateway; `None` is "undefined" (`-1` in lnetctl).
    pub hops: Option<u8>,
    /// 0 is the most preferred.
    pub priority: u32,
}

impl RouteConfig {
    /// Hops as route selection compares them (undefined counts as one).
    pub fn effective_hops(&self) -> u32 {
        self.hops.map_or(1, u32::from)
    }

    /// Hops as `route show` prints them (`-1` when undefined).
    pub fn hops_shown(&self) -> i64 {
        self.hops.map_or(-1, i64::from)
    }
}

/// Why a route was refused (lnet_add_route's checks, in our words).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// The gateway is not a usable NID (`*`, `0@lo` or any NID on `lo`).
    BadGateway(Nid),
    /// The remote net is `lo`.
    LoopbackNet,
    /// The remote net is one of our own: reached directly, never through a gateway (-EEXIST).
    LocalNet(Net),
    /// The gateway is on the net it is supposed to reach.
    GatewayOnTargetNet { net: Net, gateway: Nid },
    /// The gateway is not on any of our nets: we could not reach it (-EHOSTUNREACH).
    GatewayNotLocal(Nid),
    /// The gateway is one of our own NIDs: we would be routing to ourselves.
    GatewayIsOwn(Nid),
    /// Hops outside 1..=255.
    BadHops(i64),
    /// The same gateway for the same net twice (-EEXIST).
    Duplicate { net: Net, gateway: Nid },
    /// No such route (route del).
    NotFound { net: Net, gateway: Option<Nid> },
}

impl RouteError {
    /// The errno lnetctl reports for it.
    pub fn errno(&self) -> i32 {
        match self {
            RouteError::LocalNet(_) | RouteError::Duplicate { .. } => -errno::EEXIST,
            RouteError::GatewayNotLocal(_) => -errno::EHOSTUNREACH,
            RouteError::NotFound { .. } => -errno::ENOENT,
            _ => -errno::EINVAL,
        }
    }
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::BadGateway(g) => write!(f, "gateway {g} is not a usable NID"),
            RouteError::LoopbackNet => f.write_str("cannot route to the loopback net"),
            RouteError::LocalNet(n) => {
                write!(
                    f,
                    "net {n} is local: its peers are reached directly, not through a gateway"
                )
            }
            RouteError::GatewayOnTargetNet { net, gateway } => {
                write!(
                    f,
                    "gateway {gateway} is on {net}, the net it would route to"
                )
            }
            RouteError::GatewayNotLocal(g) => write!(
                f,
                "gateway {g} is not on any local net: it could not be reached"
            ),
            RouteError::GatewayIsOwn(g) => write!(f, "gateway {g} is one of this node's own NIDs"),
            RouteError::BadHops(h) => write!(
                f,
                "hop count {h} is outside 1..={MAX_HOPS} (or -1: undefined)"
            ),
            RouteError::Duplicate { net, gateway } => {
                write!(f, "route to {net} via {gateway} already exists")
            }
            RouteError::NotFound {
                net,
                gateway: Some(g),
            } => {
                write!(f, "no route to {net} via {g}")
            }
            RouteError::NotFound { net, gateway: None } => write!(f, "no route to {net}"),
        }
    }
}

impl std::error::Error for RouteError {}

/// Checks one route against the node's own NIDs (lnet_add_route's rules).
pub fn check_route(r: &RouteConfig, own: &[Nid]) -> Result<(), RouteError> {
    let g = r.gateway;
    if g.is_any() || g.net() == Net::LO {
        return Err(RouteError::BadGateway(g));
    }
    if r.net == Net::LO {
        return Err(RouteError::LoopbackNet);
    }
    if own.iter().any(|n| n.net() == r.net) {
        return Err(RouteError::LocalNet(r.net));
    }
    if g.net() == r.net {
        return Err(RouteError::GatewayOnTargetNet {
            net: r.net,
            gateway: g,
        });
    }
    if own.contains(&g) {
        return Err(RouteError::GatewayIsOwn(g));
    }
    if !own.iter().any(|n| n.net() == g.net()) {
        return Err(RouteError::GatewayNotLocal(g));
    }
    if r.hops == Some(0) {
        return Err(RouteError::BadHops(0));
    }
    Ok(())
}

/// How a gateway is doing, as the sender sees it (its peer NI on our side).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GatewayState {
    /// The gateway is usable: not known dead, and it reaches the route's net.
    pub alive: bool,
    /// Bytes queued to it (lpni_txqnob): fewer is better.
    pub queued_bytes: u64,
    /// Its tx credits left: more is better.
    pub credits: i64,
    /// Its LNet health value (lpni_healthv): higher is better, before queued bytes
    /// (lnet_compare_gw_lpnis).
    pub health: u32,
}

/// Every route, by remote net; each net's routes in configuration order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteTable {
    by_net: BTreeMap<Net, Vec<RouteConfig>>,
}

impl RouteTable {
    /// A table of `routes`, each checked against our NIDs; the first bad one is refused, with
    /// its position.
    pub fn new(routes: &[RouteConfig], own: &[Nid]) -> Result<RouteTable, (usize, RouteError)> {
        let mut t = RouteTable::default();
        for (i, r) in routes.iter().enumerate() {
            t.add(*r, own).map_err(|e| (i, e))?;
        }
        Ok(t)
    }

    /// Adds a route (lnetctl route add).
    pub fn add(&mut self, r: RouteConfig, own: &[Nid]) -> Result<(), RouteError> {
        check_route(&r, own)?;
        let list = self.by_net.entry(r.net).or_default();
        if list.iter().any(|x| x.gateway == r.gateway) {
            return Err(RouteError::Duplicate {
                net: r.net,
                gateway: r.gateway,
            });
        }
        list.push(r);
        Ok(())
    }

    /// Removes the routes to `net` (through `gateway` only, when given); how many went.
    pub fn remove(&mut self, net: Net, gateway: Option<Nid>) -> Result<usize, RouteError> {
        let Some(list) = self.by_net.get_mut(&net) else {
            return Err(RouteError::NotFound { net, gateway });
        };
        let before = list.len();
        list.retain(|r| gateway.is_some_and(|g| g != r.gateway));
        let gone = before - list.len();
        if list.is_empty() {
            self.by_net.remove(&net);
        }
        if gone == 0 {
            return Err(RouteError::NotFound { net, gateway });
        }
        Ok(gone)
    }

    /// Every route, by net then configuration order.
    pub fn routes(&self) -> impl Iterator<Item = &RouteConfig> + '_ {
        self.by_net.values().flatten()
    }

    /// The routes to `net`.
    pub fn to_net(&self, net: Net) -> &[RouteConfig] {
        self.by_net.get(&net).map_or(&[], Vec::as_slice)
    }

    /// True when no route is configured.
    pub fn is_empty(&self) -> bool {
        self.by_net.is_empty()
    }

    /// Every gateway, once each.
    pub fn gateways(&self) -> Vec<Nid> {
        let mut g: Vec<Nid> = self.routes().map(|r| r.gateway).collect();
        g.sort();
        g.dedup();
        g
    }

    /// The best route to `net` by lnet_compare_routes, among the routes `alive` accepts whose
    /// gateway `state` knows (a gateway we can send to from here) and says is alive: lower
    /// priority first; then fewer hops; then, as lnet_compare_gw_lpnis, the healthier gateway,
    /// the one with fewer queued bytes, then more credits; then the one used least recently
    /// (`last_used`, the round robin across equals).
    pub fn select(
        &self,
        net: Net,
        state: impl Fn(Nid) -> Option<GatewayState>,
        last_used: impl Fn(Nid) -> u64,
        alive: impl Fn(&RouteConfig) -> bool,
    ) -> Option<&RouteConfig> {
        self.to_net(net)
            .iter()
            .filter(|r| alive(r))
            .filter_map(|r| state(r.gateway).filter(|s| s.alive).map(|s| (r, s)))
            .min_by(|(a, sa), (b, sb)| {
                a.priority
                    .cmp(&b.priority)
                    .then(a.effective_hops().cmp(&b.effective_hops()))
                    .then(sb.health.cmp(&sa.health))
                    .then(sa.queued_bytes.cmp(&sb.queued_bytes))
                    .then(sb.credits.cmp(&sa.credits))
                    .then(last_used(a.gateway).cmp(&last_used(b.gateway)))
            })
            .map(|(r, _)| r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use testkit::nid;

    fn route(net: &str, gw: &str, hops: Option<u8>, priority: u32) -> RouteConfig {
        RouteConfig {
            net: net.parse().unwrap(),
            gateway: nid(gw),
            hops,
            priority,
        }
    }

    const OWN: &[&str] = &["10.0.0.1@o2ib", "10.1.0.1@o2ib1"];

    fn own() -> Vec<Nid> {
        OWN.iter().map(|s| nid(s)).collect()
    }

    /// Each of lnet_add_route's refusals, as a table: the route, and the error it gets.
    #[test]
    fn bad_routes_are_refused_with_their_reason() {
        let cases: &[(RouteConfig, RouteError)] = &[
            (
                route("o2ib2", "0@lo", None, 0),
                RouteError::BadGateway(Nid::LO_0),
            ),
            (
                route("lo", "10.0.0.9@o2ib", None, 0),
                RouteError::LoopbackNet,
            ),
            (
                route("o2ib1", "10.0.0.9@o2ib", None, 0),
                RouteError::LocalNet("o2ib1".parse().unwrap()),
            ),
            (
                route("o2ib2", "10.2.0.9@o2ib2", None, 0),
                RouteError::GatewayOnTargetNet {
                    net: "o2ib2".parse().unwrap(),
                    gateway: nid("10.2.0.9@o2ib2"),
                },
            ),
            (
                route("o2ib2", "10.3.0.9@o2ib3", None, 0),
                RouteError::GatewayNotLocal(nid("10.3.0.9@o2ib3")),
            ),
            (
                route("o2ib2", "10.0.0.1@o2ib", None, 0),
                RouteError::GatewayIsOwn(nid("10.0.0.1@o2ib")),
            ),
            (
                route("o2ib2", "10.0.0.9@o2ib", Some(0), 0),
                RouteError::BadHops(0),
            ),
        ];
        for (r, want) in cases {
            assert_eq!(check_route(r, &own()).as_ref(), Err(want), "{r:?}");
            assert_eq!(RouteTable::new(&[*r], &own()), Err((0, want.clone())));
        }
        let ok = route("o2ib2", "10.0.0.9@o2ib", Some(1), 0);
        let mut t = RouteTable::new(&[ok], &own()).unwrap();
        assert_eq!(
            t.add(ok, &own()),
            Err(RouteError::Duplicate {
                net: ok.net,
                gateway: ok.gateway
            })
        );
        assert_eq!(t.add(ok, &own()).unwrap_err().errno(), -17);
        assert_eq!(t.routes().count(), 1);
    }

    #[test]
    fn remove_by_net_or_by_gateway() {
        let a = route("o2ib2", "10.0.0.9@o2ib", None, 0);
        let b = route("o2ib2", "10.0.0.8@o2ib", None, 0);
        let c = route("o2ib3", "10.1.0.9@o2ib1", None, 0);
        let mut t = RouteTable::new(&[a, b, c], &own()).unwrap();
        assert_eq!(t.remove(a.net, Some(a.gateway)), Ok(1));
        assert_eq!(t.to_net(a.net), &[b]);
        assert_eq!(
            t.remove(a.net, Some(a.gateway)),
            Err(RouteError::NotFound {
                net: a.net,
                gateway: Some(a.gateway)
            })
        );
        assert_eq!(t.remove(c.net, None), Ok(1));
        assert_eq!(t.remove(b.net, None), Ok(1));
        assert!(t.is_empty());
    }

    /// Selection as lnet_compare_routes orders it, one rule per row: the two candidates differ
    /// only in what the row tests, and the expected winner is named.
    #[test]
    fn selection_order_is_lustres() {
        let up = |q: u64, c: i64| GatewayState {
            alive: true,
            queued_bytes: q,
            credits: c,
            health: crate::health::MAX_HEALTH,
        };
        let g1 = "10.0.0.11@o2ib";
        let g2 = "10.0.0.12@o2ib";
        // Both routes go to o2ib2, through g1 and g2; a row gives each its (hops, priority),
        // its gateway's state and its use count, and the gateway that must win.
        type Row = (
            &'static str,
            [(Option<u8>, u32); 2],
            [GatewayState; 2],
            [u64; 2],
            &'static str,
        );
        let plain = [(None, 0), (None, 0)];
        let dead = GatewayState {
            alive: false,
            ..up(0, 8)
        };
        let unhealthy = GatewayState {
            health: 900,
            ..up(0, 8)
        };
        let rows: [Row; 8] = [
            (
                "priority",
                [(None, 1), (None, 0)],
                [up(0, 8), up(0, 8)],
                [0, 0],
                g2,
            ),
            (
                "hops",
                [(Some(2), 0), (None, 0)],
                [up(0, 8), up(0, 8)],
                [0, 0],
                g2,
            ),
            (
                "alive",
                [(None, 0), (None, 5)],
                [dead, up(0, 8)],
                [0, 0],
                g2,
            ),
            (
                "health, before queued bytes",
                plain,
                [unhealthy, up(100, 2)],
                [0, 0],
                g2,
            ),
            ("queued bytes", plain, [up(100, 8), up(0, 8)], [0, 0], g2),
            ("credits", plain, [up(0, 2), up(0, 8)], [0, 0], g2),
            ("round robin", plain, [up(0, 8), up(0, 8)], [7, 3], g2),
            (
                "round robin, other way",
                plain,
                [up(0, 8), up(0, 8)],
                [3, 7],
                g1,
            ),
        ];
        for (what, [(h1, p1), (h2, p2)], states, used, want) in rows {
            let (a, b) = (route("o2ib2", g1, h1, p1), route("o2ib2", g2, h2, p2));
            let t = RouteTable::new(&[a, b], &own()).unwrap();
            let pick = t
                .select(
                    a.net,
                    |g| Some(if g == a.gateway { states[0] } else { states[1] }),
                    |g| if g == a.gateway { used[0] } else { used[1] },
                    |_| true,
                )
                .map(|r| r.gateway);
            assert_eq!(pick, Some(nid(want)), "{what}");
        }
        // Nothing alive: no route.
        let t = RouteTable::new(&[route("o2ib2", g1, None, 0)], &own()).unwrap();
        let down = GatewayState {
            alive: false,
            queued_bytes: 0,
            credits: 8,
            health: crate::health::MAX_HEALTH,
        };
        let net = "o2ib2".parse().unwrap();
        assert!(t.select(net, |_| Some(down), |_| 0, |_| true).is_none());
        // A gateway the caller cannot use is skipped, and so is a route it says is dead.
        assert!(t.select(net, |_| None, |_| 0, |_| true).is_none());
        let alive = GatewayState {
            alive: true,
            ..down
        };
        assert!(t.select(net, |_| Some(alive), |_| 0, |_| false).is_none());
        assert!(t.select(net, |_| Some(alive), |_| 0, |_| true).is_some());
    }
}
