//! The test services' bodies: adding a test to a batch (with its per-service parameters and
//! destination list) and the ping and brw test RPCs themselves (portal 50).

use lnd::wire::{ByteOrder, Nid};

use super::codec::{fixed_layouts, put, take, BodyLayout, Field, Reader, Writer};
use super::messages::*;

/// The per-service parameters of a test request (the 12-byte `tsr_u` union), chosen by the
/// request's `tsr_service` and, for brw, by the header's [`LST_FEAT_BULK_LEN`] bit
/// (sfw_unpack_addtest_req).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TestParams {
    /// Ping test (`struct test_ping_req`, 8 bytes): `png_size` at 0, `png_flags` at 4.
    Ping {
        /// Size of the ping message (unused by current Lustre).
        size: u32,
        /// Reserved flags.
        flags: u32,
    },
    /// Brw test, v0 layout (`struct test_bulk_req`, 12 bytes), sessions without
    /// [`LST_FEAT_BULK_LEN`]: `blk_opc` at 0, `blk_npg` at 4, `blk_flags` at 8. The transfer is
    /// `npg` pages of the *receiver's* page size at offset 0 (brw_client_init), which is why v1
    /// exists.
    BulkV0 {
        /// [`BrwOp`] code, raw.
        opc: u32,
        /// Number of pages.
        npg: u32,
        /// [`BrwCheck`] code, raw.
        flags: u32,
    },
    /// Brw test, v1 layout (`struct test_bulk_req_v1`, 12 bytes), sessions with
    /// [`LST_FEAT_BULK_LEN`]: `blk_opc` (u16) at 0, `blk_flags` (u16) at 2, `blk_len` at 4,
    /// `blk_offset` at 8.
    BulkV1 {
        /// [`BrwOp`] code, raw.
        opc: u16,
        /// [`BrwCheck`] code, raw.
        flags: u16,
        /// Bytes per transfer (at most [`LNET_MTU`]).
        len: u32,
        /// Offset of the data in the client's first page; the console sends the client offset
        /// to clients and the (reserved) server offset to servers. Must be a multiple of 8.
        offset: u32,
    },
    /// Any other service: the 12 union bytes exactly as received (a node answers EINVAL).
    Other {
        /// The raw `tsr_service` (neither 11 nor 12).
        service: u32,
        /// The union's bytes, unswapped.
        raw: [u8; 12],
    },
}

impl TestParams {
    /// The `tsr_service` these parameters go with.
    pub fn service(&self) -> u32 {
        match self {
            TestParams::Ping { .. } => ServiceId::Ping as u32,
            TestParams::BulkV0 { .. } | TestParams::BulkV1 { .. } => ServiceId::Brw as u32,
            TestParams::Other { service, .. } => *service,
        }
    }
}

/// Test request (`struct srpc_test_reqst`, 70 bytes): add a test to a batch on a node.
///
/// | offset | field          | size |
/// |--------|----------------|------|
/// | 0      | tsr_rpyid      | 8    |
/// | 8      | tsr_bulkid     | 8    |
/// | 16     | tsr_sid        | 16   |
/// | 32     | tsr_bid        | 8    |
/// | 40     | tsr_service    | 4    |
/// | 44     | tsr_loop       | 4    |
/// | 48     | tsr_concur     | 4    |
/// | 52     | tsr_is_client  | 1    |
/// | 53     | tsr_stop_onerr | 1    |
/// | 54     | tsr_ndest      | 4    |
/// | 58     | tsr_u          | 12   |
///
/// `tsr_service` is declared as a C enum; we take it as 4 bytes, which is what GCC gives an
/// enum of small values on every Linux ABI (the header does not say so; module.c's total of 160
/// bytes does not depend on it because the stat reply is the largest body).
///
/// **Where the destinations travel.** A client-side request (`is_client`) names `ndest`
/// destination processes, but they are not in the message: the console posts them as a bulk
/// buffer on [`SRPC_RDMA_PORTAL`] with match bits `bulkid`, and the node, before it replies,
/// LNet-GETs that buffer (sfw_add_test allocates a sink of `12 * ndest` bytes; srpc_do_bulk).
/// The buffer is an array of 12-byte [`ProcessId`]s, page by page: see [`dest_ids_len`],
/// [`emit_dest_ids`] and [`parse_dest_ids`]. A server-side request (`!is_client`) has
/// `ndest` 0, no bulk, and `loop_count` is the number of request buffers to post.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TestRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// Match bits of the destination-list bulk (client side only).
    pub bulkid: u64,
    /// The console's session id.
    pub sid: LstSid,
    /// The batch the test joins.
    pub bid: LstBid,
    /// Client: RPCs per destination and unit (loop count); server: buffers to post.
    pub loop_count: u32,
    /// Concurrent RPCs per destination (at most [`LST_MAX_CONCUR`]).
    pub concur: u32,
    /// This node runs the client side of the test.
    pub is_client: bool,
    /// Stop a test unit at its first error.
    pub stop_onerr: bool,
    /// Number of destinations in the bulk.
    pub ndest: u32,
    /// The service and its parameters.
    pub params: TestParams,
}

impl BodyLayout for TestRequest {
    const TYPE: MsgType = MsgType::TestRequest;
    const LEN: usize = 70;
    fn read(r: &Reader<'_>, features: u32) -> Self {
        let service = r.u32(40);
        let params = if service == ServiceId::Ping as u32 {
            TestParams::Ping {
                size: r.u32(58),
                flags: r.u32(62),
            }
        } else if service == ServiceId::Brw as u32 {
            if features & LST_FEAT_BULK_LEN == 0 {
                TestParams::BulkV0 {
                    opc: r.u32(58),
                    npg: r.u32(62),
                    flags: r.u32(66),
                }
            } else {
                TestParams::BulkV1 {
                    opc: r.u16(58),
                    flags: r.u16(60),
                    len: r.u32(62),
                    offset: r.u32(66),
                }
            }
        } else {
            TestParams::Other {
                service,
                raw: take(r.b, SRPC_HDR_LEN + 58),
            }
        };
        TestRequest {
            rpyid: r.u64(0),
            bulkid: r.u64(8),
            sid: r.sid(16),
            bid: LstBid(r.u64(32)),
            loop_count: r.u32(44),
            concur: r.u32(48),
            is_client: r.u8(52) != 0,
            stop_onerr: r.u8(53) != 0,
            ndest: r.u32(54),
            params,
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.u64(8, self.bulkid);
        w.sid(16, self.sid);
        w.u64(32, self.bid.0);
        w.u32(40, self.params.service());
        w.u32(44, self.loop_count);
        w.u32(48, self.concur);
        w.u8(52, u8::from(self.is_client));
        w.u8(53, u8::from(self.stop_onerr));
        w.u32(54, self.ndest);
        match self.params {
            TestParams::Ping { size, flags } => {
                w.u32(58, size);
                w.u32(62, flags);
            }
            TestParams::BulkV0 { opc, npg, flags } => {
                w.u32(58, opc);
                w.u32(62, npg);
                w.u32(66, flags);
            }
            TestParams::BulkV1 {
                opc,
                flags,
                len,
                offset,
            } => {
                w.u16(58, opc);
                w.u16(60, flags);
                w.u32(62, len);
                w.u32(66, offset);
            }
            TestParams::Other { raw, .. } => put(w.b, SRPC_HDR_LEN + 58, raw),
        }
    }
}

/// Test reply (`struct srpc_test_reply`, 20 bytes): `tsr_status` at 0, `tsr_sid` at 4.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TestReply {
    /// Positive errno, 0 on success.
    pub status: u32,
    /// The node's session id.
    pub sid: LstSid,
}

/// Ping test request (`struct srpc_ping_reqst`, 32 bytes), test client to server on portal 50:
///
/// | offset | field         | size |
/// |--------|---------------|------|
/// | 0      | pnr_rpyid     | 8    |
/// | 8      | pnr_magic     | 4    |
/// | 12     | pnr_seq       | 4    |
/// | 16     | pnr_time_sec  | 8    |
/// | 24     | pnr_time_nsec | 8    |
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PingRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// [`LST_PING_TEST_MAGIC`]; a server refuses anything else (ping_server_handle).
    pub magic: u32,
    /// The client's sequence number, echoed in the reply.
    pub seq: u32,
    /// Send time, wall-clock seconds.
    pub time_sec: u64,
    /// Send time, nanoseconds within the second.
    pub time_nsec: u64,
}

/// Ping test reply (`struct srpc_ping_reply`, 12 bytes): `pnr_status` at 0, `pnr_magic` at 4,
/// `pnr_seq` at 8.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PingReply {
    /// Positive errno (EPROTO for unknown features), 0 on success.
    pub status: u32,
    /// [`LST_PING_TEST_MAGIC`]; the client counts anything else as an error.
    pub magic: u32,
    /// The request's sequence number.
    pub seq: u32,
}

/// Brw test request (`struct srpc_brw_reqst`, 28 bytes), test client to server on portal 50:
///
/// | offset | field      | size |
/// |--------|------------|------|
/// | 0      | brw_rpyid  | 8    |
/// | 8      | brw_bulkid | 8    |
/// | 16     | brw_rw     | 4    |
/// | 20     | brw_len    | 4    |
/// | 24     | brw_flags  | 4    |
///
/// The data itself is a bulk on [`SRPC_RDMA_PORTAL`] with match bits `bulkid`: for a read the
/// server PUTs `len` bytes there, for a write it GETs them, then it replies. The server's buffer
/// always starts at page offset 0 (brw_server_handle); without [`LST_FEAT_BULK_LEN`] `len` must
/// be a whole number of pages.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BrwRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// Bulk match bits.
    pub bulkid: u64,
    /// [`BrwOp`] code, raw (a server answers others with EINVAL).
    pub rw: u32,
    /// Bytes to move, 1..=[`LNET_MTU`].
    pub len: u32,
    /// [`BrwCheck`] code, raw: the pattern the data carries.
    pub flags: u32,
}

impl BrwRequest {
    /// The direction, if `rw` is a known code.
    pub fn op(&self) -> Option<BrwOp> {
        BrwOp::from_u32(self.rw)
    }

    /// The data check, if `flags` is a known code.
    pub fn check(&self) -> Option<BrwCheck> {
        BrwCheck::from_u32(self.flags)
    }
}

/// Brw test reply (`struct srpc_brw_reply`, 4 bytes): `brw_status` at 0, a positive errno
/// (EBADMSG when a written pattern did not check out).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BrwReply {
    /// Positive errno, 0 on success.
    pub status: u32,
}

// The bodies above with every field at a fixed offset: their offsets, as in their docs.
fixed_layouts! {
    TestReply, 20 { status @ 0, sid @ 4 }
    PingRequest, 32 { rpyid @ 0, magic @ 8, seq @ 12, time_sec @ 16, time_nsec @ 24 }
    PingReply, 12 { status @ 0, magic @ 4, seq @ 8 }
    BrwRequest, 28 { rpyid @ 0, bulkid @ 8, rw @ 16, len @ 20, flags @ 24 }
    BrwReply, 4 { status @ 0 }
}

// ---------------------------------------------------------------------------------------------
// The destination list of a test request
// ---------------------------------------------------------------------------------------------

/// Bytes of the destination-list bulk for `ndest` destinations (lstcon_testrpc_prep):
/// with [`LST_FEAT_BULK_LEN`] exactly `12 * ndest`, the last page partly used; without it
/// whole pages. Either way the ids are laid out page by page, [`ids_per_page`] to a page,
/// each page's `page_size % 12` tail unused, so entry `i` is at byte
/// `(i / per_page) * page_size + (i % per_page) * 12`. The page size is the console's and
/// must match the node's (Lustre assumes the same PAGE_SIZE at both ends; with 4 KiB pages
/// that holds on x86-64 and most arm64 builds, not on 64 KiB-page nodes). Note that with the
/// feature both ends size the bulk as `12 * ndest` bytes (lstcon_testrpc_prep, sfw_add_test)
/// yet place entries by page, so past [`ids_per_page`] destinations the paged end of the list
/// lies `page_size % 12` bytes per extra page beyond the bulk's length and Lustre's last entries
/// never fully travel. We report that faithfully: [`parse_dest_ids`] then fails with
/// `Truncated` rather than invent bytes. (A Lustre quirk read from the source, not seen on a
/// live system.)
pub fn dest_ids_len(ndest: usize, page_size: usize, features: u32) -> usize {
    let per_page = ids_per_page(page_size).max(1);
    let pages = ndest.div_ceil(per_page);
    if features & LST_FEAT_BULK_LEN != 0 {
        ndest.saturating_mul(PROCESS_ID_LEN)
    } else {
        pages.saturating_mul(page_size)
    }
}

fn dest_id_offset(i: usize, page_size: usize) -> usize {
    let per_page = ids_per_page(page_size).max(1);
    (i / per_page) * page_size + (i % per_page) * PROCESS_ID_LEN
}

/// Writes `ids` into `buf` as the destination-list bulk (see [`dest_ids_len`]), in `order` (the
/// order of the test request that announces them); returns the bytes up to the end of the last
/// entry. Unused page tails are left as they are.
pub fn emit_dest_ids(
    ids: &[ProcessId],
    page_size: usize,
    buf: &mut [u8],
    order: ByteOrder,
) -> Result<usize, SelftestWireError> {
    if page_size < PROCESS_ID_LEN {
        return Err(SelftestWireError::Misaligned {
            page_size,
            offset: 0,
            len: ids.len(),
        });
    }
    let end = match ids.len() {
        0 => 0,
        n => dest_id_offset(n - 1, page_size) + PROCESS_ID_LEN,
    };
    check_room(buf, end)?;
    for (i, id) in ids.iter().enumerate() {
        let at = dest_id_offset(i, page_size);
        order.put_u64(buf, at, id.nid.raw());
        order.put_u32(buf, at + 8, id.pid);
    }
    Ok(end)
}

/// Reads `ndest` destinations from a destination-list bulk in `order` (the test request's byte
/// order, as sfw_add_test_instance swaps each entry when the request was swapped).
pub fn parse_dest_ids(
    bulk: &[u8],
    ndest: usize,
    page_size: usize,
    order: ByteOrder,
) -> Result<Vec<ProcessId>, SelftestWireError> {
    if page_size < PROCESS_ID_LEN {
        return Err(SelftestWireError::Misaligned {
            page_size,
            offset: 0,
            len: bulk.len(),
        });
    }
    let end = match ndest {
        0 => 0,
        n => dest_id_offset(n - 1, page_size) + PROCESS_ID_LEN,
    };
    check_len(bulk, end)?;
    Ok((0..ndest)
        .map(|i| {
            let at = dest_id_offset(i, page_size);
            ProcessId {
                nid: Nid::from_raw(order.get_u64(bulk, at)),
                pid: order.get_u32(bulk, at + 8),
            }
        })
        .collect())
}
