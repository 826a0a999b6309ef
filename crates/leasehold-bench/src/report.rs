//! Markdown tables and an SVG chart of one run.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

/// One table of a report.
#[derive(Debug, Default)]
pub(crate) struct Table {
    pub(crate) title: String,
    pub(crate) header: Vec<String>,
    pub(crate) rows: Vec<Vec<String>>,
    pub(crate) notes: Vec<String>,
}

impl Table {
    pub(crate) fn new(title: &str, header: &[&str]) -> Self {
        Self {
            title: title.to_owned(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            ..Self::default()
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    pub(crate) fn markdown(&self) -> String {
        let mut s = format!("### {}\n\n| {} |\n|", self.title, self.header.join(" | "));
        for _ in &self.header {
            s.push_str("---|");
        }
        s.push('\n');
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        for n in &self.notes {
            let _ = write!(s, "\n{n}\n");
        }
        s
    }
}

/// A bar for the chart: label and value in milliseconds.
#[derive(Debug, Clone)]
pub(crate) struct Bar {
    pub(crate) label: String,
    pub(crate) ms: f64,
}

/// Draws horizontal bars (p50 latency per implementation) to an SVG file.
pub(crate) fn chart(
    path: &Path,
    title: &str,
    bars: &[Bar],
) -> Result<(), Box<dyn std::error::Error>> {
    let height = 80 + 28 * bars.len() as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = bars.iter().map(|b| b.ms).fold(0.0_f64, f64::max) * 1.15 + 1e-6;
    let n = bars.len() as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(330)
        .build_cartesian_2d(0.0..max, (0..n).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("p50 latency (ms)")
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => bars
                .get(usize::try_from(*i).unwrap_or(usize::MAX))
                .map(|b| b.label.clone())
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let i = i32::try_from(i).unwrap_or(0);
        let mut bar = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (b.ms, SegmentValue::Exact(i + 1)),
            ],
            BLUE.mix(0.6).filled(),
        );
        bar.set_margin(4, 4, 0, 0);
        bar
    }))?;
    root.present()?;
    Ok(())
}
