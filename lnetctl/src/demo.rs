//! `lnetctl demo`: walks one LNet ping exchange through the real wire encoders and decoders and
//! prints every message as o2iblnd would put it on the wire, then the result in the shape
//! `lnetctl ping` prints.

use std::fmt::Write as _;

use lnd::wire::kib::EmitOpts;
use lnd::wire::lnet::{LNET_PID_LUSTRE, LNET_PING_MATCHBITS, LNET_RESERVED_PORTAL};
use lnd::wire::ping::{feat, status};
use lnd::wire::{
    ConnParams, KibBody, KibMsg, LnetBody, LnetHdr, NiStatus, Nid, PingInfo, WireError, WireHandle,
};

fn hexdump(out: &mut String, bytes: &[u8]) {
    for (i, line) in bytes.chunks(16).enumerate() {
        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        let _ = writeln!(out, "    {:04x}  {}", i * 16, hex.join(" "));
    }
}

/// Sends `msg` over an imaginary wire: encode, dump, decode, and check the round trip.
fn wire<'b>(
    out: &mut String,
    label: &str,
    msg: &KibMsg<'_>,
    buf: &'b mut [u8],
) -> Result<KibMsg<'b>, WireError> {
    let n = msg.emit(buf, EmitOpts::default())?;
    let _ = writeln!(
        out,
        "{label}: {:?} {} -> {}, {n} bytes",
        msg.msg_type(),
        msg.src_nid,
        msg.dst_nid
    );
    hexdump(out, &buf[..n]);
    let (back, _) = KibMsg::parse(&buf[..n])?;
    Ok(back)
}

/// The exchange, as the text to print.
pub fn demo(src: Nid, dst: Nid) -> Result<String, WireError> {
    let mut out = String::new();
    let out = &mut out;
    let (src_stamp, dst_stamp) = (0x0006_2a3b_0000_0001, 0x0006_2a3b_0000_0002);
    let cp = ConnParams {
        queue_depth: 8,
        max_frags: 257,
        max_msg_size: 4096,
    };
    let base = |from: Nid, to: Nid, from_stamp, to_stamp, body| {
        KibMsg::v2((from, from_stamp), (to, to_stamp), body)
    };
    let mut buf = vec![0u8; 4096];

    // Handshake: CONNREQ in the connection manager's private data, CONNACK back.
    wire(
        out,
        "1",
        &base(src, dst, src_stamp, 0, KibBody::ConnReq(cp)),
        &mut buf,
    )?;
    wire(
        out,
        "2",
        &base(dst, src, dst_stamp, src_stamp, KibBody::ConnAck(cp)),
        &mut buf,
    )?;

    // The ping: a GET on portal 0 with the ping match bits, sent IMMEDIATE.
    let get = LnetHdr {
        dest_nid: dst,
        src_nid: src,
        dest_pid: LNET_PID_LUSTRE,
        src_pid: LNET_PID_LUSTRE,
        payload_length: 0,
        body: LnetBody::Get {
            return_wmd: WireHandle {
                interface_cookie: 1,
                object_cookie: 42,
            },
            match_bits: LNET_PING_MATCHBITS,
            ptl_index: LNET_RESERVED_PORTAL,
            src_offset: 0,
            sink_length: 4096,
        },
    };
    let imm = |hdr, payload| KibBody::Immediate { hdr, payload };
    let got = wire(
        out,
        "3",
        &base(src, dst, src_stamp, dst_stamp, imm(get, &[])),
        &mut buf,
    )?;
    let KibBody::Immediate { hdr: got_get, .. } = got.body else {
        unreachable!("an IMMEDIATE decodes as an IMMEDIATE");
    };
    let LnetBody::Get { return_wmd, .. } = got_get.body else {
        unreachable!("a GET decodes as a GET");
    };

    // The reply: the ping payload, 0@lo first with the sequence number in its status.
    let nis = [
        NiStatus {
            nid: Nid::LO_0,
            status: 1,
            msg_size: 0,
        },
        NiStatus {
            nid: dst,
            status: status::UP,
            msg_size: 4096,
        },
    ];
    let info = PingInfo::new(
        feat::BASE | feat::NI_STATUS | feat::RTE_DISABLED,
        LNET_PID_LUSTRE,
        &nis,
    );
    let mut payload = vec![0u8; info.wire_len()];
    info.emit(&mut payload, Default::default())?;
    let reply = LnetHdr {
        dest_nid: src,
        src_nid: dst,
        dest_pid: LNET_PID_LUSTRE,
        src_pid: LNET_PID_LUSTRE,
        payload_length: payload.len() as u32,
        body: LnetBody::Reply {
            dst_wmd: return_wmd,
        },
    };
    let mut buf2 = vec![0u8; 4096];
    let got = wire(
        out,
        "4",
        &base(dst, src, dst_stamp, src_stamp, imm(reply, &payload)),
        &mut buf2,
    )?;
    let KibBody::Immediate { payload, .. } = got.body else {
        unreachable!("an IMMEDIATE decodes as an IMMEDIATE");
    };
    let (ping, _) = PingInfo::parse(payload)?;

    // What `lnetctl ping` prints: 0@lo is left out.
    let _ = writeln!(out, "ping:");
    let _ = writeln!(out, "    - primary nid: {dst}");
    let _ = writeln!(
        out,
        "      Multi-Rail: {}",
        ping.features & feat::MULTI_RAIL != 0
    );
    let _ = writeln!(out, "      peer_ni:");
    for ni in ping.nis.iter().filter(|ni| ni.nid != Nid::LO_0) {
        let _ = writeln!(out, "        - nid: {}", ni.nid);
    }
    Ok(std::mem::take(out))
}

/// `lnetctl demo SRC DST`: the walk-through printed, or why it failed.
pub(crate) fn run(src: &str, dst: &str) -> u8 {
    let (src, dst) = match (crate::check_nid(src), crate::check_nid(dst)) {
        (Ok(s), Ok(d)) => (s, d),
        (Err(c), _) | (_, Err(c)) => return c,
    };
    match demo(src, dst) {
        Ok(text) => {
            crate::emit(&text);
            crate::exit::OK
        }
        Err(e) => {
            eprintln!("lnetctl: demo failed: {e}");
            crate::exit::FAILED
        }
    }
}
