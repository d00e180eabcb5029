//! STUB: being written.
use super::Config;
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);
pub fn from_toml_str(_s: &str) -> Result<Config, ConfigError> {
    unimplemented!()
}
pub fn load(_p: &std::path::Path) -> Result<Config, ConfigError> {
    unimplemented!()
}
