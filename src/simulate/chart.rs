//! The run drawn as an SVG chart, by hand (no plotting crate): four panels
//! over time — active sessions against the limit, the queue, admissions a
//! minute (with the rate the ETA rests on), and the wait each visitor was
//! told on arrival against the wait they got.

use std::fmt::Write;

use super::{clock, quantile, Outcome, Sample};

const WIDTH: f64 = 960.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 24.0;
/// Height of one panel's plot area.
const PLOT: f64 = 140.0;
/// Room above a plot (its title and legend) and below it (time labels).
const ABOVE: f64 = 34.0;
const BELOW: f64 = 40.0;
const TOP: f64 = 44.0;

/// How a panel's values read.
#[derive(Clone, Copy)]
enum Unit {
    Count,
    Seconds,
}

/// (seconds, value) pairs; a NaN value breaks the line.
type Points = Vec<(f64, f64)>;

struct Series {
    name: String,
    color: &'static str,
    dashed: bool,
    points: Points,
}

struct Panel {
    title: &'static str,
    /// What the horizontal axis counts.
    x_title: &'static str,
    x_max: f64,
    unit: Unit,
    series: Vec<Series>,
}

/// The chart of a run, as SVG text.
pub fn svg(outcome: &Outcome) -> String {
    let s = &outcome.summary;
    let end = outcome
        .samples
        .last()
        .map_or(1.0, |x| f64::from(x.t).max(1.0));
    let over_time = |title, unit, series| Panel {
        title,
        x_title: "time since arrivals began",
        x_max: end,
        unit,
        series,
    };
    let mut panels = vec![];
    let mut active = vec![line(
        "active sessions",
        "#1f77b4",
        columns(&outcome.samples, end, |x| x.active as f64),
    )];
    if s.limit > 0 {
        active.push(level("total_active_users", s.limit as f64, end));
    }
    panels.push(over_time("Active sessions", Unit::Count, active));
    panels.push(over_time(
        "Queue",
        Unit::Count,
        vec![line(
            "visitors waiting",
            "#ff7f0e",
            columns(&outcome.samples, end, |x| x.queued as f64),
        )],
    ));
    let mut admissions = vec![line(
        "admissions in the last minute",
        "#2ca02c",
        columns(&outcome.samples, end, |x| x.admitted_last_minute as f64),
    )];
    if outcome.summary.queued > 0 {
        admissions.push(Series {
            name: "rate behind the ETA".to_owned(),
            color: "#9467bd",
            dashed: true,
            // Only while someone waits is the estimate told to anyone.
            points: columns(&outcome.samples, end, |x| match x.eta_rate {
                Some(rate) if x.queued > 0 => rate * 60.0,
                _ => f64::NAN,
            }),
        });
    }
    let busiest = s.peak_admissions_per_minute as f64;
    // A limit far above what happened would flatten the curve to nothing.
    if s.rate_limit > 0 && s.rate_limit as f64 <= 3.0 * busiest.max(1.0) {
        admissions.push(level("new_users_per_minute", s.rate_limit as f64, end));
    }
    panels.push(over_time("Admissions a minute", Unit::Count, admissions));
    let (told, waited, last) = waits_by_arrival(outcome);
    panels.push(Panel {
        title: "Wait told on arrival vs wait got (median by arrival time)",
        x_title: "arrival time",
        x_max: last,
        unit: Unit::Seconds,
        series: vec![
            line("told on arrival (ETA)", "#9467bd", told),
            line("real wait", "#222222", waited),
        ],
    });

    let height = TOP + panels.len() as f64 * (ABOVE + PLOT + BELOW) + 8.0;
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="system-ui, -apple-system, Segoe UI, sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{LEFT}" y="26" font-size="17" font-weight="600">{}</text>
"##,
        escape(&format!(
            "Simulated drop: {} visitors at room \"{}\"",
            super::thousands(s.arrived),
            s.room
        ))
    );
    for (i, panel) in panels.iter().enumerate() {
        draw(&mut out, panel, TOP + i as f64 * (ABOVE + PLOT + BELOW));
    }
    out.push_str("</svg>\n");
    out
}

fn line(name: &str, color: &'static str, points: Points) -> Series {
    Series {
        name: name.to_owned(),
        color,
        dashed: false,
        points,
    }
}

/// A configured limit, drawn as a dashed level.
fn level(name: &str, value: f64, end: f64) -> Series {
    Series {
        name: format!("{name} ({})", super::thousands(value as u64)),
        color: "#888888",
        dashed: true,
        points: vec![(0.0, value), (end, value)],
    }
}

/// One point per pixel column at most: the column's highest value, so
/// peaks survive the thinning (NaN, a gap, only where the whole column is).
fn columns(samples: &[Sample], end: f64, value: impl Fn(&Sample) -> f64) -> Points {
    let plot = WIDTH - LEFT - RIGHT;
    let mut out: Points = Vec::new();
    let mut column = usize::MAX;
    for s in samples {
        let t = f64::from(s.t);
        let c = (t / end * plot) as usize;
        if c == column {
            if let Some(last) = out.last_mut() {
                last.1 = last.1.max(value(s));
            }
        } else {
            column = c;
            out.push((t, value(s)));
        }
    }
    out
}

/// Medians of the told and the real waits, by arrival time, and the last
/// arrival time.
fn waits_by_arrival(outcome: &Outcome) -> (Points, Points, f64) {
    let got: Vec<(f64, f64, f64)> = outcome
        .waits
        .iter()
        .filter_map(|w| Some((w.arrived, w.told as f64, w.waited?)))
        .collect();
    let last = got.iter().map(|g| g.0).fold(1.0, f64::max);
    const BUCKETS: usize = 150;
    let mut buckets: Vec<(Vec<f64>, Vec<f64>)> = vec![(vec![], vec![]); BUCKETS];
    for &(at, told, waited) in &got {
        let b = ((at / last * BUCKETS as f64) as usize).min(BUCKETS - 1);
        buckets[b].0.push(told);
        buckets[b].1.push(waited);
    }
    let (mut told, mut waited) = (vec![], vec![]);
    for (b, (t, w)) in buckets.iter_mut().enumerate() {
        let x = (b as f64 + 0.5) / BUCKETS as f64 * last;
        t.sort_by(f64::total_cmp);
        w.sort_by(f64::total_cmp);
        if let (Some(t), Some(w)) = (quantile(t, 0.5), quantile(w, 0.5)) {
            told.push((x, t));
            waited.push((x, w));
        }
    }
    (told, waited, last)
}

fn draw(out: &mut String, panel: &Panel, top: f64) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let y0 = top + ABOVE;
    let y_max_data = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let (step, y_max) = match panel.unit {
        Unit::Count => nice(y_max_data.max(1.0), COUNT_STEPS),
        Unit::Seconds => nice(y_max_data.max(1.0), TIME_STEPS),
    };
    let x = |t: f64| LEFT + t / panel.x_max * plot_w;
    let y = |v: f64| y0 + PLOT - v / y_max * PLOT;

    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}" font-size="14" font-weight="600">{}</text>"#,
        top + 20.0,
        escape(panel.title)
    );
    // Legend, right-aligned on the title line.
    let mut lx = WIDTH - RIGHT;
    for s in panel.series.iter().rev() {
        let w = 28.0 + s.name.len() as f64 * 6.4;
        lx -= w;
        let _ = writeln!(
            out,
            r##"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2.5"{}/><text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
            lx + 18.0,
            s.color,
            if s.dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            },
            lx + 22.0,
            top + 20.0,
            escape(&s.name),
            ly = top + 16.0,
        );
    }
    // Horizontal grid and value labels.
    let mut v = 0.0;
    while v <= y_max + step * 0.001 {
        let label = match panel.unit {
            Unit::Count => count_label(v),
            Unit::Seconds => duration_label(v),
        };
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{label}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y(v) + 4.0,
            yy = y(v),
        );
        v += step;
    }
    // Time axis: ticks and labels.
    let (t_step, _) = nice(panel.x_max, TIME_STEPS);
    let mut t = 0.0;
    while t <= panel.x_max + 1e-9 {
        let _ = writeln!(
            out,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#999"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            y0 + PLOT,
            y0 + PLOT + 5.0,
            y0 + PLOT + 18.0,
            clock(t),
            xx = x(t),
        );
        t += t_step;
    }
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{b:.1}" x2="{:.1}" y2="{b:.1}" stroke="#999"/><line x1="{LEFT}" y1="{y0:.1}" x2="{LEFT}" y2="{b:.1}" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#777" font-size="11">{}</text>"##,
        LEFT + plot_w,
        LEFT + plot_w / 2.0,
        y0 + PLOT + 33.0,
        escape(panel.x_title),
        b = y0 + PLOT,
    );
    for s in &panel.series {
        // A value that is not a number breaks the line.
        for run in s.points.split(|p| p.1.is_nan()).filter(|r| !r.is_empty()) {
            let mut points = String::new();
            for &(t, v) in run {
                let _ = write!(points, "{:.1},{:.1} ", x(t), y(v));
            }
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="{}"{} points="{}"/>"#,
                s.color,
                if s.dashed { 1.5 } else { 2.0 },
                if s.dashed {
                    r#" stroke-dasharray="6 4""#
                } else {
                    ""
                },
                points.trim_end()
            );
        }
    }
}

/// Steps for counts: 1, 2, 5 times a power of ten.
const COUNT_STEPS: &[f64] = &[];
/// Steps for times, in seconds.
const TIME_STEPS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0,
    10800.0, 21600.0, 43200.0, 86400.0, 172800.0,
];

/// A step that divides `max` into at most six parts, and the axis top.
fn nice(max: f64, steps: &[f64]) -> (f64, f64) {
    let raw = max / 6.0;
    let step = if steps.is_empty() {
        let magnitude = 10f64.powf(raw.log10().floor());
        [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|&s| s >= raw)
            .unwrap_or(10.0 * magnitude)
            .max(1.0)
    } else {
        steps
            .iter()
            .copied()
            .find(|&s| s >= raw)
            .unwrap_or(steps[steps.len() - 1])
    };
    (step, (max / step).ceil().max(1.0) * step)
}

/// `45000` as `45k`, `1500` as `1.5k`.
fn count_label(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{}M", trim(v / 1_000_000.0))
    } else if v >= 1000.0 {
        format!("{}k", trim(v / 1000.0))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_owned)
}

/// Seconds as `45s`, `12m`, `2h30m`.
fn duration_label(v: f64) -> String {
    let s = v.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 if s % 60 == 0 => format!("{}m", s / 60),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ if s % 3600 == 0 => format!("{}h", s / 3600),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_get_round_steps() {
        assert_eq!(nice(45_000.0, COUNT_STEPS), (10_000.0, 50_000.0));
        assert_eq!(nice(1000.0, COUNT_STEPS), (200.0, 1000.0));
        assert_eq!(nice(3.0, COUNT_STEPS), (1.0, 3.0));
        assert_eq!(nice(9000.0, TIME_STEPS), (1800.0, 9000.0));
        assert_eq!(nice(300.0, TIME_STEPS), (60.0, 300.0));
    }

    #[test]
    fn labels_read_for_people() {
        assert_eq!(count_label(45_000.0), "45k");
        assert_eq!(count_label(1_500.0), "1.5k");
        assert_eq!(count_label(300.0), "300");
        assert_eq!(duration_label(45.0), "45s");
        assert_eq!(duration_label(720.0), "12m");
        assert_eq!(duration_label(9000.0), "2h30m");
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
