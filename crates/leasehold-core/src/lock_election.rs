//! An election view built from a lock and a place to publish the leader's value: what the
//! memory, file and Redis backends give.
//!
//! The leadership is a grant of a lock backend kept for elections only (its own names, so it
//! never collides with the lock of the same key); its fencing token is the term. Once granted,
//! the candidate's value is published in a [`LeaderStore`] under its owner value;
//! [`leader`](ElectionBackend::leader) reports the lock's holder with the value published under
//! that holder's owner, so a value left behind by an earlier leader is never mistaken for the
//! current one. Watching is by polling ([`poll_leader`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{Grant, Held, LockBackend, LockRequest, Waited};
use crate::election::{Candidate, ElectionBackend, Leader, poll_leader};
use crate::error::{Error, ErrorKind};
use crate::key::LockKey;
use crate::token::Owner;
use crate::view::View;

/// Where a [`LockElection`] publishes the leader's value, by key.
#[async_trait]
pub trait LeaderStore: Send + Sync + fmt::Debug + 'static {
    /// Records `value` as published by `owner`, which was just granted the leadership of `key`
    /// (replacing whatever was stored for `key`).
    async fn publish(&self, key: &LockKey, owner: &Owner, value: &Candidate) -> Result<(), Error>;

    /// The value stored for `key` and the owner that published it.
    async fn read(&self, key: &LockKey) -> Result<Option<(Owner, Candidate)>, Error>;

    /// Removes the value stored for `key` if `owner` published it.
    async fn clear(&self, key: &LockKey, owner: &Owner) -> Result<(), Error>;
}

/// How often [`LockElection::leader`] looks again when the holder's value is not published yet,
/// and how many times.
const UNPUBLISHED_RETRY: Duration = Duration::from_millis(20);
const UNPUBLISHED_TRIES: u32 = 10;

/// An election view over a lock backend reserved for elections and a [`LeaderStore`].
#[derive(Debug, Clone)]
pub struct LockElection {
    locks: Arc<dyn LockBackend>,
    store: Arc<dyn LeaderStore>,
    candidate: Candidate,
    poll: Duration,
}

impl LockElection {
    /// A view for `candidate`: leaderships are grants of `locks` (which must mint fencing
    /// tokens, the terms), values live in `store`, and [`observe`](ElectionBackend::observe)
    /// polls every `poll`.
    pub fn new(
        locks: Arc<dyn LockBackend>,
        store: Arc<dyn LeaderStore>,
        candidate: Candidate,
        poll: Duration,
    ) -> Self {
        Self {
            locks,
            store,
            candidate,
            poll,
        }
    }

    /// Publishes our value for a fresh grant; on failure gives the grant back and fails.
    async fn published(&self, req: &LockRequest<'_>, grant: Grant) -> Result<Grant, Error> {
        let outcome = match grant.fencing {
            None => Err(Error::new(
                ErrorKind::Unsupported,
                self.locks.capabilities().name,
                "an election needs fencing tokens for its terms",
            )),
            Some(_) => {
                self.store
                    .publish(req.key, req.owner, &self.candidate)
                    .await
            }
        };
        self.keep_if(req, grant, outcome).await
    }
}

#[async_trait]
impl View for LockElection {
    type Grants = dyn LockBackend;
    const REFUSAL: &'static str = "an election view gives leaderships only";

    fn grants(&self) -> &dyn LockBackend {
        &*self.locks
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        match self.locks.try_lock(req).await? {
            Some(grant) => self.published(&req, grant).await.map(Some),
            None => Ok(None),
        }
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let waited = self.locks.wait_lock(req, deadline).await?;
        let attempts = waited.attempts;
        match waited.grant {
            Some(grant) => Ok(Waited::new(
                Some(self.published(&req, grant).await?),
                attempts,
            )),
            None => Ok(Waited::new(None, attempts)),
        }
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        // Cleared while still held, so the next leader's value is never the one removed.
        if let Err(e) = self.store.clear(held.key, held.owner).await {
            tracing::debug!(error = %e, "leasehold.election: clearing the value failed");
        }
        self.locks.release(held).await
    }
}

#[async_trait]
impl ElectionBackend for LockElection {
    fn candidate(&self) -> &Candidate {
        &self.candidate
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>, Error> {
        let name = self.locks.capabilities().name;
        for _ in 0..UNPUBLISHED_TRIES {
            let Some(holder) = self.locks.inspect(key).await? else {
                return Ok(None);
            };
            // Granted but not published yet (or publishing failed and the grant is going), or
            // a holder caught between taking the lock and writing its owner and token (a
            // file lock): look again.
            if let (Some(owner), Some(term)) = (holder.owner, holder.fencing)
                && let Some((published, value)) = self.store.read(key).await?
                && published == owner
            {
                return Ok(Some(Leader::new(value, term)));
            }
            tokio::time::sleep(UNPUBLISHED_RETRY).await;
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            name,
            format!("the leader of {key:?} has not published its owner, term and value"),
        )
        .with_retryable(true))
    }

    async fn observe(
        &self,
        key: &LockKey,
        last: Option<&Leader>,
        deadline: Instant,
    ) -> Result<Option<Leader>, Error> {
        poll_leader(self, key, last, deadline, self.poll).await
    }
}
