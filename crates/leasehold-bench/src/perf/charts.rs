//! The SVG charts of `leasehold-bench perf`, one set per runtime: cycle latency per
//! implementation, throughput against concurrency, handoff and longest wait under contention.

use std::path::Path;

use plotters::prelude::*;

use super::Row;

type DrawResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Row height of the bar charts, in pixels.
const ROW_PX: u32 = 26;

/// Draws every chart; returns how many files it wrote.
pub(super) fn draw(out: &Path, rows: &[Row], runtimes: &[&str]) -> DrawResult<usize> {
    let mut n = 0;
    for rt in runtimes {
        let mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.runtime == *rt && r.error.is_none())
            .collect();
        let cycle: Vec<&Row> = mine
            .iter()
            .copied()
            .filter(|r| r.scenario == "cycle" && r.p50.is_some())
            .collect();
        if !cycle.is_empty() {
            let labels: Vec<String> = cycle.iter().map(|r| label(r)).collect();
            let p50: Vec<Option<f64>> = cycle.iter().map(|r| r.p50.map(to_ms)).collect();
            let p99: Vec<Option<f64>> = cycle.iter().map(|r| r.p99.map(to_ms)).collect();
            hbars(
                &out.join(format!("perf-latency-{rt}.svg")),
                &format!("Uncontended acquire + release, {rt} runtime (log scale)"),
                "milliseconds",
                &labels,
                &[("p50", BLUE.mix(0.7)), ("p99", RED.mix(0.5))],
                &[p50, p99],
            )?;
            n += 1;
        }
        let cont: Vec<&Row> = mine
            .iter()
            .copied()
            .filter(|r| r.scenario == "contention")
            .collect();
        if !cont.is_empty() {
            let labels: Vec<String> = cont.iter().map(|r| label(r)).collect();
            let handoff: Vec<Option<f64>> = cont.iter().map(|r| r.handoff_p50.map(to_ms)).collect();
            let longest: Vec<Option<f64>> =
                cont.iter().map(|r| r.longest_wait.map(to_ms)).collect();
            hbars(
                &out.join(format!("perf-handoff-{rt}.svg")),
                &format!("One contended key: handoff and longest wait, {rt} runtime (log scale)"),
                "milliseconds",
                &labels,
                &[
                    ("handoff p50", GREEN.mix(0.7)),
                    ("longest wait", RED.mix(0.5)),
                ],
                &[handoff, longest],
            )?;
            n += 1;
        }
        let tput: Vec<&Row> = mine
            .iter()
            .copied()
            .filter(|r| r.scenario == "throughput" && r.per_sec.is_some())
            .collect();
        if !tput.is_empty() {
            throughput(
                &out.join(format!("perf-throughput-{rt}.svg")),
                &format!("Throughput on distinct keys against concurrency, {rt} runtime"),
                &tput,
            )?;
            n += 1;
        }
    }
    Ok(n)
}

fn to_ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn label(r: &Row) -> String {
    format!("{}: {}", r.group, r.label)
}

/// Horizontal bars on a log axis, one band per label, one bar per series inside the band.
fn hbars(
    path: &Path,
    title: &str,
    x_desc: &str,
    labels: &[String],
    series: &[(&str, RGBAColor)],
    values: &[Vec<Option<f64>>],
) -> DrawResult<()> {
    let rows = u32::try_from(labels.len())?;
    let root = SVGBackend::new(path, (1100, 110 + ROW_PX * rows)).into_drawing_area();
    root.fill(&WHITE)?;
    let all = values.iter().flatten().flatten().copied();
    let (lo, hi) = all.fold((f64::MAX, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo = if lo.is_finite() && lo > 0.0 {
        lo / 2.0
    } else {
        0.001
    };
    let hi = (hi * 2.0).max(lo * 10.0);
    let n = i32::try_from(labels.len())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(560)
        .build_cartesian_2d((lo..hi).log_scale(), (0..n).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(x_desc)
        .y_labels(labels.len())
        .y_label_style(("sans-serif", 12))
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => usize::try_from(*i)
                .ok()
                .and_then(|i| labels.get(i))
                .cloned()
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    let k = u32::try_from(series.len().max(1))?;
    let band = (ROW_PX - 6) / k;
    for (s, ((name, color), vals)) in series.iter().zip(values).enumerate() {
        let s = u32::try_from(s)?;
        let color = *color;
        chart
            .draw_series(vals.iter().enumerate().filter_map(|(i, v)| {
                let i = i32::try_from(i).ok()?;
                let v = (*v)?;
                let mut bar = Rectangle::new(
                    [
                        (lo, SegmentValue::Exact(i)),
                        (v, SegmentValue::Exact(i + 1)),
                    ],
                    color.filled(),
                );
                let top = 3 + s * band;
                let bottom = ROW_PX.saturating_sub(top + band);
                bar.set_margin(top, bottom, 0, 0);
                Some(bar)
            }))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Lines of cycles/s against task count, one per implementation, on log-log axes.
fn throughput(path: &Path, title: &str, rows: &[&Row]) -> DrawResult<()> {
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let (Some(rate), name) = (r.per_sec, label(r)) else {
            continue;
        };
        let point = (r.concurrency as f64, rate);
        match lines.iter_mut().find(|(l, _)| *l == name) {
            Some((_, pts)) => pts.push(point),
            None => lines.push((name, vec![point])),
        }
    }
    let max_c = rows.iter().map(|r| r.concurrency).max().unwrap_or(1) as f64;
    let (lo, hi) = rows
        .iter()
        .filter_map(|r| r.per_sec)
        .fold((f64::MAX, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo = (lo / 2.0).max(0.1);
    let hi = (hi * 2.0).max(lo * 10.0);
    let legend_rows = u32::try_from(lines.len())?;
    let root = SVGBackend::new(path, (1100, 520 + 18 * legend_rows)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot, legend) = root.split_vertically(500);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d((0.8..max_c * 1.25).log_scale(), (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("concurrent tasks (C)")
        .y_desc("cycles/s (log scale)")
        .draw()?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?;
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        let y = 5 + 18 * i32::try_from(i)?;
        legend.draw(&Rectangle::new([(20, y + 3), (40, y + 11)], color.filled()))?;
        legend.draw(&Text::new(
            name.clone(),
            (48, y),
            ("sans-serif", 13).into_font(),
        ))?;
    }
    root.present()?;
    Ok(())
}
