//! `[reports]`: how long the rooms' reports are kept in the store.

use std::time::Duration;

use super::{defaults, root, Checker};
use crate::config::raw::RawReports;
use crate::config::ReportsConfig;

/// Shortest retention: an hour (a report's minutes outlive the drop).
const MIN_RETENTION: Duration = Duration::from_secs(60 * 60);

impl Checker<'_, '_> {
    pub(super) fn reports(&mut self, raw: Option<RawReports>) -> ReportsConfig {
        let retention = raw.and_then(|r| r.retention);
        ReportsConfig {
            retention: self.duration(
                &root().key("reports").key("retention"),
                retention,
                defaults::REPORT_RETENTION,
                MIN_RETENTION,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{refusals, with};

    fn reports(keys: &str) -> Vec<String> {
        refusals(&format!("{}[reports]\n{keys}\n", with("room", "")))
    }

    #[test]
    fn retention_is_an_hour_to_a_year() {
        assert_eq!(reports("retention = \"90d\""), Vec::<String>::new());
        assert_eq!(reports(""), Vec::<String>::new());
        assert_eq!(
            reports("retention = \"10m\""),
            ["reports.retention: must be at least 1h, got \"10m\""]
        );
        assert_eq!(
            reports("retention = \"400d\""),
            ["reports.retention: must be at most 365d, got \"400d\""]
        );
        assert_eq!(reports("keep = \"1d\"").len(), 1);
    }
}
