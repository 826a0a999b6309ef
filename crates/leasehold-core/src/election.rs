//! Leader election: one leader per key at a time, with a term that orders leaderships.
//!
//! A backend that can elect gives an **election view** of itself for one candidate
//! ([`LockBackend::election`]): an [`ElectionBackend`], which is a [`LockBackend`] whose
//! `try_lock` makes the candidate leader of the key and publishes its [`Candidate`] value. The
//! leadership is a [`Lease`](crate::Lease) of that view: its fencing token is the **term**
//! (strictly increasing across leaders of a key), its lost signal says leadership is gone, and
//! releasing it resigns, so the next candidate takes over at once.
//!
//! A backend that cannot order leaderships (Redlock mints no token) refuses with
//! [`Error::unsupported_primitive`], and its
//! [`Capabilities::elections`](crate::Capabilities::elections) is `false`.

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::error::{Error, ErrorKind};
use crate::key::LockKey;
use crate::token::FencingToken;

/// The longest candidate value, in bytes.
pub const MAX_CANDIDATE_LEN: usize = 4096;

/// What a candidate publishes while leader (its address, say): 1 to [`MAX_CANDIDATE_LEN`]
/// bytes of UTF-8 without NUL.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Candidate(String);

impl Candidate {
    /// A candidate value, or an [`ErrorKind::InvalidArgument`] error.
    pub fn new(value: impl Into<String>) -> Result<Self, Error> {
        let value = value.into();
        if value.is_empty() || value.len() > MAX_CANDIDATE_LEN || value.contains('\0') {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "election",
                format!(
                    "a candidate value is 1 to {MAX_CANDIDATE_LEN} bytes without NUL, got {} bytes",
                    value.len()
                ),
            ));
        }
        Ok(Self(value))
    }

    /// The value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fmt_as_str!(Candidate);

/// The leader of a key, as a backend reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The value the leader published.
    pub value: Candidate,
    /// Its term: the fencing token of its leadership.
    pub term: FencingToken,
}

impl Leader {
    /// A leader.
    pub fn new(value: Candidate, term: FencingToken) -> Self {
        Self { value, term }
    }
}

/// A backend's election view for one candidate: a [`LockBackend`] whose grants are
/// leaderships.
#[async_trait]
pub trait ElectionBackend: LockBackend {
    /// The value this view's candidate publishes.
    fn candidate(&self) -> &Candidate;

    /// The current leader of `key`, if any.
    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>, Error>;

    /// Waits until the leader of `key` differs from `last` (another value or term, or none)
    /// or `deadline` passes, and returns the leader then. Backends with a native watch use it;
    /// the others poll [`leader`](ElectionBackend::leader).
    async fn observe(
        &self,
        key: &LockKey,
        last: Option<&Leader>,
        deadline: Instant,
    ) -> Result<Option<Leader>, Error>;
}

/// The shared [`ElectionBackend::observe`] of backends without a native watch: asks
/// [`leader`](ElectionBackend::leader) every `every` until the answer differs from `last` or
/// `deadline` passes, and returns the last answer.
pub async fn poll_leader<E: ElectionBackend + ?Sized>(
    view: &E,
    key: &LockKey,
    last: Option<&Leader>,
    deadline: Instant,
    every: std::time::Duration,
) -> Result<Option<Leader>, Error> {
    loop {
        let now = view.leader(key).await?;
        let at = Instant::now();
        if now.as_ref() != last || at >= deadline {
            return Ok(now);
        }
        tokio::time::sleep_until((at + every).min(deadline)).await;
    }
}
