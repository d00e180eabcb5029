//! `GET /api/rooms/{id}/report` and `GET /api/rooms/{id}/events/{name}/report`:
//! a room's report over a window, as JSON or CSV (`telemetry::report`).

use http::{header, HeaderMap, Response, StatusCode};

use super::{instant, Admin, AdminError};
use crate::body::{full, Body};
use crate::clock::Millis;
use crate::gate::Room;
use crate::respond::json;

/// The longest window one report covers.
const MAX_WINDOW_MS: Millis = 31 * 24 * 60 * 60_000;
/// The window when none is given: the last day.
const DEFAULT_WINDOW_MS: Millis = 24 * 60 * 60_000;

/// How the report is asked for.
#[derive(Debug, PartialEq, Eq)]
struct Asked {
    from: Option<Millis>,
    to: Option<Millis>,
    csv: bool,
}

/// `from`, `to` (RFC 3339, or milliseconds since the epoch) and `format`
/// (`json` or `csv`; else `Accept: text/csv` chooses CSV).
fn asked(query: Option<&str>, headers: &HeaderMap) -> Result<Asked, AdminError> {
    let mut asked = Asked {
        from: None,
        to: None,
        csv: headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|t| t.trim().starts_with("text/csv"))),
    };
    let time = |key: &str, v: &str| match v.trim().parse::<Millis>() {
        Ok(ms) => Ok(ms),
        Err(_) => instant(key, v).map_err(AdminError::BadRequest),
    };
    for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "from" => asked.from = Some(time("from", &value)?),
            "to" => asked.to = Some(time("to", &value)?),
            "format" => {
                asked.csv = match value.as_ref() {
                    "csv" => true,
                    "json" => false,
                    other => {
                        return Err(AdminError::BadRequest(format!(
                            "format: expected json or csv, got {other:?}"
                        )))
                    }
                }
            }
            other => {
                return Err(AdminError::BadRequest(format!(
                    "{other}: unknown parameter (from, to and format are taken)"
                )))
            }
        }
    }
    Ok(asked)
}

impl Admin {
    /// A room's report over the window asked for, or `window` (an event's)
    /// when the query gives none, or the last day.
    pub(super) async fn report(
        &self,
        room: &Room,
        query: Option<&str>,
        headers: &HeaderMap,
        window: Option<(Millis, Millis)>,
    ) -> Result<Response<Body>, AdminError> {
        let asked = asked(query, headers)?;
        let gate = self.gates.load_full();
        let now = gate.clock.now_ms();
        let (default_from, default_to) =
            window.unwrap_or((now.saturating_sub(DEFAULT_WINDOW_MS), now));
        let to = asked.to.unwrap_or(default_to.min(now));
        let from = asked.from.unwrap_or(if asked.to.is_some() {
            to.saturating_sub(DEFAULT_WINDOW_MS)
        } else {
            default_from
        });
        if from > to {
            return Err(AdminError::BadRequest("from: must not be after to".into()));
        }
        if to - from > MAX_WINDOW_MS {
            return Err(AdminError::BadRequest(
                "to: a report covers at most 31 days".into(),
            ));
        }
        let report = gate.operator.report(room, from, to).await?;
        if !asked.csv {
            return Ok(json(StatusCode::OK, &report, None));
        }
        let mut resp = Response::new(full(crate::telemetry::report::csv(&report)));
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/csv; charset=utf-8; header=present"),
        );
        let name = format!(
            "attachment; filename=\"{}-{}.csv\"",
            room.config.id,
            report.from.replace(':', "")
        );
        if let Ok(v) = header::HeaderValue::from_str(&name) {
            headers.insert(header::CONTENT_DISPOSITION, v);
        }
        Ok(resp)
    }

    /// The window of the room's event `name`: from its prequeue (or start)
    /// to its end.
    pub(super) fn event_window(
        &self,
        room: &Room,
        name: &str,
    ) -> Result<(Millis, Millis), AdminError> {
        room.events()
            .iter()
            .find(|e| e.spec.name == name)
            .map(|e| {
                (
                    e.spec.prequeue_start_ms.unwrap_or(e.spec.start_ms),
                    e.spec.end_ms,
                )
            })
            .ok_or(AdminError::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_milliseconds_and_the_format_is_chosen() {
        let none = HeaderMap::new();
        let a = asked(
            Some("from=2027-01-15T08:00:00Z&to=1800003600000&format=csv"),
            &none,
        )
        .unwrap();
        assert_eq!(
            a,
            Asked {
                from: Some(1_800_000_000_000),
                to: Some(1_800_003_600_000),
                csv: true
            }
        );
        let mut accept = HeaderMap::new();
        accept.insert(header::ACCEPT, "text/csv, */*".parse().unwrap());
        assert!(asked(None, &accept).unwrap().csv);
        assert!(!asked(Some("format=json"), &accept).unwrap().csv);
        for bad in ["from=yesterday", "format=xml", "room=x", "to=-5"] {
            assert!(asked(Some(bad), &none).is_err(), "{bad}");
        }
    }
}
