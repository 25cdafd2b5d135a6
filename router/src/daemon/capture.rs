use std::sync::mpsc::{SyncSender, TrySendError};

use crate::control::{CaptureSession, CaptureSummary, Delivery, Response};
use crate::LnetNode;
use tracing::info;

/// The one capture the daemon runs at a time (`lnetctl capture`).
#[derive(Default)]
pub(super) enum CaptureState {
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
    pub(super) fn step(self, node: &mut LnetNode, now: lnd::time::Instant) -> CaptureState {
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
pub(super) fn end_capture(
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

pub(super) fn deliver(out: &SyncSender<Response>, r: Response) -> Delivery {
    match out.try_send(r) {
        Ok(()) => Delivery::Queued,
        Err(TrySendError::Full(_)) => Delivery::Full,
        Err(TrySendError::Disconnected(_)) => Delivery::Gone,
    }
}
