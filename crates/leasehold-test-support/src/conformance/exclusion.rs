//! Checks 1–4: one holder at a time, try and wait, only our own grant, fencing tokens.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{Error, ErrorKind, ExtendRequest, Held, RenewalKind};
use tokio::time::Instant;

use crate::fence::FencedResource;

use super::target::{Failure, Target, in_turns, op, prompt_try, unique_key};

/// What the workers of [`mutual_exclusion`] share.
#[derive(Default)]
struct Tally {
    /// The non-atomic counter: read, pause, write back, under the lock.
    counter: AtomicU64,
    /// Workers inside the critical section now.
    inside: AtomicUsize,
    /// Times a worker entered while another was inside.
    overlaps: AtomicUsize,
    /// Where every holder writes with its fencing token.
    resource: FencedResource,
}

/// 1. W workers × M increments of a shared, non-atomic counter under the lock, half through each
///    client: the total is exactly W×M, an overlap detector sees no two holders at once, and (for
///    backends that mint tokens) a fenced resource accepts every write.
pub async fn mutual_exclusion(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "mutual_exclusion";
    const WORKERS: usize = 5;
    const INCREMENTS: usize = 10;
    let key = unique_key(CHECK)?;
    let tally = Arc::new(Tally::default());
    let mints = t.caps().fencing.mints_tokens();
    let shared = Arc::clone(&tally);
    in_turns(t, CHECK, &key, WORKERS, INCREMENTS, move |lease| {
        let tally = Arc::clone(&shared);
        async move {
            if tally.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                tally.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            if mints {
                let token = lease.fencing_token().ok_or_else(|| {
                    Failure::new(CHECK, "backend declares fencing but gave no token")
                })?;
                if let Err(stale) = tally.resource.write("counter", token) {
                    return Err(Failure::new(
                        CHECK,
                        format!("fenced write rejected under the lock: {stale:?}"),
                    ));
                }
            }
            let v = tally.counter.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1)).await;
            tally.counter.store(v + 1, Ordering::SeqCst);
            tally.inside.fetch_sub(1, Ordering::SeqCst);
            let held = op(CHECK, "release", lease.release().await)?;
            ensure!(
                CHECK,
                held,
                "release said the lock was not held by its holder"
            );
            Ok(())
        }
    })
    .await?;
    let total = tally.counter.load(Ordering::SeqCst);
    let overlaps = tally.overlaps.load(Ordering::SeqCst);
    ensure!(CHECK, overlaps == 0, "{overlaps} overlapping holders seen");
    ensure!(
        CHECK,
        total == (WORKERS * INCREMENTS) as u64,
        "counter is {total}, expected {}",
        WORKERS * INCREMENTS
    );
    Ok(())
}

/// 2. `try_acquire` on a held key returns `Ok(None)` promptly; `acquire` with a budget waits and
///    succeeds after the holder releases; it times out cleanly when the holder never releases.
pub async fn try_and_wait(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "try_and_wait";
    let key = unique_key(CHECK)?;
    let l1 = t.locker(&t.primary, t.long_ttl(), leasehold_core::Renewal::Auto)?;
    let l2 = t.locker(&t.other, t.long_ttl(), leasehold_core::Renewal::Auto)?;

    let a = op(CHECK, "try_acquire", l1.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    let second = prompt_try(CHECK, &l2, &key, Duration::from_secs(2)).await?;
    ensure!(
        CHECK,
        second.is_none(),
        "a held key was granted to another client"
    );

    let waiter = {
        let (l2, key) = (l2.clone(), key.clone());
        tokio::spawn(async move {
            let r = l2.acquire(&key, Duration::from_secs(20)).await;
            (r, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        CHECK,
        !waiter.is_finished(),
        "the waiter finished while the lock was held"
    );
    let released_at = Instant::now();
    ensure!(
        CHECK,
        op(CHECK, "release", a.release().await)?,
        "release of a held lock said not held"
    );
    let (got, got_at) = waiter
        .await
        .map_err(|e| Failure::new(CHECK, format!("waiter panicked: {e}")))?;
    let b = op(CHECK, "acquire (waiting)", got)?;
    ensure!(
        CHECK,
        got_at >= released_at,
        "the waiter got the lock before it was released"
    );
    op(CHECK, "release", b.release().await)?;

    let holder = op(CHECK, "try_acquire", l1.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a released key was not granted again"))?;
    let budget = Duration::from_millis(500);
    let t0 = Instant::now();
    let timed_out = l2.acquire(&key, budget).await;
    let elapsed = t0.elapsed();
    match timed_out {
        Ok(_) => return Err(Failure::new(CHECK, "acquire succeeded on a held key")),
        Err(e) => {
            ensure!(
                CHECK,
                e.kind() == ErrorKind::Timeout,
                "expected a timeout, got {e}"
            );
            ensure!(
                CHECK,
                e.attempts().is_some_and(|n| n >= 1),
                "the timeout does not report attempts: {e}"
            );
        }
    }
    ensure!(
        CHECK,
        elapsed >= budget - Duration::from_millis(5) && elapsed < budget + Duration::from_secs(3),
        "gave up after {elapsed:?} with a budget of {budget:?}"
    );
    ensure!(
        CHECK,
        op(CHECK, "release", holder.release().await)?,
        "holder lost the lock while another client waited"
    );
    Ok(())
}

/// 3. Release and extend act only on our own grant: after our grant lapses and another client
///    acquires, our release says "not held" and their lock survives; our extend fails; our lost
///    signal has fired; a fenced write with our old token is rejected after theirs.
pub async fn own_grant_only(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "own_grant_only";
    let key = unique_key(CHECK)?;
    let caps = t.caps();
    let l1 = t.locker(&t.primary, t.short_ttl, leasehold_core::Renewal::Off)?;
    let l2 = t.locker(&t.other, t.long_ttl(), leasehold_core::Renewal::Auto)?;

    let a = op(CHECK, "try_acquire", l1.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    t.expire(&a, t.short_ttl).await;
    let lost = tokio::time::timeout(Duration::from_secs(10), a.lost().wait()).await;
    ensure!(
        CHECK,
        lost.is_ok(),
        "the lost signal did not fire after the grant lapsed"
    );
    let b = op(
        CHECK,
        "acquire after expiry",
        l2.acquire(&key, Duration::from_secs(10)).await,
    )?;

    let ours = op(CHECK, "stale release", a.release().await)?;
    ensure!(
        CHECK,
        !ours,
        "our release said we held a lock that another client holds"
    );
    let probe = t.locker(&t.primary, t.long_ttl(), leasehold_core::Renewal::Off)?;
    let still = op(CHECK, "try_acquire (theirs)", probe.try_acquire(&key).await)?;
    ensure!(
        CHECK,
        still.is_none(),
        "our stale release deleted their lock"
    );

    let ext = a.extend(t.short_ttl).await;
    ensure!(
        CHECK,
        ext.as_ref().err().map(Error::kind) == Some(ErrorKind::LeaseLost),
        "extend of a lost lease did not fail with LeaseLost: {ext:?}"
    );
    if caps.renewal == RenewalKind::Extend {
        // Ask the backend itself, bypassing the lease's own bookkeeping.
        let held = Held::new(&key, a.owner(), a.fencing_token(), None);
        let raw = t
            .primary
            .extend(ExtendRequest::new(held, t.long_ttl(), Instant::now()))
            .await;
        ensure!(
            CHECK,
            matches!(raw, Ok(None)),
            "the backend extended a grant that is not ours: {raw:?}"
        );
        let still = op(CHECK, "try_acquire (theirs)", probe.try_acquire(&key).await)?;
        ensure!(
            CHECK,
            still.is_none(),
            "their lock vanished after our stale extend"
        );
    }
    let fired = tokio::time::timeout(Duration::from_millis(100), a.lost().wait()).await;
    ensure!(
        CHECK,
        fired.is_ok() && a.is_lost(),
        "the lost signal is not set"
    );

    if caps.fencing.mints_tokens() {
        let (ta, tb) = (a.fencing_token(), b.fencing_token());
        let (Some(ta), Some(tb)) = (ta, tb) else {
            return Err(Failure::new(CHECK, "a fencing backend gave no token"));
        };
        ensure!(
            CHECK,
            tb > ta,
            "the new holder's token {tb} is not above ours {ta}"
        );
        let resource = FencedResource::new();
        ensure!(
            CHECK,
            resource.write("r", tb).is_ok(),
            "the new holder's write was rejected"
        );
        ensure!(
            CHECK,
            resource.write("r", ta).is_err(),
            "our stale write was accepted after the new holder's"
        );
    }
    let theirs = op(CHECK, "release (theirs)", b.release().await)?;
    ensure!(
        CHECK,
        theirs,
        "their lock did not survive our stale release"
    );
    Ok(())
}

/// 4. Fencing tokens strictly increase across successive holders under contention, for a backend
///    that mints them; one that doesn't returns none, consistently.
pub async fn fencing_tokens(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "fencing_tokens";
    const WORKERS: usize = 4;
    const ROUNDS: usize = 5;
    let key = unique_key(CHECK)?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shared = Arc::clone(&seen);
    in_turns(t, CHECK, &key, WORKERS, ROUNDS, move |lease| {
        let seen = Arc::clone(&shared);
        async move {
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(lease.fencing_token());
            tokio::task::yield_now().await;
            op(CHECK, "release", lease.release().await)?;
            Ok(())
        }
    })
    .await?;
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(PoisonError::into_inner));
    ensure!(
        CHECK,
        seen.len() == WORKERS * ROUNDS,
        "only {} grants",
        seen.len()
    );
    if t.caps().fencing.mints_tokens() {
        let tokens: Option<Vec<u64>> = seen.iter().map(|t| t.map(|t| t.get())).collect();
        let tokens = tokens
            .ok_or_else(|| Failure::new(CHECK, "a fencing backend gave a grant without a token"))?;
        for pair in tokens.windows(2) {
            ensure!(
                CHECK,
                pair[0] < pair[1],
                "tokens do not strictly increase in grant order: {tokens:?}"
            );
        }
    } else {
        ensure!(
            CHECK,
            seen.iter().all(Option::is_none),
            "a backend that declares no fencing gave tokens: {seen:?}"
        );
    }
    Ok(())
}
