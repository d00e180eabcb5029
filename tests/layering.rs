//! The order `src/lib.rs` states is true: each top-level module uses only
//! the modules listed after it (its own submodules aside). An import that
//! climbs the order fails this test, naming the file and the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The modules in the order `lib.rs`'s map lists them (`//! * [`name`]`;
/// a private module, which rustdoc cannot link, without the brackets).
fn stated_order() -> Vec<String> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("//! * "))
        .filter_map(|l| l.strip_prefix("[`").or_else(|| l.strip_prefix('`')))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// The modules `lib.rs` declares.
fn declared() -> Vec<String> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| {
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
        })
        .map(|l| l.trim_end_matches(';').to_owned())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `crate::name` uses in the code of `file` (comments left out), with
/// their line numbers. `#[cfg(test)]` code counts too: tests of a module
/// stay within its layer.
fn uses(file: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((n + 1, name));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn every_module_is_in_the_stated_order_once() {
    let order = stated_order();
    let mut declared = declared();
    declared.sort();
    let mut stated = order.clone();
    stated.sort();
    assert_eq!(
        stated, declared,
        "lib.rs's module map and its `mod` lines differ"
    );
}

#[test]
fn no_import_climbs_the_stated_order() {
    let order = stated_order();
    let rank: BTreeMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    let mut climbs = Vec::new();
    for module in &order {
        let mut files = Vec::new();
        let dir = root().join("src").join(module);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
        let file = root().join("src").join(format!("{module}.rs"));
        if file.is_file() {
            files.push(file);
        }
        for file in files {
            for (line, used) in uses(&file) {
                let Some(&at) = rank.get(used.as_str()) else {
                    continue;
                };
                if used != *module && at < rank[module.as_str()] {
                    let shown = file.strip_prefix(root()).unwrap().display().to_string();
                    climbs.push(format!("{shown}:{line}: {module} uses {used}"));
                }
            }
        }
    }
    assert!(
        climbs.is_empty(),
        "imports that climb lib.rs's order:\n{}",
        climbs.join("\n")
    );
}
