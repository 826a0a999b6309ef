//! A real network partition between a lock holder and PostgreSQL: a throwaway server (its own
//! `initdb`) in a network namespace (`leasehold_test_support::netns`, needs root), the holder
//! reaching it by a second path that is cut (blackhole routes both ways: no RST, no
//! `pg_terminate_backend`), another client reaching it by the first path.
//!
//! The holder's health check reports the loss within its bound (interval + timeout). The
//! server, though, keeps the advisory lock for as long as it keeps the session, and an idle
//! session whose client vanished is kept until a setting ends it:
//! - `tcp_keepalives_idle` / `tcp_keepalives_interval` / `tcp_keepalives_count` (TCP probes of
//!   an idle connection: here 1 s + 2 × 1 s) together with `tcp_user_timeout` (here 3 s): the
//!   keep-alives alone are not enough, since a probe is sent only while nothing is in flight,
//!   and the server's answer to the holder's last health check usually is (its ACK was cut);
//!   unacknowledged data is retransmitted for about 15 minutes (`tcp_retries2`) unless
//!   `tcp_user_timeout` ends it,
//! - `idle_session_timeout` (a session idle outside a transaction; the health check's queries
//!   keep a live holder's session from ever being idle that long),
//! - without either, the lock stays taken for the kernel's default keep-alive time (two hours
//!   on Linux): the last test shows it still held well past both bounds, until the path heals
//!   and the holder's closed connection reaches the server.
//!
//! Own test binary; the partition tests of all binaries run one at a time (`Net`'s lock).

mod common;

use std::time::Duration;

use common::BoxError;
use leasehold_core::Locker;
use leasehold_postgres::{PostgresBackend, PostgresConfig};
use leasehold_test_support::netns::Net;
use tokio::time::{Instant, sleep, timeout};

const HEALTH_INTERVAL: Duration = Duration::from_millis(250);
const HEALTH_TIMEOUT: Duration = Duration::from_millis(500);

/// What one cut showed: when the holder was told, and when (if within `limit`) the other
/// client took the lock.
struct Seen {
    told: Duration,
    taken: Option<Duration>,
}

async fn locker(url: &str, app: &str) -> Result<Locker, BoxError> {
    let cfg = PostgresConfig::from_url(url)?
        .with_health(HEALTH_INTERVAL, HEALTH_TIMEOUT)?
        .with_application_name(app);
    Ok(Locker::new(PostgresBackend::connect(cfg).await?))
}

/// A server with `settings` in a namespace; the holder's path is cut under a held lock and the
/// other client tries to take the lock for up to `limit`. Healed at the end when `heal`, and
/// then the other client must get the lock.
async fn cut_under_a_held_lock(
    tag: &str,
    settings: &[(&str, &str)],
    limit: Duration,
) -> Result<Seen, BoxError> {
    let net = Net::create(tag, 1)?;
    let alias = net.add_path(1)?;
    let url = net.postgres(1, settings).await?;
    let holder_url = url.replace(&net.addr(1).to_string(), &alias.to_string());
    let holder = locker(&holder_url, "partition-holder").await?;
    let other = locker(&url, "partition-other").await?;
    let lease = holder
        .try_acquire("job")
        .await?
        .ok_or("the lock was taken")?;
    assert!(other.try_acquire("job").await?.is_none(), "not exclusive");

    net.cut_path(1)?;
    let t0 = Instant::now();
    let signal = lease.lost();
    let told = tokio::spawn(async move {
        let _ = signal.await;
        t0.elapsed()
    });
    let mut taken = None;
    while t0.elapsed() < limit {
        if let Ok(Ok(Some(l))) = timeout(Duration::from_secs(2), other.try_acquire("job")).await {
            assert!(lease.is_lost(), "double grant: the holder was not told yet");
            taken = Some(t0.elapsed());
            l.release().await?;
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    let told = timeout(Duration::from_secs(3), told)
        .await
        .map_err(|_| "the holder was never told")??;
    eprintln!("{tag}: holder told after {told:?}, other took the lock after {taken:?}");
    if taken.is_none() {
        // Healed, the holder's closed connection reaches the server, which frees the lock.
        net.heal_path(1)?;
        let t1 = Instant::now();
        let again = other.acquire("job", Duration::from_secs(30)).await?;
        eprintln!(
            "{tag}: healed; other took the lock {:?} later",
            t1.elapsed()
        );
        again.release().await?;
    }
    Ok(Seen { told, taken })
}

fn assert_told_within_the_health_bound(seen: &Seen) {
    let bound = HEALTH_INTERVAL + HEALTH_TIMEOUT;
    assert!(
        seen.told <= bound + Duration::from_millis(1_500),
        "the health check took {:?} to report the loss (bound {bound:?})",
        seen.told
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_keepalives_and_user_timeout_bound_how_long_the_server_keeps_a_cut_holders_lock()
-> Result<(), BoxError> {
    let settings = [
        ("tcp_keepalives_idle", "1"),
        ("tcp_keepalives_interval", "1"),
        ("tcp_keepalives_count", "2"),
        ("tcp_user_timeout", "3000"),
    ];
    let seen = cut_under_a_held_lock("pgka", &settings, Duration::from_secs(15)).await?;
    assert_told_within_the_health_bound(&seen);
    let taken = seen
        .taken
        .ok_or("the server never freed the cut holder's lock")?;
    // 3 s either way (1 s idle + 2 probes 1 s apart, or 3 s unacknowledged), with slack.
    assert!(taken <= Duration::from_secs(3 + 5), "freed after {taken:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_timeout_bounds_how_long_the_server_keeps_a_cut_holders_lock()
-> Result<(), BoxError> {
    let settings = [("idle_session_timeout", "2s")];
    let seen = cut_under_a_held_lock("pgidle", &settings, Duration::from_secs(15)).await?;
    assert_told_within_the_health_bound(&seen);
    let taken = seen
        .taken
        .ok_or("the server never freed the cut holder's lock")?;
    assert!(taken <= Duration::from_secs(2 + 5), "freed after {taken:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_either_setting_the_server_keeps_a_cut_holders_lock() -> Result<(), BoxError> {
    let seen = cut_under_a_held_lock("pgnone", &[], Duration::from_secs(10)).await?;
    assert_told_within_the_health_bound(&seen);
    assert_eq!(
        seen.taken, None,
        "the lock was freed without keep-alives or an idle timeout"
    );
    Ok(())
}
