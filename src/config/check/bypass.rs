//! What a room forwards without a ticket: bypass paths, client
//! addresses (`bypass_ips`) and the secret header (`[room.bypass_header]`).

use ipnet::IpNet;

use super::values::check_path;
use super::Checker;
use crate::config::keypath::KeyPath;
use crate::config::raw::{RawBypassHeader, RawRoom};
use crate::config::Secret;

impl Checker<'_, '_> {
    /// The room's bypass paths, client addresses and secret header.
    pub(super) fn room_bypasses(
        &mut self,
        p: &KeyPath,
        raw: &mut RawRoom,
    ) -> (Vec<String>, Vec<IpNet>, Option<(http::HeaderName, Secret)>) {
        let mut bypass_paths = Vec::new();
        let paths = raw.bypass_paths.take().unwrap_or_default();
        for (i, path) in paths.iter().enumerate() {
            match check_path(path) {
                Ok(canonical) => bypass_paths.push(canonical),
                Err(why) => self.fail(&p.key("bypass_paths").index(i), format!("{path:?} {why}")),
            }
        }
        let bypass_ips = self.nets(&p.key("bypass_ips"), raw.bypass_ips.take());
        let bypass_header = raw
            .bypass_header
            .take()
            .and_then(|h| self.bypass_header(&p.key("bypass_header"), h));
        (bypass_paths, bypass_ips, bypass_header)
    }

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

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{refusals, refusals_with, with};

    fn room(keys: &str) -> Vec<String> {
        refusals(&with("room", keys))
    }

    #[test]
    fn bypass_paths_and_addresses_are_checked_one_by_one() {
        assert_eq!(
            room("bypass_paths = [\"/static/\", \"static\"]"),
            [r#"room[0].bypass_paths[1]: "static" must start with /"#]
        );
        assert_eq!(
            room("bypass_ips = [\"10.0.0.0/8\", \"ten\"]"),
            [
                r#"room[0].bypass_ips[1]: "ten" is not an IP address or CIDR block such as "10.0.0.0/8""#
            ]
        );
    }

    /// A room with `keys` in `[room.bypass_header]` and `vars` in the environment.
    fn bypass(keys: &str, vars: &[(&str, &str)]) -> Vec<String> {
        let src = format!("{}[room.bypass_header]\n{keys}\n", with("room", ""));
        refusals_with(&src, vars)
    }

    #[test]
    fn the_bypass_header_is_a_header_name() {
        assert_eq!(
            bypass(
                "name = \"x bypass\"\nvalue_env = \"BYPASS\"",
                &[("BYPASS", "s3cret")]
            ),
            [r#"room[0].bypass_header.name: "x bypass" is not a valid HTTP header name"#]
        );
    }

    #[test]
    fn the_bypass_value_is_set_and_can_match_a_header() {
        let keys = "name = \"x-bypass\"\nvalue_env = \"BYPASS\"";
        let unset = "room[0].bypass_header.value_env: environment variable BYPASS is not set; it holds the bypass header's secret value";
        assert_eq!(bypass(keys, &[]), [unset]);
        assert_eq!(bypass(keys, &[("BYPASS", "")]), [unset]);
        for value in [" s3cret", "s3cret\n", "s3\u{1}cret"] {
            assert_eq!(
                bypass(keys, &[("BYPASS", value)]),
                ["room[0].bypass_header.value_env: the value of BYPASS cannot match any request header: it has surrounding whitespace or characters not allowed in a header value"],
                "{value:?}"
            );
        }
        assert_eq!(
            bypass("name = \"x-bypass\"\nvalue_env = \"1BYPASS\"", &[]),
            [
                r#"room[0].bypass_header.value_env: "1BYPASS" is not an environment variable name (letters, digits and _, not starting with a digit)"#
            ]
        );
    }
}
