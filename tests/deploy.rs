//! The packaging under deploy/ holds together.
//!
//! Kubernetes: each kustomization (as `kubectl apply -k` builds it) runs a
//! config the daemon's own loader accepts with the secrets its Secret
//! gives, refuses to start on the Secret's placeholders, probes the paths
//! and port that config serves, selects its own pods, runs them
//! unprivileged on a read-only root, and gives a drain its time.
//! The image: its user and paths agree with the manifests. systemd: the
//! unit is valid, hardened (`systemd-analyze security` exposure at most
//! 2.0), and its env file names what the example config reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize as _;
use serde_yaml_ng::Value;
use waitroom::config::{self, Backend, Config};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every document of a YAML file.
fn documents(path: &Path) -> Vec<Value> {
    let text = read(path);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The value at a dotted path (`spec.template.spec`); panics naming the
/// path when it is missing.
fn get<'a>(value: &'a Value, path: &str) -> &'a Value {
    opt(value, path).unwrap_or_else(|| panic!("`{path}` missing in {}", describe(value)))
}

/// The value at a dotted path, if there is one.
fn opt<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |v, key| v.get(key))
        .filter(|v| !v.is_null())
}

fn str_at<'a>(value: &'a Value, path: &str) -> &'a str {
    get(value, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string in {}", describe(value)))
}

fn list<'a>(value: &'a Value, path: &str) -> &'a [Value] {
    opt(value, path).map_or(&[], |v| {
        v.as_sequence()
            .unwrap_or_else(|| panic!("`{path}` is not a list in {}", describe(value)))
    })
}

fn kind(resource: &Value) -> &str {
    str_at(resource, "kind")
}

fn name(resource: &Value) -> &str {
    str_at(resource, "metadata.name")
}

fn describe(value: &Value) -> String {
    match (opt(value, "kind"), opt(value, "metadata.name")) {
        (Some(k), Some(n)) => format!(
            "{} {}",
            k.as_str().unwrap_or("?"),
            n.as_str().unwrap_or("?")
        ),
        _ => serde_yaml_ng::to_string(value)
            .unwrap_or_default()
            .chars()
            .take(200)
            .collect(),
    }
}

/// The resources `kubectl kustomize <dir>` makes, for the features the
/// shipped kustomizations use: `resources` (files and directories),
/// `patches` by path (strategic merge of maps, such as a ConfigMap's or a
/// Secret's keys) and `replicas`. Anything else is refused, so that this
/// cannot quietly build something other than what kubectl builds.
fn kustomize(dir: &Path) -> Vec<Value> {
    let file = dir.join("kustomization.yaml");
    let k = documents(&file).remove(0);
    let at = file.display();
    for key in k.as_mapping().expect("a kustomization is a map").keys() {
        let key = key.as_str().unwrap_or_default();
        assert!(
            ["apiVersion", "kind", "resources", "patches", "replicas"].contains(&key),
            "{at}: `{key}` is not modelled by this test's kustomize; teach it, or build without it"
        );
    }
    let mut out = Vec::new();
    for resource in list(&k, "resources") {
        let path = dir.join(resource.as_str().expect("a resource is a path"));
        if path.is_dir() {
            out.extend(kustomize(&path));
        } else {
            out.extend(documents(&path));
        }
    }
    for patch in list(&k, "patches") {
        assert_eq!(
            patch.as_mapping().map(|m| m.len()),
            Some(1),
            "{at}: only `- path: file` patches are modelled"
        );
        let path = dir.join(str_at(patch, "path"));
        for doc in documents(&path) {
            let target = out
                .iter_mut()
                .find(|r| kind(r) == kind(&doc) && name(r) == name(&doc))
                .unwrap_or_else(|| panic!("{}: patches nothing", path.display()));
            merge(target, &doc, &path.display().to_string());
        }
    }
    for replicas in list(&k, "replicas") {
        let target = out
            .iter_mut()
            .find(|r| kind(r) == "Deployment" && name(r) == str_at(replicas, "name"))
            .unwrap_or_else(|| panic!("{at}: replicas of no Deployment"));
        target["spec"]["replicas"] = get(replicas, "count").clone();
    }
    out
}

/// A strategic merge patch of maps: keys of `patch` replace or extend
/// those of `into`. A list in a patch is refused (kubectl merges lists of
/// some fields by key, which this does not model).
fn merge(into: &mut Value, patch: &Value, at: &str) {
    match (into, patch) {
        (_, Value::Sequence(_)) => panic!("{at}: a list in a patch is not modelled"),
        (Value::Mapping(into), Value::Mapping(patch)) => {
            for (key, value) in patch {
                match into.get_mut(key) {
                    Some(slot) => merge(slot, value, at),
                    None => {
                        into.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (slot, value) => *slot = value.clone(),
    }
}

/// One kustomization under deploy/kubernetes, built.
struct Variant {
    dir: &'static str,
    resources: Vec<Value>,
}

fn variants() -> Vec<Variant> {
    ["base", "redis"]
        .into_iter()
        .map(|dir| Variant {
            dir,
            resources: kustomize(&root().join("deploy/kubernetes").join(dir)),
        })
        .collect()
}

impl Variant {
    fn find(&self, kind_: &str, name_: &str) -> &Value {
        self.resources
            .iter()
            .find(|r| kind(r) == kind_ && name(r) == name_)
            .unwrap_or_else(|| panic!("{}: no {kind_} {name_}", self.dir))
    }

    fn all(&self, kind_: &str) -> Vec<&Value> {
        self.resources.iter().filter(|r| kind(r) == kind_).collect()
    }

    fn deployment(&self) -> &Value {
        self.find("Deployment", "waitroom")
    }

    fn container(&self) -> &Value {
        list(self.deployment(), "spec.template.spec.containers")
            .iter()
            .find(|c| str_at(c, "name") == "waitroom")
            .unwrap_or_else(|| panic!("{}: no container waitroom", self.dir))
    }

    /// The path the container's `--config` names.
    fn config_path(&self) -> String {
        let args: Vec<&str> = list(self.container(), "args")
            .iter()
            .map(|a| a.as_str().expect("args are strings"))
            .collect();
        let i = args
            .iter()
            .position(|a| *a == "--config" || *a == "-c")
            .unwrap_or_else(|| panic!("{}: the container's args name no --config", self.dir));
        args[i + 1].to_owned()
    }

    /// The config file's text: the key of the ConfigMap whose volume is
    /// mounted where `--config` points.
    fn config_text(&self) -> String {
        let path = PathBuf::from(self.config_path());
        let (dir, file) = (path.parent().unwrap(), path.file_name().unwrap());
        let mount = list(self.container(), "volumeMounts")
            .iter()
            .find(|m| Path::new(str_at(m, "mountPath")) == dir)
            .unwrap_or_else(|| panic!("{}: nothing is mounted at {}", self.dir, dir.display()));
        let volume = list(self.deployment(), "spec.template.spec.volumes")
            .iter()
            .find(|v| str_at(v, "name") == str_at(mount, "name"))
            .expect("the mount's volume");
        let map = self.find("ConfigMap", str_at(volume, "configMap.name"));
        let key = file.to_str().unwrap();
        get(map, "data")
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{}: the ConfigMap has no key {key}", self.dir))
            .to_owned()
    }

    /// The environment the Secret gives the container: every key of each
    /// `envFrom` Secret, and each `env` entry from a Secret.
    fn secret_env(&self) -> BTreeMap<String, String> {
        let container = self.container();
        let mut env = BTreeMap::new();
        for from in list(container, "envFrom") {
            if let Some(secret) = opt(from, "secretRef.name") {
                env.extend(self.secret(secret.as_str().unwrap()));
            }
        }
        for var in list(container, "env") {
            if let Some(key) = opt(var, "valueFrom.secretKeyRef") {
                let values = self.secret(str_at(key, "name"));
                let value = values.get(str_at(key, "key")).cloned().unwrap_or_default();
                env.insert(str_at(var, "name").to_owned(), value);
            }
        }
        env
    }

    fn secret(&self, name_: &str) -> BTreeMap<String, String> {
        let secret = self.find("Secret", name_);
        let mut values = BTreeMap::new();
        if let Some(data) = opt(secret, "data").and_then(Value::as_mapping) {
            for (k, v) in data {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap_or_default())
                    .expect("Secret data is base64");
                values.insert(
                    k.as_str().unwrap().to_owned(),
                    String::from_utf8(bytes).unwrap(),
                );
            }
        }
        if let Some(data) = opt(secret, "stringData").and_then(Value::as_mapping) {
            for (k, v) in data {
                values.insert(
                    k.as_str().unwrap().to_owned(),
                    v.as_str().unwrap_or_default().to_owned(),
                );
            }
        }
        values
    }

    /// The config as the daemon loads it, with `env` as its environment.
    fn load(&self, env: &BTreeMap<String, String>) -> Result<Config, config::ConfigError> {
        config::from_toml_str_with_env(&self.config_text(), &|name| env.get(name).cloned())
    }

    /// Real values in place of the Secret's placeholders: a fresh key for
    /// the cookie keys, a token for anything else.
    fn stand_ins(&self) -> BTreeMap<String, String> {
        let table: toml::Table = self.config_text().parse().expect("TOML");
        let cookie_var = table
            .get("cookie")
            .and_then(|c| c.get("keys_env"))
            .and_then(|v| v.as_str())
            .unwrap_or("WAITROOM_COOKIE_KEYS")
            .to_owned();
        self.secret_env()
            .into_keys()
            .map(|name| {
                let value = if name == cookie_var {
                    waitroom::secret::generate_key()
                } else {
                    format!("stand-in-{}", waitroom::secret::generate_key())
                };
                (name, value)
            })
            .collect()
    }

    /// The config as it runs with real secrets.
    fn config(&self) -> Config {
        self.load(&self.stand_ins()).unwrap_or_else(|e| {
            panic!(
                "{}: the ConfigMap's waitroom.toml is refused with the Secret's variables set: {e}",
                self.dir
            )
        })
    }

    /// The Deployment's replicas (1 when unsaid).
    fn replicas(&self) -> u64 {
        opt(self.deployment(), "spec.replicas").map_or(1, |r| r.as_u64().unwrap())
    }

    /// The labels of the pods of every Deployment, by Deployment.
    fn pod_labels(&self) -> Vec<(&str, &Value)> {
        self.all("Deployment")
            .into_iter()
            .map(|d| (name(d), get(d, "spec.template.metadata.labels")))
            .collect()
    }
}

/// Whether every label of `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_mapping().expect("a selector is a map");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The number a container port (a number or a port's name) stands for.
fn port_number(container: &Value, port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    let port_name = port.as_str().expect("a port is a number or a name");
    list(container, "ports")
        .iter()
        .find(|p| opt(p, "name").and_then(Value::as_str) == Some(port_name))
        .and_then(|p| get(p, "containerPort").as_u64())
        .unwrap_or_else(|| panic!("the container has no port named {port_name}"))
}

#[test]
fn the_config_map_passes_the_daemons_own_checks() {
    for v in variants() {
        let config = v.config();
        assert!(!config.cookie.keys.is_empty(), "{}: no cookie keys", v.dir);
        // The daemon refuses to start an admin listener off loopback
        // without a token: the Secret must give it.
        if !config.server.admin_listen.ip().is_loopback() {
            assert!(
                config.server.admin_token.is_some(),
                "{}: admin_listen {} is off loopback but the Secret gives no admin token",
                v.dir,
                config.server.admin_listen
            );
        }
    }
}

#[test]
fn every_placeholder_of_the_secrets_stops_the_daemon() {
    for v in variants() {
        let placeholders = v.secret_env();
        assert!(
            placeholders.len() >= 2,
            "{}: the Secret gives only {placeholders:?}",
            v.dir
        );
        for (var, placeholder) in &placeholders {
            let mut env = v.stand_ins();
            env.insert(var.clone(), placeholder.clone());
            let starts = match v.load(&env) {
                Err(_) => false,
                Ok(c) => c.server.admin_listen.ip().is_loopback() || c.server.admin_token.is_some(),
            };
            assert!(
                !starts,
                "{}: with the Secret's placeholder {var}={placeholder:?} the daemon would start",
                v.dir
            );
        }
    }
}

#[test]
fn the_probes_ask_the_listener_the_config_opens() {
    for v in variants() {
        let config = v.config();
        let server = &config.server;
        let container = v.container();
        assert!(
            server.listen.ip().is_unspecified(),
            "{}: listen {} is not reachable from the kubelet or the Service",
            v.dir,
            server.listen
        );
        for (probe, what) in [("readinessProbe", "ready"), ("livenessProbe", "health")] {
            let probe = get(container, probe);
            assert_eq!(
                str_at(probe, "httpGet.path"),
                format!("{}{what}", server.reserved_prefix),
                "{}: the {what} probe's path",
                v.dir
            );
            assert_eq!(
                port_number(container, get(probe, "httpGet.port")),
                u64::from(server.listen.port()),
                "{}: the {what} probe's port is not server.listen's",
                v.dir
            );
            assert!(opt(probe, "httpGet.scheme").is_none_or(|s| s.as_str() == Some("HTTP")));
        }
        let service = v.find("Service", "waitroom");
        for port in list(service, "spec.ports") {
            assert_eq!(
                port_number(container, get(port, "targetPort")),
                u64::from(server.listen.port()),
                "{}: the Service sends visitors to another port than server.listen",
                v.dir
            );
        }
        let declared: Vec<u64> = list(container, "ports")
            .iter()
            .map(|p| get(p, "containerPort").as_u64().unwrap())
            .collect();
        assert!(declared.contains(&u64::from(server.listen.port())));
        if !server.admin_listen.ip().is_loopback() {
            assert!(
                declared.contains(&u64::from(server.admin_listen.port())),
                "{}: the admin port {} is not declared",
                v.dir,
                server.admin_listen.port()
            );
        }
    }
}

#[test]
fn the_selectors_pick_their_own_pods_and_no_others() {
    for v in variants() {
        let pods = v.pod_labels();
        for deployment in v.all("Deployment") {
            assert!(
                selects(
                    get(deployment, "spec.selector.matchLabels"),
                    get(deployment, "spec.template.metadata.labels")
                ),
                "{}: Deployment {} does not select its own pods",
                v.dir,
                name(deployment)
            );
        }
        // Each Service and PodDisruptionBudget is named after the
        // Deployment whose pods it means, and picks those alone.
        let mut selectors: Vec<(&Value, &Value)> = v
            .all("Service")
            .into_iter()
            .map(|s| (s, get(s, "spec.selector")))
            .collect();
        selectors.extend(
            v.all("PodDisruptionBudget")
                .into_iter()
                .map(|p| (p, get(p, "spec.selector.matchLabels"))),
        );
        for (owner, selector) in selectors {
            let chosen: Vec<&str> = pods
                .iter()
                .filter(|(_, labels)| selects(selector, labels))
                .map(|(d, _)| *d)
                .collect();
            assert_eq!(
                chosen,
                [name(owner)],
                "{}: the selector of {} picks the pods of Deployments {chosen:?}",
                v.dir,
                describe(owner)
            );
        }
        assert_eq!(v.all("PodDisruptionBudget").len(), 1, "{}", v.dir);
    }
}

#[test]
fn the_pods_run_unprivileged_on_a_read_only_root() {
    let image_user = containerfile("USER");
    let image_uid: u64 = image_user.split(':').next().unwrap().parse().unwrap();
    assert_ne!(image_uid, 0, "the image runs as root");
    for v in variants() {
        for deployment in v.all("Deployment") {
            let pod = get(deployment, "spec.template.spec");
            let who = format!("{}: Deployment {}", v.dir, name(deployment));
            assert_eq!(
                opt(pod, "automountServiceAccountToken").and_then(Value::as_bool),
                Some(false),
                "{who}: mounts a service account token it has no use for"
            );
            for container in list(pod, "containers") {
                // A container's own securityContext wins over the pod's.
                let setting = |key: &str| {
                    opt(container, &format!("securityContext.{key}"))
                        .or_else(|| opt(pod, &format!("securityContext.{key}")))
                };
                let who = format!("{who}, container {}", str_at(container, "name"));
                assert_eq!(
                    setting("runAsNonRoot").and_then(Value::as_bool),
                    Some(true),
                    "{who}: runAsNonRoot"
                );
                let uid = setting("runAsUser").and_then(Value::as_u64);
                assert!(uid.is_some_and(|u| u != 0), "{who}: runAsUser {uid:?}");
                let own = |key: &str| opt(container, &format!("securityContext.{key}"));
                assert_eq!(
                    own("readOnlyRootFilesystem").and_then(Value::as_bool),
                    Some(true),
                    "{who}: the root file system is writable"
                );
                assert_eq!(
                    own("allowPrivilegeEscalation").and_then(Value::as_bool),
                    Some(false),
                    "{who}: allowPrivilegeEscalation"
                );
                assert!(
                    own("privileged").and_then(Value::as_bool) != Some(true),
                    "{who}: privileged"
                );
                let drop: Vec<&str> = own("capabilities.drop")
                    .and_then(Value::as_sequence)
                    .map(|d| d.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                assert!(drop.contains(&"ALL"), "{who}: capabilities not all dropped");
                assert!(
                    own("capabilities.add").is_none(),
                    "{who}: capabilities added"
                );
                if str_at(container, "name") == "waitroom" {
                    assert_eq!(uid, Some(image_uid), "{who}: not the image's user");
                    let tmp = list(container, "volumeMounts")
                        .iter()
                        .find(|m| str_at(m, "mountPath") == "/tmp");
                    assert!(
                        tmp.is_some_and(
                            |m| opt(m, "readOnly").and_then(Value::as_bool) != Some(true)
                        ),
                        "{who}: no writable /tmp beside the read-only root"
                    );
                }
            }
        }
    }
}

#[test]
fn the_grace_period_covers_the_pause_and_the_drain() {
    for v in variants() {
        let config = v.config();
        let pod = get(v.deployment(), "spec.template.spec");
        let grace = opt(pod, "terminationGracePeriodSeconds").map_or(30, |g| g.as_u64().unwrap());
        let pause = opt(v.container(), "lifecycle.preStop.sleep.seconds")
            .map_or(0, |s| s.as_u64().unwrap());
        let drain = config.server.drain_timeout.as_secs();
        assert!(
            grace > pause + drain,
            "{}: terminationGracePeriodSeconds {grace} does not cover the preStop pause \
             ({pause} s) and server.drain_timeout ({drain} s): the kubelet would kill a drain",
            v.dir
        );
        assert!(pause > 0, "{}: no pause while the endpoints update", v.dir);
    }
}

#[test]
fn the_replicas_fit_the_store() {
    for v in variants() {
        let config = v.config();
        let replicas = v.replicas();
        match config.store.backend {
            Backend::Memory => assert_eq!(
                replicas, 1,
                "{}: replicas on the memory store each keep a queue of their own",
                v.dir
            ),
            _ => assert_eq!(
                config.store.instances, replicas,
                "{}: store.instances is not the number of replicas",
                v.dir
            ),
        }
        let pdb = &v.all("PodDisruptionBudget")[0];
        match (
            opt(pdb, "spec.maxUnavailable"),
            opt(pdb, "spec.minAvailable"),
        ) {
            (Some(max), None) => assert!(
                max.as_u64()
                    .is_some_and(|m| m >= 1 && (replicas == 1 || m < replicas)),
                "{}: maxUnavailable {max:?} with {replicas} replicas",
                v.dir
            ),
            (None, Some(min)) => assert!(
                min.as_u64().is_some_and(|m| m < replicas),
                "{}: minAvailable {min:?} with {replicas} replicas blocks every drain",
                v.dir
            ),
            other => panic!("{}: the PDB says {other:?}", v.dir),
        }
    }
    let redis = variants().into_iter().find(|v| v.dir == "redis").unwrap();
    assert!(redis.replicas() > 1, "the Redis example runs one replica");
}

#[test]
fn the_redis_example_reaches_its_redis() {
    let v = variants().into_iter().find(|v| v.dir == "redis").unwrap();
    let config = v.config();
    let Backend::Redis { urls } = &config.store.backend else {
        panic!("the Redis example's store is {:?}", config.store.backend);
    };
    let url: http::Uri = urls[0].parse().unwrap();
    let host = url.host().unwrap().to_owned();
    let service = v.find("Service", &host);
    let port = list(service, "spec.ports")
        .iter()
        .find(|p| get(p, "port").as_u64() == Some(u64::from(url.port_u16().unwrap_or(6379))))
        .unwrap_or_else(|| panic!("Service {host} has no port of {}", urls[0]));
    let selector = get(service, "spec.selector");
    let (deployment, _) = v
        .pod_labels()
        .into_iter()
        .find(|(_, labels)| selects(selector, labels))
        .unwrap_or_else(|| panic!("Service {host} selects no pods"));
    let redis = &list(
        v.find("Deployment", deployment),
        "spec.template.spec.containers",
    )[0];
    assert_eq!(
        port_number(redis, get(port, "targetPort")),
        6379,
        "Service {host} does not reach Redis's port"
    );
}

#[test]
fn the_image_is_this_version_and_its_paths() {
    for v in variants() {
        assert_eq!(
            str_at(v.container(), "image").rsplit('/').next().unwrap(),
            format!("waitroom:{}", env!("CARGO_PKG_VERSION")),
            "{}: the image is not this version's",
            v.dir
        );
        let cmd = containerfile("CMD");
        assert!(
            cmd.contains(&format!("\"{}\"", v.config_path())),
            "{}: the image's default config ({cmd}) is not where the ConfigMap is mounted",
            v.dir
        );
    }
    assert_eq!(
        containerfile("ENTRYPOINT"),
        r#"["/usr/local/bin/waitroom"]"#
    );
    let script = read(&root().join("scripts/image"));
    for must in [
        "\"$rootfs/usr/local/bin/waitroom\"",
        "waitroom:x:65532:65532:",
        "mkdir -m 1777 \"$rootfs/tmp\"",
    ] {
        assert!(script.contains(must), "scripts/image lost `{must}`");
    }
}

/// The argument of the Containerfile's (single) `instruction`.
fn containerfile(instruction: &str) -> String {
    let text = read(&root().join("deploy/container/Containerfile"));
    let found: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(instruction)?.strip_prefix(' '))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "the Containerfile has {} {instruction}",
        found.len()
    );
    found[0].trim().to_owned()
}

fn unit_path() -> PathBuf {
    root().join("deploy/systemd/waitroom.service")
}

/// Runs `systemd-analyze` (panics if it is missing: it comes with systemd).
fn systemd_analyze(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new("systemd-analyze")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "systemd-analyze cannot run ({e}); it comes with systemd: apt-get install systemd"
            )
        })
}

#[test]
fn the_systemd_unit_is_exposed_at_most_2_0() {
    let unit = unit_path();
    let out = systemd_analyze(
        &["security", "--offline=true", unit.to_str().unwrap()],
        root(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze security: {stderr}");
    assert!(
        !stderr.contains("Unknown"),
        "systemd-analyze ignores part of the unit:\n{stderr}"
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no overall exposure in:\n{stdout}"));
    let exposure: f64 = line
        .rsplit(':')
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the exposure of {line:?}"));
    assert!(
        exposure <= 2.0,
        "the unit's exposure is {exposure} (over 2.0):\n{stdout}"
    );
}

#[test]
fn the_systemd_unit_verifies_and_gives_a_drain_its_time() {
    let text = read(&unit_path());
    // `verify` checks that every command exists: point the unit at the
    // binary cargo built.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("waitroom.service"),
        text.replace("/usr/local/bin/waitroom", env!("CARGO_BIN_EXE_waitroom")),
    )
    .unwrap();
    let out = systemd_analyze(&["verify", "./waitroom.service"], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify:\n{stderr}"
    );

    let setting = |key: &str| -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .collect()
    };
    let example = read(&root().join("config/example.toml"));
    let env = env_file_stand_ins();
    let config =
        config::from_toml_str_with_env(&example, &|n| env.get(n).cloned()).unwrap_or_else(|e| {
            panic!("config/example.toml with waitroom.env.example's variables set: {e}")
        });
    let stop = humantime::parse_duration(setting("TimeoutStopSec")[0]).unwrap();
    assert!(
        stop > config.server.drain_timeout + Duration::from_secs(1),
        "TimeoutStopSec {stop:?} does not cover the drain ({:?})",
        config.server.drain_timeout
    );
    assert!(setting("ExecReload")[0].contains("-HUP $MAINPID"));
    assert_eq!(setting("KillSignal"), ["SIGTERM"]);
    assert_eq!(setting("EnvironmentFile"), ["/etc/waitroom/waitroom.env"]);
    assert!(setting("User").is_empty() && setting("DynamicUser") == ["yes"]);
}

/// The variables waitroom.env.example sets, with real values.
fn env_file_stand_ins() -> BTreeMap<String, String> {
    read(&root().join("deploy/systemd/waitroom.env.example"))
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(name, _)| {
            let value = if name.contains("COOKIE") {
                waitroom::secret::generate_key()
            } else {
                "stand-in-token".to_owned()
            };
            (name.to_owned(), value)
        })
        .collect()
}
