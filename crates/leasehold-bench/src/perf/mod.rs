//! `leasehold-bench perf`: every backend, its raw protocol cycle and the peer crates, side by
//! side in one run, on the chosen Tokio runtimes.
//!
//! Scenarios, per group of implementations (a backend on one deployment, [`groups`]):
//! - **cycle**: uncontended try-acquire + release latency (p50, p99, cycles/s), the
//!   implementations of a group taking turns in rounds;
//! - **throughput**: C tasks (1, 8, 64) cycling on distinct keys, in rounds taking turns
//!   (ratios taken within each round);
//! - **contention**: C clients (one each, as separate processes would have) on one key, each
//!   holding it 1 ms: handoff latency, longest wait (fairness), grants taken straight back, and a
//!   check that no two grants overlapped.
//!
//! Redlock runs on 3, 5 and 7 nodes (the 7-node run adds two `redis-server` processes the
//! benchmark starts itself next to the five Redlock nodes of `scripts/services`), and on 5
//! nodes with the fifth behind a fault proxy that black-holes it or delays it by 20 ms each
//! way. After each scenario the keys or locks each implementation left on the servers are
//! counted.
//!
//! The `fleet` group ([`fleet`]) holds 100, 1,000 and 10,000 leases in one process on each
//! backend (1,000 under `--quick`), each in a process of its own: requests per renewal period
//! read from the servers, connections, client CPU and memory per lease, a burst release and
//! the locks it left.
//!
//! Three kinds of group measure something else ([`extras`], [`pinned`]): our Redis cycles at
//! 64 tasks against `redis-benchmark`, the `LockLayer` overhead on the in-memory backend (on a
//! current-thread runtime of its own), and PostgreSQL with the bench and the server pinned to
//! different CPUs, every figure a median of repeats (run last, in a phase of their own).
//!
//! The `handoff` group ([`handoff`]) measures, on every backend that waits, the time from a
//! release to the next grant with 1 and 64 waiters on one key (each its own client).
//!
//! The `semaphore` group ([`semaphore`]) measures an uncontended permit cycle (4 permits per
//! key) against the same backend's lock cycle on every backend that gives semaphores; the
//! `failover` group ([`failover`]) the time from a leader's crash, and from its `resign()`, to a
//! new leader on every backend that gives elections (on the first runtime only).
//!
//! A last table ([`leftovers`]) shows what keys leave behind after release (Redis, file).
//!
//! `--quick` runs everything with tiny counts and fails (exit status 1) on any error,
//! leftover or nonsensical figure; it never judges timings.

mod charts;
mod extras;
pub(crate) mod failover;
pub(crate) mod fleet;
mod groups;
mod handoff;
mod leftovers;
pub(crate) mod model;
mod output;
mod pinned;
mod scenarios;
mod semaphore;

use std::path::Path;
use std::time::Duration;

use leasehold_test_support::services::Service;
use tokio::time::Instant;

use crate::harness::{BoxError, runtime};
use crate::report::{self, Provenance};
use model::{GROUPS, Params, Row, Scenario, pinned as is_pinned};
use pinned::Placement;

/// Whether group `name` was chosen.
fn chosen(p: &Params, name: &str) -> bool {
    p.groups.is_empty() || p.groups.iter().any(|g| g == name)
}

/// A row saying group `name` could not be set up.
fn setup_failed(rt: &str, name: &str, e: &BoxError) -> Row {
    Row {
        runtime: rt.to_owned(),
        group: name.to_owned(),
        scenario: Scenario::Setup,
        label: "(group setup)".into(),
        error: Some(e.to_string()),
        ..Row::default()
    }
}

/// Every chosen group of the first phase on the current runtime (`out`: where the file
/// backend's lock folder goes).
async fn run_runtime(p: &Params, rt: &str, out: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    for &name in &GROUPS {
        if !chosen(p, name)
            || is_pinned(name)
            || matches!(name, "tower-layer" | "fleet" | "failover")
        {
            continue;
        }
        let started = Instant::now();
        if name == "redis-benchmark" {
            rows.extend(extras::redis_benchmark(p, rt).await);
            rows.extend(extras::redis_cpu(p, rt).await);
        } else if name == "semaphore" {
            rows.extend(semaphore::run(p, rt, out).await);
        } else if name == "handoff" {
            rows.extend(handoff::run(p, rt, out).await);
        } else {
            let g = match groups::build_group(name, out, p.quick).await {
                Ok(g) => g,
                Err(e) => {
                    rows.push(setup_failed(rt, name, &e));
                    continue;
                }
            };
            rows.extend(scenarios::cycle_scenario(p, rt, &g).await);
            if g.full {
                for &c in &p.concurrency {
                    rows.extend(scenarios::throughput_scenario(p, rt, &g, c).await);
                }
                rows.extend(scenarios::contention_scenario(p, rt, &g).await);
            }
        }
        eprintln!(
            "perf [{rt}] {name}: {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    rows
}

/// The pinned PostgreSQL groups on every runtime, under one CPU placement.
fn run_pinned(p: &Params, runtimes: &[&str]) -> Result<Vec<Row>, BoxError> {
    let chosen: Vec<(&str, Service)> = [
        ("postgres-tcp-pinned", Service::Postgres),
        ("postgres-unix-pinned", Service::PostgresSocket),
    ]
    .into_iter()
    .filter(|(name, _)| chosen(p, name))
    .collect();
    if chosen.is_empty() {
        return Ok(Vec::new());
    }
    // Before the runtimes: their threads inherit the bench's CPU.
    let placement = Placement::new(p.pin)?;
    let mut rows = Vec::new();
    for &flavour in runtimes {
        let rt = runtime(flavour)?;
        for &(name, service) in &chosen {
            let started = Instant::now();
            rows.extend(rt.block_on(pinned::run(p, flavour, name, service, &placement.note)));
            eprintln!(
                "perf [{flavour}] {name}: {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(rows)
}

/// `leasehold-bench perf`: runs, prints Markdown, writes `perf.md`, `perf.csv` and the SVG
/// charts to `out`; fails when [`model::problems`] finds any.
pub(crate) fn main(out: &Path, runtimes: &[&str], p: &Params) -> Result<(), BoxError> {
    for g in &p.groups {
        if !GROUPS.contains(&g.as_str()) {
            return Err(format!("unknown group {g:?}; expected some of {GROUPS:?}").into());
        }
    }
    let provenance = Provenance::now(out);
    let started = std::time::Instant::now();
    std::fs::create_dir_all(out)?;
    let mut rows = Vec::new();
    for &flavour in runtimes {
        let rt = runtime(flavour)?;
        rows.extend(rt.block_on(run_runtime(p, flavour, out)));
        // Background releases and the extra Redis nodes end with the runtime.
        rt.shutdown_timeout(Duration::from_secs(2));
    }
    if chosen(p, "failover")
        && let Some(&first) = runtimes.first()
    {
        let rt = runtime(first)?;
        rows.extend(rt.block_on(failover::run(p, first, out)));
        rt.shutdown_timeout(Duration::from_secs(2));
    }
    if chosen(p, "tower-layer") {
        rows.extend(extras::tower_layer(p));
    }
    let mut fleet_rows = Vec::new();
    if chosen(p, "fleet") {
        for &flavour in runtimes {
            fleet_rows.extend(fleet::run(flavour, p.quick));
        }
    }
    rows.extend(run_pinned(p, runtimes)?);
    let mut md = provenance.heading("leasehold-bench perf");
    let mut flavours = runtimes.to_vec();
    if chosen(p, "tower-layer") && !flavours.contains(&"current-thread") {
        flavours.push("current-thread");
    }
    for &flavour in &flavours {
        for t in output::tables(&rows, flavour, p) {
            md.push_str(&t.markdown());
            md.push('\n');
        }
        let fleet_tables = [
            fleet::table(&fleet_rows, flavour),
            fleet::comparison(&fleet_rows, flavour),
        ];
        for t in fleet_tables.into_iter().flatten() {
            md.push_str(&t.markdown());
            md.push('\n');
        }
    }
    if leftovers::chosen(p) {
        md.push_str(&leftovers::markdown(p, out)?);
        md.push('\n');
    }
    let (md_path, csv_path) = report::write(out, "perf", &md, &output::csv(&rows))?;
    let mut charts = charts::charts(out, &rows, runtimes)?;
    if !fleet_rows.is_empty() {
        std::fs::write(out.join("perf-fleet.csv"), fleet::csv(&fleet_rows))?;
        for &flavour in runtimes {
            charts += fleet::chart(out, &fleet_rows, flavour)?;
        }
    }
    eprintln!(
        "wrote {}, {} and {charts} chart(s) in {:.0} s",
        md_path.display(),
        csv_path.display(),
        started.elapsed().as_secs_f64()
    );
    let mut problems = model::problems(&rows);
    problems.extend(fleet::problems(&fleet_rows));
    if problems.is_empty() {
        eprintln!("perf: every implementation ran, no lock was left behind");
        Ok(())
    } else {
        for x in &problems {
            eprintln!("perf: FAILED {x}");
        }
        Err(format!("{} problem(s), listed above", problems.len()).into())
    }
}
