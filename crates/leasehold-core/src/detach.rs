//! Background work that must outlive the task that started it (releases of dropped leases,
//! clean-up of abandoned acquisitions), counted so a program can [`settle`] before it exits.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

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

/// How many background tasks are running in this process: an atomic count, not a lock, as
/// every Redlock release and extend spawns one, so the count is on their path.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Told when the count falls to zero.
static DRAINED: Notify = Notify::const_new();

/// One counted background task in flight; counted down when it ends or is cancelled.
struct Pending;

impl Pending {
    fn start() -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        Self
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if IN_FLIGHT.fetch_sub(1, Ordering::SeqCst) == 1 {
            DRAINED.notify_waiters();
        }
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
    let drained = async {
        loop {
            // Registered before the count is read: a fall to zero after the read wakes it.
            let told = DRAINED.notified();
            if IN_FLIGHT.load(Ordering::SeqCst) == 0 {
                return;
            }
            told.await;
        }
    };
    tokio::time::timeout(within, drained).await.is_ok()
}
