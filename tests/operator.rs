//! What an operator sees and types: logs, `status`, `runs`, store URLs, flags and their
//! mistakes, with the real binaries on a local-directory store.

#![allow(clippy::disallowed_methods)] // real processes on real time.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn rekindle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rekindle"))
        .args(args)
        .env_remove("REKINDLE_STORE")
        .output()
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs a coordinator on `store` for a moment, with `env`, and returns what it logged.
fn coordinator_log(store: &Path, env: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rekindle-coordinator"));
    command
        .arg("--store")
        .arg(store)
        .args(["--id", "c-logs", "--lease-ttl-ms", "1000"])
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("REKINDLE_LOG_FORMAT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let log = std::sync::Arc::clone(&log);
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines() {
                let line = line.unwrap();
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log.lock().unwrap().contains("leading") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(status.success(), "{log}");
    log
}

// Proves logs carry no colour codes when stderr is not a terminal, and are JSON lines with
// the process's span fields on Kubernetes.
#[test]
fn logs_are_plain_off_a_terminal_and_json_on_kubernetes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let text = coordinator_log(&store, &[]);
    assert!(text.contains("leading"), "{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in {text:?}");

    let json = coordinator_log(&store, &[("KUBERNETES_SERVICE_HOST", "10.0.0.1")]);
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let leading = lines
        .iter()
        .find(|line| line["fields"]["message"] == "leading")
        .unwrap_or_else(|| panic!("no 'leading' line in {json}"));
    assert_eq!(leading["span"]["coordinator_id"], "c-logs", "{leading}");
}

// Proves commands about runs refuse a location with no Rekindle store, naming it, and create
// nothing there (a mistyped path used to print an empty list and leave a directory behind);
// malformed URLs and unknown schemes are errors at parse time.
#[test]
fn a_location_without_a_store_is_an_error_not_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo");
    let missing = missing.to_str().unwrap();
    for args in [
        vec!["runs", "ls", "--store", missing],
        vec!["runs", "show", "some-run", "--store", missing],
        vec!["status", "--store", missing],
        vec!["gc", "--store", missing],
        vec!["runs", "rm", "some-run", "--store", missing],
        vec![
            "recover",
            "some-run",
            "--recovery-id",
            "r",
            "--store",
            missing,
        ],
    ] {
        let output = rekindle(&args);
        assert!(!output.status.success(), "{args:?} succeeded");
        let text = stderr(&output);
        assert!(
            text.contains(&format!(
                "no Rekindle store at {missing}: no such directory"
            )),
            "{args:?}: {text}"
        );
        assert_eq!(text.lines().count(), 1, "{args:?}: {text}");
    }
    assert!(!Path::new(missing).exists(), "a read created the directory");

    // A directory that exists but holds no store.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let output = rekindle(&["status", "--store", empty.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("no format marker"),
        "{}",
        stderr(&output)
    );
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);

    for (url, problem) in [
        ("s3:/bucket", "no '//' after 's3:'"),
        ("file://relative", "a file:// URL needs an absolute path"),
        ("gs://bucket", "unknown scheme 'gs'"),
        ("s3://", "bucket"),
    ] {
        let output = rekindle(&["runs", "ls", "--store", url]);
        assert_eq!(output.status.code(), Some(2), "{url}");
        let text = stderr(&output);
        assert!(text.contains(problem), "{url}: {text}");
        assert!(
            text.contains(&format!("invalid store URL '{url}'")),
            "{text}"
        );
    }
    assert!(!Path::new("s3:").exists());
    assert!(!Path::new("relative").exists());
}

// Proves the demo writes only where it is told (never into REKINDLE_STORE), refuses a fleet
// with no worker, and that flags with nonsensical values are refused with one line each.
#[test]
fn the_demo_and_flags_refuse_what_makes_no_sense() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("production-store");
    let output = Command::new(env!("CARGO_BIN_EXE_rekindle"))
        .args(["demo", "--runs", "2", "--workers", "1", "--json"])
        .env("REKINDLE_STORE", &elsewhere)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let summary: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_ne!(summary["store"], elsewhere.display().to_string());
    assert!(!elsewhere.exists(), "the demo wrote into REKINDLE_STORE");

    let store = dir.path().join("s");
    let store = store.to_str().unwrap();
    for (binary, args, problem) in [
        (
            env!("CARGO_BIN_EXE_rekindle"),
            vec!["demo", "--workers", "0"],
            "--workers",
        ),
        (
            env!("CARGO_BIN_EXE_rekindle"),
            vec!["gc", "--store", store, "--grace-minutes", "0"],
            "--grace-minutes",
        ),
        (
            env!("CARGO_BIN_EXE_rekindle"),
            vec!["runs", "ls", "--store", store, "--state", "sleeping"],
            "--state",
        ),
        (
            env!("CARGO_BIN_EXE_rekindle"),
            vec!["runs", "ls", "--store", store, "--limit", "0"],
            "--limit",
        ),
        (
            env!("CARGO_BIN_EXE_rekindle"),
            vec!["bench-store", "--store", store, "--steps", "0"],
            "--steps",
        ),
        (
            env!("CARGO_BIN_EXE_rekindle"),
            vec!["recover", "--all", "--recovery-id", "x", "--store", store],
            "--recovery-id",
        ),
        // Neither form given: the usage shows both, not only the one with a run ID.
        (
            env!("CARGO_BIN_EXE_rekindle"),
            vec!["recover", "--store", store],
            "rekindle recover --store <STORE> --all [--takeover] [--wait] [--force]",
        ),
        (
            env!("CARGO_BIN_EXE_rekindle-worker"),
            vec!["--store", store, "--config", "c.toml", "--concurrency", "0"],
            "--concurrency",
        ),
        (
            env!("CARGO_BIN_EXE_rekindle-worker"),
            vec![
                "--store",
                store,
                "--config",
                "c.toml",
                "--lease-ttl-ms",
                "0",
            ],
            "--lease-ttl-ms",
        ),
        (
            env!("CARGO_BIN_EXE_rekindle-coordinator"),
            vec!["--store", store, "--max-attempts", "0"],
            "--max-attempts",
        ),
    ] {
        let output = Command::new(binary).args(&args).output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        let text = stderr(&output);
        assert!(text.contains(problem), "{args:?}: {text}");
    }
    assert!(!Path::new(store).exists());
    let output = rekindle(&["demo", "--workers", "0"]);
    assert!(
        stderr(&output).contains("invalid value '0' for '--workers <WORKERS>': must be at least 1"),
        "{}",
        stderr(&output)
    );
}

// Proves `gc --dry-run` reports and changes nothing, `bench-store` removes the runs it wrote,
// and `runs rm` of a missing run is an error naming it.
#[test]
fn gc_dry_run_bench_store_and_rm_leave_the_store_as_they_say() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let store = store.to_str().unwrap();
    let output = rekindle(&[
        "bench-store",
        "--store",
        store,
        "--steps",
        "3",
        "--facts",
        "20",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert!(report["objects_removed"].as_u64().unwrap() > 0, "{report}");
    let listed = |root: &str| -> Vec<String> {
        let mut keys = Vec::new();
        let mut stack = vec![Path::new(root).to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    keys.push(path.strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        keys.sort();
        keys
    };
    let left = listed(store);
    assert!(
        left.iter().all(|key| !key.contains("bench-")),
        "bench-store left {left:?}"
    );

    let before = listed(store);
    let output = rekindle(&["gc", "--store", store, "--dry-run", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(report["dry_run"], true);
    assert_eq!(listed(store), before);

    let output = rekindle(&[
        "answer",
        "no-such-run",
        "--confirm",
        "call_1_1",
        "--approve",
        "--store",
        store,
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("no such run (it never took a lease)"),
        "{}",
        stderr(&output)
    );

    let output = rekindle(&["runs", "rm", "no-such-run", "--store", store]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("run \"no-such-run\" does not exist"),
        "{}",
        stderr(&output)
    );
}

/// The reference `docs/flags.md` holds: generated from the three binaries' clap definitions.
fn flags_reference() -> String {
    let mut out = String::from(
        "# Flags and environment\n\nGenerated from the clap definitions of `rekindle`, `rekindle-worker` and `rekindle-coordinator` (`--help-markdown`); `cargo test --test operator` fails when it drifts, and `REKINDLE_BLESS=1` rewrites it.\n\n",
    );
    for binary in [
        env!("CARGO_BIN_EXE_rekindle"),
        env!("CARGO_BIN_EXE_rekindle-worker"),
        env!("CARGO_BIN_EXE_rekindle-coordinator"),
    ] {
        let output = Command::new(binary)
            .arg("--help-markdown")
            .output()
            .unwrap();
        assert!(output.status.success(), "{binary}: {}", stderr(&output));
        out.push_str(&stdout(&output));
    }
    out
}

// Proves docs/flags.md is what the binaries' own definitions say (every flag, environment
// variable and default), and that no flag lacks help text.
#[test]
fn the_flags_reference_matches_the_binaries() {
    let generated = flags_reference();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/flags.md");
    if std::env::var_os("REKINDLE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let undocumented: Vec<&str> = generated
        .lines()
        .filter(|line| line.starts_with("| `") && line.ends_with("|  |"))
        .collect();
    assert!(
        undocumented.is_empty(),
        "flags without help: {undocumented:?}"
    );
    for flag in [
        "--lease-ttl-ms",
        "--idle-ttl-ms",
        "--watch-interval-ms",
        "REKINDLE_SEAL_KEY",
    ] {
        assert!(generated.contains(flag), "{flag} missing");
    }
    assert_eq!(
        std::fs::read_to_string(&path).unwrap_or_default(),
        generated,
        "docs/flags.md is out of date: run REKINDLE_BLESS=1 cargo test --test operator the_flags_reference"
    );
}

/// A temporary directory holding a `rekindle.toml` whose scripted model answers "done" at
/// once, and that file's path.
fn scripted_config() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.json"), r#"[{"content": "done"}]"#).unwrap();
    let config = dir.path().join("rekindle.toml");
    std::fs::write(
        &config,
        "[model]\nkind = \"scripted\"\nname = \"m\"\nscript = \"script.json\"\n",
    )
    .unwrap();
    (dir, config)
}

/// `rekindle run` of the scripted configuration as run `id` on `store`, its state in `dir`.
fn run_scripted(dir: &Path, config: &Path, store: &str, id: &str) -> Output {
    rekindle(&[
        "run",
        "--store",
        store,
        "--config",
        config.to_str().unwrap(),
        "--state-dir",
        dir.join("state").to_str().unwrap(),
        "--run-id",
        id,
        "hello",
    ])
}

// New-user pass: `run --store memory://` succeeded silently, and a killed run could never be
// recovered. It still runs (a quick try needs no store), with a note saying so; a run on a
// directory gets no such note.
#[test]
fn a_run_on_a_memory_store_says_nothing_outlives_it() {
    let (dir, config) = scripted_config();
    let run = |store: &str, id: &str| run_scripted(dir.path(), &config, store, id);
    let note = "a memory store keeps nothing once this process exits";
    let memory = run("memory://", "in-memory");
    assert!(memory.status.success(), "{}", stderr(&memory));
    assert!(stderr(&memory).contains(note), "{}", stderr(&memory));
    assert!(stdout(&memory).contains("completed"), "{}", stdout(&memory));
    let local = run(dir.path().join("store").to_str().unwrap(), "on-disk");
    assert!(local.status.success(), "{}", stderr(&local));
    assert!(!stderr(&local).contains(note), "{}", stderr(&local));
}

// Proves the first run on a new local directory says it created a store there (a typo in
// --store would otherwise start a second, empty fleet silently), and a second run does not;
// and gc's counts agree with their words ("1 run scanned", "2 runs scanned").
#[test]
fn a_new_local_store_is_reported() {
    let (dir, config) = scripted_config();
    let store = dir.path().join("new-store");
    let run = |id: &str| run_scripted(dir.path(), &config, store.to_str().unwrap(), id);
    let gc = || {
        let output = rekindle(&["gc", "--store", store.to_str().unwrap(), "--dry-run"]);
        assert!(output.status.success(), "{}", stderr(&output));
        stdout(&output)
    };
    let first = run("first");
    assert!(first.status.success(), "{}", stderr(&first));
    let said = gc();
    assert!(
        said.contains("1 run scanned, 0 superseded generations would be deleted"),
        "{said}"
    );
    assert!(
        stderr(&first).contains(&format!(
            "note: created a new Rekindle store at {}",
            store.display()
        )),
        "{}",
        stderr(&first)
    );
    let second = run("second");
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(!stderr(&second).contains("created"), "{}", stderr(&second));
    let said = gc();
    assert!(said.contains("2 runs scanned"), "{said}");
}
