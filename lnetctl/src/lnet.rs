//! `lnet configure`, `lnet unconfigure`, `peer` and `debug recovery`: LNet as a whole and its
//! peers.

use std::path::Path;

use router::control::{ClientError, ControlClient, Request, Response};

use crate::cli::{DebugCmd, LnetCmd, PeerCmd};
use crate::view::{Step, View};
use crate::{check_nid, client_failed, cut_quotes, exit};

/// `lnet configure [-a]` and `lnet unconfigure`.
pub(crate) fn lnet(path: &Path, cmd: LnetCmd) -> u8 {
    match cmd {
        LnetCmd::Configure { all, large: _ } => configure(path, all),
        LnetCmd::Unconfigure => unconfigure(path),
    }
}

fn configure(path: &Path, all: bool) -> u8 {
    match ControlClient::connect(path).and_then(|mut c| c.call(&Request::LnetConfigure { all })) {
        Ok(Response::Done) => exit::OK,
        // -a: what the daemon's file names came back; what could not, said
        // on stderr, one line each.
        Ok(Response::Import(r)) => {
            for f in &r.failed {
                eprintln!(
                    "lnetctl: lnet configure: {}: {} (errno {})",
                    f.section,
                    cut_quotes(&f.descr),
                    f.errno
                );
            }
            if r.failed.is_empty() {
                exit::OK
            } else {
                exit::FAILED
            }
        }
        Ok(Response::Error(e)) => {
            eprintln!("lnetctl: lnet configure: {}", cut_quotes(&e.to_string()));
            exit::FAILED
        }
        Ok(other) => {
            eprintln!("lnetctl: lnet configure: the daemon answered {other:?}");
            exit::FAILED
        }
        Err(e @ ClientError::NoDaemon { .. }) => {
            eprintln!("lnetctl: {e} (lnet configure: start the lnet-router service, which configures LNet from its file)");
            exit::NO_DAEMON
        }
        Err(e) => client_failed(&e),
    }
}

fn unconfigure(path: &Path) -> u8 {
    // Every net but lo, one `net del` each (LNet with no NI, as after Lustre's
    // unconfigure; the daemon stays to take them back).
    let mut c = match ControlClient::connect(path) {
        Ok(c) => c,
        Err(e) => return client_failed(&e),
    };
    let nets = match c.call(&Request::NetShow { verbose: false }) {
        Ok(Response::Net(n)) => n.net,
        Ok(Response::Error(e)) => {
            eprintln!("lnetctl: lnet unconfigure: {e}");
            return exit::FAILED;
        }
        Ok(other) => {
            eprintln!("lnetctl: lnet unconfigure: unexpected answer: {other:?}");
            return exit::FAILED;
        }
        Err(e) => return client_failed(&e),
    };
    let mut code = exit::OK;
    for n in nets.iter().filter(|n| n.net_type != "lo") {
        let req = Request::NetDel {
            net: Some(n.net_type.clone()),
            nid: None,
        };
        match c.call(&req) {
            Ok(Response::Done) => {}
            Ok(Response::Error(e)) => {
                eprintln!("lnetctl: lnet unconfigure: {}: {e}", n.net_type);
                code = exit::FAILED;
            }
            Ok(other) => {
                eprintln!("lnetctl: lnet unconfigure: unexpected answer: {other:?}");
                code = exit::FAILED;
            }
            Err(e) => return client_failed(&e),
        }
    }
    code
}

/// `debug recovery --local | --peer`.
pub(crate) fn debug(cmd: DebugCmd) -> Step {
    let DebugCmd::Recovery { local, peer } = cmd;
    if local == peer {
        eprintln!("lnetctl: debug recovery: give --local or --peer");
        return Step::Exit(exit::USAGE);
    }
    Request::DebugRecovery { local }.into()
}

/// `peer show`; `peer add` and `peer del` are refused (no Multi-Rail peers here).
pub(crate) fn peer(cmd: PeerCmd) -> Step {
    match cmd {
        PeerCmd::Add { .. } | PeerCmd::Del { .. } => {
            eprintln!(
                "lnetctl: peer add/del: ulnet has no Multi-Rail peers; a peer with one NI is \
                 created when first used and forgotten after peer_timeout without traffic"
            );
            Step::Exit(exit::FAILED)
        }
        PeerCmd::Show { nid, verbose } => {
            if let Some(n) = &nid {
                if let Err(c) = check_nid(n) {
                    return Step::Exit(c);
                }
            }
            Step::Ask(
                Request::PeerShow {
                    nid,
                    verbose: verbose.is_some(),
                },
                View {
                    level: verbose.unwrap_or(0),
                    ..View::default()
                },
            )
        }
    }
}
