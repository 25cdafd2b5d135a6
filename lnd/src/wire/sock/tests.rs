use super::*;

#[test]
fn worked_example_connreq_round_trips() {
    let b: Nid = "192.168.1.1@tcp".parse().unwrap();
    let req = ConnReq::new(b);
    assert_eq!(ConnReq::parse(ByteOrder::Little, &req.emit()), Ok(req));
}
