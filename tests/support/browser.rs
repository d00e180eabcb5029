//! A real headless Chromium driven over WebDriver (chromedriver on a free
//! loopback port, a fresh profile per browser).
#![allow(dead_code)]

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    /// Stops chromedriver and every Chromium process it started: they share
    /// chromedriver's process group, so the browser cannot outlive the test.
    fn drop(&mut self) {
        // `-s KILL -- -PGID`: the `--` keeps the negative group id from
        // being read as an option.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.driver.id())])
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

pub struct Options {
    pub javascript: bool,
    pub width: u32,
    pub height: u32,
    /// The browser's language list (its `Accept-Language`); `None`: Chromium's default.
    pub accept_language: Option<&'static str>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            javascript: true,
            width: 1280,
            height: 800,
            accept_language: None,
        }
    }
}

impl Browser {
    pub async fn start(opts: Options) -> Self {
        for path in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(path).exists(),
                "{path} is missing: install Debian's chromium and chromium-driver (scripts/test does)"
            );
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let profile = tempfile::tempdir().unwrap();
        let mut chrome = serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                format!("--window-size={},{}", opts.width, opts.height),
                format!("--user-data-dir={}", profile.path().display()),
            ],
        });
        // Headless windows cannot be narrower than 500 px; emulate a phone instead.
        if opts.width < 500 {
            chrome["mobileEmulation"] = serde_json::json!({
                "deviceMetrics": {"width": opts.width, "height": opts.height, "pixelRatio": 2.0, "mobile": true, "touch": true}
            });
        }
        let mut prefs = serde_json::Map::new();
        if !opts.javascript {
            prefs.insert(
                "profile.managed_default_content_settings.javascript".into(),
                2.into(),
            );
        }
        if let Some(languages) = opts.accept_language {
            prefs.insert("intl.accept_languages".into(), languages.into());
        }
        if !prefs.is_empty() {
            chrome["prefs"] = prefs.into();
        }
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), chrome);
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) => {
                    assert!(Instant::now() < deadline, "chromedriver did not start: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        Self {
            client,
            driver,
            _profile: profile,
        }
    }

    /// Evaluates a JS expression and returns its JSON value.
    pub async fn eval(&self, expr: &str) -> serde_json::Value {
        self.client
            .execute(&format!("return {expr};"), vec![])
            .await
            .unwrap()
    }

    /// Text of the element with this id ("" if missing).
    pub async fn text_of(&self, id: &str) -> String {
        let v = self
            .eval(&format!(
                "(document.getElementById('{id}') || {{}}).textContent || ''"
            ))
            .await;
        v.as_str().unwrap_or("").trim().to_owned()
    }

    /// Waits (bounded) until `expr` is true in the page.
    pub async fn wait_until(&self, expr: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            // The page may be between documents during a reload.
            if let Ok(v) = self
                .client
                .execute(&format!("return !!({expr});"), vec![])
                .await
            {
                if v == serde_json::Value::Bool(true) {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "timed out waiting for: {expr}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
