//! Background work that must outlive the task that started it (releases of dropped leases,
//! clean-up of abandoned acquisitions), counted so a program can [`settle`] before it exits.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// Spawns `fut` on the current Tokio runtime, if there is one, counted until it ends (see
/// [`settle`]): for work that must outlive the call that started it, such as a background
/// release, or the requests of a driver's fan-out still on their way when its quorum has
/// decided (a program that exits right after the call would otherwise cut them off). Never
/// blocks, never panics; `false` if there is no runtime (`fut` is dropped).
pub fn spawn_detached(fut: impl Future<Output = ()> + Send + 'static) -> bool {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            let pending = Pending::start();
            drop(rt.spawn(async move {
                fut.await;
                drop(pending);
            }));
            true
        }
        Err(_) => false,
    }
}

/// How many background releases are running in this process.
fn in_flight() -> &'static watch::Sender<usize> {
    static IN_FLIGHT: std::sync::OnceLock<watch::Sender<usize>> = std::sync::OnceLock::new();
    IN_FLIGHT.get_or_init(|| watch::Sender::new(0))
}

/// One background release in flight; counted down when it ends or is cancelled.
struct Pending;

impl Pending {
    fn start() -> Self {
        in_flight().send_modify(|n| *n += 1);
        Self
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        in_flight().send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Waits, for at most `within`, until the releases leasehold runs in the background have
/// finished: those of leases dropped without [`Lease::release`](crate::Lease::release), and those that clean up an
/// acquisition cut short (its future dropped while a request may have reached the server).
/// Returns `true` if none is left.
///
/// A Tokio runtime that shuts down cancels its tasks, these included, and a cancelled cleanup
/// leaves the lock to expire by its TTL or session instead of freeing it now. A program that
/// drops leases or acquisitions shortly before it exits (a signal handler, the end of `main`)
/// should call this first:
///
/// ```
/// # async fn demo() {
/// use std::time::Duration;
///
/// // … leases dropped, acquisitions abandoned …
/// if !leasehold_core::settle(Duration::from_secs(5)).await {
///     eprintln!("some locks are left to expire by their TTL");
/// }
/// # }
/// ```
pub async fn settle(within: Duration) -> bool {
    let mut rx = in_flight().subscribe();
    tokio::time::timeout(within, rx.wait_for(|n| *n == 0))
        .await
        .is_ok_and(|r| r.is_ok())
}
