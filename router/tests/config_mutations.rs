//! A careless operator's config: the shipped example configs, mutated (bytes cut, values
//! replaced by out-of-range numbers, YAML punctuation, anchors, tags, lines duplicated), are
//! refused with an error or loaded, never a panic. Deterministic (a fixed xorshift seed);
//! `CONFIG_MUTATIONS=N` runs N of them (default 10,000; 200,000 found nothing on 2026-12-04).

use router::yaml_config::DaemonConfig;

#[test]
fn mutated_example_configs_are_refused_or_loaded_never_a_panic() {
    let mut seeds = vec![];
    for p in [
        "examples/lnet-router.yaml",
        "examples/lnet-router-b.yaml",
        "examples/routed/client.yaml",
        "examples/routed/router.yaml",
        "examples/routed/server.yaml",
    ] {
        seeds.push(std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}")));
    }
    let frags: &[&str] = &[
        "-1",
        "99999999999999999999",
        "4294967296",
        "65536",
        "256",
        "0",
        "1e9",
        "null",
        "~",
        "[]",
        "{}",
        "\"\"",
        "0x10",
        "1.5",
        "true",
        " ",
        "\n",
        ":",
        "- ",
        "@o2ib",
        "@o2ib4294967295",
        "255.255.255.255",
        "*",
        "&a",
        "*a",
        "!!str",
        "\t",
        "'",
        "\"",
        "#",
        "|\n",
        ">\n",
    ];
    let mut rng = testkit::XorShift(0x2545_f491_4f6c_dd1d);
    let mut next = || rng.next().unwrap();
    let mut panics = Vec::new();
    let (mut loaded, mut refused) = (0u32, 0u32);
    let n: usize = std::env::var("CONFIG_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    for i in 0..n {
        let mut s = seeds[(next() as usize) % seeds.len()].clone().into_bytes();
        let k = 1 + next() % 4;
        for _ in 0..k {
            if s.is_empty() {
                break;
            }
            let at = (next() as usize) % s.len();
            match next() % 4 {
                0 => {
                    let end = (at + 1 + (next() as usize) % 8).min(s.len());
                    s.drain(at..end);
                }
                1 => {
                    let f = frags[(next() as usize) % frags.len()];
                    s.splice(at..at, f.bytes());
                }
                2 => {
                    let f = frags[(next() as usize) % frags.len()];
                    let end = (at + 1 + (next() as usize) % 4).min(s.len());
                    s.splice(at..end, f.bytes());
                }
                _ => {
                    let line_start = s[..at]
                        .iter()
                        .rposition(|&b| b == b'\n')
                        .map_or(0, |p| p + 1);
                    let line_end = s[at..]
                        .iter()
                        .position(|&b| b == b'\n')
                        .map_or(s.len(), |p| at + p + 1);
                    let line: Vec<u8> = s[line_start..line_end].to_vec();
                    let ins = (next() as usize) % s.len();
                    s.splice(ins..ins, line);
                }
            }
        }
        let Ok(text) = String::from_utf8(s) else {
            continue;
        };
        let r = std::panic::catch_unwind(|| {
            let _ = DaemonConfig::parse_allowing_no_nis(&text, "mutated");
            DaemonConfig::parse(&text, "mutated").is_ok()
        });
        match r {
            Ok(true) => loaded += 1,
            Ok(false) => refused += 1,
            Err(_) => panics.push((i, text)),
        }
    }
    assert!(
        panics.is_empty(),
        "{} of {n} mutated configs panicked; the first (mutation {}):\n{}",
        panics.len(),
        panics[0].0,
        panics[0].1
    );
    // The mutations reach the parser's checks, not only YAML syntax errors: some still load.
    assert!(
        loaded > 0 && refused > 0,
        "loaded {loaded}, refused {refused}"
    );
}
