//! What a backend guarantees and can do.

use std::fmt;
use std::time::Duration;

/// How far a backend's mutual exclusion can be trusted: for efficiency (a lost lock costs
/// duplicate work) or for correctness (a lost lock corrupts data), as the crate docs explain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SafetyClass {
    /// Exact, but only among the users of one process (the in-memory backend).
    Process,
    /// Exact among the processes of one host (operating-system file locks), and nothing beyond.
    Host,
    /// Right almost always; a fault (node restart without persistence, a pause or a network
    /// delay past the TTL, clock jumps) can let two holders overlap. Good for avoiding duplicate
    /// work, not for protecting data.
    Efficiency,
    /// Backed by consensus or a transactional database: together with fencing-token checks at the
    /// resource, a lost lease cannot corrupt data.
    Correctness,
}

impl fmt::Display for SafetyClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Process => "process",
            Self::Host => "host",
            Self::Efficiency => "efficiency",
            Self::Correctness => "correctness",
        })
    }
}

/// What kind of fencing token a backend mints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FencingKind {
    /// No token: [`Lease::fencing_token`](crate::Lease::fencing_token) is always `None`.
    None,
    /// A counter that increases while the server keeps its data, but can go back if it loses
    /// it (single-node Redis without persistence).
    BestEffort,
    /// Strictly increasing per key across all grants, durable (a database sequence, a Raft
    /// revision, or a process-wide counter for the in-memory backend).
    Monotonic,
}

impl FencingKind {
    /// Whether leases carry a token at all.
    pub fn mints_tokens(self) -> bool {
        !matches!(self, Self::None)
    }
}

/// How a backend waits for a held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitKind {
    /// No native wait: [`Locker`](crate::Locker) retries with capped, fully jittered backoff.
    Poll,
    /// [`LockBackend::wait_lock`](crate::LockBackend::wait_lock) waits natively (a server-side
    /// queue, or a wake-up on release).
    Native,
}

/// How a held grant stays alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RenewalKind {
    /// The grant expires after its TTL unless [`extend`](crate::LockBackend::extend)ed; the
    /// [`Locker`](crate::Locker) watchdog can do that.
    Extend,
    /// The backend keeps grants alive itself (a database session, a kept-alive lease) and reports
    /// their validity and loss through the [`LeaseMonitor`](crate::LeaseMonitor); `extend` only
    /// confirms the grant is still held.
    ///
    /// For these backends the requested TTL does not end the grant: it lasts as long as the
    /// session (or session lease) that holds it. The TTL only caps the validity the backend
    /// *reports* (a lease's deadline never lies beyond `started + ttl − drift`), and
    /// [`Capabilities::min_ttl`] is the backend's own validity window (one health-check or
    /// keep-alive period plus its timeout), so a shorter TTL is refused rather than silently
    /// stretched. How long a crashed holder keeps the lock is the backend's liveness rule
    /// (session end, session lease TTL), documented by each driver.
    Session,
}

/// How long a lock outlives a holder that crashed (SIGKILL, power loss) without releasing it:
/// the backend's liveness bound, shown by `leasehold status`. See
/// [`Capabilities::crash_release_bound`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrashRelease {
    /// Within the lease's TTL: the grant expires on the server unless renewed (Redis, Redlock).
    Ttl,
    /// Within the lease's TTL rounded up to a whole multiple of `step`, and at least `min` (etcd:
    /// a session lease per distinct TTL, in whole seconds, no shorter than the server allows).
    TtlRoundedUp {
        /// The server's granularity.
        step: Duration,
        /// The shortest lease the backend grants.
        min: Duration,
    },
    /// When the holder's process ends: the operating system drops the lock (`flock`) or closes
    /// the session's connection, whatever the TTL (file, PostgreSQL, memory). A host that
    /// vanishes without closing its connections is noticed by the server's TCP keepalive.
    ProcessExit,
}

impl CrashRelease {
    /// The bound for a lease of `ttl`: `None` for [`ProcessExit`](Self::ProcessExit) (no TTL
    /// is involved).
    pub fn bound(self, ttl: Duration) -> Option<Duration> {
        match self {
            Self::Ttl => Some(ttl),
            Self::TtlRoundedUp { step, min } => {
                let step_ns = step.as_nanos().max(1);
                let steps = ttl.as_nanos().div_ceil(step_ns);
                let rounded = u64::try_from(steps.saturating_mul(step_ns))
                    .map_or(Duration::MAX, Duration::from_nanos);
                Some(rounded.max(min))
            }
            Self::ProcessExit => None,
        }
    }

    /// A phrase for a lease of `ttl`: `"within 5s (the TTL)"`, `"when the holder's process
    /// exits"`.
    pub fn describe(self, ttl: Duration) -> String {
        match (self, self.bound(ttl)) {
            (Self::Ttl, Some(b)) => format!("within {b:?} (the TTL)"),
            (Self::TtlRoundedUp { .. }, Some(b)) => {
                format!("within {b:?} (the TTL rounded up to the server's lease granularity)")
            }
            _ => "when the holder's process exits (the lock dies with its session)".to_owned(),
        }
    }
}

/// The longest TTL a backend accepts unless it declares otherwise: one day. A lease meant to last
/// longer should be renewed.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// What a backend guarantees and supports, declared by the backend and checked by
/// configuration (`require = "correctness"`) and by the conformance suite.
///
/// Build one with [`Capabilities::new`] and the `with_*` methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The backend's short, stable name: `"memory"`, `"file"`, `"redis"`, `"redlock"`,
    /// `"postgres"`, `"etcd"` (errors, leases, logs and metrics carry it).
    pub name: &'static str,
    /// How far mutual exclusion can be trusted.
    pub safety: SafetyClass,
    /// What fencing tokens the backend mints.
    pub fencing: FencingKind,
    /// Whether waiting is native or by polling.
    pub wait: WaitKind,
    /// How grants stay alive.
    pub renewal: RenewalKind,
    /// The shortest TTL the backend honours.
    pub min_ttl: Duration,
    /// The longest TTL the backend accepts.
    pub max_ttl: Duration,
    /// How long a lock outlives a crashed holder (see
    /// [`crash_release_bound`](Self::crash_release_bound)).
    pub crash_release: CrashRelease,
    /// Whether [`LockBackend::semaphore`](crate::LockBackend::semaphore) gives permit views.
    pub semaphores: bool,
    /// Whether [`LockBackend::election`](crate::LockBackend::election) gives election views.
    pub elections: bool,
}

impl Capabilities {
    /// Capabilities of the backend `name` with the given safety and fencing, polling for
    /// waits, TTL renewal by `extend`, TTLs from 1 ms to [`DEFAULT_MAX_TTL`], a crashed
    /// holder's lock freed within the TTL ([`CrashRelease::Ttl`]), and neither semaphores nor
    /// elections.
    pub const fn new(name: &'static str, safety: SafetyClass, fencing: FencingKind) -> Self {
        Self {
            name,
            safety,
            fencing,
            wait: WaitKind::Poll,
            renewal: RenewalKind::Extend,
            min_ttl: Duration::from_millis(1),
            max_ttl: DEFAULT_MAX_TTL,
            crash_release: CrashRelease::Ttl,
            semaphores: false,
            elections: false,
        }
    }

    /// Sets how long a lock outlives a crashed holder.
    pub const fn with_crash_release(mut self, crash_release: CrashRelease) -> Self {
        self.crash_release = crash_release;
        self
    }

    /// How long after its holder crashed a lock of `ttl` is free again at most (network and
    /// server delays aside); `None` when it is freed as the holder's process ends.
    pub fn crash_release_bound(&self, ttl: Duration) -> Option<Duration> {
        self.crash_release.bound(ttl)
    }

    /// Says the backend gives semaphores.
    pub const fn with_semaphores(mut self) -> Self {
        self.semaphores = true;
        self
    }

    /// Says the backend gives leader elections.
    pub const fn with_elections(mut self) -> Self {
        self.elections = true;
        self
    }

    /// Says the backend gives neither semaphores nor elections: what a view of one primitive
    /// over a backend (a permit view, an election view) or a wrapper that refuses both declares,
    /// keeping every other capability of the backend it wraps.
    pub const fn without_primitives(mut self) -> Self {
        self.semaphores = false;
        self.elections = false;
        self
    }

    /// Sets the name (a wrapper that reports under a name of its own).
    pub const fn with_name(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// Sets how the backend waits.
    pub const fn with_wait(mut self, wait: WaitKind) -> Self {
        self.wait = wait;
        self
    }

    /// Sets how grants stay alive.
    pub const fn with_renewal(mut self, renewal: RenewalKind) -> Self {
        self.renewal = renewal;
        self
    }

    /// Sets the range of accepted TTLs.
    pub const fn with_ttl_range(mut self, min: Duration, max: Duration) -> Self {
        self.min_ttl = min;
        self.max_ttl = max;
        self
    }

    /// Why this backend cannot serve correctness locks, or `None` if it can.
    ///
    /// Correctness needs both consensus-grade (or transactional) safety and strictly increasing,
    /// durable fencing tokens.
    pub fn correctness_gap(&self) -> Option<String> {
        let mut why = Vec::new();
        match self.safety {
            SafetyClass::Correctness => {}
            SafetyClass::Process => {
                why.push("mutual exclusion holds only within one process".to_owned())
            }
            SafetyClass::Host => why.push("mutual exclusion holds only on one host".to_owned()),
            SafetyClass::Efficiency => why
                .push("safety depends on bounded clock drift, pauses and network delay".to_owned()),
        }
        match self.fencing {
            FencingKind::Monotonic => {}
            FencingKind::BestEffort => {
                why.push("fencing tokens can go back if the server loses its data".to_owned())
            }
            FencingKind::None => why.push("no fencing token".to_owned()),
        }
        if why.is_empty() {
            None
        } else {
            Some(why.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_release_bounds() {
        let s = Duration::from_secs;
        let etcd = CrashRelease::TtlRoundedUp {
            step: s(1),
            min: s(2),
        };
        assert_eq!(etcd.bound(Duration::from_millis(300)), Some(s(2)));
        assert_eq!(etcd.bound(Duration::from_millis(3_001)), Some(s(4)));
        assert_eq!(etcd.bound(s(5)), Some(s(5)));
        assert_eq!(etcd.bound(Duration::MAX), Some(Duration::MAX));
        assert_eq!(CrashRelease::Ttl.bound(s(5)), Some(s(5)));
        assert_eq!(CrashRelease::ProcessExit.bound(s(5)), None);
        assert!(
            CrashRelease::ProcessExit
                .describe(s(1))
                .contains("process exits")
        );
    }

    #[test]
    fn correctness_gap_names_each_missing_property() {
        let ok = Capabilities::new("test", SafetyClass::Correctness, FencingKind::Monotonic);
        assert_eq!(ok.correctness_gap(), None);
        let redlock = Capabilities::new("test", SafetyClass::Efficiency, FencingKind::None);
        let gap = redlock.correctness_gap().unwrap_or_default();
        assert!(gap.contains("no fencing token"), "{gap}");
        assert!(gap.contains("clock drift"), "{gap}");
        let redis = Capabilities::new("test", SafetyClass::Efficiency, FencingKind::BestEffort);
        assert!(
            redis
                .correctness_gap()
                .unwrap_or_default()
                .contains("loses its data")
        );
    }
}
