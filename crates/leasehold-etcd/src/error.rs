//! The driver-private error, converted to [`Error`] at the boundary, and the time limit of
//! every etcd request.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::Client;
use leasehold_core::{Error, ErrorKind};
use tokio::time::Instant;

use crate::NAME;

/// A driver-private error, converted to [`Error`] at the boundary.
#[derive(Debug)]
pub(crate) enum EtcdError {
    Client(etcd_client::Error),
    Timeout(&'static str, Duration),
    Protocol(String),
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Client(e) => write!(f, "{e}"),
            Self::Timeout(what, d) => write!(f, "{what}: no answer within {d:?}"),
            Self::Protocol(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for EtcdError {}

impl EtcdError {
    /// Whether etcd said the lease does not exist.
    pub(crate) fn is_not_found(&self) -> bool {
        match self {
            Self::Client(etcd_client::Error::GRpcStatus(s)) => i32::from(s.code()) == 5,
            _ => false,
        }
    }

    pub(crate) fn into_core(self, what: &str) -> Error {
        let kind = match &self {
            Self::Timeout(..) => ErrorKind::Unavailable,
            Self::Protocol(_) => ErrorKind::Backend,
            Self::Client(e) if is_auth_refusal(e) => ErrorKind::InvalidConfig,
            // Left after every renewal (the users or roles kept changing): the next try
            // renews again.
            Self::Client(e) if is_old_auth_revision(e) => ErrorKind::Unavailable,
            Self::Client(e) => match e {
                etcd_client::Error::GRpcStatus(s) => match i32::from(s.code()) {
                    // permission denied, unauthenticated
                    7 | 16 => ErrorKind::InvalidConfig,
                    // invalid argument, failed precondition, out of range
                    3 | 9 | 11 => ErrorKind::Backend,
                    _ => ErrorKind::Unavailable,
                },
                etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => {
                    ErrorKind::InvalidConfig
                }
                etcd_client::Error::TransportError(_)
                | etcd_client::Error::IoError(_)
                | etcd_client::Error::LeaseKeepAliveError(_)
                | etcd_client::Error::WatchError(_) => ErrorKind::Unavailable,
                _ => ErrorKind::Backend,
            },
        };
        let msg = format!("{what}: {self}");
        Error::new(kind, NAME, msg).with_source(self)
    }
}

/// Whether etcd refused the credentials (or their absence): a configuration problem, which
/// retrying does not fix. etcd reports these with generic codes, so its messages (stable
/// strings of its `rpctypes`) tell them apart.
fn is_auth_refusal(e: &etcd_client::Error) -> bool {
    const REFUSALS: [&str; 4] = [
        "etcdserver: authentication failed, invalid user ID or password",
        "etcdserver: user name is empty",
        "etcdserver: authentication is not enabled",
        "etcdserver: user name not found",
    ];
    match e {
        etcd_client::Error::GRpcStatus(s) => REFUSALS.iter().any(|m| s.message().contains(m)),
        _ => false,
    }
}

/// What etcd answers a request whose token was issued before the last change to the cluster's
/// users or roles (its `ErrAuthOldRevision`). The permission check refused the request before
/// it was applied, so renewing the token and sending it again is safe.
const OLD_AUTH_REVISION: &str = "etcdserver: revision of auth store is old";

/// How many times one request renews the token and goes again before it reports the refusal
/// (as `Unavailable`). More than one: with JWT tokens every change to the users or roles
/// refuses every older token, and a burst of changes (an operator's script, a test suite
/// creating users) can land between a renewal and the request sent with it.
const RENEWALS: u32 = 8;

fn is_old_auth_revision(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains(OLD_AUTH_REVISION))
}

/// Renews a client's token when etcd refuses it as older than the last change to the cluster's
/// users or roles. etcd-client renews a token only when etcd calls it invalid; with this
/// refusal a JWT's every request (releases too) failed until the token expired (its TTL is the
/// server's), and a simple token's request that crossed the change in flight failed. One
/// renewal per change, however many requests find the token stale at once (a burst of
/// releases must not become a burst of authentications, each a write in etcd's log).
pub(crate) struct Reauth {
    client: Client,
    /// How many times the token was renewed here: a request that saw the token before a
    /// renewal just goes again with the new one.
    renewals: AtomicU64,
    renewing: tokio::sync::Mutex<()>,
}

impl Reauth {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            renewals: AtomicU64::new(0),
            renewing: tokio::sync::Mutex::new(()),
        }
    }

    fn seen(&self) -> u64 {
        self.renewals.load(Ordering::Acquire)
    }

    /// Authenticates again, unless another request did since it saw renewal `seen`.
    async fn renew(&self, seen: u64) -> Result<(), etcd_client::Error> {
        let _one = self.renewing.lock().await;
        if self.seen() != seen {
            return Ok(());
        }
        self.client.refresh_token().await?;
        self.renewals.fetch_add(1, Ordering::Release);
        tracing::debug!(
            "leasehold.etcd: token renewed after a change to the cluster's users or roles"
        );
        Ok(())
    }
}

impl From<etcd_client::Error> for EtcdError {
    fn from(e: etcd_client::Error) -> Self {
        Self::Client(e)
    }
}

/// Runs one etcd request with a time limit, trying again while it fails *without having been
/// sent* (the client's balancer picked a member it cannot connect to: a stopped member, or one
/// whose connection broke and has not been re-established yet), and after renewing the token
/// with `reauth` each time etcd refuses it as older than its users and roles (at most
/// [`RENEWALS`] times: each refusal means they changed again since the last renewal). A
/// request that may have been applied is never repeated here.
pub(crate) async fn with_timeout<T, F, Fut>(
    limit: Duration,
    what: &'static str,
    reauth: Option<&Reauth>,
    mut request: F,
) -> Result<T, EtcdError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + limit;
    let mut delay = Duration::from_millis(10);
    let mut renewals = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let seen = reauth.map(Reauth::seen);
        match tokio::time::timeout(left, request()).await {
            Ok(Err(e)) if is_unsent(&e) && Instant::now() + delay < deadline => {
                tracing::trace!(error = %e, what, "leasehold.etcd: request not sent; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(250));
            }
            Ok(Err(e)) if renewals < RENEWALS && is_old_auth_revision(&e) => {
                let (Some(reauth), Some(seen)) = (reauth, seen) else {
                    return Err(EtcdError::Client(e));
                };
                renewals += 1;
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, reauth.renew(seen)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(EtcdError::Client(e)),
                    Err(_) => return Err(EtcdError::Timeout(what, limit)),
                }
            }
            Ok(r) => return r.map_err(EtcdError::Client),
            Err(_) => return Err(EtcdError::Timeout(what, limit)),
        }
    }
}

/// Whether the request certainly never reached etcd: the connection to the chosen member could
/// not be made.
fn is_unsent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            i32::from(s.code()) == 14 && s.message().contains("connect error")
        }
        _ => false,
    }
}
