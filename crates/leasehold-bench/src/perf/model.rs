//! What `leasehold-bench perf` is asked ([`Params`]) and what it measured ([`Row`]), and
//! what makes a run fail ([`problems`]).

use std::time::Duration;

use crate::stats::{Grant, Spread, Summary};

/// What one run of `leasehold-bench perf` measures.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    /// Cycles per implementation in the cycle scenario.
    pub(crate) iterations: usize,
    /// Upper bound on the time one implementation spends in the cycle scenario.
    pub(crate) cycle_budget: Duration,
    /// Task counts of the throughput scenario.
    pub(crate) concurrency: Vec<usize>,
    /// Time each subject runs at each task count of the throughput scenario, over all its
    /// rounds (and the duration of our side of the redis-benchmark group).
    pub(crate) throughput: Duration,
    /// Clients on the one key of the contention scenario.
    pub(crate) clients: usize,
    /// Duration of each contention run.
    pub(crate) contention: Duration,
    /// Which groups to run (empty: all).
    pub(crate) groups: Vec<String>,
    /// Measurements of the repeated groups (pinned PostgreSQL, LockLayer overhead), each on
    /// new connections, and rounds of the throughput and handoff scenarios; their tables
    /// give medians and ranges.
    pub(crate) repeats: usize,
    /// Cycles per implementation and repeat in the pinned PostgreSQL groups.
    pub(crate) pinned_iterations: usize,
    /// Whether the pinned groups pin the bench and PostgreSQL to different CPUs.
    pub(crate) pin: bool,
    /// Waiter counts of the handoff group.
    pub(crate) waiters: Vec<usize>,
    /// Handoffs measured per backend and waiter count, at most (the handoff group).
    pub(crate) handoffs: usize,
    /// Time measuring handoffs per backend and waiter count, at most (the handoff group).
    pub(crate) handoff_budget: Duration,
    /// The quick smoke-test mode.
    pub(crate) quick: bool,
}

impl Params {
    /// Requests per variant and round in the LockLayer group.
    pub(crate) fn layer_requests(&self) -> u64 {
        if self.quick { 500 } else { 20_000 }
    }

    /// SET requests redis-benchmark sends in the redis-benchmark group.
    pub(crate) fn benchmark_requests(&self) -> u64 {
        if self.quick { 2_000 } else { 200_000 }
    }

    /// The `--quick` figures: everything runs, a few cycles each.
    pub(crate) fn quick(groups: Vec<String>, pin: bool) -> Self {
        Self {
            iterations: 20,
            cycle_budget: Duration::from_millis(300),
            concurrency: vec![1, 4],
            throughput: Duration::from_millis(100),
            clients: 2,
            contention: Duration::from_millis(150),
            groups,
            repeats: 2,
            pinned_iterations: 40,
            pin,
            waiters: vec![1, 4],
            handoffs: 10,
            handoff_budget: Duration::from_secs(1),
            quick: true,
        }
    }
}

/// Every group name `--groups` accepts, in run order. The pinned groups run last, in a
/// phase of their own (the CPU placement applies to them alone).
pub(crate) const GROUPS: [&str; 21] = [
    "memory",
    "file",
    "redis",
    "redis-sentinel",
    "redis-benchmark",
    "redlock3",
    "redlock5",
    "redlock7",
    "redlock5-blackhole",
    "redlock5-slow",
    "postgres-tcp",
    "postgres-unix",
    "etcd",
    "etcd-cluster",
    "semaphore",
    "handoff",
    "failover",
    "tower-layer",
    "fleet",
    "postgres-tcp-pinned",
    "postgres-unix-pinned",
];

/// Whether group `name` runs in the pinned phase.
pub(crate) fn pinned(name: &str) -> bool {
    name.ends_with("-pinned")
}

/// A hard bound on one cycle (a hung implementation fails instead of stalling the run).
pub(crate) const CYCLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a contender may wait for the key.
pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// How long a contender holds the key.
pub(crate) const HOLD: Duration = Duration::from_millis(1);

/// What a row measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// Uncontended try-acquire + release, in turns.
    #[default]
    Cycle,
    /// C tasks on distinct keys.
    Throughput,
    /// Clients on one key.
    Contention,
    /// Medians over repeats (pinned PostgreSQL, LockLayer), or a rate against a server tool.
    Repeated,
    /// Uncontended permit + release of a semaphore, and the same backend's lock cycle.
    Semaphore,
    /// Leader crash and resign to a new leader.
    Failover,
    /// W waiters on one key, each winner releasing at once.
    Handoff,
    /// A group that could not be set up.
    Setup,
}

impl Scenario {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Cycle => "cycle",
            Self::Throughput => "throughput",
            Self::Contention => "contention",
            Self::Repeated => "repeated",
            Self::Semaphore => "semaphore",
            Self::Failover => "failover",
            Self::Handoff => "handoff",
            Self::Setup => "setup",
        }
    }
}

/// One measured line of the report (one implementation, one scenario, one concurrency).
#[derive(Clone, Default)]
pub(crate) struct Row {
    /// Where it ran: the runtime, the group, the scenario.
    pub(crate) runtime: String,
    pub(crate) group: String,
    pub(crate) scenario: Scenario,
    /// What ran, of which [`Kind`](crate::subjects::Kind), with how many tasks.
    pub(crate) label: String,
    pub(crate) kind: &'static str,
    pub(crate) concurrency: usize,
    /// Why it failed, if it did.
    pub(crate) error: Option<String>,
    pub(crate) cycles: usize,
    pub(crate) p50: Option<Duration>,
    pub(crate) p99: Option<Duration>,
    pub(crate) per_sec: Option<f64>,
    pub(crate) grants: Option<usize>,
    pub(crate) handoff_p50: Option<Duration>,
    /// The handoff group's p99 (the contention scenario gives the p50 alone).
    pub(crate) handoff_p99: Option<Duration>,
    pub(crate) longest_wait: Option<Duration>,
    pub(crate) straight_back: Option<f64>,
    pub(crate) leftovers: Option<u64>,
    /// Throughput: the cycles per second of each round, in round order (a failed subject
    /// stops early), so that ratios can be taken within rounds.
    pub(crate) round_rates: Vec<f64>,
    /// Throughput: the bench process's CPU time (user + system) per cycle over the subject's
    /// turns (it includes what the process did meanwhile, such as other subjects' idle clients).
    pub(crate) cpu_per_cycle: Option<Duration>,
    /// A ratio measured in the same run (median and range over repeats), and what it is
    /// a ratio of.
    pub(crate) ratio: Option<(Spread, String)>,
    /// Failover: from the leader's crash, and from `resign()`, to a new leader's `campaign()`
    /// returning, in ms (median and range over repeats).
    pub(crate) failover: Option<Spread>,
    pub(crate) resign: Option<Spread>,
}

impl Row {
    /// Fills the contention figures from the grants of a run: how many, the handoff p50 and
    /// p99 (from a release returning to the next grant when that goes to another task; zero
    /// when the grant came first), the longest any grant waited, the percentage of grants that
    /// went to the task that had just released; an error, said in words, if a grant came
    /// before the previous holder called `release()` (two holders at once). Returns the
    /// number of handoffs.
    pub(crate) fn fill_contention(&mut self, mut grants: Vec<Grant>) -> usize {
        grants.sort_by_key(|g| g.got);
        let mut handoffs = Vec::new();
        let mut same = 0;
        for w in grants.windows(2) {
            if w[1].got < w[0].releasing {
                self.error = Some(format!(
                    "two holders at once: task {} was granted {:?} before task {} released",
                    w[1].task,
                    w[0].releasing - w[1].got,
                    w[0].task
                ));
            }
            if w[1].task == w[0].task {
                same += 1;
            } else {
                handoffs.push(w[1].got.saturating_duration_since(w[0].freed));
            }
        }
        self.grants = Some(grants.len());
        self.cycles = grants.len();
        self.longest_wait = grants.iter().map(|g| g.got - g.asked).max();
        let n = handoffs.len();
        if n > 0 {
            let s = Summary::of(handoffs);
            self.handoff_p50 = Some(s.p50);
            self.handoff_p99 = Some(s.p99);
        }
        let pairs = grants.len().saturating_sub(1).max(1);
        self.straight_back = Some(100.0 * f64::from(same) / pairs as f64);
        n
    }
}

/// What makes a run fail: errors, leftovers, figures that make no sense. Timings never do.
pub(crate) fn problems(rows: &[Row]) -> Vec<String> {
    let mut v = Vec::new();
    for r in rows {
        let what = format!(
            "[{}] {} / {} / {} (C={})",
            r.runtime,
            r.group,
            r.scenario.as_str(),
            r.label,
            r.concurrency
        );
        if let Some(e) = &r.error {
            v.push(format!("{what}: {e}"));
            continue;
        }
        if let Some(n) = r.leftovers.filter(|&n| n > 0) {
            v.push(format!("{what}: left {n} lock(s) on the server(s)"));
        }
        if let Some(why) = nonsense(r) {
            v.push(format!("{what}: {why}"));
        }
    }
    v
}

/// What makes no sense in an error-free row, if anything.
fn nonsense(r: &Row) -> Option<&'static str> {
    let no_rate = !r.per_sec.is_some_and(|x| x.is_finite() && x > 0.0);
    match r.scenario {
        Scenario::Cycle | Scenario::Semaphore
            if r.cycles == 0 || r.p50.is_none_or(|d| d.is_zero()) =>
        {
            Some("no sensible latency")
        }
        Scenario::Cycle | Scenario::Semaphore if matches!((r.p50, r.p99), (Some(a), Some(b)) if b < a) => {
            Some("p99 below p50")
        }
        Scenario::Failover if r.failover.is_none_or(|s| s.min < 0.0) => {
            Some("no failover measured")
        }
        Scenario::Throughput if r.cycles == 0 || no_rate => Some("no cycle completed"),
        Scenario::Contention if r.grants.unwrap_or(0) == 0 => Some("no grant"),
        Scenario::Handoff if r.handoff_p50.is_none() => Some("no handoff measured"),
        Scenario::Repeated if no_rate => Some("no rate measured"),
        _ => None,
    }
}

/// A clean cycle row for tests.
#[cfg(test)]
pub(crate) fn test_row(label: &str, kind: &'static str, p50_ms: u64) -> Row {
    Row {
        runtime: "rt".into(),
        group: "g".into(),
        scenario: Scenario::Cycle,
        label: label.into(),
        kind,
        concurrency: 1,
        cycles: 10,
        p50: Some(Duration::from_millis(p50_ms)),
        p99: Some(Duration::from_millis(p50_ms * 2)),
        per_sec: Some(1000.0 / p50_ms as f64),
        leftovers: Some(0),
        ..Row::default()
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    fn grant(task: usize, at: Instant, got_ms: u64, held_ms: u64) -> Grant {
        let got = at + Duration::from_millis(got_ms);
        let freed = got + Duration::from_millis(held_ms);
        Grant {
            task,
            asked: at,
            got,
            releasing: freed,
            freed,
        }
    }

    #[test]
    fn contention_figures_from_grants() {
        let t0 = Instant::now();
        let mut r = Row::default();
        // Task 0 holds 0–1 ms, task 0 again 2–3 ms, task 1 from 5 ms (asked at 0).
        r.fill_contention(vec![
            grant(1, t0, 5, 1),
            grant(0, t0, 0, 1),
            grant(0, t0, 2, 1),
        ]);
        assert_eq!(r.error, None);
        assert_eq!(r.grants, Some(3));
        assert_eq!(r.longest_wait, Some(Duration::from_millis(5)));
        assert_eq!(r.handoff_p50, Some(Duration::from_millis(2)));
        assert_eq!(r.straight_back.map(|x| x.round()), Some(50.0));
    }

    #[test]
    fn overlapping_grants_are_an_error() {
        let t0 = Instant::now();
        let mut r = Row::default();
        r.fill_contention(vec![grant(0, t0, 0, 5), grant(1, t0, 3, 1)]);
        assert!(
            r.error
                .as_deref()
                .is_some_and(|e| e.contains("two holders at once")),
            "{:?}",
            r.error
        );
        let r = Row {
            scenario: Scenario::Contention,
            ..r
        };
        assert!(!problems(&[r]).is_empty());
    }

    #[test]
    fn problems_flag_errors_leftovers_and_nonsense_but_not_timings() {
        let clean = test_row("ours", "ours", 3);
        assert!(problems(std::slice::from_ref(&clean)).is_empty());
        let slow = test_row("ours", "ours", 30_000);
        assert!(problems(&[slow]).is_empty(), "timings never fail a run");
        let leaky = Row {
            leftovers: Some(2),
            ..clean.clone()
        };
        assert!(problems(&[leaky])[0].contains("left 2 lock(s)"));
        let failed = Row {
            error: Some("boom".into()),
            ..clean.clone()
        };
        assert!(problems(&[failed])[0].ends_with("boom"));
        let empty = Row {
            cycles: 0,
            p50: None,
            ..clean.clone()
        };
        assert!(problems(&[empty])[0].contains("no sensible latency"));
        let idle = Row {
            scenario: Scenario::Throughput,
            cycles: 0,
            per_sec: Some(0.0),
            ..clean.clone()
        };
        assert!(problems(&[idle])[0].contains("no cycle completed"));
        let unmeasured = Row {
            scenario: Scenario::Repeated,
            per_sec: None,
            ..clean
        };
        assert!(problems(&[unmeasured])[0].contains("no rate measured"));
    }
}
