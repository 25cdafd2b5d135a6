//! `lnetctl capture`: the records that travel on the control socket, the daemon's side of a
//! capture ([`CaptureSession`]) and lnetctl's pcap writer ([`CaptureWriter`]).

use std::collections::HashMap;
use std::io::{self, Write};

use lnd::time::{Duration, Instant};
use lnd::wire::Nid;
use serde::{Deserialize, Serialize};

use crate::{LnetNode, NiIndex};

// `lnetctl capture` and where the file is written.
//
// The daemon streams the records to lnetctl, and lnetctl writes the pcap file; the daemon never
// opens a file for a capture. Why this way round, as an HPC admin would want it:
//
// - The daemon typically runs as root. Writing a path that arrives over a socket would let it
//   create or truncate files where the caller could not (and follow symlinks the caller planted);
//   written by lnetctl, the file belongs to the user who asked, with their permissions and umask,
//   relative paths mean their working directory, and `--file -` can feed `tshark -r -` directly.
// - The capture's life is the lnetctl command's: Ctrl-C, `--duration`, or lnetctl dying (its
//   connection closes) all end it, with nothing left running in the daemon.
// - The cost, a copy of each message through the control socket, is bounded: the engines hold at
//   most `lnd::engine`'s capture queue per NI, the stream at most [`CAPTURE_QUEUE`] chunks of
//   [`CAPTURE_CHUNK`] records; beyond that records are dropped and counted, never queued without
//   bound, so a slow disk or a stalled lnetctl cannot hurt the data path.
//
// One capture at a time: a second `capture_start` is refused with EBUSY while one runs.

/// Records per [`Response::CaptureData`](super::Response::CaptureData) chunk, at most.
pub const CAPTURE_CHUNK: usize = 256;
/// Chunks the daemon may have queued for the capturing connection before it drops (and counts)
/// further records.
pub const CAPTURE_QUEUE: usize = 64;
/// Records one event-loop turn may drain into the capture stream (bounds the loop's work).
pub const CAPTURE_TURN: usize = 4 * CAPTURE_CHUNK;

/// The answer to [`Request::CaptureStart`](super::Request::CaptureStart).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureStarted {
    /// Names this capture in [`Request::CaptureStop`](super::Request::CaptureStop).
    pub id: u64,
    /// The NIs whose messages are recorded.
    pub nis: Vec<String>,
}

/// One chunk of captured messages, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureData {
    pub records: Vec<CaptureRecord>,
}

/// One kib message as one of our NIs sent or received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRecord {
    /// Nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// `true`: our NI sent it to `peer`; `false`: our NI received it from `peer`.
    pub sent: bool,
    /// Our NI's NID.
    pub ni: String,
    /// The peer's NID.
    pub peer: String,
    /// The LND connection (`ConnId::as_u64`; 0 for a CONNREQ received before it had one).
    pub conn: u64,
    /// The whole kib message, hex; for a tcp NI (socklnd) the stream bytes, hex.
    pub msg: String,
    /// A tcp NI's record (socklnd): the connection's addresses and how many stream bytes
    /// followed `msg` unrecorded; `None` for an o2ib NI's kib message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpSegment>,
}

/// The TCP side of a socklnd capture record ([`CaptureRecord::tcp`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpSegment {
    /// Our end, `IP:PORT`.
    pub local: String,
    /// The peer's end, `IP:PORT`.
    pub remote: String,
    /// Stream bytes after `msg` that were not kept (a bulk payload beyond the first 4 KiB): the
    /// pcap writer fills them with zeros so the stream stays whole for the dissector.
    pub elided: u32,
}

/// The end of a capture.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSummary {
    /// Records the daemon streamed.
    pub captured: u64,
    /// Records lost: the engines' capture queues overflowed (`capture_drops`), or the stream to
    /// lnetctl was full.
    pub dropped: u64,
    /// Why it ended: `stopped`, `duration elapsed`, `daemon shutting down`.
    pub reason: String,
}

/// What happened to a chunk handed to the capture's connection.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Queued for the client.
    Queued,
    /// The stream is full: the chunk is dropped and counted.
    Full,
    /// The client is gone: end the capture.
    Gone,
}

/// A running capture on the daemon side: turns the engines' capture on, drains their records
/// into chunks, and turns it off again. The driver owns the stream to the client.
#[derive(Debug)]
pub struct CaptureSession {
    id: u64,
    start: Instant,
    start_unix_ns: u64,
    deadline: Option<Instant>,
    nis: Vec<Nid>,
    /// Per NI, the engine's `capture_drops` when the capture began.
    base_drops: Vec<u64>,
    captured: u64,
    lost: u64,
    /// The last delivery found the client's stream full: stop draining for this turn.
    client_full: bool,
}

impl CaptureSession {
    /// Starts capturing on every NI of `node`. `unix_ns` is the wall-clock time at `now`
    /// (records are stamped with it plus their monotonic offset from `now`).
    pub fn start(
        node: &mut LnetNode,
        id: u64,
        now: Instant,
        unix_ns: u64,
        duration: Option<Duration>,
    ) -> CaptureSession {
        let nis = node.nids();
        let mut base_drops = Vec::with_capacity(nis.len());
        for i in 0..nis.len() {
            let drops = node.endpoint(NiIndex(i)).map_or_else(
                || {
                    crate::sock::sock_engine(node, NiIndex(i))
                        .map_or(0, |e| e.stats().capture_drops)
                },
                |e| e.stats().capture_drops,
            );
            base_drops.push(drops);
            node.set_capture(NiIndex(i), true);
        }
        CaptureSession {
            id,
            start: now,
            start_unix_ns: unix_ns,
            deadline: duration.map(|d| now.saturating_add(d)),
            nis,
            base_drops,
            captured: 0,
            lost: 0,
            client_full: false,
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Wall-clock nanoseconds of a record taken at `at` (the start's, plus its offset).
    fn ts_ns(&self, at: Instant) -> u64 {
        self.start_unix_ns
            .saturating_add(at.saturating_duration_since(self.start).as_nanos())
    }

    /// The answer to the start request.
    pub fn started(&self) -> CaptureStarted {
        CaptureStarted {
            id: self.id,
            nis: self.nis.iter().map(Nid::to_string).collect(),
        }
    }

    /// True once the requested duration has passed.
    pub fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// Drains the NIs' captured messages into chunks of at most [`CAPTURE_CHUNK`], oldest
    /// first within each chunk, handing each to `deliver`. Returns `false` once `deliver` says
    /// the client is gone.
    ///
    /// Bounded so that capturing cannot stall the event loop: at most [`CAPTURE_TURN`] records
    /// per call, and none more once the stream to the client is full (what is not drained waits
    /// in the LND's own bounded queue, which drops and counts when it overflows).
    pub fn drain(
        &mut self,
        node: &mut LnetNode,
        mut deliver: impl FnMut(CaptureData) -> Delivery,
    ) -> bool {
        let mut chunk: Vec<(Instant, CaptureRecord)> = Vec::new();
        let mut budget = CAPTURE_TURN;
        self.client_full = false;
        for i in 0..self.nis.len() {
            let ni_s = self.nis[i].to_string();
            while budget > 0 && !self.client_full {
                let Some(c) = node.poll_captured(NiIndex(i)) else {
                    break;
                };
                budget -= 1;
                let ts_ns = self.ts_ns(c.at);
                let rec = CaptureRecord {
                    ts_ns,
                    sent: c.dir == lnd::engine::CaptureDir::Sent,
                    ni: ni_s.clone(),
                    peer: c.peer.to_string(),
                    conn: c.conn.as_u64(),
                    msg: hex_encode(&c.bytes),
                    tcp: None,
                };
                node.recycle(c.bytes);
                chunk.push((c.at, rec));
                if chunk.len() >= CAPTURE_CHUNK && !self.deliver(&mut chunk, &mut deliver) {
                    return false;
                }
            }
            while budget > 0 && !self.client_full {
                let Some(c) =
                    crate::sock::sock_engine_mut(node, NiIndex(i)).and_then(|e| e.poll_captured())
                else {
                    break;
                };
                budget -= 1;
                let ts_ns = self.ts_ns(c.at);
                let rec = CaptureRecord {
                    ts_ns,
                    sent: c.sent,
                    ni: ni_s.clone(),
                    peer: c
                        .peer
                        .map_or_else(|| "unknown".to_string(), |n| n.to_string()),
                    conn: 0,
                    msg: hex_encode(&c.bytes),
                    tcp: Some(TcpSegment {
                        local: c.local.to_string(),
                        remote: c.remote.to_string(),
                        elided: c.elided,
                    }),
                };
                chunk.push((c.at, rec));
                if chunk.len() >= CAPTURE_CHUNK && !self.deliver(&mut chunk, &mut deliver) {
                    return false;
                }
            }
        }
        chunk.is_empty() || self.deliver(&mut chunk, &mut deliver)
    }

    fn deliver(
        &mut self,
        chunk: &mut Vec<(Instant, CaptureRecord)>,
        deliver: &mut impl FnMut(CaptureData) -> Delivery,
    ) -> bool {
        chunk.sort_by_key(|(at, _)| *at);
        let n = chunk.len() as u64;
        let records = chunk.drain(..).map(|(_, r)| r).collect();
        match deliver(CaptureData { records }) {
            Delivery::Queued => {
                self.captured += n;
                true
            }
            Delivery::Full => {
                self.lost += n;
                self.client_full = true;
                true
            }
            Delivery::Gone => false,
        }
    }

    /// Turns capturing off on every NI (records not drained are dropped: drain first) and
    /// returns the summary.
    pub fn finish(self, node: &mut LnetNode, reason: &str) -> CaptureSummary {
        let mut dropped = self.lost;
        for (i, base) in self.base_drops.iter().enumerate() {
            if let Some(ep) = node.endpoint(NiIndex(i)) {
                dropped += ep.stats().capture_drops.saturating_sub(*base);
            } else if let Some(e) = crate::sock::sock_engine(node, NiIndex(i)) {
                dropped += e.stats().capture_drops.saturating_sub(*base);
            }
            node.set_capture(NiIndex(i), false);
        }
        CaptureSummary {
            captured: self.captured,
            dropped,
            reason: reason.to_string(),
        }
    }
}

/// Lower-case hex of `b`.
pub fn hex_encode(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(char::from(DIGITS[usize::from(x >> 4)]));
        s.push(char::from(DIGITS[usize::from(x & 15)]));
    }
    s
}

/// The bytes of hex `s` (either case); `None` if it is not hex.
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return None;
    }
    let nibble = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    b.chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// Writes captured records as a pcap file that Wireshark's LNet dissector decodes
/// ([`lnd::wire::pcap`]: each message framed as the RoCEv2 packet a sniffer would have seen).
///
/// Addresses: each side gets its NID's address (`10.0.0.1@o2ib` is 10.0.0.1; for nets whose
/// NIDs are not IPv4 addresses, the 32-bit NID address read as one). Queue pairs: messages on a
/// connection use a QP number derived from the connection's id, the same for both directions, so
/// a connection's traffic is one conversation; CONNREQ and CONNACK are framed the same way (a
/// real fabric carries them in connection-manager MADs on QP 1, which Wireshark would hand to
/// its MAD dissector instead of LNet's). PSNs count per connection and direction.
///
/// A tcp NI's records (socklnd: [`CaptureRecord::tcp`]) are TCP segments of their connection
/// between the two socket addresses (`lnd::wire::pcap_tcp`), in the same file, so Wireshark
/// decodes them on port 988; bytes a record elided are written as zeros, so the stream stays
/// whole and the dissector frames the messages after them.
pub struct CaptureWriter<W: Write> {
    pcap: lnd::wire::pcap::PcapWriter<W>,
    psn: HashMap<(u64, bool), u32>,
    tcp: lnd::wire::pcap_tcp::TcpPcapWriter<Vec<u8>>,
}

impl<W: Write> CaptureWriter<W> {
    /// Writes the pcap global header.
    pub fn new(out: W) -> io::Result<CaptureWriter<W>> {
        Ok(CaptureWriter {
            pcap: lnd::wire::pcap::PcapWriter::new(out)?,
            psn: HashMap::new(),
            tcp: lnd::wire::pcap_tcp::TcpPcapWriter::continuing(Vec::new()),
        })
    }

    /// Writes one record as one frame.
    pub fn write(&mut self, r: &CaptureRecord) -> io::Result<()> {
        use lnd::wire::pcap::Endpoint;
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let ni: Nid = r.ni.parse().map_err(|e| bad(format!("record NI: {e}")))?;
        let peer: Nid = r
            .peer
            .parse()
            .map_err(|e| bad(format!("record peer: {e}")))?;
        let msg = hex_decode(&r.msg).ok_or_else(|| bad("record message is not hex".into()))?;
        if let Some(t) = &r.tcp {
            return self.write_tcp(r, t, msg);
        }
        let qpn = conn_qpn(r.conn);
        let (src, dst) = if r.sent { (ni, peer) } else { (peer, ni) };
        let psn = self.psn.entry((r.conn, r.sent)).or_insert(0);
        let this = *psn;
        *psn = psn.wrapping_add(1);
        self.pcap.write_kib_with_psn(
            r.ts_ns,
            Endpoint::from_nid(src, qpn),
            Endpoint::from_nid(dst, qpn),
            this,
            &msg,
        )
    }

    /// A socklnd record: the stream bytes as TCP segments from one socket address to the other.
    fn write_tcp(
        &mut self,
        r: &CaptureRecord,
        t: &TcpSegment,
        mut bytes: Vec<u8>,
    ) -> io::Result<()> {
        use lnd::wire::pcap_tcp::TcpEndpoint;
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let end = |s: &str| -> io::Result<TcpEndpoint> {
            let a: std::net::SocketAddrV4 = s
                .parse()
                .map_err(|e| bad(format!("record address {s}: {e}")))?;
            Ok(TcpEndpoint {
                ipv4: a.ip().octets(),
                port: a.port(),
            })
        };
        let (local, remote) = (end(&t.local)?, end(&t.remote)?);
        let (src, dst) = if r.sent {
            (local, remote)
        } else {
            (remote, local)
        };
        // At most LNET_MTU of zeros a record (a payload is never larger).
        let elided = (t.elided as usize).min(lnd::wire::lnet::LNET_MTU as usize);
        bytes.resize(bytes.len() + elided, 0);
        self.tcp.write_data(r.ts_ns, src, dst, &bytes)?;
        let frames = std::mem::take(self.tcp.get_mut());
        self.pcap.write_frames(&frames)
    }

    /// Frames written.
    pub fn frames(&self) -> u64 {
        self.pcap.frames() + self.tcp.frames()
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.pcap.flush()
    }
}

/// A 24-bit QP number for a connection id, never 0 or 1 (reserved for SMI and GSI).
fn conn_qpn(conn: u64) -> u32 {
    let index = conn as u32;
    let generation = (conn >> 32) as u32;
    let q = (index.wrapping_add(generation.wrapping_mul(0x1000)) & 0x00ff_ffff) | 0x10_0000;
    q.max(2)
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{nid, node};
    use super::*;

    #[test]
    fn hex_round_trips() {
        let b: Vec<u8> = (0..=255).collect();
        let h = hex_encode(&b);
        assert_eq!(&h[..6], "000102");
        assert_eq!(hex_decode(&h).unwrap(), b);
        assert_eq!(hex_decode("0A0b").unwrap(), vec![10, 11]);
        assert!(hex_decode("abc").is_none());
        assert!(hex_decode("zz").is_none());
    }

    #[test]
    fn capture_session_streams_records_and_counts_losses() {
        let mut n = node();
        let t0 = Instant::from_secs(2);
        let unix = 1_700_000_000_000_000_000;
        let mut s = CaptureSession::start(&mut n, 1, t0, unix, Some(Duration::from_secs(5)));
        assert_eq!(s.started().nis, vec!["10.0.0.1@o2ib".to_string()]);
        assert!(n.endpoint(NiIndex(0)).unwrap().is_capturing());
        // A ping to a peer makes the LND connect: its CONNREQ is captured.
        let t1 = Instant::from_secs(3);
        n.ping(t1, nid("10.0.0.2@o2ib"), Duration::from_secs(5))
            .unwrap();
        let mut chunks = Vec::new();
        assert!(s.drain(&mut n, |c| {
            chunks.push(c);
            Delivery::Queued
        }));
        assert_eq!(chunks.len(), 1);
        let r = &chunks[0].records[0];
        assert!(r.sent);
        assert_eq!(r.ni, "10.0.0.1@o2ib");
        assert_eq!(r.peer, "10.0.0.2@o2ib");
        assert_eq!(r.ts_ns, unix + 1_000_000_000);
        let bytes = hex_decode(&r.msg).unwrap();
        let (msg, _) = lnd::wire::KibMsg::parse(&bytes).unwrap();
        assert!(matches!(msg.body, lnd::wire::KibBody::ConnReq(_)));

        // Written as one pcap frame around the message.
        let mut w = CaptureWriter::new(Vec::new()).unwrap();
        w.write(r).unwrap();
        assert_eq!(w.frames(), 1);
        let out = w.pcap.into_inner();
        assert_eq!(
            out.len(),
            lnd::wire::pcap::GLOBAL_HEADER_LEN
                + lnd::wire::pcap::RECORD_HEADER_LEN
                + lnd::wire::pcap::FRAME_OVERHEAD
                + bytes.len()
        );
        // IPv4 source and destination are the NIDs' addresses.
        let ip = lnd::wire::pcap::GLOBAL_HEADER_LEN + lnd::wire::pcap::RECORD_HEADER_LEN + 14;
        assert_eq!(&out[ip + 12..ip + 16], &[10, 0, 0, 1]);
        assert_eq!(&out[ip + 16..ip + 20], &[10, 0, 0, 2]);

        // A full stream loses the chunk (counted); a gone client ends the capture.
        n.ping(t1, nid("10.0.0.3@o2ib"), Duration::from_secs(5))
            .unwrap();
        assert!(s.drain(&mut n, |_| Delivery::Full));
        n.ping(t1, nid("10.0.0.4@o2ib"), Duration::from_secs(5))
            .unwrap();
        assert!(!s.drain(&mut n, |_| Delivery::Gone));
        assert!(!s.expired(Instant::from_secs(6)));
        assert!(s.expired(Instant::from_secs(7)));
        let sum = s.finish(&mut n, "stopped");
        assert_eq!(sum.captured, 1);
        assert_eq!(sum.dropped, 1);
        assert_eq!(sum.reason, "stopped");
        assert!(!n.endpoint(NiIndex(0)).unwrap().is_capturing());
    }
}
