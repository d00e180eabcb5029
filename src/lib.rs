//! waitroom: a virtual waiting room that runs as a reverse proxy in front of a
//! website. See `README.md` for operation and `docs/request-phases.md` for the
//! request path.
//!
//! Modules, and what each owns:
//!
//! * [`clock`]: wall-clock time as an injected input.
//! * [`config`]: the TOML file, validated into typed configuration.
//! * [`ticket`]: the sealed ticket cookie (AES-256-GCM, key ring, room binding).
//! * [`store`]: all shared room state behind the `Store` trait; `memory` and
//!   `redis` backends.

#![forbid(unsafe_code)]

pub mod clock;
pub mod config;
pub mod store;
pub mod ticket;
