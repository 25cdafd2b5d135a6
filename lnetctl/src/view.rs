//! What a command hands to `show::query`: the request and how its answer is cut and shown
//! (a net, a route filter, a `-v` level), or the exit status of a command already done.

use router::control::{self, Request};

/// What a command does next: it is done (with its exit status), or it asks the daemon.
pub(crate) enum Step {
    Exit(u8),
    Ask(Request, View),
}

impl From<Request> for Step {
    fn from(req: Request) -> Step {
        Step::Ask(req, View::default())
    }
}

/// How an answer is shown beyond what the request carries.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// `net show --net N`: the daemon's answer, cut to that net here.
    pub(crate) net_filter: Option<String>,
    /// `-v LEVEL`: ulnet's own keys from render::ULNET_LEVEL up (net show), at any -v (stats,
    /// global show).
    pub(crate) level: u8,
    /// `route show --hop/--priority`: the daemon's verbose answer, cut here.
    pub(crate) route_filter: RouteFilter,
}

/// `route show --hop N --priority N`, which the daemon's request does not carry: the routes
/// are asked for verbose (they carry their hop and priority only then), kept when they match,
/// and shown as asked.
#[derive(Debug, Default)]
pub(crate) struct RouteFilter {
    pub(crate) hop: Option<i64>,
    pub(crate) priority: Option<i64>,
    pub(crate) verbose: bool,
}

impl RouteFilter {
    pub(crate) fn active(&self) -> bool {
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
