//! The three scenarios every group of subjects runs: the uncontended cycle in turns, C tasks
//! on distinct keys, and clients contending on one key; and the count of what each subject
//! left on the servers after each.

use std::sync::Arc;
use std::time::Duration;

use leasehold_test_support::services;
use tokio::time::Instant;

use super::groups::Group;
use super::model::{CYCLE_TIMEOUT, HOLD, Params, Row, Scenario, WAIT};
use crate::harness::{BoxError, grants_until};
use crate::stats::Summary;
use crate::subjects::{Client, Hold, Subject};

/// Pause before counting leftovers, for releases still on the wire (the slowed node's
/// round trip is 40 ms).
const SETTLE: Duration = Duration::from_millis(100);
/// The same in `--quick` mode.
const SETTLE_QUICK: Duration = Duration::from_millis(50);
/// When a count found new locks: how long before counting again (far below the 30 s TTL).
const RECOUNT: Duration = Duration::from_secs(1);
/// The key of the cycle scenario.
pub(super) const CYCLE_KEY: &str = "u";

fn base_row(rt: &str, g: &Group, s: &Subject, scenario: Scenario, c: usize) -> Row {
    Row {
        runtime: rt.to_owned(),
        group: g.title.clone(),
        scenario,
        label: s.label.clone(),
        kind: s.kind.as_str(),
        concurrency: c,
        ..Row::default()
    }
}

/// Counts what each subject left (clients still alive), after a moment for releases that
/// are still on the wire.
pub(super) async fn count_leftovers(p: &Params, g: &Group, rows: &mut [Row]) {
    tokio::time::sleep(if p.quick { SETTLE_QUICK } else { SETTLE }).await;
    let mut found = Vec::new();
    for (s, r) in g.subjects.iter().zip(rows.iter_mut()) {
        match s.leftovers().await {
            Ok(n) => found.push(n),
            Err(e) => {
                r.error
                    .get_or_insert_with(|| format!("counting leftovers: {e}"));
                found.push(None);
            }
        }
    }
    let Ok(mut counted) = g.counted.lock().map(|c| c.clone()) else {
        return;
    };
    counted.resize(found.len(), 0);
    // A key that is gone a moment later was released late (through the slowed node's proxy,
    // on a loaded machine), not left behind: those live until their 30 s TTL. Recount once.
    if found
        .iter()
        .zip(&counted)
        .any(|(n, before)| n.is_some_and(|n| n > *before))
    {
        tokio::time::sleep(RECOUNT).await;
        for ((s, n), before) in g.subjects.iter().zip(found.iter_mut()).zip(&counted) {
            if n.is_some_and(|n| n > *before)
                && let Ok(again) = s.leftovers().await
            {
                if again < *n {
                    eprintln!(
                        "perf: {} / {}: {} lock(s) found right after the scenario were \
                         released within {RECOUNT:?}",
                        g.title,
                        s.label,
                        n.unwrap_or(0) - again.unwrap_or(0)
                    );
                }
                *n = again;
            }
        }
    }
    for ((r, n), before) in rows.iter_mut().zip(&found).zip(counted.iter_mut()) {
        if let Some(n) = *n {
            r.leftovers = Some(n.saturating_sub(*before));
            *before = n;
        }
    }
    if let Ok(mut c) = g.counted.lock() {
        *c = counted;
    }
}

pub(super) async fn timed<T>(
    fut: impl Future<Output = Result<T, BoxError>>,
    limit: Duration,
) -> Result<T, String> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

/// The cycle scenario: the group's subjects take turns in rounds.
pub(super) async fn cycle_scenario(p: &Params, rt: &str, g: &Group) -> Vec<Row> {
    const ROUNDS: usize = 10;
    let mut rows: Vec<Row> = g
        .subjects
        .iter()
        .map(|s| base_row(rt, g, s, Scenario::Cycle, 1))
        .collect();
    let mut clients: Vec<Option<Arc<dyn Client>>> = Vec::new();
    for (s, r) in g.subjects.iter().zip(rows.iter_mut()) {
        match timed((s.make)(), CYCLE_TIMEOUT).await {
            Ok(c) => clients.push(Some(c)),
            Err(e) => {
                r.error = Some(format!("connect: {e}"));
                clients.push(None);
            }
        }
    }
    if let Some((proxy, mode)) = &g.fault {
        proxy.set_mode(*mode);
    }
    let warmup = (p.iterations / 10).clamp(1, 20);
    let per = (p.iterations / ROUNDS).max(1);
    let round_budget = p.cycle_budget / ROUNDS as u32;
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); clients.len()];
    // Time spent measuring each subject: one that is out of budget sits out the remaining
    // rounds once it has a sample (a black-holed node can make a cycle take seconds).
    let mut spent = vec![Duration::ZERO; clients.len()];
    for round in 0..=ROUNDS {
        for (i, slot) in clients.iter_mut().enumerate() {
            let Some(c) = slot.clone() else { continue };
            if round > 0 && !samples[i].is_empty() && spent[i] >= p.cycle_budget {
                continue;
            }
            let started = Instant::now();
            let n = if round == 0 { warmup } else { per };
            for _ in 0..n {
                let t0 = Instant::now();
                if let Err(e) = timed(c.cycle(CYCLE_KEY), CYCLE_TIMEOUT).await {
                    rows[i].error = Some(e);
                    *slot = None;
                    break;
                }
                if round > 0 {
                    samples[i].push(t0.elapsed());
                }
                if started.elapsed() >= round_budget {
                    break;
                }
            }
            if round > 0 {
                spent[i] += started.elapsed();
            }
        }
    }
    for (r, s) in rows.iter_mut().zip(samples) {
        r.cycles = s.len();
        if !s.is_empty() {
            let sum = Summary::of(s);
            r.p50 = Some(sum.p50);
            r.p99 = Some(sum.p99);
            r.per_sec = Some(sum.per_sec);
        } else if r.error.is_none() {
            r.error = Some("no cycle measured".into());
        }
    }
    count_leftovers(p, g, &mut rows).await;
    if let Some((proxy, _)) = &g.fault {
        proxy.pass();
    }
    drop(clients);
    rows
}

/// The throughput scenario: `c` tasks on distinct keys, each subject for `p.throughput` in
/// all, split over `p.repeats` rounds that take turns (round k starts k subjects further
/// along), so that a change in machine load hits every subject alike and a ratio can be
/// taken within each round.
pub(super) async fn throughput_scenario(p: &Params, rt: &str, g: &Group, c: usize) -> Vec<Row> {
    let mut rows: Vec<Row> = g
        .subjects
        .iter()
        .map(|s| base_row(rt, g, s, Scenario::Throughput, c))
        .collect();
    // Clients made and warmed up first, all tasks at once (pools open their connections,
    // sessions are made); then the rounds.
    let mut fleets: Vec<Option<Fleet>> = Vec::new();
    for (s, r) in g.subjects.iter().zip(rows.iter_mut()) {
        let fleet = async {
            let mut clients = Vec::new();
            for i in 0..c {
                if i == 0 || !s.shared {
                    clients.push(timed((s.make)(), CYCLE_TIMEOUT).await?);
                } else {
                    clients.push(Arc::clone(&clients[0]));
                }
            }
            let tag = services::unique_prefix("t");
            run_tasks(&clients, &tag, None).await?;
            Ok::<_, String>((clients, tag))
        }
        .await;
        match fleet {
            Ok(f) => fleets.push(Some(f)),
            Err(e) => {
                r.error = Some(e);
                fleets.push(None);
            }
        }
    }
    let rounds = p.repeats.max(1);
    let per_round = p.throughput / rounds as u32;
    // Per subject: cycles, time, and the process's CPU time (user + system) in its turns.
    let mut totals = vec![(0usize, Duration::ZERO, Duration::ZERO); fleets.len()];
    for round in 0..rounds {
        for turn in 0..fleets.len() {
            let i = (round + turn) % fleets.len();
            let Some((clients, tag)) = fleets[i].as_ref() else {
                continue;
            };
            let (t0, cpu0) = (Instant::now(), cpu_time());
            match run_tasks(clients, tag, Some(per_round)).await {
                Ok(n) => {
                    let elapsed = t0.elapsed();
                    totals[i].0 += n;
                    totals[i].1 += elapsed;
                    totals[i].2 += cpu_time().saturating_sub(cpu0);
                    rows[i].round_rates.push(n as f64 / elapsed.as_secs_f64());
                }
                Err(e) => {
                    rows[i].error = Some(e);
                    fleets[i] = None;
                }
            }
        }
    }
    for (r, (n, elapsed, cpu)) in rows.iter_mut().zip(totals) {
        if r.error.is_none() {
            r.cycles = n;
            r.per_sec = Some(n as f64 / elapsed.as_secs_f64());
            r.cpu_per_cycle = (n > 0 && !cpu.is_zero()).then(|| cpu.div_f64(n as f64));
        }
    }
    count_leftovers(p, g, &mut rows).await;
    drop(fleets);
    rows
}

/// The bench process's CPU time so far (zero if it cannot be read: the figure is then left out).
fn cpu_time() -> Duration {
    super::fleet::probe::cpu_time().unwrap_or_default()
}

/// One subject's clients in a throughput run, and the prefix of their keys.
type Fleet = (Vec<Arc<dyn Client>>, String);

/// One task per client, each cycling on a key of its own: once (`run: None`) or until `run`
/// has passed. Returns the cycles completed.
pub(super) async fn run_tasks(
    clients: &[Arc<dyn Client>],
    tag: &str,
    run: Option<Duration>,
) -> Result<usize, String> {
    let end = run.map(|d| Instant::now() + d);
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let (client, key) = (Arc::clone(client), format!("{tag}-{i}"));
            tokio::spawn(async move {
                let mut n = 0usize;
                loop {
                    timed(client.cycle(&key), CYCLE_TIMEOUT).await?;
                    n += 1;
                    if end.is_none_or(|end| Instant::now() >= end) {
                        return Ok::<usize, String>(n);
                    }
                }
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(|e| e.to_string())??;
    }
    Ok(total)
}

/// The contention scenario: `p.clients` clients, each its own, on one key.
pub(super) async fn contention_scenario(p: &Params, rt: &str, g: &Group) -> Vec<Row> {
    let mut rows: Vec<Row> = g
        .subjects
        .iter()
        .map(|s| base_row(rt, g, s, Scenario::Contention, p.clients))
        .collect();
    let mut keep = Vec::new();
    for (s, r) in g.subjects.iter().zip(rows.iter_mut()) {
        let result = async {
            let mut clients = Vec::new();
            for _ in 0..p.clients {
                clients.push(timed((s.make)(), CYCLE_TIMEOUT).await?);
            }
            let key = services::unique_prefix("hot");
            // Warm-up on keys of their own: connections opened, scripts loaded.
            for (i, client) in clients.iter().enumerate() {
                timed(client.cycle(&format!("{key}-warm-{i}")), CYCLE_TIMEOUT).await?;
            }
            let end = Instant::now() + p.contention;
            let tasks: Vec<_> = clients
                .iter()
                .enumerate()
                .map(|(task, client)| {
                    let (client, key) = (Arc::clone(client), key.clone());
                    tokio::spawn(async move {
                        grants_until(task, end, || {
                            timed(
                                client.hold(Hold {
                                    key: &key,
                                    wait: WAIT,
                                    hold: HOLD,
                                }),
                                WAIT + CYCLE_TIMEOUT,
                            )
                        })
                        .await
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.map_err(|e| e.to_string())??);
            }
            keep.push(clients);
            Ok::<_, String>(all)
        }
        .await;
        match result {
            Ok(grants) => {
                r.fill_contention(grants);
            }
            Err(e) => r.error = Some(e),
        }
    }
    count_leftovers(p, g, &mut rows).await;
    drop(keep);
    rows
}
