//! A room's secret bypass header (`[room.bypass_header]`).

use super::Checker;
use crate::config::keypath::KeyPath;
use crate::config::raw::RawBypassHeader;
use crate::config::Secret;

impl Checker<'_, '_> {
    pub(super) fn bypass_header(
        &mut self,
        p: &KeyPath,
        raw: RawBypassHeader,
    ) -> Option<(http::HeaderName, Secret)> {
        let name = match http::HeaderName::from_bytes(raw.name.as_bytes()) {
            Ok(name) => Some(name),
            Err(_) => {
                self.fail(
                    &p.key("name"),
                    format!("{:?} is not a valid HTTP header name", raw.name),
                );
                None
            }
        };
        let value_path = p.key("value_env");
        let var = self.env_name(&value_path, Some(raw.value_env), "")?;
        // The value is a secret: messages name the variable, never its content.
        let value = match (self.env)(&var) {
            Some(v) if !v.is_empty() => v,
            _ => {
                self.fail(
                    &value_path,
                    format!("environment variable {var} is not set; it holds the bypass header's secret value"),
                );
                return None;
            }
        };
        if value.trim() != value || http::HeaderValue::from_str(&value).is_err() {
            self.fail(
                &value_path,
                format!(
                    "the value of {var} cannot match any request header: it has surrounding \
                     whitespace or characters not allowed in a header value"
                ),
            );
            return None;
        }
        Some((name?, Secret(value)))
    }
}
