//! The node's events in an NI loop: to the selftest first, peer up/down to the log (within a
//! budget: [`PeerLog`]), and to the control requests that wait on them.

use std::sync::mpsc::SyncSender;
use std::time::Duration as StdDuration;

use crate::control::{Control, Response};
use crate::runtime::NiRuntime;
use crate::LnetEvent;
use lnd::driver::LndDriver;
use tracing::{debug, info};

use super::selftest::{registry, NiSelftest, NoRegistry};

/// Peer up/down lines at info level, at most [`PeerLog::BUDGET`] per [`PeerLog::WINDOW`] per
/// NI; the rest are counted and summed up in one line when the window ends. A peer churning
/// connections (or a hostile one: the audit's 10,000 connections in 0.9 s wrote 20,001 lines,
/// 1.7 MB) must not flood the log; the peers' counters keep every event.
#[derive(Debug, Default)]
pub(super) struct PeerLog {
    pub(super) window_start: Option<std::time::Instant>,
    pub(super) lines: u32,
    pub(super) suppressed: u64,
}

impl PeerLog {
    pub(super) const WINDOW: StdDuration = StdDuration::from_secs(10);
    pub(super) const BUDGET: u32 = 100;

    /// Whether a line may be written at `now`; when a window with suppressed lines ends,
    /// the count of what was suppressed comes back to be logged.
    pub(super) fn admit(&mut self, now: std::time::Instant) -> (bool, Option<u64>) {
        let mut ended = None;
        match self.window_start {
            Some(t) if now.saturating_duration_since(t) < Self::WINDOW => {}
            _ => {
                if self.suppressed > 0 {
                    ended = Some(self.suppressed);
                }
                self.window_start = Some(now);
                self.lines = 0;
                self.suppressed = 0;
            }
        }
        if self.lines < Self::BUDGET {
            self.lines += 1;
            (true, ended)
        } else {
            self.suppressed += 1;
            (false, ended)
        }
    }
}

pub(super) fn drain_events(
    rt: &mut NiRuntime<Box<dyn LndDriver + Send>>,
    control: &mut Control<SyncSender<Response>>,
    lst: &mut NiSelftest,
    peer_log: &mut PeerLog,
) {
    // The clock only when there is an event to handle: a loop comes here every turn.
    if !rt.node().has_events() {
        lst.answer();
        return;
    }
    let now = rt.now();
    let (node, driver) = rt.parts();
    let mut none = NoRegistry;
    while let Some(ev) = node.poll_event() {
        let reg = registry(driver, &mut none);
        if let Some(st) = lst.st.as_mut() {
            if st.handle_event(now, node, reg, &ev) {
                continue;
            }
        }
        match &ev {
            LnetEvent::PeerUp { .. } | LnetEvent::PeerDown { .. } => {
                let (write, ended) = peer_log.admit(std::time::Instant::now());
                if let Some(n) = ended {
                    info!(
                        suppressed = n,
                        "peer up/down lines over {} per {} s were not logged (counters keep them)",
                        PeerLog::BUDGET,
                        PeerLog::WINDOW.as_secs()
                    );
                }
                match &ev {
                    LnetEvent::PeerUp { nid, .. } if write => info!(%nid, "peer up"),
                    LnetEvent::PeerDown { nid, reason, .. } if write => {
                        info!(%nid, ?reason, "peer down")
                    }
                    _ => debug!(?ev, "peer event"),
                }
            }
            LnetEvent::Put { from, portal, .. } => debug!(%from, portal, "PUT (no consumer)"),
            _ => {}
        }
        if let Some((reply, resp)) = control.on_event(&ev) {
            let _ = reply.try_send(resp);
        }
    }
    lst.answer();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hostile-peer audit's log flood: peer up/down lines are written up to the budget
    /// per window, the rest counted, and the count reported once when the window ends.
    #[test]
    fn peer_up_down_lines_are_budgeted_per_window() {
        let mut log = PeerLog::default();
        let t0 = std::time::Instant::now();
        let written = (0..10_000).filter(|_| log.admit(t0).0).count();
        assert_eq!(written, PeerLog::BUDGET as usize);
        // Still inside the window: nothing reported, still suppressed.
        assert_eq!(log.admit(t0 + StdDuration::from_secs(9)), (false, None));
        // The next window: the suppressed count comes back once, and lines flow again.
        let later = t0 + PeerLog::WINDOW + StdDuration::from_secs(1);
        assert_eq!(
            log.admit(later),
            (true, Some(10_000 - u64::from(PeerLog::BUDGET) + 1))
        );
        assert_eq!(log.admit(later), (true, None));
    }
}
