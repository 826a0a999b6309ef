//! The election contract every backend that gives elections must pass: one leader at a time,
//! strictly increasing terms, a fast hand-over on `resign()`, `leader()` and `watch()` seeing
//! each change, a new leader with a higher term after a loss, a renewed leadership that
//! outlives its TTL, and a long wait that takes over without a phantom leadership.
//!
//! A driver's tests run them all with [`election_tests!`](crate::election_tests), given an
//! `async fn() -> Option<ElectionTarget>`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{Candidate, Elector, Leader, LockBackend, LockKey, Renewal};
use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

use super::target::{ExpireHook, Failure, op, unique_key};

/// What the election checks run against.
#[derive(Clone)]
pub struct ElectionTarget {
    /// The first client.
    pub primary: Arc<dyn LockBackend>,
    /// A second, independent client of the same service.
    pub other: Arc<dyn LockBackend>,
    /// The leadership TTL the checks use.
    pub ttl: Duration,
    /// The longest a hand-over may take, from `resign()` returning to the next candidate's
    /// `campaign()` returning: well under the TTL with a native wait, one polling interval
    /// (plus slack) without.
    pub handoff: Duration,
    /// Makes a leadership lapse for real; without it the check lets an unrenewed one expire.
    pub expire: Option<ExpireHook>,
    /// What must live as long as the backends (a test folder), dropped with the last clone of
    /// the target.
    pub keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl ElectionTarget {
    /// A target without an expiry hook.
    pub fn new(
        primary: Arc<dyn LockBackend>,
        other: Arc<dyn LockBackend>,
        ttl: Duration,
        handoff: Duration,
    ) -> Self {
        Self {
            primary,
            other,
            ttl,
            handoff,
            expire: None,
            keep: None,
        }
    }

    /// Adds the expiry hook.
    pub fn with_expire(self, hook: ExpireHook) -> Self {
        let expire = Some(hook);
        Self { expire, ..self }
    }

    /// Keeps `value` (a test folder the backends use) until the target is dropped.
    pub fn keeping(self, value: impl std::any::Any + Send + Sync) -> Self {
        let keep: Option<Arc<dyn std::any::Any + Send + Sync>> = Some(Arc::new(value));
        Self { keep, ..self }
    }

    /// Candidate `n` (alternating between the two clients) for `key`, publishing `value`.
    pub fn elector(
        &self,
        n: usize,
        key: &LockKey,
        value: &str,
        renewal: Renewal,
    ) -> Result<Elector, Failure> {
        let backend = if n.is_multiple_of(2) {
            &self.primary
        } else {
            &self.other
        };
        let candidate = op("setup", "candidate", Candidate::new(value))?;
        let options = crate::harness::options(self.ttl, renewal);
        op(
            "setup",
            "elector",
            Elector::new(Arc::clone(backend), key.clone(), candidate, options),
        )
    }
}

checks!(ELECTION_CHECKS, run_election(ElectionTarget):
    one_leader_at_a_time, resign_hands_over, leader_and_watch, loss_brings_a_new_leader,
    a_renewed_leadership_lasts, a_long_wait_shows_no_phantom_leader);

/// The generous bound of every wait in these checks that should be short.
const PATIENCE: Duration = Duration::from_secs(20);

/// Three candidates (across both clients) each lead four times, holding for a random while:
/// the recorded leaderships never overlap, their terms increase in the order they began, and a
/// leader's `leader()` names itself.
pub async fn one_leader_at_a_time(t: &ElectionTarget) -> Result<(), Failure> {
    const CHECK: &str = "one_leader_at_a_time";
    let key = unique_key(CHECK)?;
    let record = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..3 {
        let e = t.elector(n, &key, &format!("candidate-{n}"), Renewal::Auto)?;
        let record = Arc::clone(&record);
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let won = op(
                    CHECK,
                    "campaign",
                    e.campaign_for(Duration::from_secs(60)).await,
                )?;
                let start = Instant::now();
                let seen = op(CHECK, "leader", e.leader().await)?;
                let me = Leader::new(e.candidate().clone(), won.term());
                ensure!(
                    CHECK,
                    seen.as_ref() == Some(&me),
                    "leader() says {seen:?}, not {me:?}"
                );
                let hold = rand::rng().random_range(0..30);
                tokio::time::sleep(Duration::from_millis(hold)).await;
                let end = Instant::now();
                ensure!(CHECK, !won.is_lost(), "leadership lost while held");
                if let Ok(mut r) = record.lock() {
                    r.push((start, end, won.term()));
                }
                op(CHECK, "resign", won.resign().await)?;
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::new(CHECK, format!("candidate panicked: {e}")))??;
    }
    let mut spans = record.lock().map(|r| r.clone()).unwrap_or_default();
    ensure!(
        CHECK,
        spans.len() == 12,
        "{} leaderships recorded",
        spans.len()
    );
    spans.sort_by_key(|s| s.0);
    for pair in spans.windows(2) {
        let ((_, end, term), (start, _, next)) = (pair[0], pair[1]);
        ensure!(
            CHECK,
            end <= start,
            "two leaders at once (terms {term} and {next})"
        );
        ensure!(CHECK, next > term, "term {next} follows term {term}");
    }
    Ok(())
}

/// A waiting candidate takes over within [`ElectionTarget::handoff`] of `resign()` returning.
pub async fn resign_hands_over(t: &ElectionTarget) -> Result<(), Failure> {
    const CHECK: &str = "resign_hands_over";
    let key = unique_key(CHECK)?;
    let (a, b) = (
        t.elector(0, &key, "a", Renewal::Auto)?,
        t.elector(1, &key, "b", Renewal::Auto)?,
    );
    let first = op(CHECK, "campaign a", a.campaign_for(PATIENCE).await)?;
    let next = tokio::spawn(async move {
        let won = b.campaign_for(PATIENCE).await;
        (won, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(CHECK, !next.is_finished(), "b led while a did");
    let term = first.term();
    op(CHECK, "resign", first.resign().await)?;
    let resigned = Instant::now();
    let (won, at) = next
        .await
        .map_err(|e| Failure::new(CHECK, format!("b panicked: {e}")))?;
    let won = op(CHECK, "campaign b", won)?;
    let took = at.saturating_duration_since(resigned);
    ensure!(
        CHECK,
        took <= t.handoff,
        "hand-over took {took:?}, bound {:?}",
        t.handoff
    );
    ensure!(CHECK, won.term() > term, "term {} after {term}", won.term());
    op(CHECK, "resign", won.resign().await)?;
    Ok(())
}

/// An observer's `watch()` sees a, then b with a higher term, then nobody; `leader()` agrees.
pub async fn leader_and_watch(t: &ElectionTarget) -> Result<(), Failure> {
    const CHECK: &str = "leader_and_watch";
    let key = unique_key(CHECK)?;
    let observer = t.elector(1, &key, "observer", Renewal::Auto)?;
    let (a, b) = (
        t.elector(0, &key, "a", Renewal::Auto)?,
        t.elector(1, &key, "b", Renewal::Auto)?,
    );
    let mut rx = op(CHECK, "watch", observer.watch().await)?;
    ensure!(CHECK, rx.borrow().is_none(), "a leader before any campaign");
    let first = op(CHECK, "campaign a", a.campaign_for(PATIENCE).await)?;
    seen(&mut rx, |l| {
        l.is_some_and(|l| l.value.as_str() == "a" && l.term == first.term())
    })
    .await?;
    let term = first.term();
    op(CHECK, "resign", first.resign().await)?;
    let second = op(CHECK, "campaign b", b.campaign_for(PATIENCE).await)?;
    ensure!(
        CHECK,
        second.term() > term,
        "term {} after {term}",
        second.term()
    );
    seen(&mut rx, |l| {
        l.is_some_and(|l| l.value.as_str() == "b" && l.term == second.term())
    })
    .await?;
    let now = op(CHECK, "leader", observer.leader().await)?;
    ensure!(
        CHECK,
        now.as_ref().map(|l| l.term) == Some(second.term()),
        "leader() says {now:?}"
    );
    op(CHECK, "resign", second.resign().await)?;
    seen(&mut rx, |l| l.is_none()).await?;
    let now = op(CHECK, "leader", observer.leader().await)?;
    ensure!(
        CHECK,
        now.is_none(),
        "leader() says {now:?} after the last resignation"
    );
    Ok(())
}

/// Waits (within [`PATIENCE`]) until the watched leader satisfies `want`.
async fn seen(
    rx: &mut watch::Receiver<Option<Leader>>,
    want: impl Fn(Option<&Leader>) -> bool,
) -> Result<(), Failure> {
    const CHECK: &str = "leader_and_watch";
    let waited = tokio::time::timeout(PATIENCE, rx.wait_for(|l| want(l.as_ref())))
        .await
        .map(|r| r.map(|_| ()));
    match waited {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Failure::new(CHECK, "the watch ended")),
        Err(_) => Err(Failure::new(
            CHECK,
            format!("the watch still says {:?}", *rx.borrow()),
        )),
    }
}

/// A leadership that lapses (unrenewed past its TTL, or through the target's hook) signals its
/// loss, and a waiting candidate leads with a higher term; the loser can campaign again.
pub async fn loss_brings_a_new_leader(t: &ElectionTarget) -> Result<(), Failure> {
    const CHECK: &str = "loss_brings_a_new_leader";
    let key = unique_key(CHECK)?;
    let renewal = if t.expire.is_some() {
        Renewal::Auto
    } else {
        Renewal::Off
    };
    let a = t.elector(0, &key, "a", renewal)?;
    let b = t.elector(1, &key, "b", Renewal::Auto)?;
    let first = op(CHECK, "campaign a", a.campaign_for(PATIENCE).await)?;
    let bound = t.ttl * 3 + PATIENCE;
    let next = tokio::spawn(async move { b.campaign_for(bound).await });
    if let Some(hook) = &t.expire {
        hook(first.lease()).await;
    }
    let lost = tokio::time::timeout(bound, first.lost()).await;
    ensure!(CHECK, lost.is_ok(), "the loss was never signalled");
    let won = next
        .await
        .map_err(|e| Failure::new(CHECK, format!("b panicked: {e}")))?;
    let won = op(CHECK, "campaign b", won)?;
    ensure!(
        CHECK,
        won.term() > first.term(),
        "term {} after {}",
        won.term(),
        first.term()
    );
    let term = won.term();
    op(CHECK, "resign", won.resign().await)?;
    let again = op(CHECK, "campaign a again", a.campaign_for(PATIENCE).await)?;
    ensure!(
        CHECK,
        again.term() > term,
        "term {} after {term}",
        again.term()
    );
    op(CHECK, "resign", again.resign().await)?;
    Ok(())
}

/// A leadership the watchdog renews outlives its TTL: two TTLs on it is not lost, and
/// `leader()` still names it with its term. (The renewal goes through the election view's
/// batched `extend_many`, which must renew the leadership, not a lock of the same key.)
pub async fn a_renewed_leadership_lasts(t: &ElectionTarget) -> Result<(), Failure> {
    const CHECK: &str = "a_renewed_leadership_lasts";
    let key = unique_key(CHECK)?;
    let a = t.elector(0, &key, "a", Renewal::Auto)?;
    let lead = op(CHECK, "campaign", a.campaign_for(PATIENCE).await)?;
    tokio::time::sleep(t.ttl * 2).await;
    ensure!(
        CHECK,
        !lead.is_lost(),
        "a renewed leadership was lost within two TTLs: {:?}",
        lead.loss_reason()
    );
    let now = op(CHECK, "leader", a.leader().await)?;
    ensure!(
        CHECK,
        now.as_ref().map(|l| l.term) == Some(lead.term()),
        "leader() says {now:?}, the leadership has term {}",
        lead.term()
    );
    op(CHECK, "resign", lead.resign().await)?;
    Ok(())
}

/// A candidate that waited longer than the TTL takes over when the leader resigns, and an
/// observer's `watch()` sees only the two leaderships that ran: no leader with a term nobody
/// led under (what a grant born expired after a long wait, given back and queued again,
/// shows as).
pub async fn a_long_wait_shows_no_phantom_leader(t: &ElectionTarget) -> Result<(), Failure> {
    const CHECK: &str = "a_long_wait_shows_no_phantom_leader";
    let key = unique_key(CHECK)?;
    let observer = t.elector(1, &key, "observer", Renewal::Auto)?;
    let a = t.elector(0, &key, "a", Renewal::Auto)?;
    let b = t.elector(1, &key, "b", Renewal::Auto)?;
    let first = op(CHECK, "campaign a", a.campaign_for(PATIENCE).await)?;
    let term_a = first.term();
    let mut rx = op(CHECK, "watch", observer.watch().await)?;
    let log = Arc::new(Mutex::new(vec![rx.borrow().clone()]));
    let seen = Arc::clone(&log);
    let watcher = tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let now = rx.borrow_and_update().clone();
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(now);
        }
    });
    let waited = t.ttl * 3 / 2;
    let next = tokio::spawn(async move { b.campaign_for(waited + PATIENCE).await });
    tokio::time::sleep(waited).await;
    op(CHECK, "resign a", first.resign().await.map(|_| ()))?;
    let second = next
        .await
        .map_err(|e| Failure::new(CHECK, format!("b panicked: {e}")))?;
    let second = op(CHECK, "campaign b", second)?;
    ensure!(
        CHECK,
        second.term() > term_a,
        "term {} after {}",
        second.term(),
        term_a
    );
    let t0 = Instant::now();
    let saw = |l: &[Option<Leader>]| l.iter().flatten().any(|l| l.term == second.term());
    while !saw(&log.lock().unwrap_or_else(PoisonError::into_inner)) {
        ensure!(CHECK, t0.elapsed() < PATIENCE, "the watch never saw b lead");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    watcher.abort();
    let log = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let phantom = log
        .iter()
        .flatten()
        .find(|l| l.term != term_a && l.term != second.term());
    ensure!(
        CHECK,
        phantom.is_none(),
        "the watch saw {phantom:?}, a leadership that never ran (a led {}, b {}): {log:?}",
        term_a,
        second.term()
    );
    op(CHECK, "resign b", second.resign().await)?;
    Ok(())
}

/// Generates one `#[tokio::test]` per election check, given the path of an
/// `async fn() -> Option<ElectionTarget>` (`None` skips, which only non-CI runs allow).
#[macro_export]
macro_rules! election_tests {
    ($target:path) => {
        $crate::election_tests!(@each $target;
            one_leader_at_a_time, resign_hands_over, leader_and_watch, loss_brings_a_new_leader,
            a_renewed_leadership_lasts, a_long_wait_shows_no_phantom_leader);
    };
    (@each $target:path; $($check:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some(target) = $target().await else { return };
                if let Err(failure) = $crate::conformance::election::$check(&target).await {
                    panic!("{failure}");
                }
            }
        )+
    };
}
