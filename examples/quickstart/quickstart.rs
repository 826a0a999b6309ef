//! A tour of leasehold on the in-memory backend: no services needed.
//!
//! Run it with `cargo run --example quickstart` from the workspace root. Every step checks what
//! it shows: anything unexpected ends the tour with an error and a non-zero exit status.
//!
//! It is written against `leasehold-core`, whose names the `leasehold` facade re-exports
//! (`leasehold::Locker` is `leasehold_core::Locker`). Its package depends on the core alone so
//! that it builds with nothing but cargo: built from the workspace root, the facade gets the
//! driver features that other members enable, and the etcd driver's build needs `protoc`.

use std::time::Duration;

use leasehold_core::{Error, ErrorKind, LockOptions, Locker, MemoryBackend, Renewal};

/// Whatever ends the tour early: an error of leasehold, or a step that did not go as shown.
type TourError = Box<dyn std::error::Error + Send + Sync>;

/// Fails the tour with `what` unless `holds`.
fn check(holds: bool, what: &str) -> Result<(), TourError> {
    if holds {
        Ok(())
    } else {
        Err(format!("unexpected: {what}").into())
    }
}

#[tokio::main]
async fn main() -> Result<(), TourError> {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());

    // 1. Take a lock. The lease carries a fencing token: send it with every write.
    let lease = locker
        .acquire("reports/daily", Duration::from_secs(1))
        .await?;
    let first = lease.fencing_token();
    println!(
        "1. acquired {:?}: fencing token {:?}, valid for {:?}",
        lease.key().as_str(),
        first.map(|t| t.get()),
        lease.remaining()
    );
    check(
        first.is_some(),
        "the in-memory backend minted no fencing token",
    )?;

    // 2. Someone else trying meets contention, which is not an error.
    let other = locker.try_acquire("reports/daily").await?;
    println!(
        "2. a second try_acquire while held: {:?}",
        other.as_ref().map(|_| "granted")
    );
    check(other.is_none(), "a second holder was granted the lock")?;

    // 3. A waiter gets the lock as soon as it is released, with a higher token.
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            locker
                .acquire("reports/daily", Duration::from_secs(5))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = lease.release().await?;
    println!("3. release: we still held it = {held}");
    check(held, "the lease was no longer held at release")?;
    let next = waiter
        .await
        .map_err(|e| Error::new(ErrorKind::Backend, "quickstart", e.to_string()))??;
    let second = next.fencing_token();
    println!(
        "   the waiter got it with token {:?} (> {:?})",
        second.map(|t| t.get()),
        first.map(|t| t.get())
    );
    check(second > first, "the waiter's token is not higher")?;
    next.release().await?;

    // 4. A lease without renewal is lost at its deadline, and the holder is told.
    let short = locker.clone().with_options(
        LockOptions::default()
            .with_ttl(Duration::from_millis(200))
            .with_renewal(Renewal::Off),
    )?;
    let lease = short.acquire("jobs/cleanup", Duration::ZERO).await?;
    let work = lease.run(tokio::time::sleep(Duration::from_secs(10))).await;
    match work {
        Err(e) if e.kind() == ErrorKind::LeaseLost => {
            println!("4. long work under a 200 ms lease was cancelled: {e}");
        }
        Err(e) => return Err(e.into()),
        Ok(()) => check(false, "the work outlived its 200 ms lease")?,
    }
    check(lease.is_lost(), "the lease does not say it is lost")?;
    println!(
        "   releasing it now: we still held it = {}",
        lease.release().await?
    );

    // 5. with_lock: acquire, run, release; the closure gets the token and the lost signal.
    let sum = locker
        .with_lock("counters/a", Duration::from_secs(1), |info| async move {
            println!(
                "5. inside with_lock, token {:?}",
                info.fencing.map(|t| t.get())
            );
            (40 + 2, info.fencing.is_some())
        })
        .await?;
    let (sum, fenced) = sum;
    check(fenced, "with_lock's work got no fencing token")?;
    let left = backend.held_count();
    println!("   with_lock returned {sum}; keys still held: {left}");
    check(sum == 42 && left == 0, "with_lock left a key held")?;
    Ok(())
}
