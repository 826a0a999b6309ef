//! Tunable policies: drift margin, retry backoff, renewal, and the options of a [`Locker`].
//!
//! [`Locker`]: crate::Locker

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::caps::Capabilities;
use crate::error::{Error, ErrorKind};
use crate::validity::Validity;

/// Name used in errors raised by the lock API itself rather than by a backend.
pub(crate) const API: &str = "leasehold";

/// The clock-drift margin subtracted from every lease: `ttl × factor + fixed`.
///
/// The default, `ttl × 0.01 + 2 ms`, is the Redlock proposal's. A lease's deadline is
/// `from + ttl − margin(ttl)`, where `from` is the instant before the request was sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drift {
    /// Proportional part, in `[0, 1)`.
    pub factor: f64,
    /// Fixed part.
    pub fixed: Duration,
}

impl Default for Drift {
    fn default() -> Self {
        Self {
            factor: 0.01,
            fixed: Duration::from_millis(2),
        }
    }
}

impl Drift {
    /// The margin for a lease of `ttl`. Never panics; an invalid factor counts as the whole TTL.
    pub fn margin(&self, ttl: Duration) -> Duration {
        // In whole nanoseconds, rounded up (a margin never shorter than the exact product):
        // `Duration::try_from_secs_f64` cost more than the rest of a lease's renewal
        // bookkeeping, and this runs once per lease per renewal. The cast saturates; below a
        // factor of 1 the product stays under `ttl`.
        let proportional = if (0.0..1.0).contains(&self.factor) {
            Duration::from_nanos((ttl.as_secs_f64() * 1e9 * self.factor).ceil() as u64)
        } else {
            ttl
        };
        proportional.saturating_add(self.fixed)
    }

    /// The deadline of a grant with this validity: `from + ttl − margin(ttl)`, or `from` itself
    /// when the margin eats the whole TTL.
    pub fn deadline(&self, v: Validity) -> Instant {
        let usable = v.ttl.saturating_sub(self.margin(v.ttl));
        v.from.checked_add(usable).unwrap_or(v.from)
    }

    fn validate(&self) -> Result<(), Error> {
        if !(self.factor.is_finite() && (0.0..1.0).contains(&self.factor)) {
            return Err(invalid(format!(
                "drift factor must be in [0, 1), got {}",
                self.factor
            )));
        }
        Ok(())
    }
}

/// Capped exponential backoff with full jitter, for retrying a contended lock.
///
/// The delay before retry `n` (counting from 1) is uniform in
/// `[0, min(max, initial × 2^(n−1))]`, so contenders desynchronise. A zero `initial` retries
/// at once (yielding to the runtime between attempts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Upper bound of the first delay.
    pub initial: Duration,
    /// Upper bound of every delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (1 for the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let cap = self.cap(attempt);
        let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }

    /// The upper bound of the delay before retry `attempt`.
    pub fn cap(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << shift)
            .unwrap_or(self.max)
            .min(self.max)
    }

    fn validate(&self) -> Result<(), Error> {
        if self.max < self.initial {
            return Err(invalid(format!(
                "backoff max {:?} is below its initial delay {:?}",
                self.max, self.initial
            )));
        }
        Ok(())
    }
}

/// Whether and how often the [`Locker`](crate::Locker)'s watchdog extends a held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Renewal {
    /// Never extend automatically: the lease expires after its TTL unless extended by hand.
    Off,
    /// Extend every `ttl / 3` (the default).
    #[default]
    Auto,
    /// Extend at this interval, which must be shorter than the TTL minus the drift margin.
    Every(Duration),
}

impl Renewal {
    /// The interval for a lease of `ttl`: `ttl / 3` ([`Auto`](Self::Auto)), the fixed interval
    /// ([`Every`](Self::Every)) while it is shorter than the usable lease (`ttl` minus the
    /// drift margin) and `ttl / 3` once a shorter TTL makes it too long; `None` when off.
    pub(crate) fn interval_for(self, ttl: Duration, drift: &Drift) -> Option<Duration> {
        match self {
            Self::Off => None,
            Self::Auto => Some(ttl / 3),
            Self::Every(d) if d < ttl.saturating_sub(drift.margin(ttl)) => Some(d),
            Self::Every(_) => Some(ttl / 3),
        }
    }
}

/// The least time automatic renewal needs between a renewal falling due and the lease's usable
/// deadline (a round trip to the server, and the scheduling of two busy cores): a TTL that
/// leaves less is refused when renewal is on. With [`Renewal::Auto`] and the default drift
/// margin, that makes 26 ms the shortest renewable TTL.
pub const MIN_RENEWAL_SLACK: Duration = Duration::from_millis(15);

/// How a [`Locker`](crate::Locker) acquires and keeps leases.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LockOptions {
    /// Lease duration (default 30 s).
    pub ttl: Duration,
    /// Automatic renewal (default [`Renewal::Auto`]: every `ttl / 3`). Backends whose grants
    /// live as long as a session ([`RenewalKind::Session`](crate::RenewalKind::Session)) keep
    /// them alive themselves; for those this only sets how often the lease re-confirms.
    pub renewal: Renewal,
    /// Retry delays when the backend has no native wait.
    pub backoff: Backoff,
    /// The drift margin subtracted from every validity.
    pub drift: Drift,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            renewal: Renewal::Auto,
            backoff: Backoff::default(),
            drift: Drift::default(),
        }
    }
}

impl LockOptions {
    /// Sets the lease duration.
    pub fn with_ttl(self, ttl: Duration) -> Self {
        Self { ttl, ..self }
    }

    /// Sets the renewal policy.
    pub fn with_renewal(self, renewal: Renewal) -> Self {
        Self { renewal, ..self }
    }

    /// Sets the retry backoff.
    pub fn with_backoff(self, backoff: Backoff) -> Self {
        Self { backoff, ..self }
    }

    /// Sets the drift margin.
    pub fn with_drift(self, drift: Drift) -> Self {
        Self { drift, ..self }
    }

    /// The watchdog interval, if renewal is on.
    pub fn renewal_interval(&self) -> Option<Duration> {
        match self.renewal {
            Renewal::Off => None,
            Renewal::Auto => Some(self.ttl / 3),
            Renewal::Every(d) => Some(d),
        }
    }

    /// Checks the options against a backend's capabilities.
    ///
    /// With renewal on, a TTL whose renewal cannot come at least [`MIN_RENEWAL_SLACK`] before
    /// the lease's usable deadline is refused: it would expire between two renewals, however
    /// fast the server.
    pub fn validate(&self, caps: &Capabilities) -> Result<(), Error> {
        self.drift.validate()?;
        self.backoff.validate()?;
        check_ttl(self.ttl, &self.drift, caps)?;
        if caps.renewal == crate::caps::RenewalKind::Extend
            && let Some(interval) = self.renewal_interval()
        {
            let usable = self.ttl.saturating_sub(self.drift.margin(self.ttl));
            if usable.saturating_sub(interval) < MIN_RENEWAL_SLACK {
                return Err(invalid(format!(
                    "ttl {:?} is too short to be kept by renewal: renewing every {interval:?} \
                     leaves less than {MIN_RENEWAL_SLACK:?} before the usable lease ({usable:?}, \
                     ttl minus drift margin) ends; use a longer ttl or Renewal::Off",
                    self.ttl
                )));
            }
        }
        if let Renewal::Every(d) = self.renewal {
            let usable = self.ttl.saturating_sub(self.drift.margin(self.ttl));
            if d.is_zero() || d >= usable {
                return Err(invalid(format!(
                    "renewal interval {d:?} must be positive and shorter than the usable lease \
                     ({usable:?} = ttl {:?} minus drift margin)",
                    self.ttl
                )));
            }
        }
        Ok(())
    }
}

/// Checks a TTL: positive, longer than its drift margin, within the backend's range.
pub(crate) fn check_ttl(ttl: Duration, drift: &Drift, caps: &Capabilities) -> Result<(), Error> {
    if ttl.is_zero() {
        return Err(invalid("ttl must be positive, got 0"));
    }
    let margin = drift.margin(ttl);
    if ttl <= margin {
        return Err(invalid(format!(
            "ttl {ttl:?} is not longer than its drift margin {margin:?}: the lease would never \
             be valid"
        )));
    }
    if ttl < caps.min_ttl || ttl > caps.max_ttl {
        return Err(invalid(format!(
            "ttl {ttl:?} is outside the backend's range {:?}..={:?}",
            caps.min_ttl, caps.max_ttl
        )));
    }
    Ok(())
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, API, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::{FencingKind, SafetyClass};

    #[test]
    fn a_ttl_renewal_cannot_keep_is_refused() {
        let caps = Capabilities::new("test", SafetyClass::Efficiency, FencingKind::None);
        let ms = Duration::from_millis;
        let auto = |ttl| LockOptions::default().with_ttl(ttl).validate(&caps);
        let e = auto(ms(20)).unwrap_err();
        assert!(
            e.to_string().contains("too short to be kept by renewal"),
            "{e}"
        );
        assert!(auto(ms(5)).is_err());
        assert!(auto(ms(30)).is_ok());
        let off = LockOptions::default()
            .with_ttl(ms(5))
            .with_renewal(Renewal::Off);
        assert!(
            off.validate(&caps).is_ok(),
            "without renewal a short TTL is fine"
        );
        // A backend that keeps grants alive itself declares its own minimum.
        let session = caps.with_renewal(crate::caps::RenewalKind::Session);
        assert!(
            LockOptions::default()
                .with_ttl(ms(5))
                .validate(&session)
                .is_ok()
        );
        // Every(d) on a shorter TTL falls back to ttl / 3.
        let d = Drift::default();
        assert_eq!(
            Renewal::Every(ms(500)).interval_for(ms(300), &d),
            Some(ms(100))
        );
        assert_eq!(
            Renewal::Every(ms(50)).interval_for(ms(300), &d),
            Some(ms(50))
        );
    }

    #[test]
    fn drift_margin_is_one_percent_plus_two_ms() {
        let d = Drift::default();
        assert_eq!(
            d.margin(Duration::from_secs(10)),
            Duration::from_millis(102)
        );
        let from = Instant::now();
        assert_eq!(
            d.deadline(Validity::new(from, Duration::from_secs(10))),
            from + Duration::from_millis(9_898)
        );
        // Rounded up to the nanosecond, never below the exact product.
        let third = Drift {
            factor: 1.0 / 3.0,
            fixed: Duration::ZERO,
        };
        assert_eq!(
            third.margin(Duration::from_nanos(10)),
            Duration::from_nanos(4)
        );
        assert_eq!(third.margin(Duration::from_secs(3)), Duration::from_secs(1));
        // Never panics: an absurd TTL saturates, an invalid factor takes the whole TTL.
        assert!(d.margin(Duration::MAX) > Duration::from_secs(1 << 30));
        for factor in [f64::NAN, -0.5, 1.0, f64::INFINITY] {
            let bad = Drift {
                factor,
                fixed: Duration::ZERO,
            };
            assert_eq!(bad.margin(Duration::from_secs(3)), Duration::from_secs(3));
        }
    }

    #[test]
    fn backoff_is_capped_and_jittered_and_zero_works() {
        let b = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        assert_eq!(b.cap(1), Duration::from_millis(10));
        assert_eq!(b.cap(3), Duration::from_millis(40));
        assert_eq!(b.cap(40), Duration::from_millis(100));
        for n in 1..50 {
            assert!(b.delay(n) <= b.cap(n));
        }
        let zero = Backoff {
            initial: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert_eq!(zero.delay(7), Duration::ZERO);
    }

    #[test]
    fn bad_options_are_typed_errors() {
        let caps = Capabilities::new("test", SafetyClass::Process, FencingKind::Monotonic);
        for opts in [
            LockOptions::default().with_ttl(Duration::ZERO),
            LockOptions::default().with_ttl(Duration::from_millis(2)),
            LockOptions::default().with_ttl(Duration::from_secs(86_400 * 365 * 100)),
            LockOptions::default().with_renewal(Renewal::Every(Duration::from_secs(60))),
            LockOptions::default().with_drift(Drift {
                factor: f64::NAN,
                fixed: Duration::ZERO,
            }),
            LockOptions::default().with_backoff(Backoff {
                initial: Duration::from_secs(2),
                max: Duration::from_secs(1),
            }),
        ] {
            let err = opts.validate(&caps).err();
            assert_eq!(
                err.as_ref().map(Error::kind),
                Some(ErrorKind::InvalidArgument),
                "{opts:?}"
            );
        }
        assert!(LockOptions::default().validate(&caps).is_ok());
    }
}
