//! `route add`, `route del` and `route show` (with the hop and priority filters the daemon's
//! request does not carry).

use router::control::Request;

use crate::cli::RouteCmd;
use crate::view::{RouteFilter, Step, View};
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
