//! The Redis Lua passes luacheck as Redis runs it: the room functions'
//! library as the crate assembles it (`function_library`: the generated
//! constants, `lua/lib/*.lua`, then each room function inside its
//! `register_function` wrapper), the global region scripts with their
//! argument positions and the record codec in front (`region::scripts`),
//! the scripts sent as
//! they are, and HAProxy's action. Settings: `.luacheckrc`, where the
//! assembled scripts are named `assembled/<name>.lua`. luacheck (Debian's
//! `lua-check`) must be installed: the test fails without it.

use std::path::Path;
use std::process::Command;

use waitroom::region;
use waitroom::store::redis::{function_library, Layout};

const LUA: &str = "src/store/redis/lua";

/// Scripts sent as they are (`EVALSHA`, `src/store/redis/mod.rs`).
const ALONE: [&str; 7] = [
    "totals.lua",
    "overrides.lua",
    "set_overrides.lua",
    "note.lua",
    "epoch.lua",
    "report_add.lua",
    "report_read.lua",
];

/// Every `.lua` file under `src/store/redis/lua/`, as paths from the root.
fn sources(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for sub in ["", "lib"] {
        for entry in std::fs::read_dir(root.join(LUA).join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "lua") {
                let rel = path.strip_prefix(root).unwrap();
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// luacheck's findings, one a line (empty when it finds nothing).
fn luacheck(root: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("luacheck")
        .current_dir(root)
        .args(["--config", ".luacheckrc", "--no-color", "--codes"])
        .args(["--formatter", "plain"])
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("luacheck could not run ({e}): install it (Debian: apt-get install lua-check)")
        });
    let mut found: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    // Exit 1: warnings (listed); above: errors, or luacheck itself failed.
    if !out.status.success() && (out.status.code() != Some(1) || found.is_empty()) {
        found.push(format!(
            "luacheck {args:?} exited {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    found
}

#[test]
fn the_lua_passes_luacheck_as_redis_runs_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));

    // The assembled scripts, by the name .luacheckrc knows them by.
    let mut assembled = vec![(
        "assembled/room_functions.lua".to_owned(),
        function_library(&Layout::production()),
    )];
    for (name, text) in region::scripts() {
        assembled.push((format!("assembled/{name}"), text));
    }

    // Every file under lua/ is in one of the scripts checked: a new one
    // is, or this test says where to add it.
    let unchecked: Vec<String> = sources(root)
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(root.join(path)).unwrap();
            let name = Path::new(path).file_name().unwrap().to_str().unwrap();
            !ALONE.contains(&name) && !assembled.iter().any(|(_, s)| s.contains(&text))
        })
        .collect();
    assert!(
        unchecked.is_empty(),
        "not in any script tests/lint.rs checks: {unchecked:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let mut found = Vec::new();
    for (name, text) in &assembled {
        let file = dir.path().join(name.replace('/', "_"));
        std::fs::write(&file, text).unwrap();
        let file = file.display().to_string();
        for line in luacheck(root, &["--filename", name, &file]) {
            found.push(source_of(root, &assembled, &line));
        }
    }
    let mut alone: Vec<String> = ALONE.iter().map(|n| format!("{LUA}/{n}")).collect();
    alone.push("deploy/haproxy/waitroom.lua".into());
    let alone: Vec<&str> = alone.iter().map(String::as_str).collect();
    found.extend(luacheck(root, &alone));
    // Line length file by file: the assembled library holds the generated
    // constants, whose longest line .luacheckrc lets past (see there).
    let all = sources(root);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    found.extend(luacheck(
        root,
        &[&["--only", "631", "--"][..], &all].concat(),
    ));

    assert!(found.is_empty(), "luacheck found:\n{}", found.join("\n"));
}

/// A luacheck line (`<name>:<line>:<col>: …`) about an assembled script,
/// told as the source file and line it comes from (the generated constants
/// and the wrappers have none: they keep the script's name).
fn source_of(root: &Path, assembled: &[(String, String)], line: &str) -> String {
    let mut parts = line.splitn(3, ':');
    let (Some(name), Some(n), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
        return line.to_owned();
    };
    let (Some((_, script)), Ok(n)) = (
        assembled.iter().find(|(s, _)| s == name),
        n.parse::<usize>(),
    ) else {
        return line.to_owned();
    };
    for path in sources(root) {
        let text = std::fs::read_to_string(root.join(&path)).unwrap();
        if let Some(at) = script.find(&text) {
            let first = script[..at].matches('\n').count() + 1;
            let last = first + text.matches('\n').count();
            if (first..last).contains(&n) {
                return format!("{path}:{}:{rest} (in {name})", n - first + 1);
            }
        }
    }
    line.to_owned()
}
