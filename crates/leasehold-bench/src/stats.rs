//! Latency summaries.

use std::time::Duration;

use tokio::time::Instant;

/// One acquisition in a contention run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    /// The task that took it.
    pub(crate) task: usize,
    /// When it asked.
    pub(crate) asked: Instant,
    /// When it was granted.
    pub(crate) got: Instant,
    /// When it called `release()`: a grant to another task before this is two holders at once.
    pub(crate) releasing: Instant,
    /// When `release()` returned: handoffs count from here.
    pub(crate) freed: Instant,
}

/// p50, p99 and rate of a set of cycle latencies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Summary {
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    /// Cycles per second of wall time (sequential cycles: 1 / mean).
    pub(crate) per_sec: f64,
}

impl Summary {
    pub(crate) fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let n = samples.len();
        let at = |q: f64| {
            let i = ((n as f64 - 1.0) * q).round() as usize;
            samples.get(i).copied().unwrap_or_default()
        };
        let total: Duration = samples.iter().sum();
        Self {
            p50: at(0.5),
            p99: at(0.99),
            per_sec: if total.is_zero() {
                0.0
            } else {
                n as f64 / total.as_secs_f64()
            },
        }
    }
}

/// The median and range of a few figures (one per repeat of a measurement).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Spread {
    /// The middle figure (the mean of the two middle ones for an even count).
    pub(crate) median: f64,
    /// The smallest figure.
    pub(crate) min: f64,
    /// The largest figure.
    pub(crate) max: f64,
}

impl Spread {
    /// Of `xs` (sorted in place; NaN sorts last). All zero when empty.
    pub(crate) fn of(xs: &mut [f64]) -> Self {
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        if n == 0 {
            return Self {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        let median = if n % 2 == 1 {
            xs[n / 2]
        } else {
            (xs[n / 2 - 1] + xs[n / 2]) / 2.0
        };
        Self {
            median,
            min: xs[0],
            max: xs[n - 1],
        }
    }

    /// As a ratio: `1.07× [1.02–1.11×]` (no range for a single figure).
    pub(crate) fn times(&self) -> String {
        if self.min == self.max {
            format!("{:.3}×", self.median)
        } else {
            format!("{:.3}× [{:.2}–{:.2}×]", self.median, self.min, self.max)
        }
    }
}

/// Formats a duration in ms with three decimals.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_gives_median_and_range() {
        let s = Spread::of(&mut [1.3, 1.1, 1.2]);
        assert_eq!((s.median, s.min, s.max), (1.2, 1.1, 1.3));
        let s = Spread::of(&mut [1.4, 1.0, 1.2, 1.1]);
        assert!((s.median - 1.15).abs() < 1e-12, "{s:?}");
        assert_eq!(s.times(), "1.150× [1.00–1.40×]");
        assert_eq!(Spread::of(&mut [1.0]).times(), "1.000×");
        let empty = Spread::of(&mut []);
        assert_eq!((empty.median, empty.min, empty.max), (0.0, 0.0, 0.0));
    }
}
