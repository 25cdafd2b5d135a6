//! Draws `benches/bulk.sh`'s figures as an SVG line chart: MiB/s against message size (log
//! scale), one line per system, so a reader sees at a glance where ulnet stands.
//!
//!     bulk_plot FIGS OUT.svg
//!
//! FIGS has one measurement per line, `<system> <size in bytes> <MiB/s>`; several lines for
//! the same system and size (rounds) are reduced to their median. Hand-written SVG: no
//! dependency for one chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

const W: f64 = 760.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn size_label(s: u64) -> String {
    match s {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// The chart for `series`: system -> size -> MiB/s.
fn svg(series: &BTreeMap<String, BTreeMap<u64, f64>>) -> String {
    let sizes: Vec<u64> = {
        let mut v: Vec<u64> = series.values().flat_map(|m| m.keys().copied()).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let ymax = series
        .values()
        .flat_map(|m| m.values().copied())
        .fold(1.0f64, f64::max)
        * 1.1;
    let (lo, hi) = (
        (*sizes.first().unwrap_or(&1) as f64).log2(),
        (*sizes.last().unwrap_or(&2) as f64).log2().max(1.0),
    );
    let span = (hi - lo).max(1.0);
    let x = |s: u64| LEFT + ((s as f64).log2() - lo) / span * (W - LEFT - RIGHT);
    let y = |v: f64| TOP + (1.0 - v / ymax) * (H - TOP - BOTTOM);
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="14">Bulk throughput on loopback (MiB/s, median of rounds)</text>"#,
        (W - RIGHT + LEFT) / 2.0
    );
    // Axes, grid, ticks.
    let (x0, x1, y0, y1) = (LEFT, W - RIGHT, TOP, H - BOTTOM);
    let _ = writeln!(
        o,
        r#"<path d="M{x0},{y0} L{x0},{y1} L{x1},{y1}" stroke="black" fill="none"/>"#
    );
    for i in 0..=5 {
        let v = ymax * f64::from(i) / 5.0;
        let yy = y(v);
        let _ = writeln!(
            o,
            r##"<line x1="{x0}" y1="{yy:.1}" x2="{x1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            x0 - 6.0,
            yy + 4.0
        );
    }
    for &s in &sizes {
        let xx = x(s);
        let _ = writeln!(
            o,
            r#"<line x1="{xx:.1}" y1="{y1}" x2="{xx:.1}" y2="{:.1}" stroke="black"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            y1 + 5.0,
            y1 + 20.0,
            size_label(s)
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">message size</text>"#,
        (x0 + x1) / 2.0,
        H - 10.0
    );
    // One line per system, its legend entry on the right.
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = pts
            .iter()
            .enumerate()
            .map(|(k, (&s, &v))| {
                format!("{}{:.1},{:.1}", if k == 0 { "M" } else { "L" }, x(s), y(v))
            })
            .collect();
        let _ = writeln!(
            o,
            r#"<path d="{}" stroke="{c}" stroke-width="2" fill="none"/>"#,
            path.join(" ")
        );
        for (&s, &v) in pts {
            let _ = writeln!(
                o,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                x(s),
                y(v)
            );
        }
        let ly = TOP + 20.0 * i as f64 + 10.0;
        let _ = writeln!(
            o,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            x1 + 15.0,
            x1 + 35.0,
            x1 + 40.0,
            ly + 4.0
        );
    }
    o.push_str("</svg>\n");
    o
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [figs, out] = &args[..] else {
        eprintln!("usage: bulk_plot FIGS OUT.svg");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(figs) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("bulk_plot: {figs}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut raw: BTreeMap<String, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let (Some(name), Some(size), Some(v)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let (Ok(size), Ok(v)) = (size.parse::<u64>(), v.parse::<f64>()) else {
            continue;
        };
        raw.entry(name.to_string())
            .or_default()
            .entry(size)
            .or_default()
            .push(v);
    }
    if raw.is_empty() {
        eprintln!("bulk_plot: no figures in {figs}");
        return ExitCode::FAILURE;
    }
    let series: BTreeMap<String, BTreeMap<u64, f64>> = raw
        .into_iter()
        .map(|(n, m)| {
            (
                n,
                m.into_iter()
                    .map(|(s, mut v)| (s, median(&mut v)))
                    .collect(),
            )
        })
        .collect();
    if let Err(e) = std::fs::write(out, svg(&series)) {
        eprintln!("bulk_plot: {out}: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_a_line_per_system() {
        let mut v = vec![3.0, 1.0, 2.0];
        assert_eq!(median(&mut v), 2.0);
        let mut v = vec![4.0, 1.0, 2.0, 3.0];
        assert_eq!(median(&mut v), 2.5);
        let mut s = BTreeMap::new();
        s.insert(
            "iperf3".to_string(),
            BTreeMap::from([(4096, 100.0), (1 << 20, 2000.0)]),
        );
        s.insert(
            "ulnet".to_string(),
            BTreeMap::from([(4096, 50.0), (1 << 20, 1900.0)]),
        );
        let out = svg(&s);
        assert!(out.starts_with("<svg"));
        assert_eq!(out.matches("stroke-width=\"2\" fill=\"none\"").count(), 2);
        assert!(out.contains(">iperf3</text>") && out.contains(">ulnet</text>"));
        assert!(out.contains(">4 KiB</text>") && out.contains(">1 MiB</text>"));
    }
}
