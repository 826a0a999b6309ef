use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use leasehold_core::{Error, FencingToken};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::Admission;
use crate::FenceError;
use crate::once::{take_call, take_err};

pub(super) type Admitting = Pin<Box<dyn Future<Output = Result<Admission, Error>> + Send>>;

pin_project! {
    /// The response future of [`Fence`](super::Fence): first the token check, then the inner
    /// call.
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
        Admit {
            admitting: Admitting,
            svc: Option<S>,
            req: Option<Req>,
            resource: String,
            token: FencingToken,
        },
        Call {
            #[pin]
            fut: S::Future,
        },
        Failed {
            err: Option<FenceError<S::Error>>,
        },
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(super) fn failed(err: FenceError<S::Error>) -> Self {
        Self {
            state: State::Failed { err: Some(err) },
        }
    }

    pub(super) fn admit(
        admitting: Admitting,
        svc: S,
        req: Req,
        resource: String,
        token: FencingToken,
    ) -> Self {
        Self {
            state: State::Admit {
                admitting,
                svc: Some(svc),
                req: Some(req),
                resource,
                token,
            },
        }
    }
}

impl<S: Service<Req>, Req> Future for ResponseFuture<S, Req> {
    type Output = Result<S::Response, FenceError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Call { fut } => return fut.poll(cx).map_err(FenceError::Service),
                StateProj::Failed { err } => return Poll::Ready(Err(take_err(err))),
                StateProj::Admit {
                    admitting,
                    svc,
                    req,
                    resource,
                    token,
                } => {
                    let verdict = ready!(admitting.as_mut().poll(cx));
                    let err = match verdict {
                        Ok(Admission::Accepted) => None,
                        Ok(Admission::Stale { highest }) => Some(FenceError::Stale {
                            resource: std::mem::take(resource),
                            token: *token,
                            highest,
                        }),
                        Err(e) => Some(FenceError::Store(e)),
                    };
                    if let Some(err) = err {
                        this.state.set(State::Failed { err: None });
                        return Poll::Ready(Err(err));
                    }
                    let (mut svc, req) = take_call(svc, req);
                    let fut = svc.call(req);
                    this.state.set(State::Call { fut });
                }
            }
        }
    }
}
