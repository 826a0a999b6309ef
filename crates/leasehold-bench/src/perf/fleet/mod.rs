//! The `fleet` group of `leasehold-bench perf`: one process holding N leases (N = 100, 1,000
//! and 10,000; 1,000 under `--quick`) on Redis, Redlock (5 nodes), a Redis Cluster,
//! PostgreSQL and etcd, with a 3 s TTL (a renewal period, TTL / 3, of 1 s).
//!
//! Each (backend, N) runs in a process of its own ([`child`], the hidden `__fleet`
//! subcommand), so that CPU time, memory and connections are that backend's alone. It
//! measures the time to take all N leases (64 acquisitions in flight, transient faults retried
//! within each one's budget), then over the hold window: the
//! requests each server counted per renewal period ([`probe`]: Redis `INFO commandstats`
//! script calls and the reads it served, PostgreSQL `pg_stat_database.xact_commit`, etcd's gRPC
//! messages from `/metrics`; the busiest node's figure), the TCP connections to the servers
//! (from `/proc`, the probe's own taken out) and PostgreSQL's sessions (`pg_stat_activity` rows
//! with the backend's `application_name`), client CPU (`getrusage`, user + system, % of one
//! core; the CPU time of the connection counts' own `/proc` reads taken out) and resident memory growth per lease; then the time to release all N at once, and
//! the locks left at once and after the settle time (5 s; the backend still connected, so a
//! lock a live session still carries shows); and the leases lost while held.
//!
//! Then, for the Redis family at N = 10,000, a second table: [`ROUNDS`] rounds, each measuring
//! one after another our row, its raw floor ([`raw`]) and our row with the heap kept
//! ([`HEAP_KEPT`]), reported as medians and as ratios to ours within each round (the host's
//! load drifts over minutes; a ratio within a round cancels it).
//!
//! The group fails (as every `perf` failure: exit status 1) on any error, any lost lease, any
//! lock left after the settle time, or more PostgreSQL sessions than `max_sessions` — never on
//! a timing.

mod child;
pub(crate) mod probe;
mod raw;
mod table;

use std::time::Duration;

use crate::harness::{BoxError, runtime};

pub(super) use table::{chart, comparison, csv, table};

/// The TTL of every lease of the fleet scenario.
pub(super) const FLEET_TTL: Duration = Duration::from_secs(3);

/// The N of the compared rows ([`compared`]).
const COMPARED_N: usize = 10_000;

/// How many rounds the compared rows take turns in.
const ROUNDS: usize = 3;

/// The backends measured, in run order.
const BACKENDS: [&str; 5] = ["redis", "redlock5", "redis-cluster", "postgres", "etcd"];

/// The backends compared at [`COMPARED_N`] with their raw floor ([`raw`]) and with the heap
/// kept ([`HEAP_KEPT`]): the Redis family, whose renewal batches allocate and free hundreds of
/// kilobytes each.
const COMPARED: [&str; 3] = ["redis", "redlock5", "redis-cluster"];

/// The suffix of a heap-kept row's backend name.
const HEAP_KEPT: &str = "+heap-kept";

/// The glibc tunable a heap-kept row's process starts with: a trim threshold (64 MiB) that a
/// fleet's heap never reaches, so that glibc does not hand the top of its heaps back to the
/// system after each renewal batch (for the next batch to fault it in again). The default rows'
/// processes start without `GLIBC_TUNABLES`.
const HEAP_KEPT_TUNABLE: &str = "glibc.malloc.trim_threshold=67108864";

/// The backend of a heap-kept row (`None` for any other row).
fn heap_kept(backend: &str) -> Option<&str> {
    backend.strip_suffix(HEAP_KEPT)
}

/// The rows `backend` (one of [`COMPARED`]) is compared with in one round: itself first, then
/// its raw floor if it has one, then itself with the heap kept.
fn compared(backend: &str) -> Vec<String> {
    let mut v = vec![backend.to_owned()];
    v.extend(raw::of(backend).map(str::to_owned));
    v.push(format!("{backend}{HEAP_KEPT}"));
    v
}

/// What one child process measures.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) backend: String,
    pub(crate) n: usize,
    pub(crate) runtime: String,
    pub(crate) hold: Duration,
    pub(crate) settle: Duration,
    /// Under `--quick`: PostgreSQL with the smoke test's health timeout (see `pg_config`).
    pub(crate) quick: bool,
}

/// What one child measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Measured {
    pub(super) acquire: Duration,
    pub(super) hold: Duration,
    /// Server nodes counted.
    pub(super) nodes: usize,
    /// Top-level script calls per renewal period on the busiest node (Redis only).
    pub(super) scripts_per_period: Option<f64>,
    /// Requests per renewal period on the busiest node.
    pub(super) requests_per_period: Option<f64>,
    pub(super) connections: usize,
    pub(super) pg_sessions: Option<u64>,
    pub(super) pg_bound: Option<u64>,
    pub(super) cpu_pct: f64,
    pub(super) rss_per_lease: f64,
    pub(super) release: Duration,
    /// The burst release's peak of resident memory above its start, per lease.
    pub(super) release_peak_per_lease: f64,
    pub(super) release_errors: usize,
    pub(super) left_at_once: u64,
    pub(super) left_later: u64,
    pub(super) lost: usize,
}

/// One row of the fleet table.
#[derive(Debug, Clone)]
pub(super) struct FleetRow {
    pub(super) runtime: String,
    pub(super) backend: String,
    pub(super) n: usize,
    /// The round of a compared row ([`compared`]); `None` for the rows of the main table.
    pub(super) round: Option<usize>,
    pub(super) result: Result<Measured, String>,
}

/// The marker of the child's result line on its stdout.
const LINE: &str = "fleet-result";

impl Measured {
    /// The child's result line: `fleet-result` and `name=value` fields, tab-separated.
    fn line(&self) -> String {
        let opt = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{x}"));
        let opt_u = |x: Option<u64>| x.map_or_else(|| "-".to_owned(), |x| x.to_string());
        [
            LINE.to_owned(),
            format!("acquire_ns={}", self.acquire.as_nanos()),
            format!("hold_ns={}", self.hold.as_nanos()),
            format!("nodes={}", self.nodes),
            format!("scripts={}", opt(self.scripts_per_period)),
            format!("requests={}", opt(self.requests_per_period)),
            format!("connections={}", self.connections),
            format!("pg_sessions={}", opt_u(self.pg_sessions)),
            format!("pg_bound={}", opt_u(self.pg_bound)),
            format!("cpu_pct={}", self.cpu_pct),
            format!("rss_per_lease={}", self.rss_per_lease),
            format!("release_ns={}", self.release.as_nanos()),
            format!("release_peak_per_lease={}", self.release_peak_per_lease),
            format!("release_errors={}", self.release_errors),
            format!("left_at_once={}", self.left_at_once),
            format!("left_later={}", self.left_later),
            format!("lost={}", self.lost),
        ]
        .join("\t")
    }

    /// Reads a child's result line back.
    fn parse(line: &str) -> Result<Self, BoxError> {
        let mut fields = std::collections::HashMap::new();
        let mut parts = line.trim_end().split('\t');
        if parts.next() != Some(LINE) {
            return Err(format!("not a fleet result line: {line:?}").into());
        }
        for p in parts {
            let (k, v) = p.split_once('=').ok_or("a field without '='")?;
            fields.insert(k, v);
        }
        let get = |k: &str| {
            fields
                .get(k)
                .copied()
                .ok_or_else(|| format!("no {k} in the fleet result"))
        };
        let f = |k: &str| -> Result<f64, BoxError> { Ok(get(k)?.parse()?) };
        let u = |k: &str| -> Result<u64, BoxError> { Ok(get(k)?.parse()?) };
        let of = |k: &str| -> Result<Option<f64>, BoxError> {
            Ok(match get(k)? {
                "-" => None,
                v => Some(v.parse()?),
            })
        };
        let ou = |k: &str| -> Result<Option<u64>, BoxError> {
            Ok(match get(k)? {
                "-" => None,
                v => Some(v.parse()?),
            })
        };
        let nanos = |k: &str| -> Result<Duration, BoxError> { Ok(Duration::from_nanos(u(k)?)) };
        Ok(Self {
            acquire: nanos("acquire_ns")?,
            hold: nanos("hold_ns")?,
            nodes: usize::try_from(u("nodes")?)?,
            scripts_per_period: of("scripts")?,
            requests_per_period: of("requests")?,
            connections: usize::try_from(u("connections")?)?,
            pg_sessions: ou("pg_sessions")?,
            pg_bound: ou("pg_bound")?,
            cpu_pct: f("cpu_pct")?,
            rss_per_lease: f("rss_per_lease")?,
            release: nanos("release_ns")?,
            release_peak_per_lease: f("release_peak_per_lease")?,
            release_errors: usize::try_from(u("release_errors")?)?,
            left_at_once: u("left_at_once")?,
            left_later: u("left_later")?,
            lost: usize::try_from(u("lost")?)?,
        })
    }
}

/// The hidden `__fleet` subcommand: runs one measurement and prints its result line.
pub(crate) fn child_main(spec: &Spec) -> Result<(), BoxError> {
    let rt = runtime(&spec.runtime)?;
    let m = if let Some(backend) = heap_kept(&spec.backend) {
        // The row says the heap was kept: it must have been.
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        if !tunables.split(':').any(|t| t == HEAP_KEPT_TUNABLE) {
            return Err(format!("a {HEAP_KEPT} row without {HEAP_KEPT_TUNABLE}").into());
        }
        let spec = Spec {
            backend: backend.to_owned(),
            ..spec.clone()
        };
        rt.block_on(child::measure(&spec))?
    } else {
        match raw::service(&spec.backend) {
            Some(service) => rt.block_on(raw::measure(spec, service))?,
            None => rt.block_on(child::measure(spec))?,
        }
    };
    println!("{}", m.line());
    rt.shutdown_timeout(Duration::from_secs(2));
    Ok(())
}

/// Runs one child process for `spec` and reads its result.
fn run_child(spec: &Spec) -> Result<Measured, BoxError> {
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    match heap_kept(&spec.backend) {
        Some(_) => cmd.env("GLIBC_TUNABLES", HEAP_KEPT_TUNABLE),
        None => cmd.env_remove("GLIBC_TUNABLES"),
    };
    let out = cmd
        .arg("__fleet")
        .args(["--backend", &spec.backend])
        .args(["--n", &spec.n.to_string()])
        .args(["--runtime", &spec.runtime])
        .args(["--hold-ms", &spec.hold.as_millis().to_string()])
        .args(["--settle-ms", &spec.settle.as_millis().to_string()])
        .args(spec.quick.then_some("--quick"))
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().find(|l| l.starts_with(LINE)) {
        Some(line) if out.status.success() => Measured::parse(line),
        _ => Err(format!("the measurement process failed ({})", out.status).into()),
    }
}

/// Every backend at every N on runtime `rt`, each in a process of its own: one after another,
/// so that each measures its CPU and memory alone; with `quick` (invariants only, no figure
/// kept) the five backends at once, each on servers of its own (its counts read from them
/// alone), which takes the time of the slowest instead of the sum.
pub(super) fn run(rt: &str, quick: bool) -> Vec<FleetRow> {
    let (sizes, hold, settle): (&[usize], _, _) = if quick {
        (&[1_000], Duration::from_secs(3), Duration::from_secs(2))
    } else {
        (
            &[100, 1_000, 10_000],
            Duration::from_secs(10),
            Duration::from_secs(5),
        )
    };
    let spec = |backend: &str, n| Spec {
        backend: backend.to_owned(),
        n,
        runtime: rt.to_owned(),
        hold,
        settle,
        quick,
    };
    let specs: Vec<(Spec, Option<usize>)> = BACKENDS
        .iter()
        .flat_map(|backend| sizes.iter().map(|&n| (spec(backend, n), None)))
        .collect();
    let measure = |(spec, round): &(Spec, Option<usize>)| {
        let started = std::time::Instant::now();
        let result = run_child(spec).map_err(|e| e.to_string());
        eprintln!(
            "perf [{rt}] fleet {} N={}{}: {:.1} s",
            spec.backend,
            spec.n,
            round_label(*round),
            started.elapsed().as_secs_f64()
        );
        FleetRow {
            runtime: rt.to_owned(),
            backend: spec.backend.clone(),
            n: spec.n,
            round: *round,
            result,
        }
    };
    if quick {
        return at_once(&specs, measure, rt);
    }
    // Then the compared rows (not under `--quick`: they check no invariant of ours that the
    // rows above do not), taking turns so that the host's load, which drifts over minutes,
    // weighs on each alike: each round every backend with its floor and its heap kept, the
    // order turned by one each round.
    let mut compared_specs = Vec::new();
    for round in 0..ROUNDS {
        for backend in COMPARED {
            let mut rows = compared(backend);
            let turn = round % rows.len();
            rows.rotate_left(turn);
            compared_specs.extend(rows.iter().map(|b| (spec(b, COMPARED_N), Some(round))));
        }
    }
    specs.iter().chain(&compared_specs).map(measure).collect()
}

/// Every spec at once, each in a thread of its own (the quick run: its backends on servers of
/// their own).
fn at_once(
    specs: &[(Spec, Option<usize>)],
    measure: impl Fn(&(Spec, Option<usize>)) -> FleetRow + Sync,
    rt: &str,
) -> Vec<FleetRow> {
    std::thread::scope(|s| {
        let running: Vec<_> = specs.iter().map(|spec| s.spawn(|| measure(spec))).collect();
        running
            .into_iter()
            .zip(specs)
            .map(|(t, (spec, round))| {
                t.join().unwrap_or_else(|_| FleetRow {
                    runtime: rt.to_owned(),
                    backend: spec.backend.clone(),
                    n: spec.n,
                    round: *round,
                    result: Err("the measuring thread panicked".to_owned()),
                })
            })
            .collect()
    })
}

/// How a compared row's round is named after its backend and N (nothing for a main-table row).
fn round_label(round: Option<usize>) -> String {
    round
        .map(|r| format!(" / round {}", r + 1))
        .unwrap_or_default()
}

/// What makes the fleet group fail: errors, lost leases, locks left after the settle time,
/// PostgreSQL sessions above the pool's bound. Never a timing.
pub(super) fn problems(rows: &[FleetRow]) -> Vec<String> {
    let mut v = Vec::new();
    for r in rows {
        let what = format!(
            "[{}] fleet / {} / N={}{}",
            r.runtime,
            r.backend,
            r.n,
            round_label(r.round)
        );
        match &r.result {
            Err(e) => v.push(format!("{what}: {e}")),
            Ok(m) => {
                if m.lost > 0 {
                    v.push(format!("{what}: {} lease(s) lost while held", m.lost));
                }
                if m.left_later > 0 {
                    v.push(format!(
                        "{what}: {} lock(s) left after the burst release",
                        m.left_later
                    ));
                }
                if let (Some(s), Some(b)) = (m.pg_sessions, m.pg_bound)
                    && s > b
                {
                    v.push(format!(
                        "{what}: {s} PostgreSQL sessions, above max_sessions = {b}"
                    ));
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each compared backend is measured with its raw floor (when it has one) and its heap
    /// kept; only a heap-kept row is one, and every raw row has a backend of ours.
    #[test]
    fn compared_rows_name_measured_backends() {
        for b in COMPARED {
            assert!(BACKENDS.contains(&b));
            let rows = compared(b);
            assert_eq!(rows[0], b);
            assert_eq!(heap_kept(rows.last().unwrap()), Some(b));
            assert_eq!(rows.iter().filter(|r| heap_kept(r).is_some()).count(), 1);
            for r in &rows[1..] {
                assert!(raw::service(r).is_some() || heap_kept(r).is_some(), "{r}");
            }
        }
        assert_eq!(compared("redlock5")[1], "redlock5-raw");
        assert_eq!(
            compared("redis-cluster").len(),
            2,
            "no raw floor of a cluster"
        );
        assert!(raw::RAW.iter().all(|(b, _)| heap_kept(b).is_none()));
        assert!(
            raw::RAW
                .iter()
                .all(|(b, _)| COMPARED.iter().any(|c| raw::of(c) == Some(b)))
        );
    }

    #[test]
    fn a_result_line_reads_back_and_problems_never_judge_timings() {
        let m = Measured {
            acquire: Duration::from_millis(1500),
            hold: Duration::from_secs(10),
            nodes: 5,
            scripts_per_period: Some(12.5),
            requests_per_period: None,
            connections: 5,
            pg_sessions: Some(11),
            pg_bound: Some(10),
            cpu_pct: 1.5,
            rss_per_lease: 512.0,
            release: Duration::from_millis(900),
            release_peak_per_lease: 2048.0,
            left_at_once: 3,
            lost: 1,
            ..Measured::default()
        };
        assert_eq!(Measured::parse(&m.line()).unwrap(), m);
        let row = |m: Measured| FleetRow {
            runtime: "rt".into(),
            backend: "postgres".into(),
            n: 1000,
            round: None,
            result: Ok(m),
        };
        let p = problems(&[row(m.clone())]);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("1 lease(s) lost") && p[1].contains("above max_sessions"));
        let slow = Measured {
            acquire: Duration::from_secs(3600),
            release: Duration::from_secs(3600),
            left_later: 0,
            lost: 0,
            pg_sessions: Some(10),
            ..m
        };
        assert!(
            problems(&[row(slow.clone())]).is_empty(),
            "timings never fail"
        );
        let left = Measured {
            left_later: 2,
            ..slow
        };
        assert!(problems(&[row(left)])[0].contains("2 lock(s) left"));
    }
}
