//! Latency summaries.

use std::time::Duration;

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

/// Formats a duration in ms with three decimals.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}
