//! PNG charts of `tq eval` results (plotters, bitmap backend, ab_glyph text).
//!
//! plotters draws text with a font registered at runtime: DejaVu Sans from Debian's
//! `fonts-dejavu-core`. Without it the plots are skipped with a warning; the tables and
//! JSON do not depend on it.

use crate::results::{ModelResults, Row};
use plotters::coord::CoordTranslate;
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub const FONT_PACKAGE: &str = "fonts-dejavu-core";
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];
pub const FAMILY: &str = "sans-serif";

/// Registers DejaVu Sans as plotters' "sans-serif" once; the path used, or why not.
pub fn font() -> Result<&'static Path, String> {
    static FONT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let path = FONT_PATHS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                format!(
                    "no TTF font for the plots: install the Debian package {FONT_PACKAGE} \
                     (apt-get install {FONT_PACKAGE}; looked for {})",
                    FONT_PATHS.join(", ")
                )
            })?;
        let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        for style in [FontStyle::Normal, FontStyle::Bold] {
            plotters::style::register_font(FAMILY, style, bytes)
                .map_err(|_| format!("{} is not a usable TTF font", path.display()))?;
        }
        Ok(path)
    })
    .as_ref()
    .map(|p| p.as_path())
    .map_err(Clone::clone)
}

pub fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("plotting: {e:?}")
}

/// The legend box every chart here uses: upper right, white, black border.
pub fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    font_size: u32,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .label_font((FAMILY, font_size))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)
}

/// Writes the charts for one model into `dir`; the file names written, or why none were.
pub fn write_plots(res: &ModelResults, dir: &Path) -> Result<Vec<String>, String> {
    font()?;
    let mut files = Vec::new();
    let p = dir.join("kld_vs_bits.png");
    if kld_vs_bits(res, &p)? {
        files.push("kld_vs_bits.png".to_string());
    }
    if !res.bench_depths.is_empty() {
        let p = dir.join("speed_vs_depth.png");
        if speed_vs_depth(res, &p)? {
            files.push("speed_vs_depth.png".to_string());
        }
    }
    Ok(files)
}

/// matplotlib's tab10: distinct on white, no pale yellow.
pub const TAB10: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
const UPSTREAM: RGBColor = RGBColor(31, 119, 180);
const TURBO: RGBColor = RGBColor(214, 39, 40);

/// Mean KLD (log scale) against average bits per value; upstream types blue circles, pairs
/// with a turbo type red triangles, each point labelled. False when no row has a KLD.
fn kld_vs_bits(res: &ModelResults, path: &Path) -> Result<bool, String> {
    let pts: Vec<(&Row, f64, f64, f64)> = res
        .rows
        .iter()
        .filter_map(|r| r.kld.map(|k| (r, r.bits_per_value, k.kld, k.kld_err)))
        .filter(|(_, _, k, _)| *k > 0.0)
        .collect();
    if pts.is_empty() {
        return Ok(false);
    }
    let kmin = pts
        .iter()
        .map(|p| (p.2 - p.3).max(p.2 * 0.5))
        .fold(f64::INFINITY, f64::min);
    let kmax = pts.iter().map(|p| p.2 + p.3).fold(0.0, f64::max);
    // whole decades, so that the log axis gets labels all the way down
    let (ylo, yhi) = (
        10f64.powf((kmin / 1.5).log10().floor()),
        10f64.powf((kmax * 1.5).log10().ceil()),
    );
    let xmax = pts.iter().map(|p| p.1).fold(0.0, f64::max) + 1.0;

    let root = BitMapBackend::new(path, (1100, 750)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let title = format!(
        "{}: mean KLD vs f16 by KV bits/value (ctx {})",
        res.model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        res.ctx
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..xmax, (ylo..yhi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("average bits per value (K and V)")
        .y_desc("mean KLD (log)")
        .y_labels(12)
        .y_label_formatter(&|y| format!("{y:.1e}"))
        .label_style((FAMILY, 15))
        .draw()
        .map_err(err)?;
    for (turbo, color, name) in [(false, UPSTREAM, "upstream"), (true, TURBO, "turbo")] {
        let group: Vec<_> = pts.iter().filter(|p| p.0.turbo == turbo).collect();
        if group.is_empty() {
            continue;
        }
        // error bars
        chart
            .draw_series(group.iter().map(|p| {
                PathElement::new(
                    vec![(p.1, (p.2 - p.3).max(ylo)), (p.1, p.2 + p.3)],
                    color.mix(0.5).stroke_width(2),
                )
            }))
            .map_err(err)?;
        let series = group.iter().map(|p| (p.1, p.2));
        if turbo {
            chart
                .draw_series(series.map(|c| TriangleMarker::new(c, 8, color.filled())))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 6, color.filled()));
        } else {
            chart
                .draw_series(series.map(|c| Circle::new(c, 6, color.filled())))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
        }
        chart
            .draw_series(group.iter().map(|p| {
                EmptyElement::at((p.1, p.2))
                    + Text::new(
                        p.0.pair.clone(),
                        (10, -8),
                        (FAMILY, 15).into_font().color(&color),
                    )
            }))
            .map_err(err)?;
    }
    legend(&mut chart, 16)?;
    root.present().map_err(err)?;
    Ok(true)
}

/// pp and tg t/s against depth, one line per pair, two panels. False when no bench data.
fn speed_vs_depth(res: &ModelResults, path: &Path) -> Result<bool, String> {
    let rows: Vec<&Row> = res.rows.iter().filter(|r| !r.bench.is_empty()).collect();
    if rows.is_empty() {
        return Ok(false);
    }
    let root = BitMapBackend::new(path, (1400, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(700);
    let dmax = res.bench_depths.iter().copied().max().unwrap_or(0).max(1) as f64;
    for (area, test) in [
        (&left, format!("pp{}", res.bench_pp)),
        (&right, format!("tg{}", res.bench_tg)),
    ] {
        let ymax = rows
            .iter()
            .flat_map(|r| r.bench.iter())
            .filter(|b| b.test == test)
            .map(|b| b.t_s)
            .fold(0.0, f64::max);
        if ymax <= 0.0 {
            continue;
        }
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{test} t/s vs depth (CPU, {} threads)", res.threads),
                (FAMILY, 22),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(-dmax * 0.03..dmax * 1.05, 0.0..ymax * 1.15)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("depth (tokens already in the KV cache)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("tokens/s")
            .label_style((FAMILY, 14))
            .draw()
            .map_err(err)?;
        for (i, r) in rows.iter().enumerate() {
            let color = TAB10[i % TAB10.len()];
            let mut pts: Vec<(f64, f64)> = r
                .bench
                .iter()
                .filter(|b| b.test == test)
                .map(|b| (b.depth as f64, b.t_s))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let style = if r.turbo {
                color.stroke_width(3)
            } else {
                color.stroke_width(1)
            };
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(err)?
                .label(r.pair.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart
                .draw_series(pts.iter().map(|&c| Circle::new(c, 4, color.filled())))
                .map_err(err)?;
        }
        legend(&mut chart, 14)?;
    }
    root.present().map_err(err)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_both_charts() {
        if let Err(e) = font() {
            assert!(e.contains(FONT_PACKAGE), "{e}");
            eprintln!("skipped: {e}");
            return;
        }
        let dir = std::env::temp_dir().join(format!("tq-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = write_plots(&crate::eval::tests::sample(true), &dir).unwrap();
        assert_eq!(files, ["kld_vs_bits.png", "speed_vs_depth.png"]);
        for f in files {
            let b = std::fs::read(dir.join(f)).unwrap();
            assert!(b.starts_with(b"\x89PNG") && b.len() > 10_000);
        }
        // no bench: no speed chart
        let files = write_plots(&crate::eval::tests::sample(false), &dir).unwrap();
        assert_eq!(files, ["kld_vs_bits.png"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
