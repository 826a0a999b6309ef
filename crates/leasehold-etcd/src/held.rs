//! Release and renewal of a grant, by its state or (when the caller never saw the grant) by
//! its owner value under a range: shared by the lock backend and the permit view, whose keys
//! carry unique owner values.

use std::sync::Arc;

use leasehold_core::{Error, ExtendRequest, Held, Validity};

use crate::client::Inner;
use crate::config::LeaseMode;
use crate::error::EtcdError;
use crate::job::{EtcdGrant, confirm};

/// Releases `held`, a grant under `range`: by its state, or by deleting whatever key under
/// the range holds its owner value.
pub(crate) async fn release(inner: &Inner, range: String, held: Held<'_>) -> Result<bool, Error> {
    match held.state::<EtcdGrant>() {
        Some(g) => g.release().await,
        None => match release_by_owner(inner, range.into_bytes(), held.owner.as_str()).await {
            Err(_) if keys_gone(inner).await => Ok(false),
            other => other.map_err(|e| e.into_core("release")),
        },
    }
}

/// Renews `req`'s grant, a grant under `range`: confirms its key is still there, on a live
/// lease of ours.
pub(crate) async fn extend(
    inner: &Inner,
    range: String,
    req: ExtendRequest<'_>,
) -> Result<Option<Validity>, Error> {
    let (key, owner, session) = match req.held.state::<EtcdGrant>() {
        Some(g) => (
            g.key.clone(),
            g.owner.as_str(),
            Some(Arc::clone(&g.session)),
        ),
        None => {
            let owner = req.held.owner.as_str();
            let found = inner
                .find_owner(range.as_bytes(), owner)
                .await
                .map_err(|e| e.into_core("extend"))?;
            let Some(kv) = found.into_iter().next() else {
                return Ok(None);
            };
            match inner.session_by_id(kv.lease()).await {
                Some(s) => (kv.key().to_vec(), owner, Some(s)),
                None => return Ok(None),
            }
        }
    };
    confirm(inner, key, owner, session, req.ttl).await
}

/// Deletes whatever key under `range` holds the owner value of an acquisition whose outcome
/// the caller never saw (its own task also cleans up; both compare on the value).
async fn release_by_owner(inner: &Inner, range: Vec<u8>, owner: &str) -> Result<bool, EtcdError> {
    let found = inner.find_owner(&range, owner).await?;
    let mut any = false;
    for kv in found {
        any |= inner.delete_if_owner(kv.key(), owner).await?;
        if inner.config.lease_mode == LeaseMode::PerLock {
            crate::session::spawn_revoke(inner.client.lease_client(), kv.lease());
        }
    }
    Ok(any)
}

/// Whether every key an abandoned acquisition may have left is gone with its lease: in
/// session mode, when no session lease of ours lives any more; in per-lock mode always (the
/// acquisition's own task revokes its lease, or it expires by its TTL unrenewed).
async fn keys_gone(inner: &Inner) -> bool {
    match inner.config.lease_mode {
        LeaseMode::PerLock => true,
        LeaseMode::Session => inner.no_live_session().await,
    }
}
