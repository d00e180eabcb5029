//! What loading a configuration can refuse, each problem named by its key
//! and place, and the caller's choices about what a valid one needs. The
//! other parts of `config` (`load`, `check`, `keypath`) use these and
//! nothing of each other's but what their names say.

use std::fmt;
use std::path::PathBuf;

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
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
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
        /// The file named.
        path: PathBuf,
        /// What reading it failed with.
        source: std::io::Error,
    },
    /// The text is not valid TOML.
    #[error("TOML syntax error at line {line}, column {column}: {message}")]
    Syntax {
        /// Line of the error, from 1.
        line: usize,
        /// Column of the error, from 1.
        column: usize,
        /// The TOML parser's description.
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
