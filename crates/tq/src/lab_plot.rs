//! One chart type for the lab subcommands: lines and/or labelled points over a linear x
//! axis, linear or log y, optional horizontal reference lines. Same font rule as plot.rs.

use plotters::prelude::*;
use std::path::Path;

use crate::plot::{err, legend, FAMILY, TAB10};

pub struct Series {
    pub name: String,
    pub pts: Vec<(f64, f64)>,
    pub color: usize,
    /// joined by a line (else markers only)
    pub line: bool,
    pub bold: bool,
    /// a text label next to each point
    pub labels: Vec<String>,
}

impl Series {
    pub fn line(name: &str, pts: Vec<(f64, f64)>, color: usize, bold: bool) -> Series {
        Series {
            name: name.into(),
            pts,
            color,
            line: true,
            bold,
            labels: Vec::new(),
        }
    }
    pub fn points(name: &str, pts: Vec<(f64, f64)>, color: usize) -> Series {
        Series {
            name: name.into(),
            pts,
            color,
            line: false,
            bold: true,
            labels: Vec::new(),
        }
    }
    pub fn labelled(mut self, labels: Vec<String>) -> Series {
        self.labels = labels;
        self
    }
}

#[allow(clippy::too_many_arguments)]
pub fn lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    log_y: bool,
    series: &[Series],
    hlines: &[(String, f64)],
) -> Result<(), String> {
    crate::plot::font()?;
    let ys = series
        .iter()
        .flat_map(|s| s.pts.iter().map(|p| p.1))
        .chain(hlines.iter().map(|h| h.1))
        .filter(|y| y.is_finite() && (!log_y || *y > 0.0));
    let (ymin, ymax) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
        (a.min(y), b.max(y))
    });
    let xs = series.iter().flat_map(|s| s.pts.iter().map(|p| p.0));
    let (xmin, xmax) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    if !ymin.is_finite() || !xmin.is_finite() {
        return Err("plotting: nothing to plot".into());
    }
    let xpad = ((xmax - xmin) * 0.06).max(0.5);
    let (x0, x1) = (xmin - xpad, xmax + xpad * 2.0);
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .x_label_formatter(&|x| {
                    if x.fract() == 0.0 {
                        format!("{x:.0}")
                    } else {
                        format!("{x:.2}")
                    }
                })
                .label_style((FAMILY, 15))
                .draw()
                .map_err(err)?;
            for (name, y) in hlines {
                chart
                    .draw_series(LineSeries::new(
                        vec![(x0, *y), (x1, *y)],
                        BLACK.stroke_width(1),
                    ))
                    .map_err(err)?
                    .label(name.clone())
                    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
            }
            for s in series {
                let color = TAB10[s.color % TAB10.len()];
                let style = color.stroke_width(if s.bold { 3 } else { 1 });
                let pts: Vec<(f64, f64)> = s
                    .pts
                    .iter()
                    .copied()
                    .filter(|p| p.1.is_finite() && (!log_y || p.1 > 0.0))
                    .collect();
                if s.line {
                    chart
                        .draw_series(LineSeries::new(pts.clone(), style))
                        .map_err(err)?
                        .label(s.name.clone())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
                    chart
                        .draw_series(pts.iter().map(|&c| Circle::new(c, 3, color.filled())))
                        .map_err(err)?;
                } else {
                    chart
                        .draw_series(pts.iter().map(|&c| Circle::new(c, 6, color.filled())))
                        .map_err(err)?
                        .label(s.name.clone())
                        .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
                }
                if !s.labels.is_empty() {
                    chart
                        .draw_series(
                            s.pts
                                .iter()
                                .zip(&s.labels)
                                .filter(|(c, _)| c.1.is_finite() && (!log_y || c.1 > 0.0))
                                .map(|(&c, l)| {
                                    EmptyElement::at(c)
                                        + Text::new(
                                            l.clone(),
                                            (8, -8),
                                            (FAMILY, 14).into_font().color(&color),
                                        )
                                }),
                        )
                        .map_err(err)?;
                }
            }
            legend(&mut chart, 14)?;
        }};
    }
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, (FAMILY, 22))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80);
    if log_y {
        let (lo, hi) = (
            10f64.powf((ymin / 1.5).log10().floor()),
            10f64.powf((ymax * 1.5).log10().ceil()),
        );
        draw!(builder
            .build_cartesian_2d(x0..x1, (lo..hi).log_scale())
            .map_err(err)?);
    } else {
        let pad = ((ymax - ymin) * 0.08).max(1e-3);
        draw!(builder
            .build_cartesian_2d(x0..x1, (ymin - pad)..(ymax + pad))
            .map_err(err)?);
    }
    root.present().map_err(err)?;
    Ok(())
}
