//! What every measurement shares: interleaved rounds, holds, contention grants, and the
//! Tokio runtimes measured on.

use std::error::Error;

use tokio::runtime::Runtime;
use tokio::time::Instant;

use crate::stats::{Grant, Summary};

/// The error of a benchmark run.
pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// Cycles of one implementation per round: the implementations take turns every few cycles,
/// so drift in machine load (a noisy neighbour, a busy second CPU) hits all of them alike.
const BLOCK: usize = 20;

/// Measures `k` implementations, `n` cycles each, in alternating rounds of [`BLOCK`] cycles
/// after `warmup` cycles of each; `cycle(i)` runs one cycle of implementation `i`. One summary
/// per implementation.
pub(crate) async fn interleaved(
    n: usize,
    k: usize,
    warmup: usize,
    mut cycle: impl AsyncFnMut(usize) -> Result<(), BoxError>,
) -> Result<Vec<Summary>, BoxError> {
    let rounds = (n / BLOCK).max(1);
    let per = n.div_ceil(rounds);
    for _ in 0..warmup {
        for i in 0..k {
            cycle(i).await?;
        }
    }
    let mut samples: Vec<Vec<_>> = (0..k).map(|_| Vec::with_capacity(n)).collect();
    for _ in 0..rounds {
        for (i, out) in samples.iter_mut().enumerate() {
            for _ in 0..per.min(n - out.len()) {
                let t0 = Instant::now();
                cycle(i).await?;
                out.push(t0.elapsed());
            }
        }
    }
    Ok(samples.into_iter().map(Summary::of).collect())
}

/// Holds a granted lock for `hold` (no sleep at all for a zero hold): the instants the hold
/// began and ended.
pub(crate) async fn held_for(hold: std::time::Duration) -> (Instant, Instant) {
    let got = Instant::now();
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    (got, Instant::now())
}

/// Task `task` of a contention run: takes the lock over and over until `end`. `take` waits
/// for it, holds it and releases it, and returns the instants it was granted and released.
pub(crate) async fn grants_until<E, F, Fut>(
    task: usize,
    end: Instant,
    mut take: F,
) -> Result<Vec<Grant>, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(Instant, Instant), E>>,
{
    let mut grants = Vec::new();
    while Instant::now() < end {
        let asked = Instant::now();
        let (got, freed) = take().await?;
        // The contention subjects time the release as a whole: a grant to another task
        // before it returned counts as an overlap.
        grants.push(Grant {
            task,
            asked,
            got,
            releasing: freed,
            freed,
        });
    }
    Ok(grants)
}

/// Which Tokio runtime(s) to measure on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Runtimes {
    Both,
    MultiThread,
    CurrentThread,
}

impl Runtimes {
    /// The names of the runtimes chosen, each built when its turn comes ([`runtime`]).
    pub(crate) fn names(self) -> Vec<&'static str> {
        match self {
            Self::Both => vec!["multi-thread", "current-thread"],
            Self::MultiThread => vec!["multi-thread"],
            Self::CurrentThread => vec!["current-thread"],
        }
    }
}

/// Builds the runtime of that name.
pub(crate) fn runtime(flavour: &str) -> Result<Runtime, BoxError> {
    let rt = if flavour == "multi-thread" {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    };
    Ok(rt)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every implementation gets exactly `n` measured cycles, in rounds of `BLOCK` that take
    /// turns, after its warm-up.
    #[tokio::test]
    async fn interleaved_runs_n_cycles_each_in_alternating_blocks() {
        for n in [1, 7, BLOCK, 2 * BLOCK + 3, 1000] {
            let mut order = Vec::new();
            let s = interleaved(n, 3, 2, async |i| {
                order.push(i);
                Ok(())
            })
            .await
            .unwrap();
            assert_eq!(s.len(), 3);
            let (warm, measured) = order.split_at(6);
            assert_eq!(warm, [0, 1, 2, 0, 1, 2]);
            for i in 0..3 {
                assert_eq!(measured.iter().filter(|&&x| x == i).count(), n, "n = {n}");
            }
            let longest_run = measured
                .chunk_by(|a, b| a == b)
                .map(<[usize]>::len)
                .max()
                .unwrap_or(0);
            assert!(longest_run < 2 * BLOCK, "n = {n}: a run of {longest_run}");
        }
    }
}
