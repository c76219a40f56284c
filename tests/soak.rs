//! `rekindle bench soak`, short: the real binaries under a stream of hosts, some killed -9,
//! must hold every invariant and leave behind only what live processes own. The long run
//! (30 minutes at the defaults) and its curve are in the README.

#![allow(clippy::disallowed_methods)] // real processes on real time: waits are wall time.

use std::process::Command;
use std::time::Duration;

use rekindle::fleet::soak::{self, SoakOptions};
use rekindle::store::StoreSettings;

fn report_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

#[test]
fn a_short_soak_holds_every_invariant_and_leaves_only_live_processes() {
    let output = Command::new(env!("CARGO_BIN_EXE_rekindle"))
        .args(["bench", "soak", "--minutes", "0.3", "--arrival-ms", "250"])
        .args([
            "--kill-percent",
            "40",
            "--ttl-ms",
            "1000",
            "--sample-s",
            "5",
        ])
        .args(["--settle-s", "120", "--steps", "3", "--step-ms", "100"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "soak failed: {stderr}");
    let lines = report_lines(&output.stdout);
    let (report, samples) = lines.split_last().unwrap();
    assert_eq!(report["bench"], "soak", "{report}");
    assert!(samples.len() >= 3, "{} samples", samples.len());
    for sample in samples {
        assert_eq!(sample["bench"], "soak-sample");
        for process in ["coordinator", "worker-0", "worker-1"] {
            let rss = sample["rss_mib"][process].as_f64().unwrap();
            let heap = sample["heap_mib"][process].as_f64().unwrap();
            assert!(0.0 < heap && heap < rss, "{sample}");
        }
    }
    let count = |v: &serde_json::Value| v.as_u64().unwrap();
    assert!(count(&report["runs"]) >= 20, "{report}");
    assert!(count(&report["killed"]) >= 3, "{report}");
    assert!(count(&report["recovered"]) >= 1, "{report}");
    assert_eq!(
        count(&report["runs"]),
        count(&report["finished_by_host"])
            + count(&report["recovered"])
            + count(&report["never_started"]),
        "{report}"
    );
    assert_eq!(report["violations"], serde_json::json!([]), "{report}");
    // After the settle: no run left to recover, and the killed hosts' heartbeats removed
    // (the coordinator's and the two workers' remain).
    let end = &report["end"]["objects"];
    assert_eq!(count(&end["index"]), 0, "{report}");
    assert!(count(&end["heartbeats"]) <= 3, "{report}");
    // After a graceful stop, nothing of the fleet's processes is left.
    let after = &report["objects_after_stop"];
    for prefix in ["heartbeats", "workers", "inbox", "index"] {
        assert_eq!(count(&after[prefix]), 0, "{prefix}: {report}");
    }
    assert!(count(&after["runs"]) > 0, "{report}");
}

#[tokio::test]
async fn a_soak_without_the_fleet_binaries_names_what_is_missing() {
    let missing = tempfile::tempdir().unwrap();
    let options = SoakOptions {
        duration: Duration::from_secs(1),
        arrival: Duration::from_millis(500),
        kill_percent: 0,
        workers: 1,
        steps: 1,
        step_time: Duration::from_millis(1),
        sample_every: Duration::from_secs(1),
        store: None,
        store_settings: StoreSettings::default(),
        bin_dir: missing.path().to_owned(),
        ttl: None,
        seed: 1,
        settle: Duration::from_secs(1),
    };
    let error = soak::soak(&options, |_| {}).await.unwrap_err().to_string();
    assert!(
        error.contains("cannot start") && error.contains("rekindle-coordinator"),
        "{error}"
    );
}

/// A soak stopped by a signal stops its fleet and hosts and removes its work directory,
/// and says so; it exits non-zero.
#[test]
fn a_soak_stopped_by_a_signal_leaves_nothing_running() {
    use std::io::BufRead;
    let mut soak = Command::new(env!("CARGO_BIN_EXE_rekindle"))
        .args(["bench", "soak", "--minutes", "1", "--ttl-ms", "1000"])
        .args(["--sample-s", "1", "--arrival-ms", "200"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = soak.id();
    // Running with hosts in flight: a few samples in.
    let stdout = soak.stdout.take().unwrap();
    let samples = std::io::BufReader::new(stdout)
        .lines()
        .take(3)
        .map(Result::unwrap)
        .collect::<Vec<_>>();
    assert_eq!(samples.len(), 3, "{samples:?}");
    let work = format!("rekindle-soak-{pid}-");
    let running = || {
        Command::new("pgrep")
            .args(["-f", &work])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).lines().count())
            .unwrap_or(0)
    };
    assert!(running() >= 3, "the fleet is not running");
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let output = soak.wait_with_output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("interrupted"), "{stderr}");
    // A killed host's tool call in flight (a shell sleeping 0.2 s) ends on its own.
    for _ in 0..100 {
        if running() == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let listing = Command::new("pgrep").args(["-af", &work]).output().unwrap();
    assert_eq!(
        running(),
        0,
        "processes of the soak are still running: {}",
        String::from_utf8_lossy(&listing.stdout)
    );
    let left = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .any(|entry| entry.file_name().to_string_lossy().starts_with(&work));
    assert!(!left, "the work directory was left behind");
}
