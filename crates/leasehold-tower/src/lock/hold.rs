//! How long the lease of a request is held: until the response is ready, or until its http
//! body has finished streaming.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use leasehold_core::{Lease, LossReason};
use pin_project_lite::pin_project;

use crate::LeaseLostError;

pub(super) type Lost = Pin<Box<dyn Future<Output = LossReason> + Send>>;

/// The lease of a request once its response is ready, handed to a [`Hold`] policy.
///
/// Dropping it drops the lease, which releases it in the background.
pub struct HeldLease {
    lease: Lease,
    /// [`OnLost::Abort`](super::OnLost::Abort): the loss ends what still runs under the lease.
    abort: bool,
    /// The lost signal, armed by the first user that needs it (the response future passes on
    /// the one it already polled).
    lost: Option<Lost>,
}

impl HeldLease {
    pub(super) fn new(lease: Lease, abort: bool, lost: Option<Lost>) -> Self {
        Self { lease, abort, lost }
    }

    /// Polls the lost signal if the policy is to abort on loss (arming it on first use).
    fn poll_abort(&mut self, cx: &mut Context<'_>) -> Poll<LossReason> {
        if !self.abort {
            return Poll::Pending;
        }
        let lease = &self.lease;
        let lost = self.lost.get_or_insert_with(|| lease.lost().into_future());
        lost.as_mut().poll(cx)
    }

    /// The lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Whether the policy is [`OnLost::Abort`](super::OnLost::Abort): whatever still runs
    /// under the lease should stop when it is lost.
    pub fn aborts_on_loss(&self) -> bool {
        self.abort
    }

    /// Takes the lease out, to release it explicitly or keep it longer; the loss no longer
    /// aborts anything.
    pub fn into_lease(self) -> Lease {
        self.lease
    }
}

impl fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLease")
            .field("lease", &self.lease)
            .field("aborts_on_loss", &self.aborts_on_loss())
            .finish()
    }
}

/// What [`Lock`](super::Lock) does with the lease when the inner service's response is ready:
/// drop it ([`UntilResponse`], the default) or hand it on, for example into the response body
/// ([`UntilBodyEnd`]).
pub trait Hold<R> {
    /// The response type the caller sees.
    type Response;

    /// The response of a request that ran under `lease`.
    fn hold(&self, response: R, lease: HeldLease) -> Self::Response;

    /// The response of a request that passed through without a lock (no key).
    fn unlocked(&self, response: R) -> Self::Response;
}

/// Holds the lease until the response is ready (for `http`: until the response *head* is
/// ready, not while a streaming body is sent). The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct UntilResponse;

impl<R> Hold<R> for UntilResponse {
    type Response = R;

    fn hold(&self, response: R, lease: HeldLease) -> R {
        drop(lease);
        response
    }

    fn unlocked(&self, response: R) -> R {
        response
    }
}

/// Holds the lease of an `http` request until its response body has finished streaming (or is
/// dropped): the body becomes a [`LeaseBody`] that owns the lease.
///
/// With [`OnLost::Abort`](super::OnLost::Abort), a lease lost while the body streams ends the
/// body with a [`LeaseLostError`]: the client sees a broken response instead of a complete one.
/// With [`OnLost::Finish`](super::OnLost::Finish) the body streams to its end regardless.
#[derive(Debug, Clone, Copy, Default)]
pub struct UntilBodyEnd;

impl<B> Hold<http::Response<B>> for UntilBodyEnd {
    type Response = http::Response<LeaseBody<B>>;

    fn hold(&self, response: http::Response<B>, lease: HeldLease) -> Self::Response {
        response.map(|body| LeaseBody::held(body, lease))
    }

    fn unlocked(&self, response: http::Response<B>) -> Self::Response {
        response.map(LeaseBody::unlocked)
    }
}

pin_project! {
    /// A response body that holds the request's lease until it has streamed to the end, failed,
    /// or been dropped (see [`UntilBodyEnd`]).
    ///
    /// Its error type is a boxed error: the inner body's errors, or a [`LeaseLostError`] when
    /// the lease is lost mid-stream under [`OnLost::Abort`](super::OnLost::Abort).
    ///
    /// # Cancellation and drop
    ///
    /// The lease is dropped as soon as the inner body reports its end (or an error), or when
    /// this body is dropped, e.g. because the client went away. Dropping the lease releases it
    /// in the background: release is not immediate.
    pub struct LeaseBody<B> {
        #[pin]
        inner: B,
        held: Option<HeldLease>,
        failed: bool,
    }
}

impl<B> LeaseBody<B> {
    /// `body`, holding `lease` until it ends.
    pub fn held(body: B, lease: HeldLease) -> Self {
        Self {
            inner: body,
            held: Some(lease),
            failed: false,
        }
    }

    /// `body`, holding no lease.
    pub fn unlocked(body: B) -> Self {
        Self {
            inner: body,
            held: None,
            failed: false,
        }
    }

    /// The lease still held by this body, if any.
    pub fn lease(&self) -> Option<&Lease> {
        self.held.as_ref().map(HeldLease::lease)
    }

    /// The inner body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: fmt::Debug> fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseBody")
            .field("inner", &self.inner)
            .field("held", &self.held)
            .finish()
    }
}

impl<B: Default> Default for LeaseBody<B> {
    fn default() -> Self {
        Self::unlocked(B::default())
    }
}

/// A body without a lease, from text (error responses, for example).
impl<B: From<String>> From<String> for LeaseBody<B> {
    fn from(text: String) -> Self {
        Self::unlocked(B::from(text))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> Body for LeaseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if *this.failed {
            return Poll::Ready(None);
        }
        if let Some(held) = this.held.as_mut()
            && let Poll::Ready(reason) = held.poll_abort(cx)
        {
            let key = held.lease.key().clone();
            *this.held = None;
            *this.failed = true;
            return Poll::Ready(Some(Err(Box::new(LeaseLostError { key, reason }))));
        }
        let frame = ready!(this.inner.poll_frame(cx));
        match frame {
            Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
            Some(Err(e)) => {
                *this.held = None;
                Poll::Ready(Some(Err(e.into())))
            }
            None => {
                *this.held = None;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.failed {
            SizeHint::with_exact(0)
        } else {
            self.inner.size_hint()
        }
    }
}
