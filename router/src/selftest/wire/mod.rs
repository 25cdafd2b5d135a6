//! Wire formats of lnet_selftest's RPC protocol ("srpc"), byte-exact with Lustre's
//! `lnet/selftest/rpc.h`, `selftest.h` and `include/uapi/linux/lnet/lnetst.h`.
//!
//! # How the protocol travels
//!
//! Every selftest RPC is one fixed-size message, `struct srpc_msg`: a 24-byte header and a
//! union of bodies, packed, 160 bytes in all (module.c asserts the size at build time). The
//! sender always sends the whole 160 bytes, whatever the body, and a Lustre server drops a
//! request whose LNet `mlength` is anything else (srpc_lnet_ev_handler), so [`SrpcMsg::parse`]
//! wants at least [`SRPC_MSG_LEN`] bytes and [`SrpcMsg::emit`] always writes exactly that many,
//! zero-filling what the body does not use.
//!
//! - A **request** is an LNet PUT to the server's portal: [`SRPC_FRAMEWORK_REQUEST_PORTAL`] (51)
//!   for the framework services (session, batch, test, stat, join, debug: ids below
//!   [`SRPC_FRAMEWORK_SERVICE_MAX_ID`]), [`SRPC_REQUEST_PORTAL`] (50) for the test services (brw,
//!   ping); the match bits are the service id (srpc_serv_portal and the service's posted
//!   buffers in rpc.c).
//! - Every request body starts with `rpyid`: the match bits of a buffer the client posted on
//!   [`SRPC_RDMA_PORTAL`] (52) for the **reply**, which the server PUTs there. Requests that move
//!   bulk data (test, brw) carry `bulkid` next: the match bits of the client's bulk buffer, also
//!   on portal 52, which the server GETs (the client is the source) or PUTs into (the client is
//!   the sink) before it replies (srpc_prepare_bulk, srpc_do_bulk).
//! - Every reply body starts with a `status`, a **positive** errno (`EPROTO`, `EBUSY`, ...), 0 on
//!   success; framework replies carry the server's session id next.
//!
//! # Byte order
//!
//! Like o2iblnd, selftest sends in the sender's native order, and the receiver swaps when it sees
//! [`SRPC_MSG_MAGIC`] byte-swapped (srpc_unpack_msg_hdr, sfw_unpack_message). We detect the order
//! from the magic, return it with the parsed message, and emit either order. Where Lustre's
//! swapping routines forget a field (the status of a debug reply, `bar_active` and `bar_time` of
//! a batch reply are never swapped by sfw_unpack_message) we still swap it: we read what the
//! sender meant; a kernel receiver of the other order would misread those fields either way.
//!
//! # Session features and the two bulk layouts
//!
//! The header's `msg_ses_feats` carries the session's feature bits. The only one defined,
//! [`LST_FEAT_BULK_LEN`], switches the brw parameters of a test request from the v0 layout
//! (a page count: assumes both ends have the same page size) to v1 (a byte length and an offset),
//! and changes how long the destination-list bulk is (see [`dest_ids_len`]). Servers reply EPROTO
//! to feature bits they do not know rather than dropping the message, so [`SrpcMsg::parse`]
//! accepts any bits and hands them up.
//!
//! # Style
//!
//! As in `lnd::wire`: parsing checks the length and magic first and then every read is in bounds
//! by construction; the readers below also return zero rather than panic out of range. Values
//! the receiver answers with an error status (an unknown brw opcode, check flag, batch opcode,
//! test service) are kept raw with typed accessors, so a service can answer them as Lustre
//! does instead of losing the request.
//!
//! # Where things are
//!
//! `messages` holds the constants, errors and types the bodies are made of; `codec` the
//! byte access and the header; the bodies are in `framework` (portal 51 services) and `bodies`
//! (the test services and a test's destination list); `patterns` the brw data patterns. This
//! file puts them together into [`SrpcBody`] and [`SrpcMsg`].

mod bodies;
mod codec;
mod framework;
mod messages;
mod patterns;

pub use bodies::*;
pub use codec::SrpcHeader;
pub use framework::*;
pub use messages::*;
pub use patterns::*;

use codec::{detect_order, hdr, BodyLayout, Reader, Writer};
use lnd::wire::ByteOrder;

// ---------------------------------------------------------------------------------------------
// The message
// ---------------------------------------------------------------------------------------------

macro_rules! bodies {
    ($($variant:ident),* $(,)?) => {
        /// The body of an srpc message, one variant per `msg_type`.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        pub enum SrpcBody {
            $(
                #[doc = concat!("A [`", stringify!($variant), "`] body.")]
                $variant($variant),
            )*
        }

        impl SrpcBody {
            /// The `msg_type` this body is sent with.
            pub fn msg_type(&self) -> MsgType {
                match self {
                    $(SrpcBody::$variant(_) => <$variant as BodyLayout>::TYPE,)*
                }
            }

            /// Bytes of the body union this body uses.
            pub fn len(&self) -> usize {
                match self {
                    $(SrpcBody::$variant(_) => <$variant as BodyLayout>::LEN,)*
                }
            }

            /// Never true: every body has fields (here for clippy's `len_without_is_empty`).
            pub fn is_empty(&self) -> bool {
                false
            }

            fn read(t: MsgType, r: &Reader<'_>, features: u32) -> SrpcBody {
                match t {
                    $(MsgType::$variant => SrpcBody::$variant(<$variant as BodyLayout>::read(r, features)),)*
                }
            }

            fn write(&self, w: &mut Writer<'_>) {
                match self {
                    $(SrpcBody::$variant(x) => x.write(w),)*
                }
            }
        }

        $(
            impl From<$variant> for SrpcBody {
                fn from(x: $variant) -> SrpcBody {
                    SrpcBody::$variant(x)
                }
            }

            impl $variant {
                /// The `msg_type` of this body.
                pub const MSG_TYPE: MsgType = <$variant as BodyLayout>::TYPE;

                /// Parses a whole 160-byte srpc message that must carry this body, returning
                /// it and the byte order it came in. The header's features are only used where
                /// the layout depends on them (a test request's brw parameters); use
                /// [`SrpcMsg::parse`] to see them.
                pub fn parse(msg: &[u8]) -> Result<(Self, ByteOrder), SelftestWireError> {
                    let (m, order) = SrpcMsg::parse(msg)?;
                    match m.body {
                        SrpcBody::$variant(x) => Ok((x, order)),
                        other => Err(SelftestWireError::WrongMsgType {
                            expected: Self::MSG_TYPE,
                            got: other.msg_type(),
                        }),
                    }
                }

                /// Emits this body as a whole 160-byte srpc message in `order`, with the
                /// features [`SrpcBody::implied_features`] gives it; use [`SrpcMsg::emit`] to
                /// choose them.
                pub fn emit(&self, buf: &mut [u8], order: ByteOrder) -> Result<usize, SelftestWireError> {
                    SrpcMsg::new(SrpcBody::$variant(*self)).emit(buf, order)
                }
            }
        )*
    };
}

bodies!(
    MakeSessionRequest,
    MakeSessionReply,
    RemoveSessionRequest,
    RemoveSessionReply,
    BatchRequest,
    BatchReply,
    StatRequest,
    StatReply,
    TestRequest,
    TestReply,
    DebugRequest,
    DebugReply,
    BrwRequest,
    BrwReply,
    PingRequest,
    PingReply,
    JoinRequest,
    JoinReply,
);

impl SrpcBody {
    /// The session features a body is sent with when none are chosen: every feature we know
    /// ([`LST_FEATS_MASK`]), except that a test request with v0 brw parameters needs
    /// [`LST_FEAT_BULK_LEN`] clear.
    pub fn implied_features(&self) -> u32 {
        match self {
            SrpcBody::TestRequest(TestRequest {
                params: TestParams::BulkV0 { .. },
                ..
            }) => LST_FEAT_NONE,
            _ => LST_FEATS_MASK,
        }
    }
}

/// A validated srpc message (`struct srpc_msg`, 160 bytes, packed): the header fields that mean
/// something and the typed body. `msg_magic` and `msg_version` are implied
/// ([`SRPC_MSG_MAGIC`], [`SRPC_MSG_VERSION`]), `msg_type` comes from the body, and the two
/// reserved words are written as zero and ignored on receive.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SrpcMsg {
    /// `msg_ses_feats`: the session's feature bits. Unknown bits are kept: Lustre answers them
    /// with EPROTO rather than dropping the message.
    pub features: u32,
    /// The body.
    pub body: SrpcBody,
}

impl SrpcMsg {
    /// A message with the body's [`SrpcBody::implied_features`].
    pub fn new(body: SrpcBody) -> SrpcMsg {
        SrpcMsg {
            features: body.implied_features(),
            body,
        }
    }

    /// The message type.
    pub fn msg_type(&self) -> MsgType {
        self.body.msg_type()
    }

    /// Parses a message: at least [`SRPC_MSG_LEN`] bytes (bytes beyond are ignored), a known
    /// magic in either byte order, version 1, a known type. Returns the message and the order it
    /// was sent in (which also tells how the brw data pattern and destination list of this
    /// exchange are ordered).
    pub fn parse(b: &[u8]) -> Result<(SrpcMsg, ByteOrder), SelftestWireError> {
        check_len(b, SRPC_MSG_LEN)?;
        let order = detect_order(b)?;
        let version = order.get_u32(b, hdr::VERSION);
        if version != SRPC_MSG_VERSION {
            return Err(SelftestWireError::BadVersion(version));
        }
        let raw_type = order.get_u32(b, hdr::TYPE);
        let msg_type =
            MsgType::from_u32(raw_type).ok_or(SelftestWireError::UnknownMsgType(raw_type))?;
        let features = order.get_u32(b, hdr::SES_FEATS);
        let r = Reader { b, order };
        let body = SrpcBody::read(msg_type, &r, features);
        Ok((SrpcMsg { features, body }, order))
    }

    /// Writes the whole 160-byte message into `buf` in `order`, zeroing what the body does not
    /// use; returns [`SRPC_MSG_LEN`]. Refuses a test request whose brw layout disagrees with
    /// `features`, and [`TestParams::Other`] carrying the brw or ping service id.
    pub fn emit(&self, buf: &mut [u8], order: ByteOrder) -> Result<usize, SelftestWireError> {
        if let SrpcBody::TestRequest(t) = &self.body {
            let v1 = self.features & LST_FEAT_BULK_LEN != 0;
            match t.params {
                TestParams::BulkV0 { .. } if v1 => {
                    return Err(SelftestWireError::BulkLayoutMismatch {
                        features: self.features,
                    })
                }
                TestParams::BulkV1 { .. } if !v1 => {
                    return Err(SelftestWireError::BulkLayoutMismatch {
                        features: self.features,
                    })
                }
                TestParams::Other { service, .. }
                    if service == ServiceId::Brw as u32 || service == ServiceId::Ping as u32 =>
                {
                    return Err(SelftestWireError::BadTestService(service))
                }
                _ => {}
            }
        }
        let got = buf.len();
        let out = buf
            .get_mut(..SRPC_MSG_LEN)
            .ok_or(SelftestWireError::BufferTooSmall {
                needed: SRPC_MSG_LEN,
                got,
            })?;
        out.fill(0);
        order.put_u32(out, hdr::MAGIC, SRPC_MSG_MAGIC);
        order.put_u32(out, hdr::VERSION, SRPC_MSG_VERSION);
        order.put_u32(out, hdr::TYPE, self.msg_type() as u32);
        order.put_u32(out, hdr::RESERVED0, 0);
        order.put_u32(out, hdr::RESERVED1, 0);
        order.put_u32(out, hdr::SES_FEATS, self.features);
        self.body.write(&mut Writer { b: out, order });
        Ok(SRPC_MSG_LEN)
    }
}

#[cfg(test)]
mod tests;
