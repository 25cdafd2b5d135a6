//! Host tests of the verbs fabric: what needs no RDMA device (errors, sizing, status mapping).

use super::*;

/// On a host without an RDMA device the fabric refuses to start with a clear error.
#[test]
fn no_device_gives_a_clear_error() {
    if v::device_count() > 0 {
        eprintln!("an RDMA device exists: skipping the no-device assertion");
        return;
    }
    let Err(e) = VerbsFabric::new(VerbsConfig::default(), |_| None) else {
        panic!("VerbsFabric::new succeeded without a device");
    };
    assert!(matches!(e, VerbsError::NoDevice));
    let msg = e.to_string();
    assert!(msg.contains("no RDMA device"), "{msg}");
    assert!(msg.contains("rdma_rxe"), "{msg}");
}

/// o2iblnd's sizing: messages + queue depth x fragments, the RDMA share halved until the
/// device's limits hold.
#[test]
fn send_queue_sizing() {
    // Queue depth 8: 18 receives and message buffers, 8 x 257 fragments.
    assert_eq!(sq_size(8, 18, 257, None), (18 + 8 * 257, 257));
    let roomy = DeviceLimits {
        max_qp_wr: 16384,
        max_cqe: 32767,
        max_sge: 32,
        max_mr_size: u64::MAX,
    };
    assert_eq!(sq_size(8, 18, 257, Some(roomy)), (2074, 257));
    // A device with 1024 WRs per queue: 257 and 128 fragments do not fit (18 + 1024 = 1042),
    // 64 do (18 + 512 = 530).
    let small = DeviceLimits {
        max_qp_wr: 1024,
        ..roomy
    };
    assert_eq!(sq_size(8, 18, 257, Some(small)), (18 + 8 * 64, 64));
    // The CQ bound counts too: send + receive entries.
    let tiny_cq = DeviceLimits {
        max_cqe: 100,
        ..roomy
    };
    let (send, frags) = sq_size(8, 18, 257, Some(tiny_cq));
    assert!(send + 18 <= 100 && frags == 8, "{send} {frags}");
    // Nothing fits: messages only.
    let none = DeviceLimits {
        max_qp_wr: 10,
        ..roomy
    };
    assert_eq!(sq_size(8, 18, 257, Some(none)), (18, 0));
}

#[test]
fn completion_statuses_map_to_the_engine() {
    assert_eq!(wc_status(v::wc::SUCCESS), WcStatus::Success);
    assert_eq!(wc_status(v::wc::WR_FLUSH_ERR), WcStatus::Flushed);
    assert_eq!(wc_status(v::wc::RETRY_EXC_ERR), WcStatus::RetryExceeded);
    assert_eq!(wc_status(v::wc::REM_ACCESS_ERR), WcStatus::Error);
    assert_eq!(wc_status(v::wc::LOC_PROT_ERR), WcStatus::Error);
    assert_eq!(wc_status(v::wc::RNR_RETRY_EXC_ERR), WcStatus::Error);
    assert!(v::wc::name(v::wc::REM_ACCESS_ERR).contains("remote access"));
}

/// A receive that fails (not flushed) breaks the connection: for a message too long for its
/// slot that is the peer's protocol error, anything else the transport; never a close.
#[test]
fn receive_errors_name_why_the_connection_broke() {
    assert_eq!(
        recv_error_reason(v::wc::LOC_LEN_ERR),
        DisconnectReason::ProtocolError
    );
    for st in [
        v::wc::REM_ACCESS_ERR,
        v::wc::LOC_PROT_ERR,
        v::wc::RETRY_EXC_ERR,
    ] {
        assert_eq!(recv_error_reason(st), DisconnectReason::TransportError);
    }
}

#[test]
fn verbs_fabric_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<VerbsFabric>();
}
