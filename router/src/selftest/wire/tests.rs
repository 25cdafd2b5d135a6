use super::*;
use lnd::wire::Nid;
use proptest::prelude::*;

const LE: ByteOrder = ByteOrder::Little;
const BE: ByteOrder = ByteOrder::Big;

/// Copies `bytes` to absolute offset `off` of the expected message.
fn at(e: &mut [u8], off: usize, bytes: &[u8]) {
    e[off..off + bytes.len()].copy_from_slice(bytes);
}

/// Header of a little-endian message of type `t` with features `f` (offsets 0..24).
fn le_header(t: u32, f: u32) -> Vec<u8> {
    let mut e = vec![0u8; SRPC_MSG_LEN];
    at(&mut e, 0, &0xeeb0_f00du32.to_le_bytes()); // msg_magic
    at(&mut e, 4, &1u32.to_le_bytes()); // msg_version
    at(&mut e, 8, &t.to_le_bytes()); // msg_type
                                     // 12: msg_reserved0 = 0, 16: msg_reserved1 = 0
    at(&mut e, 20, &f.to_le_bytes()); // msg_ses_feats
    e
}

fn emit_msg(m: &SrpcMsg, order: ByteOrder) -> Vec<u8> {
    let mut b = vec![0xa5u8; SRPC_MSG_LEN];
    assert_eq!(m.emit(&mut b, order), Ok(SRPC_MSG_LEN));
    b
}

fn sid() -> LstSid {
    LstSid {
        nid: Nid::from_raw(0x0005_0000_c0a8_0101), // 192.168.1.1@o2ib
        stamp: 1_700_000_000_123,
    }
}

#[test]
fn sizes_match_lustre() {
    assert_eq!(SRPC_MSG_LEN, 160);
    assert_eq!(SRPC_BODY_LEN, StatReply::LEN);
    for t in MsgType::ALL {
        assert_eq!(MsgType::from_u32(t as u32), Some(t));
        assert!(t.service().request_type() as u32 / 2 == t as u32 / 2);
        assert_eq!(t.is_reply(), t.reply() == t);
    }
    assert_eq!(MsgType::from_u32(18), None);
    assert_eq!(ids_per_page(4096), 341);
    assert_eq!(SFW_MAX_NDESTS_4K, 256 * 341);
    assert_eq!(BRW_MAX_PAGES_4K, 256);
    assert_eq!(ServiceId::Brw.portal(), 50);
    assert_eq!(ServiceId::Join.portal(), 51);
    assert_eq!(ServiceId::Ping.reply_type(), MsgType::PingReply);
    assert_eq!(TestType::Bulk.service(), ServiceId::Brw);
    assert_eq!(ServiceId::from_u32(10), None);
}

/// The PING request of the known-answer tests.
fn ping_request() -> PingRequest {
    PingRequest {
        rpyid: 0x0102_0304_0506_0708,
        magic: LST_PING_TEST_MAGIC,
        seq: 7,
        time_sec: 0x11,
        time_nsec: 0x22,
    }
}

#[test]
fn kat_ping_request_le_literal() {
    let m = ping_request();
    let mut e = vec![0u8; SRPC_MSG_LEN];
    at(&mut e, 0, &[0x0d, 0xf0, 0xb0, 0xee]); // msg_magic 0xeeb0f00d, LE
    at(&mut e, 4, &[1, 0, 0, 0]); // msg_version 1
    at(&mut e, 8, &[14, 0, 0, 0]); // msg_type SRPC_MSG_PING_REQST
    at(&mut e, 20, &[1, 0, 0, 0]); // msg_ses_feats LST_FEAT_BULK_LEN
    at(&mut e, 24, &[8, 7, 6, 5, 4, 3, 2, 1]); // 24+0: pnr_rpyid
    at(&mut e, 32, &[0xce, 0xfa, 0xbe, 0xba]); // 24+8: pnr_magic 0xbabeface
    at(&mut e, 36, &[7, 0, 0, 0]); // 24+12: pnr_seq
    at(&mut e, 40, &[0x11, 0, 0, 0, 0, 0, 0, 0]); // 24+16: pnr_time_sec
    at(&mut e, 48, &[0x22, 0, 0, 0, 0, 0, 0, 0]); // 24+24: pnr_time_nsec
    let mut b = [0xffu8; 200];
    assert_eq!(m.emit(&mut b, LE), Ok(160));
    assert_eq!(&b[..160], &e[..]);
    assert_eq!(b[160], 0xff, "nothing written past the message");
    assert_eq!(PingRequest::parse(&e), Ok((m, LE)));
}

#[test]
fn kat_ping_request_be() {
    let m = ping_request();
    let mut e = vec![0u8; SRPC_MSG_LEN];
    at(&mut e, 0, &[0xee, 0xb0, 0xf0, 0x0d]); // msg_magic, BE
    at(&mut e, 4, &[0, 0, 0, 1]); // msg_version
    at(&mut e, 8, &[0, 0, 0, 14]); // msg_type
    at(&mut e, 20, &[0, 0, 0, 1]); // msg_ses_feats
    at(&mut e, 24, &[1, 2, 3, 4, 5, 6, 7, 8]); // pnr_rpyid
    at(&mut e, 32, &[0xba, 0xbe, 0xfa, 0xce]); // pnr_magic
    at(&mut e, 36, &[0, 0, 0, 7]); // pnr_seq
    at(&mut e, 40, &[0, 0, 0, 0, 0, 0, 0, 0x11]); // pnr_time_sec
    at(&mut e, 48, &[0, 0, 0, 0, 0, 0, 0, 0x22]); // pnr_time_nsec
    assert_eq!(emit_msg(&SrpcMsg::new(m.into()), BE), e);
    assert_eq!(PingRequest::parse(&e), Ok((m, BE)));
}

#[test]
fn kat_ping_reply() {
    let m = PingReply {
        status: 71, // EPROTO
        magic: LST_PING_TEST_MAGIC,
        seq: 0x0a0b_0c0d,
    };
    let mut e = le_header(15, 1); // SRPC_MSG_PING_REPLY
    at(&mut e, 24, &71u32.to_le_bytes()); // 24+0: pnr_status
    at(&mut e, 28, &0xbabe_faceu32.to_le_bytes()); // 24+4: pnr_magic
    at(&mut e, 32, &[0x0d, 0x0c, 0x0b, 0x0a]); // 24+8: pnr_seq
    let mut b = [0u8; 160];
    m.emit(&mut b, LE).unwrap();
    assert_eq!(&b[..], &e[..]);
    assert_eq!(PingReply::parse(&e), Ok((m, LE)));
}

#[test]
fn kat_brw_request_and_reply() {
    let m = BrwRequest {
        rpyid: 0x1111_2222_3333_4444,
        bulkid: 0x5555_6666_7777_8888,
        rw: BrwOp::Write as u32,
        len: 1 << 20,
        flags: BrwCheck::Full as u32,
    };
    let mut e = le_header(12, 1); // SRPC_MSG_BRW_REQST
    at(&mut e, 24, &0x1111_2222_3333_4444u64.to_le_bytes()); // 24+0: brw_rpyid
    at(&mut e, 32, &0x5555_6666_7777_8888u64.to_le_bytes()); // 24+8: brw_bulkid
    at(&mut e, 40, &2u32.to_le_bytes()); // 24+16: brw_rw LST_BRW_WRITE
    at(&mut e, 44, &[0, 0, 0x10, 0]); // 24+20: brw_len 1 MiB
    at(&mut e, 48, &3u32.to_le_bytes()); // 24+24: brw_flags LST_BRW_CHECK_FULL
    assert_eq!(emit_msg(&SrpcMsg::new(m.into()), LE), e);
    let (p, o) = BrwRequest::parse(&e).unwrap();
    assert_eq!((p, o), (m, LE));
    assert_eq!(p.op(), Some(BrwOp::Write));
    assert_eq!(p.check(), Some(BrwCheck::Full));

    let r = BrwReply { status: 74 }; // EBADMSG
    let mut e = le_header(13, 1); // SRPC_MSG_BRW_REPLY
    at(&mut e, 24, &74u32.to_le_bytes()); // 24+0: brw_status
    assert_eq!(emit_msg(&SrpcMsg::new(r.into()), LE), e);
    assert_eq!(BrwReply::parse(&e), Ok((r, LE)));
    // The same reply big-endian: only the magic tells the order.
    let mut e = vec![0u8; 160];
    at(&mut e, 0, &0xeeb0_f00du32.to_be_bytes());
    at(&mut e, 4, &1u32.to_be_bytes());
    at(&mut e, 8, &13u32.to_be_bytes());
    at(&mut e, 20, &1u32.to_be_bytes());
    at(&mut e, 24, &74u32.to_be_bytes());
    assert_eq!(emit_msg(&SrpcMsg::new(r.into()), BE), e);
    assert_eq!(BrwReply::parse(&e), Ok((r, BE)));
}

#[test]
fn kat_make_session_request() {
    let m = MakeSessionRequest {
        rpyid: 42,
        sid: sid(),
        force: 1,
        name: LstName::new("read_test").unwrap(),
    };
    let mut e = le_header(0, 1); // SRPC_MSG_MKSN_REQST
    at(&mut e, 24, &42u64.to_le_bytes()); // 24+0: mksn_rpyid
    at(&mut e, 32, &0x0005_0000_c0a8_0101u64.to_le_bytes()); // 24+8: mksn_sid.ses_nid
    at(&mut e, 40, &1_700_000_000_123i64.to_le_bytes()); // 24+16: mksn_sid.ses_stamp
    at(&mut e, 48, &1u32.to_le_bytes()); // 24+24: mksn_force
    at(&mut e, 52, b"read_test"); // 24+28: mksn_name[32], NUL-padded
    assert_eq!(emit_msg(&SrpcMsg::new(m.into()), LE), e);
    let (p, _) = MakeSessionRequest::parse(&e).unwrap();
    assert_eq!(p, m);
    assert_eq!(p.name.to_string_lossy(), "read_test");
}

#[test]
fn kat_test_request_brw_v1() {
    let m = TestRequest {
        rpyid: 0x10,
        bulkid: 0x20,
        sid: sid(),
        bid: LstBid(0x30),
        loop_count: 100_000,
        concur: 8,
        is_client: true,
        stop_onerr: false,
        ndest: 2,
        params: TestParams::BulkV1 {
            opc: BrwOp::Read as u16,
            flags: BrwCheck::Simple as u16,
            len: 4096,
            offset: 8,
        },
    };
    let mut e = le_header(8, 1); // SRPC_MSG_TEST_REQST, LST_FEAT_BULK_LEN
    at(&mut e, 24, &0x10u64.to_le_bytes()); // 24+0: tsr_rpyid
    at(&mut e, 32, &0x20u64.to_le_bytes()); // 24+8: tsr_bulkid
    at(&mut e, 40, &0x0005_0000_c0a8_0101u64.to_le_bytes()); // 24+16: tsr_sid.ses_nid
    at(&mut e, 48, &1_700_000_000_123i64.to_le_bytes()); // 24+24: tsr_sid.ses_stamp
    at(&mut e, 56, &0x30u64.to_le_bytes()); // 24+32: tsr_bid
    at(&mut e, 64, &11u32.to_le_bytes()); // 24+40: tsr_service SRPC_SERVICE_BRW
    at(&mut e, 68, &100_000u32.to_le_bytes()); // 24+44: tsr_loop
    at(&mut e, 72, &8u32.to_le_bytes()); // 24+48: tsr_concur
    at(&mut e, 76, &[1]); // 24+52: tsr_is_client
    at(&mut e, 77, &[0]); // 24+53: tsr_stop_onerr
    at(&mut e, 78, &2u32.to_le_bytes()); // 24+54: tsr_ndest (unaligned: packed)
    at(&mut e, 82, &1u16.to_le_bytes()); // 24+58: blk_opc LST_BRW_READ (u16)
    at(&mut e, 84, &2u16.to_le_bytes()); // 24+60: blk_flags LST_BRW_CHECK_SIMPLE (u16)
    at(&mut e, 86, &4096u32.to_le_bytes()); // 24+62: blk_len
    at(&mut e, 90, &8u32.to_le_bytes()); // 24+66: blk_offset
    assert_eq!(emit_msg(&SrpcMsg::new(m.into()), LE), e);
    assert_eq!(TestRequest::parse(&e), Ok((m, LE)));

    // The same union bytes in a session without the feature read as v0.
    at(&mut e, 20, &0u32.to_le_bytes());
    let (v0, _) = TestRequest::parse(&e).unwrap();
    assert_eq!(
        v0.params,
        TestParams::BulkV0 {
            opc: 0x0002_0001,
            npg: 4096,
            flags: 8
        }
    );
    // And emitting v1 parameters without the feature is refused.
    let bad = SrpcMsg {
        features: 0,
        body: m.into(),
    };
    assert_eq!(
        bad.emit(&mut [0u8; 160], LE),
        Err(SelftestWireError::BulkLayoutMismatch { features: 0 })
    );
}

#[test]
fn kat_stat_reply() {
    let m = StatReply {
        status: 0,
        sid: sid(),
        fw: SfwCounters {
            running_ms: 1,
            active_batches: 2,
            zombie_sessions: 3,
            brw_errors: 4,
            ping_errors: 5,
        },
        rpc: SrpcCounters {
            errors: 6,
            rpcs_sent: 7,
            rpcs_rcvd: 8,
            rpcs_dropped: 9,
            rpcs_expired: 10,
            bulk_get: 11,
            bulk_put: 12,
        },
        lnet: LnetCounters {
            msgs_alloc: 13,
            msgs_max: 14,
            errors: 15,
            send_count: 16,
            recv_count: 17,
            route_count: 18,
            drop_count: 19,
            send_length: 20,
            recv_length: 21,
            route_length: 22,
            drop_length: 0x0102_0304_0506_0708,
        },
    };
    let mut e = le_header(7, 1); // SRPC_MSG_STAT_REPLY
                                 // 24+0: str_status = 0
    at(&mut e, 28, &0x0005_0000_c0a8_0101u64.to_le_bytes()); // 24+4: str_sid.ses_nid
    at(&mut e, 36, &1_700_000_000_123i64.to_le_bytes()); // 24+12: str_sid.ses_stamp
                                                         // 24+20: str_fw, five u32: running_ms .. ping_errors = 1..=5
    for (i, v) in (1u32..=5).enumerate() {
        at(&mut e, 44 + 4 * i, &v.to_le_bytes());
    }
    // 24+40: str_rpc, five u32 (errors .. rpcs_expired = 6..=10) then two u64
    for (i, v) in (6u32..=10).enumerate() {
        at(&mut e, 64 + 4 * i, &v.to_le_bytes());
    }
    at(&mut e, 84, &11u64.to_le_bytes()); // 24+60: bulk_get
    at(&mut e, 92, &12u64.to_le_bytes()); // 24+68: bulk_put
                                          // 24+76: str_lnet, seven u32 (msgs_alloc .. drop_count = 13..=19) then four u64
    for (i, v) in (13u32..=19).enumerate() {
        at(&mut e, 100 + 4 * i, &v.to_le_bytes());
    }
    at(&mut e, 128, &20u64.to_le_bytes()); // 24+104: send_length
    at(&mut e, 136, &21u64.to_le_bytes()); // 24+112: recv_length
    at(&mut e, 144, &22u64.to_le_bytes()); // 24+120: route_length
    at(&mut e, 152, &0x0102_0304_0506_0708u64.to_le_bytes()); // 24+128: drop_length, ends at 160
    assert_eq!(emit_msg(&SrpcMsg::new(m.into()), LE), e);
    assert_eq!(StatReply::parse(&e), Ok((m, LE)));
}

#[test]
fn typed_errors() {
    let mut b = [0u8; 160];
    PingReply {
        status: 0,
        magic: LST_PING_TEST_MAGIC,
        seq: 1,
    }
    .emit(&mut b, LE)
    .unwrap();
    assert_eq!(
        PingRequest::parse(&b),
        Err(SelftestWireError::WrongMsgType {
            expected: MsgType::PingRequest,
            got: MsgType::PingReply
        })
    );
    assert_eq!(
        SrpcMsg::parse(&b[..159]),
        Err(SelftestWireError::Truncated {
            needed: 160,
            got: 159
        })
    );
    let mut v = b;
    v[4] = 2;
    assert_eq!(SrpcMsg::parse(&v), Err(SelftestWireError::BadVersion(2)));
    // The header alone still parses, so a server can answer EPROTO to rpyid.
    assert_eq!(SrpcHeader::parse(&v).map(|(h, _)| h.version), Ok(2));
    let mut v = b;
    v[8] = 18;
    assert_eq!(
        SrpcMsg::parse(&v),
        Err(SelftestWireError::UnknownMsgType(18))
    );
    let mut v = b;
    v[0] = 0;
    assert!(matches!(
        SrpcMsg::parse(&v),
        Err(SelftestWireError::BadMagic(_))
    ));
    assert_eq!(
        b.as_slice().len(),
        BrwReply { status: 0 }.emit(&mut [0u8; 200], BE).unwrap()
    );
    assert_eq!(
        BrwReply { status: 0 }.emit(&mut [0u8; 159], LE),
        Err(SelftestWireError::BufferTooSmall {
            needed: 160,
            got: 159
        })
    );
    let other = TestRequest {
        rpyid: 0,
        bulkid: 0,
        sid: LstSid::NONE,
        bid: LstBid(0),
        loop_count: 1,
        concur: 1,
        is_client: false,
        stop_onerr: false,
        ndest: 0,
        params: TestParams::Other {
            service: 12,
            raw: [0; 12],
        },
    };
    assert_eq!(
        other.emit(&mut [0u8; 160], LE),
        Err(SelftestWireError::BadTestService(12))
    );
    assert_eq!(LstName::new(&"x".repeat(32)), None);
    assert!(LstName::new(&"x".repeat(31)).is_some());
}

#[test]
fn dest_ids_page_layout() {
    let ids: Vec<ProcessId> = (0..400u32)
        .map(|i| ProcessId {
            nid: Nid::from_raw(0x0005_0000_0a00_0000 | u64::from(i)),
            pid: 12345,
        })
        .collect();
    let mut bulk = vec![0u8; 2 * 4096];
    let end = emit_dest_ids(&ids, 4096, &mut bulk, LE).unwrap();
    assert_eq!(end, 4096 + 59 * 12);
    // Entry 340 is the last of page 1 (bytes 4080..4092), entry 341 opens page 2.
    assert_eq!(
        &bulk[4080..4088],
        &(0x0005_0000_0a00_0000u64 | 340).to_le_bytes()
    );
    assert_eq!(&bulk[4092..4096], &[0, 0, 0, 0]);
    assert_eq!(
        &bulk[4096..4104],
        &(0x0005_0000_0a00_0000u64 | 341).to_le_bytes()
    );
    assert_eq!(parse_dest_ids(&bulk, 400, 4096, LE).unwrap(), ids);
    assert_eq!(dest_ids_len(400, 4096, 0), 8192);
    assert_eq!(dest_ids_len(400, 4096, LST_FEAT_BULK_LEN), 4800);
    assert!(matches!(
        parse_dest_ids(&bulk[..4800], 400, 4096, LE),
        Err(SelftestWireError::Truncated { .. })
    ));
    let mut be = vec![0u8; 24];
    emit_dest_ids(&ids[..2], 4096, &mut be, BE).unwrap();
    assert_eq!(&be[8..12], &12345u32.to_be_bytes());
    assert_eq!(parse_dest_ids(&be, 2, 4096, BE).unwrap(), &ids[..2]);
}

#[test]
fn full_pattern_catches_any_flipped_byte() {
    // 3 segments: 4088 bytes at offset 8, one whole page, 1000 bytes.
    let len = 4088 + 4096 + 1000;
    let mut buf = vec![0u8; len];
    for order in [LE, BE] {
        fill_pattern(&mut buf, 8, 4096, BrwCheck::Full, BRW_MAGIC, order).unwrap();
        assert_eq!(
            check_pattern(&buf, 8, 4096, BrwCheck::Full, BRW_MAGIC, order),
            Ok(())
        );
        for i in [0, 1, 7, 4087, 4088, 5000, len - 1] {
            let mut bad = buf.clone();
            bad[i] ^= 0x10;
            assert!(
                matches!(
                    check_pattern(&bad, 8, 4096, BrwCheck::Full, BRW_MAGIC, order),
                    Err(SelftestWireError::BadBulkData { at, .. }) if at == i / 8 * 8
                ),
                "byte {i} flipped"
            );
        }
    }
    // Filled in one order, checked in the other: every word is wrong.
    fill_pattern(&mut buf, 8, 4096, BrwCheck::Full, BRW_MAGIC, LE).unwrap();
    assert!(check_pattern(&buf, 8, 4096, BrwCheck::Full, BRW_MAGIC, BE).is_err());
    assert_eq!(
        &buf[..8],
        &[0xb3, 0xee, 0xb2, 0xee, 0xb1, 0xee, 0xb0, 0xee][..]
    );
    assert_eq!(&buf[..8], &BRW_MAGIC.to_le_bytes());
}

#[test]
fn simple_pattern_checks_first_and_last_word_of_each_page() {
    let len = 4096 + 4096 + 8; // two full pages and a one-word page
    let mut buf = vec![0u8; len];
    fill_pattern(&mut buf, 0, 4096, BrwCheck::Simple, BRW_MAGIC, LE).unwrap();
    let words: Vec<usize> = (0..len / 8)
        .filter(|w| buf[w * 8..w * 8 + 8] != [0; 8])
        .map(|w| w * 8)
        .collect();
    assert_eq!(words, vec![0, 4088, 4096, 8184, 8192]);
    assert_eq!(
        check_pattern(&buf, 0, 4096, BrwCheck::Simple, BRW_MAGIC, LE),
        Ok(())
    );
    for w in &words {
        let mut bad = buf.clone();
        bad[w + 3] ^= 1;
        assert!(matches!(
            check_pattern(&bad, 0, 4096, BrwCheck::Simple, BRW_MAGIC, LE),
            Err(SelftestWireError::BadBulkData { at, .. }) if at == *w
        ));
    }
    // A flip in the middle of a page is not seen by simple, but is by full.
    let mut mid = buf.clone();
    mid[2000] ^= 1;
    assert_eq!(
        check_pattern(&mid, 0, 4096, BrwCheck::Simple, BRW_MAGIC, LE),
        Ok(())
    );
    // None and Discard never look.
    assert_eq!(
        check_pattern(&mid, 0, 4096, BrwCheck::None, BRW_MAGIC, LE),
        Ok(())
    );
    assert_eq!(
        check_pattern(&mid, 0, 4096, BrwCheck::Discard, BRW_MAGIC, LE),
        Ok(())
    );
    // Misalignment is refused, as brw_fill_page asserts.
    assert!(matches!(
        fill_pattern(&mut buf[..12], 0, 4096, BrwCheck::Full, BRW_MAGIC, LE),
        Err(SelftestWireError::Misaligned { .. })
    ));
    assert!(matches!(
        check_pattern(&buf, 4, 4096, BrwCheck::Full, BRW_MAGIC, LE),
        Err(SelftestWireError::Misaligned { .. })
    ));
    assert_eq!(brw_page_count(8, 4096, 4096), 2);
    assert_eq!(brw_page_count(0, 1 << 20, 4096), 256);
}

// ----- property tests -----

fn arb_sid() -> impl Strategy<Value = LstSid> {
    (any::<u64>(), any::<i64>()).prop_map(|(n, stamp)| LstSid {
        nid: Nid::from_raw(n),
        stamp,
    })
}

fn arb_name() -> impl Strategy<Value = LstName> {
    any::<[u8; 32]>().prop_map(LstName)
}

fn arb_params() -> impl Strategy<Value = TestParams> {
    prop_oneof![
        (any::<u32>(), any::<u32>()).prop_map(|(size, flags)| TestParams::Ping { size, flags }),
        (any::<u32>(), any::<u32>(), any::<u32>())
            .prop_map(|(opc, npg, flags)| TestParams::BulkV0 { opc, npg, flags }),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(
            |(opc, flags, len, offset)| TestParams::BulkV1 {
                opc,
                flags,
                len,
                offset
            }
        ),
        (any::<u32>(), any::<[u8; 12]>())
            .prop_filter("typed services", |(s, _)| *s != 11 && *s != 12)
            .prop_map(|(service, raw)| TestParams::Other { service, raw }),
    ]
}

fn arb_framework_body() -> impl Strategy<Value = SrpcBody> {
    prop_oneof![
        (any::<u64>(), arb_sid(), any::<u32>(), arb_name()).prop_map(
            |(rpyid, sid, force, name)| {
                SrpcBody::from(MakeSessionRequest {
                    rpyid,
                    sid,
                    force,
                    name,
                })
            }
        ),
        (any::<u32>(), arb_sid(), any::<u32>(), arb_name()).prop_map(
            |(status, sid, timeout, name)| SrpcBody::from(MakeSessionReply {
                status,
                sid,
                timeout,
                name
            })
        ),
        (any::<u64>(), arb_sid())
            .prop_map(|(rpyid, sid)| SrpcBody::from(RemoveSessionRequest { rpyid, sid })),
        (any::<u32>(), arb_sid())
            .prop_map(|(status, sid)| SrpcBody::from(RemoveSessionReply { status, sid })),
        (any::<u64>(), arb_sid(), any::<u64>(), any::<[u32; 3]>()).prop_map(
            |(rpyid, sid, bid, [opc, testidx, arg])| SrpcBody::from(BatchRequest {
                rpyid,
                sid,
                bid: LstBid(bid),
                opc,
                testidx,
                arg
            })
        ),
        (any::<u32>(), arb_sid(), any::<u32>(), any::<u32>()).prop_map(
            |(status, sid, active, time)| SrpcBody::from(BatchReply {
                status,
                sid,
                active,
                time
            })
        ),
        (any::<u64>(), arb_sid(), any::<u32>()).prop_map(|(rpyid, sid, stat_type)| {
            SrpcBody::from(StatRequest {
                rpyid,
                sid,
                stat_type,
            })
        }),
        (
            any::<u32>(),
            arb_sid(),
            any::<[u32; 10]>(),
            any::<[u32; 7]>(),
            any::<[u64; 6]>()
        )
            .prop_map(|(status, sid, a, l, w)| SrpcBody::from(StatReply {
                status,
                sid,
                fw: SfwCounters {
                    running_ms: a[0],
                    active_batches: a[1],
                    zombie_sessions: a[2],
                    brw_errors: a[3],
                    ping_errors: a[4],
                },
                rpc: SrpcCounters {
                    errors: a[5],
                    rpcs_sent: a[6],
                    rpcs_rcvd: a[7],
                    rpcs_dropped: a[8],
                    rpcs_expired: a[9],
                    bulk_get: w[0],
                    bulk_put: w[1],
                },
                lnet: LnetCounters {
                    msgs_alloc: l[0],
                    msgs_max: l[1],
                    errors: l[2],
                    send_count: l[3],
                    recv_count: l[4],
                    route_count: l[5],
                    drop_count: l[6],
                    send_length: w[2],
                    recv_length: w[3],
                    route_length: w[4],
                    drop_length: w[5],
                },
            })),
        (
            any::<[u64; 3]>(),
            arb_sid(),
            any::<[u32; 3]>(),
            any::<(bool, bool)>(),
            arb_params()
        )
            .prop_map(
                |([rpyid, bulkid, bid], sid, [loop_count, concur, ndest], (c, s), params)| {
                    SrpcBody::from(TestRequest {
                        rpyid,
                        bulkid,
                        sid,
                        bid: LstBid(bid),
                        loop_count,
                        concur,
                        is_client: c,
                        stop_onerr: s,
                        ndest,
                        params,
                    })
                }
            ),
    ]
}

fn arb_other_body() -> impl Strategy<Value = SrpcBody> {
    prop_oneof![
        (any::<u32>(), arb_sid())
            .prop_map(|(status, sid)| SrpcBody::from(TestReply { status, sid })),
        (any::<u64>(), arb_sid(), any::<u32>())
            .prop_map(|(rpyid, sid, flags)| SrpcBody::from(DebugRequest { rpyid, sid, flags })),
        (
            any::<u32>(),
            arb_sid(),
            any::<u32>(),
            any::<u32>(),
            arb_name()
        )
            .prop_map(
                |(status, sid, timeout, nbatch, name)| SrpcBody::from(DebugReply {
                    status,
                    sid,
                    timeout,
                    nbatch,
                    name
                })
            ),
        (any::<[u64; 2]>(), any::<[u32; 3]>()).prop_map(|([rpyid, bulkid], [rw, len, flags])| {
            SrpcBody::from(BrwRequest {
                rpyid,
                bulkid,
                rw,
                len,
                flags,
            })
        }),
        any::<u32>().prop_map(|status| SrpcBody::from(BrwReply { status })),
        (any::<u64>(), any::<[u32; 2]>(), any::<[u64; 2]>()).prop_map(
            |(rpyid, [magic, seq], [time_sec, time_nsec])| SrpcBody::from(PingRequest {
                rpyid,
                magic,
                seq,
                time_sec,
                time_nsec
            })
        ),
        any::<[u32; 3]>().prop_map(|[status, magic, seq]| SrpcBody::from(PingReply {
            status,
            magic,
            seq
        })),
        (any::<u64>(), arb_sid(), arb_name())
            .prop_map(|(rpyid, sid, group)| SrpcBody::from(JoinRequest { rpyid, sid, group })),
        (any::<u32>(), arb_sid(), any::<u32>(), arb_name()).prop_map(
            |(status, sid, timeout, session)| SrpcBody::from(JoinReply {
                status,
                sid,
                timeout,
                session
            })
        ),
    ]
}

fn arb_msg() -> impl Strategy<Value = SrpcMsg> {
    (
        prop_oneof![arb_framework_body(), arb_other_body()],
        any::<u32>(),
    )
        .prop_map(|(body, feats)| {
            // The BULK_LEN bit must agree with a brw test request's layout.
            let features = match body {
                SrpcBody::TestRequest(TestRequest {
                    params: TestParams::BulkV0 { .. },
                    ..
                }) => feats & !LST_FEAT_BULK_LEN,
                SrpcBody::TestRequest(TestRequest {
                    params: TestParams::BulkV1 { .. },
                    ..
                }) => feats | LST_FEAT_BULK_LEN,
                _ => feats,
            };
            SrpcMsg { features, body }
        })
}

fn arb_order() -> impl Strategy<Value = ByteOrder> {
    prop_oneof![Just(LE), Just(BE)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn round_trip_every_message(m in arb_msg(), order in arb_order()) {
        let b = emit_msg(&m, order);
        prop_assert_eq!(SrpcMsg::parse(&b), Ok((m, order)));
        // Bytes past the body's end are zero.
        let used = SRPC_HDR_LEN + m.body.len();
        prop_assert!(b[used..].iter().all(|&x| x == 0));
        // The other order gives the same message with every multi-byte field swapped.
        let other = match order { LE => BE, BE => LE };
        let b2 = emit_msg(&m, other);
        prop_assert_eq!(SrpcMsg::parse(&b2), Ok((m, other)));
        let (h, o) = SrpcHeader::parse(&b).unwrap();
        prop_assert_eq!(o, order);
        prop_assert_eq!(h.msg_type, m.msg_type() as u32);
        prop_assert_eq!(h.features, m.features);
    }

    #[test]
    fn every_prefix_is_truncated(m in arb_msg(), order in arb_order(), cut in 0usize..160) {
        let b = emit_msg(&m, order);
        prop_assert_eq!(
            SrpcMsg::parse(&b[..cut]),
            Err(SelftestWireError::Truncated { needed: 160, got: cut })
        );
    }

    #[test]
    fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = SrpcMsg::parse(&b);
        let _ = SrpcHeader::parse(&b);
        let _ = TestRequest::parse(&b);
        let _ = parse_dest_ids(&b, b.len() / 7, 64, LE);
    }

    #[test]
    fn garbage_with_valid_header_parses_or_errs(
        mut b in proptest::collection::vec(any::<u8>(), 160..200),
        order in arb_order(),
        t in 0u32..20,
    ) {
        order.put_u32(&mut b, 0, SRPC_MSG_MAGIC);
        order.put_u32(&mut b, 4, SRPC_MSG_VERSION);
        order.put_u32(&mut b, 8, t);
        match SrpcMsg::parse(&b) {
            Ok((m, o)) => {
                prop_assert_eq!(o, order);
                prop_assert_eq!(m.msg_type() as u32, t);
                // Re-emitting what we understood parses to the same thing.
                let b2 = emit_msg(&m, o);
                prop_assert_eq!(SrpcMsg::parse(&b2), Ok((m, o)));
            }
            Err(e) => prop_assert_eq!(e, SelftestWireError::UnknownMsgType(t)),
        }
    }

    #[test]
    fn pattern_round_trip_and_single_flip(
        words in 1usize..600,
        off_words in 0usize..512,
        flip in any::<prop::sample::Index>(),
        order in arb_order(),
    ) {
        let len = words * 8;
        let offset = off_words * 8;
        let mut buf = vec![0u8; len];
        fill_pattern(&mut buf, offset, 4096, BrwCheck::Full, BRW_MAGIC, order).unwrap();
        prop_assert_eq!(check_pattern(&buf, offset, 4096, BrwCheck::Full, BRW_MAGIC, order), Ok(()));
        let i = flip.index(len);
        buf[i] ^= 0x80;
        let flagged = matches!(
            check_pattern(&buf, offset, 4096, BrwCheck::Full, BRW_MAGIC, order),
            Err(SelftestWireError::BadBulkData { at, .. }) if at == i / 8 * 8
        );
        prop_assert!(flagged);
    }
}
