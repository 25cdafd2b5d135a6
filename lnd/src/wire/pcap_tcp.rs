//! A classic libpcap writer of TCP-over-IPv4 Ethernet frames, for socklnd traffic.
//!
//! # Why
//!
//! socklnd runs over ordinary TCP, so `tcpdump -i IF port 988` already sees a kernel's traffic.
//! Ours, though, may run where no capture is possible (in the simulator, in a network namespace
//! a test tears down, on a host where nobody has root), and what we record is what the engine
//! saw: the byte streams, not the segments. This writer turns those streams back into the frames
//! a sniffer on the wire would have seen, so that `lnetctl capture` can record socklnd
//! connections and Wireshark's LNet dissector (registered on TCP port 988) decodes them.
//!
//! # Framing
//!
//! Each piece of a stream becomes one or more frames (linktype 1, Ethernet):
//!
//! | layer    | bytes | content                                                              |
//! |----------|-------|----------------------------------------------------------------------|
//! | Ethernet | 14    | made-up, locally administered MACs `02:00:<IPv4>`; ethertype 0x0800   |
//! | IPv4     | 20    | DF, TTL 64, protocol 6, an identification that counts frames, correct header checksum |
//! | TCP      | 20    | the ports; sequence and acknowledgement numbers that advance per direction; ACK (and PSH on data), window 65535, correct checksum |
//! | data     | n     | the stream bytes, at most [`TcpPcapWriter::max_segment`] per frame    |
//!
//! A connection is identified by its two endpoints (address and port). The writer keeps, per
//! connection, the next sequence number of each direction: [`TcpPcapWriter::connect`] records
//! the three-way handshake and starts a connection at a fixed initial sequence number derived from
//! the endpoints; data on a connection never seen starts one without a handshake (Wireshark
//! copes: it shows the first segment's sequence number as relative 1). [`TcpPcapWriter::close`]
//! records a FIN and [`TcpPcapWriter::reset`] an RST; once both sides sent FIN, or after an RST,
//! the connection is forgotten (a later one between the same endpoints starts afresh).
//!
//! Payload bytes go straight to the underlying writer (a capture may record garbage a peer
//! sent); only the 70 bytes of headers per frame are built on the stack. Time is passed in as
//! nanoseconds since the Unix epoch, as for [`super::pcap::PcapWriter`].

use std::collections::HashMap;
use std::io::{self, Write};

use super::pcap::{self, global_header, RECORD_HEADER_LEN, SNAPLEN};
use super::Nid;

const ETH_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const TCP_LEN: usize = 20;
const HEADERS_LEN: usize = ETH_LEN + IPV4_LEN + TCP_LEN;

/// Bytes each frame adds in front of its data.
pub const TCP_FRAME_OVERHEAD: usize = HEADERS_LEN;
/// The most stream bytes one frame carries by default: what fits [`SNAPLEN`] (the IPv4 total
/// length, 16 bits, would allow 14 more).
pub const MAX_SEGMENT: usize = SNAPLEN as usize - HEADERS_LEN;

/// TCP flags.
pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
}

/// One end of a TCP connection.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TcpEndpoint {
    /// The IPv4 address, in network order (`[10, 0, 0, 1]` is 10.0.0.1).
    pub ipv4: [u8; 4],
    pub port: u16,
}

impl TcpEndpoint {
    /// The endpoint at the address of an IP-addressed NID (`10.0.0.1@tcp` gives 10.0.0.1).
    pub const fn from_nid(nid: Nid, port: u16) -> TcpEndpoint {
        TcpEndpoint {
            ipv4: nid.addr().to_be_bytes(),
            port,
        }
    }
}

/// The sequence state of one connection, keyed by its endpoints in order (`lo` < `hi`).
#[derive(Copy, Clone, Debug)]
struct Flow {
    /// Next sequence number from `lo` to `hi`, and from `hi` to `lo`.
    next: [u32; 2],
    /// Whether each direction has sent its FIN.
    fin: [bool; 2],
}

/// Writes a classic (microsecond) libpcap file of TCP connections as Ethernet frames.
#[derive(Debug)]
pub struct TcpPcapWriter<W: Write> {
    out: W,
    flows: HashMap<(TcpEndpoint, TcpEndpoint), Flow>,
    ip_id: u16,
    max_segment: usize,
    frames: u64,
}

impl<W: Write> TcpPcapWriter<W> {
    /// Writes the global header and returns the writer.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(&global_header())?;
        Ok(TcpPcapWriter::continuing(out))
    }

    /// A writer that writes no global header: its frames follow another writer's in one file
    /// (`lnetctl capture` puts o2ib NIs' RoCEv2 frames and tcp NIs' TCP frames in one pcap,
    /// both on Ethernet).
    pub fn continuing(out: W) -> Self {
        TcpPcapWriter {
            out,
            flows: HashMap::new(),
            ip_id: 0,
            max_segment: MAX_SEGMENT,
            frames: 0,
        }
    }

    /// The underlying writer, to take the frames written so far.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// Splits data into frames of at most `n` bytes (clamped to 1..=[`MAX_SEGMENT`]), as a link
    /// with that MSS would carry it. Wireshark reassembles socklnd messages across frames.
    pub fn with_max_segment(mut self, n: usize) -> Self {
        self.max_segment = n.clamp(1, MAX_SEGMENT);
        self
    }

    /// The most stream bytes one frame carries.
    pub fn max_segment(&self) -> usize {
        self.max_segment
    }

    /// Records a three-way handshake from `client` to `server` (SYN, SYN-ACK, ACK, all at
    /// `ts_nanos`), starting the connection afresh.
    pub fn connect(
        &mut self,
        ts_nanos: u64,
        client: TcpEndpoint,
        server: TcpEndpoint,
    ) -> io::Result<()> {
        check_ts(ts_nanos)?;
        let (key, dir) = key(client, server);
        let mut flow = Flow {
            next: [isn(key.0, key.1), isn(key.1, key.0)],
            fin: [false; 2],
        };
        let c = dir;
        let s = 1 - dir;
        self.frame(ts_nanos, client, server, flow.next[c], 0, flags::SYN, &[])?;
        flow.next[c] = flow.next[c].wrapping_add(1);
        self.frame(
            ts_nanos,
            server,
            client,
            flow.next[s],
            flow.next[c],
            flags::SYN | flags::ACK,
            &[],
        )?;
        flow.next[s] = flow.next[s].wrapping_add(1);
        self.frame(
            ts_nanos,
            client,
            server,
            flow.next[c],
            flow.next[s],
            flags::ACK,
            &[],
        )?;
        self.flows.insert(key, flow);
        Ok(())
    }

    /// Records `data` sent from `src` to `dst` at `ts_nanos`, in segments of at most
    /// [`max_segment`](Self::max_segment) bytes, each with PSH and ACK. Nothing is written for
    /// empty data.
    pub fn write_data(
        &mut self,
        ts_nanos: u64,
        src: TcpEndpoint,
        dst: TcpEndpoint,
        data: &[u8],
    ) -> io::Result<()> {
        check_ts(ts_nanos)?;
        for seg in data.chunks(self.max_segment) {
            let (k, d, seq) = self.segment(ts_nanos, src, dst, flags::PSH | flags::ACK, seg)?;
            if let Some(f) = self.flows.get_mut(&k) {
                f.next[d] = seq.wrapping_add(seg.len() as u32);
            }
        }
        Ok(())
    }

    /// Records a FIN from `src` (a graceful close of its direction). The connection is forgotten
    /// once both directions have closed.
    pub fn close(&mut self, ts_nanos: u64, src: TcpEndpoint, dst: TcpEndpoint) -> io::Result<()> {
        check_ts(ts_nanos)?;
        let (k, d, seq) = self.segment(ts_nanos, src, dst, flags::FIN | flags::ACK, &[])?;
        if let Some(f) = self.flows.get_mut(&k) {
            f.next[d] = seq.wrapping_add(1);
            f.fin[d] = true;
            if f.fin == [true; 2] {
                self.flows.remove(&k);
            }
        }
        Ok(())
    }

    /// Records an RST from `src` (an abortive close) and forgets the connection.
    pub fn reset(&mut self, ts_nanos: u64, src: TcpEndpoint, dst: TcpEndpoint) -> io::Result<()> {
        check_ts(ts_nanos)?;
        let (k, _, _) = self.segment(ts_nanos, src, dst, flags::RST | flags::ACK, &[])?;
        self.flows.remove(&k);
        Ok(())
    }

    /// Connections whose sequence numbers the writer holds.
    pub fn open_connections(&self) -> usize {
        self.flows.len()
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Returns the underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.out
    }

    /// The connection's key, `src`'s direction in it, and its state (a copy; started without a
    /// handshake if unknown).
    fn flow(
        &mut self,
        src: TcpEndpoint,
        dst: TcpEndpoint,
    ) -> ((TcpEndpoint, TcpEndpoint), usize, Flow) {
        let (k, d) = key(src, dst);
        let flow = *self.flows.entry(k).or_insert_with(|| Flow {
            next: [isn(k.0, k.1), isn(k.1, k.0)],
            fin: [false; 2],
        });
        (k, d, flow)
    }

    /// Writes one frame of `tcp_flags` and `data` from `src` at its direction's next sequence
    /// number, acking everything the other direction sent; returns the flow's key, `src`'s
    /// direction and the sequence number used, for the caller to advance or close the flow.
    fn segment(
        &mut self,
        ts_nanos: u64,
        src: TcpEndpoint,
        dst: TcpEndpoint,
        tcp_flags: u8,
        data: &[u8],
    ) -> io::Result<((TcpEndpoint, TcpEndpoint), usize, u32)> {
        let (k, d, flow) = self.flow(src, dst);
        let (seq, ack) = (flow.next[d], flow.next[1 - d]);
        self.frame(ts_nanos, src, dst, seq, ack, tcp_flags, data)?;
        Ok((k, d, seq))
    }

    /// Writes one frame (at most [`MAX_SEGMENT`] data bytes; the time is already checked).
    #[allow(clippy::too_many_arguments)]
    fn frame(
        &mut self,
        ts_nanos: u64,
        src: TcpEndpoint,
        dst: TcpEndpoint,
        seq: u32,
        ack: u32,
        tcp_flags: u8,
        data: &[u8],
    ) -> io::Result<()> {
        let secs = (ts_nanos / 1_000_000_000) as u32;
        let usecs = ((ts_nanos % 1_000_000_000) / 1_000) as u32;
        let frame_len = (HEADERS_LEN + data.len()) as u32;
        let mut head = [0u8; RECORD_HEADER_LEN + HEADERS_LEN];
        let (record, h) = head.split_at_mut(RECORD_HEADER_LEN);
        pcap::put(record, 0, &secs.to_le_bytes());
        pcap::put(record, 4, &usecs.to_le_bytes());
        pcap::put(record, 8, &frame_len.to_le_bytes());
        pcap::put(record, 12, &frame_len.to_le_bytes());

        // Ethernet.
        pcap::put(h, 0, &pcap::ipv4_mac(dst.ipv4));
        pcap::put(h, 6, &pcap::ipv4_mac(src.ipv4));
        pcap::put(h, 12, &0x0800u16.to_be_bytes());
        // IPv4.
        let ip = ETH_LEN;
        let ip_total = (IPV4_LEN + TCP_LEN + data.len()) as u16;
        pcap::put(h, ip, &[0x45, 0x00]);
        pcap::put(h, ip + 2, &ip_total.to_be_bytes());
        pcap::put(h, ip + 4, &self.ip_id.to_be_bytes());
        pcap::put(h, ip + 6, &[0x40, 0x00]); // DF
        pcap::put(h, ip + 8, &[64, 6]); // TTL, TCP
        pcap::put(h, ip + 12, &src.ipv4);
        pcap::put(h, ip + 16, &dst.ipv4);
        let sum = pcap::ipv4_checksum(h.get(ip..ip + IPV4_LEN).unwrap_or_default());
        pcap::put(h, ip + 10, &sum.to_be_bytes());
        // TCP: data offset 5 words, no options.
        let t = ip + IPV4_LEN;
        pcap::put(h, t, &src.port.to_be_bytes());
        pcap::put(h, t + 2, &dst.port.to_be_bytes());
        pcap::put(h, t + 4, &seq.to_be_bytes());
        pcap::put(h, t + 8, &ack.to_be_bytes());
        pcap::put(h, t + 12, &[(TCP_LEN as u8 / 4) << 4, tcp_flags]);
        pcap::put(h, t + 14, &0xffffu16.to_be_bytes());
        let sum = tcp_checksum(
            src.ipv4,
            dst.ipv4,
            h.get(t..t + TCP_LEN).unwrap_or_default(),
            data,
        );
        pcap::put(h, t + 16, &sum.to_be_bytes());

        self.out.write_all(&head)?;
        self.out.write_all(data)?;
        self.ip_id = self.ip_id.wrapping_add(1);
        self.frames += 1;
        Ok(())
    }
}

fn check_ts(ts_nanos: u64) -> io::Result<()> {
    if ts_nanos / 1_000_000_000 > u64::from(u32::MAX) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "timestamp is past what classic pcap can hold (2106)",
        ));
    }
    Ok(())
}

/// The connection key (endpoints in order) and the index of `src`'s direction.
fn key(src: TcpEndpoint, dst: TcpEndpoint) -> ((TcpEndpoint, TcpEndpoint), usize) {
    if src <= dst {
        ((src, dst), 0)
    } else {
        ((dst, src), 1)
    }
}

/// A made-up but stable initial sequence number for the direction `from` -> `to` (FNV-1a over
/// both endpoints), so that captures are reproducible and directions differ.
fn isn(from: TcpEndpoint, to: TcpEndpoint) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in from
        .ipv4
        .iter()
        .chain(&from.port.to_be_bytes())
        .chain(&to.ipv4)
        .chain(&to.port.to_be_bytes())
    {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    h
}

/// The TCP checksum: the Internet checksum over the IPv4 pseudo-header, the TCP header (with its
/// checksum field zero) and the data.
fn tcp_checksum(src: [u8; 4], dst: [u8; 4], tcp: &[u8], data: &[u8]) -> u16 {
    let len = (tcp.len() + data.len()) as u32;
    let mut sum: u64 = 0;
    let mut add = |b: &[u8]| {
        for pair in b.chunks(2) {
            let hi = u64::from(pair.first().copied().unwrap_or(0));
            let lo = u64::from(pair.get(1).copied().unwrap_or(0));
            sum += hi << 8 | lo;
        }
    };
    add(&src);
    add(&dst);
    add(&[0, 6]);
    add(&(len as u16).to_be_bytes());
    add(tcp);
    // The TCP header is 20 bytes, so the data starts on a 16-bit boundary.
    add(data);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::pcap::GLOBAL_HEADER_LEN;

    const A: TcpEndpoint = TcpEndpoint {
        ipv4: [192, 168, 1, 2],
        port: 1023,
    };
    const B: TcpEndpoint = TcpEndpoint {
        ipv4: [192, 168, 1, 1],
        port: 988,
    };

    /// One parsed frame: its TCP fields and data.
    #[derive(Debug)]
    struct Seg {
        src: TcpEndpoint,
        dst: TcpEndpoint,
        seq: u32,
        ack: u32,
        flags: u8,
        data: Vec<u8>,
    }

    fn be16(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    fn be32(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    fn ones_sum(b: &[u8]) -> u32 {
        let mut s: u32 = b
            .chunks(2)
            .map(|p| u32::from(p[0]) << 8 | u32::from(*p.get(1).unwrap_or(&0)))
            .sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s
    }

    /// Reads every frame back, checking lengths and both checksums on the way.
    fn segments(file: &[u8]) -> Vec<Seg> {
        assert_eq!(&file[..GLOBAL_HEADER_LEN], &global_header());
        let mut out = Vec::new();
        let mut at = GLOBAL_HEADER_LEN;
        while at < file.len() {
            let rec = &file[at..];
            let caplen = u32::from_le_bytes(rec[8..12].try_into().unwrap()) as usize;
            let origlen = u32::from_le_bytes(rec[12..16].try_into().unwrap()) as usize;
            assert_eq!(caplen, origlen);
            let f = &rec[RECORD_HEADER_LEN..RECORD_HEADER_LEN + caplen];
            assert_eq!(be16(f, 12), 0x0800);
            let ip = &f[14..34];
            assert_eq!(ip[0], 0x45);
            assert_eq!(ip[9], 6);
            assert_eq!(be16(ip, 2) as usize, caplen - 14, "IPv4 total length");
            assert_eq!(ones_sum(ip), 0xffff, "IPv4 header checksum");
            let tcp_seg = &f[34..];
            let mut pseudo = Vec::new();
            pseudo.extend_from_slice(&ip[12..20]);
            pseudo.extend_from_slice(&[0, 6]);
            pseudo.extend_from_slice(&(tcp_seg.len() as u16).to_be_bytes());
            pseudo.extend_from_slice(tcp_seg);
            assert_eq!(ones_sum(&pseudo), 0xffff, "TCP checksum");
            assert_eq!(tcp_seg[12] >> 4, 5);
            out.push(Seg {
                src: TcpEndpoint {
                    ipv4: ip[12..16].try_into().unwrap(),
                    port: be16(tcp_seg, 0),
                },
                dst: TcpEndpoint {
                    ipv4: ip[16..20].try_into().unwrap(),
                    port: be16(tcp_seg, 2),
                },
                seq: be32(tcp_seg, 4),
                ack: be32(tcp_seg, 8),
                flags: tcp_seg[13],
                data: tcp_seg[20..].to_vec(),
            });
            at += RECORD_HEADER_LEN + caplen;
        }
        out
    }

    #[test]
    fn handshake_data_and_close_advance_each_direction() {
        let mut w = TcpPcapWriter::new(Vec::new()).unwrap();
        w.connect(1, A, B).unwrap();
        w.write_data(2, A, B, &[1; 16]).unwrap();
        w.write_data(3, A, B, &[2; 56]).unwrap();
        w.write_data(4, B, A, &[3; 56]).unwrap();
        w.write_data(5, A, B, &[]).unwrap();
        w.close(6, A, B).unwrap();
        assert_eq!(w.open_connections(), 1);
        w.close(7, B, A).unwrap();
        assert_eq!(w.open_connections(), 0);
        assert_eq!(w.frames(), 8);
        let s = segments(&w.into_inner());
        assert_eq!(s.len(), 8);
        let (ia, ib) = (s[0].seq, s[1].seq);
        use flags::*;
        let want = [
            (A, B, ia, 0, SYN, 0),
            (B, A, ib, ia + 1, SYN | ACK, 0),
            (A, B, ia + 1, ib + 1, ACK, 0),
            (A, B, ia + 1, ib + 1, PSH | ACK, 16),
            (A, B, ia + 17, ib + 1, PSH | ACK, 56),
            (B, A, ib + 1, ia + 73, PSH | ACK, 56),
            (A, B, ia + 73, ib + 57, FIN | ACK, 0),
            (B, A, ib + 57, ia + 74, FIN | ACK, 0),
        ];
        for (i, (seg, w)) in s.iter().zip(want).enumerate() {
            assert_eq!(
                (
                    seg.src,
                    seg.dst,
                    seg.seq,
                    seg.ack,
                    seg.flags,
                    seg.data.len()
                ),
                w,
                "frame {i}"
            );
        }
        assert_ne!(ia, ib, "each direction has its own sequence space");
        assert_eq!(s[3].data, [1; 16]);
    }

    #[test]
    fn long_data_is_split_and_sequence_numbers_wrap() {
        let mut w = TcpPcapWriter::new(Vec::new())
            .unwrap()
            .with_max_segment(1000);
        assert_eq!(w.max_segment(), 1000);
        let data: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        // No handshake: the connection starts at its made-up initial sequence numbers.
        w.write_data(0, A, B, &data).unwrap();
        let s = segments(&w.into_inner());
        assert_eq!(
            s.iter().map(|x| x.data.len()).collect::<Vec<_>>(),
            [1000, 1000, 500]
        );
        assert_eq!(s[1].seq, s[0].seq.wrapping_add(1000));
        assert_eq!(s[2].seq, s[0].seq.wrapping_add(2000));
        let joined: Vec<u8> = s.iter().flat_map(|x| x.data.clone()).collect();
        assert_eq!(joined, data);

        let mut w = TcpPcapWriter::new(Vec::new()).unwrap();
        let k = key(A, B).0;
        w.flows.insert(
            k,
            Flow {
                next: [u32::MAX - 1, 5],
                fin: [false; 2],
            },
        );
        w.write_data(0, B, A, &[0; 4]).unwrap();
        w.write_data(0, B, A, &[0; 4]).unwrap();
        let s = segments(&w.into_inner());
        assert_eq!(s[0].seq, u32::MAX - 1);
        assert_eq!(s[1].seq, 2);
        assert_eq!(
            TcpPcapWriter::new(Vec::new())
                .unwrap()
                .with_max_segment(0)
                .max_segment(),
            1
        );
    }

    #[test]
    fn connections_are_separate_and_reset_forgets() {
        let c = TcpEndpoint { port: 1022, ..A };
        let mut w = TcpPcapWriter::new(Vec::new()).unwrap();
        w.connect(0, A, B).unwrap();
        w.connect(0, c, B).unwrap();
        w.write_data(0, A, B, &[0; 10]).unwrap();
        w.write_data(0, c, B, &[0; 3]).unwrap();
        assert_eq!(w.open_connections(), 2);
        w.reset(0, B, c).unwrap();
        assert_eq!(w.open_connections(), 1);
        let s = segments(&w.into_inner());
        assert_eq!(s.len(), 9);
        assert_eq!(s[6].seq, s[0].seq + 1);
        assert_eq!(s[7].seq, s[3].seq + 1);
        assert_eq!(s[8].flags, flags::RST | flags::ACK);
        assert_eq!(s[8].seq, s[4].seq + 1);
        assert_eq!(s[8].ack, s[3].seq + 4);
    }

    #[test]
    fn largest_segment_fills_the_snaplen_and_bad_times_write_nothing() {
        let mut w = TcpPcapWriter::new(Vec::new()).unwrap();
        w.write_data(0, A, B, &vec![7; MAX_SEGMENT + 1]).unwrap();
        let file = w.into_inner();
        let s = segments(&file);
        assert_eq!(s[0].data.len(), MAX_SEGMENT);
        assert_eq!(s[1].data.len(), 1);
        let rec = &file[GLOBAL_HEADER_LEN..];
        assert_eq!(u32::from_le_bytes(rec[8..12].try_into().unwrap()), SNAPLEN);

        let mut w = TcpPcapWriter::new(Vec::new()).unwrap();
        let e = w.write_data(u64::MAX, A, B, &[1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(w.connect(u64::MAX, A, B).is_err());
        assert_eq!(w.frames(), 0);
        assert_eq!(w.get_ref().len(), GLOBAL_HEADER_LEN);
    }

    #[test]
    fn tcp_checksum_matches_a_known_segment() {
        // Frame 4 of socklnd-vectors.py's capture (the acceptor request, 192.168.1.2:1023 ->
        // 192.168.1.1:988, seq 1001, ack 5001, PSH|ACK, window 65535), checksum from the script.
        let mut tcp = [0u8; 20];
        tcp[0..2].copy_from_slice(&1023u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&988u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&1001u32.to_be_bytes());
        tcp[8..12].copy_from_slice(&5001u32.to_be_bytes());
        tcp[12] = 0x50;
        tcp[13] = flags::PSH | flags::ACK;
        tcp[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
        let data = [
            0x00, 0x71, 0xce, 0xac, 0x01, 0x00, 0x00, 0x00, 0x01, 0x01, 0xa8, 0xc0, 0x00, 0x00,
            0x02, 0x00,
        ];
        assert_eq!(
            tcp_checksum([192, 168, 1, 2], [192, 168, 1, 1], &tcp, &data),
            TCP_CSUM_OF_FRAME_4
        );
    }

    /// Read from the script's pcap (bytes 50..52 of frame 4).
    const TCP_CSUM_OF_FRAME_4: u16 = 0x913c;
}
