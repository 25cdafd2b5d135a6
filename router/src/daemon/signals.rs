//! The signals the daemon handles: TERM, INT and QUIT stop it; HUP, USR1 and USR2 are logged
//! and ignored.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::warn;

/// The signals the daemon handles. SIGTERM, SIGINT and SIGQUIT stop it gracefully; SIGHUP,
/// SIGUSR1 and SIGUSR2 are logged (once per delivery) and ignored, so that a service manager
/// reloading or a closed terminal never kills it uncleanly (configuration changes go through
/// lnetctl). SIGPIPE stays ignored as Rust's runtime sets it at start: a client that goes away
/// is an EPIPE on its connection, nothing more.
pub(super) struct Signals {
    pub(super) term: Arc<AtomicBool>,
    pub(super) hup: Arc<AtomicBool>,
    pub(super) usr1: Arc<AtomicBool>,
    pub(super) usr2: Arc<AtomicBool>,
}

impl Signals {
    pub(super) fn install() -> Result<Signals, String> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
        let s = Signals {
            term: Arc::default(),
            hup: Arc::default(),
            usr1: Arc::default(),
            usr2: Arc::default(),
        };
        let reg = |sig, flag: &Arc<AtomicBool>| {
            signal_hook::flag::register(sig, Arc::clone(flag))
                .map(|_| ())
                .map_err(|e| format!("cannot install a signal handler: {e}"))
        };
        for sig in [SIGTERM, SIGINT, SIGQUIT] {
            reg(sig, &s.term)?;
        }
        reg(SIGHUP, &s.hup)?;
        reg(SIGUSR1, &s.usr1)?;
        reg(SIGUSR2, &s.usr2)?;
        Ok(s)
    }

    /// Logs the ignored signals that arrived since the last look; true once a stop was asked.
    pub(super) fn check(&self) -> bool {
        if self.hup.swap(false, Ordering::Relaxed) {
            warn!("SIGHUP ignored: configuration changes go through lnetctl");
        }
        if self.usr1.swap(false, Ordering::Relaxed) {
            warn!("SIGUSR1 ignored");
        }
        if self.usr2.swap(false, Ordering::Relaxed) {
            warn!("SIGUSR2 ignored");
        }
        self.term.load(Ordering::Relaxed)
    }
}
