//! Check 9: the primitives a backend declares in its capabilities are exactly the ones it
//! gives, and every refusal is typed and says why.

use std::sync::Arc;

use leasehold_core::{Candidate, Capabilities, Error, ErrorKind, LockBackend, PermitLimit};

use super::target::{Failure, Target, op};

const CHECK: &str = "primitives";

/// [`LockBackend::semaphore`] gives a view exactly when [`Capabilities::semaphores`] says so,
/// and [`LockBackend::election`] exactly when [`Capabilities::elections`] does; a refusal is an
/// [`ErrorKind::Unsupported`] naming the backend and the primitive. Each view given is itself a
/// backend that declares, and gives, neither primitive.
pub async fn primitives(t: &Target) -> Result<(), Failure> {
    let caps = t.caps();
    let limit = op("setup", "permit limit", PermitLimit::new(2))?;
    let candidate = op("setup", "candidate", Candidate::new("conformance"))?;
    match Arc::clone(&t.primary).semaphore(limit) {
        Ok(view) => {
            ensure!(
                CHECK,
                caps.semaphores,
                "{} gives a permit view, but its capabilities say it gives no semaphores",
                caps.name
            );
            view_gives_nothing(view, limit, &candidate)?;
        }
        Err(e) => refused(&caps, caps.semaphores, "semaphores", &e)?,
    }
    match Arc::clone(&t.primary).election(candidate.clone()) {
        Ok(view) => {
            ensure!(
                CHECK,
                caps.elections,
                "{} gives an election view, but its capabilities say it gives no elections",
                caps.name
            );
            view_gives_nothing(view, limit, &candidate)?;
        }
        Err(e) => refused(&caps, caps.elections, "elections", &e)?,
    }
    Ok(())
}

/// `e` refused `primitive` of a backend with `caps`, whose flag for it is `declared`.
fn refused(caps: &Capabilities, declared: bool, primitive: &str, e: &Error) -> Result<(), Failure> {
    ensure!(
        CHECK,
        !declared,
        "{}'s capabilities say it gives {primitive}, but it refused: {e}",
        caps.name
    );
    ensure!(
        CHECK,
        e.kind() == ErrorKind::Unsupported,
        "refusing {primitive} is not ErrorKind::Unsupported: {e}"
    );
    let said = e.to_string();
    ensure!(
        CHECK,
        said.contains(caps.name) && said.contains(primitive),
        "refusing {primitive}, the error names neither the backend nor the primitive: {said}"
    );
    Ok(())
}

/// A view of one primitive declares neither primitive and refuses both.
fn view_gives_nothing<V: LockBackend + ?Sized>(
    view: Arc<V>,
    limit: PermitLimit,
    candidate: &Candidate,
) -> Result<(), Failure> {
    let caps = view.capabilities();
    ensure!(
        CHECK,
        !caps.semaphores && !caps.elections,
        "a view of {} declares semaphores ({}) or elections ({}) of its own",
        caps.name,
        caps.semaphores,
        caps.elections
    );
    match Arc::clone(&view).semaphore(limit) {
        Ok(_) => return Err(Failure::new(CHECK, "a view gives semaphores of its own")),
        Err(e) => refused(&caps, false, "semaphores", &e)?,
    }
    match view.election(candidate.clone()) {
        Ok(_) => Err(Failure::new(CHECK, "a view gives elections of its own")),
        Err(e) => refused(&caps, false, "elections", &e),
    }
}
