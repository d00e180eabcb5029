//! waitroom: a virtual waiting room that runs as a reverse proxy in front of a
//! website. Visitors within the configured limits pass straight through; the
//! overflow waits on a queue page, in arrival order, and is let in as room
//! frees up. See `docs/operating.md` for operation, `docs/request-phases.md`
//! for the request path and `docs/invariants.md` for the invariants I1–I6
//! the code cites.
//!
//! Modules, and what each owns (each depends only on those listed after
//! it; `tests/layering.rs` holds the code to this order):
//!
//! * [`simulate`]: a flash crowd run against the real store and ETA on a
//!   virtual clock, with its summary and chart (`waitroom simulate`).
//! * `server`: listeners and lifecycle ([`Daemon`], [`run`]); `worker`: one
//!   thread per core with its own listeners (plain and TLS), connections
//!   and origin pool; `conn`: connection caps and the first-byte timeout;
//!   `redirect`: plain HTTP sent to https.
//! * [`region`]: region mode: the global store's client, the per-region
//!   sync of grants and the Anywhere pool (`docs/regions.md`).
//! * `admin`: the operator's API and dashboard on the admin listener.
//! * [`gate`]: the request path, phase by phase (canonical, route, bypass,
//!   ticket, respond): rooms, the store guard, tickets, pages, limits, ETA;
//!   decision mode, room upkeep and operator actions beside it.
//! * [`proxy`]: forwarding to the origin (per-worker pools, header
//!   rewriting, streaming, upgrades, time limits).
//! * [`telemetry`]: metrics and history (written by the gate, read by admin).
//! * [`ticket`]: the sealed ticket cookie (AES-256-GCM, key ring, room binding).
//! * [`store`]: all shared room state behind the `Store` trait; `memory` and
//!   `redis` backends.
//! * [`config`]: the TOML file, validated into typed configuration.
//! * [`webhook`]: `[[webhook]]`: happenings POSTed, signed and retried,
//!   through bounded buffers that never block the caller.
//! * [`tls`]: certificates (PEM loading, SNI choice, reload), the rustls
//!   configuration of the TLS listener and its `[tls]` settings.
//! * `respond`: building the daemon's own responses.
//! * [`queue_page`]: the queue page template, status JSON and message pages.
//! * [`i18n`]: the shipped translations and the visitor's language.
//! * [`canonical`]: the one spelling of a request's path and host.
//! * [`secret`]: secrets, cookie keys, constant-time comparison.
//! * [`enqueue`]: enqueue tokens (compact JWTs a site signs for its users)
//!   and the keys that verify them.
//! * `outbound`: the HTTP connector for what the daemon calls out to.
//! * [`domain`]: the words every layer shares: visitor ids, room policies,
//!   queueing methods, states, events, runtime changes, proof challenges.
//! * [`clock`]: wall-clock time as an injected input.
//! * [`demo`]: a tiny origin for the demo command and for trying things out.
//! * [`body`]: the body type shared by every response.

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod admin;
pub mod body;
pub mod canonical;
pub mod clock;
pub mod config;
pub mod demo;
pub mod domain;
pub mod enqueue;
pub mod gate;
pub mod i18n;
mod outbound;
pub mod proxy;
pub mod queue_page;
pub mod region;
mod respond;
pub mod secret;
mod server;
pub mod simulate;
pub mod store;
pub mod telemetry;
pub mod ticket;
pub mod tls;
pub mod webhook;

pub use server::{run, Daemon, Deps};
