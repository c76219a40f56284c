//! `rekindle bench soak`, short: the real binaries under a stream of hosts, some killed -9,
//! must hold every invariant and leave behind only what live processes own. The long run
//! (30 minutes at the defaults) and its curve are in the README.

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
            assert!(
                sample["rss_mib"][process].as_f64().unwrap() > 0.0,
                "{sample}"
            );
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
