//! Timer wheel micro-benchmarks with 1,000,000 timers pending.
//!
//! * `wheel/insert+cancel`: 1M timers spread over 0..60 s (tick 1 ms); each
//!   iteration inserts one more timer at a pseudo-random deadline in the
//!   same range and cancels it again.
//! * `wheel/insert+expire`: 1M timers parked 25..49 days out (all in the
//!   top level, and the first cascade of that level is 24.8 days away, far
//!   beyond the simulated time any run covers); each iteration inserts one
//!   timer 1 ms ahead, advances time by 1 ms and polls it out, so it
//!   measures one insert plus one expiry (slot processing, ready-queue sort
//!   and pop) with 1M others pending.
//!
//! Deadlines come from a fixed-seed xorshift generator, so runs are
//! reproducible.

use std::hint::black_box;
use std::time::Duration as StdDuration;

use criterion::{criterion_group, criterion_main, Criterion};
use lnd::time::{Duration, Instant};
use lnd::wheel::TimerWheel;

const PENDING: usize = 1_000_000;
const TICK: Duration = Duration::from_millis(1);

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A value in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// A wheel starting at time zero with `PENDING` timers at deadlines drawn
/// from `lo..hi` nanoseconds.
fn filled(rng: &mut XorShift, lo: u64, hi: u64) -> TimerWheel<u64> {
    let mut w = TimerWheel::with_capacity(Instant::ZERO, TICK, PENDING + 16);
    for i in 0..PENDING as u64 {
        w.insert(Instant::from_nanos(rng.range(lo, hi)), i);
    }
    w
}

fn insert_cancel(c: &mut Criterion) {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let sixty_s = Duration::from_secs(60).as_nanos();
    let mut w = filled(&mut rng, 0, sixty_s);
    c.bench_function("wheel/insert+cancel (1M pending over 60 s)", |b| {
        b.iter(|| {
            let d = Instant::from_nanos(rng.range(0, sixty_s));
            let k = w.insert(black_box(d), 7);
            black_box(w.cancel(k))
        })
    });
    assert_eq!(w.len(), PENDING);
}

fn insert_expire(c: &mut Criterion) {
    let mut rng = XorShift(0xD1B5_4A32_D192_ED03);
    let day = Duration::from_secs(86_400).as_nanos();
    // [2^31, 2^32) ms: top-level slots 2 and 3, first due at ~24.8 days.
    let far_lo = (1u64 << 31) * 1_000_000;
    let far_hi = (1u64 << 32) * 1_000_000;
    let mut w = filled(&mut rng, far_lo, far_hi);
    let mut now = Instant::ZERO;
    c.bench_function("wheel/insert+expire (1M pending far out)", |b| {
        b.iter(|| {
            let deadline = now + TICK;
            w.insert(deadline, 1);
            now = deadline;
            let fired = w.poll(now);
            assert_eq!(fired, Some((deadline, 1)));
            black_box(fired)
        })
    });
    // Criterion ran well under 24 days' worth of 1 ms iterations, so none of
    // the far timers may have fired or cascaded.
    assert!(now.as_nanos() < 20 * day, "simulated time {now}");
    assert_eq!(w.len(), PENDING);
    assert!(w.poll(now).is_none());
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(StdDuration::from_secs(1))
        .measurement_time(StdDuration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = insert_cancel, insert_expire
}
criterion_main!(benches);
