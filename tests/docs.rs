//! The documentation holds together: every relative link and image in
//! README.md, CONTRIBUTING.md and the pages under docs/ names a file that
//! exists, and every `#anchor` a heading of the page it points to; nothing
//! cites the old outside specification; the README stays short; commit
//! subjects stay short.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The pages checked: the README, CONTRIBUTING.md and every page under
/// docs/, its subfolders included.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md"]
        .iter()
        .map(|p| root.join(p))
        .filter(|p| p.exists())
        .collect();
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages
}

/// A page's text outside code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor for a heading: lower case, punctuation dropped,
/// spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> HashSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|l| {
            l.trim_start_matches('#')
                .strip_prefix(' ')
                .filter(|_| l.starts_with('#'))
        })
        .map(slug)
        .collect()
}

/// The targets of `](…)` links and `src="…"` images on a line.
fn targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (open, close) in [("](", ')'), ("src=\"", '"')] {
        let mut rest = line;
        while let Some(i) = rest.find(open) {
            rest = &rest[i + open.len()..];
            if let Some(end) = rest.find(close) {
                out.push(rest[..end].to_owned());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_link_between_the_docs_holds() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for line in prose(&text) {
            for target in targets(line) {
                if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                if !file.exists() {
                    broken.push(format!("{}: {target} (no such file)", page.display()));
                    continue;
                }
                if !anchor.is_empty() && file.extension().is_some_and(|e| e == "md") {
                    let headings = anchors(&std::fs::read_to_string(&file).unwrap());
                    if !headings.contains(anchor) {
                        broken.push(format!("{}: {target} (no such heading)", page.display()));
                    }
                }
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_first_screen_not_a_manual() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; the rest belongs in docs/"
    );
    for must in ["cargo run --release -- demo", "scripts/test"] {
        assert!(readme.contains(must), "README.md lost `{must}`");
    }
}

/// `git` run in the repository, or `None` when git or the repository is
/// not there (a crate unpacked from a registry, a sandbox without git).
fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn nothing_cites_the_old_outside_spec() {
    let Some(files) = git(&["ls-files", "-z"]) else {
        eprintln!("skipped: no git repository");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Spelled in two parts so that this file does not match itself.
    let needles = [["SPEC", " §"].concat(), ["SPEC", ".md"].concat()];
    let mut found = Vec::new();
    let mut read = 0;
    for file in files.split('\0').filter(|f| !f.is_empty()) {
        // Text files only: whatever is not UTF-8 (images) is skipped.
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        read += 1;
        for (n, line) in text.lines().enumerate() {
            if needles.iter().any(|needle| line.contains(needle.as_str())) {
                found.push(format!("{file}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(read > 50, "only {read} tracked text files read");
    assert!(
        found.is_empty(),
        "cite the repository's own pages (docs/…) instead:\n{}",
        found.join("\n")
    );
}

/// Commit subjects stay short (CONTRIBUTING.md, "Commits"): checked for
/// the commits after the one that wrote the rule down.
#[test]
fn commit_subjects_are_short() {
    const SINCE: &str = "30ef29e";
    if git(&["cat-file", "-e", &format!("{SINCE}^{{commit}}")]).is_none() {
        eprintln!("skipped: no git, or {SINCE} is not in this clone (shallow?)");
        return;
    }
    let Some(subjects) = git(&["log", "--format=%h %s", &format!("{SINCE}..HEAD")]) else {
        eprintln!("skipped: git log failed");
        return;
    };
    let long: Vec<String> = subjects
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, s)| s.chars().count() > 80)
        .map(|(h, s)| format!("{h} ({} characters): {s}", s.chars().count()))
        .collect();
    assert!(
        long.is_empty(),
        "commit subjects over 80 characters (put the detail in the body):\n{}",
        long.join("\n")
    );
}
