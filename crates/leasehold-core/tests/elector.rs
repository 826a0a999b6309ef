//! The [`Elector`] on the memory backend: campaigns, hand-over, retries after faults, refusal.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    Candidate, ElectionBackend, Elector, Error, ErrorKind, LeaderStore, LockBackend, LockElection,
    LockKey, LockOptions, MemoryBackend, Owner, Renewal,
};

fn options() -> LockOptions {
    LockOptions::default().with_ttl(Duration::from_secs(1))
}

fn elector(backend: &Arc<MemoryBackend>, value: &str) -> Result<Elector, Error> {
    let b: Arc<dyn LockBackend> = backend.clone();
    Elector::new(b, "elected", Candidate::new(value)?, options())
}

#[tokio::test(start_paused = true)]
async fn resign_hands_over_at_once_and_terms_grow() -> Result<(), Error> {
    let backend = Arc::new(MemoryBackend::new());
    let (a, b) = (elector(&backend, "a")?, elector(&backend, "b")?);
    let first = a.campaign().await?;
    let mut watch = b.watch().await?;
    assert_eq!(watch.borrow().as_ref().map(|l| l.value.as_str()), Some("a"));
    let next = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!next.is_finished(), "b waits while a leads (renewed)");
    let t0 = tokio::time::Instant::now();
    let term = first.term();
    assert!(first.resign().await?);
    let second = next.await.map_err(|e| fault(&e.to_string()))??;
    assert_eq!(tokio::time::Instant::now(), t0, "woken by the resignation");
    assert!(second.term() > term);
    watch.changed().await.map_err(|e| fault(&e.to_string()))?;
    while watch.borrow().as_ref().map(|l| l.term) != Some(second.term()) {
        watch.changed().await.map_err(|e| fault(&e.to_string()))?;
    }
    let now = a.leader().await?.ok_or_else(|| fault("a leader"))?;
    assert_eq!((now.value.as_str(), now.term), ("b", second.term()));
    // An election does not take the lock of the same key, nor the other way round.
    let lock = leasehold_core::Locker::from_arc(backend.clone() as Arc<dyn LockBackend>);
    assert!(lock.try_acquire("elected").await?.is_some());
    drop(second);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(a.leader().await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_lost_leadership_lets_another_lead_with_a_higher_term() -> Result<(), Error> {
    let backend = Arc::new(MemoryBackend::new());
    let b: Arc<dyn LockBackend> = backend.clone();
    let a = Elector::new(
        Arc::clone(&b),
        "k",
        Candidate::new("a")?,
        options().with_renewal(Renewal::Off),
    )?;
    let first = a.campaign().await?;
    let second = elector(&backend, "b")?;
    let second = tokio::spawn(async move { second.campaign_for(Duration::from_secs(5)).await });
    first.lost().await;
    let won = second.await.map_err(|e| fault(&e.to_string()))??;
    assert!(won.term() > first.term());
    assert!(first.is_lost());
    // And the loser may campaign again.
    drop(won);
    assert!(a.campaign_for(Duration::from_secs(5)).await?.term() > first.term());
    Ok(())
}

/// A store whose first publications fail, as a flaky server would.
#[derive(Debug, Default)]
struct Flaky {
    failures: AtomicU32,
    inner: std::sync::Mutex<Option<(Owner, Candidate)>>,
}

#[async_trait]
impl LeaderStore for Flaky {
    async fn publish(&self, _: &LockKey, owner: &Owner, value: &Candidate) -> Result<(), Error> {
        if self.failures.fetch_add(1, Ordering::SeqCst) < 3 {
            return Err(Error::new(ErrorKind::Unavailable, "flaky", "down").with_retryable(false));
        }
        if let Ok(mut v) = self.inner.lock() {
            *v = Some((owner.clone(), value.clone()));
        }
        Ok(())
    }
    async fn read(&self, _: &LockKey) -> Result<Option<(Owner, Candidate)>, Error> {
        Ok(self.inner.lock().ok().and_then(|v| v.clone()))
    }
    async fn clear(&self, _: &LockKey, _: &Owner) -> Result<(), Error> {
        Ok(())
    }
}

/// A backend whose election view is a [`LockElection`] over a flaky store.
#[derive(Debug, Default)]
struct FlakyElections {
    locks: MemoryBackend,
    store: Arc<Flaky>,
}

#[async_trait]
impl LockBackend for FlakyElections {
    leasehold_core::refuse_semaphores!("a test");
    fn election(self: Arc<Self>, c: Candidate) -> Result<Arc<dyn ElectionBackend>, Error> {
        let locks: Arc<dyn LockBackend> = Arc::new(self.locks.clone());
        let store: Arc<dyn LeaderStore> = self.store.clone();
        Ok(Arc::new(LockElection::new(
            locks,
            store,
            c,
            Duration::from_millis(10),
        )))
    }
    fn capabilities(&self) -> leasehold_core::Capabilities {
        self.locks
            .capabilities()
            .without_primitives()
            .with_elections()
    }
    async fn try_lock(
        &self,
        r: leasehold_core::LockRequest<'_>,
    ) -> Result<Option<leasehold_core::Grant>, Error> {
        self.locks.try_lock(r).await
    }
    async fn wait_lock(
        &self,
        r: leasehold_core::LockRequest<'_>,
        d: tokio::time::Instant,
    ) -> Result<leasehold_core::Waited, Error> {
        self.locks.wait_lock(r, d).await
    }
    async fn release(&self, h: leasehold_core::Held<'_>) -> Result<bool, Error> {
        self.locks.release(h).await
    }
    async fn extend(
        &self,
        r: leasehold_core::ExtendRequest<'_>,
    ) -> Result<Option<leasehold_core::Validity>, Error> {
        self.locks.extend(r).await
    }
    async fn extend_many(
        &self,
        r: &[leasehold_core::ExtendRequest<'_>],
    ) -> Vec<leasehold_core::Extended> {
        self.locks.extend_many(r).await
    }
    async fn inspect(&self, k: &LockKey) -> Result<Option<leasehold_core::HolderInfo>, Error> {
        self.locks.inspect(k).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_campaign_keeps_trying_after_faults() -> Result<(), Error> {
    let backend = Arc::new(FlakyElections::default());
    let store = Arc::clone(&backend.store);
    let b: Arc<dyn LockBackend> = backend;
    let e = Elector::new(b, "k", Candidate::new("a")?, options())?;
    let won = e.campaign().await?;
    assert!(
        store.failures.load(Ordering::SeqCst) >= 4,
        "failed, then won"
    );
    assert_eq!(e.leader().await?.map(|l| l.term), Some(won.term()));
    Ok(())
}

#[tokio::test]
async fn bad_values_and_refusing_backends_are_errors() -> Result<(), Error> {
    assert_eq!(
        Candidate::new("").err().map(|e| e.kind()),
        Some(ErrorKind::InvalidArgument)
    );
    assert!(Candidate::new("a\0b").is_err());
    assert!(Candidate::new("x".repeat(4097)).is_err());
    let view = Arc::new(MemoryBackend::new()).election(Candidate::new("v")?)?;
    let nested = Arc::new(LockElection::new(
        view.clone(),
        Arc::new(Flaky::default()),
        Candidate::new("v")?,
        Duration::from_millis(10),
    ));
    let refused = nested.election(Candidate::new("v")?).err();
    assert_eq!(refused.map(|e| e.kind()), Some(ErrorKind::Unsupported));
    Ok(())
}

fn fault(what: &str) -> Error {
    Error::new(ErrorKind::Backend, "test", format!("expected {what}"))
}
