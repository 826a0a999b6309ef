//! The one public error type.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;

use crate::key::KeyError;
use crate::loss::LossReason;

/// What went wrong, for callers to match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock key is not valid; [`Error::key_error`] says why.
    InvalidKey,
    /// An argument is out of range (a zero TTL, a TTL shorter than the drift margin, an absurd
    /// TTL, a bad backoff).
    InvalidArgument,
    /// The backend's configuration is wrong or incomplete.
    InvalidConfig,
    /// The wait budget ran out before the lock was granted; [`Error::attempts`] says how many
    /// tries were made.
    Timeout,
    /// The lease is no longer held (expired, taken over, session gone);
    /// [`Error::loss_reason`] says how.
    LeaseLost,
    /// Redlock could not reach a majority of nodes; [`Error::node_errors`] lists each node's
    /// cause.
    QuorumNotReached,
    /// The backend could not be reached or did not answer in time.
    Unavailable,
    /// The backend does not support the operation (see [`Capabilities`](crate::Capabilities)).
    Unsupported,
    /// The backend answered with an error or something unexpected.
    Backend,
}

impl ErrorKind {
    /// Whether an operation that failed this way may succeed if simply tried again.
    pub fn is_retryable_by_default(self) -> bool {
        matches!(
            self,
            Self::Timeout | Self::Unavailable | Self::QuorumNotReached
        )
    }

    fn describe(self) -> &'static str {
        match self {
            Self::InvalidKey => "invalid key",
            Self::InvalidArgument => "invalid argument",
            Self::InvalidConfig => "invalid configuration",
            Self::Timeout => "timed out",
            Self::LeaseLost => "lease lost",
            Self::QuorumNotReached => "quorum not reached",
            Self::Unavailable => "unavailable",
            Self::Unsupported => "unsupported",
            Self::Backend => "backend error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// One node's part in a failed quorum operation.
#[derive(Debug)]
pub struct NodeError {
    /// The node, as the backend names it (never with a password).
    pub node: String,
    /// What happened on that node.
    pub error: Error,
}

/// The error of every leasehold operation.
///
/// It carries the backend's name, a [`kind`](Error::kind) to match on, whether retrying can
/// help, and, depending on the kind, the number of attempts, the per-node causes of a failed
/// quorum, the key validation error or the reason a lease was lost. Contention is not an error:
/// [`Locker::try_acquire`](crate::Locker::try_acquire) returns `Ok(None)`.
///
/// Messages never contain passwords: drivers redact connection strings before building errors.
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    backend: Cow<'static, str>,
    message: String,
    retryable: bool,
    attempts: Option<u32>,
    nodes: Vec<NodeError>,
    key_error: Option<KeyError>,
    loss: Option<LossReason>,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl Error {
    /// A new error of `kind` from `backend`, retryable as the kind suggests
    /// ([`ErrorKind::is_retryable_by_default`]).
    pub fn new(
        kind: ErrorKind,
        backend: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            inner: Box::new(Inner {
                kind,
                backend: backend.into(),
                message: message.into(),
                retryable: kind.is_retryable_by_default(),
                attempts: None,
                nodes: Vec::new(),
                key_error: None,
                loss: None,
                source: None,
            }),
        }
    }

    /// An [`ErrorKind::InvalidKey`] error carrying the validation failure.
    pub fn invalid_key(backend: impl Into<Cow<'static, str>>, err: KeyError) -> Self {
        let mut e = Self::new(ErrorKind::InvalidKey, backend, err.to_string());
        e.inner.key_error = Some(err);
        e
    }

    /// What [`LockBackend::wait_lock`](crate::LockBackend::wait_lock) answers on a backend that
    /// waits by polling ([`WaitKind::Poll`](crate::WaitKind::Poll)): [`ErrorKind::Unsupported`],
    /// saying `why`; the [`Locker`](crate::Locker) retries with backoff instead.
    pub fn no_native_wait(backend: &'static str, why: &str) -> Self {
        Self::new(
            ErrorKind::Unsupported,
            backend,
            format!("{why}; the Locker retries with jittered backoff"),
        )
    }

    /// What a backend answers when asked for a primitive it cannot give safely (a semaphore or
    /// an election on Redlock): [`ErrorKind::Unsupported`], naming the primitive and saying
    /// `why`.
    pub fn unsupported_primitive(backend: &'static str, primitive: &str, why: &str) -> Self {
        Self::new(
            ErrorKind::Unsupported,
            backend,
            format!("{backend} does not give {primitive}: {why}"),
        )
    }

    /// An [`ErrorKind::LeaseLost`] error for `key`, carrying the reason.
    pub fn lease_lost(
        backend: impl Into<Cow<'static, str>>,
        key: &crate::LockKey,
        reason: LossReason,
    ) -> Self {
        let mut e = Self::new(
            ErrorKind::LeaseLost,
            backend,
            format!("lease on {key:?}: {reason}"),
        );
        e.inner.loss = Some(reason);
        e
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.inner.source = Some(Box::new(source));
        self
    }

    /// Attaches a boxed underlying cause.
    pub fn with_boxed_source(mut self, source: Box<dyn StdError + Send + Sync + 'static>) -> Self {
        self.inner.source = Some(source);
        self
    }

    /// Overrides whether retrying can help.
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.inner.retryable = retryable;
        self
    }

    /// Records how many attempts were made.
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.inner.attempts = Some(attempts);
        self
    }

    /// Records the per-node causes (for [`ErrorKind::QuorumNotReached`]).
    pub fn with_node_errors(mut self, nodes: Vec<NodeError>) -> Self {
        self.inner.nodes = nodes;
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The backend that reported it (`"memory"`, `"redis"`, …), or `"leasehold"` for errors of
    /// the lock API itself.
    pub fn backend(&self) -> &str {
        &self.inner.backend
    }

    /// The human-readable message, without the backend name and kind.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// Whether the same operation may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        self.inner.retryable
    }

    /// How many attempts were made (set on [`ErrorKind::Timeout`]).
    pub fn attempts(&self) -> Option<u32> {
        self.inner.attempts
    }

    /// Each node's cause, for [`ErrorKind::QuorumNotReached`].
    pub fn node_errors(&self) -> &[NodeError] {
        &self.inner.nodes
    }

    /// The key validation failure, for [`ErrorKind::InvalidKey`].
    pub fn key_error(&self) -> Option<&KeyError> {
        self.inner.key_error.as_ref()
    }

    /// How the lease was lost, for [`ErrorKind::LeaseLost`].
    pub fn loss_reason(&self) -> Option<&LossReason> {
        self.inner.loss.as_ref()
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind)
            .field("backend", &self.inner.backend)
            .field("message", &self.inner.message)
            .field("retryable", &self.inner.retryable);
        if let Some(a) = self.inner.attempts {
            d.field("attempts", &a);
        }
        if !self.inner.nodes.is_empty() {
            d.field("nodes", &self.inner.nodes);
        }
        if let Some(s) = &self.inner.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}",
            self.inner.backend, self.inner.kind, self.inner.message
        )?;
        if let Some(a) = self.inner.attempts {
            write!(f, " (after {a} attempt{})", if a == 1 { "" } else { "s" })?;
        }
        for n in &self.inner.nodes {
            write!(f, "; {}: {}", n.node, n.error)?;
        }
        Ok(())
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        if let Some(s) = &self.inner.source {
            return Some(&**s as &(dyn StdError + 'static));
        }
        self.inner
            .key_error
            .as_ref()
            .map(|k| k as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_backend_kind_attempts_and_nodes() {
        let node = Error::new(ErrorKind::Unavailable, "redis", "connection refused");
        let e = Error::new(
            ErrorKind::QuorumNotReached,
            "redlock",
            "2 of 5 nodes granted",
        )
        .with_attempts(3)
        .with_node_errors(vec![NodeError {
            node: "127.0.0.1:1".into(),
            error: node,
        }]);
        let s = e.to_string();
        assert!(s.starts_with("redlock: quorum not reached: 2 of 5"), "{s}");
        assert!(s.contains("after 3 attempts"), "{s}");
        assert!(s.contains("127.0.0.1:1: redis: unavailable"), "{s}");
        assert!(e.is_retryable());
        assert_eq!(e.node_errors().len(), 1);
    }

    #[test]
    fn retryability_follows_kind_and_can_be_overridden() {
        assert!(!Error::new(ErrorKind::InvalidConfig, "x", "y").is_retryable());
        assert!(Error::new(ErrorKind::Unavailable, "x", "y").is_retryable());
        assert!(
            !Error::new(ErrorKind::Unavailable, "x", "y")
                .with_retryable(false)
                .is_retryable()
        );
    }

    #[test]
    fn invalid_key_keeps_the_typed_cause() {
        let e = Error::invalid_key("leasehold", KeyError::Empty);
        assert_eq!(e.kind(), ErrorKind::InvalidKey);
        assert_eq!(e.key_error(), Some(&KeyError::Empty));
        assert!(StdError::source(&e).is_some());
    }
}
