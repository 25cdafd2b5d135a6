//! `lnetctl capture` in an NI loop ([`LoopCapture`]): the one capture it runs, streamed to the
//! capturing connection without ever blocking on it (a full stream drops and counts). The
//! connection's side is `serve::serve_capture`.

use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::control::{errno, CaptureSession, CaptureSummary, ControlError, Delivery, Response};
use crate::LnetNode;
use lnd::time::Duration;
use tracing::info;

/// One NI loop's side of `lnetctl capture`: the capture it runs (one at a time), and the id
/// the next one gets.
pub(super) struct LoopCapture {
    state: CaptureState,
    next: u64,
}

impl Default for LoopCapture {
    fn default() -> LoopCapture {
        LoopCapture {
            state: CaptureState::Idle,
            next: 1,
        }
    }
}

impl LoopCapture {
    /// `capture_start`: turns capturing on in the node's LNDs, streaming to `reply`; refused
    /// while one runs, or once the loop is shutting down. The answer goes on `reply` too.
    pub(super) fn start(
        &mut self,
        node: &mut LnetNode,
        now: lnd::time::Instant,
        duration_secs: Option<u64>,
        reply: &SyncSender<Response>,
        shutting_down: bool,
    ) -> Response {
        if !matches!(self.state, CaptureState::Idle) {
            return Response::Error(ControlError::new(
                errno::EBUSY,
                "a capture is already running (one at a time); stop it first",
            ));
        }
        if shutting_down {
            return Response::Error(ControlError::new(
                errno::ESHUTDOWN,
                "the daemon is shutting down",
            ));
        }
        let unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let s = CaptureSession::start(
            node,
            self.next,
            now,
            unix_ns,
            duration_secs.map(Duration::from_secs),
        );
        self.next += 1;
        info!(id = s.id(), ?duration_secs, "capture started");
        let started = Response::CaptureStarted(s.started());
        self.state = CaptureState::Running(s, reply.clone());
        started
    }

    /// `capture_stop` of capture `id`: ends it (the summary follows the records in its stream).
    pub(super) fn stop(&mut self, node: &mut LnetNode, id: u64) -> Response {
        match std::mem::take(&mut self.state) {
            CaptureState::Running(s, out) if s.id() == id => {
                let sum = end_capture(node, s, &out, "stopped");
                self.state = CaptureState::Ending(sum.clone(), out);
                Response::CaptureDone(sum)
            }
            other => {
                self.state = other;
                Response::Error(ControlError::new(
                    errno::ENOENT,
                    format!("no capture {id} is running"),
                ))
            }
        }
    }

    /// Whether a capture runs or its summary waits to be delivered.
    pub(super) fn active(&self) -> bool {
        !matches!(self.state, CaptureState::Idle)
    }

    /// One turn of the loop for the capture ([`CaptureState::step`]).
    pub(super) fn step(&mut self, node: &mut LnetNode, now: lnd::time::Instant) {
        self.state = std::mem::take(&mut self.state).step(node, now);
    }

    /// The loop is ending: a running capture ends with its summary sent (if there is room).
    pub(super) fn end(&mut self, node: &mut LnetNode) {
        if let CaptureState::Running(s, out) = std::mem::take(&mut self.state) {
            let sum = end_capture(node, s, &out, "daemon shutting down");
            let _ = out.try_send(Response::CaptureDone(sum));
        }
    }
}

/// The one capture the daemon runs at a time (`lnetctl capture`).
#[derive(Default)]
enum CaptureState {
    #[default]
    Idle,
    /// Streaming records to the capturing connection.
    Running(CaptureSession, SyncSender<Response>),
    /// Finished; the summary waits for room in the stream.
    Ending(CaptureSummary, SyncSender<Response>),
}

impl CaptureState {
    /// One turn of the loop: stream what the engines captured, end the capture when its
    /// duration is over or its client is gone, deliver the final summary.
    fn step(self, node: &mut LnetNode, now: lnd::time::Instant) -> CaptureState {
        match self {
            CaptureState::Idle => CaptureState::Idle,
            CaptureState::Running(mut s, out) => {
                if !s.drain(node, |chunk| deliver(&out, Response::CaptureData(chunk))) {
                    let sum = s.finish(node, "lnetctl went away");
                    info!(
                        captured = sum.captured,
                        dropped = sum.dropped,
                        "capture ended: {}",
                        sum.reason
                    );
                    return CaptureState::Idle;
                }
                if s.expired(now) {
                    let sum = end_capture(node, s, &out, "duration elapsed");
                    return CaptureState::Ending(sum, out).step(node, now);
                }
                CaptureState::Running(s, out)
            }
            CaptureState::Ending(sum, out) => {
                match deliver(&out, Response::CaptureDone(sum.clone())) {
                    Delivery::Full => CaptureState::Ending(sum, out),
                    Delivery::Queued | Delivery::Gone => CaptureState::Idle,
                }
            }
        }
    }
}

/// Streams the records still held, then turns capturing off.
fn end_capture(
    node: &mut LnetNode,
    mut s: CaptureSession,
    out: &SyncSender<Response>,
    reason: &str,
) -> CaptureSummary {
    s.drain(node, |chunk| deliver(out, Response::CaptureData(chunk)));
    let sum = s.finish(node, reason);
    info!(
        captured = sum.captured,
        dropped = sum.dropped,
        "capture ended: {reason}"
    );
    sum
}

fn deliver(out: &SyncSender<Response>, r: Response) -> Delivery {
    match out.try_send(r) {
        Ok(()) => Delivery::Queued,
        Err(TrySendError::Full(_)) => Delivery::Full,
        Err(TrySendError::Disconnected(_)) => Delivery::Gone,
    }
}
