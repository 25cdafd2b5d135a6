//! `ping` and `discover`: the targets as LNet takes them, the answer split between standard
//! output (who answered) and standard error (who did not), and the in-process LNet that
//! answers for `0@lo` when no daemon runs.

use router::control::{self, ControlClient, Request, Response};
use router::{LnetNode, NodeConfig};

use crate::view::{Step, View};
use crate::{
    arg_excerpt, check_nid, client_failed, cut_quotes, emit, emit_err, exit, render, tree,
};

/// A ping's (or discover's, `what`) answer: the NIDs that answered on standard output, the
/// `manage:` block of those that did not on standard error.
pub(crate) fn emit_ping(p: &control::PingShow, what: &str, json: bool) {
    let text = |p: &control::PingShow| {
        let doc = render::ping_as(p, what);
        if json {
            tree::to_json(&doc)
        } else {
            tree::to_yaml_as(&doc, tree::PING)
        }
    };
    if !p.ping.is_empty() {
        emit(&text(&control::PingShow {
            ping: p.ping.clone(),
            manage: Vec::new(),
        }));
    }
    if !p.manage.is_empty() {
        emit_err(&text(&control::PingShow {
            ping: Vec::new(),
            manage: p.manage.clone(),
        }));
    }
}

/// NIDs given as `A,B` or as several arguments.
pub(crate) fn split_nids(args: &[String]) -> Vec<String> {
    args.iter()
        .flat_map(|a| a.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// LNet's process id of kernel Lustre, the only one ulnet's pings go to.
const LNET_PID_LUSTRE: u32 = lnd::wire::lnet::LNET_PID_LUSTRE;
/// LNET_PID_ANY: "whichever", which LNet's ping turns into LNET_PID_LUSTRE.
const LNET_PID_ANY: u32 = u32::MAX;

/// A ping target as LNet's `libcfs_strid` takes it: `NID` or `PID-NID`. ulnet's pings go to
/// PID 12345 (LNET_PID_LUSTRE), as LNet's do for a NID given alone; so a PID of 12345 (or
/// LNET_PID_ANY) is taken and dropped, and another is refused rather than silently pinged at
/// 12345. Returns the NID's text.
pub(crate) fn ping_target(s: &str) -> Result<String, u8> {
    let s = s.trim();
    let Some((pid, nid)) = s
        .split_once('-')
        .filter(|(p, _)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    else {
        check_nid(s)?;
        return Ok(s.to_string());
    };
    check_nid(nid)?;
    match pid.parse::<u32>() {
        Ok(LNET_PID_LUSTRE | LNET_PID_ANY) => Ok(nid.to_string()),
        _ => {
            eprintln!(
                "lnetctl: {}: ulnet pings LNet's PID {LNET_PID_LUSTRE} only (give the NID alone, \
                 or {LNET_PID_LUSTRE}-NID)",
                arg_excerpt(s)
            );
            Err(exit::FAILED)
        }
    }
}

/// The targets of `ping` or `discover` (`A,B` or several arguments), each checked.
fn targets(nids: &[String]) -> Result<Vec<String>, u8> {
    split_nids(nids).iter().map(|n| ping_target(n)).collect()
}

/// `lnetctl ping`: the request (the answer is shown by [`crate::show::query`], which pings
/// from an in-process LNet when no daemon runs).
pub(crate) fn ping(nids: &[String], timeout: Option<u64>, source: Option<String>) -> Step {
    let nids = match targets(nids) {
        Ok(n) => n,
        Err(c) => return Step::Exit(c),
    };
    if nids.is_empty() {
        eprintln!("lnetctl: ping: no NID given");
        return Step::Exit(exit::USAGE);
    }
    if let Some(Err(c)) = source.as_deref().map(check_nid) {
        return Step::Exit(c);
    }
    Step::Ask(
        Request::Ping {
            nids,
            timeout_secs: timeout,
            source,
        },
        View::default(),
    )
}

/// `lnetctl discover`: a ping of each NID through the daemon, shown as discover's answer.
pub(crate) fn discover(path: &std::path::Path, nids: &[String], json: bool) -> u8 {
    let nids = match targets(nids) {
        Ok(n) => n,
        Err(c) => return c,
    };
    let req = Request::Ping {
        nids,
        timeout_secs: None,
        source: None,
    };
    let resp = match ControlClient::connect(path).and_then(|mut c| c.call(&req)) {
        Ok(r) => r,
        Err(e) => return client_failed(&e),
    };
    match resp {
        Response::Ping(p) => {
            emit_ping(&p, "discover", json);
            if p.manage.is_empty() {
                exit::OK
            } else {
                exit::FAILED
            }
        }
        Response::Error(e) => {
            eprintln!("lnetctl: discover: {}", cut_quotes(&e.to_string()));
            exit::FAILED
        }
        other => {
            eprintln!("lnetctl: discover: unexpected answer: {other:?}");
            exit::FAILED
        }
    }
}

/// `ping` with no daemon: an in-process LNet with no NIs, so only `0@lo` answers; every other
/// NID fails with a message saying why.
pub(crate) fn ping_without_daemon(req: Request, path: &std::path::Path) -> Response {
    let t0 = std::time::Instant::now();
    let clock = move || lnd::time::Instant::from_nanos(t0.elapsed().as_nanos() as u64 + 1);
    let mut node = LnetNode::new(NodeConfig::new(Vec::new()), clock());
    let mut resp = control::call_local(&mut node, req, clock);
    if let Response::Ping(p) = &mut resp {
        for f in &mut p.manage {
            f.descr = format!(
                "{} (no lnet-router daemon at {}; without one only 0@lo is reachable)",
                f.descr,
                path.display()
            );
        }
    }
    resp
}
