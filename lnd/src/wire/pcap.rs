//! A classic libpcap writer that frames o2iblnd messages as RoCEv2 packets, so that Wireshark's
//! LNet dissector decodes them.
//!
//! # Why
//!
//! o2iblnd traffic never passes through the kernel's network stack: the HCA moves it straight
//! between registered memory and the wire, so `tcpdump` on the host sees nothing, and our own
//! userspace (kernel-bypass) fabrics are just as invisible. Wireshark, however, has had an LNet
//! dissector for years, reachable as a heuristic on InfiniBand payloads. This writer records each
//! message we send or receive as the RoCEv2 frame a sniffer on an Ethernet RDMA fabric would have
//! seen, so a capture we write opens in Wireshark/tshark with every o2iblnd header, LNet header,
//! connparam, cookie and RDMA fragment decoded. It is the seed of `lnetctl capture`. socklnd
//! traffic, which is plain TCP, has its own writer next to this one ([`super::pcap_tcp`]).
//!
//! # Framing
//!
//! Each message becomes one frame (linktype 1, Ethernet):
//!
//! | layer    | bytes | content                                                                |
//! |----------|-------|------------------------------------------------------------------------|
//! | Ethernet | 14    | made-up, locally administered MACs `02:00:<IPv4>`; ethertype 0x0800     |
//! | IPv4     | 20    | DF, TTL 64, protocol 17 (UDP), correct header checksum                 |
//! | UDP      | 8     | source port derived from the source QPN, destination 4791 (RoCEv2), checksum 0 |
//! | IB BTH   | 12    | opcode 0x04 (RC SEND Only), P_Key 0xffff, destination QP, PSN          |
//! | message  | n     | the o2iblnd message bytes, exactly `ibm_nob` of them                   |
//! | ICRC     | 4     | the RoCEv2 invariant CRC, computed as a real HCA does                  |
//!
//! Unlike a real HCA we do not pad the payload to a multiple of four bytes (the BTH pad count
//! stays 0): Wireshark 4.0 hands pad bytes to the LNet dissector as part of the message, which then
//! reports a length mismatch. The ICRC is computed over the unpadded frame, so it stays
//! self-consistent.
//!
//! The writer never allocates: headers are built on the stack, and the message bytes go straight
//! to the underlying writer, unchecked (a capture may record garbage a peer sent). Wrap files in a
//! [`std::io::BufWriter`]: each frame is three `write_all` calls.
//!
//! Time is passed in by the caller as nanoseconds since the Unix epoch (the core never reads a
//! clock); classic pcap stores microseconds, so the last three digits are dropped.
//!
//! # Reading the captures
//!
//! `wireshark FILE` or `tshark -r FILE -V` decode the frames with their default settings (checked
//! against Debian's tshark 4.0 by `tests/tests/tshark_decodes.rs`, which also lists where that
//! dissector misreads o2iblnd: swapped PID labels, stamps shown as dates, byte-swapped ACK
//! cookies, and a GET_REQ cookie and RDMA descriptor read 4 bytes early). Two limits of
//! Wireshark, not of the capture:
//!
//! - Only little-endian messages are recognised; big-endian ones show as plain RoCE data.
//! - The RPC-over-RDMA heuristic runs before the LNet one and reads bytes 12..16 (`ibm_cksum`,
//!   usually zero) as its message type; on rare byte patterns it then claims the frame and
//!   reports it malformed. Disabling the `rpcrdma_infiniband` heuristic avoids it
//!   (`tshark --disable-heuristic rpcrdma_infiniband`, or Analyze > Enabled Protocols).

use std::io::{self, Write};

use super::kib::{EmitOpts, KibMsg, MSG_SIZE};
use super::Nid;

/// The classic pcap magic for microsecond timestamps.
pub const PCAP_MAGIC: u32 = 0xa1b2_c3d4;
/// The largest frame a capture records whole (and the largest we write).
pub const SNAPLEN: u32 = 65535;
/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// The IANA UDP port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// The BTH opcode of an RC SEND Only, which is how every o2iblnd message travels.
pub const BTH_OPCODE_RC_SEND_ONLY: u8 = 0x04;
/// Bytes in the global header.
pub const GLOBAL_HEADER_LEN: usize = 24;
/// Bytes in each record header.
pub const RECORD_HEADER_LEN: usize = 16;

const ETH_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const UDP_LEN: usize = 8;
const BTH_LEN: usize = 12;
const ICRC_LEN: usize = 4;
const HEADERS_LEN: usize = ETH_LEN + IPV4_LEN + UDP_LEN + BTH_LEN;

/// Bytes each frame adds around a message.
pub const FRAME_OVERHEAD: usize = HEADERS_LEN + ICRC_LEN;
/// The longest message one frame can carry (the frame must fit [`SNAPLEN`]). Real o2iblnd
/// messages are at most 4096 bytes.
pub const MAX_MSG_LEN: usize = SNAPLEN as usize - FRAME_OVERHEAD;

const PSN_MASK: u32 = 0x00ff_ffff;
const QPN_MASK: u32 = 0x00ff_ffff;

/// One side of a frame: the IPv4 address the frame carries and the queue pair number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The IPv4 address, in network order (`[10, 0, 0, 1]` is 10.0.0.1).
    pub ipv4: [u8; 4],
    /// The queue pair number (24 bits; higher bits are ignored). The destination's goes into the
    /// BTH; the source's picks the UDP source port, as RoCE NICs spread flows.
    pub qpn: u32,
}

impl Endpoint {
    /// An endpoint with the address of an IP-addressed NID (`10.0.0.1@o2ib` gives 10.0.0.1).
    /// Other NIDs give their 32-bit address read as an IPv4 address.
    pub const fn from_nid(nid: Nid, qpn: u32) -> Endpoint {
        Endpoint {
            ipv4: nid.addr().to_be_bytes(),
            qpn,
        }
    }

    fn udp_port(&self) -> u16 {
        // The dynamic range, 49152..=65535, keyed by the QPN.
        0xc000 | (self.qpn & 0x3fff) as u16
    }
}

/// The locally administered MAC both capture writers give an IPv4 address (02:00 and the four
/// address bytes), so that a frame's Ethernet ends name the same hosts as its IP ends.
pub(crate) fn ipv4_mac(ipv4: [u8; 4]) -> [u8; 6] {
    let [a, b, c, d] = ipv4;
    [0x02, 0x00, a, b, c, d]
}

/// Writes a classic (microsecond) libpcap file of o2iblnd messages framed as RoCEv2.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    next_psn: u32,
    frames: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header and returns the writer.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(&global_header())?;
        Ok(PcapWriter {
            out,
            next_psn: 0,
            frames: 0,
        })
    }

    /// Records the o2iblnd message `msg` (its wire bytes, exactly `ibm_nob` of them) sent from
    /// `src` to `dst` at `ts_nanos` (nanoseconds since the Unix epoch). The PSN is one more than
    /// the last frame's (0 for the first).
    ///
    /// Fails with [`io::ErrorKind::InvalidInput`], writing nothing, if the message is longer than
    /// [`MAX_MSG_LEN`] or the time is past what classic pcap can hold (year 2106).
    pub fn write_kib(
        &mut self,
        ts_nanos: u64,
        src: Endpoint,
        dst: Endpoint,
        msg: &[u8],
    ) -> io::Result<()> {
        let psn = self.next_psn;
        self.write_kib_with_psn(ts_nanos, src, dst, psn, msg)
    }

    /// As [`write_kib`](Self::write_kib), with the caller's packet sequence number (24 bits;
    /// higher bits are ignored).
    pub fn write_kib_with_psn(
        &mut self,
        ts_nanos: u64,
        src: Endpoint,
        dst: Endpoint,
        psn: u32,
        msg: &[u8],
    ) -> io::Result<()> {
        let secs = u32::try_from(ts_nanos / 1_000_000_000)
            .map_err(|_| invalid("timestamp is past what classic pcap can hold (2106)"))?;
        let usecs = ((ts_nanos % 1_000_000_000) / 1_000) as u32;
        if msg.len() > MAX_MSG_LEN {
            return Err(invalid("message is too long for one frame"));
        }
        let frame_len = (msg.len() + FRAME_OVERHEAD) as u32;

        let mut head = [0u8; RECORD_HEADER_LEN + HEADERS_LEN];
        let (record, headers) = head.split_at_mut(RECORD_HEADER_LEN);
        put(record, 0, &secs.to_le_bytes());
        put(record, 4, &usecs.to_le_bytes());
        put(record, 8, &frame_len.to_le_bytes());
        put(record, 12, &frame_len.to_le_bytes());
        build_headers(headers, src, dst, psn & PSN_MASK, msg.len());

        let mut crc = icrc_headers(headers);
        crc = crc32_update(crc, msg);
        let icrc = (!crc).to_le_bytes();

        self.out.write_all(&head)?;
        self.out.write_all(msg)?;
        self.out.write_all(&icrc)?;
        self.next_psn = (psn.wrapping_add(1)) & PSN_MASK;
        self.frames += 1;
        Ok(())
    }

    /// Emits `msg` with `opts` and records it, as [`write_kib`](Self::write_kib) does.
    /// Fails with [`io::ErrorKind::InvalidInput`] if the message cannot be emitted.
    pub fn write_msg(
        &mut self,
        ts_nanos: u64,
        src: Endpoint,
        dst: Endpoint,
        msg: &KibMsg<'_>,
        opts: EmitOpts,
    ) -> io::Result<()> {
        let mut buf = [0u8; MSG_SIZE];
        let n = msg
            .emit(&mut buf, opts)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.write_kib(ts_nanos, src, dst, buf.get(..n).unwrap_or_default())
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Appends frames another writer built for the same file (same global header: Ethernet,
    /// microseconds), as they are.
    pub fn write_frames(&mut self, frames: &[u8]) -> io::Result<()> {
        self.out.write_all(frames)
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Returns the underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.out
    }
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// The 24-byte global header, little-endian: magic, version 2.4, zone 0, sigfigs 0, snaplen,
/// linktype.
pub fn global_header() -> [u8; GLOBAL_HEADER_LEN] {
    let mut h = [0u8; GLOBAL_HEADER_LEN];
    put(&mut h, 0, &PCAP_MAGIC.to_le_bytes());
    put(&mut h, 4, &2u16.to_le_bytes());
    put(&mut h, 6, &4u16.to_le_bytes());
    // thiszone and sigfigs stay 0.
    put(&mut h, 16, &SNAPLEN.to_le_bytes());
    put(&mut h, 20, &LINKTYPE_ETHERNET.to_le_bytes());
    h
}

pub(crate) fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(s) = b.get_mut(at..at.saturating_add(v.len())) {
        s.copy_from_slice(v);
    }
}

/// Fills Ethernet, IPv4, UDP and BTH for a message of `msg_len` bytes (at most [`MAX_MSG_LEN`]).
fn build_headers(h: &mut [u8], src: Endpoint, dst: Endpoint, psn: u32, msg_len: usize) {
    // Ethernet.
    put(h, 0, &ipv4_mac(dst.ipv4));
    put(h, 6, &ipv4_mac(src.ipv4));
    put(h, 12, &0x0800u16.to_be_bytes());
    // IPv4.
    let ip = ETH_LEN;
    let ip_total = (IPV4_LEN + UDP_LEN + BTH_LEN + msg_len + ICRC_LEN) as u16;
    put(h, ip, &[0x45, 0x00]);
    put(h, ip + 2, &ip_total.to_be_bytes());
    put(h, ip + 4, &[0x00, 0x00, 0x40, 0x00]); // identification 0, DF
    put(h, ip + 8, &[64, 17]); // TTL, UDP
    put(h, ip + 12, &src.ipv4);
    put(h, ip + 16, &dst.ipv4);
    let sum = ipv4_checksum(h.get(ip..ip + IPV4_LEN).unwrap_or_default());
    put(h, ip + 10, &sum.to_be_bytes());
    // UDP.
    let udp = ip + IPV4_LEN;
    let udp_len = ip_total - IPV4_LEN as u16;
    put(h, udp, &src.udp_port().to_be_bytes());
    put(h, udp + 2, &ROCEV2_UDP_PORT.to_be_bytes());
    put(h, udp + 4, &udp_len.to_be_bytes());
    // Checksum 0: none, as RoCEv2 senders do.
    // BTH: opcode; SE 0, M 0, pad 0, TVer 0; P_Key; reserved; dest QP; AckReq 0; PSN.
    let bth = udp + UDP_LEN;
    put(h, bth, &[BTH_OPCODE_RC_SEND_ONLY, 0x00, 0xff, 0xff]);
    put(h, bth + 4, &(dst.qpn & QPN_MASK).to_be_bytes());
    put(h, bth + 8, &(psn & PSN_MASK).to_be_bytes());
}

/// The Internet checksum of an IPv4 header whose checksum field is zero.
pub(crate) fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in h.chunks(2) {
        let hi = u32::from(pair.first().copied().unwrap_or(0));
        let lo = u32::from(pair.get(1).copied().unwrap_or(0));
        sum += hi << 8 | lo;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The running (not yet inverted) ICRC over the masked headers (InfiniBand annex A17.3.3, as
/// Linux rxe_icrc_hdr computes it): eight 0xff bytes standing for the LRH, then IPv4 with TOS,
/// TTL and checksum set to ones, UDP with its checksum set to ones, and the BTH with its reserved
/// byte (FECN, BECN, resv6) set to ones.
fn icrc_headers(h: &[u8]) -> u32 {
    let mut masked = [0u8; IPV4_LEN + UDP_LEN + BTH_LEN];
    if let Some(s) = h.get(ETH_LEN..HEADERS_LEN) {
        masked.copy_from_slice(s);
    }
    masked[1] = 0xff; // TOS
    masked[8] = 0xff; // TTL
    masked[10] = 0xff; // header checksum
    masked[11] = 0xff;
    masked[IPV4_LEN + 6] = 0xff; // UDP checksum
    masked[IPV4_LEN + 7] = 0xff;
    masked[IPV4_LEN + UDP_LEN + 4] = 0xff; // BTH resv8a
    let crc = crc32_update(!0, &[0xff; 8]);
    crc32_update(crc, &masked)
}

/// The reflected CRC-32 (polynomial 0x04c11db7, as Ethernet and zlib), without the final
/// inversion.
pub(crate) fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
    for &byte in data {
        let idx = ((crc ^ u32::from(byte)) & 0xff) as usize;
        crc = (crc >> 8) ^ CRC_TABLE.get(idx).copied().unwrap_or(0);
    }
    crc
}

const CRC_TABLE: [u32; 256] = crc_table();

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::kib::VERSION_2;
    use crate::wire::{ConnParams, KibBody, LndType, Net};

    const A: Endpoint = Endpoint {
        ipv4: [10, 0, 0, 1],
        qpn: 0x11,
    };
    const B: Endpoint = Endpoint {
        ipv4: [10, 0, 0, 2],
        qpn: 0x22,
    };

    fn u16_be(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    fn u32_le(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    fn u32_be(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    fn one_frame(msg: &[u8]) -> Vec<u8> {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_kib_with_psn(1_700_000_000_123_456_789, A, B, 7, msg)
            .unwrap();
        w.into_inner()
    }

    #[test]
    fn global_header_bytes() {
        let w = PcapWriter::new(Vec::new()).unwrap();
        assert_eq!(
            w.into_inner(),
            [
                0xd4, 0xc3, 0xb2, 0xa1, // magic
                2, 0, 4, 0, // version 2.4
                0, 0, 0, 0, // thiszone
                0, 0, 0, 0, // sigfigs
                0xff, 0xff, 0, 0, // snaplen 65535
                1, 0, 0, 0, // Ethernet
            ]
        );
    }

    #[test]
    fn record_and_length_fields() {
        let msg: Vec<u8> = (0..125u8).collect();
        let file = one_frame(&msg);
        let rec = &file[GLOBAL_HEADER_LEN..];
        assert_eq!(u32_le(rec, 0), 1_700_000_000);
        assert_eq!(u32_le(rec, 4), 123_456);
        let frame_len = 125 + FRAME_OVERHEAD;
        assert_eq!(u32_le(rec, 8) as usize, frame_len);
        assert_eq!(u32_le(rec, 12) as usize, frame_len);
        let f = &rec[RECORD_HEADER_LEN..];
        assert_eq!(f.len(), frame_len);
        // Ethernet.
        assert_eq!(&f[0..6], &[2, 0, 10, 0, 0, 2]);
        assert_eq!(&f[6..12], &[2, 0, 10, 0, 0, 1]);
        assert_eq!(u16_be(f, 12), 0x0800);
        // IPv4.
        let ip = &f[14..34];
        assert_eq!(ip[0], 0x45);
        assert_eq!(u16_be(ip, 2) as usize, frame_len - 14);
        assert_eq!(ip[8], 64);
        assert_eq!(ip[9], 17);
        assert_eq!(&ip[12..16], &[10, 0, 0, 1]);
        assert_eq!(&ip[16..20], &[10, 0, 0, 2]);
        // UDP.
        let udp = &f[34..42];
        assert_eq!(u16_be(udp, 0), 0xc011);
        assert_eq!(u16_be(udp, 2), 4791);
        assert_eq!(u16_be(udp, 4) as usize, frame_len - 34);
        assert_eq!(u16_be(udp, 6), 0);
        // BTH.
        let bth = &f[42..54];
        assert_eq!(bth[0], 0x04);
        assert_eq!(bth[1], 0);
        assert_eq!(u16_be(bth, 2), 0xffff);
        assert_eq!(u32_be(bth, 4), 0x22);
        assert_eq!(u32_be(bth, 8), 7);
        // The message, untouched, then the ICRC.
        assert_eq!(&f[54..54 + 125], &msg[..]);
        assert_eq!(f.len() - 54 - 125, 4);
    }

    #[test]
    fn ipv4_checksum_is_correct() {
        for len in [0usize, 1, 48, 4096, MAX_MSG_LEN] {
            let file = one_frame(&vec![0xa5; len]);
            let ip = &file[GLOBAL_HEADER_LEN + RECORD_HEADER_LEN + 14..][..20];
            // Summing a header with its checksum gives all ones.
            let mut sum: u32 = ip
                .chunks(2)
                .map(|p| u32::from(u16::from_be_bytes([p[0], p[1]])))
                .sum();
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            assert_eq!(sum, 0xffff, "len {len}");
        }
        // RFC 1071's worked example header.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_checksum(&hdr), 0xb861);
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(!crc32_update(!0, b"123456789"), 0xcbf4_3926);
        // The seed rxe uses: eight 0xff bytes (the masked LRH) from an all-ones start.
        assert_eq!(crc32_update(!0, &[0xff; 8]), 0xdebb_20e3);
    }

    #[test]
    fn frame_matches_an_independent_encoder() {
        // The same frame built by scapy (Ether/IP/UDP/scapy.contrib.roce.BTH, whose ICRC follows
        // the IBTA annex as Linux rxe does): a NOOP header from 10.0.0.1 (QP 0x11) to 10.0.0.2
        // (QP 0x22), PSN 7.
        let mut msg = [0u8; 48];
        msg[..8].copy_from_slice(&[0x91, 0x1b, 0xe9, 0x0b, 0x12, 0x00, 0xd0, 0x03]);
        msg[8] = 48;
        let file = one_frame(&msg);
        let frame = &file[GLOBAL_HEADER_LEN + RECORD_HEADER_LEN..];
        let expect = concat!(
            "02000a000002",
            "02000a000001",
            "0800",
            "4500005c000040004011268f0a0000010a000002",
            "c01112b700480000",
            "0400ffff0000002200000007",
            "911be90b1200d00330000000",
            "000000000000000000000000",
            "000000000000000000000000",
            "000000000000000000000000",
            "eb5d7114",
        );
        let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, expect);
    }

    #[test]
    fn oversized_and_out_of_range_inputs_are_refused_without_writing() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let e = w.write_kib(0, A, B, &vec![0; MAX_MSG_LEN + 1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = w.write_kib(u64::MAX, A, B, &[0; 48]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(w.frames(), 0);
        assert_eq!(w.get_ref().len(), GLOBAL_HEADER_LEN);
        w.write_kib(0, A, B, &[]).unwrap();
        assert_eq!(w.frames(), 1);
    }

    #[test]
    fn psn_runs_and_wraps() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_kib_with_psn(0, A, B, 0x00ff_ffff, &[]).unwrap();
        w.write_kib(0, A, B, &[]).unwrap();
        let f = w.into_inner();
        let frame = RECORD_HEADER_LEN + FRAME_OVERHEAD;
        let psn = |i: usize| {
            u32_be(
                &f[GLOBAL_HEADER_LEN + i * frame + RECORD_HEADER_LEN + 42..],
                8,
            )
        };
        assert_eq!(psn(0), 0x00ff_ffff);
        assert_eq!(psn(1), 0);
    }

    #[test]
    fn write_msg_emits_then_frames() {
        let net = Net::new(LndType::O2ib, 0);
        let msg = KibMsg {
            version: VERSION_2,
            credits: 0,
            src_nid: Nid::new(net, 0x0a00_0001),
            src_stamp: 1,
            dst_nid: Nid::new(net, 0x0a00_0002),
            dst_stamp: 2,
            body: KibBody::ConnReq(ConnParams {
                queue_depth: 8,
                max_frags: 256,
                max_msg_size: 4096,
            }),
        };
        let src = Endpoint::from_nid(msg.src_nid, 1);
        assert_eq!(src.ipv4, [10, 0, 0, 1]);
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_msg(0, src, B, &msg, EmitOpts::default()).unwrap();
        let f = w.into_inner();
        let mut expect = [0u8; 56];
        assert_eq!(msg.emit(&mut expect, EmitOpts::default()).unwrap(), 56);
        let at = GLOBAL_HEADER_LEN + RECORD_HEADER_LEN + 54;
        assert_eq!(&f[at..at + 56], &expect);
        assert_eq!(f.len(), at + 56 + 4);
    }
}
