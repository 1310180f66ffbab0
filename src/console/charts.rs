//! The overview's charts, drawn as SVG by `plotters` from numbers only (no
//! user text reaches a chart, so its markup can be inlined as is).

use plotters::prelude::*;

/// Colours of the series (dark enough for text contrast on white).
const BLUE: RGBColor = RGBColor(0x1f, 0x4e, 0x9a);
const ORANGE: RGBColor = RGBColor(0xa8, 0x4b, 0x00);

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw the chart: {0}")]
pub struct ChartError(String);

fn err<E: std::fmt::Display>(e: E) -> ChartError {
    ChartError(e.to_string())
}

/// A line chart of one daily series: `points` are (days before today,
/// value), oldest first; `unit` names the y axis.
pub fn daily_line(points: &[(i32, f64)], unit: &str, second: bool) -> Result<String, ChartError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (560, 240)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        // Always the whole window, so a short history sits at its right end.
        let first = points.first().map_or(-30, |p| p.0.min(-30));
        let top = points.iter().map(|p| p.1).fold(0.0_f64, f64::max);
        let top = if top <= 0.0 { 1.0 } else { top * 1.15 };
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(first..0, 0.0..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("days ago")
            .y_desc(unit)
            .x_label_formatter(&|d| format!("{}", -d))
            .y_label_formatter(&|v| short(*v))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        let colour = if second { ORANGE } else { BLUE };
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(err)?;
        // A marker on each day, so that one day alone still shows.
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, colour.filled())))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// A bar chart with one bar per `(caption, value)`.
pub fn bars(bars: &[(&str, u64)], unit: &str) -> Result<String, ChartError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (560, 240)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let top = bars.iter().map(|b| b.1).max().unwrap_or(0);
        let top = (top + top / 6).max(1);
        let n = u32::try_from(bars.len()).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            // A segmented 0..k has k + 1 segments, one per bar here.
            .build_cartesian_2d((0..n.saturating_sub(1).max(1)).into_segmented(), 0..top)
            .map_err(err)?;
        let captions: Vec<String> = bars.iter().map(|b| b.0.to_owned()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(unit)
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => captions.get(*i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .y_label_formatter(&|v| short(*v as f64))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(
                Histogram::vertical(&chart)
                    .style(BLUE.filled())
                    .margin(24)
                    .data(bars.iter().enumerate().map(|(i, b)| (i as u32, b.1))),
            )
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// 1234567 as 1.2M, for axis labels.
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_without_scripts_or_style_attributes() {
        let line = daily_line(&[(-2, 1.0), (-1, 3.0), (0, 2.0)], "payloads", false).unwrap();
        let bar = bars(&[("24 h", 3), ("7 days", 5), ("30 days", 9)], "payloads").unwrap();
        for svg in [line, bar] {
            assert!(svg.starts_with("<svg"), "{svg}");
            assert!(!svg.contains("<script"), "{svg}");
            assert!(
                !svg.contains("style="),
                "inline styles break the CSP: {svg}"
            );
        }
    }

    #[test]
    fn empty_data_still_draws() {
        assert!(daily_line(&[], "bytes", true).unwrap().contains("<svg"));
        assert!(bars(&[], "payloads").unwrap().contains("<svg"));
    }
}
