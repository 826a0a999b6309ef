//! `leasehold-bench safety`: the torture table. Every backend against every fault that applies
//! to it, N times ([`trial`]), watched by the real-time checker of [`check`].
//!
//! The checker counts, per trial, whether two holders overlapped and which stale writes the
//! plain and the fenced store accepted; [`render()`] tallies the cells and checks the invariants
//! of [`model`].
//!
//! Destructive Redis faults (restart, clock jump) hit the dedicated nodes `safety1..3` of
//! `scripts/services`, never the shared ones; the etcd member kill stops and restarts one
//! member of the shared 3-member cluster (the leader). The network partition runs servers of
//! its own in network namespaces (see [`partition`]; root only); the Redis failovers kill the
//! master of the Sentinel topology (see [`failover`]).

mod check;
mod env;
mod failover;
mod faults;
pub(crate) mod model;
mod partition;
mod render;
mod trial;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use crate::harness::{BoxError, runtime};
use crate::report::{self, Provenance};
use env::Env;
use model::{BACKENDS, Cell, FAULTS, Params, applies};
use render::render;

/// Runs the table, prints it and writes `safety.md` and `safety.csv` to `out`; an error if an
/// invariant failed or a trial could not run.
pub(crate) fn main(out: &Path, params: &Params) -> Result<(), BoxError> {
    for b in &params.backends {
        if !BACKENDS.contains(&b.as_str()) {
            return Err(format!("unknown backend {b:?}; expected some of {BACKENDS:?}").into());
        }
    }
    for f in &params.faults {
        if !FAULTS.iter().any(|(n, _)| n == f) {
            let names: Vec<_> = FAULTS.iter().map(|(n, _)| *n).collect();
            return Err(format!("unknown fault {f:?}; expected some of {names:?}").into());
        }
    }
    let provenance = Provenance::now(out);
    let rt = runtime("multi-thread")?;
    let started = Instant::now();
    let cells = rt.block_on(run_all(params))?;
    let elapsed = started.elapsed();
    let (tables, csv, violations) = render(params, &cells, elapsed);
    let md = provenance.heading("leasehold-bench safety") + &tables;
    let (md_path, csv_path) = report::write(out, "safety", &md, &csv)?;
    eprintln!("wrote {} and {}", md_path.display(), csv_path.display());
    if violations.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} safety invariant(s) failed:\n  {}",
            violations.len(),
            violations.join("\n  ")
        )
        .into())
    }
}

async fn run_all(params: &Params) -> Result<BTreeMap<(usize, usize), Cell>, BoxError> {
    let env = Env::load(&params.backends)?;
    let mut cells = BTreeMap::new();
    for (bi, backend) in BACKENDS.iter().enumerate() {
        if !params.backends.iter().any(|b| b == backend) {
            continue;
        }
        for (fi, (fault, _)) in FAULTS.iter().enumerate() {
            if !params.faults.iter().any(|f| f == fault) || !applies(backend, fault) {
                continue;
            }
            let mut cell = Cell::default();
            for i in 0..params.runs {
                let t0 = Instant::now();
                let result = trial::trial(&env, backend, fault, i).await;
                match result {
                    Ok(o) => {
                        let w = o.trial.writes();
                        cell.runs += 1;
                        cell.overlaps += u32::from(o.overlap);
                        cell.takeovers += u32::from(o.takeover);
                        cell.late_grants += u32::from(o.late_grant);
                        cell.writes += w;
                        cell.caps = Some(o.caps);
                    }
                    Err(e) => cell.errors.push(e.to_string()),
                }
                eprintln!(
                    "safety: {backend:>8} {fault:<15} run {}/{} {:>6} ms{}",
                    i + 1,
                    params.runs,
                    t0.elapsed().as_millis(),
                    cell.errors
                        .last()
                        .filter(|_| cell.runs as usize <= i)
                        .map(|e| format!("  ERROR: {e}"))
                        .unwrap_or_default()
                );
            }
            cells.insert((bi, fi), cell);
        }
    }
    let _ = std::fs::remove_dir_all(&env.file_dir);
    Ok(cells)
}
