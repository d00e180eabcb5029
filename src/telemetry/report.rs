//! A room's report: what every instance saw, clock minute by clock minute,
//! added up in the shared store (`store::Reports`) and kept for
//! `[reports] retention`; read back as totals, percentiles and a
//! per-minute series (`GET /api/rooms/{id}/report`, JSON or CSV, and the
//! dashboard's report page).
//!
//! Each instance keeps a [`Tally`] per room: its counters (the ones
//! `/metrics` exports) since it last wrote, the waits and stays it
//! recorded, and the highest queue and active count it saw. The room
//! upkeep hands it the figures every couple of seconds and writes what is
//! due. Counts add up across instances (each decision is made once, on one
//! instance); peaks take the highest; the store's cumulative totals
//! (admissions, abandoned places) are kept as peaks, and a minute's count
//! is the rise from the minute before.

use std::collections::BTreeMap;

use serde::Serialize;

use super::dwell::TimeOnOrigin;
use super::metrics::RoomMetrics;
use super::wait::{Counts, BUCKETS};
use crate::clock::Millis;
use crate::store::{ReportMinute, RoomTotals};

const MINUTE_MS: Millis = 60_000;

/// An instance writes what it tallied at least this often (and whenever a
/// minute is over).
pub(crate) const WRITE_EVERY_MS: Millis = 10_000;

/// Most minutes an instance holds while the store does not take them; the
/// oldest go first.
const MAX_UNWRITTEN: usize = 60;

/// The field names a report minute is kept under.
mod field {
    pub(super) const ADMITTED: &str = "admitted";
    pub(super) const CAME: &str = "came";
    pub(super) const QUEUED: &str = "queued";
    pub(super) const REJECTED: &str = "rejected";
    pub(super) const REVOKED: &str = "revoked";
    pub(super) const SHADOWED: &str = "shadowed";
    pub(super) const WOULD_SHADOW: &str = "would_shadow";
    pub(super) const LANE_ENTRIES: &str = "lane_entries";
    pub(super) const QUEUE_PEAK: &str = "queue_peak";
    pub(super) const ACTIVE_PEAK: &str = "active_peak";
    pub(super) const LIMIT: &str = "limit";
    pub(super) const STORE_ADMITTED: &str = "store_admitted";
    pub(super) const STORE_ABANDONED: &str = "store_abandoned";
    /// `w<bucket>`: waits in `wait::bucket`'s buckets.
    pub(super) const WAIT: &str = "w";
    /// `o<bucket>`: stays on the origin, the same buckets.
    pub(super) const STAY: &str = "o";
}

/// The counters a tally reads, at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    admitted: u64,
    queued: u64,
    rejected: u64,
    revoked: u64,
    shadowed: u64,
    would_shadow: u64,
    lane_entries: u64,
}

impl Counters {
    fn of(m: &RoomMetrics) -> Self {
        Self {
            admitted: m.admitted.get(),
            queued: m.queued.get(),
            rejected: m.rejected.get(),
            revoked: m.revoked.get(),
            shadowed: m.shadowed.get(),
            would_shadow: m.would_shadow.get(),
            lane_entries: m.lanes.iter().map(|l| l.entered.get()).sum(),
        }
    }
}

/// What the upkeep read of a room this time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Observed {
    pub(crate) active: u64,
    pub(crate) queued: u64,
    pub(crate) limit: u64,
    pub(crate) totals: Option<RoomTotals>,
    /// A stay with nothing seen for this long is over: the session length.
    pub(crate) idle_ms: Millis,
}

/// One room's share on this instance not yet in the store.
#[derive(Default)]
pub(crate) struct Tally {
    /// The counters as they were when last taken (zero at start: the
    /// counters start with the process).
    seen: Counters,
    started: bool,
    unwritten: BTreeMap<u64, ReportMinute>,
    last_write_ms: Millis,
    /// What the upkeep last read, for a write between its rounds.
    last_seen: Option<Observed>,
}

impl Tally {
    /// Folds in what happened since the last call, and returns the minutes
    /// to write now: every minute once it is over, the current one at
    /// most every [`WRITE_EVERY_MS`]. What is returned is no longer held:
    /// give it back with [`Tally::unwritten`] if the store refused it.
    pub(crate) fn observe(
        &mut self,
        metrics: &RoomMetrics,
        stays: &TimeOnOrigin,
        seen: Observed,
        now: Millis,
    ) -> Vec<(u64, ReportMinute)> {
        self.last_seen = Some(seen);
        let minute = now / MINUTE_MS;
        let mut add = ReportMinute::default();
        let counters = Counters::of(metrics);
        let before = self.seen;
        self.seen = counters;
        let mut sum = |name: &str, now: u64, then: u64| {
            let n = now.saturating_sub(then);
            if n > 0 {
                add.sums.insert(name.to_owned(), n);
            }
        };
        sum(field::ADMITTED, counters.admitted, before.admitted);
        sum(field::QUEUED, counters.queued, before.queued);
        sum(field::REJECTED, counters.rejected, before.rejected);
        sum(field::REVOKED, counters.revoked, before.revoked);
        sum(field::SHADOWED, counters.shadowed, before.shadowed);
        sum(
            field::WOULD_SHADOW,
            counters.would_shadow,
            before.would_shadow,
        );
        sum(
            field::LANE_ENTRIES,
            counters.lane_entries,
            before.lane_entries,
        );
        let waits = metrics
            .queue_wait
            .hour
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take_pending();
        let came: u64 = waits.iter().map(|(_, c)| u64::from(*c)).sum();
        if came > 0 {
            add.sums.insert(field::CAME.to_owned(), came);
        }
        for (i, c) in waits {
            add.sums.insert(format!("{}{i}", field::WAIT), u64::from(c));
        }
        let ended = stays
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(now, seen.idle_ms);
        for (i, c) in ended {
            add.sums.insert(format!("{}{i}", field::STAY), u64::from(c));
        }
        let mut peak = |name: &str, n: u64| {
            add.peaks.insert(name.to_owned(), n);
        };
        peak(field::QUEUE_PEAK, seen.queued);
        peak(field::ACTIVE_PEAK, seen.active);
        peak(field::LIMIT, seen.limit);
        if let Some(t) = seen.totals {
            peak(field::STORE_ADMITTED, t.admitted);
            peak(field::STORE_ABANDONED, t.abandoned);
            if !self.started {
                // The totals as this instance found them (less what it
                // admitted itself before this first look): the minute
                // before counts from there, not from the room's creation.
                let mut baseline = ReportMinute::default();
                baseline.peaks.insert(
                    field::STORE_ADMITTED.to_owned(),
                    t.admitted.saturating_sub(counters.admitted),
                );
                baseline
                    .peaks
                    .insert(field::STORE_ABANDONED.to_owned(), t.abandoned);
                self.hold(minute.saturating_sub(1), &baseline);
            }
        }
        self.started = true;
        self.hold(minute, &add);
        let over = self.unwritten.keys().next().is_some_and(|&m| m < minute);
        if !over && now < self.last_write_ms.saturating_add(WRITE_EVERY_MS) {
            return Vec::new();
        }
        self.last_write_ms = now;
        std::mem::take(&mut self.unwritten).into_iter().collect()
    }

    /// Everything this instance tallied up to `now`, to write before a
    /// report is read, with `seen` (else the upkeep's last figures).
    pub(crate) fn now(
        &mut self,
        metrics: &RoomMetrics,
        stays: &TimeOnOrigin,
        seen: Option<Observed>,
        now: Millis,
    ) -> Vec<(u64, ReportMinute)> {
        let Some(seen) = seen.or(self.last_seen) else {
            return std::mem::take(&mut self.unwritten).into_iter().collect();
        };
        self.last_write_ms = 0;
        self.observe(metrics, stays, seen, now)
    }

    /// Takes back minutes the store did not take, to write them next time.
    pub(crate) fn unwritten(&mut self, minutes: Vec<(u64, ReportMinute)>) {
        for (minute, add) in minutes {
            self.hold(minute, &add);
        }
    }

    fn hold(&mut self, minute: u64, add: &ReportMinute) {
        self.unwritten.entry(minute).or_default().merge(add);
        while self.unwritten.len() > MAX_UNWRITTEN {
            self.unwritten.pop_first();
        }
    }
}

/// Quantiles of waits or stays, in seconds (`null` without data).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    /// How many.
    pub count: u64,
    pub p50_seconds: Option<f64>,
    pub p90_seconds: Option<f64>,
    pub p99_seconds: Option<f64>,
}

impl Spread {
    fn of(counts: &Counts) -> Self {
        Self {
            count: counts.total(),
            p50_seconds: counts.quantile_seconds(0.5),
            p90_seconds: counts.quantile_seconds(0.9),
            p99_seconds: counts.quantile_seconds(0.99),
        }
    }
}

/// A report's counts over its window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// New visitors: admitted at once, queued, turned away or shadowed.
    pub arrivals: u64,
    /// Let in: at once, or from the queue when they came for it.
    pub admitted: u64,
    /// Put in the queue.
    pub queued: u64,
    /// Turned away (closed, queue full, the `reject` method).
    pub rejected: u64,
    /// Queue places dropped for want of polls (`abandon_after`).
    pub abandoned: u64,
    /// Let in from the queue but never came for it: their session ran out
    /// unused. Those let in near the window's end who have not come yet
    /// count until they come.
    pub no_shows: u64,
    /// Sessions the operator ended.
    pub revoked: u64,
    /// Sent to the shadow queue.
    pub shadowed: u64,
    /// Counted by a rule in log mode as ones it would have shadowed.
    pub would_shadow: u64,
    /// Visitors who entered a priority lane.
    pub lane_entries: u64,
}

/// One minute of the series.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MinuteRow {
    /// Start of the minute, RFC 3339.
    pub t: String,
    pub arrivals: u64,
    pub admitted: u64,
    pub queued: u64,
    pub rejected: u64,
    pub abandoned: u64,
    pub revoked: u64,
    pub shadowed: u64,
    pub lane_entries: u64,
    /// The longest queue and the most sessions an instance saw.
    pub queue_peak: u64,
    pub active_peak: u64,
    /// `total_active_users` in force (stock and operators' changes included).
    pub limit: u64,
    /// Time in queue of those let in this minute.
    pub wait_p50_seconds: Option<f64>,
    pub wait_p90_seconds: Option<f64>,
}

/// What `GET /api/rooms/{id}/report` answers.
#[derive(Clone, Debug, Serialize)]
pub struct RoomReport {
    pub room: String,
    /// The window, RFC 3339: whole minutes, `from` to the end of `to`'s.
    pub from: String,
    pub to: String,
    pub totals: Totals,
    /// Time in queue of the visitors let in from it.
    pub wait: Spread,
    /// Time on origin of the visitors let in (see `telemetry::dwell`).
    pub time_on_origin: Spread,
    /// The longest queue in the window.
    pub peak_queue: u64,
    /// The most sessions at once.
    pub peak_active: u64,
    /// Every minute in the window, quiet ones included, oldest first.
    pub minutes: Vec<MinuteRow>,
}

fn rfc3339(ms: Millis) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// The rise of a cumulative total from the last minute that had one; a
/// total that fell (a reset) counts from zero; the first one counts
/// nothing (its baseline is unknown).
fn rise(last: &mut Option<u64>, now: Option<u64>) -> u64 {
    let Some(now) = now else {
        return 0;
    };
    let rise = match *last {
        Some(before) if now >= before => now - before,
        Some(_) => now,
        None => 0,
    };
    *last = Some(now);
    rise
}

/// Builds the report of minutes `from..=to` of `room` from what the store
/// kept: `minutes` (oldest first) may start before `from`, to give the
/// cumulative totals their baseline.
pub(crate) fn build(room: &str, from: u64, to: u64, minutes: &[(u64, ReportMinute)]) -> RoomReport {
    let mut totals = Totals::default();
    let mut waits = Counts::default();
    let mut stays = Counts::default();
    let (mut last_admitted, mut last_abandoned) = (None, None);
    let (mut peak_queue, mut peak_active) = (0, 0);
    let mut store_admitted = 0u64;
    let mut rows: BTreeMap<u64, MinuteRow> = (from..=to)
        .map(|m| {
            let row = MinuteRow {
                t: rfc3339(m * MINUTE_MS),
                ..MinuteRow::default()
            };
            (m, row)
        })
        .collect();
    for (minute, kept) in minutes {
        let sum = |name: &str| kept.sums.get(name).copied().unwrap_or(0);
        let peak = |name: &str| kept.peaks.get(name).copied();
        let admitted_rise = rise(&mut last_admitted, peak(field::STORE_ADMITTED));
        let abandoned = rise(&mut last_abandoned, peak(field::STORE_ABANDONED));
        let Some(row) = rows.get_mut(minute) else {
            continue;
        };
        store_admitted += admitted_rise;
        let mut minute_waits = Counts::default();
        for (name, n) in &kept.sums {
            let bucket = |prefix: &str| {
                name.strip_prefix(prefix)
                    .and_then(|i| i.parse::<usize>().ok())
                    .filter(|&i| i < BUCKETS)
            };
            let n = u32::try_from(*n).unwrap_or(u32::MAX);
            if let Some(i) = bucket(field::WAIT) {
                minute_waits.add_to(i, n);
                waits.add_to(i, n);
            } else if let Some(i) = bucket(field::STAY) {
                stays.add_to(i, n);
            }
        }
        let admitted = sum(field::ADMITTED);
        let came = sum(field::CAME);
        row.admitted = admitted;
        row.queued = sum(field::QUEUED);
        row.rejected = sum(field::REJECTED);
        row.shadowed = sum(field::SHADOWED);
        row.arrivals = admitted.saturating_sub(came) + row.queued + row.rejected + row.shadowed;
        row.abandoned = abandoned;
        row.revoked = sum(field::REVOKED);
        row.lane_entries = sum(field::LANE_ENTRIES);
        row.queue_peak = peak(field::QUEUE_PEAK).unwrap_or(0);
        row.active_peak = peak(field::ACTIVE_PEAK).unwrap_or(0);
        row.limit = peak(field::LIMIT).unwrap_or(0);
        row.wait_p50_seconds = minute_waits.quantile_seconds(0.5);
        row.wait_p90_seconds = minute_waits.quantile_seconds(0.9);
        totals.arrivals += row.arrivals;
        totals.admitted += row.admitted;
        totals.queued += row.queued;
        totals.rejected += row.rejected;
        totals.abandoned += row.abandoned;
        totals.revoked += row.revoked;
        totals.shadowed += row.shadowed;
        totals.would_shadow += sum(field::WOULD_SHADOW);
        totals.lane_entries += row.lane_entries;
        peak_queue = peak_queue.max(row.queue_peak);
        peak_active = peak_active.max(row.active_peak);
    }
    // The store counts every admission when it is made, promotions
    // included; this daemon counts a promoted visitor when it comes.
    totals.no_shows = store_admitted.saturating_sub(totals.admitted);
    RoomReport {
        room: room.to_owned(),
        from: rfc3339(from * MINUTE_MS),
        to: rfc3339((to + 1) * MINUTE_MS),
        totals,
        wait: Spread::of(&waits),
        time_on_origin: Spread::of(&stays),
        peak_queue,
        peak_active,
        minutes: rows.into_values().collect(),
    }
}

/// The series as CSV (RFC 4180, a header line, `\r\n` line ends; a
/// quantile without data is an empty cell).
pub(crate) fn csv(report: &RoomReport) -> String {
    let mut out = String::from(
        "minute,arrivals,admitted,queued,rejected,abandoned,revoked,shadowed,lane_entries,queue_peak,active_peak,limit,wait_p50_seconds,wait_p90_seconds\r\n",
    );
    let q = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    for r in &report.minutes {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{}\r\n",
            r.t,
            r.arrivals,
            r.admitted,
            r.queued,
            r.rejected,
            r.abandoned,
            r.revoked,
            r.shadowed,
            r.lane_entries,
            r.queue_peak,
            r.active_peak,
            r.limit,
            q(r.wait_p50_seconds),
            q(r.wait_p90_seconds),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::wait::bucket;

    const M0: u64 = 30_000_000;

    fn minute(sums: &[(&str, u64)], peaks: &[(&str, u64)]) -> ReportMinute {
        ReportMinute {
            sums: sums.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            peaks: peaks.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn counts_add_cumulative_totals_rise_and_no_shows_are_the_difference() {
        let w = |s: u64| format!("w{}", bucket(s * 1000));
        let minutes = vec![
            // Before the window: the baseline of the store's totals.
            (
                M0 - 1,
                minute(&[], &[("store_admitted", 100), ("store_abandoned", 7)]),
            ),
            (
                M0,
                minute(
                    &[("admitted", 10), ("queued", 30), ("rejected", 2)],
                    &[
                        ("store_admitted", 110),
                        ("store_abandoned", 7),
                        ("queue_peak", 30),
                    ],
                ),
            ),
            // Five promoted, three came for it (waits of 60 s).
            (
                M0 + 2,
                minute(
                    &[("admitted", 3), ("came", 3), (&w(60), 3)],
                    &[
                        ("store_admitted", 115),
                        ("store_abandoned", 9),
                        ("queue_peak", 25),
                    ],
                ),
            ),
        ];
        let r = build("shop", M0, M0 + 2, &minutes);
        assert_eq!(r.minutes.len(), 3, "quiet minutes included");
        assert_eq!(r.totals.arrivals, 10 + 30 + 2);
        assert_eq!(r.totals.admitted, 13);
        assert_eq!(r.totals.abandoned, 2);
        assert_eq!(r.totals.no_shows, 2);
        assert_eq!(r.peak_queue, 30);
        assert_eq!(r.wait.count, 3);
        let p50 = r.wait.p50_seconds.unwrap();
        assert!((p50 - 60.0).abs() < 60.0 * 0.05, "{p50}");
        assert_eq!(r.minutes[2].wait_p50_seconds, r.wait.p50_seconds);
        assert_eq!(
            r.minutes[1],
            MinuteRow {
                t: r.minutes[1].t.clone(),
                ..Default::default()
            }
        );
        let csv = csv(&r);
        assert_eq!(csv.lines().count(), 4);
        assert!(csv.lines().nth(1).unwrap().starts_with(&r.minutes[0].t));
    }

    #[test]
    fn a_reset_counts_from_zero_and_a_first_total_has_no_baseline() {
        let mut last = None;
        assert_eq!(rise(&mut last, Some(50)), 0);
        assert_eq!(rise(&mut last, Some(60)), 10);
        assert_eq!(rise(&mut last, None), 0);
        assert_eq!(rise(&mut last, Some(4)), 4);
    }

    #[test]
    fn a_tally_writes_each_minute_once_it_is_over_and_the_current_one_now_and_then() {
        let metrics = crate::telemetry::Metrics::new().room("r");
        let stays = TimeOnOrigin::default();
        let seen = Observed {
            active: 3,
            queued: 9,
            limit: 10,
            totals: Some(RoomTotals {
                admitted: 40,
                ..Default::default()
            }),
            idle_ms: 300_000,
        };
        let mut t = Tally::default();
        let t0 = M0 * MINUTE_MS;
        metrics.admitted.inc();
        // The first call writes (nothing written yet) with the baseline.
        let got = t.observe(&metrics, &stays, seen, t0);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, M0 - 1);
        assert_eq!(got[1].1.sums["admitted"], 1);
        metrics.admitted.inc();
        assert!(t.observe(&metrics, &stays, seen, t0 + 2_000).is_empty());
        metrics.admitted.inc();
        let got = t.observe(&metrics, &stays, seen, t0 + WRITE_EVERY_MS);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1.sums["admitted"], 2);
        // Refused by the store: held and written with the next.
        t.unwritten(got);
        metrics.admitted.inc();
        let got = t.observe(&metrics, &stays, seen, t0 + MINUTE_MS);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1.sums["admitted"], 2);
        assert_eq!(got[1].0, M0 + 1);
        assert_eq!(got[1].1.peaks["queue_peak"], 9);
    }
}
