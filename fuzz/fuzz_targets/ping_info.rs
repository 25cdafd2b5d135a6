//! Ping payloads from the network: parse never panics and re-emits losslessly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lnd::wire::PingInfo;

fuzz_target!(|data: &[u8]| {
    if let Ok((ping, order)) = PingInfo::parse(data) {
        let mut out = vec![0u8; ping.wire_len()];
        ping.emit(&mut out, order).expect("sized to fit");
        assert_eq!(&out[..], &data[..out.len()]);
    }
});
