//! ulnet's own time types: [`Instant`] and [`Duration`], both plain `u64`
//! nanosecond counts.
//!
//! # Why not `std::time`?
//!
//! The LND core is *sans-IO*: it never reads a clock, sleeps, or spawns
//! anything. Every entry point that cares about time is handed "now" by its
//! caller:
//!
//! * the real driver reads `CLOCK_MONOTONIC` once per event-loop iteration and
//!   converts it to an [`Instant`] (nanoseconds since an arbitrary epoch, e.g.
//!   the driver's start), then passes that same value to everything it calls
//!   during the iteration;
//! * the deterministic simulator passes *virtual* time, which it advances
//!   however it likes (jumping straight to the next timer deadline, replaying
//!   a recorded run, ...).
//!
//! `std::time::Instant` cannot be constructed from a number, so a simulator
//! could not fabricate one, and its representation is platform-specific. Our
//! [`Instant`] is a transparent `u64` of nanoseconds: trivially constructible,
//! `Copy`, `Ord`, `Hash`, printable, and cheap to do arithmetic on (the timer
//! wheel turns it into tick numbers with one division).
//!
//! [`Duration`] is likewise a `u64` of nanoseconds (about 584 years of range,
//! far more than any protocol timeout). It converts to and from
//! `std::time::Duration` for configuration and for the driver's sleeps.
//!
//! # Overflow policy
//!
//! Arithmetic never panics. The operators (`+`, `-`, `*`) *saturate*:
//! `Instant::ZERO - d == Instant::ZERO`, `later - earlier` of two instants is
//! zero when they are the wrong way round, and sums clamp at `MAX`. Time
//! values in this project come from a monotonic clock or a simulator, so
//! saturation only ever matters at the extremes (e.g. "never" expressed as
//! [`Duration::MAX`]), where clamping is exactly the wanted behaviour. Use the
//! `checked_*` methods where overflow must be detected.

use std::fmt;
use std::ops::{Add, AddAssign, Mul, Sub, SubAssign};

const NANOS_PER_MICRO: u64 = 1_000;
const NANOS_PER_MILLI: u64 = 1_000_000;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// What [`Instant`] and [`Duration`] share as a `u64` of nanoseconds: constructors from whole
/// units (saturating), and a [`Duration`] added or taken away: checked, saturating, and as the
/// `+`, `-`, `+=` and `-=` operators, which saturate (the module's overflow policy). One
/// definition for both, so that the two cannot drift apart in how they overflow.
macro_rules! nanos_arith {
    ($T:ident { $($(#[$doc:meta])* $ctor:ident($unit:ident) = $per:expr;)* }) => {
        impl $T {
            $(
                $(#[$doc])*
                #[inline]
                pub const fn $ctor($unit: u64) -> $T {
                    $T($unit.saturating_mul($per))
                }
            )*

            /// `self + d`, or `None` on overflow.
            #[inline]
            pub const fn checked_add(self, d: Duration) -> Option<$T> {
                match self.0.checked_add(d.0) {
                    Some(n) => Some($T(n)),
                    None => None,
                }
            }

            #[doc = concat!("`self - d`, or `None` below [`", stringify!($T), "::ZERO`].")]
            #[inline]
            pub const fn checked_sub(self, d: Duration) -> Option<$T> {
                match self.0.checked_sub(d.0) {
                    Some(n) => Some($T(n)),
                    None => None,
                }
            }

            #[doc = concat!("`self + d`, clamped to [`", stringify!($T), "::MAX`].")]
            #[inline]
            pub const fn saturating_add(self, d: Duration) -> $T {
                $T(self.0.saturating_add(d.0))
            }

            #[doc = concat!("`self - d`, clamped to [`", stringify!($T), "::ZERO`].")]
            #[inline]
            pub const fn saturating_sub(self, d: Duration) -> $T {
                $T(self.0.saturating_sub(d.0))
            }
        }

        impl Add<Duration> for $T {
            type Output = $T;
            #[doc = concat!("Saturating: clamps to [`", stringify!($T), "::MAX`].")]
            #[inline]
            fn add(self, d: Duration) -> $T {
                self.saturating_add(d)
            }
        }

        impl AddAssign<Duration> for $T {
            #[inline]
            fn add_assign(&mut self, d: Duration) {
                *self = *self + d;
            }
        }

        impl Sub<Duration> for $T {
            type Output = $T;
            #[doc = concat!("Saturating: clamps to [`", stringify!($T), "::ZERO`].")]
            #[inline]
            fn sub(self, d: Duration) -> $T {
                self.saturating_sub(d)
            }
        }

        impl SubAssign<Duration> for $T {
            #[inline]
            fn sub_assign(&mut self, d: Duration) {
                *self = *self - d;
            }
        }
    };
}

/// Writes `nanos` as seconds with `precision` (0..=9) decimal places,
/// truncating (never rounding up, so a printed time is never later than the
/// real one), followed by `s`: `12.345678s`.
fn fmt_secs(f: &mut fmt::Formatter<'_>, nanos: u64, precision: usize) -> fmt::Result {
    let secs = nanos / NANOS_PER_SEC;
    let frac = nanos % NANOS_PER_SEC;
    let precision = precision.min(9);
    if precision == 0 {
        return write!(f, "{secs}s");
    }
    // 10^(9 - precision): drop the digits we do not print.
    let divisor = 10u64.pow(9 - precision as u32);
    write!(f, "{secs}.{:0width$}s", frac / divisor, width = precision)
}

/// A point in time: nanoseconds since an arbitrary, caller-chosen epoch.
///
/// The core never creates one from a clock; the driver (monotonic clock) or
/// the simulator (virtual time) does. Only differences and comparisons
/// between instants of the same epoch are meaningful.
///
/// `Display` prints seconds with microsecond precision (`12.345678s`; a
/// formatter precision such as `{:.3}` overrides it); `Debug` prints full
/// nanosecond precision (`12.345678901s`).
#[derive(Copy, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The epoch itself.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant (used as "never").
    pub const MAX: Instant = Instant(u64::MAX);

    /// Nanoseconds since the epoch.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    #[inline]
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }

    /// Time elapsed from `earlier` to `self`, or `None` if `earlier` is later.
    #[inline]
    pub const fn checked_duration_since(self, earlier: Instant) -> Option<Duration> {
        match self.0.checked_sub(earlier.0) {
            Some(d) => Some(Duration(d)),
            None => None,
        }
    }
}

nanos_arith!(Instant {
    /// An instant `nanos` nanoseconds after the epoch.
    from_nanos(nanos) = 1;
    /// An instant `millis` milliseconds after the epoch (saturating).
    from_millis(millis) = NANOS_PER_MILLI;
    /// An instant `secs` seconds after the epoch (saturating).
    from_secs(secs) = NANOS_PER_SEC;
});

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating: zero if `earlier` is actually later than `self`.
    #[inline]
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_secs(f, self.0, f.precision().unwrap_or(6))
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_secs(f, self.0, f.precision().unwrap_or(9))
    }
}

/// A span of time in nanoseconds.
///
/// `Debug` and `Display` use the same compact, unit-scaled format as
/// `std::time::Duration`'s `Debug` (`1.5ms`, `250ns`, `12.345678s`).
#[derive(Copy, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(u64);

impl Duration {
    /// No time at all.
    pub const ZERO: Duration = Duration(0);
    /// The longest representable span (about 584 years; used as "never").
    pub const MAX: Duration = Duration(u64::MAX);

    /// Whole nanoseconds.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Whole microseconds (truncated).
    #[inline]
    pub const fn as_micros(self) -> u64 {
        self.0 / NANOS_PER_MICRO
    }

    /// Whole milliseconds (truncated).
    #[inline]
    pub const fn as_millis(self) -> u64 {
        self.0 / NANOS_PER_MILLI
    }

    /// Whole seconds (truncated).
    #[inline]
    pub const fn as_secs(self) -> u64 {
        self.0 / NANOS_PER_SEC
    }

    /// Seconds as a float (for statistics and human output).
    #[inline]
    pub fn as_secs_f64(self) -> f64 {
        (self.0 / NANOS_PER_SEC) as f64 + (self.0 % NANOS_PER_SEC) as f64 * 1e-9
    }

    /// `true` for a zero-length span.
    #[inline]
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// `self * n`, clamped to [`Duration::MAX`].
    #[inline]
    pub const fn saturating_mul(self, n: u64) -> Duration {
        Duration(self.0.saturating_mul(n))
    }
}

nanos_arith!(Duration {
    /// `nanos` nanoseconds.
    from_nanos(nanos) = 1;
    /// `micros` microseconds (saturating).
    from_micros(micros) = NANOS_PER_MICRO;
    /// `millis` milliseconds (saturating).
    from_millis(millis) = NANOS_PER_MILLI;
    /// `secs` seconds (saturating).
    from_secs(secs) = NANOS_PER_SEC;
});

impl Mul<u64> for Duration {
    type Output = Duration;
    /// Saturating: clamps to [`Duration::MAX`].
    #[inline]
    fn mul(self, n: u64) -> Duration {
        self.saturating_mul(n)
    }
}

impl From<std::time::Duration> for Duration {
    /// Saturates at [`Duration::MAX`] (std durations can be far longer).
    #[inline]
    fn from(d: std::time::Duration) -> Duration {
        Duration(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl From<Duration> for std::time::Duration {
    #[inline]
    fn from(d: Duration) -> std::time::Duration {
        std::time::Duration::from_nanos(d.0)
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&std::time::Duration::from_nanos(self.0), f)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&std::time::Duration::from_nanos(self.0), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_constructors() {
        assert_eq!(Instant::ZERO.as_nanos(), 0);
        assert_eq!(Instant::from_nanos(42).as_nanos(), 42);
        assert_eq!(Instant::from_millis(3).as_nanos(), 3_000_000);
        assert_eq!(Instant::from_secs(2).as_nanos(), 2_000_000_000);
        assert_eq!(Instant::from_secs(u64::MAX), Instant::MAX);
        assert_eq!(Instant::from_millis(u64::MAX), Instant::MAX);
        assert_eq!(Instant::default(), Instant::ZERO);
    }

    #[test]
    fn instant_arithmetic_saturates() {
        let t = Instant::from_secs(10);
        assert_eq!(t + Duration::from_secs(1), Instant::from_secs(11));
        assert_eq!(t - Duration::from_secs(1), Instant::from_secs(9));
        assert_eq!(t - Duration::from_secs(11), Instant::ZERO);
        assert_eq!(Instant::MAX + Duration::from_nanos(1), Instant::MAX);
        assert_eq!(t + Duration::MAX, Instant::MAX);
        assert_eq!(t - Instant::from_secs(4), Duration::from_secs(6));
        assert_eq!(Instant::from_secs(4) - t, Duration::ZERO);
        assert_eq!(
            t.saturating_duration_since(Instant::from_secs(3)),
            Duration::from_secs(7)
        );
        assert_eq!(Instant::ZERO.saturating_duration_since(t), Duration::ZERO);
        assert_eq!(t.checked_duration_since(Instant::from_secs(11)), None);
        assert_eq!(
            t.checked_add(Duration::from_nanos(5)),
            Some(Instant::from_nanos(10_000_000_005))
        );
        assert_eq!(Instant::MAX.checked_add(Duration::from_nanos(1)), None);
        assert_eq!(Instant::ZERO.checked_sub(Duration::from_nanos(1)), None);

        let mut u = t;
        u += Duration::from_millis(500);
        assert_eq!(u, Instant::from_millis(10_500));
        u -= Duration::from_millis(1_500);
        assert_eq!(u, Instant::from_secs(9));
    }

    #[test]
    fn instant_ordering_and_hash() {
        use std::collections::HashSet;
        let a = Instant::from_nanos(1);
        let b = Instant::from_nanos(2);
        assert!(a < b);
        assert_eq!(a.max(b), b);
        let set: HashSet<Instant> = [a, b, a].into_iter().collect();
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn instant_formatting() {
        let t = Instant::from_nanos(12_345_678_901);
        assert_eq!(t.to_string(), "12.345678s");
        assert_eq!(format!("{t:?}"), "12.345678901s");
        assert_eq!(format!("{t:.3}"), "12.345s");
        assert_eq!(format!("{t:.0}"), "12s");
        assert_eq!(Instant::ZERO.to_string(), "0.000000s");
        assert_eq!(Instant::from_millis(1).to_string(), "0.001000s");
        assert_eq!(format!("{:.12}", Instant::from_nanos(1)), "0.000000001s");
    }

    #[test]
    fn duration_constructors_and_accessors() {
        assert_eq!(Duration::from_micros(7).as_nanos(), 7_000);
        assert_eq!(Duration::from_millis(7).as_micros(), 7_000);
        assert_eq!(Duration::from_secs(7).as_millis(), 7_000);
        assert_eq!(Duration::from_millis(2_500).as_secs(), 2);
        assert_eq!(Duration::from_millis(2_500).as_secs_f64(), 2.5);
        assert_eq!(Duration::from_secs(u64::MAX), Duration::MAX);
        assert_eq!(Duration::from_micros(u64::MAX), Duration::MAX);
        assert!(Duration::ZERO.is_zero());
        assert!(!Duration::from_nanos(1).is_zero());
        assert_eq!(Duration::default(), Duration::ZERO);
    }

    #[test]
    fn duration_arithmetic_saturates() {
        let d = Duration::from_millis(5);
        assert_eq!(d + d, Duration::from_millis(10));
        assert_eq!(d - Duration::from_millis(6), Duration::ZERO);
        assert_eq!(Duration::MAX + d, Duration::MAX);
        assert_eq!(d * 3, Duration::from_millis(15));
        assert_eq!(d * u64::MAX, Duration::MAX);
        assert_eq!(d.saturating_mul(0), Duration::ZERO);
        assert_eq!(d.checked_add(Duration::MAX), None);
        assert_eq!(d.checked_sub(Duration::from_secs(1)), None);
        assert_eq!(d.max(Duration::from_millis(9)), Duration::from_millis(9));
        assert_eq!(d.min(Duration::from_millis(9)), d);
        let mut e = d;
        e += d;
        e -= Duration::from_millis(1);
        assert_eq!(e, Duration::from_millis(9));
    }

    #[test]
    fn duration_std_conversions() {
        let std_d = std::time::Duration::from_micros(1_234_567);
        let d: Duration = std_d.into();
        assert_eq!(d, Duration::from_micros(1_234_567));
        let back: std::time::Duration = d.into();
        assert_eq!(back, std_d);
        assert_eq!(Duration::from(std::time::Duration::MAX), Duration::MAX);
    }

    #[test]
    fn duration_formatting() {
        assert_eq!(Duration::from_micros(1_500).to_string(), "1.5ms");
        assert_eq!(format!("{:?}", Duration::from_nanos(250)), "250ns");
        assert_eq!(
            Duration::from_nanos(12_345_678_000).to_string(),
            "12.345678s"
        );
    }
}
