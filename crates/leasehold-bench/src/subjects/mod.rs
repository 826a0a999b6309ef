//! The one set of implementations ("subjects") every measurement runs: leasehold's backends
//! through `Locker` ([`Ours`]), the raw protocol cycles ([`raw`], one client per protocol) and
//! the peer crates (`peers`, with `--features peers`), with how to count what each left on
//! the servers ([`Count`]).
//!
//! A [`Client`] is what one task (or one process) holds: a `Locker`, a connection, a peer
//! crate's manager. A [`Subject`] makes clients: one shared by every task when the
//! implementation multiplexes (a `Locker`, a redis-rs multiplexed connection), one per task when
//! it holds a session per lock or is meant to model separate processes.

mod count;
#[cfg(feature = "peers")]
pub(crate) mod peers;
pub(crate) mod raw;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LockBackend, LockOptions, Locker, Renewal};
use tokio::time::Instant;

use crate::harness::{BoxError, held_for};
pub(crate) use count::Count;

/// A boxed, sendable future.
pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// TTL of every lease taken by the benchmark.
pub(crate) const TTL: Duration = Duration::from_secs(30);

/// What a contender asks for: `key`, waiting up to `wait`, holding it for `hold`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold<'a> {
    pub(crate) key: &'a str,
    pub(crate) wait: Duration,
    pub(crate) hold: Duration,
}

/// The instants a hold was granted and released.
pub(crate) type Held = Result<(Instant, Instant), BoxError>;

/// One lock client, as implementations write it.
pub(crate) trait Lock: Send + Sync {
    /// One try-acquire + release of an uncontended `key`; an error if it was not granted.
    fn cycle(&self, key: &str) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Waits for the key, holds it, releases it.
    fn hold(&self, h: Hold<'_>) -> impl Future<Output = Held> + Send;

    /// The `Locker` behind this client, if it is ours (scenarios that drive acquire and
    /// release apart).
    fn locker(&self) -> Option<&Locker> {
        None
    }
}

/// One lock client, as the scenarios hold it (`Arc<dyn Client>`): every [`Lock`] is one.
pub(crate) trait Client: Send + Sync {
    /// [`Lock::cycle`].
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>>;

    /// [`Lock::hold`].
    fn hold<'a>(&'a self, h: Hold<'a>) -> BoxFut<'a, Held>;

    /// [`Lock::locker`].
    fn locker(&self) -> Option<&Locker>;
}

impl<T: Lock> Client for T {
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>> {
        Box::pin(Lock::cycle(self, key))
    }

    fn hold<'a>(&'a self, h: Hold<'a>) -> BoxFut<'a, Held> {
        Box::pin(Lock::hold(self, h))
    }

    fn locker(&self) -> Option<&Locker> {
        Lock::locker(self)
    }
}

/// The hold most clients share: `acquire` bounded by the wait (`what` names the client in
/// the error), then the hold, then `release` of what it granted.
pub(crate) async fn acquire_hold_release<G, R>(
    what: &str,
    h: Hold<'_>,
    acquire: impl Future<Output = Result<G, BoxError>>,
    release: impl FnOnce(G) -> R,
) -> Held
where
    R: Future<Output = Result<(), BoxError>>,
{
    let granted = tokio::time::timeout(h.wait, acquire)
        .await
        .map_err(|_| format!("{what}: not granted within the wait budget"))??;
    let held = held_for(h.hold).await;
    release(granted).await?;
    Ok(held)
}

/// Which side of a comparison a subject is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A leasehold backend (through `Locker`, unless its label says otherwise).
    Ours,
    /// The raw protocol cycle: the physical limit.
    Raw,
    /// A peer crate.
    Peer,
    /// A tool of the server's own (redis-benchmark): a reference, not a lock.
    Tool,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Ours => "ours",
            Self::Raw => "raw",
            Self::Peer => "peer",
            Self::Tool => "tool",
        }
    }
}

/// Makes a client.
pub(crate) type MakeClient =
    Box<dyn Fn() -> BoxFut<'static, Result<Arc<dyn Client>, BoxError>> + Send + Sync>;

/// A [`MakeClient`] from an async constructor.
pub(crate) fn make<F, Fut, C>(f: F) -> MakeClient
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<C, BoxError>> + Send + 'static,
    C: Client + 'static,
{
    Box::new(move || {
        let fut = f();
        Box::pin(async move { Ok(Arc::new(fut.await?) as Arc<dyn Client>) })
    })
}

/// One implementation under test.
pub(crate) struct Subject {
    pub(crate) label: String,
    pub(crate) kind: Kind,
    /// Whether the tasks of one process share one client (else: one client per task).
    pub(crate) shared: bool,
    pub(crate) make: MakeClient,
    pub(crate) count: Count,
}

impl Subject {
    pub(crate) fn new(
        label: impl Into<String>,
        kind: Kind,
        shared: bool,
        make: MakeClient,
        count: Count,
    ) -> Self {
        Self {
            label: label.into(),
            kind,
            shared,
            make,
            count,
        }
    }

    /// What this subject left on the servers, or `None` when that cannot be counted.
    pub(crate) async fn leftovers(&self) -> Result<Option<u64>, BoxError> {
        self.count.leftovers().await
    }
}

/// A leasehold backend through `Locker` (no renewal: cycles are far shorter than the TTL).
pub(crate) struct Ours(pub(crate) Locker);

impl Ours {
    /// `backend` behind a `Locker` with the bench's TTL and no renewal.
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Result<Self, BoxError> {
        Ok(Self(
            Locker::from_arc(backend).with_options(
                LockOptions::default()
                    .with_ttl(TTL)
                    .with_renewal(Renewal::Off),
            )?,
        ))
    }
}

/// An error unless a release found the lease still held.
pub(crate) fn released(still_held: bool) -> Result<(), BoxError> {
    if still_held {
        Ok(())
    } else {
        Err("release reported the lease not held".into())
    }
}

impl Lock for Ours {
    async fn cycle(&self, key: &str) -> Result<(), BoxError> {
        let lease = self.0.try_acquire(key).await?;
        let lease = lease.ok_or("an uncontended key was not granted")?;
        released(lease.release().await?)
    }

    async fn hold(&self, h: Hold<'_>) -> Held {
        let lease = self.0.acquire(h.key, h.wait).await?;
        let held = held_for(h.hold).await;
        released(lease.release().await?)?;
        Ok(held)
    }

    fn locker(&self) -> Option<&Locker> {
        Some(&self.0)
    }
}
