//! Views of one primitive over a backend whose grants they are: written once, what every such
//! view does alike.
//!
//! A permit view or an election view is itself a [`LockBackend`]. Some take their grants their
//! own way but leave them to the backend they wrap: releasing, renewing and inspecting a grant
//! is that backend's business. Such a view implements [`View`], saying only how it takes a
//! grant and what else it changes; the [`LockBackend`] implementation for every `View` forwards
//! the rest to [`View::grants`], declares neither semaphores nor elections in its capabilities,
//! and refuses both with [`View::REFUSAL`].

use std::fmt;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{
    ExtendRequest, Extended, Grant, Held, HolderInfo, LockBackend, LockRequest, Waited,
};
use crate::caps::Capabilities;
use crate::error::Error;
use crate::key::LockKey;
use crate::release::ReleaseGate;

/// A view of one primitive whose grants belong to the backend it wraps ([`grants`](View::grants)).
///
/// Taking a grant is the view's own ([`try_lock`](View::try_lock) and
/// [`wait_lock`](View::wait_lock) have no default: a view that forgot them would hand out the
/// wrapped backend's locks). Everything else goes to [`grants`](View::grants) unless the view
/// overrides it, with the meaning [`LockBackend`] gives each method.
#[async_trait]
pub trait View: Send + Sync + fmt::Debug + 'static {
    /// The backend that keeps this view's grants.
    type Grants: LockBackend + ?Sized;

    /// Why the view gives neither semaphores nor elections of its own (the reason of both
    /// refusals).
    const REFUSAL: &'static str;

    /// The backend that keeps this view's grants.
    fn grants(&self) -> &Self::Grants;

    /// Keeps `grant`, just taken for `req`, when what the view did after taking it (`done`)
    /// worked; otherwise gives it back to [`grants`](View::grants) (a failed give-back is left
    /// to the grant's TTL or session) and fails with `done`'s error.
    async fn keep_if(
        &self,
        req: &LockRequest<'_>,
        grant: Grant,
        done: Result<(), Error>,
    ) -> Result<Grant, Error> {
        let Err(e) = done else {
            return Ok(grant);
        };
        let held = Held::new(req.key, req.owner, grant.fencing, grant.state.as_deref());
        if let Err(r) = self.grants().release(held).await {
            tracing::debug!(error = %r, "leasehold: a view's give-back failed");
        }
        Err(e)
    }

    /// The view's capabilities, before semaphores and elections are cleared: by default those of
    /// [`grants`](View::grants).
    fn capabilities(&self) -> Capabilities {
        self.grants().capabilities()
    }

    /// As [`LockBackend::try_lock`], the view's own way.
    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error>;

    /// As [`LockBackend::wait_lock`], the view's own way.
    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error>;

    /// As [`LockBackend::release`]: by default [`grants`](View::grants)'.
    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        self.grants().release(held).await
    }

    /// As [`LockBackend::extend`]: by default [`grants`](View::grants)'.
    async fn extend(&self, req: ExtendRequest<'_>) -> Extended {
        self.grants().extend(req).await
    }

    /// As [`LockBackend::extend_many`]: by default [`grants`](View::grants)'.
    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<Extended> {
        self.grants().extend_many(reqs).await
    }

    /// As [`LockBackend::inspect`]: by default [`grants`](View::grants)'.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.grants().inspect(key).await
    }
}

#[async_trait]
impl<V: View> LockBackend for V {
    crate::refuse_primitives!(<Self as View>::REFUSAL);

    /// The view's capabilities, without semaphores or elections.
    fn capabilities(&self) -> Capabilities {
        View::capabilities(self).without_primitives()
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        View::try_lock(self, req).await
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        View::wait_lock(self, req, deadline).await
    }

    /// The gate of [`grants`](View::grants): the view's releases and the backend's share it.
    fn release_gate(&self) -> Option<&ReleaseGate> {
        self.grants().release_gate()
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        View::release(self, held).await
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Extended {
        View::extend(self, req).await
    }

    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<Extended> {
        View::extend_many(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        View::inspect(self, key).await
    }
}
