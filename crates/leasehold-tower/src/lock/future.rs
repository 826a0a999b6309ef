use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use leasehold_core::{Error, ErrorKind, Lease, LockKey, LossReason};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::hold::{HeldLease, Hold, Lost, UntilResponse};
use super::{InsertLease, OnLost};
use crate::meter::Meter;
use crate::once::{polled_after_completion, take_call, take_err};
use crate::{Completed, LockError};

pub(super) type Acquiring = Pin<Box<dyn Future<Output = Result<Option<Lease>, Error>> + Send>>;

pin_project! {
    /// The response future of [`Lock`](super::Lock): first the lease, then the inner call.
    ///
    /// It owns the [`Lease`] while the inner future runs, so the lease is held until the
    /// response is ready (or this future is dropped). Then the [`Hold`] policy gets it: the
    /// default drops it, which releases it in the background (see `leasehold_core::Lease`,
    /// "Cancellation and drop": release on drop is not immediate);
    /// [`UntilBodyEnd`](super::UntilBodyEnd) moves it into the response body.
    pub struct ResponseFuture<S, Req, H = UntilResponse>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        hold: H,
        meter: Meter,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateOwn]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Pass {
            #[pin]
            fut: S::Future,
        },
        Acquire {
            acquiring: Acquiring,
            svc: Option<S>,
            req: Option<Req>,
            key: LockKey,
            on_lost: OnLost,
        },
        Call {
            #[pin]
            fut: S::Future,
            lease: Lease,
            // Created on the first `Pending` of the inner future under `OnLost::Abort`: a
            // request that completes at once pays for no timer.
            lost: Option<Lost>,
            on_lost: OnLost,
        },
        Failed {
            err: Option<LockError<S::Error, S::Response>>,
        },
        Done,
    }
}

impl<S: Service<Req>, Req, H> ResponseFuture<S, Req, H> {
    pub(super) fn pass(fut: S::Future, hold: H, meter: Meter) -> Self {
        Self {
            state: State::Pass { fut },
            hold,
            meter,
        }
    }

    pub(super) fn failed(err: LockError<S::Error, S::Response>, hold: H, meter: Meter) -> Self {
        Self {
            state: State::Failed { err: Some(err) },
            hold,
            meter,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquire(
        acquiring: Acquiring,
        svc: S,
        req: Req,
        key: LockKey,
        on_lost: OnLost,
        hold: H,
        meter: Meter,
    ) -> Self {
        Self {
            state: State::Acquire {
                acquiring,
                svc: Some(svc),
                req: Some(req),
                key,
                on_lost,
            },
            hold,
            meter,
        }
    }
}

/// The `outcome` label of a request's result (see the `metrics` feature).
fn outcome<T, E, R>(result: &Result<T, LockError<E, R>>, locked: bool) -> &'static str {
    match result {
        Ok(_) if locked => "ok",
        Ok(_) => "unlocked",
        Err(LockError::Service(_)) if locked => "service_error",
        Err(LockError::Service(_)) => "unlocked",
        Err(LockError::Contended { .. }) => "contended",
        Err(LockError::Timeout { .. }) => "timeout",
        Err(LockError::Unavailable(_)) => "unavailable",
        Err(LockError::LeaseLost { .. }) => "lease_lost",
        Err(LockError::Lock(_)) => "lock_error",
    }
}

/// Sorts an acquisition failure into the error enum.
fn acquire_error<E, R>(key: &LockKey, e: Error) -> LockError<E, R> {
    let unavailable =
        |k: ErrorKind| matches!(k, ErrorKind::Unavailable | ErrorKind::QuorumNotReached);
    match e.kind() {
        k if unavailable(k) => LockError::Unavailable(e),
        ErrorKind::Timeout => {
            // The budget ran out because the backend kept failing, not because of a holder.
            let cause = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<Error>())
                .map(Error::kind);
            if cause.is_some_and(unavailable) {
                LockError::Unavailable(e)
            } else {
                LockError::Timeout {
                    key: key.clone(),
                    source: e,
                }
            }
        }
        _ => LockError::Lock(e),
    }
}

impl<S, Req, H> Future for ResponseFuture<S, Req, H>
where
    S: Service<Req>,
    Req: InsertLease,
    H: Hold<S::Response>,
{
    type Output = Result<H::Response, LockError<S::Error, S::Response>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let locked = !matches!(*this.state, State::Pass { .. });
        let out = ready!(Self::poll_state(this.state, this.hold, cx));
        this.meter.record(outcome(&out, locked));
        Poll::Ready(out)
    }
}

/// What a failed request resolves to.
type Failure<S, Req> = LockError<<S as Service<Req>>::Error, <S as Service<Req>>::Response>;

type Output<S, Req, H> =
    Result<<H as Hold<<S as Service<Req>>::Response>>::Response, Failure<S, Req>>;

/// The steps of a [`ResponseFuture`], on its pinned state.
impl<S, Req, H> ResponseFuture<S, Req, H>
where
    S: Service<Req>,
    Req: InsertLease,
    H: Hold<S::Response>,
{
    fn poll_state(
        mut state: Pin<&mut State<S, Req>>,
        hold: &H,
        cx: &mut Context<'_>,
    ) -> Poll<Output<S, Req, H>> {
        loop {
            match state.as_mut().project() {
                StateProj::Pass { fut } => {
                    let out = ready!(fut.poll(cx));
                    return Poll::Ready(out.map(|r| hold.unlocked(r)).map_err(LockError::Service));
                }
                StateProj::Failed { err } => {
                    let err = take_err(err);
                    state.set(State::Done);
                    return Poll::Ready(Err(err));
                }
                StateProj::Acquire {
                    acquiring,
                    svc,
                    req,
                    key,
                    on_lost,
                } => match ready!(Self::poll_acquire(acquiring, svc, req, key, *on_lost, cx)) {
                    Ok(call) => state.set(call),
                    Err(e) => {
                        state.set(State::Done);
                        return Poll::Ready(Err(e));
                    }
                },
                StateProj::Call { .. } => return Self::poll_call(state, hold, cx),
                StateProj::Done => polled_after_completion(),
            }
        }
    }

    /// `Acquire`: waits for the lease, then makes the inner call under it; the result is the
    /// next state (`Call`).
    fn poll_acquire(
        acquiring: &mut Acquiring,
        svc: &mut Option<S>,
        req: &mut Option<Req>,
        key: &LockKey,
        on_lost: OnLost,
        cx: &mut Context<'_>,
    ) -> Poll<Result<State<S, Req>, Failure<S, Req>>> {
        let lease = match ready!(acquiring.as_mut().poll(cx)) {
            Ok(Some(lease)) => lease,
            Ok(None) => return Poll::Ready(Err(LockError::Contended { key: key.clone() })),
            Err(e) => return Poll::Ready(Err(acquire_error(key, e))),
        };
        let (mut svc, mut req) = take_call(svc, req);
        req.insert_lease(lease.info());
        Poll::Ready(Ok(State::Call {
            fut: svc.call(req),
            lease,
            lost: None,
            on_lost,
        }))
    }

    /// Under [`OnLost::Abort`], whether the lease is known lost now, reading the armed lost signal
    /// if there is one (the deadline alone otherwise).
    fn poll_lost(
        lost: &mut Option<Lost>,
        lease: &Lease,
        cx: &mut Context<'_>,
    ) -> Option<LossReason> {
        match lost.as_mut() {
            Some(l) => match l.as_mut().poll(cx) {
                Poll::Ready(reason) => Some(reason),
                Poll::Pending => None,
            },
            None => lease.loss_reason(),
        }
    }

    /// `Call`: runs the inner future under the lease, ending it early if the lease is lost under
    /// [`OnLost::Abort`], and hands the lease to the [`Hold`] policy with the response.
    fn poll_call(
        mut state: Pin<&mut State<S, Req>>,
        hold: &H,
        cx: &mut Context<'_>,
    ) -> Poll<Output<S, Req, H>> {
        let StateProj::Call {
            fut,
            lease,
            lost,
            on_lost,
        } = state.as_mut().project()
        else {
            unreachable!("poll_call is called in the Call state")
        };
        let abort = *on_lost == OnLost::Abort;
        // Under Abort, the inner future makes no progress once the lease is known lost.
        let mut lost_now = if abort {
            Self::poll_lost(lost, lease, cx)
        } else {
            None
        };
        let polled = match lost_now {
            Some(_) => None,
            None => Some(fut.poll(cx)),
        };
        if abort && lost_now.is_none() && lost.is_none() && matches!(polled, Some(Poll::Pending)) {
            // The request is still running: wake it when the lease is lost.
            let mut l: Lost = lease.lost().into_future();
            if let Poll::Ready(reason) = l.as_mut().poll(cx) {
                lost_now = Some(reason);
            }
            *lost = Some(l);
        }
        if let Some(reason) = lost_now {
            let key = lease.key().clone();
            // Dropping the state drops (cancels) the inner future, then the lease.
            state.set(State::Done);
            return Poll::Ready(Err(LockError::LeaseLost {
                key,
                reason,
                completed: None,
            }));
        }
        let Some(Poll::Ready(out)) = polled else {
            return Poll::Pending;
        };
        // The deadline may have passed before the lost timer fired: check again.
        let loss = lease.loss_reason();
        let key = lease.key().clone();
        let StateOwn::Call { lease, lost, .. } = state.as_mut().project_replace(State::Done) else {
            unreachable!("the state was Call")
        };
        Poll::Ready(match (loss, out) {
            (None, Ok(response)) => Ok(hold.hold(response, HeldLease::new(lease, abort, lost))),
            (None, Err(e)) => Err(LockError::Service(e)),
            (Some(reason), out) => Err(LockError::LeaseLost {
                key,
                reason,
                completed: Some(Completed::new(out)),
            }),
        })
    }
}
