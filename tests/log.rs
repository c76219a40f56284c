//! The local fact log on a real filesystem: durability bookkeeping, torn tails, corruption,
//! locking between two real processes, permissions, and safe file names for hostile IDs.

#![allow(clippy::disallowed_methods)] // real processes on real time: deadlines and pauses are wall time.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use rekindle::core::fact::{self, Fact, Seq};
use rekindle::core::sample;
use rekindle::store::log::{self, FactLog, LogDir, LogError, TornTail};

const CHILD_ENV: &str = "REKINDLE_TEST_LOCK_CHILD_LOG";

fn facts(n: usize) -> Vec<Fact> {
    sample::run("log-test", n, 3)
}

fn write_lines(path: &Path, facts: &[Fact], tail: &[u8]) {
    let mut bytes = Vec::new();
    for fact in facts {
        bytes.extend(fact::encode(fact).unwrap());
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(tail);
    std::fs::write(path, bytes).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

// Proves appended facts read back in order and a reopened log continues at the next seq.
#[test]
fn append_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let logs = LogDir::open(dir.path().join("runs")).unwrap();
    let all = facts(20);
    {
        let (mut log, contents) = logs.open_log("r-1").unwrap();
        assert!(contents.facts.is_empty());
        log.append(&all[0]).unwrap();
        log.append_all(&all[1..10]).unwrap();
    }
    let (mut log, contents) = logs.open_log("r-1").unwrap();
    assert_eq!(contents.facts, all[..10]);
    assert_eq!(log.next_seq(), Seq(11));
    log.append_all(&all[10..]).unwrap();
    drop(log);
    assert_eq!(log::read(&logs.path_for("r-1")).unwrap().facts, all);
}

// Proves appends must continue the seq exactly; a skipped or repeated seq is refused.
#[test]
fn out_of_order_append_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = FactLog::open(dir.path().join("r.jsonl")).unwrap();
    let all = facts(10);
    log.append(&all[0]).unwrap();
    let error = log.append(&all[2]).unwrap_err();
    assert!(matches!(
        error,
        LogError::OutOfOrder {
            expected: Seq(2),
            got: Seq(3),
            ..
        }
    ));
    log.append(&all[1]).unwrap();
    assert_eq!(log::read(log.path()).unwrap().facts, all[..2]);
}

// Proves exactly one torn last line is tolerated on read, and cut off before the next append.
#[test]
fn torn_last_line_is_tolerated_and_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let all = facts(12);
    let next = fact::encode(&all[8]).unwrap();
    write_lines(&path, &all[..8], &next[..next.len() / 2]);

    let contents = log::read(&path).unwrap();
    assert_eq!(contents.facts, all[..8]);
    assert_eq!(
        contents.torn_tail,
        Some(TornTail {
            line: 9,
            bytes: (next.len() / 2) as u64
        })
    );

    let (mut log, contents) = FactLog::open(&path).unwrap();
    assert_eq!(contents.facts.len(), 8);
    log.append_all(&all[8..]).unwrap();
    drop(log);
    let reread = log::read(&path).unwrap();
    assert_eq!(reread.facts, all);
    assert_eq!(reread.torn_tail, None);
}

// Proves a crash's zero-filled tail counts as torn too.
#[test]
fn zero_filled_tail_is_torn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let all = facts(6);
    write_lines(&path, &all, &[0u8; 512]);
    let contents = log::read(&path).unwrap();
    assert_eq!(contents.facts, all);
    assert!(contents.torn_tail.is_some());
}

// Proves a whole last fact whose newline was lost is kept and the newline restored on open.
#[test]
fn last_fact_without_newline_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let all = facts(8);
    write_lines(&path, &all[..4], &fact::encode(&all[4]).unwrap());
    assert_eq!(log::read(&path).unwrap().facts, all[..5]);
    let (mut log, _) = FactLog::open(&path).unwrap();
    log.append_all(&all[5..]).unwrap();
    drop(log);
    assert_eq!(log::read(&path).unwrap().facts, all);
}

// Proves damage before the last line is refused with its line number, even if later lines parse.
#[test]
fn corruption_in_the_middle_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let all = facts(10);
    let mut bytes = Vec::new();
    for (i, fact) in all.iter().enumerate() {
        let mut line = fact::encode(fact).unwrap();
        if i == 4 {
            line.truncate(line.len() - 7);
        }
        bytes.extend(line);
        bytes.push(b'\n');
    }
    std::fs::write(&path, &bytes).unwrap();
    let error = log::read(&path).unwrap_err();
    assert!(
        matches!(error, LogError::Corrupt { line: 5, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("line 5 is corrupt"));
    // Opening for append must refuse too, and leave the file exactly as it was.
    assert!(matches!(
        FactLog::open(&path),
        Err(LogError::Corrupt { line: 5, .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

// Proves a whole JSON line of the wrong shape at the end is corruption, not a torn write.
#[test]
fn wrong_shape_last_line_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let all = facts(5);
    write_lines(&path, &all, b"{\"v\":1,\"seq\":6}\n");
    let error = log::read(&path).unwrap_err();
    let expected = all.len() as u64 + 1;
    assert!(
        matches!(error, LogError::Corrupt { line, .. } if line == expected),
        "{error}"
    );
}

// Proves a future-schema fact, even on the last line, is refused naming both versions.
#[test]
fn future_schema_last_line_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let all = facts(5);
    write_lines(
        &path,
        &all,
        br#"{"v":9,"seq":6,"at_ms":1,"kind":"user.message","data":{"content":"x"}}"#,
    );
    let error = log::read(&path).unwrap_err();
    let expected = format!(
        "line {} has schema version 9, this build reads up to 1",
        all.len() + 1
    );
    assert!(error.to_string().ends_with(&expected), "{error}");
}

// Proves the log directory is 0700 (even if it existed looser) and logs are 0600.
#[test]
fn permissions_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("state").join("runs");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let logs = LogDir::open(&root).unwrap();
    assert_eq!(mode(&root), 0o700);
    let (mut log, _) = logs.open_log("r-1").unwrap();
    log.append(&facts(3)[0]).unwrap();
    assert_eq!(mode(log.path()), 0o600);

    let fresh = dir.path().join("fresh").join("deeper");
    LogDir::open(&fresh).unwrap();
    assert_eq!(mode(&fresh), 0o700);
}

// Proves hostile run IDs map to distinct files inside the directory and never escape it.
#[test]
fn hostile_ids_stay_inside_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let logs = LogDir::open(dir.path().join("runs")).unwrap();
    let long_a = format!("{}a", "x".repeat(9_999));
    let long_b = format!("{}b", "x".repeat(9_999));
    let ids = [
        "../escape",
        "..",
        ".",
        "a/b",
        "/etc/passwd",
        "nul\0byte",
        "new\nline",
        "ünïcødé",
        "s-looks-encoded",
        "",
        long_a.as_str(),
        long_b.as_str(),
        &"y".repeat(129),
    ];
    let mut names = std::collections::HashSet::new();
    for id in ids {
        let path = logs.path_for(id);
        assert_eq!(path.parent(), Some(logs.root()), "{id:?}");
        let name = log::file_name(id);
        assert!(
            name.starts_with("s-") && name.len() == 2 + 64 + 6,
            "{id:?} -> {name}"
        );
        assert!(names.insert(name), "two IDs share a file: {id:?}");
        let (mut log, _) = logs.open_log(id).unwrap();
        log.append(&facts(3)[0]).unwrap();
    }
    assert_eq!(std::fs::read_dir(logs.root()).unwrap().count(), ids.len());
    for plain in ["r-12", "run_1.2:3", &"z".repeat(128)] {
        assert_eq!(log::file_name(plain), format!("{plain}.jsonl"));
    }
}

// Proves the state directory follows XDG and never falls back to the working directory.
#[test]
fn default_dir_follows_xdg() {
    use std::ffi::OsString;
    let dir = |xdg: Option<&str>, home: Option<&str>| {
        log::default_dir_from(xdg.map(OsString::from), home.map(OsString::from))
    };
    assert_eq!(
        dir(Some("/xdg"), Some("/home/u")).unwrap(),
        Path::new("/xdg/rekindle/runs")
    );
    assert_eq!(
        dir(Some("relative"), Some("/home/u")).unwrap(),
        Path::new("/home/u/.local/state/rekindle/runs")
    );
    assert!(matches!(
        dir(Some("relative"), Some("also-relative")),
        Err(LogError::NoStateDir)
    ));
    assert!(matches!(dir(None, None), Err(LogError::NoStateDir)));
}

// Proves a log cannot be removed while its writer holds it, and can be once released.
#[test]
fn remove_respects_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let logs = LogDir::open(dir.path()).unwrap();
    let (mut log, _) = logs.open_log("r-1").unwrap();
    log.append(&facts(3)[0]).unwrap();
    assert!(matches!(
        logs.remove_log("r-1"),
        Err(LogError::Locked { .. })
    ));
    drop(log);
    logs.remove_log("r-1").unwrap();
    assert!(!logs.path_for("r-1").exists());
    logs.remove_log("r-1").unwrap();
}

// Proves the lock is per open file, so even one process cannot open a log twice; when run as
// the child of `lock_is_held_across_processes_and_released_on_kill`, holds the lock instead.
#[test]
fn lock_child_or_same_process_check() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        let (mut log, contents) = FactLog::open(Path::new(&path)).unwrap();
        log.append(&facts(4)[contents.facts.len()]).unwrap();
        println!("LOCKED");
        std::io::stdout().flush().unwrap();
        // Hold the lock until the parent kills us (or, as a bound, for 60 seconds).
        std::thread::sleep(std::time::Duration::from_secs(60));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let (_held, _) = FactLog::open(&path).unwrap();
    assert!(matches!(FactLog::open(&path), Err(LogError::Locked { .. })));
}

// Proves a second process is refused while the first holds the log, and that the kernel
// releases the lock when the holder is killed with SIGKILL (no stale lock after a crash).
#[test]
fn lock_is_held_across_processes_and_released_on_kill() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "lock_child_or_same_process_check", "--nocapture"])
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("LOCKED") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "child exited before taking the lock"
        );
    }
    let error = FactLog::open(&path).unwrap_err();
    assert!(matches!(error, LogError::Locked { .. }), "{error}");
    assert!(error.to_string().contains("locked by another process"));

    child.kill().unwrap();
    child.wait().unwrap();
    let (log, contents) = FactLog::open(&path).unwrap();
    assert_eq!(contents.facts, facts(4)[..1]);
    assert_eq!(log.next_seq(), Seq(2));
}

/// Opening a log directory removes logs that a killed process left: nobody holds them and
/// they were last written over an hour ago. A log a process holds, however old, and a recent
/// one stay.
#[test]
fn opening_the_directory_removes_logs_killed_processes_left() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("runs");
    let logs = LogDir::open(&root).unwrap();
    let hour_and_more = std::time::SystemTime::now() - std::time::Duration::from_secs(3700);
    let age = |run: &str| {
        std::fs::File::options()
            .write(true)
            .open(logs.path_for(run))
            .unwrap()
            .set_modified(hour_and_more)
            .unwrap();
    };
    for run in ["abandoned", "held", "recent"] {
        let (mut log, _) = logs.open_log(run).unwrap();
        log.append_all(&sample::run(run, 2, 1)).unwrap();
    }
    age("abandoned");
    age("held");
    let (held, _) = logs.open_log("held").unwrap();
    // Other files, old too: one not named like a log, one named like a log but holding
    // something else (a tool's ledger in a shared directory).
    let notes = root.join("notes.txt");
    let ledger = root.join("ledger.jsonl");
    std::fs::write(&notes, b"not a log").unwrap();
    std::fs::write(&ledger, b"{\"step\": 1}\n").unwrap();
    for other in [&notes, &ledger] {
        std::fs::File::options()
            .write(true)
            .open(other)
            .unwrap()
            .set_modified(hour_and_more)
            .unwrap();
    }
    LogDir::open(&root).unwrap();
    assert!(!logs.path_for("abandoned").exists());
    assert!(logs.path_for("held").exists(), "a held log was removed");
    assert!(logs.path_for("recent").exists());
    assert!(notes.exists(), "a file that is not a log was removed");
    assert!(
        ledger.exists(),
        "a .jsonl file that is not a log was removed"
    );
    drop(held);
    assert_eq!(
        logs.sweep_abandoned(std::time::Duration::from_secs(3600)),
        1
    );
    assert!(!logs.path_for("held").exists());
}
