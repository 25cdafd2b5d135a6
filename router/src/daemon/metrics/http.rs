//! The endpoint's HTTP side: one accept thread, at most `max_connections` scrapes served at once
//! (a connection beyond them is closed at accept and counted), each on a short-lived thread
//! that reads one request head (parsed by `httparse`; at most [`MAX_REQUEST`] bytes, within
//! [`REQUEST_TIMEOUT`] of the accept), answers `GET /metrics` and closes. None of it touches an
//! NI loop: a scrape reads the loops' published copies only.
//!
//! Why not a server crate (tiny_http, say): none of the small ones lets the caller refuse a
//! connection at accept or bound how long a client may take to send its request, which is what
//! keeps a slow or hostile client from holding threads and memory; the parsing, the part that
//! must not be hand-written, is `httparse`'s (hyper's parser).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

/// The most bytes of a request head read: a scrape's is a few hundred.
pub(crate) const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take from its accept to the end of its request head, and to take
/// the answer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The most headers a request may have.
const MAX_HEADERS: usize = 64;

/// The endpoint's own counters (exported as `ulnet_metrics_*`).
#[derive(Debug, Default)]
pub(crate) struct EndpointCounters {
    pub(crate) served: AtomicU64,
    /// Connections closed at accept: `max_connections` were being served.
    pub(crate) refused: AtomicU64,
    /// Requests answered 4xx: not GET, not /metrics, malformed, too large.
    pub(crate) not_found: AtomicU64,
    pub(crate) bad_method: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) oversized: AtomicU64,
    /// Clients closed because their request was not complete in time, or who did not take
    /// the answer in time.
    pub(crate) timeouts: AtomicU64,
    pub(crate) accept_errors: AtomicU64,
    /// Connections being served now.
    pub(crate) active: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What a scrape answers: the body and its content type, for the request's Accept header.
pub(crate) type Render = dyn Fn(Option<&str>) -> (String, &'static str) + Send + Sync;

/// Accepts connections on `listener` for ever (the daemon's exit ends the thread).
pub(crate) fn serve(
    listener: TcpListener,
    max: u32,
    counters: Arc<EndpointCounters>,
    render: Arc<Render>,
) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                bump(&counters.accept_errors);
                warn!("metrics endpoint: accept failed: {e}");
                // Out of descriptors, say: do not spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        // Taken here, released by the connection's thread: the cap holds however slow it is.
        if counters.active.fetch_add(1, Ordering::AcqRel) >= u64::from(max) {
            counters.active.fetch_sub(1, Ordering::AcqRel);
            bump(&counters.refused);
            debug!("metrics endpoint: {max} connections served already; closed one at accept");
            drop(stream);
            continue;
        }
        let (c, r) = (Arc::clone(&counters), Arc::clone(&render));
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                let mut stream = stream;
                handle(&mut stream, &c, &*r);
                // The slot is free before the client sees the end of the answer: a client
                // that reads to the end and connects again is never refused for itself.
                c.active.fetch_sub(1, Ordering::AcqRel);
                let _ = stream.shutdown(std::net::Shutdown::Both);
            });
        if let Err(e) = spawned {
            counters.active.fetch_sub(1, Ordering::AcqRel);
            bump(&counters.accept_errors);
            warn!("metrics endpoint: cannot start a thread for a client: {e}");
        }
    }
}

/// What the head of a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Asked {
    /// `GET /metrics` with this Accept header, if any.
    Metrics(Option<String>),
    NotFound,
    BadMethod,
    Malformed,
    /// The head is not complete yet.
    Partial,
}

/// Parses the request head in `buf` (complete or not).
pub(crate) fn parse(buf: &[u8]) -> Asked {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Asked::Partial,
        Err(_) => Asked::Malformed,
        Ok(httparse::Status::Complete(_)) => {
            if req.method != Some("GET") {
                return Asked::BadMethod;
            }
            let path = req.path.unwrap_or("");
            let path = path.split_once('?').map_or(path, |(p, _)| p);
            if path != "/metrics" {
                return Asked::NotFound;
            }
            let accept = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("accept"))
                .map(|h| String::from_utf8_lossy(h.value).into_owned());
            Asked::Metrics(accept)
        }
    }
}

/// Whether an Accept header asks for OpenMetrics.
pub(crate) fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

fn handle(s: &mut TcpStream, c: &EndpointCounters, render: &Render) {
    let start = Instant::now();
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let asked = loop {
        let left = REQUEST_TIMEOUT.saturating_sub(start.elapsed());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            bump(&c.timeouts);
            return;
        }
        match s.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                bump(&c.timeouts);
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        match parse(&buf) {
            Asked::Partial if buf.len() >= MAX_REQUEST => {
                bump(&c.oversized);
                let _ = reply(
                    s,
                    "431 Request Header Fields Too Large",
                    "text/plain",
                    b"request too large\n",
                );
                return;
            }
            Asked::Partial => continue,
            a => break a,
        }
    };
    let _ = s.set_write_timeout(Some(REQUEST_TIMEOUT));
    let r = match asked {
        Asked::Metrics(accept) => {
            let (body, ctype) = render(accept.as_deref());
            bump(&c.served);
            reply(s, "200 OK", ctype, body.as_bytes())
        }
        Asked::NotFound => {
            bump(&c.not_found);
            reply(
                s,
                "404 Not Found",
                "text/plain",
                b"only /metrics is served here\n",
            )
        }
        Asked::BadMethod => {
            bump(&c.bad_method);
            reply(s, "405 Method Not Allowed", "text/plain", b"only GET\n")
        }
        Asked::Malformed | Asked::Partial => {
            bump(&c.malformed);
            reply(s, "400 Bad Request", "text/plain", b"bad request\n")
        }
    };
    if r.is_err() {
        bump(&c.timeouts);
    }
}

fn reply(s: &mut TcpStream, status: &str, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let allow = if status.starts_with("405") {
        "Allow: GET\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    // The caller closes (what the client still sends, the rest of an oversized head, is not
    // read).
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_of_metrics_is_asked_for() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n"),
            Asked::Metrics(Some("application/openmetrics-text; version=1.0.0".into()))
        );
        assert_eq!(
            parse(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Asked::Metrics(None)
        );
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(parse(b"GET /metricsx HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(parse(b"POST /metrics HTTP/1.1\r\n\r\n"), Asked::BadMethod);
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHost"), Asked::Partial);
        assert_eq!(parse(b"\x00\x01 nonsense\r\n\r\n"), Asked::Malformed);
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}
