//! Bounds every value must keep, whether it comes from the config file or an
//! operator's runtime change: the admin API holds changes to the same
//! limits the file is checked against.

use std::time::Duration;

/// Longest accepted duration. Other modules add durations to millisecond
/// timestamps; a cap keeps that arithmetic far from overflow.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// `MAX_DURATION` as operators write it.
pub(crate) const MAX_DURATION_TEXT: &str = "365d";

/// Shortest session.
pub(crate) const MIN_SESSION: Duration = Duration::from_secs(1);

/// Largest `total_active_users` or `new_users_per_minute`: far beyond any
/// room, and far below 2^53, so Lua's numbers in the Redis scripts count it
/// exactly.
pub(crate) const MAX_LIMIT: u64 = 1_000_000_000;
