//! `leasehold elect` failovers on real servers, with `--ttl 2s`:
//!
//! - two or three candidates; SIGKILL of the leader's `leasehold` process (its command dies
//!   with it) → another leads within the backend's crash-release bound plus slack, with a
//!   higher term, as `leader --json` and the new command's `LEASEHOLD_TERM` both say; again
//!   until one is left (Redis, etcd: three candidates; PostgreSQL, file: two);
//! - SIGSTOP of the leader's `leasehold elect --once` process past its TTL (its command runs
//!   on) → a new leader with a higher term; the old command's writes with the old term are
//!   rejected by a fenced resource once the new leader has written; SIGCONT → the old one
//!   learns it lost, stops its command and exits 79; the new leader, without `--once`,
//!   paused alone past its TTL, stops its command on resuming and campaigns again, leading
//!   with a higher term (Redis, etcd: the backends whose leaderships expire).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use common::election::{Candidate, IDLE, SLACK, Seen, gone, leader, until_leader};
use common::{alive, eventually, folder};
use leasehold::FencingToken;
use leasehold_test_support::fence::FencedResource;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;

/// The crash-release bound of the TTL backends at `--ttl 2s` (etcd: the TTL in whole seconds).
const TTL_BOUND: Duration = Duration::from_secs(2);

/// How long any step that should be quick may take.
const QUICK: Duration = Duration::from_secs(20);

/// Starts `n` candidates on `key`, then SIGKILLs each leader in turn until one is left: each
/// time another leads within `crash + SLACK`, with a higher term, and its command runs under
/// it; the killed leader's command dies with it. Then SIGTERM ends the rest (143) and nobody
/// leads.
async fn failover(backend: &str, url: &str, n: usize, crash: Duration) {
    let rt = folder(&format!("failover-{backend}"));
    let dir = folder(&format!("failover-{backend}-out"));
    let key = unique_prefix("failover");
    let at = (key.as_str(), url);
    let mut candidates: Vec<Candidate> = (0..n)
        .map(|i| Candidate::start(&rt, &dir, at, &format!("c{i}"), &[], IDLE, &[]))
        .collect();
    let (mut seen, _) = until_leader(&rt, at, QUICK, |_| true).await;
    let mut run = by_value(&candidates, &seen)
        .ran_under(seen.term, QUICK)
        .await;
    for _ in 1..n {
        let i = candidates
            .iter()
            .position(|c| c.value == seen.value)
            .unwrap();
        let mut dead = candidates.remove(i);
        dead.signal(Signal::SIGKILL);
        let killed = Instant::now();
        assert_eq!(dead.exit(QUICK).await, None, "killed by SIGKILL");
        let old = seen.clone();
        let (next, _) = until_leader(&rt, at, crash + SLACK + QUICK, |s| {
            s.value != old.value && s.term > old.term
        })
        .await;
        let took = killed.elapsed();
        assert!(
            took <= crash + SLACK,
            "{backend}: a new leader {took:?} after SIGKILL of the old (bound {crash:?} + {SLACK:?})"
        );
        let next_run = by_value(&candidates, &next)
            .ran_under(next.term, QUICK)
            .await;
        assert!(next_run.term > run.term, "{next_run:?} after {run:?}");
        eventually("the killed leader's command dies with it", QUICK, || {
            gone(run)
        })
        .await;
        (seen, run) = (next, next_run);
    }
    // The waiting ones first (they give up: 143), then the leader (its command ends by the
    // SIGTERM passed on to it: 143, and it resigns).
    candidates.sort_by_key(|c| c.value == seen.value);
    for mut c in candidates {
        c.signal(Signal::SIGTERM);
        assert_eq!(c.exit(QUICK).await, Some(143), "{}", c.stderr());
    }
    assert_eq!(leader(&rt, &key, url).await, None, "{backend}: resigned");
}

fn by_value<'a>(candidates: &'a [Candidate], seen: &Seen) -> &'a Candidate {
    candidates
        .iter()
        .find(|c| c.value == seen.value)
        .unwrap_or_else(|| panic!("{seen:?} is none of ours"))
}

fn etcd_url(endpoints: &[String]) -> String {
    format!(
        "etcd://{}?prefix={}/",
        endpoints.join(","),
        unique_prefix("elect")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_three_candidates_survive_their_leaders_sigkill() {
    let redis = require_service!(Service::Redis);
    failover("redis", redis.url(), 3, TTL_BOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_three_candidates_survive_their_leaders_sigkill() {
    let etcd = require_service!(Service::Etcd);
    failover("etcd", &etcd_url(etcd.urls()), 3, TTL_BOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_candidates_survive_their_leaders_sigkill() {
    let pg = require_service!(Service::Postgres);
    // The session ends with the process: no TTL to wait for.
    failover("postgres", pg.url(), 2, Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_two_candidates_survive_their_leaders_sigkill() {
    let dir = folder("failover-file-locks");
    let url = format!("file://{}", dir.display());
    // The kernel drops the lock with the process.
    failover("file", &url, 2, Duration::ZERO).await;
}

/// One write the fenced resource received.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Write {
    who: String,
    term: u64,
    accepted: bool,
}

/// A fenced resource on a loopback port ([`FencedResource`]: it rejects a term lower than one
/// it accepted): each connection writes one line `WHO TERM`; every write is recorded.
struct Resource {
    port: u16,
    writes: Arc<Mutex<Vec<Write>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Resource {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let writes = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&writes);
        let task = tokio::spawn(async move {
            let fenced = FencedResource::new();
            while let Ok((socket, _)) = listener.accept().await {
                let mut line = String::new();
                let mut reader = BufReader::new(socket);
                let read = reader.read_line(&mut line);
                if tokio::time::timeout(Duration::from_secs(2), read)
                    .await
                    .is_err()
                {
                    continue;
                }
                let Some((who, term)) = line.trim().split_once(' ') else {
                    continue;
                };
                let Ok(term) = term.parse::<u64>() else {
                    continue;
                };
                let accepted = fenced.write("shared", FencingToken::new(term)).is_ok();
                let who = who.to_owned();
                log.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Write {
                        who,
                        term,
                        accepted,
                    });
            }
        });
        Self { port, writes, task }
    }

    /// The command of a candidate: writes `$ELECT_NAME $LEASEHOLD_TERM` every 200 ms.
    fn writer(&self) -> String {
        format!(
            "while :; do echo \"$ELECT_NAME $LEASEHOLD_TERM\" > /dev/tcp/127.0.0.1/{}; \
             sleep 0.2; done",
            self.port
        )
    }

    /// Waits (at most `limit`) for a write like `want`; its index in the log.
    async fn until(&self, want: &Write, limit: Duration) -> usize {
        let t0 = Instant::now();
        loop {
            let writes = self
                .writes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(i) = writes.iter().position(|w| w == want) {
                return i;
            }
            assert!(
                t0.elapsed() < limit,
                "no write {want:?} within {limit:?}: {writes:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The SIGSTOP scenario on a backend whose leaderships expire after `crash`.
async fn paused_leader(backend: &str, url: &str, crash: Duration) {
    let rt = folder(&format!("pause-{backend}"));
    let dir = folder(&format!("pause-{backend}-out"));
    let key = unique_prefix("pause");
    let at = (key.as_str(), url);
    let resource = Resource::start().await;
    let name = |n: &str| [("ELECT_NAME", n.to_owned())];
    let write = |who: &str, term: u64, accepted: bool| Write {
        who: who.to_owned(),
        term,
        accepted,
    };
    let mut a = Candidate::start(
        &rt,
        &dir,
        at,
        "a",
        &["--once"],
        &resource.writer(),
        &name("a"),
    );
    let (first, _) = until_leader(&rt, at, QUICK, |s| s.value == "a").await;
    let run_a = a.ran_under(first.term, QUICK).await;
    resource.until(&write("a", first.term, true), QUICK).await;
    let mut b = Candidate::start(&rt, &dir, at, "b", &[], &resource.writer(), &name("b"));
    eventually("b campaigns", QUICK, || {
        b.stderr().contains("waiting to lead")
    })
    .await;

    a.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    let (second, _) = until_leader(&rt, at, crash + SLACK + QUICK, |s| {
        s.value == "b" && s.term > first.term
    })
    .await;
    let took = paused.elapsed();
    assert!(
        took <= crash + SLACK,
        "{backend}: a new leader {took:?} after the old one froze (bound {crash:?} + {SLACK:?})"
    );
    b.ran_under(second.term, QUICK).await;
    // The paused leader's command runs on, writing with the old term: once the new leader has
    // written, the resource refuses those writes.
    let new = resource.until(&write("b", second.term, true), QUICK).await;
    let stale = resource.until(&write("a", first.term, false), QUICK).await;
    assert!(
        stale > new,
        "a's write was refused only after b's was accepted"
    );
    assert!(
        alive(run_a.pid),
        "a's command ran on while its leasehold was paused"
    );

    a.signal(Signal::SIGCONT);
    assert_eq!(a.exit(QUICK).await, Some(79), "{}", a.stderr());
    assert!(a.stderr().contains("lost"), "{}", a.stderr());
    eventually("a's command is stopped", QUICK, || gone(run_a)).await;
    assert_eq!(
        leader(&rt, &key, url).await,
        Some(second.clone()),
        "b still leads"
    );
    assert_eq!(b.ran().len(), 1, "b led once: {:?}", b.ran());

    // Without --once a lost leadership is campaigned for again: b, paused alone past its
    // TTL, stops its command when it resumes and leads again, with a higher term.
    let run_b = b.ran_under(second.term, QUICK).await;
    b.signal(Signal::SIGSTOP);
    tokio::time::sleep(crash + Duration::from_secs(2)).await;
    b.signal(Signal::SIGCONT);
    let (third, _) = until_leader(&rt, at, QUICK, |s| s.value == "b" && s.term > second.term).await;
    b.ran_under(third.term, QUICK).await;
    eventually("b's first command is stopped", QUICK, || gone(run_b)).await;
    assert!(b.child.try_wait().unwrap().is_none(), "b campaigns on");
    assert!(b.stderr().contains("campaigning again"), "{}", b.stderr());
    b.signal(Signal::SIGTERM);
    assert_eq!(b.exit(QUICK).await, Some(143), "{}", b.stderr());
    assert_eq!(leader(&rt, &key, url).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_paused_leader_is_replaced_fenced_and_exits_79() {
    let redis = require_service!(Service::Redis);
    paused_leader("redis", redis.url(), TTL_BOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_paused_leader_is_replaced_fenced_and_exits_79() {
    let etcd = require_service!(Service::Etcd);
    paused_leader("etcd", &etcd_url(etcd.urls()), TTL_BOUND).await;
}
