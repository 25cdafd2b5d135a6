//! o2iblnd messages from the network: parse must never panic, and what parses must re-emit to a
//! message that parses to the same thing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lnd::wire::kib::EmitOpts;
use lnd::wire::KibMsg;

fuzz_target!(|data: &[u8]| {
    if let Ok((msg, framing)) = KibMsg::parse(data) {
        let mut out = vec![0u8; msg.wire_len()];
        let opts = EmitOpts {
            order: framing.order,
            // Re-emit in the flavour the message matched (either, when both gave the same sum).
            checksum: framing
                .cksum
                .map(|c| c.flavour.unwrap_or(lnd::wire::kib::CksumFlavour::Unsigned)),
        };
        if let Ok(n) = msg.emit(&mut out, opts) {
            let (again, _) = KibMsg::parse(&out[..n]).expect("re-emitted message must parse");
            assert_eq!(again, msg);
        }
    }
});
