//! Reject private data from the connection manager: parse never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lnd::wire::KibRej;

fuzz_target!(|data: &[u8]| {
    if let Ok((rej, order)) = KibRej::parse(data) {
        let mut out = [0u8; 24];
        rej.emit(&mut out, order).expect("24 bytes always fit");
        assert_eq!(KibRej::parse(&out), Ok((rej, order)));
    }
});
