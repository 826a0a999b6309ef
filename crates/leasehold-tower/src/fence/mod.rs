//! [`FenceLayer`]: reject stale fencing tokens at the resource (the server side).

mod future;
mod layer;
mod service;

use leasehold_core::FencingToken;

pub use future::ResponseFuture;
pub use layer::FenceLayer;
pub use leasehold_core::fence::{Admission, FenceStore, MemoryFenceStore};
pub use service::Fence;

/// Reads the protected resource and the fencing token from a request; `None` when the request
/// carries none (it is then rejected with [`FenceError::MissingToken`](crate::FenceError)).
///
/// Any `Fn(&Req) -> Option<(String, FencingToken)>` is one.
pub trait FenceExtractor<Req> {
    /// The resource and the token of `req`.
    fn extract(&self, req: &Req) -> Option<(String, FencingToken)>;
}

impl<F, Req> FenceExtractor<Req> for F
where
    F: Fn(&Req) -> Option<(String, FencingToken)>,
{
    fn extract(&self, req: &Req) -> Option<(String, FencingToken)> {
        self(req)
    }
}
