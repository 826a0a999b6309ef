//! The SVG charts: horizontal bars on a log axis (latencies per implementation) and lines on
//! log-log axes (a rate against concurrency).

use std::path::Path;

use plotters::prelude::*;

type DrawResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Row height of the bar charts, in pixels.
const ROW_PX: u32 = 26;

/// One series of bars: its name, its colour, one value per label (none: no bar).
pub(crate) struct Series<'a> {
    pub(crate) name: &'a str,
    pub(crate) color: RGBAColor,
    pub(crate) values: Vec<Option<f64>>,
}

/// Horizontal bars on a log axis, one band per label, one bar per series inside the band.
pub(crate) fn hbars(
    path: &Path,
    title: &str,
    x_desc: &str,
    labels: &[String],
    series: &[Series<'_>],
) -> DrawResult<()> {
    let rows = u32::try_from(labels.len())?;
    let root = SVGBackend::new(path, (1100, 110 + ROW_PX * rows)).into_drawing_area();
    root.fill(&WHITE)?;
    let all = series
        .iter()
        .flat_map(|s| s.values.iter().flatten().copied());
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
    for (s, one) in series.iter().enumerate() {
        let s = u32::try_from(s)?;
        let color = one.color;
        chart
            .draw_series(one.values.iter().enumerate().filter_map(|(i, v)| {
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
            .label(one.name)
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

/// The axis descriptions of a [`lines`] chart.
pub(crate) struct Axes<'a> {
    pub(crate) x: &'a str,
    pub(crate) y: &'a str,
}

/// Lines of `(x, y)` points, one per name, on log-log axes described by `axes`, with the
/// legend below the plot.
pub(crate) fn lines(
    path: &Path,
    title: &str,
    axes: &Axes<'_>,
    lines: &[(String, Vec<(f64, f64)>)],
) -> DrawResult<()> {
    let points = || lines.iter().flat_map(|(_, pts)| pts.iter().copied());
    let max_c = points().map(|(x, _)| x).fold(1.0_f64, f64::max);
    let min_c = points().map(|(x, _)| x).fold(max_c, f64::min).max(1.0);
    let (lo, hi) = points().fold((f64::MAX, 0.0_f64), |(lo, hi), (_, v)| {
        (lo.min(v), hi.max(v))
    });
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
        .build_cartesian_2d(
            (min_c * 0.8..max_c * 1.25).log_scale(),
            (lo..hi).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc(axes.x)
        .y_desc(axes.y)
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
