//! Reading metrics back in tests, from metrics-util's debugging recorder.
//!
//! [`record_here`] installs a recorder for the test's thread: run the test on a current-thread
//! runtime, so that tasks leasehold spawns (background releases) record into it too, and read
//! the totals once, at the end (a snapshot resets them).

use std::collections::BTreeMap;

use metrics::LocalRecorderGuard;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Records the metrics of this thread into a debugging recorder until the guard is dropped;
/// read them with [`counters`] and the snapshotter. The recorder is leaked (one per test).
pub fn record_here() -> (Snapshotter, LocalRecorderGuard<'static>) {
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    (
        recorder.snapshotter(),
        metrics::set_default_local_recorder(recorder),
    )
}

/// Every counter recorded so far, summed over its labels, by name (resets the recorder).
pub fn counters(snapshotter: &Snapshotter) -> Counters {
    let mut totals = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            *totals.entry(key.key().name().to_owned()).or_insert(0) += n;
        }
    }
    Counters(totals)
}

/// Counter totals by name, as [`counters`] read them.
#[derive(Debug, Clone, Default)]
pub struct Counters(BTreeMap<String, u64>);

impl Counters {
    /// The total of counter `name` (0 if it was never recorded).
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }
}
