//! `lnetctl capture --file F.pcap [--duration SECS] [--force]`.
//!
//! The daemon streams a copy of every kib message its NIs send and receive over the control
//! connection; this process writes the pcap file (see `router/src/control/capture.rs` for
//! why the file is written here and not by the daemon). The capture ends when `--duration` has
//! passed (the daemon ends it), on Ctrl-C or SIGTERM (we ask the daemon to stop, it flushes what
//! its engines still hold and sends the totals), or when this process dies (its connection closes
//! and the daemon stops capturing). A second Ctrl-C, or a daemon that does not confirm the stop
//! within [`STOP_BOUND`], ends the command at once with what was written so far.
//!
//! The file is written with this user's permissions; an existing file is refused unless
//! `--force`. On a refused capture (another one runs: one at a time) the file we created is
//! removed again.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use router::control::{
    CaptureSummary, CaptureWriter, ClientError, ControlClient, Request, Response,
};

use crate::exit;
use crate::render::{self, Report};

/// How long we wait for the daemon to confirm a stop before giving up on it.
pub const STOP_BOUND: Duration = Duration::from_secs(10);
/// How often the wait for records looks at signals.
const TICK: Duration = Duration::from_millis(100);

/// Where the pcap goes.
enum Sink {
    Stdout,
    File(PathBuf),
}

pub fn run(socket: &Path, file: &Path, duration: Option<u64>, force: bool, json: bool) -> u8 {
    let sink = if file.as_os_str() == "-" {
        Sink::Stdout
    } else {
        match std::path::absolute(file) {
            Ok(p) => Sink::File(p),
            Err(e) => {
                eprintln!("lnetctl: capture: {}: {e}", file.display());
                return exit::FAILED;
            }
        }
    };
    // Refuse an existing file before asking the daemon anything; the file itself is opened (and
    // with --force truncated) only once the capture has started, so a capture that cannot start
    // leaves whatever was there untouched.
    if let Sink::File(p) = &sink {
        if !force && std::fs::symlink_metadata(p).is_ok() {
            eprintln!(
                "lnetctl: capture: {}: exists; pass --force to overwrite it",
                p.display()
            );
            return exit::FAILED;
        }
    }
    let open_out = || -> std::io::Result<Box<dyn Write>> {
        Ok(match &sink {
            Sink::Stdout => Box::new(std::io::stdout().lock()),
            Sink::File(p) => Box::new(BufWriter::new(open(p, force)?)),
        })
    };
    capture(socket, &sink, open_out, duration, json).unwrap_or_else(|code| code)
}

fn open(p: &Path, force: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true);
    if force {
        o.create(true).truncate(true);
    } else {
        o.create_new(true);
    }
    o.open(p).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            std::io::Error::new(e.kind(), "exists; pass --force to overwrite it")
        } else {
            e
        }
    })
}

/// Runs the capture: `Err(exit code)` if it could not start (no file opened), else the exit
/// code (the file is kept, complete up to the last whole chunk, even after an error).
fn capture(
    socket: &Path,
    sink: &Sink,
    open_out: impl FnOnce() -> std::io::Result<Box<dyn Write>>,
    duration: Option<u64>,
    json: bool,
) -> Result<u8, u8> {
    let mut client = match ControlClient::connect(socket) {
        Ok(c) => c,
        Err(e @ ClientError::NoDaemon { .. }) => {
            eprintln!("lnetctl: {e}");
            return Err(exit::NO_DAEMON);
        }
        Err(e) => {
            eprintln!("lnetctl: {e}");
            return Err(exit::FAILED);
        }
    };
    // From here on Ctrl-C asks the daemon to stop instead of killing us mid-record.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&stop)) {
            eprintln!("lnetctl: cannot handle signals: {e}");
            return Err(exit::FAILED);
        }
    }
    let started = client
        .send(&Request::CaptureStart {
            duration_secs: duration,
        })
        .and_then(|()| client.call_reply());
    let started = match started {
        Ok(Response::CaptureStarted(s)) => s,
        Ok(Response::Error(e)) => {
            eprintln!("lnetctl: capture: {e}");
            return Err(exit::FAILED);
        }
        Ok(other) => {
            eprintln!("lnetctl: capture: unexpected answer {other:?}");
            return Err(exit::FAILED);
        }
        Err(e) => {
            eprintln!("lnetctl: {e}");
            return Err(exit::FAILED);
        }
    };
    let target = match sink {
        Sink::Stdout => "standard output".to_string(),
        Sink::File(p) => p.display().to_string(),
    };
    let out = match open_out() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("lnetctl: capture: {target}: {e}");
            let _ = client.send(&Request::CaptureStop { id: started.id });
            return Ok(exit::FAILED);
        }
    };
    let mut w = match CaptureWriter::new(out) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("lnetctl: capture: {target}: {e}");
            let _ = client.send(&Request::CaptureStop { id: started.id });
            return Ok(exit::FAILED);
        }
    };
    // Said once the output is open: a path that cannot be written ends it before any "capturing"
    // line (an operator's audit saw the line, then the failure).
    eprintln!(
        "lnetctl: capturing on {} into {target}; {}",
        started.nis.join(", "),
        match duration {
            Some(d) => format!("for {d} s (Ctrl-C stops earlier)"),
            None => "Ctrl-C stops".to_string(),
        }
    );

    let t0 = Instant::now();
    let mut stop_sent: Option<Instant> = None;
    let (summary, code) = loop {
        match client.recv_timeout(Some(TICK)) {
            Ok(Some(Response::CaptureData(d))) => {
                let r = d
                    .records
                    .iter()
                    .try_for_each(|r| w.write(r))
                    .and_then(|()| w.flush());
                if let Err(e) = r {
                    eprintln!("lnetctl: capture: {target}: {e}");
                    let _ = client.send(&Request::CaptureStop { id: started.id });
                    break (None, exit::FAILED);
                }
            }
            Ok(Some(Response::CaptureDone(s))) => break (Some(s), exit::OK),
            Ok(Some(Response::Error(e))) => {
                eprintln!("lnetctl: capture: {e}");
                break (None, exit::FAILED);
            }
            Ok(Some(other)) => {
                eprintln!("lnetctl: capture: unexpected answer {other:?}");
                break (None, exit::FAILED);
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("lnetctl: capture ended early: {e}");
                break (None, exit::FAILED);
            }
        }
        if stop.swap(false, Ordering::Relaxed) {
            if stop_sent.is_some() {
                eprintln!("lnetctl: capture: interrupted again; not waiting for the daemon");
                break (None, exit::FAILED);
            }
            if let Err(e) = client.send(&Request::CaptureStop { id: started.id }) {
                eprintln!("lnetctl: capture: cannot ask the daemon to stop: {e}");
                break (None, exit::FAILED);
            }
            stop_sent = Some(Instant::now());
        }
        if stop_sent.is_some_and(|t| t.elapsed() > STOP_BOUND) {
            eprintln!(
                "lnetctl: capture: the daemon did not confirm the stop within {STOP_BOUND:?}"
            );
            break (None, exit::FAILED);
        }
    };
    let _ = w.flush();
    let report = Report {
        file: target,
        captured: w.frames(),
        dropped: summary.as_ref().map(|s| s.dropped),
        seconds: t0.elapsed().as_secs_f64(),
        reason: summary.map_or_else(|| "error".to_string(), |s: CaptureSummary| s.reason),
    };
    let text = if json {
        render::capture_json(&report)
    } else {
        render::capture_yaml(&report)
    };
    match sink {
        // The pcap owns standard output.
        Sink::Stdout => eprint!("{text}"),
        Sink::File(_) => print!("{text}"),
    }
    Ok(code)
}

trait CallReply {
    fn call_reply(&mut self) -> Result<Response, ClientError>;
}

impl CallReply for ControlClient {
    /// The next response, however long it takes.
    fn call_reply(&mut self) -> Result<Response, ClientError> {
        loop {
            if let Some(r) = self.recv_timeout(Some(TICK))? {
                return Ok(r);
            }
        }
    }
}
