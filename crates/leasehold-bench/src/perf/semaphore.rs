//! The `semaphore` group of `leasehold-bench perf`: on each backend that gives semaphores, an
//! uncontended permit cycle (try-acquire + release of one of [`PERMITS`] permits, one client)
//! against the same backend's lock cycle, the two taking turns in the rounds of the cycle
//! scenario, each on backends (connections) of its own.

use std::path::Path;

use leasehold_core::PermitLimit;

use super::groups::{SEMAPHORE_BACKENDS, build_semaphore_group};
use super::model::{Params, Row, Scenario};
use super::{scenarios, setup_failed};
use crate::stats::Spread;

/// Permits per key of the measured semaphores.
pub(super) const PERMITS: u32 = 4;

/// The semaphore rows of every backend that gives semaphores, on runtime `rt` (`out`: where
/// the file backend's lock folder goes).
pub(super) async fn run(p: &Params, rt: &str, out: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    for name in SEMAPHORE_BACKENDS {
        let group = match PermitLimit::new(PERMITS) {
            Ok(limit) => build_semaphore_group(name, out, limit).await,
            Err(e) => Err(e.into()),
        };
        let mut pair = match group {
            Ok(g) => scenarios::cycle_scenario(p, rt, &g).await,
            Err(e) => vec![setup_failed(rt, &format!("semaphore on {name}"), &e)],
        };
        mark(&mut pair);
        rows.extend(pair);
    }
    rows
}

/// Marks a group's rows as semaphore rows and gives the permit row its ratio to the lock row
/// (the first) measured in the same rounds.
fn mark(rows: &mut [Row]) {
    let lock = rows.first().and_then(|r| r.p50);
    for r in rows.iter_mut() {
        r.scenario = Scenario::Semaphore;
    }
    if let (Some(lock), Some(permit)) = (lock, rows.get_mut(1))
        && let Some(p50) = permit.p50
        && !lock.is_zero()
    {
        let x = p50.as_secs_f64() / lock.as_secs_f64();
        permit.ratio = Some((Spread::of(&mut [x]), "of the lock cycle".into()));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::perf::model::test_row;

    #[test]
    fn the_permit_row_gets_its_ratio_to_the_lock_row() {
        let mut rows = vec![test_row("lock", "ours", 2), test_row("permit", "ours", 3)];
        mark(&mut rows);
        assert!(rows.iter().all(|r| r.scenario == Scenario::Semaphore));
        assert!(rows[0].ratio.is_none());
        let (s, of) = rows[1].ratio.clone().unwrap_or_else(|| panic!("no ratio"));
        assert!((s.median - 1.5).abs() < 1e-9, "{s:?}");
        assert_eq!(of, "of the lock cycle");
        // No lock figure, no ratio.
        let mut rows = vec![test_row("lock", "ours", 2), test_row("permit", "ours", 3)];
        rows[0].p50 = None;
        mark(&mut rows);
        assert!(rows[1].ratio.is_none());
        assert_eq!(rows[1].p50, Some(Duration::from_millis(3)));
    }
}
