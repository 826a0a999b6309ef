//! How `leasehold-bench perf` reports its rows: the Markdown tables (one set per runtime),
//! and the CSV, from the same rows as the charts ([`charts`](super::charts)).

use std::fmt::Write as _;
use std::time::Duration;

use super::failover::TTL as FAILOVER_TTL;
use super::model::{HOLD, Params, Row, Scenario};
use super::semaphore::PERMITS;
use crate::report::{Table, csv_text};
use crate::stats::{Spread, ms};

pub(super) fn fmt_ms(d: Option<Duration>) -> String {
    d.map(ms).unwrap_or_else(|| "–".into())
}

/// A duration in µs below 10 µs (the LockLayer group's requests), else in ms.
pub(super) fn fmt_fine(d: Option<Duration>) -> String {
    match d {
        Some(d) if d < Duration::from_micros(10) => format!("{:.2} µs", d.as_secs_f64() * 1e6),
        other => fmt_ms(other),
    }
}

fn fmt_rate(x: Option<f64>) -> String {
    x.map(|x| format!("{x:.0}")).unwrap_or_else(|| "–".into())
}

fn ratio(x: Option<f64>, base: Option<f64>) -> String {
    match (x, base) {
        (Some(x), Some(b)) if b > 0.0 => format!("{:.2}×", x / b),
        _ => "–".into(),
    }
}

/// The *locks left* cell: the error, or the count.
pub(super) fn left(error: Option<&str>, leftovers: Option<u64>) -> String {
    match (error, leftovers) {
        (Some(e), _) => format!("**failed**: {}", e.replace('|', "/")),
        (None, Some(n)) => n.to_string(),
        (None, None) => "–".into(),
    }
}

fn implementation(r: &Row) -> String {
    format!("{} *({})*", r.label, r.kind)
}

/// The p50 (cycle) or rate (throughput) of the group's raw row and best peer.
fn baselines<'a>(
    rows: &'a [&'a Row],
    value: impl Fn(&Row) -> Option<f64>,
    lower_is_better: bool,
) -> (Option<f64>, Option<f64>) {
    let raw = rows.iter().find(|r| r.kind == "raw").and_then(|r| value(r));
    let peers = rows
        .iter()
        .filter(|r| r.kind == "peer" && r.error.is_none())
        .filter_map(|r| value(r));
    let best = if lower_is_better {
        peers.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))
    } else {
        peers.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    (raw, best)
}

/// The rows of one runtime, grouped by group in run order.
fn by_group<'a>(rows: &'a [Row], rt: &str) -> Vec<(&'a str, Vec<&'a Row>)> {
    let mut groups: Vec<(&str, Vec<&Row>)> = Vec::new();
    for r in rows.iter().filter(|r| r.runtime == rt) {
        match groups.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, v)) => v.push(r),
            None => groups.push((&r.group, vec![r])),
        }
    }
    groups
}

fn cycle_table(groups: &[(&str, Vec<&Row>)], rt: &str) -> Table {
    let mut t = Table::new(
        &format!("Uncontended acquire + release cycle ({rt} runtime)"),
        &[
            "backend",
            "implementation",
            "p50",
            "p99",
            "cycles/s",
            "p50 vs raw",
            "p50 vs best peer",
            "locks left",
        ],
    );
    for (g, rows) in groups {
        let cyc: Vec<&Row> = rows
            .iter()
            .copied()
            .filter(|r| matches!(r.scenario, Scenario::Cycle | Scenario::Setup))
            .collect();
        let (raw, best) = baselines(&cyc, |r| r.p50.map(|d| d.as_secs_f64()), true);
        for r in &cyc {
            let p50 = r.p50.map(|d| d.as_secs_f64());
            t.row(vec![
                (*g).to_owned(),
                implementation(r),
                fmt_ms(r.p50),
                fmt_ms(r.p99),
                fmt_rate(r.per_sec),
                ratio(p50, raw),
                ratio(p50, best),
                left(r.error.as_deref(), r.leftovers),
            ]);
        }
    }
    t.note(
        "Ratios are against the group's raw protocol cycle and its fastest peer, measured in the \
         same run with the implementations taking turns. *locks left*: lock keys (or advisory \
         locks, or etcd keys and leases) the scenario added on the servers, counted right \
         after it while its clients were still connected (and, when that finds any, once \
         more a second later, so a release still on the wire does not count)."
            .to_owned(),
    );
    t
}

/// The ratios of `r`'s rate, round by round, to the raw row's and the fastest peer's rate
/// of the same round (`at_top`: the group's rows at the top task count): the median and
/// range of each, or none without a shared round.
fn round_ratios(r: &Row, at_top: &[&Row]) -> (Option<Spread>, Option<Spread>) {
    let raw = at_top.iter().find(|x| x.kind == "raw");
    let peers: Vec<&Row> = at_top
        .iter()
        .copied()
        .filter(|x| x.kind == "peer" && x.error.is_none())
        .collect();
    let (mut vs_raw, mut vs_peer) = (Vec::new(), Vec::new());
    for (k, &rate) in r.round_rates.iter().enumerate() {
        if let Some(&b) = raw.and_then(|x| x.round_rates.get(k)).filter(|&&b| b > 0.0) {
            vs_raw.push(rate / b);
        }
        let best = peers
            .iter()
            .filter_map(|x| x.round_rates.get(k).copied())
            .fold(0.0, f64::max);
        if best > 0.0 {
            vs_peer.push(rate / best);
        }
    }
    let spread = |mut v: Vec<f64>| (!v.is_empty()).then(|| Spread::of(&mut v));
    (spread(vs_raw), spread(vs_peer))
}

/// One throughput line: the rates at each task count, the ratios at the top one.
fn throughput_cells(
    p: &Params,
    g: &str,
    label: &str,
    rows: &[&Row],
    at_top: &[&Row],
) -> Vec<String> {
    let top = p.concurrency.last().copied().unwrap_or(1);
    let mut cells = vec![g.to_owned(), String::new()];
    let (mut failed, mut left_total, mut kind) = (None, None::<u64>, "");
    let (mut ratios, mut cpu) = ((None, None), None);
    for &c in &p.concurrency {
        let r = rows.iter().find(|r| r.label == label && r.concurrency == c);
        cells.push(match r {
            Some(r) if r.error.is_none() => fmt_rate(r.per_sec),
            Some(_) => "failed".into(),
            None => "–".into(),
        });
        let Some(r) = r else { continue };
        kind = r.kind;
        failed = failed.or(r.error.as_deref());
        if let Some(n) = r.leftovers {
            left_total = Some(left_total.unwrap_or(0) + n);
        }
        if c == top && r.error.is_none() {
            ratios = round_ratios(r, at_top);
            cpu = r.cpu_per_cycle;
        }
    }
    cells[1] = format!("{label} *({kind})*");
    let cell = |s: Option<Spread>| s.map_or_else(|| "–".into(), |s| s.times());
    cells.push(cell(ratios.0));
    cells.push(cell(ratios.1));
    cells.push(cpu.map_or_else(
        || "–".into(),
        |d| format!("{:.1} µs", d.as_secs_f64() * 1e6),
    ));
    cells.push(left(failed, left_total));
    cells
}

fn throughput_table(groups: &[(&str, Vec<&Row>)], rt: &str, p: &Params) -> Table {
    let top = p.concurrency.last().copied().unwrap_or(1);
    let mut header = vec!["backend".to_owned(), "implementation".to_owned()];
    header.extend(p.concurrency.iter().map(|c| format!("C={c} cycles/s")));
    header.push(format!("vs raw at C={top}"));
    header.push(format!("vs best peer at C={top}"));
    header.push(format!("client CPU per cycle at C={top}"));
    header.push("locks left".into());
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(
        &format!(
            "Throughput: C tasks on distinct keys for {:?} each, {} rounds taking turns ({rt} \
             runtime)",
            p.throughput,
            p.repeats.max(1)
        ),
        &header,
    );
    for (g, rows) in groups {
        let tput: Vec<&Row> = rows
            .iter()
            .copied()
            .filter(|r| r.scenario == Scenario::Throughput)
            .collect();
        let at_top: Vec<&Row> = tput
            .iter()
            .copied()
            .filter(|r| r.concurrency == top)
            .collect();
        let mut labels: Vec<&str> = Vec::new();
        for r in &tput {
            if !labels.contains(&r.label.as_str()) {
                labels.push(&r.label);
            }
        }
        for l in labels {
            t.row(throughput_cells(p, g, l, &tput, &at_top));
        }
    }
    t.note(
        "Shared clients (a `Locker`, a multiplexed connection, a peer's pool) serve all C tasks; \
         our PostgreSQL backend shares at most `max_sessions` (10) sessions among all its locks. \
         Each implementation runs its time in rounds that take turns with the other \
         implementations of its backend, each round starting one implementation further \
         along. Rates are over all rounds; a ratio is the median [range] of the ratios taken \
         within each round (to the raw row's rate, and to the fastest peer's, of the same \
         round), so dividing two printed rates need not give it. *client CPU per cycle*: the \
         bench process's user + system CPU time (`getrusage`) over the implementation's turns, \
         per cycle (the servers' work is not in it). *locks left* sums over the task counts."
            .to_owned(),
    );
    t
}

/// A table of one line per row of `scenario`, its cells from `cells`.
pub(super) fn line_table(
    title: String,
    header: &[&str],
    groups: &[(&str, Vec<&Row>)],
    scenario: Scenario,
    cells: impl Fn(&Row) -> Vec<String>,
) -> Table {
    let mut t = Table::new(&title, header);
    for (g, rows) in groups {
        for r in rows.iter().filter(|r| r.scenario == scenario) {
            let mut line = vec![(*g).to_owned(), implementation(r)];
            line.extend(cells(r));
            t.row(line);
        }
    }
    t
}

fn contention_table(groups: &[(&str, Vec<&Row>)], rt: &str, p: &Params) -> Table {
    let title = format!(
        "One key, {} clients contending for {:?}, each holding it {HOLD:?} ({rt} runtime)",
        p.clients, p.contention
    );
    let header = [
        "backend",
        "implementation",
        "grants",
        "handoff p50",
        "longest wait",
        "taken straight back",
        "locks left",
    ];
    let mut t = line_table(title, &header, groups, Scenario::Contention, |r| {
        let back = r.straight_back.map(|x| format!("{x:.0}%"));
        vec![
            r.grants.map_or_else(|| "–".into(), |n| n.to_string()),
            fmt_ms(r.handoff_p50),
            fmt_ms(r.longest_wait),
            back.unwrap_or_else(|| "–".into()),
            left(r.error.as_deref(), r.leftovers),
        ]
    });
    t.note(
        "Each contender has its own client, as separate processes would. Handoff: from a \
         release to the next grant to a *different* client. Longest wait: the fairness figure. \
         \"Taken straight back\": grants that went to the client that had just released. The \
         raw PostgreSQL row waits in the server's own queue (`pg_advisory_lock` under \
         `lock_timeout`), a session per client."
            .to_owned(),
    );
    t
}

fn repeated_table(groups: &[(&str, Vec<&Row>)], rt: &str, p: &Params) -> Table {
    let title = format!(
        "Repeated measurements and the servers' own tools ({rt} runtime, {} repeats)",
        p.repeats.max(1)
    );
    let header = [
        "group",
        "implementation",
        "p50 (median)",
        "p99 (median)",
        "per second (median)",
        "ratio: median [range] over repeats",
    ];
    let mut t = line_table(title, &header, groups, Scenario::Repeated, |r| {
        let rate = match &r.error {
            Some(e) => format!("**failed**: {}", e.replace('|', "/")),
            None => fmt_rate(r.per_sec),
        };
        vec![fmt_fine(r.p50), fmt_fine(r.p99), rate, ratio_cell(r)]
    });
    t.note(
        "Each repeat measures every implementation of the group in alternating rounds (the \
         pinned PostgreSQL groups on new connections, so on new server processes); figures \
         are medians over the repeats, ratios are the median and range of the per-repeat \
         ratios. The pinned groups run the bench and PostgreSQL on different CPUs unless \
         `--no-pin` (or one CPU) says otherwise. The tower-layer figures are times per request \
         (a round's mean, median over the rounds), ratios the median of per-round ratios. The \
         redis-benchmark row is one run of the server's own tool, against our cycles on the \
         same number of tasks."
            .to_owned(),
    );
    t
}

/// The ratio cell of a row: its median and range, and what it is a ratio of.
pub(super) fn ratio_cell(r: &Row) -> String {
    r.ratio
        .as_ref()
        .map_or_else(|| "–".into(), |(s, of)| format!("{} {of}", s.times()))
}

fn semaphore_table(groups: &[(&str, Vec<&Row>)], rt: &str) -> Table {
    let title =
        format!("Semaphores: uncontended permit + release against the lock cycle ({rt} runtime)");
    let header = [
        "backend",
        "implementation",
        "p50",
        "p99",
        "cycles/s",
        "p50 vs lock",
        "locks left",
    ];
    let mut t = line_table(title, &header, groups, Scenario::Semaphore, |r| {
        vec![
            fmt_ms(r.p50),
            fmt_ms(r.p99),
            fmt_rate(r.per_sec),
            ratio_cell(r),
            left(r.error.as_deref(), r.leftovers),
        ]
    });
    t.note(format!(
        "One client takes one permit of a semaphore of {PERMITS} permits per key (`try_acquire`) \
         and releases it; the lock row is the same backend's lock cycle, the two taking turns \
         in the same rounds, each on backends (connections) of its own. *locks left*: permits \
         (or locks) the scenario added on the servers, counted as in the cycle table."
    ));
    t
}

/// Milliseconds, median and range over repeats.
fn fmt_spread_ms(s: Option<&Spread>) -> String {
    match s {
        None => "–".into(),
        Some(s) if s.min == s.max => format!("{:.1} ms", s.median),
        Some(s) => format!("{:.1} ms [{:.1}–{:.1}]", s.median, s.min, s.max),
    }
}

fn failover_table(groups: &[(&str, Vec<&Row>)], rt: &str) -> Table {
    let repeats = groups
        .iter()
        .flat_map(|(_, v)| v.iter())
        .filter(|r| r.scenario == Scenario::Failover)
        .map(|r| r.cycles)
        .max()
        .unwrap_or(0);
    let title = format!(
        "Leader failover: leader crash, and resign(), to a new leader; TTL {FAILOVER_TTL:?} \
         ({rt} runtime, {repeats} repeat(s))"
    );
    let header = [
        "backend",
        "implementation",
        "crash → new leader: median [range]",
        "resign() → new leader: median [range]",
        "leaders left",
    ];
    let mut t = line_table(title, &header, groups, Scenario::Failover, |r| {
        vec![
            fmt_spread_ms(r.failover.as_ref()),
            fmt_spread_ms(r.resign.as_ref()),
            left(r.error.as_deref(), r.leftovers),
        ]
    });
    t.note(
        "Crash: the leader runs in a process of its own that is killed (SIGKILL), so nothing \
         resigns and its connections close: Redis waits for the leadership key's TTL, etcd for \
         the session lease's, PostgreSQL for the session's end, the file backend for the \
         descriptor's close. On the memory backend, which lives in one process, the leader's \
         thread and runtime stop with the leadership forgotten (nothing renews or resigns). \
         Each time runs to the next candidate's `campaign()` returning, that candidate having \
         campaigned for a moment already; the resign figure starts when `resign()` returned \
         (0 when the campaign returned first). *leaders left*: leaders once the last \
         candidate resigned."
            .to_owned(),
    );
    t
}

/// The tables of one runtime (those with rows).
pub(super) fn tables(rows: &[Row], rt: &str, p: &Params) -> Vec<Table> {
    let groups = by_group(rows, rt);
    let has = |s: Scenario| {
        groups
            .iter()
            .any(|(_, v)| v.iter().any(|r| r.scenario == s))
    };
    let mut v = Vec::new();
    if has(Scenario::Cycle) || has(Scenario::Setup) {
        v.push(cycle_table(&groups, rt));
    }
    if has(Scenario::Throughput) {
        v.push(throughput_table(&groups, rt, p));
    }
    if has(Scenario::Contention) {
        v.push(contention_table(&groups, rt, p));
    }
    if has(Scenario::Semaphore) {
        v.push(semaphore_table(&groups, rt));
    }
    if has(Scenario::Failover) {
        v.push(failover_table(&groups, rt));
    }
    if has(Scenario::Handoff) {
        v.push(super::handoff::table(&groups, rt, p));
    }
    if has(Scenario::Repeated) {
        v.push(repeated_table(&groups, rt, p));
    }
    v
}

/// Every row as CSV.
pub(super) fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "runtime,group,scenario,implementation,kind,concurrency,cycles,p50_ms,p99_ms,per_sec,\
         grants,handoff_p50_ms,handoff_p99_ms,longest_wait_ms,straight_back_pct,leftovers,ratio_median,\
         ratio_min,ratio_max,ratio_of,failover_median_ms,failover_min_ms,failover_max_ms,\
         resign_median_ms,resign_min_ms,resign_max_ms,error\n",
    );
    let d = |x: Option<Duration>| {
        x.map(|d| format!("{:.4}", d.as_secs_f64() * 1e3))
            .unwrap_or_default()
    };
    let f = |x: Option<f64>, digits: usize| x.map(|x| format!("{x:.digits$}")).unwrap_or_default();
    for r in rows {
        let spread = r.ratio.as_ref().map(|(s, _)| s);
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            csv_text(&r.runtime),
            csv_text(&r.group),
            r.scenario.as_str(),
            csv_text(&r.label),
            r.kind,
            r.concurrency,
            r.cycles,
            d(r.p50),
            d(r.p99),
            f(r.per_sec, 1),
            r.grants.map(|x| x.to_string()).unwrap_or_default(),
            d(r.handoff_p50),
            d(r.handoff_p99),
            d(r.longest_wait),
            f(r.straight_back, 1),
            r.leftovers.map(|x| x.to_string()).unwrap_or_default(),
            f(spread.map(|s| s.median), 4),
            f(spread.map(|s| s.min), 4),
            f(spread.map(|s| s.max), 4),
            csv_text(r.ratio.as_ref().map_or("", |(_, of)| of.as_str())),
            f(r.failover.map(|s| s.median), 3),
            f(r.failover.map(|s| s.min), 3),
            f(r.failover.map(|s| s.max), 3),
            f(r.resign.map(|s| s.median), 3),
            f(r.resign.map(|s| s.min), 3),
            f(r.resign.map(|s| s.max), 3),
            csv_text(r.error.as_deref().unwrap_or("")),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::model::test_row;

    #[test]
    fn ratios_are_against_raw_and_the_fastest_peer() {
        let rows = vec![
            test_row("ours", "ours", 6),
            test_row("raw", "raw", 4),
            test_row("slow peer", "peer", 12),
            test_row("fast peer", "peer", 3),
        ];
        let p = Params::quick(Vec::new(), false);
        let t = tables(&rows, "rt", &p);
        let ours = &t[0].rows[0];
        assert_eq!(ours[5], "1.50×", "{ours:?}");
        assert_eq!(ours[6], "2.00×", "{ours:?}");
        let md = t[0].markdown();
        assert!(md.contains("| g | fast peer *(peer)* |"), "{md}");
    }

    #[test]
    fn throughput_ratios_are_taken_within_rounds() {
        let tput = |label: &str, kind: &'static str, rates: &[f64]| Row {
            scenario: Scenario::Throughput,
            concurrency: 4,
            cycles: 100,
            per_sec: Some(rates.iter().sum::<f64>() / rates.len() as f64),
            round_rates: rates.to_vec(),
            ..test_row(label, kind, 1)
        };
        // The load halves in round 2: ours is 1.2× raw in both rounds although its mean
        // rate is not 1.2× raw's mean; a peer that failed after one round sets no baseline
        // for the rounds it missed.
        let mut failed_peer = tput("failed peer", "peer", &[300.0]);
        failed_peer.error = Some("boom".into());
        let rows = vec![
            tput("ours", "ours", &[120.0, 30.0, 60.0]),
            tput("raw", "raw", &[100.0, 25.0, 50.0]),
            tput("peer", "peer", &[60.0, 30.0, 40.0]),
            failed_peer,
        ];
        let p = Params::quick(Vec::new(), false);
        let t = tables(&rows, "rt", &p);
        let ours = &t[0].rows[0];
        assert_eq!(ours[4], "1.200×", "{ours:?}");
        assert_eq!(ours[5], "1.500× [1.00–2.00×]", "{ours:?}");
        let raw = &t[0].rows[1];
        assert_eq!(raw[4], "1.000×", "{raw:?}");
        assert_eq!(t[0].rows[3][4], "–", "a failed row has no ratio");
        assert_eq!(ours[6], "–", "no CPU time measured");
        assert!(
            t[0].title.contains("2 rounds taking turns"),
            "{}",
            t[0].title
        );
    }

    #[test]
    fn failover_rows_make_their_table_and_fail_without_a_figure() {
        let mut times = [1900.0, 2100.0, 2000.0];
        let r = Row {
            scenario: Scenario::Failover,
            failover: Some(Spread::of(&mut times)),
            resign: Some(Spread::of(&mut [5.0])),
            cycles: 3,
            ..test_row("leasehold RedisBackend: election", "ours", 1)
        };
        let p = Params::quick(Vec::new(), false);
        let t = tables(std::slice::from_ref(&r), "rt", &p);
        let md = t[0].markdown();
        assert!(md.contains("3 repeat(s)"), "{md}");
        assert!(
            md.contains("| 2000.0 ms [1900.0–2100.0] | 5.0 ms | 0 |"),
            "{md}"
        );
        assert!(crate::perf::model::problems(std::slice::from_ref(&r)).is_empty());
        let unmeasured = Row {
            failover: None,
            ..r
        };
        let problems = crate::perf::model::problems(&[unmeasured]);
        assert!(problems[0].contains("no failover measured"), "{problems:?}");
        assert!(
            csv(&[])
                .lines()
                .next()
                .unwrap_or_default()
                .contains("failover_median_ms")
        );
    }

    #[test]
    fn csv_quotes_text_fields() {
        let r = Row {
            error: Some("said \"no\", twice".into()),
            ..test_row("a, b", "peer", 1)
        };
        let text = csv(&[r]);
        let line = text.lines().nth(1).unwrap_or_default();
        assert!(line.contains("\"a, b\""), "{line}");
        assert!(line.ends_with("\"said \"\"no\"\", twice\""), "{line}");
    }
}
