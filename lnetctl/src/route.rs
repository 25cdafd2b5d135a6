//! `route add`, `route del` and `route show` (with the hop and priority filters the daemon's
//! request does not carry).

use router::control::{self, Request};

use crate::cli::RouteCmd;
use crate::show::{Step, View};
use crate::{check_nid, exit};

/// The request of a `route` command, or why there is none.
pub(crate) fn route(cmd: RouteCmd) -> Step {
    let req = match cmd {
        RouteCmd::Add {
            net,
            gateway,
            hop,
            priority,
            health_sensitivity: _,
        } => {
            if let Err(c) = check_nid(&gateway) {
                return Step::Exit(c);
            }
            // lustre_lnet_config_route: -1 is the default priority, 0; below, refused.
            let priority = match priority {
                None | Some(-1) => None,
                Some(p) => {
                    match u32::try_from(p) {
                        Ok(p) => Some(p),
                        Err(_) => {
                            eprintln!("lnetctl: invalid priority {p}, must be 0 or greater (-1: the default)");
                            return Step::Exit(exit::USAGE);
                        }
                    }
                }
            };
            Request::RouteAdd {
                net,
                gateway,
                hop,
                priority,
            }
        }
        RouteCmd::Del { net, gateway } => {
            if let Some(Err(c)) = gateway.as_deref().map(check_nid) {
                return Step::Exit(c);
            }
            Request::RouteDel { net, gateway }
        }
        RouteCmd::Show {
            net,
            gateway,
            hop,
            priority,
            verbose,
        } => {
            // As lnetctl: -1 filters nothing. The daemon filters by net and gateway; hop
            // and priority are filtered here, from the verbose answer.
            let route_filter = RouteFilter {
                hop: hop.filter(|&h| h != -1),
                priority: priority.filter(|&p| p != -1),
                verbose,
            };
            let req = Request::RouteShow {
                net,
                gateway,
                verbose: verbose || route_filter.active(),
            };
            return Step::Ask(
                req,
                View {
                    route_filter,
                    ..View::default()
                },
            );
        }
    };
    Step::Ask(req, View::default())
}

/// `route show --hop N --priority N`, which the daemon's request does not carry: the routes
/// are asked for verbose (they carry their hop and priority only then), kept when they match,
/// and shown as asked.
#[derive(Debug, Default)]
pub(crate) struct RouteFilter {
    hop: Option<i64>,
    priority: Option<i64>,
    verbose: bool,
}

impl RouteFilter {
    fn active(&self) -> bool {
        self.hop.is_some() || self.priority.is_some()
    }

    pub(crate) fn apply(&self, mut r: control::RouteShow) -> control::RouteShow {
        if !self.active() {
            return r;
        }
        r.route.retain(|e| {
            self.hop.is_none_or(|h| e.hop == Some(h))
                && self
                    .priority
                    .is_none_or(|p| e.priority.map(i64::from) == Some(p))
        });
        if !self.verbose {
            for e in &mut r.route {
                *e = control::RouteEntry {
                    net: std::mem::take(&mut e.net),
                    gateway: std::mem::take(&mut e.gateway),
                    hop: None,
                    priority: None,
                    health_sensitivity: None,
                    state: None,
                    kind: None,
                };
            }
        }
        r
    }
}
