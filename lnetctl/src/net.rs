//! `net add`, `net del` and `net show`. An added NI goes to the daemon as a one-NI import
//! document (`import::NiToAdd`), so it is checked as a configuration file's NI is.

use std::path::Path;

use router::control::{ControlClient, ImportOp, Request, Response};

use crate::cli::NetCmd;
use crate::view::{Step, View};
use crate::{check_nid, client_failed, cut_quotes, exit, import};

/// What a `net` command does.
pub(crate) fn net(path: &Path, cmd: NetCmd) -> Step {
    match cmd {
        NetCmd::Add {
            net,
            r#if,
            nid,
            peer_timeout,
            peer_credits,
            peer_buffer_credits,
            credits,
            cpt: _,
            conns_per_peer,
            skip_mr_route_setup: _,
            ip2net,
            fabric,
            listen,
        } => {
            if ip2net.is_some() {
                eprintln!("lnetctl: net add: --ip2net is not supported by ulnet; give --net and --if, or --nid");
                return Step::Exit(exit::FAILED);
            }
            let ni = import::NiToAdd {
                net,
                interface: r#if,
                nid,
                tunables: [
                    ("peer_timeout", peer_timeout),
                    ("peer_credits", peer_credits),
                    ("peer_buffer_credits", peer_buffer_credits),
                    ("credits", credits),
                ],
                conns_per_peer,
                fabric,
                listen,
            };
            Step::Exit(add(path, &ni))
        }
        NetCmd::Del { net, r#if, nid } => del(net, r#if, nid),
        NetCmd::Show { net, verbose } => Step::Ask(
            Request::NetShow {
                verbose: verbose.is_some(),
            },
            View {
                net_filter: net,
                level: verbose.unwrap_or(0),
                ..View::default()
            },
        ),
    }
}

/// `net add`: the NI's document imported; what the daemon refused said on stderr.
fn add(path: &Path, ni: &import::NiToAdd) -> u8 {
    let yaml = match ni.document() {
        Ok(y) => y,
        Err(e) => {
            eprintln!("lnetctl: net add: {e}");
            return exit::USAGE;
        }
    };
    let req = Request::Import {
        yaml,
        op: ImportOp::Add,
        nets: None,
    };
    match ControlClient::connect(path).and_then(|mut c| c.call(&req)) {
        Ok(Response::Import(r)) => {
            for f in &r.failed {
                // The daemon's reason names the change ("net add NID: ..."): once.
                let descr = cut_quotes(&f.descr);
                if descr.starts_with("net add") {
                    eprintln!("lnetctl: {descr}");
                } else {
                    eprintln!("lnetctl: net add: {descr}");
                }
            }
            if !r.failed.is_empty() {
                exit::FAILED
            } else if r.applied == 0 {
                eprintln!("lnetctl: net add: the NI exists");
                exit::FAILED
            } else {
                exit::OK
            }
        }
        Ok(Response::Error(e)) => {
            // The document is ours: what the daemon says of it is about the options
            // (its `import:LINE:` says nothing to the user).
            let msg = e.message.strip_prefix("import:").map_or(&*e.message, |m| {
                m.trim_start_matches(|c: char| c.is_ascii_digit())
                    .trim_start_matches(':')
            });
            eprintln!("lnetctl: net add: {}", cut_quotes(msg.trim_start()));
            exit::FAILED
        }
        Ok(other) => {
            eprintln!("lnetctl: net add: unexpected answer from the daemon: {other:?}");
            exit::FAILED
        }
        Err(e) => client_failed(&e),
    }
}

/// `net del`: by net or by NID (ulnet keeps no interface names).
fn del(net: Option<String>, r#if: Option<String>, nid: Option<String>) -> Step {
    if r#if.is_some() {
        eprintln!(
            "lnetctl: net del: --if: ulnet does not keep the interface names of its NIs; \
             give --nid (lnetctl net show lists them)"
        );
        return Step::Exit(exit::FAILED);
    }
    if net.is_some() && nid.is_some() {
        eprintln!("lnetctl: net del: --net is invalid with --nid option");
        return Step::Exit(exit::USAGE);
    }
    if net.is_none() && nid.is_none() {
        eprintln!("lnetctl: net del: missing mandatory parameter: --net or --nid");
        return Step::Exit(exit::USAGE);
    }
    if let Some(n) = &nid {
        if let Err(c) = check_nid(n) {
            return Step::Exit(c);
        }
    }
    Request::NetDel { net, nid }.into()
}
