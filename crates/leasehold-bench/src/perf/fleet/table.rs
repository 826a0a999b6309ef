//! The fleet group's table (one per runtime), its CSV lines and its charts of cost against N.

use std::fmt::Write as _;
use std::path::Path;

use super::child::{ACQUIRE_BUDGET, IN_FLIGHT, REDLOCK_NODE_TIMEOUT};
use super::raw::{CHUNK, SLICES};
use super::{
    COMPARED, COMPARED_N, FLEET_TTL, FleetRow, HEAP_KEPT, HEAP_KEPT_TUNABLE, Measured, compared,
};
use crate::report::charts::{self, Axes};
use crate::report::{Table, csv_text};
use crate::stats::{Spread, ms};

fn per_period(x: Option<f64>) -> String {
    x.map_or_else(|| "–".into(), |x| format!("{x:.0}"))
}

fn cells(m: &Measured) -> Vec<String> {
    let sessions = match (m.pg_sessions, m.pg_bound) {
        (Some(s), Some(b)) => format!("{s} (bound {b})"),
        _ => "–".into(),
    };
    vec![
        ms(m.acquire),
        m.nodes.to_string(),
        per_period(m.scripts_per_period),
        per_period(m.requests_per_period),
        m.connections.to_string(),
        sessions,
        format!("{:.2} %", m.cpu_pct),
        format!("{:.0} B", m.rss_per_lease),
        ms(m.release),
        format!("{:.0} B", m.release_peak_per_lease),
        m.release_errors.to_string(),
        m.left_at_once.to_string(),
        m.left_later.to_string(),
        m.lost.to_string(),
    ]
}

/// The fleet table of runtime `rt` (`None` if the group did not run on it).
pub(in crate::perf) fn table(rows: &[FleetRow], rt: &str) -> Option<Table> {
    let mine: Vec<&FleetRow> = rows
        .iter()
        .filter(|r| r.runtime == rt && r.round.is_none())
        .collect();
    let hold = mine
        .iter()
        .find_map(|r| r.result.as_ref().ok().map(|m| m.hold))?;
    let mut t = Table::new(
        &format!("Fleet: N leases held by one process, {rt} runtime"),
        &[
            "backend",
            "N",
            "acquire all",
            "nodes",
            "script calls / renewal period / node",
            "requests / renewal period / node",
            "server connections",
            "PostgreSQL sessions",
            "client CPU (% of a core)",
            "RSS / lease",
            "release all (one burst)",
            "burst's RSS peak / lease",
            "release errors",
            "locks left at once",
            "locks left after settle",
            "leases lost",
        ],
    );
    for r in &mine {
        let mut row = vec![r.backend.clone(), r.n.to_string()];
        match &r.result {
            Ok(m) => row.extend(cells(m)),
            Err(e) => row.push(format!("**failed**: {}", e.replace('|', "/"))),
        }
        t.row(row);
    }
    t.note(format!(
        "TTL {FLEET_TTL:?}, renewal period TTL / 3. Acquire all: {IN_FLIGHT} acquisitions in \
         flight, each an `acquire` with a {ACQUIRE_BUDGET:?} budget (a transient fault is \
         retried); Redlock with a per-node timeout of {REDLOCK_NODE_TIMEOUT:?}. Counters over a hold window of {}, the \
         busiest node's figure. Script calls: the top-level `eval`/`evalsha`/`fcall` (and `_ro`) \
         calls of Redis `INFO commandstats` (a script renewing many leases counts once; the \
         commands it runs inside are left out). Requests: Redis `total_reads_processed` (round trips: \
         commands pipelined together arrive in one read; the probe's own `INFO` calls included), PostgreSQL `pg_stat_database.xact_commit` of the \
         database (the probe's own queries included), etcd `grpc_server_msg_received_total` of \
         `/metrics` (every gRPC message, keep-alives included). Server connections: this \
         process's established TCP connections to the servers (`/proc`), the probe's own taken \
         out; PostgreSQL sessions: the most `pg_stat_activity` rows with the backend's \
         `application_name` seen while holding. Client CPU: `getrusage` user + system over the \
         hold window, less the CPU time of the probe's own connection counts (`/proc` reads, \
         measured with the thread's `getrusage` around each); RSS / lease: resident memory growth from before the N acquisitions to \
         the end of the hold, over N. Burst's RSS peak / lease: the high-water mark of resident \
         memory during the burst release (`VmHWM`, reset before it through \
         `/proc/self/clear_refs`) above the resident memory before it, over N. Each (backend, N) runs in a process of its own. Locks \
         left after settle: counted with the backend still connected (a TTL backend's keys \
         expire by then anyway; the figure shows what a live session still carries).",
        ms(hold)
    ));
    Some(t)
}

/// The compared rows of runtime `rt` (`None` if none ran on it): each of ours at
/// [`COMPARED_N`] against its raw floor and with its heap kept, as medians over the rounds and
/// ratios of each round's figures.
pub(in crate::perf) fn comparison(rows: &[FleetRow], rt: &str) -> Option<Table> {
    let mine: Vec<&FleetRow> = rows
        .iter()
        .filter(|r| r.runtime == rt && r.round.is_some())
        .collect();
    if mine.is_empty() {
        return None;
    }
    let rounds = mine.iter().filter_map(|r| r.round).max().unwrap_or(0) + 1;
    let mut t = Table::new(
        &format!(
            "Fleet at N = {COMPARED_N}: ours against the raw floor and with the heap kept, \
             {rounds} rounds taking turns, {rt} runtime"
        ),
        &[
            "backend",
            "rounds measured",
            "client CPU (% of a core), median [range]",
            "CPU / ours, per round",
            "RSS / lease, median",
            "RSS / ours, per round",
        ],
    );
    // Round → figures of one backend name.
    let of = |name: &str| -> Vec<(usize, &Measured)> {
        mine.iter()
            .filter(|r| r.backend == name)
            .filter_map(|r| Some((r.round?, r.result.as_ref().ok()?)))
            .collect()
    };
    for base in COMPARED {
        let ours = of(base);
        for name in compared(base) {
            let runs = of(&name);
            if runs.is_empty() {
                t.row(vec![name, "**failed** in every round".to_owned()]);
                continue;
            }
            let spread = |f: fn(&Measured) -> f64| {
                Spread::of(&mut runs.iter().map(|(_, m)| f(m)).collect::<Vec<_>>())
            };
            let ratio = |f: fn(&Measured) -> f64| {
                if name == base {
                    return "–".to_owned();
                }
                let mut per_round: Vec<f64> = runs
                    .iter()
                    .filter_map(|(round, m)| {
                        let o = ours.iter().find(|(r, _)| r == round)?.1;
                        (f(o) > 0.0).then(|| f(m) / f(o))
                    })
                    .collect();
                if per_round.is_empty() {
                    return "–".to_owned();
                }
                Spread::of(&mut per_round).times()
            };
            let cpu = spread(|m| m.cpu_pct);
            t.row(vec![
                name.clone(),
                runs.len().to_string(),
                format!("{:.2} % [{:.2}–{:.2}]", cpu.median, cpu.min, cpu.max),
                ratio(|m| m.cpu_pct),
                format!("{:.0} B", spread(|m| m.rss_per_lease).median),
                ratio(|m| m.rss_per_lease),
            ]);
        }
    }
    t.note(format!(
        "Each round measures, one after another, every backend here (in a process of its own, \
         as in the table above), its raw floor and itself with the heap kept, the order \
         turned by one each round: the host's load drifts over minutes, so a ratio of two \
         figures of one round is the figure to read. Raw rows (`redis-raw`, \
         `redlock5-raw`): the same leases renewed by a bare redis-rs client with no lease \
         bookkeeping (`SET NX PX` to take them; every renewal period, {SLICES} slices of \
         script calls of at most {CHUNK} keys, every node at once, each call under a timer; a \
         compare-and-delete script of the same shape to release): what the same traffic costs \
         any client here, so that the gap to ours is what our leases cost. `{HEAP_KEPT}` rows: \
         the same backend in a process started with `GLIBC_TUNABLES={HEAP_KEPT_TUNABLE}`, so \
         that glibc's malloc keeps the memory each renewal batch frees instead of handing the \
         top of its heaps back to the system for the next batch to fault in again: the CPU gap \
         to ours is what that churn costs, the RSS gap what keeping the memory costs."
    ));
    Some(t)
}

/// The CSV of the fleet rows.
pub(in crate::perf) fn csv(rows: &[FleetRow]) -> String {
    let mut s = String::from(
        "runtime,backend,n,round,error,acquire_ms,nodes,scripts_per_period,requests_per_period,\
         connections,pg_sessions,cpu_pct,rss_per_lease,release_ms,release_peak_per_lease,release_errors,left_at_once,\
         left_later,lost\n",
    );
    for r in rows {
        let round = r.round.map(|x| (x + 1).to_string()).unwrap_or_default();
        let head = format!(
            "{},{},{},{round}",
            csv_text(&r.runtime),
            csv_text(&r.backend),
            r.n
        );
        match &r.result {
            Err(e) => {
                let _ = writeln!(s, "{head},{}{}", csv_text(e), ",".repeat(14));
            }
            Ok(m) => {
                let o = |x: Option<f64>| x.map(|x| format!("{x:.1}")).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "{head},,{:.3},{},{},{},{},{},{:.3},{:.0},{:.3},{:.0},{},{},{},{}",
                    m.acquire.as_secs_f64() * 1e3,
                    m.nodes,
                    o(m.scripts_per_period),
                    o(m.requests_per_period),
                    m.connections,
                    m.pg_sessions.map(|x| x.to_string()).unwrap_or_default(),
                    m.cpu_pct,
                    m.rss_per_lease,
                    m.release.as_secs_f64() * 1e3,
                    m.release_peak_per_lease,
                    m.release_errors,
                    m.left_at_once,
                    m.left_later,
                    m.lost
                );
            }
        }
    }
    s
}

/// One line per backend: `figure` of each N it measured (positive figures only: log axes).
fn lines_of(
    rows: &[&FleetRow],
    figure: impl Fn(&Measured) -> Option<f64>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let Some(y) = r
            .result
            .as_ref()
            .ok()
            .and_then(&figure)
            .filter(|y| *y > 0.0)
        else {
            continue;
        };
        let point = (r.n as f64, y);
        match lines.iter_mut().find(|(l, _)| *l == r.backend) {
            Some((_, pts)) => pts.push(point),
            None => lines.push((r.backend.clone(), vec![point])),
        }
    }
    lines
}

/// The charts of cost against N of runtime `rt`: server requests per renewal period, and
/// client CPU; returns how many files it wrote.
pub(in crate::perf) fn chart(out: &Path, rows: &[FleetRow], rt: &str) -> Result<usize, String> {
    let mine: Vec<&FleetRow> = rows
        .iter()
        .filter(|r| r.runtime == rt && r.round.is_none())
        .collect();
    type Figure = fn(&Measured) -> Option<f64>;
    let figures: [(&str, &str, &str, Figure); 2] = [
        (
            "requests",
            "Server requests per renewal period (busiest node) against N",
            "requests / renewal period (log scale)",
            |m| m.requests_per_period,
        ),
        (
            "cpu",
            "Client CPU while holding N leases against N",
            "% of one core (log scale)",
            |m| Some(m.cpu_pct),
        ),
    ];
    let mut n = 0;
    for (name, title, y, figure) in figures {
        let lines = lines_of(&mine, figure);
        if lines.is_empty() {
            continue;
        }
        let path = out.join(format!("perf-fleet-{name}-{rt}.svg"));
        let axes = Axes {
            x: "leases held (N, log scale)",
            y,
        };
        charts::lines(&path, &format!("{title}, {rt} runtime"), &axes, &lines)
            .map_err(|e| e.to_string())?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(backend: &str, round: Option<usize>, cpu_pct: f64, rss: f64) -> FleetRow {
        FleetRow {
            runtime: "rt".into(),
            backend: backend.into(),
            n: COMPARED_N,
            round,
            result: Ok(Measured {
                cpu_pct,
                rss_per_lease: rss,
                hold: std::time::Duration::from_secs(10),
                ..Measured::default()
            }),
        }
    }

    /// The comparison reads each ratio within a round (the drift between rounds cancels), the
    /// main table and charts leave the compared rows out, and a row that failed in every round
    /// says so.
    #[test]
    fn compared_rows_are_ratios_within_each_round() {
        let mut rows = vec![row("redis", None, 1.0, 700.0)];
        // Round 1 on an idle host, round 2 on a loaded one: ours doubles, so does its floor.
        for (round, load) in [(0, 1.0), (1, 2.0)] {
            rows.push(row("redis", Some(round), 2.0 * load, 800.0));
            rows.push(row("redis-raw", Some(round), 1.0 * load, 600.0));
            rows.push(row("redis+heap-kept", Some(round), 1.5 * load, 880.0));
        }
        let md = comparison(&rows, "rt").unwrap().markdown();
        let line = |name: &str| {
            md.lines()
                .find(|l| l.starts_with(&format!("| {name} |")))
                .unwrap_or_else(|| panic!("no row {name} in {md}"))
                .to_owned()
        };
        assert!(line("redis-raw").contains("| 0.500× |"), "{md}");
        assert!(line("redis-raw").contains("| 0.750× |"), "{md}");
        assert!(line("redis+heap-kept").contains("| 0.750× |"), "{md}");
        assert!(line("redis+heap-kept").contains("| 1.100× |"), "{md}");
        assert!(line("redis").contains("3.00 % [2.00–4.00]"), "{md}");
        assert!(line("redlock5").contains("failed"), "{md}");
        assert!(md.contains("2 rounds"), "{md}");

        let main = table(&rows, "rt").unwrap().markdown();
        assert_eq!(main.matches("| redis |").count(), 1, "{main}");
        assert!(!main.contains("heap-kept") && !main.contains("redis-raw"));
        assert!(comparison(&rows[..1], "rt").is_none());
    }
}
