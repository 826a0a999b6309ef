//! The real-time checker of `leasehold-bench safety`, and the lock clients it watches.
//!
//! Each [`Client`] stands for one process: a thread of its own with a current-thread Tokio
//! runtime, on which its backend, its connections, its renewal watchdog and its health checks
//! all run. Blocking that thread ([`Client::write`] with a pause) therefore stops everything
//! the process does, as a GC pause or SIGSTOP would, while the servers and the other clients go
//! on.
//!
//! A [`Trial`] records, on the one monotonic clock every thread shares, when each holder got
//! its grant, its fencing token, and the instant it stopped acting as holder (it released, or
//! it noticed the loss: its lost signal fired or it found the lease lost before a write). Two
//! holder intervals that intersect are an overlap. Every write goes to two stores at once: a
//! plain one that accepts everything, and a fenced one ([`FencedResource`]) that rejects a token
//! below the highest it has accepted. A write is *stale* when another holder was granted the
//! lock after the writer was and before the write. "After" is grant order, taken from when each
//! request was sent, not from when its answer came: a grant whose answer is delayed arrives
//! after a newer holder's, yet it is the older one. (Not from the tokens: a best-effort token
//! can go back, which is one of the things the table measures.)

use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures_util::future::LocalBoxFuture;
use leasehold_core::{Capabilities, ErrorKind, FencingToken, Lease, Locker};
use leasehold_test_support::fence::FencedResource;
use tokio::sync::{mpsc, oneshot};

use crate::harness::BoxError;

/// One holder's grant, as the checker saw it.
#[derive(Debug, Clone)]
struct GrantRec {
    client: &'static str,
    /// When the request that was granted was sent: the grant order.
    requested: Instant,
    /// When its answer came: the start of the holder interval.
    acquired: Instant,
    end: Option<Instant>,
    token: Option<FencingToken>,
}

/// What the writes of one trial did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Writes {
    /// Stale writes the plain store accepted.
    pub(crate) stale_plain: u32,
    /// Stale writes the fenced store accepted.
    pub(crate) stale_fenced: u32,
    /// Writes of the newest holder that the fenced store rejected (its token went back).
    pub(crate) rightful_rejected: u32,
}

impl std::ops::AddAssign for Writes {
    fn add_assign(&mut self, other: Self) {
        self.stale_plain += other.stale_plain;
        self.stale_fenced += other.stale_fenced;
        self.rightful_rejected += other.rightful_rejected;
    }
}

/// The record of one trial: grants, holder intervals and both stores.
#[derive(Debug)]
pub(crate) struct Trial {
    resource: String,
    grants: Mutex<Vec<GrantRec>>,
    writes: Mutex<Writes>,
    fenced: FencedResource,
}

impl Trial {
    pub(crate) fn new(resource: &str) -> Arc<Self> {
        Arc::new(Self {
            resource: resource.to_owned(),
            grants: Mutex::new(Vec::new()),
            writes: Mutex::new(Writes::default()),
            fenced: FencedResource::new(),
        })
    }

    fn grants(&self) -> std::sync::MutexGuard<'_, Vec<GrantRec>> {
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn grant(
        &self,
        client: &'static str,
        requested: Instant,
        acquired: Instant,
        token: Option<FencingToken>,
    ) -> usize {
        let mut g = self.grants();
        g.push(GrantRec {
            client,
            requested,
            acquired,
            end: None,
            token,
        });
        g.len() - 1
    }

    fn end(&self, id: usize, at: Instant) {
        if let Some(g) = self.grants().get_mut(id) {
            g.end = Some(g.end.map_or(at, |e| e.min(at)));
        }
    }

    /// Writes to both stores as grant `id`, with its token; returns whether the write was stale.
    fn write(&self, id: usize) -> bool {
        let at = Instant::now();
        let (stale, token) = {
            let g = self.grants();
            let Some(mine) = g.get(id) else {
                return false;
            };
            // Another grant requested after mine (so granted after it) whose answer came
            // before this write.
            let stale = g
                .iter()
                .enumerate()
                .any(|(i, o)| i != id && o.requested > mine.requested && o.acquired <= at);
            (stale, mine.token)
        };
        let fenced_ok = token.map(|t| self.fenced.write(&self.resource, t).is_ok());
        let mut w = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
        if stale {
            w.stale_plain += 1;
            if fenced_ok == Some(true) {
                w.stale_fenced += 1;
            }
        } else if fenced_ok == Some(false) {
            w.rightful_rejected += 1;
        }
        stale
    }

    /// Whether two holder intervals of different clients intersected. Intervals still open
    /// count as open until `now`.
    pub(crate) fn overlapped(&self) -> bool {
        let now = Instant::now();
        let g = self.grants();
        g.iter().enumerate().any(|(i, a)| {
            g.iter().skip(i + 1).any(|b| {
                a.client != b.client
                    && a.acquired < b.end.unwrap_or(now)
                    && b.acquired < a.end.unwrap_or(now)
            })
        })
    }

    pub(crate) fn writes(&self) -> Writes {
        *self.writes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How an acquisition went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// We hold it (the checker recorded the grant).
    Held,
    /// Someone else holds it.
    Busy,
    /// Granted, but the lease was already past its validity when the answer came: the client
    /// gave it back without acting as holder.
    LostOnArrival,
    /// The backend reported a fault.
    Failed,
}

/// What a write attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// Written (to both stores); `true` if stale.
    Yes(bool),
    /// The client found its lease lost and did not write.
    NoticedLoss,
    /// The client held nothing.
    NotHolding,
}

type Factory = Box<dyn FnOnce() -> LocalBoxFuture<'static, Result<Locker, BoxError>> + Send>;

enum Cmd {
    Acquire(String, oneshot::Sender<Acquired>),
    Write(Duration, oneshot::Sender<Wrote>),
    Release(oneshot::Sender<()>),
}

/// One lock client on a thread and runtime of its own (see the module docs).
pub(crate) struct Client {
    tx: Option<mpsc::UnboundedSender<Cmd>>,
    last_error: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

struct Holding {
    lease: Lease,
    id: Option<usize>,
    noticed: Arc<Mutex<Option<Instant>>>,
}

impl Client {
    /// Starts a client named `name` whose locker `make` builds on the client's own runtime.
    /// Also returns the backend's declared capabilities.
    pub(crate) async fn start<F>(
        name: &'static str,
        trial: Arc<Trial>,
        make: F,
    ) -> Result<(Client, Capabilities), BoxError>
    where
        F: FnOnce() -> LocalBoxFuture<'static, Result<Locker, BoxError>> + Send + 'static,
    {
        let make: Factory = Box::new(make);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let last_error = Arc::new(Mutex::new(None));
        let errors = Arc::clone(&last_error);
        let thread = std::thread::Builder::new()
            .name(format!("safety-{name}"))
            .spawn(move || actor(name, trial, make, rx, ready_tx, errors))?;
        let client = Client {
            tx: Some(tx),
            last_error,
            thread: Some(thread),
        };
        match ready_rx.await {
            Ok(Ok(caps)) => Ok((client, caps)),
            Ok(Err(e)) => Err(format!("client {name}: {e}").into()),
            Err(_) => Err(format!("client {name} died while starting").into()),
        }
    }

    fn send(&self, cmd: Cmd) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(cmd);
        }
    }

    /// Starts one `try_acquire` of `key`; the answer comes on the receiver.
    pub(crate) fn acquire_start(&self, key: &str) -> oneshot::Receiver<Acquired> {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::Acquire(key.to_owned(), tx));
        rx
    }

    /// One `try_acquire` of `key`.
    pub(crate) async fn acquire(&self, key: &str) -> Acquired {
        self.acquire_start(key).await.unwrap_or(Acquired::Failed)
    }

    /// Starts a write: the client checks its lease, then (if it still looks valid) stalls its
    /// whole runtime for `pause`, then writes without looking again — the check-then-act gap
    /// a GC pause falls into.
    pub(crate) fn write_start(&self, pause: Duration) -> oneshot::Receiver<Wrote> {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::Write(pause, tx));
        rx
    }

    /// A write with no pause.
    pub(crate) async fn write(&self) -> Wrote {
        self.write_start(Duration::ZERO)
            .await
            .unwrap_or(Wrote::NotHolding)
    }

    /// The last fault an acquisition reported.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Gives the lease back (if any) and ends the holder interval.
    pub(crate) async fn release(&self) {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::Release(tx));
        let _ = rx.await;
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Closing the channel ends the actor, which releases what it holds first.
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn actor(
    name: &'static str,
    trial: Arc<Trial>,
    make: Factory,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    ready: oneshot::Sender<Result<Capabilities, String>>,
    last_error: Arc<Mutex<Option<String>>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    rt.block_on(async move {
        let locker = match make().await {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        };
        let _ = ready.send(Ok(locker.capabilities()));
        let mut holding: Option<Holding> = None;
        while let Some(cmd) = rx.recv().await {
            match cmd {
                Cmd::Acquire(key, reply) => {
                    let requested = Instant::now();
                    let outcome = if holding.is_some() {
                        Acquired::Busy
                    } else {
                        match locker.try_acquire(key.as_str()).await {
                            Ok(Some(lease)) if lease.is_lost() => {
                                let _ = lease.release().await;
                                Acquired::LostOnArrival
                            }
                            Ok(Some(lease)) => {
                                // Only grants of the trial's resource are watched (not the
                                // warm-up keys).
                                let id = (key == trial.resource).then(|| {
                                    trial.grant(
                                        name,
                                        requested,
                                        Instant::now(),
                                        lease.fencing_token(),
                                    )
                                });
                                let noticed = Arc::new(Mutex::new(None));
                                let signal = lease.lost();
                                let n = Arc::clone(&noticed);
                                tokio::spawn(async move {
                                    signal.wait().await;
                                    let mut n = n.lock().unwrap_or_else(PoisonError::into_inner);
                                    n.get_or_insert_with(Instant::now);
                                });
                                holding = Some(Holding { lease, id, noticed });
                                Acquired::Held
                            }
                            Ok(None) => Acquired::Busy,
                            // The Locker refuses (and releases) a grant whose answer came after
                            // its validity deadline.
                            Err(e)
                                if e.kind() == ErrorKind::Timeout
                                    && e.to_string().contains("after its validity deadline") =>
                            {
                                Acquired::LostOnArrival
                            }
                            Err(e) => {
                                *last_error.lock().unwrap_or_else(PoisonError::into_inner) =
                                    Some(e.to_string());
                                Acquired::Failed
                            }
                        }
                    };
                    let _ = reply.send(outcome);
                }
                Cmd::Write(pause, reply) => {
                    let outcome = match &holding {
                        None => Wrote::NotHolding,
                        Some(h) if h.lease.is_lost() => {
                            let now = Instant::now();
                            h.noticed
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .get_or_insert(now);
                            if let Some(id) = h.id {
                                trial.end(id, now);
                            }
                            Wrote::NoticedLoss
                        }
                        Some(Holding { id: None, .. }) => Wrote::NotHolding,
                        Some(Holding { id: Some(id), .. }) => {
                            if !pause.is_zero() {
                                // Stop the world: this thread runs the client's runtime.
                                std::thread::sleep(pause);
                            }
                            Wrote::Yes(trial.write(*id))
                        }
                    };
                    let _ = reply.send(outcome);
                }
                Cmd::Release(reply) => {
                    give_back(&trial, holding.take()).await;
                    let _ = reply.send(());
                }
            }
        }
        give_back(&trial, holding.take()).await;
    });
}

async fn give_back(trial: &Trial, holding: Option<Holding>) {
    let Some(h) = holding else { return };
    let now = Instant::now();
    let noticed = *h.noticed.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(id) = h.id {
        trial.end(id, noticed.map_or(now, |n| n.min(now)));
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), h.lease.release()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(n: u64) -> Option<FencingToken> {
        Some(FencingToken::new(n))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The counts of stale writes without and with fencing, and rightful writes rejected.
    fn counts(t: &Trial) -> (u32, u32, u32) {
        let w = t.writes();
        (w.stale_plain, w.stale_fenced, w.rightful_rejected)
    }

    /// A is granted (token `a_token`) and writes; B is granted 1 ms later (`b_token`) and
    /// writes; then A writes again. What the two stores made of it.
    fn a_then_b_then_a(a_token: u64, b_token: u64) -> (u32, u32, u32) {
        let t = Trial::new("r");
        let t0 = Instant::now();
        let a = t.grant("A", t0, t0, token(a_token));
        assert!(!t.write(a), "no newer grant yet");
        let b = t.grant("B", t0 + ms(1), t0 + ms(1), token(b_token));
        std::thread::sleep(ms(2));
        assert!(!t.write(b), "the newest holder's write is not stale");
        assert!(t.write(a), "A wrote after B was granted");
        counts(&t)
    }

    #[test]
    fn a_write_after_a_newer_grant_is_stale_and_only_fencing_stops_it() {
        assert_eq!(a_then_b_then_a(5, 6), (1, 0, 0));
    }

    #[test]
    fn a_token_that_went_back_lets_the_stale_write_through() {
        assert_eq!(a_then_b_then_a(3, 1), (1, 1, 1));
    }

    #[test]
    fn intervals_of_different_clients_overlap_only_if_they_intersect() {
        let t = Trial::new("r");
        let t0 = Instant::now();
        let a = t.grant("A", t0, t0, None);
        t.end(a, t0 + ms(10));
        let b = t.grant("B", t0 + ms(10), t0 + ms(10), None);
        t.end(b, t0 + ms(20));
        assert!(!t.overlapped(), "back to back is not an overlap");
        let a2 = t.grant("A", t0 + ms(15), t0 + ms(15), None);
        t.end(a2, t0 + ms(30));
        assert!(t.overlapped());
        // An end is never moved later (a loss noticed first stays the end).
        t.end(a2, t0 + ms(50));
        assert_eq!(t.grants()[a2].end, Some(t0 + ms(30)));
    }

    #[test]
    fn a_late_answered_grant_is_ordered_by_when_it_was_requested() {
        // The delay fault, had the Locker wrongly accepted A's late grant: A's request is sent
        // first and granted first, but its answer comes after B's.
        let t = Trial::new("r");
        let t0 = Instant::now();
        let a = t.grant("A", t0, t0 + ms(3), token(5));
        let b = t.grant("B", t0 + ms(1), t0 + ms(2), token(6));
        std::thread::sleep(ms(5));
        assert!(!t.write(b), "B is the newest holder");
        assert!(t.write(a), "A wrote after B, granted after A, was answered");
        assert_eq!(
            counts(&t),
            (1, 0, 0),
            "answer-time order would count B's write stale and A's rejected write rightful"
        );
        // The holder intervals still start at the answers.
        assert_eq!(t.grants()[a].acquired, t0 + ms(3));
        assert!(t.overlapped());
    }
}
