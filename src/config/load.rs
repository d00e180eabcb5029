//! Loading a configuration: the entry points (`load`, `from_toml_str`…);
//! the errors they give, each naming its key, are `error`'s. Parsing happens in two
//! steps so every error can name its key: the text is parsed into toml's
//! spanned tree, the raw structs (`raw`) are deserialized from that tree and
//! any serde error's span is mapped back to a key path (`keypath`); then
//! `check` validates every value.

use std::path::Path;

use serde::Deserialize;
use toml::de::DeTable;

use super::check::Checker;
use super::error::{ConfigError, LoadOptions};
use super::keypath::{deserialize_error, syntax_error};
use super::raw::RawConfig;
use super::Config;

/// Reads an environment variable the way the daemon does in production.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Parses and validates a configuration, reading secrets from the process environment.
pub fn from_toml_str(src: &str) -> Result<Config, ConfigError> {
    from_toml_str_with(src, LoadOptions::default(), &process_env)
}

/// As [`from_toml_str`], reading secrets through `env` (tests inject their own).
pub fn from_toml_str_with_env(
    src: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    from_toml_str_with(src, LoadOptions::default(), env)
}

/// Parses and validates a configuration with explicit options and environment.
pub fn from_toml_str_with(
    src: &str,
    options: LoadOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let tree = DeTable::parse(src).map_err(|e| syntax_error(src, &e))?;
    let raw = RawConfig::deserialize(toml::de::Deserializer::from(tree.clone()))
        .map_err(|e| deserialize_error(src, tree.get_ref(), &e))?;
    let mut checker = Checker {
        src,
        tree: tree.get_ref(),
        env,
        problems: Vec::new(),
    };
    let config = checker.config(raw, options);
    if checker.problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(checker.problems))
    }
}

/// Reads, parses and validates the file at `path`, with secrets from the process environment.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, LoadOptions::default(), &process_env)
}

/// As [`load`], with explicit options and environment.
pub fn load_with(
    path: &Path,
    options: LoadOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let src = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    from_toml_str_with(&src, options, env)
}

/// The unit tests' config: one room `shop` on `/` with this capacity and
/// 60 newcomers a minute, in front of a local origin; `store` is the
/// `[store]` section's body.
#[cfg(test)]
pub(crate) fn shop(total_active_users: u64, store: &str) -> Config {
    from_toml_str(&format!(
        r#"
        [store]
        {store}
        [cookie]
        keys = ["__________________________________________8"]
        [origin]
        url = "http://127.0.0.1:3000"
        [[room]]
        id = "shop"
        path = "/"
        total_active_users = {total_active_users}
        new_users_per_minute = 60
        "#
    ))
    .expect("the test config is valid")
}
