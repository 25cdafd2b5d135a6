//! `lnetctl`: ulnet's control tool. It asks the `lnet-router` daemon over its control socket
//! (JSON lines, `router::control`) and prints the answer as YAML in real lnetctl's layout, or as
//! JSON with `--json`. Without a daemon, `ping` runs an in-process LNet that has only `0@lo`.
//! `capture` writes the daemon's o2iblnd traffic into a pcap file (`capture.rs`). `demo` walks
//! one LNet ping exchange through the real wire encoders and decoders.
//!
//! The files: `cli` (the command line), one module per command group (`net`, `route`, `lnet`
//! with peers and debug, `ping`, `import_export`, `capture`, `selftest`, `demo`), `show` and
//! `view` (the common request-and-show path), and the renderers (`render`, `tree`, `export`,
//! `import`).
//! This file dispatches a command to its group and holds what they all use: the exit codes,
//! output, and the checks of arguments.

mod capture;
mod cli;
mod demo;
mod export;
#[cfg(test)]
mod golden;
mod import;
mod import_export;
mod lnet;
mod net;
mod ping;
mod render;
mod route;
mod selftest;
mod show;
mod tree;
mod view;

use std::process::ExitCode;

use clap::Parser;
use lnd::wire::Nid;
use router::control::{default_socket_path, ClientError, ImportOp, Request};

use cli::{Cli, Cmd, GlobalCmd, StatsCmd};
use view::{Step, View};

/// The exit codes a script can rely on.
pub(crate) mod exit {
    /// The command worked (every ping answered).
    pub const OK: u8 = 0;
    /// The operation failed: a ping failed or timed out, a peer is unknown, the daemon refused.
    pub const FAILED: u8 = 1;
    /// Bad command line (clap's own code).
    pub const USAGE: u8 = 2;
    /// No daemon: the control socket is missing or refuses connections.
    pub const NO_DAEMON: u8 = 3;
    /// A NID on the command line does not parse.
    pub const BAD_NID: u8 = 4;
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ExitCode::from(run(cli))
}

/// One command: done by its group's module, or asked of the daemon and shown by [`show::query`].
fn run(cli: Cli) -> u8 {
    let path = cli.socket.unwrap_or_else(default_socket_path);
    let json = cli.json;
    let step = match cli.cmd {
        Cmd::Capture {
            file,
            duration,
            force,
        } => return capture::run(&path, &file, duration, force, json),
        Cmd::Selftest { cmd } => return selftest::run(&path, json, cmd),
        Cmd::Discover { nids, force: _ } => return ping::discover(&path, &nids, json),
        Cmd::Lnet { cmd } => return lnet::lnet(&path, cmd),
        Cmd::Debug { cmd } => lnet::debug(cmd),
        Cmd::Net { cmd } => net::net(&path, cmd),
        Cmd::Peer { cmd } => lnet::peer(cmd),
        Cmd::Export { backup, file } => {
            return import_export::run_export(&path, json, backup, file.as_deref())
        }
        Cmd::Import {
            add: _,
            del,
            show,
            exec,
            file,
        } => {
            let op = match (del, show) {
                (true, _) => ImportOp::Del,
                (_, true) => ImportOp::Show,
                _ => ImportOp::Add,
            };
            return import_export::run_import(&path, json, op, exec, file.as_deref());
        }
        Cmd::Man => return cli::man(),
        Cmd::Completions { shell } => return cli::completions(shell),
        Cmd::Demo { src, dst } => return demo::run(&src, &dst),
        Cmd::Ping {
            nids,
            timeout,
            source,
        } => ping::ping(&nids, timeout, source),
        Cmd::Conn { .. } => Request::ConnShow.into(),
        Cmd::Stats {
            cmd: StatsCmd::Show { verbose },
        } => Step::Ask(Request::StatsShow, level(verbose)),
        Cmd::Stats {
            cmd: StatsCmd::Reset,
        } => Request::StatsReset.into(),
        Cmd::Global {
            cmd: GlobalCmd::Show { verbose },
        } => Step::Ask(Request::GlobalShow, level(verbose)),
        Cmd::Route { cmd } => route::route(cmd),
        Cmd::Routing { .. } => Request::RoutingShow.into(),
        Cmd::Set { cmd } => cmd.request().into(),
    };
    match step {
        Step::Exit(code) => code,
        Step::Ask(req, view) => show::query(&path, json, req, view),
    }
}

/// `-v [LEVEL]` of a show: ulnet's own keys at any level.
fn level(verbose: Option<u8>) -> View {
    View {
        level: verbose.unwrap_or(0),
        ..View::default()
    }
}

/// Writes `text` to standard output. A reader that went away (`lnetctl peer show | head`) is
/// not an error worth a panic: the rest is dropped, as the shell tools do.
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("lnetctl: writing the output: {e}");
        }
    }
}

/// Writes `text` to standard error: lnetctl's YAML error blocks go there, as Lustre 2.16's
/// lnetctl writes them (lnetctl.c, yaml_lnet_print_error emits on stderr), so that a script
/// reading standard output never takes a failure for output.
fn emit_err(text: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// A failed call to the daemon, said on stderr, as the exit status it means.
fn client_failed(e: &ClientError) -> u8 {
    eprintln!("lnetctl: {}", cut_quotes(&e.to_string()));
    match e {
        ClientError::NoDaemon { .. } => exit::NO_DAEMON,
        _ => exit::FAILED,
    }
}

/// Parses a NID given on the command line, or says why not.
fn check_nid(s: &str) -> Result<Nid, u8> {
    s.trim().parse::<Nid>().map_err(|e| {
        eprintln!("lnetctl: {}", cut_quotes(&e.to_string()));
        exit::BAD_NID
    })
}

/// An argument as an error message quotes it: cut at `router::text::EXCERPT_CHARS`
/// characters, as the daemon's configuration errors are.
fn arg_excerpt(s: &str) -> std::borrow::Cow<'_, str> {
    router::text::excerpt(s, router::text::EXCERPT_CHARS)
}

/// `msg` with every quoted ('...') part longer than an excerpt cut to one: a 100 kB NID on
/// the command line made a 200 kB error line (it is quoted whole, twice).
fn cut_quotes(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(4096));
    let mut rest = msg;
    while let Some(open) = rest.find('\'') {
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        // The closing quote: the first one followed by a space, a colon, a comma, a bracket
        // or the end, so that a quote inside the argument does not end it early.
        let close = ["' ", "':", "',", "')"]
            .iter()
            .filter_map(|p| rest.find(p))
            .min()
            .or_else(|| rest.ends_with('\'').then(|| rest.len() - 1))
            .unwrap_or(rest.len());
        out.push_str(&arg_excerpt(&rest[..close]));
        rest = &rest[close..];
        if let Some(r) = rest.strip_prefix('\'') {
            out.push('\'');
            rest = r;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cmd, EXIT_CODES, SET_NOTES};
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn set_help_says_what_each_global_does_here() {
        for t in router::globals::TUNABLES {
            assert!(SET_NOTES.contains(t.name), "{} not in the notes", t.name);
            assert!(SET_NOTES.contains(t.effect), "{}: {}", t.name, t.effect);
            let cmd = Cli::try_parse_from(["lnetctl", "set", t.name, "7"]).unwrap();
            match cmd.cmd {
                Cmd::Set { cmd } => assert_eq!(
                    cmd.request(),
                    Request::SetGlobals {
                        values: vec![(t.name.into(), 7)]
                    }
                ),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn exit_codes_are_documented() {
        for code in [
            exit::OK,
            exit::FAILED,
            exit::USAGE,
            exit::NO_DAEMON,
            exit::BAD_NID,
        ] {
            assert!(EXIT_CODES.contains(&format!("  {code}  ")));
        }
    }
}
