//! The state a held grant keeps ([`EtcdGrant`]), and its release and renewal, by that state or
//! (when the caller never saw the grant) by its owner value under a range: shared by the lock
//! backend, the permit view (whose keys carry unique owner values) and elections.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{Error, ExtendRequest, Held, Owner, Validity};

use crate::client::{Inner, Key, finish};
use crate::config::LeaseMode;
use crate::error::EtcdError;
use crate::local::LocalSlot;
use crate::session::Session;

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
            g.key.to_vec(),
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

/// Whether our `key` (value `owner`) is still there on `session`'s lease: its validity if so.
pub(crate) async fn confirm(
    inner: &Inner,
    key: Vec<u8>,
    owner: &str,
    session: Option<Arc<Session>>,
    ttl: Duration,
) -> Result<Option<Validity>, Error> {
    let Some(session) = session.filter(|s| !s.is_lost()) else {
        return Ok(None);
    };
    // Confirm with etcd that our key is still there, on our lease.
    let validity = session.validity(ttl);
    let resp = inner
        .get("extend", key, None)
        .await
        .map_err(|e| e.into_core("extend"))?;
    let held = resp
        .kvs()
        .first()
        .is_some_and(|kv| kv.value() == owner.as_bytes() && kv.lease() == session.id());
    Ok(held.then_some(validity))
}

/// The backend-private state of a grant.
pub(crate) struct EtcdGrant {
    pub(crate) inner: Arc<Inner>,
    /// Our key, shared with the in-process slot (no copy per held lock).
    pub(crate) key: Key,
    /// Our owner value, shared with the lease (no copy either).
    pub(crate) owner: Owner,
    pub(crate) session: Arc<Session>,
    pub(crate) per_lock: bool,
    /// Our in-process permit, freed once our key is deleted.
    pub(crate) slot: Mutex<Option<LocalSlot>>,
    pub(crate) done: AtomicBool,
}

impl EtcdGrant {
    /// Deletes our key if it is still ours: `Ok(true)` if it was.
    pub(crate) async fn release(&self) -> Result<bool, Error> {
        if self.done.load(Ordering::Acquire) {
            return Ok(false);
        }
        match self
            .inner
            .delete_if_owner(&self.key, self.owner.as_str())
            .await
        {
            Ok(ours) => {
                self.finish();
                Ok(ours)
            }
            // Our key lives on the session lease: once that is gone, so is the key.
            Err(_) if self.session.is_lost() => {
                self.finish();
                Ok(false)
            }
            Err(e) => Err(e.into_core("release")),
        }
    }

    /// Our key is deleted (or gone with its lease): ends a per-lock lease and frees the
    /// in-process permit, once.
    pub(crate) fn finish(&self) {
        if !self.done.swap(true, Ordering::AcqRel) {
            if self.per_lock {
                self.session.close();
            }
            drop(self.take_slot());
        }
    }

    pub(crate) fn take_slot(&self) -> Option<LocalSlot> {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl Drop for EtcdGrant {
    fn drop(&mut self) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        // Never released (the grant was dropped before anyone took it, or release failed):
        // delete our key in the background, then free the permit.
        if self.per_lock {
            self.session.close();
            return;
        }
        let slot = self.take_slot();
        let (inner, key, owner, session) = (
            Arc::clone(&self.inner),
            Arc::clone(&self.key),
            self.owner.clone(),
            Arc::clone(&self.session),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn(async move {
                finish(&inner, &key, owner.as_str(), &session).await;
                drop(slot);
            }));
        }
    }
}
