//! LNet headers: parse never panics; a parsed header re-emits to the same bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lnd::wire::LnetHdr;

fuzz_target!(|data: &[u8]| {
    if let Ok(hdr) = LnetHdr::parse(data) {
        let mut out = [0u8; 72];
        hdr.emit(&mut out).expect("72 bytes always fit");
        assert_eq!(LnetHdr::parse(&out), Ok(hdr));
    }
});
