//! The parts a response future uses exactly once (the readied service, the request, a stored
//! error), and the panic when it is polled again after it completed.

/// Panics: a response future was polled after it returned `Ready` (a caller bug, as for any
/// future).
pub(crate) fn polled_after_completion() -> ! {
    panic!("ResponseFuture polled after completion")
}

/// Moves the readied service and its request out, for the one call they are kept for.
pub(crate) fn take_call<S, Req>(svc: &mut Option<S>, req: &mut Option<Req>) -> (S, Req) {
    match (svc.take(), req.take()) {
        (Some(svc), Some(req)) => (svc, req),
        _ => polled_after_completion(),
    }
}

/// Moves a stored error out, to return it once.
pub(crate) fn take_err<E>(err: &mut Option<E>) -> E {
    err.take().unwrap_or_else(|| polled_after_completion())
}
