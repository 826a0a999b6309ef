//! The SVG charts of `leasehold-bench perf`, drawn from the same rows as its tables
//! ([`output`](super::output)): bars per row for latencies, lines for throughput against C.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::{BLUE, Color as _, GREEN, RED, RGBAColor};

use super::failover::TTL as FAILOVER_TTL;
use super::model::{Row, Scenario};
use super::semaphore::PERMITS;
use crate::report::charts::{self, Series};
use crate::stats::Spread;

fn to_ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median of a spread of milliseconds, as a duration; none for zero (no bar on a log
/// axis).
fn median_duration(s: &Spread) -> Option<Duration> {
    (s.median > 0.0).then(|| Duration::from_secs_f64(s.median / 1e3))
}

fn chart_label(r: &Row) -> String {
    format!("{}: {}", r.group, r.label)
}

/// A figure of a row, drawn as one series of bars.
type Figure = (&'static str, RGBAColor, fn(&Row) -> Option<Duration>);

/// Bars of `figures` for `rows`, one band per row, to `<out>/perf-<name>-<rt>.svg`; false
/// (nothing written) without rows.
fn bar_chart(
    out: &Path,
    name: &str,
    rt: &str,
    title: &str,
    rows: &[&Row],
    figures: &[Figure],
) -> Result<bool, String> {
    if rows.is_empty() {
        return Ok(false);
    }
    let labels: Vec<String> = rows.iter().map(|r| chart_label(r)).collect();
    let series: Vec<Series<'_>> = figures
        .iter()
        .map(|&(name, color, figure)| Series {
            name,
            color,
            values: rows.iter().map(|r| figure(r).map(to_ms)).collect(),
        })
        .collect();
    let title = format!("{title}, {rt} runtime (log scale)");
    let path = out.join(format!("perf-{name}-{rt}.svg"));
    charts::hbars(&path, &title, "milliseconds", &labels, &series).map_err(|e| e.to_string())?;
    Ok(true)
}

/// Draws the charts of each runtime (cycle latency, contention, throughput); returns how many
/// files it wrote.
pub(super) fn charts(out: &Path, rows: &[Row], runtimes: &[&str]) -> Result<usize, String> {
    let mut n = 0;
    for rt in runtimes {
        let ok = |s: Scenario| {
            rows.iter()
                .filter(move |r| r.runtime == *rt && r.error.is_none() && r.scenario == s)
        };
        let cycle: Vec<&Row> = ok(Scenario::Cycle).filter(|r| r.p50.is_some()).collect();
        let latency: [Figure; 2] = [
            ("p50", BLUE.mix(0.7), |r| r.p50),
            ("p99", RED.mix(0.5), |r| r.p99),
        ];
        let title = "Uncontended acquire + release";
        n += usize::from(bar_chart(out, "latency", rt, title, &cycle, &latency)?);
        let sem: Vec<&Row> = ok(Scenario::Semaphore)
            .filter(|r| r.p50.is_some())
            .collect();
        let title = format!("Uncontended permit ({PERMITS} per key) and lock cycle");
        n += usize::from(bar_chart(out, "semaphore", rt, &title, &sem, &latency)?);
        let elected: Vec<&Row> = ok(Scenario::Failover).collect();
        let failover: [Figure; 2] = [
            ("crash → new leader (median)", RED.mix(0.5), |r| {
                r.failover.and_then(|s| median_duration(&s))
            }),
            ("resign() → new leader (median)", GREEN.mix(0.7), |r| {
                r.resign.and_then(|s| median_duration(&s))
            }),
        ];
        let title = format!("Leader failover, TTL {FAILOVER_TTL:?}");
        n += usize::from(bar_chart(out, "failover", rt, &title, &elected, &failover)?);
        let cont: Vec<&Row> = ok(Scenario::Contention).collect();
        let waits: [Figure; 2] = [
            ("handoff p50", GREEN.mix(0.7), |r| r.handoff_p50),
            ("longest wait", RED.mix(0.5), |r| r.longest_wait),
        ];
        let title = "One contended key: handoff and longest wait";
        n += usize::from(bar_chart(out, "handoff", rt, title, &cont, &waits)?);
        let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for r in ok(Scenario::Throughput) {
            let Some(rate) = r.per_sec else { continue };
            let (name, point) = (chart_label(r), (r.concurrency as f64, rate));
            match lines.iter_mut().find(|(l, _)| *l == name) {
                Some((_, pts)) => pts.push(point),
                None => lines.push((name, vec![point])),
            }
        }
        if !lines.is_empty() {
            let title = format!("Throughput on distinct keys against concurrency, {rt} runtime");
            let path = out.join(format!("perf-throughput-{rt}.svg"));
            let axes = charts::Axes {
                x: "concurrent tasks (C)",
                y: "cycles/s (log scale)",
            };
            charts::lines(&path, &title, &axes, &lines).map_err(|e| e.to_string())?;
            n += 1;
        }
    }
    Ok(n)
}
