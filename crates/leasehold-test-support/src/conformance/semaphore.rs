//! The semaphore checks: at most N holders, permits freed, waiters woken, limits agreed, and
//! fairness measured. They run over the same [`Target`] as the lock checks, through
//! [`Semaphore`] views of its two clients.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{ErrorKind, LockBackend, LockKey, PermitLimit, Renewal, Semaphore};
use rand::Rng;
use tokio::time::Instant;

use super::target::{Failure, Target, op, unique_key};

checks!(SEMAPHORE_CHECKS, run_semaphore(Target):
    permit_bound, permits_freed, permit_waiters_woken, permit_limit_mismatch);

/// A semaphore of `limit` permits over `backend`, with the suite's fast backoff.
pub(super) fn semaphore(
    t: &Target,
    backend: &Arc<dyn LockBackend>,
    limit: u32,
    ttl: Duration,
    renewal: Renewal,
) -> Result<Semaphore, Failure> {
    let locker = t.locker(backend, ttl, renewal)?;
    let limit = PermitLimit::new(limit).map_err(|e| Failure::new("setup", e.to_string()))?;
    Semaphore::from_locker(&locker, limit)
        .map_err(|e| Failure::new("setup", format!("no semaphore: {e}")))
}

/// Grant intervals over real time: `(granted, released)` pairs.
#[derive(Default)]
struct Intervals {
    spans: Mutex<Vec<(Instant, Instant)>>,
    inside: AtomicUsize,
    peak: AtomicUsize,
}

impl Intervals {
    fn enter(&self) -> Instant {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Instant::now()
    }

    fn leave(&self, granted: Instant) {
        let left = Instant::now();
        self.inside.fetch_sub(1, Ordering::SeqCst);
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((granted, left));
    }

    /// The most intervals open at once, by a sweep over every recorded start and end (an end
    /// at the same instant as a start closes first: the holder left before the next came).
    fn max_overlap(&self) -> usize {
        let spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        let mut events: Vec<(Instant, i32)> =
            spans.iter().flat_map(|&(a, b)| [(a, 1), (b, -1)]).collect();
        events.sort();
        let (mut open, mut most) = (0i32, 0i32);
        for (_, step) in events {
            open += step;
            most = most.max(open);
        }
        usize::try_from(most).unwrap_or(0)
    }
}

/// How a worker of [`permit_bound`] lets go of a permit.
#[derive(Clone, Copy)]
enum Exit {
    Release,
    Drop,
}

/// S1. 4N workers (N = 3) over both clients take permits of one key in rounds, hold them for a
///     random 0–15 ms and let go by release or by drop; one acquisition in five is cancelled at
///     a random point. Every grant interval is recorded in real time: never more than N at
///     once, at least two at once (a semaphore, not a mutex), and every token distinct.
pub async fn permit_bound(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "permit_bound";
    const N: u32 = 3;
    const ROUNDS: usize = 8;
    let key = unique_key(CHECK)?;
    let log = Arc::new(Intervals::default());
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..4 * N as usize {
        let backend = if w % 2 == 0 { &t.primary } else { &t.other };
        let sem = semaphore(t, backend, N, t.long_ttl(), Renewal::Auto)?;
        let (key, log, tokens) = (key.clone(), Arc::clone(&log), Arc::clone(&tokens));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let (cancel, hold, exit) = {
                    let mut rng = rand::rng();
                    let exit = if rng.random_bool(0.3) {
                        Exit::Drop
                    } else {
                        Exit::Release
                    };
                    (rng.random_bool(0.2), rng.random_range(0..15u64), exit)
                };
                if cancel {
                    let cut = Duration::from_micros(rand::rng().random_range(0..3_000));
                    let _ =
                        tokio::time::timeout(cut, sem.acquire(&key, Duration::from_secs(60))).await;
                    continue;
                }
                let lease = op(
                    CHECK,
                    "acquire",
                    sem.acquire(&key, Duration::from_secs(60)).await,
                )?;
                let granted = log.enter();
                if let Some(token) = lease.fencing_token() {
                    tokens
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(token);
                }
                tokio::time::sleep(Duration::from_millis(hold)).await;
                log.leave(granted);
                match exit {
                    Exit::Release => {
                        op(CHECK, "release", lease.release().await)?;
                    }
                    Exit::Drop => drop(lease),
                }
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::new(CHECK, format!("worker panicked: {e}")))??;
    }
    let (overlap, peak) = (log.max_overlap(), log.peak.load(Ordering::SeqCst));
    ensure!(
        CHECK,
        overlap <= N as usize,
        "{overlap} grant intervals overlapped; the limit is {N}"
    );
    ensure!(
        CHECK,
        peak <= N as usize,
        "{peak} holders inside at once; the limit is {N}"
    );
    ensure!(
        CHECK,
        overlap >= 2,
        "never two holders at once: a mutex, not a semaphore"
    );
    let tokens = tokens.lock().unwrap_or_else(PoisonError::into_inner);
    let distinct: HashSet<_> = tokens.iter().collect();
    ensure!(
        CHECK,
        distinct.len() == tokens.len(),
        "two permits carried the same token"
    );
    Ok(())
}

/// S2. With N = 2 held, a third try is `Ok(None)` and both holders are listed; a permit comes
///     back on release, on drop (within the settle time), and when its holder is lost (the
///     target's expiry hook: TTL, killed session, revoked lease), whose lost signal fires. The
///     hook gets a permit of `primary` and may end every grant `primary` has on its key, never
///     one of `other`.
pub async fn permits_freed(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "permits_freed";
    let key = unique_key(CHECK)?;
    let ttl = t.short_ttl;
    let a_sem = semaphore(t, &t.primary, 2, t.long_ttl(), Renewal::Auto)?;
    let b_sem = semaphore(t, &t.other, 2, t.long_ttl(), Renewal::Auto)?;
    let short = semaphore(t, &t.primary, 2, ttl, Renewal::Off)?;
    let take = |sem: &Semaphore, what: &'static str| {
        let (sem, key) = (sem.clone(), key.clone());
        async move {
            op(CHECK, what, sem.try_acquire(&key).await)?
                .ok_or_else(|| Failure::new(CHECK, format!("{what}: a free permit was refused")))
        }
    };
    let a = take(&a_sem, "first permit").await?;
    let b = take(&b_sem, "second permit").await?;
    let third = op(CHECK, "third try", b_sem.try_acquire(&key).await)?;
    ensure!(
        CHECK,
        third.is_none(),
        "a third permit was granted with a limit of 2"
    );
    let holders = op(CHECK, "holders", a_sem.holders(&key).await)?;
    ensure!(
        CHECK,
        holders.len() == 2,
        "holders lists {} of 2",
        holders.len()
    );

    ensure!(
        CHECK,
        op(CHECK, "release", a.release().await)?,
        "release said not held"
    );
    let c = take(&b_sem, "after release").await?;

    drop(c);
    let mut after_drop = None;
    let until = Instant::now() + t.settle;
    while after_drop.is_none() && Instant::now() < until {
        after_drop = op(CHECK, "after drop", a_sem.try_acquire(&key).await)?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ensure!(
        CHECK,
        after_drop.is_some(),
        "a dropped permit was not freed within {:?}",
        t.settle
    );
    drop(after_drop);
    ensure!(
        CHECK,
        op(CHECK, "release", b.release().await)?,
        "release said not held"
    );

    // Both permits free again (the dropped one may still be on its way back): lose one. The
    // expiry hook may end every grant of `primary` on the key (a killed session), so the
    // permit kept through the loss is `other`'s.
    let lost = op(CHECK, "short permit", short.acquire(&key, t.settle).await)?;
    let kept = op(CHECK, "other permit", b_sem.acquire(&key, t.settle).await)?;
    t.expire(&lost, ttl).await;
    let back = op(
        CHECK,
        "after loss",
        a_sem.acquire(&key, t.settle + ttl).await,
    )?;
    let fired = tokio::time::timeout(t.settle, lost.lost().wait()).await;
    ensure!(
        CHECK,
        fired.is_ok() && lost.is_lost(),
        "the lost holder's signal did not fire within {:?}",
        t.settle
    );
    ensure!(
        CHECK,
        op(CHECK, "release", kept.release().await)?,
        "release said not held"
    );
    ensure!(
        CHECK,
        op(CHECK, "release", back.release().await)?,
        "release said not held"
    );
    Ok(())
}

/// S3. With every permit held, a waiter waits (and is not granted); a release wakes it well
///     within its budget.
pub async fn permit_waiters_woken(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "permit_waiters_woken";
    let key = unique_key(CHECK)?;
    let a_sem = semaphore(t, &t.primary, 2, t.long_ttl(), Renewal::Auto)?;
    let b_sem = semaphore(t, &t.other, 2, t.long_ttl(), Renewal::Auto)?;
    let a = op(CHECK, "first", a_sem.acquire(&key, t.settle).await)?;
    let b = op(CHECK, "second", a_sem.acquire(&key, t.settle).await)?;
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move {
            let r = b_sem.acquire(&key, Duration::from_secs(30)).await;
            (r, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        CHECK,
        !waiter.is_finished(),
        "the waiter was granted while all permits were held"
    );
    let released = Instant::now();
    ensure!(
        CHECK,
        op(CHECK, "release", a.release().await)?,
        "release said not held"
    );
    let (got, at) = waiter
        .await
        .map_err(|e| Failure::new(CHECK, format!("waiter panicked: {e}")))?;
    let c = op(CHECK, "waiter", got)?;
    let woke = at.saturating_duration_since(released);
    ensure!(
        CHECK,
        woke < Duration::from_secs(10),
        "the waiter woke {woke:?} after a release"
    );
    op(CHECK, "release", b.release().await)?;
    op(CHECK, "release", c.release().await)?;
    Ok(())
}

/// S4. While a key is held with N = 3, a client asking N = 5 is refused with
///     [`ErrorKind::InvalidConfig`] naming both limits, without waiting out its budget.
pub async fn permit_limit_mismatch(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "permit_limit_mismatch";
    let key = unique_key(CHECK)?;
    let three = semaphore(t, &t.primary, 3, t.long_ttl(), Renewal::Auto)?;
    let five = semaphore(t, &t.other, 5, t.long_ttl(), Renewal::Auto)?;
    let held = op(CHECK, "N = 3", three.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free permit was refused"))?;
    for wait in [None, Some(Duration::from_secs(20))] {
        let t0 = Instant::now();
        let got = match wait {
            None => five.try_acquire(&key).await.map(|_| ()),
            Some(w) => five.acquire(&key, w).await.map(|_| ()),
        };
        let Err(e) = got else {
            return Err(Failure::new(
                CHECK,
                "N = 5 was granted on a key held with N = 3",
            ));
        };
        ensure!(
            CHECK,
            e.kind() == ErrorKind::InvalidConfig,
            "wrong error kind: {e}"
        );
        let text = e.to_string();
        ensure!(
            CHECK,
            text.contains('3') && text.contains('5'),
            "unclear error: {text}"
        );
        ensure!(
            CHECK,
            t0.elapsed() < Duration::from_secs(5),
            "refused only after {:?}",
            t0.elapsed()
        );
    }
    op(CHECK, "release", held.release().await)?;
    Ok(())
}

/// What [`permit_fairness`] measured.
#[derive(Debug, Clone, Copy)]
pub struct Fairness {
    /// The permit count.
    pub limit: u32,
    /// How many contenders (4 × limit).
    pub contenders: usize,
    /// Grants in the run.
    pub grants: usize,
    /// The longest any contender waited for one permit.
    pub longest_wait: Duration,
    /// The mean wait.
    pub mean_wait: Duration,
}

/// Fairness, measured: 4N contenders over both clients each take a permit of one key `rounds`
/// times, holding it `hold`. Every contender must be served (none starves within its 60 s
/// budget); the longest and mean waits are returned to be reported, not bounded.
pub async fn permit_fairness(
    t: &Target,
    limit: u32,
    rounds: usize,
    hold: Duration,
) -> Result<Fairness, Failure> {
    const CHECK: &str = "permit_fairness";
    let key: LockKey = unique_key(CHECK)?;
    let contenders = 4 * limit as usize;
    let mut tasks = Vec::new();
    for w in 0..contenders {
        let backend = if w % 2 == 0 { &t.primary } else { &t.other };
        let sem = semaphore(t, backend, limit, t.long_ttl(), Renewal::Auto)?;
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut waits = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t0 = Instant::now();
                let lease = op(
                    CHECK,
                    "acquire",
                    sem.acquire(&key, Duration::from_secs(60)).await,
                )?;
                waits.push(t0.elapsed());
                tokio::time::sleep(hold).await;
                op(CHECK, "release", lease.release().await)?;
            }
            Ok::<Vec<Duration>, Failure>(waits)
        }));
    }
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(
            task.await
                .map_err(|e| Failure::new(CHECK, format!("contender panicked: {e}")))??,
        );
    }
    let grants = waits.len();
    let total: Duration = waits.iter().sum();
    Ok(Fairness {
        limit,
        contenders,
        grants,
        longest_wait: waits.iter().copied().max().unwrap_or_default(),
        mean_wait: total / u32::try_from(grants.max(1)).unwrap_or(u32::MAX),
    })
}

/// Generates one `#[tokio::test]` per semaphore check, plus `permit_fairness_measured`, which
/// prints the fairness figures (N = 2, 8 contenders).
#[macro_export]
macro_rules! semaphore_tests {
    ($target:path) => {
        $crate::conformance_tests!(@each $target;
            permit_bound, permits_freed, permit_waiters_woken, permit_limit_mismatch);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn permit_fairness_measured() {
            let Some(target) = $target().await else { return };
            match $crate::conformance::permit_fairness(
                &target, 2, 5, ::std::time::Duration::from_millis(10)).await
            {
                Ok(f) => println!("fairness: {f:?}"),
                Err(failure) => panic!("{failure}"),
            }
        }
    };
}
