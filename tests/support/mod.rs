//! Shared pieces of the integration tests: a real fake origin on a loopback
//! port, a config builder, and a daemon started on `127.0.0.1:0`.
#![allow(dead_code)]

pub mod origin;
pub mod raw;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use waitroom::clock::ManualClock;
use waitroom::config::*;
use waitroom::store::{QueueingMethod, RoomState, SharedStore};
use waitroom::{Daemon, Deps};

/// A fixed cookie key for tests.
pub const KEY: [u8; 32] = [7; 32];

/// A realistic "now" for tests (2027-01-15).
pub const T0: u64 = 1_800_000_000_000;

/// A config with one room "shop" on every host at `/`, in front of `origin`.
pub fn config(origin: SocketAddr) -> Config {
    Config {
        server: ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            admin_token: None,
            reserved_prefix: "/__waitroom/".into(),
            trusted_proxies: vec![],
            unmatched: Unmatched::Forward,
            max_connections: 10_000,
            max_connections_per_ip: 10_000,
            max_header_bytes: 16_384,
            header_read_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(5),
            ip_polls_per_second: 50,
            ip_poll_burst: 200,
            ip_arrivals_per_second: 1_000_000,
            ip_arrival_burst: 1_000_000,
            access_log: false,
            workers: 2,
            max_streams_per_connection: 100,
            max_streams_per_ip: 256,
            send_timeout: Duration::from_secs(30),
            request_body_timeout: Duration::from_secs(20),
            request_body_min_rate: 500,
            tunnel_idle_timeout: Duration::from_secs(120),
            unmatched_upgrades: false,
            allow_path_colons: false,
        },
        store: StoreConfig {
            backend: Backend::Memory,
            timeout: Duration::from_millis(500),
            unreachable_after: Duration::from_secs(1),
            fail_mode: FailMode::Open,
            instances: 1,
            tls_ca: None,
            replica_acks: 0,
            replica_ack_timeout: Duration::from_millis(250),
        },
        cookie: CookieConfig {
            keys: vec![Secret32(KEY)],
            secure: false,
            bind_to_client: false,
            max_networks_per_session: 4,
            same_site: SameSite::Lax,
            partitioned: false,
            domain: None,
        },
        reports: ReportsConfig {
            retention: Duration::from_secs(30 * 24 * 3600),
        },
        origin: OriginConfig {
            url: format!("http://{origin}").parse().unwrap(),
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            sign_key: None,
            max_connections: 512,
            ca_file: None,
            client_cert: None,
        },
        rooms: vec![room("shop", "/")],
        region: None,
        tls: None,
        webhooks: Vec::new(),
    }
}

pub fn room(id: &str, path: &str) -> RoomConfig {
    RoomConfig {
        id: id.into(),
        name: format!("The {id} room"),
        host: None,
        path: path.into(),
        total_active_users: 5,
        new_users_per_minute: 0,
        session_duration: Duration::from_secs(60),
        session_renewal: true,
        queueing_method: QueueingMethod::Fifo,
        max_queue_length: 0,
        sessions_per_item: 1.0,
        show_stock: false,
        refresh_interval: Duration::from_secs(5),
        abandon_after: Duration::from_secs(60),
        queue_status_code: http::StatusCode::OK,
        json_response: true,
        template: None,
        bypass_paths: vec!["/static/".into()],
        bypass_ips: vec![],
        bypass_header: None,
        end_session_paths: vec![],
        case_insensitive_paths: false,
        bypass_upgrades: false,
        proof_of_work: 0,
        bot_score: None,
        failed_challenge: FailedChallenge::Retry,
        captcha: None,
        enqueue_token: None,
        lanes: Vec::new(),
        lanes_only_until_ms: 0,
        state: RoomState::Open,
        language: Language::Auto,
        events: vec![],
        autotune: None,
        origin: None,
    }
}

/// A daemon on loopback with a manual clock (starting at `T0`).
pub struct Harness {
    pub daemon: Daemon,
    pub clock: ManualClock,
    pub origin: origin::Origin,
    /// The admin API's token, when the config has one.
    admin_token: Option<String>,
}

impl Harness {
    pub async fn start(tweak: impl FnOnce(&mut Config)) -> Self {
        Self::start_with_store(tweak, None).await
    }

    pub async fn start_with_store(
        tweak: impl FnOnce(&mut Config),
        store: Option<SharedStore>,
    ) -> Self {
        let origin = origin::Origin::start().await;
        Self::start_full(tweak, store, origin, ManualClock::new(T0)).await
    }

    /// A daemon in front of an existing origin, on an existing clock (a
    /// restart of the daemon).
    pub async fn start_on(
        tweak: impl FnOnce(&mut Config),
        origin: origin::Origin,
        clock: ManualClock,
    ) -> Self {
        Self::start_full(tweak, None, origin, clock).await
    }

    async fn start_full(
        tweak: impl FnOnce(&mut Config),
        store: Option<SharedStore>,
        origin: origin::Origin,
        clock: ManualClock,
    ) -> Self {
        let mut cfg = config(origin.addr);
        tweak(&mut cfg);
        let daemon = Daemon::start(
            &cfg,
            Deps {
                store,
                clock: Some(Arc::new(clock.clone())),
                config_path: None,
            },
        )
        .await
        .expect("daemon starts");
        Self {
            daemon,
            clock,
            origin,
            admin_token: cfg.server.admin_token.map(|t| t.0),
        }
    }

    /// An admin API request to `path`, with the token when there is one.
    fn admin(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.bare().request(method, self.admin_url(path));
        match &self.admin_token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// `GET path` on the admin API, as the operator.
    pub async fn admin_get(&self, path: &str) -> reqwest::Response {
        self.admin(reqwest::Method::GET, path).send().await.unwrap()
    }

    /// `POST /api/rooms/shop/release` of `visitor`, as the operator; it
    /// must have been released.
    pub async fn release_ok(&self, visitor: waitroom::store::VisitorId) {
        let body = serde_json::json!({ "visitor": visitor.to_hex() });
        let req = self.admin(reqwest::Method::POST, "/api/rooms/shop/release");
        let resp = req.json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let answer: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(answer["released"], true, "{visitor}");
    }

    /// `PATCH /api/rooms/{room}` with `body`, as the operator.
    pub async fn patch_room(&self, room: &str, body: serde_json::Value) -> reqwest::Response {
        let path = format!("/api/rooms/{room}");
        let req = self.admin(reqwest::Method::PATCH, &path).json(&body);
        req.send().await.unwrap()
    }

    /// The same, which must be taken (200).
    pub async fn patch_room_ok(&self, room: &str, body: serde_json::Value) {
        let resp = self.patch_room(room, body).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    }

    /// `room` as the admin API shows it.
    pub async fn room_json(&self, room: &str) -> serde_json::Value {
        let req = self.admin(reqwest::Method::GET, &format!("/api/rooms/{room}"));
        req.send().await.unwrap().json().await.unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.daemon.addr, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.daemon.admin_addr, path)
    }

    pub fn clock_now(&self) -> u64 {
        use waitroom::clock::Clock;
        self.clock.now_ms()
    }

    /// The visitor's standing, as the queue page's script polls it.
    pub async fn status(&self, visitor: &reqwest::Client) -> serde_json::Value {
        let resp = visitor
            .get(self.url("/__waitroom/status?room=shop"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.json().await.unwrap()
    }

    /// The admin listener's `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.bare()
            .get(self.admin_url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// A GET of `path` with these headers and no cookie jar: its status,
    /// the shop room's ticket cookie it sets (the value), and its body.
    pub async fn page(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (u16, Option<String>, String) {
        let mut req = self.bare().get(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.unwrap();
        let cookie = set_cookie(&resp, "waitroom_shop");
        (resp.status().as_u16(), cookie, resp.text().await.unwrap())
    }

    /// The first room's sessions and queue places, as the store counts them.
    pub async fn counts(&self) -> (u64, u64) {
        let stats = self
            .store()
            .stats(&self.policy(), self.clock_now())
            .await
            .unwrap();
        (stats.active, stats.queued)
    }

    /// The daemon's store.
    pub fn store(&self) -> SharedStore {
        self.daemon.gate().store.shared().clone()
    }

    /// The policy in force for the first room.
    pub fn policy(&self) -> waitroom::store::RoomPolicy {
        (*self.daemon.gate().rooms.all()[0].policy()).clone()
    }

    /// A client that keeps its own cookies, like one browser.
    pub fn visitor(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    /// A client without cookies.
    pub fn bare(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }
}

/// The value of the `name` cookie in a response's `Set-Cookie` headers.
pub fn set_cookie(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .filter_map(|kv| kv.split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_owned())
}

/// The visitor id the origin received, from the fake origin's echo.
pub async fn admitted_id(resp: reqwest::Response) -> waitroom::store::VisitorId {
    assert!(from_origin(&resp), "not admitted: {}", resp.status());
    let echo: serde_json::Value = resp.json().await.unwrap();
    let hex = echo["headers"]["x-waitroom-visitor"][0].as_str().unwrap();
    waitroom::store::VisitorId::from_hex(hex).unwrap()
}

/// The fields (and no others) of the JSON a queued app is answered with.
pub fn assert_queued_json(body: &serde_json::Value) {
    let keys: Vec<&str> = body
        .as_object()
        .expect("a JSON object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "eta_seconds",
            "position",
            "queue_length",
            "refresh_seconds",
            "room",
            "state"
        ]
    );
}

/// Whether a response is the origin's (and not the daemon's queue page).
pub fn from_origin(resp: &reqwest::Response) -> bool {
    resp.headers().contains_key("x-origin")
}

/// A small deterministic generator, so a run is the same every time.
pub struct Lcg(pub u64);

impl Lcg {
    /// The next number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lo + (self.0 >> 33) % (hi - lo + 1)
    }
}
