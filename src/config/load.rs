//! Loading a configuration: the entry points (`load`, `from_toml_str`…),
//! and the errors they give, each naming its key. Parsing happens in two
//! steps so every error can name its key: the text is parsed into toml's
//! spanned tree, the raw structs (`raw`) are deserialized from that tree and
//! any serde error's span is mapped back to a key path (`keypath`); then
//! `check` validates every value.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::de::DeTable;

use super::check::Checker;
use super::keypath::{deserialize_error, syntax_error};
use super::raw::RawConfig;
use super::Config;

/// Choices the caller makes about what a valid configuration needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Accept a configuration with no cookie keys; the caller then supplies
    /// one (the `demo` command generates an ephemeral key).
    pub allow_missing_keys: bool,
}

/// One thing wrong with a configuration, named by its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Full key path, e.g. `room[1].session_duration` (arrays count from 0).
    pub key: String,
    /// Where the key (or, when absent, its enclosing table) is in the file.
    pub location: Option<Location>,
    /// What is wrong and what is allowed.
    pub message: String,
}

/// A 1-based line and column in the TOML text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)?;
        if let Some(at) = self.location {
            write!(f, " (line {}, column {})", at.line, at.column)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The text is not valid TOML.
    #[error("TOML syntax error at line {line}, column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    /// Unknown or missing keys, or bad values; never empty.
    #[error("{}", ProblemList(.0))]
    Invalid(Vec<Problem>),
}

impl ConfigError {
    /// The individual problems (empty for read and syntax errors).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(problems) => problems,
            _ => &[],
        }
    }
}

struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [one] => write!(f, "{one}"),
            many => {
                write!(f, "{} problems in the configuration:", many.len())?;
                for p in many {
                    write!(f, "\n  {p}")?;
                }
                Ok(())
            }
        }
    }
}

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
