//! The common path of the commands that are one request to the daemon: the request sent, the
//! answer cut as the command line asked (a net, a route filter, a `-v` level) and printed as
//! YAML or JSON, its error said on stderr, and the exit status.

use std::path::Path;

use router::control::{errno, ClientError, ControlClient, Request, Response};

use crate::ping::{emit_ping, ping_without_daemon};
use crate::view::View;
use crate::{client_failed, cut_quotes, emit, exit, render};

/// Sends `req` to the daemon at `path` and shows its answer as `view` says.
pub(crate) fn query(path: &Path, json: bool, req: Request, view: View) -> u8 {
    let mut no_daemon = false;
    let resp = match ControlClient::connect(path).and_then(|mut c| c.call(&req)) {
        Ok(Response::Net(mut n)) => {
            if let Some(want) = &view.net_filter {
                n.net.retain(|e| &e.net_type == want);
                if n.net.is_empty() {
                    eprintln!("lnetctl: net show: no net {want} here");
                    return exit::FAILED;
                }
            }
            Response::Net(n)
        }
        Ok(Response::Route(r)) => Response::Route(view.route_filter.apply(r)),
        Ok(r) => r,
        Err(ClientError::NoDaemon { .. }) if matches!(req, Request::Ping { .. }) => {
            no_daemon = true;
            ping_without_daemon(req, path)
        }
        Err(e) => return client_failed(&e),
    };
    if let Response::Ping(p) = &resp {
        emit_ping(p, "ping", json);
        // Without a daemon only 0@lo answers: a NID that did not is the "no daemon" of every
        // other command.
        return if p.manage.is_empty() {
            exit::OK
        } else if no_daemon {
            exit::NO_DAEMON
        } else {
            exit::FAILED
        };
    }
    let out = if json {
        render::json_at(&resp, view.level)
    } else {
        render::yaml_at(&resp, view.level)
    };
    match (&resp, out) {
        (Response::Error(e), _) => {
            eprintln!("lnetctl: {}", cut_quotes(&e.to_string()));
            if e.errno == errno::EINVAL && e.message.contains("bad NID") {
                exit::BAD_NID
            } else {
                exit::FAILED
            }
        }
        (_, Some(text)) => {
            emit(&text);
            exit::OK
        }
        (_, None) => exit::FAILED,
    }
}
