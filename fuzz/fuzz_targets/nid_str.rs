//! NID strings from users and config files: parse never panics; what parses prints back to a
//! string that parses to the same NID.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lnd::wire::Nid;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(nid) = s.parse::<Nid>() {
            let printed = nid.to_string();
            assert_eq!(printed.parse::<Nid>(), Ok(nid), "{printed}");
        }
    }
});
