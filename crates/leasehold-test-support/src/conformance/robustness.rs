//! Checks 7–8: cancellation at any point leaks nothing; bad input is a typed error.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use leasehold_core::{Error, ErrorKind, KeyError, Locker};
use rand::Rng;
use tokio::time::Instant;

use super::target::{Failure, Target, op, prompt_try, unique_key};

/// 7. 1,000 acquire futures dropped at random points (before the first poll, mid-request,
///    mid-wait, right after the grant) while another task churns the lock; afterwards the backend
///    holds nothing and the key is acquirable at once.
pub async fn cancellation(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "cancellation";
    const DROPS: usize = 1_000;
    let key = unique_key(CHECK)?;
    let l1 = t.locker(&t.primary, t.long_ttl(), leasehold_core::Renewal::Auto)?;
    let l2 = t.locker(&t.other, t.long_ttl(), leasehold_core::Renewal::Auto)?;
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (l1, key, stop) = (l1.clone(), key.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(Some(lease)) = l1.try_acquire(&key).await {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    let _ = lease.release().await;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let waker = Waker::noop();
    for i in 0..DROPS {
        let locker = if i % 2 == 0 { &l1 } else { &l2 };
        let (mode, polls, micros) = {
            let mut rng = rand::rng();
            (
                rng.random_range(0..4u8),
                rng.random_range(0..4usize),
                rng.random_range(0..3_000u64),
            )
        };
        match mode {
            0 => poll_then_drop(locker.try_acquire(&key), polls, waker),
            1 => poll_then_drop(
                locker.acquire(&key, Duration::from_millis(50)),
                polls,
                waker,
            ),
            2 => {
                let _ = tokio::time::timeout(
                    Duration::from_micros(micros),
                    locker.acquire(&key, Duration::from_millis(20)),
                )
                .await;
            }
            _ => {
                let _ =
                    tokio::time::timeout(Duration::from_micros(micros), locker.try_acquire(&key))
                        .await;
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    churn
        .await
        .map_err(|e| Failure::new(CHECK, format!("churn task panicked: {e}")))?;

    let settle_by = Instant::now() + t.settle;
    // Background clean-ups may still be landing: nothing must be held for a few samples in a
    // row, not just once.
    let mut quiet = 0;
    loop {
        let held = match &t.held {
            Some(hook) => op(CHECK, "held hook", hook().await)?,
            None => usize::from(op(CHECK, "inspect", t.primary.inspect(&key).await)?.is_some()),
        };
        if held == 0 {
            quiet += 1;
            if quiet == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        quiet = 0;
        ensure!(
            CHECK,
            Instant::now() < settle_by,
            "{held} grant(s) still held {:?} after the last dropped acquire",
            t.settle
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lease = prompt_try(CHECK, &l2, &key, Duration::from_secs(1)).await?;
    ensure!(
        CHECK,
        lease.is_some(),
        "the key is still held after the drops settled"
    );
    Ok(())
}

/// Polls `fut` up to `polls` times with a waker that does nothing, then drops it wherever it is.
fn poll_then_drop<F: Future>(fut: F, polls: usize, waker: &Waker) {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(waker);
    for _ in 0..polls {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            drop(out);
            return;
        }
    }
}

/// 8. Empty, oversized and NUL keys; a zero TTL, a TTL below the drift margin and an absurd TTL:
///    typed errors, no panic.
pub async fn bad_input(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "bad_input";
    let locker = t.locker(&t.primary, t.long_ttl(), leasehold_core::Renewal::Off)?;
    let long = "k".repeat(leasehold_core::MAX_KEY_LEN + 1);
    for (bad, want) in [
        ("", KeyError::Empty),
        (
            long.as_str(),
            KeyError::TooLong {
                len: long.len(),
                max: leasehold_core::MAX_KEY_LEN,
            },
        ),
        ("a\0b", KeyError::ContainsNul { offset: 1 }),
    ] {
        for r in [
            locker.try_acquire(bad).await.map(|_| ()),
            locker
                .acquire(bad, Duration::from_millis(10))
                .await
                .map(|_| ()),
            locker.inspect(bad).await.map(|_| ()),
        ] {
            let e = r.err();
            ensure!(
                CHECK,
                e.as_ref().map(Error::kind) == Some(ErrorKind::InvalidKey)
                    && e.as_ref().and_then(Error::key_error) == Some(&want),
                "key {:?}: expected InvalidKey({want:?}), got {e:?}",
                bad.get(..20).unwrap_or(bad)
            );
        }
    }
    let caps = t.caps();
    let base = Locker::from_arc(Arc::clone(&t.primary));
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(2),
        caps.max_ttl + Duration::from_secs(1),
        Duration::from_secs(100 * 365 * 86_400),
        Duration::MAX,
    ] {
        let r = base.clone().with_ttl(ttl);
        ensure!(
            CHECK,
            r.as_ref().err().map(Error::kind) == Some(ErrorKind::InvalidArgument),
            "ttl {ttl:?} was not rejected as an invalid argument"
        );
    }
    let key = unique_key(CHECK)?;
    let lease = op(CHECK, "try_acquire", locker.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    for ttl in [Duration::ZERO, Duration::MAX] {
        let r = lease.extend(ttl).await;
        ensure!(
            CHECK,
            r.as_ref().err().map(Error::kind) == Some(ErrorKind::InvalidArgument),
            "extend({ttl:?}) was not rejected as an invalid argument: {r:?}"
        );
    }
    ensure!(
        CHECK,
        op(CHECK, "release", lease.release().await)?,
        "bad extends broke the lease"
    );
    Ok(())
}
