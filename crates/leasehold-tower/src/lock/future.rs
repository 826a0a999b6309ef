use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use leasehold_core::{Error, ErrorKind, Lease, LockKey, LossReason};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{InsertLease, OnLost};
use crate::{Completed, LockError};

pub(super) type Acquiring = Pin<Box<dyn Future<Output = Result<Option<Lease>, Error>> + Send>>;
type Lost = Pin<Box<dyn Future<Output = LossReason> + Send>>;

pin_project! {
    /// The response future of [`Lock`](super::Lock): first the lease, then the inner call.
    ///
    /// It owns the [`Lease`] while the inner future runs, so the lease is held until the
    /// response is ready (or this future is dropped). Then the lease is dropped, which releases
    /// it in the background (see `leasehold_core::Lease`, "Cancellation and drop": release on
    /// drop is not immediate).
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
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
            lost: Lost,
            on_lost: OnLost,
        },
        Failed {
            err: Option<LockError<S::Error, S::Response>>,
        },
        Done,
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(super) fn pass(fut: S::Future) -> Self {
        Self {
            state: State::Pass { fut },
        }
    }

    pub(super) fn failed(err: LockError<S::Error, S::Response>) -> Self {
        Self {
            state: State::Failed { err: Some(err) },
        }
    }

    pub(super) fn acquire(
        acquiring: Acquiring,
        svc: S,
        req: Req,
        key: LockKey,
        on_lost: OnLost,
    ) -> Self {
        Self {
            state: State::Acquire {
                acquiring,
                svc: Some(svc),
                req: Some(req),
                key,
                on_lost,
            },
        }
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

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    Req: InsertLease,
{
    type Output = Result<S::Response, LockError<S::Error, S::Response>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Pass { fut } => return fut.poll(cx).map_err(LockError::Service),
                StateProj::Failed { err } => {
                    let err = err.take();
                    this.state.set(State::Done);
                    match err {
                        Some(e) => return Poll::Ready(Err(e)),
                        None => panic!("ResponseFuture polled after completion"),
                    }
                }
                StateProj::Acquire {
                    acquiring,
                    svc,
                    req,
                    key,
                    on_lost,
                } => {
                    let outcome = ready!(acquiring.as_mut().poll(cx));
                    let lease = match outcome {
                        Ok(Some(lease)) => lease,
                        Ok(None) => {
                            let key = key.clone();
                            this.state.set(State::Done);
                            return Poll::Ready(Err(LockError::Contended { key }));
                        }
                        Err(e) => {
                            let err = acquire_error(key, e);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(err));
                        }
                    };
                    let (Some(mut svc), Some(mut req)) = (svc.take(), req.take()) else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let info = lease.info();
                    let lost: Lost = info.lost.clone().into_future();
                    req.insert_lease(info);
                    let fut = svc.call(req);
                    let on_lost = *on_lost;
                    this.state.set(State::Call {
                        fut,
                        lease,
                        lost,
                        on_lost,
                    });
                }
                StateProj::Call {
                    fut,
                    lease,
                    lost,
                    on_lost,
                } => {
                    if *on_lost == OnLost::Abort
                        && let Poll::Ready(reason) = lost.as_mut().poll(cx)
                    {
                        let key = lease.key().clone();
                        // Dropping the state drops (cancels) the inner future, then the lease.
                        this.state.set(State::Done);
                        return Poll::Ready(Err(LockError::LeaseLost {
                            key,
                            reason,
                            completed: None,
                        }));
                    }
                    let out = ready!(fut.poll(cx));
                    // The deadline may have passed before the lost timer fired: check again.
                    let loss = lease.loss_reason();
                    let key = lease.key().clone();
                    this.state.set(State::Done);
                    return Poll::Ready(match loss {
                        None => out.map_err(LockError::Service),
                        Some(reason) => Err(LockError::LeaseLost {
                            key,
                            reason,
                            completed: Some(Completed::new(out)),
                        }),
                    });
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
