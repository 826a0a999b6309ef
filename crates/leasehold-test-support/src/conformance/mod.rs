//! The conformance suite: the contract every backend must pass, as plain async functions.
//!
//! Each check takes a [`Target`] (two independent clients of one lock service and a few hooks)
//! and returns `Err(Failure)` instead of panicking, so the suite's own tests can show that a
//! deliberately broken backend fails it. A driver's tests run the whole list with
//! [`conformance_tests!`](crate::conformance_tests), given an `async fn() -> Option<Target>`;
//! `tests/memory_conformance.rs` in this crate is the smallest example.
//!
//! The checks, in order:
//! 1. [`mutual_exclusion`]: W workers × M non-atomic increments, exact total, no overlap, fenced
//!    writes all accepted;
//! 2. [`try_and_wait`]: `try_acquire` on a held key is `Ok(None)` promptly, a waiter gets the
//!    lock after release, a wait with a budget times out cleanly;
//! 3. [`own_grant_only`]: after our grant lapses and another client acquires, our release says
//!    "not held", their lock survives, our extend fails, our lost signal has fired, and our
//!    stale fenced write is rejected;
//! 4. [`fencing_tokens`]: tokens strictly increase across holders (or are consistently absent);
//! 5. [`validity_deadline`]: the deadline is never later than send instant + ttl − drift;
//! 6. [`watchdog`]: renewal keeps a lease across 5 TTLs; without renewal the lost signal fires
//!    before another client can acquire;
//! 7. [`cancellation`]: 1,000 acquires dropped at random points leave nothing held;
//! 8. [`bad_input`]: bad keys and TTLs are typed errors, not panics;
//! 9. [`primitives`]: semaphores and elections are given exactly when the capabilities say so,
//!    refused with a typed error and a reason otherwise, and a view of either gives neither.
//!
//! Backends that give semaphores also run the semaphore checks ([`SEMAPHORE_CHECKS`], generated
//! by [`semaphore_tests!`](crate::semaphore_tests)) over the same target: [`permit_bound`] (never
//! more than N holders over recorded grant intervals, with random holds, drops and
//! cancellations), [`permits_freed`] (on release, drop and holder loss), [`permit_waiters_woken`],
//! [`permit_limit_mismatch`] (refused), and [`permit_fairness`] (measured, not bounded).
//!
//! Backends that give elections also pass the checks of [`election`].

/// Fails `check` with a formatted message unless `cond` holds.
macro_rules! ensure {
    ($check:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Failure::new($check, format!($($msg)+)));
        }
    };
}

/// Declares `$list`, the names of the given checks in order, and `$run`, which runs one of them
/// by name against a `$target`.
macro_rules! checks {
    ($list:ident, $run:ident($target:ty): $($check:ident),+ $(,)?) => {
        #[doc = concat!("Every check of this list, by name, in order (see [`", stringify!($run), "`]).")]
        pub const $list: [&str; [$(stringify!($check)),+].len()] = [$(stringify!($check)),+];

        #[doc = concat!("Runs one check by name (see [`", stringify!($list), "`]).")]
        pub async fn $run(name: &str, t: &$target) -> Result<(), Failure> {
            $(
                if name == stringify!($check) {
                    return $check(t).await;
                }
            )+
            Err(Failure::new("run", format!("no check named {name:?}")))
        }
    };
}

pub mod election;
mod exclusion;
mod lifetime;
mod primitives;
mod robustness;
mod semaphore;
mod target;

pub use exclusion::{fencing_tokens, mutual_exclusion, own_grant_only, try_and_wait};
pub use lifetime::{validity_deadline, watchdog};
pub use primitives::primitives;
pub use robustness::{bad_input, cancellation};
pub use semaphore::{
    Fairness, SEMAPHORE_CHECKS, permit_bound, permit_fairness, permit_limit_mismatch,
    permit_waiters_woken, permits_freed, run_semaphore,
};
pub use target::{BoxFuture, ExpireHook, Failure, HeldHook, Target, unique_key};

checks!(CHECKS, run(Target):
    mutual_exclusion, try_and_wait, own_grant_only, fencing_tokens, validity_deadline, watchdog,
    cancellation, bad_input, primitives);

/// Runs every check, stopping at the first failure.
pub async fn run_all(t: &Target) -> Result<(), Failure> {
    for name in CHECKS {
        run(name, t).await?;
    }
    Ok(())
}

/// Generates one `#[tokio::test]` per conformance check.
///
/// `$target` is the path of an `async fn() -> Option<Target>`; returning `None` skips (which
/// [`services::require`](crate::services) only allows outside CI).
#[macro_export]
macro_rules! conformance_tests {
    ($target:path) => {
        $crate::conformance_tests!(@each $target;
            mutual_exclusion, try_and_wait, own_grant_only, fencing_tokens,
            validity_deadline, watchdog, cancellation, bad_input, primitives);
    };
    (@each $target:path; $($check:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some(target) = $target().await else { return };
                if let Err(failure) = $crate::conformance::$check(&target).await {
                    panic!("{failure}");
                }
            }
        )+
    };
}
