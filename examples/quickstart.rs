//! A tour of leasehold on the in-memory backend: no services needed.
//!
//! Run it with `cargo run --example quickstart`.

use std::time::Duration;

use leasehold::{Error, LockOptions, Locker, MemoryBackend, Renewal};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());

    // 1. Take a lock. The lease carries a fencing token: send it with every write.
    let lease = locker
        .acquire("reports/daily", Duration::from_secs(1))
        .await?;
    println!(
        "1. acquired {:?}: fencing token {:?}, valid for {:?}",
        lease.key().as_str(),
        lease.fencing_token().map(|t| t.get()),
        lease.remaining()
    );

    // 2. Someone else trying meets contention, which is not an error.
    let other = locker.try_acquire("reports/daily").await?;
    println!(
        "2. a second try_acquire while held: {:?}",
        other.map(|_| "granted?!")
    );

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
    println!("3. release: we still held it = {}", lease.release().await?);
    let next = waiter
        .await
        .map_err(|e| Error::new(leasehold::ErrorKind::Backend, "quickstart", e.to_string()))??;
    println!(
        "   the waiter got it with token {:?} (> {:?})",
        next.fencing_token().map(|t| t.get()),
        lease.fencing_token().map(|t| t.get())
    );
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
        Err(e) => println!("4. long work under a 200 ms lease was cancelled: {e}"),
        Ok(()) => println!("4. unexpected: the work outlived its lease"),
    }
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
            40 + 2
        })
        .await?;
    println!(
        "   with_lock returned {sum}; keys still held: {}",
        backend.held_count()
    );
    Ok(())
}
