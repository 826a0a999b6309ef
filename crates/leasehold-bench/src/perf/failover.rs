//! The `failover` group of `leasehold-bench perf`: on each backend that gives elections, the
//! time from the leader's crash to a new leader, and from `resign()` to the next leader.
//!
//! Each repeat elects a leader that can really crash: a process of its own (the hidden
//! `__leader` subcommand) killed with SIGKILL, so its connections close and nothing resigns
//! (Redis and etcd wait for the TTL or session lease, PostgreSQL for the session's end, the file
//! backend for the descriptor's close); on the memory backend, which lives in one process, a
//! thread and runtime of its own that forget the leadership and stop (nothing renews or
//! resigns: the TTL runs out). A second candidate campaigns while it leads; the failover time
//! runs from the kill to the second candidate's `campaign()` returning. Then a third candidate
//! campaigns and the second resigns: the hand-off runs from `resign()` returning to the third's
//! `campaign()` returning (zero when the campaign returned first). Each new term must be above
//! the last, and once the third resigned no leader may be left.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Candidate, Elector, Leadership, LockBackend, LockOptions, MemoryBackend};
use leasehold_etcd::EtcdConfig;
use leasehold_test_support::services::{self, Service};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::time::Instant;

use super::groups::{etcd_backend, pg_backend, redis_backend};
use super::model::{Params, Row, Scenario};
use crate::file_backend::{FileBackend, FileConfig};
use crate::harness::{BoxError, runtime};
use crate::stats::Spread;

/// The leadership TTL (and etcd session TTL) of every candidate: etcd's shortest lease.
pub(super) const TTL: Duration = Duration::from_secs(2);
/// Candidates per repeat: the crashing leader, the one that takes over, the one handed to.
const CANDIDATES: usize = 3;
/// The backends that give elections: `--backend` of `__leader`, and the group's title.
const BACKENDS: [(&str, &str, &str); 5] = [
    ("memory", "memory (in process)", "MemoryBackend"),
    ("file", "file (flock, local disk)", "FileBackend"),
    ("redis", "redis (single node)", "RedisBackend"),
    ("postgres", "postgres over TCP", "PostgresBackend"),
    ("etcd", "etcd, single member", "EtcdBackend (session lease)"),
];
/// A bound on each campaign and on the leader process's start.
const LIMIT: Duration = Duration::from_secs(30);
/// How long a candidate campaigns before the leader goes (it reaches its wait).
const SETTLE: Duration = Duration::from_millis(300);
/// A leader process nobody killed ends after this.
const ORPHAN: Duration = Duration::from_secs(60);

/// Where a backend's candidates connect.
#[derive(Clone)]
enum Target {
    Memory(MemoryBackend),
    File(PathBuf),
    Redis(String),
    Postgres(String),
    Etcd(Vec<String>),
}

impl Target {
    /// Backend `name` of `scripts/services` (its lock folder under `dir` for the file backend).
    fn of(name: &str, dir: &Path) -> Result<Self, BoxError> {
        let url =
            |s: Service| -> Result<String, BoxError> { Ok(services::lookup(s)?.url().to_owned()) };
        Ok(match name {
            "memory" => Self::Memory(MemoryBackend::new()),
            "file" => Self::File(dir.to_owned()),
            "redis" => Self::Redis(url(Service::Redis)?),
            "postgres" => Self::Postgres(url(Service::Postgres)?),
            "etcd" => Self::Etcd(services::lookup(Service::Etcd)?.urls().to_vec()),
            other => return Err(format!("no election backend {other:?}").into()),
        })
    }

    /// The target a leader process was given (`at`: as [`Self::at`] said it).
    fn parse(name: &str, at: &str) -> Result<Self, BoxError> {
        Ok(match name {
            "file" => Self::File(PathBuf::from(at)),
            "redis" => Self::Redis(at.to_owned()),
            "postgres" => Self::Postgres(at.to_owned()),
            "etcd" => Self::Etcd(at.split(',').map(str::to_owned).collect()),
            other => return Err(format!("no leader process on {other:?}").into()),
        })
    }

    /// Where it is, for a leader process (none for the memory backend).
    fn at(&self) -> Option<String> {
        match self {
            Self::Memory(_) => None,
            Self::File(dir) => Some(dir.display().to_string()),
            Self::Redis(url) | Self::Postgres(url) => Some(url.clone()),
            Self::Etcd(endpoints) => Some(endpoints.join(",")),
        }
    }

    /// A candidate publishing `value` for `key`, on a backend (connections) of its own.
    async fn elector(&self, key: &str, prefix: &str, value: &str) -> Result<Elector, BoxError> {
        let backend: Arc<dyn LockBackend> = match self {
            Self::Memory(m) => Arc::new(m.clone()),
            Self::File(dir) => Arc::new(FileBackend::new(FileConfig::new(dir.clone()))?),
            Self::Redis(url) => redis_backend(vec![url.clone()], prefix.to_owned(), false).await?,
            Self::Postgres(url) => {
                pg_backend(
                    url,
                    prefix.to_owned(),
                    services::unique_prefix("perf"),
                    false,
                )
                .await?
            }
            Self::Etcd(endpoints) => {
                let cfg = EtcdConfig::new(endpoints.clone())
                    .with_prefix(prefix)?
                    .with_session_ttl(TTL);
                etcd_backend(cfg).await?
            }
        };
        let options = LockOptions::default().with_ttl(TTL);
        Ok(Elector::new(backend, key, Candidate::new(value)?, options)?)
    }
}

/// How the first leader goes away.
enum Crash {
    /// A leader process, killed.
    Process(tokio::process::Child),
    /// A leader thread with its runtime, told to forget its leadership and stop.
    Thread(
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<()>,
    ),
}

/// The first leader of a repeat: its term, and how it crashes.
struct FirstLeader {
    term: u64,
    crash: Crash,
}

impl FirstLeader {
    async fn elect(target: &Target, key: &str, prefix: &str) -> Result<Self, BoxError> {
        match target.at() {
            Some(at) => Self::process(target, &at, key, prefix).await,
            None => Self::thread(target.clone(), key.to_owned(), prefix.to_owned()).await,
        }
    }

    /// A leader in a process of its own: `leasehold-bench __leader`, which prints its term.
    async fn process(target: &Target, at: &str, key: &str, prefix: &str) -> Result<Self, BoxError> {
        let name = match target {
            Target::File(_) => "file",
            Target::Redis(_) => "redis",
            Target::Postgres(_) => "postgres",
            _ => "etcd",
        };
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(["__leader", "--backend", name, "--at", at, "--key", key])
            .args(["--prefix", prefix])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or("no stdout of the leader process")?;
        let line = tokio::time::timeout(LIMIT, BufReader::new(stdout).lines().next_line())
            .await
            .map_err(|_| format!("the leader process did not lead within {LIMIT:?}"))??
            .ok_or("the leader process ended before it led")?;
        let term = line
            .strip_prefix("leader ")
            .ok_or_else(|| format!("the leader process said {line:?}"))?
            .parse()?;
        Ok(Self {
            term,
            crash: Crash::Process(child),
        })
    }

    /// A leader on a thread and runtime of its own (the memory backend).
    async fn thread(target: Target, key: String, prefix: String) -> Result<Self, BoxError> {
        let (term_tx, term_rx) = tokio::sync::oneshot::channel::<Result<u64, String>>();
        let (crash_tx, crash_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("perf-leader".into())
            .spawn(move || {
                let rt = match runtime("current-thread") {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = term_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let won = rt.block_on(lead(&target, &key, &prefix));
                match won {
                    Ok(leadership) => {
                        let _ = term_tx.send(Ok(leadership.term().get()));
                        // Driven meanwhile, so the leadership renews until the crash.
                        let _ = rt.block_on(crash_rx);
                        // The crash: no resign, no release on drop, no renewal from now on.
                        std::mem::forget(leadership);
                        drop(rt);
                    }
                    Err(e) => {
                        let _ = term_tx.send(Err(e.to_string()));
                    }
                }
            })?;
        let term = term_rx
            .await
            .map_err(|_| "the leader thread ended before it led")??;
        Ok(Self {
            term,
            crash: Crash::Thread(crash_tx, thread),
        })
    }

    /// Crashes it, and waits until it is gone.
    async fn crash(self) -> Result<(), BoxError> {
        match self.crash {
            Crash::Process(mut child) => {
                child.start_kill()?;
                child.wait().await?;
            }
            Crash::Thread(tx, thread) => {
                let _ = tx.send(());
                tokio::task::spawn_blocking(move || thread.join())
                    .await?
                    .map_err(|_| "the leader thread panicked")?;
            }
        }
        Ok(())
    }
}

/// Campaigns (bounded by [`LIMIT`]) as the crashing leader.
async fn lead(target: &Target, key: &str, prefix: &str) -> Result<Leadership, BoxError> {
    let elector = target.elector(key, prefix, "crashing-leader").await?;
    Ok(elector.campaign_for(LIMIT).await?)
}

/// The hidden `__leader` subcommand: leads `key` on backend `name` at `at`, prints
/// `leader <term>`, and waits to be killed.
pub(crate) fn child_main(name: &str, at: &str, key: &str, prefix: &str) -> Result<(), BoxError> {
    let rt = runtime("current-thread")?;
    rt.block_on(async {
        let leadership = lead(&Target::parse(name, at)?, key, prefix).await?;
        println!("leader {}", leadership.term().get());
        tokio::time::sleep(ORPHAN).await;
        leadership.resign().await?;
        Ok(())
    })
}

/// A campaign in a task of its own, stopped if dropped before it won (a repeat that failed).
struct Campaign(tokio::task::JoinHandle<Result<(Leadership, Instant), String>>);

impl Campaign {
    fn start(e: Elector) -> Self {
        Self(tokio::spawn(async move {
            let l = e.campaign_for(LIMIT).await.map_err(|e| e.to_string())?;
            Ok((l, Instant::now()))
        }))
    }

    /// The leadership and when `campaign()` returned.
    async fn won(mut self) -> Result<(Leadership, Instant), BoxError> {
        Ok((&mut self.0).await??)
    }
}

impl Drop for Campaign {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What one repeat measured.
struct Measured {
    failover: Duration,
    handoff: Duration,
    /// Leaders left once the last candidate resigned (0 or 1).
    left: u64,
}

/// One repeat on `target` (see the module docs).
async fn repeat(target: &Target, tag: &str) -> Result<Measured, BoxError> {
    let key = format!("{tag}-leader");
    let first = FirstLeader::elect(target, &key, tag).await?;
    let first_term = first.term;
    let second = target.elector(&key, tag, "second").await?;
    let third = target.elector(&key, tag, "third").await?;
    let taking = Campaign::start(second);
    tokio::time::sleep(SETTLE).await;
    let crashed = Instant::now();
    first.crash().await?;
    let (lead2, took) = taking.won().await?;
    let failover = took.saturating_duration_since(crashed);
    let term2 = lead2.term().get();
    if term2 <= first_term {
        return Err(format!("term {term2} after the crashed leader's {first_term}").into());
    }
    let handed = Campaign::start(third.clone());
    tokio::time::sleep(SETTLE).await;
    if !lead2.resign().await? {
        return Err("the second leader had lost its leadership before it resigned".into());
    }
    let resigned = Instant::now();
    let (lead3, took) = handed.won().await?;
    let handoff = took.saturating_duration_since(resigned);
    let term3 = lead3.term().get();
    if term3 <= term2 {
        return Err(format!("term {term3} after the resigned leader's {term2}").into());
    }
    lead3.resign().await?;
    let left = u64::from(third.leader().await?.is_some());
    Ok(Measured {
        failover,
        handoff,
        left,
    })
}

/// The failover rows of every backend that gives elections (`out`: where the file backend's
/// lock folder goes), measured on runtime `rt`.
pub(super) async fn run(p: &Params, rt: &str, out: &Path) -> Vec<Row> {
    let repeats = if p.quick { 1 } else { p.repeats.max(1) };
    let dir = out.join(format!(
        "election-locks-{}",
        services::unique_prefix("perf")
    ));
    let mut rows = Vec::new();
    for (name, title, backend) in BACKENDS {
        let started = Instant::now();
        let mut row = Row {
            runtime: rt.to_owned(),
            group: title.to_owned(),
            scenario: Scenario::Failover,
            label: format!("leasehold {backend}: election"),
            kind: "ours",
            concurrency: CANDIDATES,
            ..Row::default()
        };
        let (mut failovers, mut handoffs, mut left) = (Vec::new(), Vec::new(), 0);
        let target = std::fs::create_dir_all(&dir)
            .map_err(BoxError::from)
            .and_then(|()| Target::of(name, &dir));
        for _ in 0..repeats {
            let tag = services::unique_prefix("perf-elect");
            match target.as_ref().map_err(ToString::to_string) {
                Ok(t) => match repeat(t, &tag).await {
                    Ok(m) => {
                        failovers.push(m.failover.as_secs_f64() * 1e3);
                        handoffs.push(m.handoff.as_secs_f64() * 1e3);
                        left += m.left;
                    }
                    Err(e) => row.error = Some(e.to_string()),
                },
                Err(e) => row.error = Some(e),
            }
            if row.error.is_some() {
                break;
            }
        }
        row.cycles = failovers.len();
        if !failovers.is_empty() {
            row.failover = Some(Spread::of(&mut failovers));
            row.resign = Some(Spread::of(&mut handoffs));
        }
        row.leftovers = Some(left);
        rows.push(row);
        eprintln!(
            "perf [{rt}] failover on {name}: {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    rows
}
