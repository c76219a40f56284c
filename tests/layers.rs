//! The layering rule, checked on the source: nothing under `src/core/` does I/O, reads a clock
//! or awaits, and it imports nothing from the layers above it. A violation names the file, the
//! line and the rule it breaks.

use std::path::{Path, PathBuf};

/// What `src/core/` may not mention, and why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("crate::store", "core imports the store layer"),
    ("crate::fleet", "core imports the fleet layer"),
    ("crate::host", "core imports the agent host"),
    (
        "crate::clock",
        "core reads the clock (take the time as an argument)",
    ),
    ("crate::serve", "core imports an interface"),
    ("tokio", "core uses the async runtime"),
    ("async ", "core defines async code"),
    (".await", "core awaits"),
    ("std::fs", "core touches the filesystem"),
    ("std::net", "core touches the network"),
    ("std::env", "core reads the environment"),
    ("std::process", "core starts processes"),
    ("SystemTime", "core reads the wall clock"),
    ("Instant", "core reads the monotonic clock"),
    ("object_store", "core uses the object store client"),
    ("reqwest", "core uses the HTTP client"),
    ("getrandom", "core draws randomness (take a seed)"),
    ("Uuid::new_v4", "core draws randomness (take a seed)"),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/core") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Lines that are code (not comments), with their numbers.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line))
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
}

/// `pattern` occurs in `line` as a whole token: not inside a longer identifier
/// (`.await` is not `.awaiting`, `Instant` is not `InstantLike`).
fn contains_token(line: &str, pattern: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(pattern).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + pattern.len()..].chars().next();
        let starts_ident = pattern.chars().next().is_some_and(ident);
        let ends_ident = pattern.chars().next_back().is_some_and(ident);
        let glued_before = starts_ident && before.is_some_and(ident);
        let glued_after = ends_ident && after.is_some_and(ident);
        !(glued_before || glued_after)
    })
}

fn violations(files: &[PathBuf]) -> Vec<String> {
    violations_of(files, FORBIDDEN)
}

/// Every code line of `files` that mentions one of `rules`' patterns, named with its rule.
fn violations_of(files: &[PathBuf], rules: &[(&str, &str)]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("read a source file");
        for (number, line) in code_lines(&text) {
            for (pattern, rule) in rules {
                if contains_token(line, pattern) {
                    found.push(format!(
                        "{}:{number}: {rule}: {}",
                        file.display(),
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn core_does_no_io_reads_no_clock_and_never_awaits() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        files.len() >= 8,
        "expected the core modules under {}, found {files:?}",
        root.display()
    );
    let found = violations(&files);
    assert!(
        found.is_empty(),
        "layering violations:\n{}",
        found.join("\n")
    );
}

/// What the layers below the public error may not mention: `src/error.rs` names their errors,
/// so an import the other way is a cycle (the fact log once returned the public error).
const PUBLIC_ERROR: &[&str] = &[
    "crate::error",
    "crate::Error",
    "crate::ErrorKind",
    "crate::Result",
];

// Proves core, store and host keep their own error enums and never import the public error,
// which sits above them (`src/error.rs` imports their errors): no import cycle through it.
#[test]
fn core_store_and_host_never_import_the_public_error() {
    let mut files = Vec::new();
    for layer in ["src/core", "src/store", "src/host"] {
        rust_files(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join(layer),
            &mut files,
        );
    }
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a source file");
        for (number, line) in code_lines(&text) {
            if PUBLIC_ERROR.iter().any(|p| contains_token(line, p)) {
                found.push(format!(
                    "{}:{number}: imports the public error: {}",
                    file.display(),
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "layering violations:\n{}",
        found.join("\n")
    );
}

// The checker itself: each rule fires on a line that breaks it, and comments are ignored.
#[test]
fn the_layer_check_catches_what_it_names() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("bad.rs");
    std::fs::write(
        &file,
        "// crate::store in a comment is fine\nuse crate::store::Store;\nasync fn f() { g().await }\nlet t = std::time::Instant::now();\nself.awaiting_model = true;\n",
    )
    .expect("write");
    let found = violations(&[file]);
    assert!(
        found
            .iter()
            .any(|v| v.contains(":2: core imports the store layer")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|v| v.contains(":3: core defines async code")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|v| v.contains(":3: core awaits")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|v| v.contains(":4: core reads the monotonic clock")),
        "{found:?}"
    );
    assert!(!found.iter().any(|v| v.contains(":1:")), "{found:?}");
    assert!(!found.iter().any(|v| v.contains(":5:")), "{found:?}");
}

/// `select!` sites in `text` (tokio's, however imported) whose first line inside is not
/// `biased;`: an unbiased select polls its ready branches in random order, so a seeded
/// simulation would not replay.
fn unbiased_selects(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//") && line.contains("select!"))
        .filter(|(i, _)| lines.get(i + 1).is_none_or(|next| next.trim() != "biased;"))
        .map(|(i, _)| i + 1)
        .collect()
}

// Proves every `tokio::select!` in the library and binaries is `biased`: when a wake-up and a
// timer are ready at the same virtual instant, the branch taken must not depend on tokio's
// random draw, or a simulation seed does not replay exactly (it did not: seed 10002938 gave
// three different traces in six runs until these became biased).
#[test]
fn every_select_polls_its_branches_in_order() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a source file");
        for number in unbiased_selects(&text) {
            found.push(format!(
                "{}:{number}: a select! that is not biased",
                file.display()
            ));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    assert_eq!(
        unbiased_selects(
            "tokio::select! {\n    biased;\n}\nlet x = tokio::select! {\n    a = f() => a,\n};\n"
        ),
        vec![4],
        "the check finds an unbiased select"
    );
}

/// What the coordinator's synchronous faces may not mention: they judge and remember what was
/// observed, and never reach the store or await.
const SYNCHRONOUS_FACES: &[(&str, &str)] = &[
    ("async ", "defines async code"),
    (".await", "awaits"),
    ("tokio", "uses the async runtime"),
    ("object_store", "uses the object store client"),
    ("std::fs", "touches the filesystem"),
    ("std::net", "touches the network"),
    ("Store", "holds or takes the store"),
];

// Proves the coordinator's memory (what it remembers between turns and how it judges it) and
// its gauges never await or take the store: what a tick decides from them can be followed
// without the bucket.
#[test]
fn the_coordinators_memory_and_gauges_never_await_or_take_the_store() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/fleet/coordinator");
    let files = [root.join("memory.rs"), root.join("gauges.rs")];
    let found = violations_of(&files, SYNCHRONOUS_FACES);
    assert!(
        found.is_empty(),
        "layering violations:\n{}",
        found.join("\n")
    );
}

// Proves the public error does not import the tools over the fleet (bench, soak, demo): they
// return their own errors, which wrap the public one, so no import runs both ways.
#[test]
fn the_public_error_does_not_import_the_tools() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/error.rs");
    let rules = [
        ("fleet::bench", "the public error imports the bench"),
        ("fleet::soak", "the public error imports the soak"),
        ("fleet::demo", "the public error imports the demo"),
        ("BenchError", "the public error names the bench's error"),
        ("DemoError", "the public error names the demo's error"),
    ];
    let found = violations_of(&[file], &rules);
    assert!(
        found.is_empty(),
        "layering violations:\n{}",
        found.join("\n")
    );
}
