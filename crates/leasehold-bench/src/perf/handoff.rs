//! The `handoff` group of `leasehold-bench perf`: waiting at scale. On each backend that waits
//! (each of our subjects of its lock group, one after the other), W + 1 clients, each its own (a backend and connections of its own, as separate processes
//! would have), want one key with `acquire(key, budget)`. Whoever is granted releases at once
//! (as soon as every other client is waiting, see [`SETTLE`]) and queues again once another
//! client was granted, so every grant hands the key over with W clients waiting. Handoff: from
//! `release()` returning to the next grant. The table gives its p50 and p99 for each W, the
//! p50 against the same backend's at the first W, and Redlock's one-waiter handoff against
//! single-node Redis's. Every row is measured in `--repeats` rounds taking turns, and its
//! ratios are taken within each round ([`merge`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leasehold_test_support::services;
use tokio::sync::watch;
use tokio::time::Instant;

use super::groups::{Group, build_group};
use super::model::{CYCLE_TIMEOUT, Params, Row, Scenario};
use super::output::{fmt_fine, fmt_ms, left, line_table, ratio_cell};
use super::scenarios::{count_leftovers, timed};
use super::setup_failed;
use crate::harness::BoxError;
use crate::report::Table;
use crate::stats::{Grant, Spread};
use crate::subjects::{Client, Kind, Subject, released};

/// The backends that wait, as their lock groups are named; ours is measured on each.
const BACKENDS: [&str; 6] = [
    "memory",
    "file",
    "redis",
    "redlock5",
    "postgres-tcp",
    "etcd",
];
/// How long every other client has been waiting when a winner releases: a waiter that queued
/// again a moment ago has then had its first attempt answered and is waiting (a few round
/// trips on loopback), so the release finds W waiters.
pub(super) const SETTLE: Duration = Duration::from_millis(5);
/// How long the clients still waiting when the measurement stops may take to drain (each
/// takes the key once and releases it).
const DRAIN: Duration = Duration::from_secs(30);
/// Attempts at each client's warm-up cycle.
const WARM_TRIES: u32 = 3;

/// The handoff rows of every backend that waits, on runtime `rt` (`out`: where the file
/// backend's lock folder goes), measured in `--repeats` rounds (see [`merge`]).
pub(super) async fn run(p: &Params, rt: &str, out: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut subjects: Vec<(&str, Group)> = Vec::new();
    for name in BACKENDS {
        match ours_only(name, out, p.quick).await {
            Ok(groups) => subjects.extend(groups.into_iter().map(|g| (name, g))),
            Err(e) => rows.push(setup_failed(rt, &format!("handoff on {name}"), &e)),
        }
    }
    let title = |n: &str| {
        subjects
            .iter()
            .find(|(t, _)| *t == n)
            .map(|(_, g)| g.title.clone())
    };
    let (redis, redlock) = (title("redis"), title("redlock5"));
    // Each round measures every subject at every W, one after another, starting one further
    // along each round: the host's load drifts over minutes, a ratio within a round cancels it.
    let rounds = p.repeats.max(1);
    let mut measured: Vec<Vec<Row>> = vec![Vec::new(); subjects.len() * p.waiters.len()];
    for round in 0..rounds {
        let mut this_round = Vec::new();
        for k in 0..subjects.len() {
            let at = (k + round) % subjects.len();
            let (name, g) = &subjects[at];
            for (j, &w) in p.waiters.iter().enumerate() {
                let started = Instant::now();
                this_round.push((at * p.waiters.len() + j, measure(p, rt, g, w).await));
                eprintln!(
                    "perf [{rt}] handoff on {name} ({}), W={w}, round {}/{rounds}: {:.1} s",
                    g.subjects[0].label,
                    round + 1,
                    started.elapsed().as_secs_f64()
                );
            }
        }
        this_round.sort_by_key(|(i, _)| *i);
        let (places, mut round_rows): (Vec<usize>, Vec<Row>) = this_round.into_iter().unzip();
        ratios(&mut round_rows, p, redis.clone(), redlock.clone());
        for (i, r) in places.into_iter().zip(round_rows) {
            measured[i].push(r);
        }
    }
    rows.extend(measured.into_iter().filter_map(merge));
    rows
}

/// One row of the rounds of a (backend, W): the figures of the round whose handoff p50 is the
/// median (the lower one of an even count), the ratio as median and range of the rounds'
/// ratios, the locks left summed. A round that failed makes the row fail with its error.
fn merge(mut rounds: Vec<Row>) -> Option<Row> {
    let leftovers = rounds
        .iter()
        .filter_map(|r| r.leftovers)
        .reduce(|a, b| a + b);
    let mut ratios: Vec<f64> = rounds
        .iter()
        .filter_map(|r| r.ratio.as_ref().map(|(s, _)| s.median))
        .collect();
    let of = rounds
        .iter()
        .find_map(|r| r.ratio.as_ref().map(|(_, of)| of.clone()));
    let failed = rounds.iter().position(|r| r.error.is_some());
    let mut row = match failed {
        Some(i) => {
            let mut r = rounds.swap_remove(i);
            r.error = r.error.map(|e| format!("round {}: {e}", i + 1));
            r
        }
        None => {
            rounds.sort_by_key(|r| r.handoff_p50);
            let mid = rounds.len().checked_sub(1)? / 2;
            rounds.swap_remove(mid)
        }
    };
    row.leftovers = leftovers;
    row.ratio = of.map(|of| (Spread::of(&mut ratios), of));
    Some(row)
}

/// Lock group `name` with our subjects alone, each in a group of its own (the first, in its
/// default mode, in the group that keeps what the subjects need).
async fn ours_only(name: &'static str, out: &Path, quick: bool) -> Result<Vec<Group>, BoxError> {
    let mut g = build_group(name, out, quick).await?;
    let mut ours: Vec<Subject> = Vec::new();
    for s in std::mem::take(&mut g.subjects) {
        if s.kind == Kind::Ours {
            ours.push(s);
        }
    }
    let mut ours = ours.into_iter();
    let first = ours
        .next()
        .ok_or_else(|| format!("no leasehold subject in group {name}"))?;
    let others = ours.map(|s| {
        let mut other = Group::new(false);
        other.title.clone_from(&g.title);
        other.subjects = vec![s];
        other
    });
    let others: Vec<Group> = others.collect();
    g.subjects = vec![first];
    Ok(std::iter::once(g).chain(others).collect())
}

/// One backend at W waiters: the row, with the locks left counted while the clients live.
async fn measure(p: &Params, rt: &str, g: &Group, w: usize) -> Row {
    let s: &Subject = &g.subjects[0];
    let mut row = [Row {
        runtime: rt.to_owned(),
        group: g.title.clone(),
        scenario: Scenario::Handoff,
        label: s.label.clone(),
        kind: s.kind.as_str(),
        concurrency: w,
        ..Row::default()
    }];
    let mut clients = Vec::new();
    let result = async {
        for _ in 0..=w {
            clients.push(timed((s.make)(), CYCLE_TIMEOUT).await?);
        }
        relay(p, &clients).await
    }
    .await;
    match result {
        Ok((turns, failed)) => {
            fill(&mut row[0], turns);
            if let Some(e) = failed {
                row[0].error.get_or_insert(e);
            }
        }
        Err(e) => row[0].error = Some(e),
    }
    count_leftovers(p, g, &mut row).await;
    drop(clients);
    let [row] = row;
    row
}

/// What the clients of a relay share.
struct Relay {
    /// When each client began waiting (`None`: not waiting).
    waiting: Vec<Option<Instant>>,
    /// The client granted last.
    holder: Option<usize>,
    turns: Vec<Grant>,
    /// Set once enough handoffs were measured, the time is up, or a client failed.
    stop: bool,
    error: Option<String>,
}

/// Runs the relay of `clients` on one key: the grants measured, and why the relay failed if
/// it did (an error before the relay began: `Err`).
async fn relay(p: &Params, clients: &[Arc<dyn Client>]) -> Result<Relayed, String> {
    let key = services::unique_prefix("handoff");
    // Warm-up on keys of their own: connections opened, scripts loaded. Not measured, so a
    // transient failure (a Redlock node slower than its 50 ms bound on a loaded machine) is
    // tried again.
    for (i, c) in clients.iter().enumerate() {
        let warm = format!("{key}-warm-{i}");
        let mut tries = 0;
        while let Err(e) = timed(c.cycle(&warm), CYCLE_TIMEOUT).await {
            tries += 1;
            if tries == WARM_TRIES {
                return Err(format!("warm-up: {e}"));
            }
        }
    }
    let (tx, _) = watch::channel(Relay {
        waiting: vec![None; clients.len()],
        holder: None,
        turns: Vec::new(),
        stop: false,
        error: None,
    });
    let tx = Arc::new(tx);
    let end = Instant::now() + p.handoff_budget;
    let budget = p.handoff_budget + DRAIN;
    let want = p.handoffs + 1;
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (c, tx, key) = (Arc::clone(c), Arc::clone(&tx), key.clone());
            tokio::spawn(async move {
                let turns = Turns {
                    client: i,
                    tx: &tx,
                    key: &key,
                    budget,
                    end,
                    want,
                };
                if let Err(e) = turns.take(c.as_ref()).await {
                    tx.send_modify(|r| {
                        r.stop = true;
                        r.error.get_or_insert(format!("client {i}: {e}"));
                    });
                }
            })
        })
        .collect();
    let aborts: Vec<_> = tasks
        .iter()
        .map(tokio::task::JoinHandle::abort_handle)
        .collect();
    let joined = tokio::time::timeout(budget + CYCLE_TIMEOUT, async {
        for t in tasks {
            t.await.map_err(|e| e.to_string())?;
        }
        Ok::<_, String>(())
    })
    .await;
    aborts.iter().for_each(tokio::task::AbortHandle::abort);
    let joined = match joined {
        Ok(j) => j.err(),
        Err(_) => Some("the waiters did not drain in time".to_owned()),
    };
    let r = tx.borrow();
    Ok((r.turns.clone(), r.error.clone().or(joined)))
}

/// The grants of a relay, and why it failed if it did.
type Relayed = (Vec<Grant>, Option<String>);

/// One client's part in a relay.
struct Turns<'a> {
    client: usize,
    tx: &'a watch::Sender<Relay>,
    key: &'a str,
    /// The wait budget of each `acquire`.
    budget: Duration,
    /// When to stop measuring, and how many grants to measure at most.
    end: Instant,
    want: usize,
}

impl Turns<'_> {
    /// Takes the key over and over: waits for it, releases it once every other client
    /// waits, and queues again once another client was granted. Ends when the relay stops
    /// and this client is not waiting.
    async fn take(&self, c: &dyn Client) -> Result<(), String> {
        let i = self.client;
        let locker = c.locker().ok_or("not a leasehold client")?;
        let mut rx = self.tx.subscribe();
        loop {
            let stop = rx
                .wait_for(|r| r.stop || r.holder != Some(i))
                .await
                .map_err(|e| e.to_string())?
                .stop;
            if stop {
                return Ok(());
            }
            let asked = Instant::now();
            self.tx.send_modify(|r| r.waiting[i] = Some(asked));
            let lease = locker
                .acquire(self.key, self.budget)
                .await
                .map_err(|e| e.to_string())?;
            let got = Instant::now();
            self.tx.send_modify(|r| {
                r.waiting[i] = None;
                r.holder = Some(i);
            });
            self.all_waiting(&mut rx).await?;
            let releasing = Instant::now();
            released(lease.release().await.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            let freed = Instant::now();
            let turn = Grant {
                task: i,
                asked,
                got,
                releasing,
                freed,
            };
            self.tx.send_modify(|r| {
                if !r.stop {
                    r.turns.push(turn);
                    r.stop = r.turns.len() >= self.want || freed >= self.end;
                }
            });
        }
    }

    /// Returns once every other client has been waiting for [`SETTLE`], or the relay stops.
    async fn all_waiting(&self, rx: &mut watch::Receiver<Relay>) -> Result<(), String> {
        loop {
            let since = {
                let r = rx.borrow_and_update();
                if r.stop {
                    return Ok(());
                }
                let others = r.waiting.iter().enumerate();
                let others = others.filter(|&(j, _)| j != self.client).map(|(_, w)| *w);
                others
                    .collect::<Option<Vec<_>>>()
                    .map(|v| v.into_iter().max())
            };
            match since {
                None => rx.changed().await.map_err(|e| e.to_string())?,
                Some(Some(t)) if Instant::now() < t + SETTLE => {
                    tokio::time::sleep_until(t + SETTLE).await;
                }
                Some(_) => return Ok(()),
            }
        }
    }
}

/// Fills a row from the grants of a relay ([`Row::fill_contention`]); its cycles are the
/// handoffs.
fn fill(row: &mut Row, turns: Vec<Grant>) {
    row.cycles = row.fill_contention(turns);
}

/// The ratio of two p50s, if both were measured.
fn p50_ratio(of: &Row, base: Option<&Row>) -> Option<Spread> {
    let (x, b) = (of.handoff_p50?, base?.handoff_p50?);
    (!b.is_zero()).then(|| Spread::of(&mut [x.as_secs_f64() / b.as_secs_f64()]))
}

/// Gives each row at more waiters its p50 against the same backend's at the first waiter
/// count, and Redlock's row at that count its p50 against single-node Redis's (`redis`,
/// `redlock`: their group titles).
fn ratios(rows: &mut [Row], p: &Params, redis: Option<String>, redlock: Option<String>) {
    let Some(&first) = p.waiters.first() else {
        return;
    };
    // The first row of a group at `w` (its default mode: measured first), or of a label.
    let at = |rows: &[Row], group: &str, label: Option<&str>, w: usize| {
        rows.iter()
            .find(|r| r.group == group && label.is_none_or(|l| r.label == l))
            .filter(|r| r.concurrency == w && r.error.is_none())
            .cloned()
    };
    for i in 0..rows.len() {
        if rows[i].concurrency == first {
            continue;
        }
        let base = at(rows, &rows[i].group, Some(&rows[i].label), first);
        if let Some(x) = p50_ratio(&rows[i], base.as_ref()) {
            rows[i].ratio = Some((x, format!("of W={first}")));
        }
    }
    if let (Some(redis), Some(redlock)) = (redis, redlock)
        && let Some(base) = at(rows, &redis, None, first)
        && let Some(r) = rows
            .iter_mut()
            .find(|r| r.group == redlock)
            .filter(|r| r.concurrency == first)
        && let Some(x) = p50_ratio(r, Some(&base))
    {
        r.ratio = Some((x, format!("of single-node Redis at W={first}")));
    }
}

/// The handoff table of runtime `rt`.
pub(super) fn table(groups: &[(&str, Vec<&Row>)], rt: &str, p: &Params) -> Table {
    let title = format!(
        "Waiting at scale: W waiters on one key, each winner releasing at once; at most {} \
         handoffs or {:?} per W, {} rounds taking turns ({rt} runtime)",
        p.handoffs,
        p.handoff_budget,
        p.repeats.max(1)
    );
    let header = [
        "backend",
        "implementation",
        "waiters (W)",
        "handoffs",
        "handoff p50",
        "handoff p99",
        "longest wait",
        "p50 ratio",
        "locks left",
    ];
    let mut t = line_table(title, &header, groups, Scenario::Handoff, |r| {
        vec![
            r.concurrency.to_string(),
            r.cycles.to_string(),
            fmt_fine(r.handoff_p50),
            fmt_fine(r.handoff_p99),
            fmt_ms(r.longest_wait),
            ratio_cell(r),
            left(r.error.as_deref(), r.leftovers),
        ]
    });
    t.note(format!(
        "W + 1 clients, each its own (a backend and connections of its own, as separate \
         processes would have; the memory rows share one in-process backend), want one key \
         with `acquire(key, budget)`. The client granted releases as soon as every other \
         client has been waiting for {SETTLE:?}, and queues again once another client was \
         granted, so each release finds W waiters and every grant is a handoff. Handoff: from \
         `release()` returning to the next grant. *p50 ratio*: at W > 1 the handoff p50 \
         against the same backend's at W = 1; on the Redlock row at W = 1, against \
         single-node Redis's at W = 1. Each round measures every row once, one after \
         another, starting one backend further along each round (`--repeats` rounds): a row's \
         figures are those of its round with the median handoff p50, its p50 ratio the \
         median and range of the ratios within each round (the host's load drifts over \
         minutes, a ratio within a round cancels it). *locks left* as in the cycle table, \
         summed over the rounds."
    ));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(task: usize, at: Instant, got_ms: u64) -> Grant {
        let got = at + Duration::from_millis(got_ms);
        Grant {
            task,
            asked: at,
            got,
            releasing: got + Duration::from_millis(1),
            freed: got + Duration::from_millis(2),
        }
    }

    #[test]
    fn handoffs_run_from_release_returning_to_the_next_grant() {
        let t0 = Instant::now();
        let mut r = Row::default();
        // Granted at 0, 5, 8 and 11 ms (each release called 1 ms and returning 2 ms after
        // its grant): handoffs of 3, 1 and 1 ms; the longest wait 5 ms.
        let later = t0 + Duration::from_millis(6);
        fill(
            &mut r,
            vec![
                turn(1, t0, 5),
                turn(0, t0, 0),
                turn(0, later, 2),
                turn(1, later, 5),
            ],
        );
        assert_eq!(r.error, None);
        assert_eq!((r.grants, r.cycles), (Some(4), 3));
        assert_eq!(r.handoff_p50, Some(Duration::from_millis(1)));
        assert_eq!(r.handoff_p99, Some(Duration::from_millis(3)));
        assert_eq!(r.longest_wait, Some(Duration::from_millis(5)));
        // A grant before the previous holder called release: two holders at once.
        let mut r = Row::default();
        fill(&mut r, vec![turn(0, t0, 0), turn(1, t0, 0)]);
        assert!(
            r.error
                .as_deref()
                .is_some_and(|e| e.contains("two holders at once")),
            "{:?}",
            r.error
        );
    }

    #[test]
    fn rounds_merge_into_the_median_round_with_ratios_per_round() {
        let row = |ms: u64, ratio: f64, left: u64| Row {
            group: "redis".into(),
            concurrency: 64,
            handoff_p50: Some(Duration::from_millis(ms)),
            ratio: Some((Spread::of(&mut [ratio]), "of W=1".into())),
            leftovers: Some(left),
            ..Row::default()
        };
        let merged = merge(vec![row(5, 1.5, 0), row(3, 1.1, 1), row(9, 2.5, 0)]).unwrap();
        assert_eq!(merged.handoff_p50, Some(Duration::from_millis(5)));
        assert_eq!(merged.leftovers, Some(1));
        assert_eq!(ratio_cell(&merged), "1.500× [1.10–2.50×] of W=1");
        // A failed round fails the row, saying which round.
        let failed = Row {
            error: Some("client 3: timed out".into()),
            ..row(4, 1.0, 0)
        };
        let merged = merge(vec![row(5, 1.5, 0), failed]).unwrap();
        assert_eq!(
            merged.error.as_deref(),
            Some("round 2: client 3: timed out")
        );
        assert!(merge(Vec::new()).is_none());
    }

    #[test]
    fn ratios_against_one_waiter_and_single_node_redis() {
        let p = Params::quick(Vec::new(), false);
        let row = |group: &str, w: usize, ms: u64| Row {
            group: group.into(),
            scenario: Scenario::Handoff,
            concurrency: w,
            handoff_p50: Some(Duration::from_millis(ms)),
            ..Row::default()
        };
        let mut rows = vec![
            row("redis", 1, 2),
            row("redis", 4, 3),
            row("redlock", 1, 8),
            row("redlock", 4, 4),
        ];
        ratios(&mut rows, &p, Some("redis".into()), Some("redlock".into()));
        let cell = |r: &Row| ratio_cell(r);
        assert_eq!(cell(&rows[0]), "–");
        assert_eq!(cell(&rows[1]), "1.500× of W=1");
        assert_eq!(cell(&rows[2]), "4.000× of single-node Redis at W=1");
        assert_eq!(cell(&rows[3]), "0.500× of W=1");
        let no_grant = Row {
            handoff_p50: None,
            ..rows[0].clone()
        };
        let problems = crate::perf::model::problems(&[no_grant]);
        assert!(problems[0].contains("no handoff measured"), "{problems:?}");
    }
}
