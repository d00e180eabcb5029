//! waitroom: a virtual waiting room that runs as a reverse proxy in front of a
//! website. Visitors within the configured limits pass straight through; the
//! overflow waits on a queue page, in arrival order, and is let in as room
//! frees up. See `README.md` for operation and `docs/request-phases.md` for
//! the request path.
//!
//! Modules, and what each owns:
//!
//! * [`server`]: listeners, connection limits, lifecycle (`Daemon`, `run`).
//! * [`admin`]: the operator's API, metrics, history and dashboard.
//! * [`gate`]: the admission phases of every visitor request (route, bypass,
//!   ticket, respond), rooms and the ETA.
//! * [`proxy`]: forwarding to the origin (pooled client, streaming, headers,
//!   upgrades, time limits).
//! * [`queue_page`]: the queue page template, status JSON and message pages.
//! * [`ticket`]: the sealed ticket cookie (AES-256-GCM, key ring, room binding).
//! * [`store`]: all shared room state behind the `Store` trait; `memory` and
//!   `redis` backends.
//! * [`config`]: the TOML file, validated into typed configuration.
//! * [`clock`]: wall-clock time as an injected input.
//! * [`demo`]: a tiny origin for the demo command and for trying things out.
//! * [`body`]: the body type shared by every response.

#![forbid(unsafe_code)]

pub mod admin;
pub mod body;
pub mod canonical;
pub mod clock;
pub mod config;
pub mod demo;
pub mod gate;
pub mod proxy;
pub mod queue_page;
pub mod respond;
pub mod secret;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod ticket;

pub use server::{run, Daemon, Deps};
