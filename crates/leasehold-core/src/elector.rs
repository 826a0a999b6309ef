//! [`Elector`]: campaign for the leadership of a key, learn who leads, watch the changes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::election::{Candidate, ElectionBackend, Leader};
use crate::error::{Error, ErrorKind};
use crate::key::{IntoLockKey, LockKey};
use crate::lease::Lease;
use crate::locker::Locker;
use crate::loss::LossReason;
use crate::policy::{Backoff, LockOptions};
use crate::signal::LostSignal;
use crate::token::FencingToken;

/// How long one wait of a campaign or a watch lasts before it starts over (a campaign is
/// endless; the chunks only bound each backend call).
const CHUNK: Duration = Duration::from_secs(30);

/// The pause after a transient failure of a campaign or a watch grows up to this.
const FAULT_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(1),
};

/// One candidate in the leader election of one key.
///
/// Built over a backend's election view ([`LockBackend::election`]) and a [`Locker`] over
/// that view, with the usual [`LockOptions`] (TTL, renewal, backoff): a leadership is a
/// [`Lease`] of the view, so it renews, signals loss and releases on drop like any lease.
///
/// ```
/// # async fn demo() -> Result<(), leasehold_core::Error> {
/// use std::sync::Arc;
/// use leasehold_core::{Candidate, Elector, LockOptions, MemoryBackend};
///
/// let backend = Arc::new(MemoryBackend::new());
/// let me = Elector::new(backend, "scheduler", Candidate::new("10.0.0.7:8080")?, LockOptions::default())?;
/// let leadership = me.campaign().await?;
/// assert_eq!(me.leader().await?.map(|l| l.term), Some(leadership.term()));
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Elector {
    key: LockKey,
    view: Arc<dyn ElectionBackend>,
    locker: Locker,
}

impl fmt::Debug for Elector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Elector")
            .field("key", &self.key)
            .field("candidate", self.view.candidate())
            .field("backend", &self.locker.capabilities().name)
            .finish()
    }
}

impl Elector {
    /// A candidate publishing `candidate` in the election of `key` on `backend`. Fails with
    /// [`ErrorKind::Unsupported`] when the backend gives no elections (its reason in the
    /// message), or with the options' or key's error.
    pub fn new(
        backend: Arc<dyn LockBackend>,
        key: impl IntoLockKey,
        candidate: Candidate,
        options: LockOptions,
    ) -> Result<Self, Error> {
        let name = backend.capabilities().name;
        let key = key
            .into_lock_key()
            .map_err(|e| Error::invalid_key(name, e))?;
        let view = backend.election(candidate)?;
        let as_lock: Arc<dyn LockBackend> = view.clone();
        let locker = Locker::from_arc(as_lock).with_options(options)?;
        Ok(Self { key, view, locker })
    }

    /// The key elected for.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The value published while leader.
    pub fn candidate(&self) -> &Candidate {
        self.view.candidate()
    }

    /// The locker over the election view (its options and capabilities).
    pub fn locker(&self) -> &Locker {
        &self.locker
    }

    /// Waits to become leader, for as long as it takes: transient backend failures are logged
    /// and retried with backoff. Only a permanent error (an unsupported backend, bad options)
    /// ends it; drop the future to stop campaigning. Call again after a leadership ends.
    pub async fn campaign(&self) -> Result<Leadership, Error> {
        self.campaign_until(None).await
    }

    /// [`campaign`](Self::campaign), giving up with [`ErrorKind::Timeout`] after `wait`.
    pub async fn campaign_for(&self, wait: Duration) -> Result<Leadership, Error> {
        self.campaign_until(Some(Instant::now() + wait)).await
    }

    async fn campaign_until(&self, deadline: Option<Instant>) -> Result<Leadership, Error> {
        let mut faults = 0u32;
        loop {
            let now = Instant::now();
            let chunk = deadline.map_or(CHUNK, |d| d.saturating_duration_since(now).min(CHUNK));
            match self.locker.acquire(&self.key, chunk).await {
                Ok(lease) => return self.leadership(lease),
                Err(e) if permanent(&e) => return Err(e),
                Err(e) if deadline.is_some_and(|d| Instant::now() >= d) => return Err(e),
                // A quiet chunk (the acquire retried its own faults within it): start over.
                Err(e) if e.kind() == ErrorKind::Timeout => faults = 0,
                Err(e) => {
                    faults += 1;
                    tracing::warn!(key = %self.key, error = %e, "leasehold.campaign: retrying after a fault");
                    let pause = FAULT_BACKOFF.delay(faults);
                    match deadline {
                        Some(d) => tokio::time::sleep_until((Instant::now() + pause).min(d)).await,
                        None => tokio::time::sleep(pause).await,
                    }
                }
            }
        }
    }

    fn leadership(&self, lease: Lease) -> Result<Leadership, Error> {
        match lease.fencing_token() {
            Some(term) => Ok(Leadership {
                lease,
                term,
                value: self.candidate().clone(),
            }),
            None => Err(Error::new(
                ErrorKind::Unsupported,
                lease.backend_name(),
                "the election view granted a leadership without a term",
            )),
        }
    }

    /// The current leader (value and term), if any.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        self.view.leader(&self.key).await
    }

    /// The current leader now, then every change (another value or term, or none) as it is
    /// seen, through a [`watch::Receiver`]. A background task observes the backend (natively
    /// where it can, else by polling), retrying after faults, until every receiver is dropped.
    /// Changes closer together than one observation may be seen as one.
    pub async fn watch(&self) -> Result<watch::Receiver<Option<Leader>>, Error> {
        let first = self.leader().await?;
        let (tx, rx) = watch::channel(first.clone());
        let (view, key) = (Arc::clone(&self.view), self.key.clone());
        tokio::spawn(async move {
            let mut last = first;
            let mut faults = 0u32;
            loop {
                let deadline = Instant::now() + CHUNK;
                tokio::select! {
                    () = tx.closed() => return,
                    seen = view.observe(&key, last.as_ref(), deadline) => match seen {
                        Ok(now) => {
                            faults = 0;
                            if now != last {
                                last.clone_from(&now);
                                tx.send_replace(now);
                            }
                        }
                        Err(e) => {
                            faults += 1;
                            tracing::debug!(key = %key, error = %e, "leasehold.watch: retrying");
                            tokio::time::sleep(FAULT_BACKOFF.delay(faults)).await;
                        }
                    },
                }
            }
        });
        Ok(rx)
    }
}

/// Errors no retry can fix: the campaign stops with them.
fn permanent(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::InvalidKey
            | ErrorKind::InvalidArgument
            | ErrorKind::InvalidConfig
            | ErrorKind::Unsupported
    )
}

/// A leadership won by [`Elector::campaign`]: a [`Lease`] of the election view whose fencing
/// token is the term. Dropping it resigns in the background, like dropping a lease.
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
    term: FencingToken,
    value: Candidate,
}

impl Leadership {
    /// The term: strictly greater than every earlier leader's of this key. Hand it to fenced
    /// resources.
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// The value published.
    pub fn value(&self) -> &Candidate {
        &self.value
    }

    /// The lease underneath (validity, renewal, [`Lease::run`]).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Whether the leadership is lost.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Why it was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.lease.loss_reason()
    }

    /// Completes when the leadership is lost.
    pub fn lost(&self) -> LostSignal {
        self.lease.lost()
    }

    /// Steps down at once so the next candidate can lead: `Ok(true)` if we were still leader.
    /// Errors as [`Lease::release`].
    pub async fn resign(self) -> Result<bool, Error> {
        self.lease.release().await
    }

    /// The lease, for code that wants to keep it.
    pub fn into_lease(self) -> Lease {
        self.lease
    }
}
