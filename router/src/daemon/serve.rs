//! The control thread: accepts lnetctl connections (at most `control::MAX_CLIENTS`; the client
//! idle longest makes room), serves each on a thread of its own with a size cap and timeouts,
//! and hands a capture its connection.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use crate::control::{errno, ControlCounters, ControlError, ReadRequest, Request, Response};
use tracing::{debug, warn};

use super::fan_out::{no_ni, Loops};
use super::state::{lock, shutting_down, Members};

/// How long a control client may idle between requests, and take to send one.
#[derive(Copy, Clone, Debug)]
pub(super) struct ClientLimits {
    pub(super) idle: StdDuration,
    pub(super) request: StdDuration,
}

/// Takes one client off [`ControlCounters::active`] when its thread ends, however it ends.
pub(super) struct ActiveClient(Arc<ControlCounters>);

impl Drop for ActiveClient {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The control clients holding the [`crate::control::MAX_CLIENTS`] slots, as the control thread sees
/// them when a new one comes and every slot is taken. A client with no request in flight (a
/// stuck monitoring script, a leaked descriptor) held its slot until the idle timeout, so an
/// operator's `lnetctl net show` or `ping` failed for up to 30 s: now the client idle longest
/// is closed to make room, at once, and counted (`evicted`). Never one being answered, nor one
/// receiving a stream: a capture's records, or a selftest session's progress (`run-test` polls
/// its statistics on the connection that opened the session).
#[derive(Default)]
pub(super) struct Clients {
    pub(super) next: u64,
    pub(super) served: HashMap<u64, Served>,
}

pub(super) struct Served {
    /// Since when it has waited for its next request with none in flight; `None` while one is
    /// being answered.
    pub(super) idle_since: Option<std::time::Instant>,
    /// Receiving a stream: never closed to make room.
    pub(super) streaming: bool,
    /// Its socket (a second descriptor), to end its reading side when it is closed to make
    /// room: its thread's read then ends, and the thread tells it why and closes.
    pub(super) stream: UnixStream,
}

impl Clients {
    /// Takes a slot for a client served from now on (idle: it has sent nothing yet).
    pub(super) fn add(&mut self, stream: UnixStream) -> u64 {
        let id = self.next;
        self.next += 1;
        self.served.insert(
            id,
            Served {
                idle_since: Some(std::time::Instant::now()),
                streaming: false,
                stream,
            },
        );
        id
    }

    /// Client `id` waits for its next request; false if it was closed to make room.
    pub(super) fn waiting(&mut self, id: u64) -> bool {
        self.served.get_mut(&id).is_some_and(|c| {
            c.idle_since.get_or_insert_with(std::time::Instant::now);
            true
        })
    }

    /// Client `id` has a request in flight (or is done reading); false if it was closed to
    /// make room before the request came.
    pub(super) fn answering(&mut self, id: u64) -> bool {
        self.served.get_mut(&id).is_some_and(|c| {
            c.idle_since = None;
            true
        })
    }

    pub(super) fn set_streaming(&mut self, id: u64, on: bool) {
        if let Some(c) = self.served.get_mut(&id) {
            c.streaming = on;
        }
    }

    /// Frees a slot for a newcomer. First one whose client has already hung up while idle (its
    /// thread has not seen the end yet): freed without a word, not an eviction (its thread then
    /// finds its slot gone and ends). Else the client idle longest, not streaming, is closed to
    /// make room: its slot taken and its socket's reading side ended (`Some(true)`, counted as
    /// evicted by the caller). `None` if every client is being answered or streams.
    pub(super) fn make_room(&mut self) -> Option<bool> {
        let gone = self
            .served
            .iter()
            .find(|(_, c)| c.idle_since.is_some() && hung_up(&c.stream))
            .map(|(id, _)| *id);
        if let Some(id) = gone {
            self.served.remove(&id);
            debug!("control client slot freed: its client had gone");
            return Some(false);
        }
        let idlest = self
            .served
            .iter()
            .filter(|(_, c)| !c.streaming)
            .filter_map(|(id, c)| Some((c.idle_since?, *id)))
            .min();
        let (since, id) = idlest?;
        if let Some(c) = self.served.remove(&id) {
            debug!(
                idle_ms = since.elapsed().as_millis() as u64,
                "control client closed to make room for a new one"
            );
            let _ = c.stream.shutdown(std::net::Shutdown::Read);
        }
        Some(true)
    }
}

/// Whether a client's peer has closed its end: a read would give end-of-file now. Peeks without
/// blocking and without changing the socket's flags (its thread reads it blocking), so a
/// request not yet read is left where it is.
fn hung_up(stream: &UnixStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        rustix::net::recv(
            stream,
            &mut byte,
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT
        ),
        Ok((0, _))
    )
}

/// The longest the control thread waits for the thread of a client it closed to make room
/// (which writes one line with a 1 s timeout, then ends).
pub(super) const EVICT_WAIT: StdDuration = StdDuration::from_secs(2);

/// Gives a client's slot back when its thread ends, however it ends (a no-op for one closed to
/// make room, whose slot went then).
pub(super) struct Slot {
    pub(super) clients: Arc<Mutex<Clients>>,
    pub(super) id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.clients).served.remove(&self.id);
    }
}

/// Accepts lnetctl connections. At most [`crate::control::MAX_CLIENTS`] are served at once, each by
/// its own thread (a capture adds a watcher); when all are taken, the one idle longest is
/// closed to make room ([`Clients`]), and only if none is idle the next are told "too many
/// control clients" in one line and closed at once, on this thread, so that idle or stuck
/// clients cost a bounded number of threads and fds and never lock the operator out. Each
/// client thread reads with a size cap and timeouts ([`crate::control::read_request`]).
pub(super) fn control_thread(
    listener: std::os::unix::net::UnixListener,
    loops: Loops,
    limits: ClientLimits,
    counters: Arc<ControlCounters>,
) {
    let clients = Arc::new(Mutex::new(Clients::default()));
    // Accept failures (at the descriptor limit, say) are counted, and logged at most once per
    // ACCEPT_LOG_EVERY with how many were not.
    const ACCEPT_LOG_EVERY: StdDuration = StdDuration::from_secs(10);
    let mut last_log: Option<std::time::Instant> = None;
    let mut unlogged = 0u64;
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                ControlCounters::bump(&counters.accept_errors);
                if last_log.is_none_or(|t| t.elapsed() >= ACCEPT_LOG_EVERY) {
                    warn!(
                        more_since_last_log = unlogged,
                        "control socket accept: {e}; retrying every 100 ms"
                    );
                    last_log = Some(std::time::Instant::now());
                    unlogged = 0;
                } else {
                    unlogged += 1;
                }
                std::thread::sleep(StdDuration::from_millis(100));
                continue;
            }
        };
        // Only this thread adds clients, so the check cannot be overtaken. Every slot taken:
        // the client idle longest makes room (see `Clients`); refused only when each is being
        // answered or streams.
        let slot = {
            let mut table = lock(&clients);
            let full = table.served.len() >= crate::control::MAX_CLIENTS;
            let made = if full { table.make_room() } else { Some(false) };
            if made == Some(true) {
                ControlCounters::bump(&counters.evicted);
            }
            let room = made.is_some();
            match stream.try_clone() {
                Ok(handle) if room => Some(table.add(handle)),
                _ => None,
            }
        };
        let Some(id) = slot else {
            ControlCounters::bump(&counters.refused);
            debug!(
                "control client refused: {} served already, none idle",
                crate::control::MAX_CLIENTS
            );
            refuse(
                stream,
                &format!(
                    "too many control clients ({} at once, none idle); try again",
                    crate::control::MAX_CLIENTS
                ),
            );
            continue;
        };
        let slot = Slot {
            clients: Arc::clone(&clients),
            id,
        };
        // A client closed to make room ends its thread at once (its read has ended; its one
        // error line waits 1 s at most): waited for, so that the threads stay bounded too.
        let t0 = std::time::Instant::now();
        while counters.active.load(Ordering::Relaxed) >= crate::control::MAX_CLIENTS as u64
            && t0.elapsed() < EVICT_WAIT
        {
            std::thread::sleep(StdDuration::from_millis(1));
        }
        counters.active.fetch_add(1, Ordering::Relaxed);
        let active = ActiveClient(Arc::clone(&counters));
        let (loops, c) = (loops.clone(), Arc::clone(&counters));
        let spawned = std::thread::Builder::new()
            .name("control-conn".into())
            .spawn(move || {
                let _active = active;
                ControlCounters::bump(&c.accepted);
                if let Err(e) = serve_client(stream, &loops, limits, &c, &slot) {
                    debug!("control connection: {e}");
                }
            });
        if let Err(e) = spawned {
            // The closure (and with it the stream and the active count) was dropped.
            warn!("cannot serve a control connection: {e}");
        }
    }
}

/// Answers a client we do not serve with one error line and closes it, never blocking long
/// (a fresh connection's send buffer is empty; the write timeout is a belt for the braces).
pub(super) fn refuse(stream: UnixStream, message: &str) {
    let _ = stream.set_write_timeout(Some(StdDuration::from_millis(100)));
    let resp = Response::Error(ControlError::new(errno::EBUSY, message));
    let _ = (&stream).write_all(crate::control::encode_response(&resp).as_bytes());
}

/// Serves one lnetctl connection: request lines in, one response line each, until the client
/// closes, idles past `limits.idle`, takes longer than `limits.request` to send a line, or
/// sends a line over [`crate::control::MAX_REQUEST`] (each of these gets an error line and is closed).
/// A `capture_start` hands the connection over to the capture ([`serve_capture`]).
pub(super) fn serve_client(
    stream: UnixStream,
    loops: &Loops,
    limits: ClientLimits,
    counters: &ControlCounters,
    slot: &Slot,
) -> std::io::Result<()> {
    // A client that does not read its answers is closed too, not waited for.
    stream.set_write_timeout(Some(limits.idle))?;
    // One fd per client for its requests and answers (and one the control thread holds to
    // close it to make room).
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let waiting = lock(&slot.clients).waiting(slot.id);
        let read = if waiting {
            crate::control::read_request(
                &mut reader,
                &mut line,
                Some(limits.idle),
                Some(limits.request),
            )
        } else {
            Ok(ReadRequest::Eof)
        };
        // Closed to make room while it waited (its read ended): told so, whatever it sent.
        if !lock(&slot.clients).answering(slot.id) {
            let e = ControlError::new(
                errno::EBUSY,
                format!(
                    "closed to make room for another control client: this one was idle \
                     longest of {} (at most {} at once)",
                    crate::control::MAX_CLIENTS,
                    crate::control::MAX_CLIENTS
                ),
            );
            tell_and_close(reader.get_ref(), e);
            return Ok(());
        }
        match read_outcome(read?, limits, counters) {
            Ok(()) => {}
            Err(None) => return Ok(()),
            Err(Some(e)) => {
                tell_and_close(reader.get_ref(), e);
                return Ok(());
            }
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        let decoded = crate::control::decode_request_bytes(&line);
        // A big request (an import) leaves no big buffer behind it for the connection's life.
        if line.capacity() > 64 * 1024 {
            line = Vec::new();
        }
        let resp = match decoded {
            Ok(req @ Request::CaptureStart { .. }) => {
                // The stream's pace is the client's: a capture is never idle, nor closed to
                // make room.
                lock(&slot.clients).set_streaming(slot.id, true);
                // The capture's watcher reads while this thread writes: a second fd, for the
                // one capture that runs at a time.
                let writer = reader.get_ref().try_clone()?;
                writer.set_write_timeout(None)?;
                return serve_capture(req, reader, writer, loops);
            }
            Ok(req @ Request::StatsShow) => match loops.call(req) {
                Response::Stats(mut s) => {
                    s.control = Some(counters.snapshot());
                    Response::Stats(s)
                }
                other => other,
            },
            Ok(req @ Request::Selftest { .. }) => answer_selftest(req, loops, slot),
            Ok(req) => loops.call(req),
            Err(e) => {
                ControlCounters::bump(&counters.bad_requests);
                Response::Error(e)
            }
        };
        reader
            .get_ref()
            .write_all(crate::control::encode_response(&resp).as_bytes())?;
    }
}

/// Tells a client why it is closed, best effort: it may be gone or not reading. What it still
/// sends is never read (closing with unread data resets its side).
fn tell_and_close(mut writer: &UnixStream, e: ControlError) {
    debug!("control client closed: {e}");
    let _ = writer.set_write_timeout(Some(StdDuration::from_secs(1)));
    let _ = writer.write_all(crate::control::encode_response(&Response::Error(e)).as_bytes());
}

/// A client's read: a line to answer (`Ok`), its close (`Err(None)`), or what closes it, to
/// tell it and count (`Err(Some(..))`: idle, stalled or oversized).
fn read_outcome(
    read: ReadRequest,
    limits: ClientLimits,
    counters: &ControlCounters,
) -> Result<(), Option<ControlError>> {
    let (counter, e) = match read {
        ReadRequest::Line => return Ok(()),
        ReadRequest::Eof => return Err(None),
        ReadRequest::Idle => (
            &counters.idle_timeouts,
            ControlError::new(
                errno::ETIMEDOUT,
                format!("idle for {} s; closing", limits.idle.as_secs()),
            ),
        ),
        ReadRequest::Stalled => (
            &counters.request_timeouts,
            ControlError::new(
                errno::ETIMEDOUT,
                format!(
                    "request not complete within {} s; closing",
                    limits.request.as_secs()
                ),
            ),
        ),
        ReadRequest::TooLong => (&counters.oversized, crate::control::too_long()),
    };
    ControlCounters::bump(counter);
    Err(Some(e))
}

/// A selftest command, through the first NI's console. A selftest session's console
/// (`run-test`) polls its progress on this connection: from its new session to its end, it is
/// never closed to make room.
fn answer_selftest(req: Request, loops: &Loops, slot: &Slot) -> Response {
    let session = match &req {
        Request::Selftest {
            cmd: crate::selftest::LstCommand::NewSession { .. },
        } => Some(true),
        Request::Selftest {
            cmd: crate::selftest::LstCommand::EndSession,
        } => Some(false),
        _ => None,
    };
    let resp = loops.call(req);
    if let Some(on) = session.filter(|_| !matches!(resp, Response::Error(_))) {
        lock(&slot.clients).set_streaming(slot.id, on);
    }
    resp
}

/// A capture owns its connection: every NI loop's records are written to the client as they
/// come, while a watcher thread reads the client's side; a `capture_stop` line, or the client
/// closing (lnetctl killed, its host gone), ends the capture on every NI. So does a failed write:
/// the stream's receiver is dropped and each loop sees it at its next delivery. The NI loops
/// share one bounded stream; this thread merges their starts and their summaries into one each.
pub(super) fn serve_capture(
    req: Request,
    mut reader: BufReader<UnixStream>,
    mut writer: UnixStream,
    loops: &Loops,
) -> std::io::Result<()> {
    let (out_tx, out_rx) = mpsc::sync_channel(crate::control::CAPTURE_QUEUE);
    // The NIs as they are when the capture starts: the capture is theirs (an NI added later
    // is not captured; one removed ends its part with its loop).
    let m = loops.members();
    if m.list.is_empty() {
        let e = no_ni();
        return writer.write_all(crate::control::encode_response(&Response::Error(e)).as_bytes());
    }
    let mut asked = Vec::new();
    for (i, member) in m.list.iter().enumerate() {
        match member.submit(req.clone(), out_tx.clone()) {
            Ok(()) => asked.push(i),
            Err(e) => {
                stop_captures(&m, &asked, &HashMap::new());
                return writer
                    .write_all(crate::control::encode_response(&Response::Error(e)).as_bytes());
            }
        }
    }
    drop(out_tx);
    // Every NI's start (each names its own capture), with the records that beat the last one.
    let mut ids: HashMap<usize, u64> = HashMap::new();
    let mut early = Vec::new();
    let mut failure = None;
    while ids.len() + usize::from(failure.is_some()) < asked.len() {
        match out_rx.recv() {
            Ok(Response::CaptureStarted(s)) => {
                if let Some(i) = s.nis.first().and_then(|n| m.index_of(n)) {
                    ids.insert(i, s.id);
                }
            }
            Ok(Response::Error(e)) => {
                failure.get_or_insert(e);
            }
            Ok(other) => early.push(other),
            Err(_) => {
                failure.get_or_insert_with(|| match shutting_down() {
                    Response::Error(e) => e,
                    _ => ControlError::new(errno::ESHUTDOWN, "the daemon is shutting down"),
                });
                break;
            }
        }
    }
    if let Some(e) = failure {
        stop_captures(&m, &asked, &ids);
        return writer.write_all(crate::control::encode_response(&Response::Error(e)).as_bytes());
    }
    let started = crate::control::CaptureStarted {
        id: ids.get(&0).copied().unwrap_or(1),
        nis: m.list.iter().map(|l| l.nid.to_string()).collect(),
    };
    writer.write_all(
        crate::control::encode_response(&Response::CaptureStarted(started)).as_bytes(),
    )?;
    let (m2, ids2) = (Arc::clone(&m), ids.clone());
    std::thread::Builder::new()
        .name("capture-watch".into())
        .spawn(move || {
            let mut line = Vec::new();
            // No timeouts: the capture's client only ever sends its stop. A line over the cap
            // ends the capture like a closed connection.
            while let Ok(ReadRequest::Line) =
                crate::control::read_request(&mut reader, &mut line, None, None)
            {
                if let Ok(Request::CaptureStop { .. }) = crate::control::decode_request_bytes(&line)
                {
                    break;
                }
                // Anything else is ignored: the connection belongs to the capture.
            }
            let all: Vec<usize> = ids2.keys().copied().collect();
            stop_captures(&m2, &all, &ids2);
        })?;
    let mut done: Option<crate::control::CaptureSummary> = None;
    let mut ended = 0;
    for resp in early.into_iter().chain(out_rx.iter()) {
        match resp {
            Response::CaptureDone(sum) => {
                ended += 1;
                let d = done.get_or_insert_with(|| crate::control::CaptureSummary {
                    reason: sum.reason.clone(),
                    ..Default::default()
                });
                d.captured += sum.captured;
                d.dropped += sum.dropped;
                if ended == ids.len() {
                    break;
                }
            }
            Response::Error(_) => {}
            other => writer.write_all(crate::control::encode_response(&other).as_bytes())?,
        }
    }
    let sum = done.unwrap_or_else(|| crate::control::CaptureSummary {
        reason: "daemon shutting down".into(),
        ..Default::default()
    });
    writer.write_all(crate::control::encode_response(&Response::CaptureDone(sum)).as_bytes())?;
    // Ends the watcher's read too.
    let _ = writer.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// Asks NI loops `which` to end their capture (ids as each named it). The stop must get through,
/// or a capture would run (and refuse every other) until the daemon stops: retried while a
/// control queue is full.
pub(super) fn stop_captures(m: &Members, which: &[usize], ids: &HashMap<usize, u64>) {
    for &i in which {
        let Some(&id) = ids.get(&i) else {
            continue;
        };
        loop {
            let (done_tx, _done_rx) = mpsc::sync_channel(1);
            let Some(member) = m.list.get(i) else { break };
            match member.submit(Request::CaptureStop { id }, done_tx) {
                Err(e) if e.errno == errno::EIO => {
                    std::thread::sleep(StdDuration::from_millis(10));
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32, item 4: with every slot taken, the client idle longest makes room, never one
    /// being answered or receiving a stream; none idle, none is closed.
    #[test]
    fn the_client_idle_longest_makes_room() {
        let mut t = Clients::default();
        let mut ends = Vec::new();
        let mut add = |t: &mut Clients| {
            let (ours, theirs) = UnixStream::pair().unwrap();
            ends.push(theirs);
            t.add(ours)
        };
        let streaming = add(&mut t);
        t.set_streaming(streaming, true);
        let idle_old = add(&mut t);
        let busy = add(&mut t);
        assert!(t.answering(busy));
        let idle_new = add(&mut t);
        assert_eq!(t.make_room(), Some(true));
        assert!(!t.served.contains_key(&idle_old));
        assert!(!t.waiting(idle_old), "its thread learns it was closed");
        assert_eq!(t.make_room(), Some(true));
        assert!(!t.served.contains_key(&idle_new));
        assert!(
            t.make_room().is_none(),
            "one answering and one streaming: nobody to close"
        );
        assert_eq!(t.served.len(), 2);
        // Its answer sent, the busy one waits again: now it may go.
        assert!(t.waiting(busy));
        assert_eq!(t.make_room(), Some(true));
        assert_eq!(
            t.served.keys().copied().collect::<Vec<_>>(),
            vec![streaming]
        );
        // A slot's guard gives it back.
        drop(Slot {
            clients: Arc::new(Mutex::new(std::mem::take(&mut t))),
            id: streaming,
        });
    }

    /// A client that hung up while idle is freed first, silently: not an eviction (what the
    /// `evicted` counter tells an operator, and tests count exactly), and the ones still
    /// connected keep their slots.
    #[test]
    fn a_client_gone_while_idle_is_freed_not_evicted() {
        let mut t = Clients::default();
        let (a, a_peer) = UnixStream::pair().unwrap();
        let (b, _b_peer) = UnixStream::pair().unwrap();
        let older = t.add(a);
        let gone = t.add(b);
        drop(_b_peer);
        let _ = &a_peer;
        assert_eq!(t.make_room(), Some(false), "the hung-up one goes first");
        assert!(!t.served.contains_key(&gone));
        assert!(
            t.served.contains_key(&older),
            "the idlest, still there, stays"
        );
        assert_eq!(
            t.make_room(),
            Some(true),
            "then the idlest is closed to make room"
        );
        assert!(t.served.is_empty());
    }
}
