//! The `rekindle` command line as a user runs it, plus the shipped sample log it is shown on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rekindle::core::fact::{self, Fact};
use rekindle::core::fold::Step;
use rekindle::core::rng::SplitMix;
use rekindle::core::sample::Builder;

fn rekindle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rekindle"))
        .args(args)
        .output()
        .unwrap()
}

/// A runtime for the store setup a test does before running the binary.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Opens (creating) a local-directory store at `bucket`, as the CLI would.
async fn open_store(bucket: &Path) -> rekindle::store::Store {
    use rekindle::store::{Store, StoreSettings, StoreUrl};
    let url: StoreUrl = bucket.to_str().unwrap().parse().unwrap();
    Store::open(
        &url,
        &StoreSettings::default(),
        rekindle::clock::SystemClock::shared(),
    )
    .await
    .unwrap()
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/interrupted-run.jsonl")
}

/// The shipped sample: a run interrupted mid tool round (some results recorded, some calls
/// still pending), ending in a torn line as a crash during an append leaves it.
fn interrupted_run() -> (Vec<Fact>, Vec<u8>) {
    let mut random = SplitMix::new(11);
    let mut builder = Builder::new("sample-run");
    loop {
        builder.step(&mut |bound| random.below(bound), true);
        let last_was_result = matches!(
            builder.state().facts().last().map(|f| &f.body),
            Some(fact::FactBody::ToolResult(_))
        );
        if builder.len() >= 24
            && last_was_result
            && matches!(builder.state().next_step(), Step::RunTools { .. })
        {
            break;
        }
    }
    let facts = builder.into_facts();
    let mut bytes = Vec::new();
    for fact in &facts {
        bytes.extend(fact::encode(fact).unwrap());
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(br#"{"v":1,"seq":"#);
    (facts, bytes)
}

// Proves the shipped sample log is exactly what the generator makes, so the wire format of
// schema 1 cannot drift unnoticed. Set REKINDLE_BLESS=1 to rewrite it after a deliberate change.
#[test]
fn shipped_sample_matches_the_generator() {
    let (_, bytes) = interrupted_run();
    if std::env::var_os("REKINDLE_BLESS").is_some() {
        std::fs::write(fixture(), &bytes).unwrap();
    }
    assert_eq!(std::fs::read(fixture()).unwrap(), bytes);
}

// Proves `rekindle fold` prints the next step, the pending calls and the torn-tail note.
#[test]
fn fold_prints_the_state() {
    let out = rekindle(&["fold", fixture().to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stdout.contains("run        sample-run (session sample-session)"),
        "{stdout}"
    );
    assert!(stdout.contains("next step  run tools: call_"), "{stdout}");
    assert!(stdout.contains("terminal   no"), "{stdout}");
    assert!(stderr.contains("skipped a torn last line"), "{stderr}");
}

// Proves `--json` gives the same state as the library's fold.
#[test]
fn fold_json_matches_the_library() {
    let (facts, _) = interrupted_run();
    let state = rekindle::core::fold::fold(facts).unwrap();
    let out = rekindle(&["fold", fixture().to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{out:?}");
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["next_step"]["step"], "run_tools");
    assert_eq!(value["facts"], state.facts().len() as u64);
    assert_eq!(
        value["counters"]["tool_results"],
        state.counters().tool_results
    );
    assert_eq!(
        value["pending_calls"].as_array().unwrap().len(),
        state.pending_calls().len()
    );
    assert_eq!(value["torn_tail_line"], state.facts().len() as u64 + 1);
}

// Proves a corrupt log fails with one clear line naming the file and line, and exit code 1.
#[test]
fn fold_of_a_corrupt_log_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    let mut text = std::fs::read_to_string(fixture()).unwrap();
    text = text.replacen("\"kind\":\"model.turn\"", "\"kind\":\"model.tur", 1);
    std::fs::write(&path, text).unwrap();
    let out = rekindle(&["fold", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("fact log {}: line 3 is corrupt", path.display())),
        "{stderr}"
    );
}

// Proves a log that breaks the run's rules is refused naming the fact.
#[test]
fn fold_of_an_invalid_run_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gap.jsonl");
    let text = std::fs::read_to_string(fixture()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&path, format!("{}\n{}\n", lines[0], lines[2])).unwrap();
    let out = rekindle(&["fold", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("expected seq 2, facts 2..2 are missing"),
        "{stderr}"
    );
}

// Proves a missing file is a clear error naming it.
#[test]
fn fold_of_a_missing_file_names_it() {
    let out = rekindle(&["fold", "/nonexistent/run.jsonl"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("fact log /nonexistent/run.jsonl: cannot open"),
        "{stderr}"
    );
}

// Proves `--help` documents the commands and the fleet binaries print their usage.
#[test]
fn help_documents_commands() {
    let out = rekindle(&["--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap().contains("fold"));
    for bin in [
        env!("CARGO_BIN_EXE_rekindle-worker"),
        env!("CARGO_BIN_EXE_rekindle-coordinator"),
    ] {
        let help = Command::new(bin).arg("--help").output().unwrap();
        assert!(help.status.success());
        assert!(String::from_utf8(help.stdout).unwrap().contains("Usage:"));
        let bare = Command::new(bin).output().unwrap();
        assert_eq!(bare.status.code(), Some(2), "{bin} without arguments");
    }
}

/// `rekindle` with extra environment variables (and the store ones the tests set cleared).
fn rekindle_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rekindle"));
    for name in [
        "REKINDLE_STORE",
        "REKINDLE_SEAL_KEY",
        "REKINDLE_SEAL_KEY_FILE",
        "REKINDLE_SEAL_OLD_KEYS",
        "REKINDLE_FAULTS",
        "REKINDLE_FAULTS_PARTITION_FILE",
    ] {
        command.env_remove(name);
    }
    command
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap()
}

// Proves a malformed --store URL (flag or REKINDLE_STORE) is refused before anything runs,
// naming the URL and what is wrong with it, with the usage exit code.
#[test]
fn malformed_store_url_is_refused_naming_it() {
    for (url, reason) in [
        ("ftp://host/runs", "unknown scheme 'ftp'"),
        ("s3://", "no bucket name"),
        ("s3://my bucket/runs", "which no bucket name has"),
        ("file://relative/dir", "needs an absolute path"),
    ] {
        let out = rekindle_with(&["status", "--store", url], &[]);
        assert_eq!(out.status.code(), Some(2), "{url}: {out:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains(&format!("invalid store URL '{url}'")) && stderr.contains(reason),
            "{url}: {stderr}"
        );
    }
    // A path that names a file (a typo for the directory beside it): refused as such by a
    // command that only reads and by one that would create the store.
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().to_str().unwrap();
    for command in ["status", "probe"] {
        let out = rekindle_with(&[command, "--store", path], &[]);
        assert_eq!(out.status.code(), Some(1), "{command}: {out:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains(&format!("{path} is a file; a local store is a directory")),
            "{command}: {stderr}"
        );
    }
    let out = rekindle_with(&["probe"], &[("REKINDLE_STORE", "gs://bucket")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("invalid store URL 'gs://bucket'"),
        "{stderr}"
    );
}

// Proves a bad sealing key fails the command with one line naming where the key came from,
// never echoing it, and that a missing key file is named.
#[test]
fn bad_seal_key_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("bucket");
    let store = store.to_str().unwrap();
    let secret = "not-hex-but-secret-0123";
    let out = rekindle_with(
        &["probe", "--store", store],
        &[("REKINDLE_SEAL_KEY", secret)],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "open the store: encryption key REKINDLE_SEAL_KEY: expected 64 hex characters"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains(secret), "{stderr}");
    let missing = dir.path().join("no-such-key");
    let out = rekindle_with(
        &["probe", "--store", store],
        &[("REKINDLE_SEAL_KEY_FILE", missing.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(&format!(
            "encryption key file {} (REKINDLE_SEAL_KEY_FILE): cannot read it: No such file",
            missing.display()
        )),
        "{stderr}"
    );
    let out = rekindle_with(
        &["probe", "--store", store],
        &[("REKINDLE_SEAL_KEY", &"ab".repeat(32))],
    );
    assert!(out.status.success(), "{out:?}");
}

// Proves a typo in the test-only REKINDLE_FAULTS is an error naming the setting, not a
// fault test that silently injects nothing, and that fault injection, when on, is logged.
#[test]
fn fault_spec_typo_is_refused_and_faults_are_logged() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("bucket");
    let store = store.to_str().unwrap();
    let out = rekindle_with(
        &["probe", "--store", store],
        &[("REKINDLE_FAULTS", "seed=3,eror=40")],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("read REKINDLE_FAULTS: fault setting 'eror=40'"),
        "{stderr}"
    );
    let out = rekindle_with(
        &["probe", "--store", store],
        &[("REKINDLE_FAULTS", "seed=3"), ("RUST_LOG", "warn")],
    );
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("store fault injection is on: for tests only"),
        "{stderr}"
    );
}

// Proves `demo` takes the same store flags as every other command, and runs on a store
// given by URL.
#[test]
fn demo_takes_the_store_flags() {
    let help = rekindle_with(&["demo", "--help"], &[]);
    let text = String::from_utf8(help.stdout).unwrap();
    for flag in [
        "--store",
        "--endpoint",
        "--allow-http",
        "--virtual-hosted-style",
        "--region",
        "--store-timeout-ms",
    ] {
        assert!(text.contains(flag), "demo --help lacks {flag}: {text}");
    }
    let out = rekindle_with(
        &[
            "demo",
            "--runs",
            "6",
            "--workers",
            "2",
            "--store",
            "memory://",
            "--store-timeout-ms",
            "5000",
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["store"], "memory://");
    assert_eq!(summary["completed"], 6);
}

// New-user finding: a malformed `--endpoint` made every command panic inside the S3 client
// (exit 101 and a backtrace); it is now an error naming the endpoint.
#[test]
fn a_bad_endpoint_is_an_error_not_a_panic() {
    for endpoint in ["not-a-url", ""] {
        let out = rekindle_with(
            &[
                "status",
                "--store",
                "s3://bucket/p",
                "--endpoint",
                endpoint,
                "--allow-http",
            ],
            &[
                ("AWS_ACCESS_KEY_ID", "x"),
                ("AWS_SECRET_ACCESS_KEY", "y"),
                ("AWS_REGION", "us-east-1"),
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            stderr.contains(&format!("endpoint '{endpoint}' is not an absolute URL")),
            "{stderr}"
        );
    }
}

// New-user findings: `demo --workers 0` hung (nothing could recover the crashed runs), and
// `recover --all` exited 0 when a run could not be admitted, so a batch job saw success.
#[test]
fn demo_needs_a_worker_and_recover_all_fails_when_an_admission_fails() {
    let out = rekindle(&["demo", "--workers", "0"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workers"));

    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let runtime = runtime();
    runtime.block_on(async {
        use rekindle::core::record::{IndexEntry, Phase};
        let store = open_store(&bucket).await;
        // An interrupted run (no holder) whose only generation is damaged: it cannot be
        // admitted.
        let run = rekindle::core::fact::RunId::new("cor-1");
        let entry = IndexEntry::new(run, None, Phase::Running, "fp".into(), 1);
        rekindle::fleet::lifecycle::host_started(&store, &entry)
            .await
            .unwrap();
        let base = rekindle::core::layout::run_base("cor-1");
        store
            .put(
                &rekindle::core::layout::generation(&base, 1),
                bytes::Bytes::from_static(b"{not json"),
            )
            .await
            .unwrap();
    });
    let out = recover_all_takeover(&bucket);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("run cor-1:"), "{stderr}");
    assert!(
        stderr.contains("1 interrupted runs could not be admitted"),
        "{stderr}"
    );
}

// Proves the bench refuses what cannot give an honest figure: a store inside one process (its
// host is another process, killed -9) and worker counts that are not counts, each with a
// message naming the problem and a non-zero exit, before any fleet starts.
#[test]
fn bench_refuses_a_memory_store_and_bad_worker_counts() {
    let memory = rekindle(&[
        "bench",
        "crash-recover",
        "--runs",
        "2",
        "--mode",
        "takeover",
        "--store",
        "memory://",
    ]);
    assert_eq!(memory.status.code(), Some(1), "{memory:?}");
    let stderr = String::from_utf8_lossy(&memory.stderr);
    assert!(
        stderr.contains("memory://") && stderr.contains("another"),
        "{stderr}"
    );
    let out = rekindle(&["bench", "crash-recover", "--queue", "-1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid value '-1' for '--queue"),
        "{out:?}"
    );
    let out = rekindle(&["bench", "scale", "--workers", "3"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--workers does not apply"),
        "{out:?}"
    );
    for bad in ["0,1", "abc", "1,,2", "-1"] {
        let out = rekindle(&["bench", "scale", &format!("--counts={bad}")]);
        assert_eq!(out.status.code(), Some(2), "--counts={bad}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("is not a worker count"),
            "--counts={bad}: {stderr}"
        );
    }
}

// Proves a small `bench crash-recover` runs end to end as the README shows it: the host is
// killed half-way, every run is completed by its recovery, the audit finds nothing, and the
// report carries the figures the README quotes, the recovery's CPU time included (the
// evidence that a run is bound by this machine's cores rather than by the fleet).
#[test]
fn a_small_crash_recover_bench_reports_every_figure() {
    let out = rekindle(&[
        "bench",
        "crash-recover",
        "--runs",
        "4",
        "--steps",
        "6",
        // Slow enough that the host cannot finish its runs between the bench's look at the
        // ledger and the kill (a recovery must be left to measure).
        "--step-ms",
        "50",
        "--workers",
        "2",
        "--mode",
        "takeover",
    ]);
    let report = bench_report(&out);
    assert_eq!(report["bench"], "crash-recover", "{report}");
    assert_eq!(report["ledger_violations"], 0, "{report}");
    let runs = report["runs"].as_u64().unwrap();
    let never_started = report["never_started"].as_u64().unwrap();
    assert_eq!(
        report["completed"].as_u64(),
        Some(runs - never_started),
        "{report}"
    );
    let number = |field: &str| {
        report[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{field} missing: {report}"))
    };
    assert!(number("recovered") >= 1.0, "{report}");
    assert!(
        report["requests_per_recovered_run"]["total"].as_f64() > Some(0.0),
        "{report}"
    );
    let cpu = number("recovery_cpu_s");
    let wall = number("recovery_wall_s");
    assert!(cpu > 0.0, "a recovery that ran used no CPU: {report}");
    assert!(
        (number("cores_busy") - cpu / wall).abs() < 1e-6,
        "cores_busy is cpu over wall: {report}"
    );
    assert!(number("cores") >= 1.0, "{report}");
    assert!(
        (number("cpu_ms_per_step") - cpu * 1000.0 / number("steps_left")).abs() < 1e-6,
        "{report}"
    );
    assert!(
        (number("steps_per_cpu_s") - number("steps_left") / cpu).abs() < 1e-6,
        "steps_per_cpu_s is steps over CPU seconds: {report}"
    );
    let total = number_at(&report["requests_per_recovered_run"]);
    let roles = report["requests_per_recovered_run_by_role"]
        .as_object()
        .unwrap_or_else(|| panic!("requests by role missing: {report}"));
    for role in ["coordinator", "workers", "operator"] {
        assert!(roles.contains_key(role), "{role} missing: {report}");
    }
    let by_roles: f64 = roles.values().map(number_at).sum();
    assert!(
        (by_roles - total).abs() < 1e-6,
        "the roles' requests add up to the total: {report}"
    );
}

fn number_at(requests: &serde_json::Value) -> f64 {
    requests["total"]
        .as_f64()
        .unwrap_or_else(|| panic!("no total in {requests}"))
}

#[test]
fn the_round_trips_bench_counts_the_sequential_path_to_the_first_tool_call() {
    let out = rekindle(&[
        "bench",
        "round-trips",
        "--steps",
        "6",
        "--step-ms",
        "50",
        "--latency-ms",
        "40",
        "--pairs",
        "1",
    ]);
    let report = bench_report(&out);
    assert_eq!(report["bench"], "round-trips", "{report}");
    assert_eq!(report["latency_ms"], 40, "{report}");
    assert_eq!(report["pairs"], 1, "{report}");
    for list in ["without_latency_ms", "with_latency_ms"] {
        assert_eq!(report[list].as_array().map(Vec::len), Some(1), "{report}");
    }
    let trips = report["round_trips_to_first_tool_call"].as_f64().unwrap();
    // At least the recovery lease and the seed generation lie on the path.
    assert!(trips >= 1.0, "{report}");
    assert_eq!(
        report["round_trips_to_first_committed_step"].as_f64(),
        Some(trips + 1.0),
        "{report}"
    );
}

// The outage bench end to end at a small size: every interrupted run recovered once, no
// healthy run touched, the steady state measured, coordinators sampled as processes.
#[test]
fn the_outage_bench_recovers_every_interrupted_run_and_no_healthy_one() {
    let out = rekindle(&[
        "bench",
        "outage",
        "--active",
        "300",
        "--interrupted",
        "40",
        "--coordinators",
        "2",
        "--workers",
        "2",
        "--hosts",
        "3",
        "--dead-hosts",
        "2",
        "--ttl-ms",
        "1500",
        "--warmup-s",
        "1",
        "--steady-s",
        "2",
    ]);
    let report = bench_report(&out);
    assert_eq!(report["bench"], "outage", "{report}");
    assert_eq!(report["recovered"], 40, "{report}");
    assert_eq!(report["ledger_violations"], 0, "{report}");
    assert_eq!(report["interruption_to_resumption"]["n"], 40, "{report}");
    // The runs come back only after their hosts' TTL ran out.
    assert!(
        report["interruption_to_resumption"]["p50_ms"]
            .as_f64()
            .unwrap()
            >= 1500.0,
        "{report}"
    );
    assert_eq!(
        report["coordinator_peak_rss_mib"].as_array().map(Vec::len),
        Some(2),
        "{report}"
    );
    assert!(
        report["steady"]["coordinator_requests_per_s"]["total"]
            .as_f64()
            .unwrap()
            > 0.0,
        "the leader's steady state makes requests: {report}"
    );
    let roles = report["requests_per_recovered_run_by_role"]
        .as_object()
        .unwrap();
    assert!(number_at(&roles["coordinators"]) > 0.0, "{report}");
    assert!(number_at(&roles["workers"]) > 0.0, "{report}");
}

#[test]
fn the_outage_bench_refuses_more_interrupted_runs_than_active_ones() {
    let out = rekindle(&["bench", "outage", "--active", "10", "--interrupted", "11"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--interrupted (11) must not exceed --active (10)"),
        "{stderr}"
    );
}

// New-user pass: `recover RUN --recovery-id ID` announced "watching its heartbeat for up to
// 30 s" and then refused at once, because ID already names a run. The watch is announced only
// when the admission will really wait.
#[test]
fn recover_does_not_announce_a_watch_it_will_not_make() {
    use rekindle::core::fact::RunId;
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let runtime = runtime();
    runtime.block_on(async {
        let store = open_store(&bucket).await;
        let host =
            rekindle::store::lease::Holder::new(&store, "host", std::time::Duration::from_secs(30));
        host.beat().await.unwrap();
        host.acquire(&RunId::new("held-1")).await.unwrap();
        host.acquire(&RunId::new("taken-id")).await.unwrap();
    });
    let out = rekindle(&[
        "recover",
        "held-1",
        "--recovery-id",
        "taken-id",
        "--store",
        bucket.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_ne!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("already names a run"), "{stderr}");
    assert!(!stdout.contains("watching"), "{stdout}");
}

/// `rekindle recover --all --takeover` on the store at `bucket`.
fn recover_all_takeover(bucket: &std::path::Path) -> std::process::Output {
    rekindle(&[
        "recover",
        "--all",
        "--takeover",
        "--store",
        bucket.to_str().unwrap(),
    ])
}

// Proves `recover --all --takeover` does not fail a batch, again and again, on a run whose
// host died before its first commit (after taking the lease and writing the index entry):
// nothing was acknowledged, so nothing is lost. The fence takes the run's first slot (a host
// that was only slow cannot start it any more), the entry leaves the index, as the
// coordinator's admission does, and the command exits 0. Before, it exited 1 naming the run,
// and every later `recover --all` did the same until a coordinator cleared the entry. A claim
// an earlier admission left on the run (it crashed after claiming) is given back.
#[test]
fn recover_all_clears_a_run_that_never_made_its_first_commit() {
    use rekindle::core::fact::RunId;
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let runtime = runtime();
    let run = RunId::new("unstarted-1");
    let store = runtime.block_on(async {
        use rekindle::core::record::{IndexEntry, Phase};
        let store = open_store(&bucket).await;
        let host =
            rekindle::store::lease::Holder::new(&store, "host", std::time::Duration::from_secs(30));
        host.acquire(&run).await.unwrap();
        let mut entry = IndexEntry::new(run.clone(), None, Phase::Running, "fp".into(), 1);
        entry.holder = Some(host.heartbeat_key());
        rekindle::fleet::lifecycle::host_started(&store, &entry)
            .await
            .unwrap();
        // An earlier admission claimed it and crashed before it found nothing to recover.
        let id = rekindle::core::assignment::recovery_id_for(&run);
        rekindle::store::recovery::claim(&store, &run, &id)
            .await
            .unwrap();
        store
    });
    let recover_all = || {
        let out = recover_all_takeover(&bucket);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, text) = recover_all();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("run unstarted-1: its host stopped before its first commit")
            && text.contains("nothing to recover, removed from the index"),
        "{text}"
    );
    let (left, slow_host) = runtime.block_on(async {
        use rekindle::store::generation::{RunWriter, SnapshotPolicy};
        let left = rekindle::store::index::read(&store, &run).await.unwrap();
        let mut random = SplitMix::new(4);
        let mut builder = Builder::new("unstarted-1");
        builder.step(&mut |bound| random.below(bound), true);
        let first = RunWriter::create(
            &store,
            builder.into_facts(),
            rekindle::core::epoch::Epoch(1),
            SnapshotPolicy::default(),
        )
        .await;
        (left, first.is_err())
    });
    assert!(
        left.is_none(),
        "the run that never started is still indexed"
    );
    // `runs show` says so too, instead of calling it unfinished.
    let shown = rekindle(&[
        "runs",
        "show",
        "unstarted-1",
        "--store",
        bucket.to_str().unwrap(),
    ]);
    assert!(
        String::from_utf8_lossy(&shown.stdout)
            .contains("never started: its host stopped before its first commit"),
        "{shown:?}"
    );
    let claim = runtime.block_on(rekindle::store::recovery::claimed_by(&store, &run));
    assert_eq!(
        claim.unwrap(),
        None,
        "the crashed admission's claim was kept"
    );
    assert!(slow_host, "a slow host could still make its first commit");
    let (code, text) = recover_all();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("0 interrupted runs admitted"), "{text}");
}

// Proves `recover --all --takeover` does not fail a batch on a run that had ended: its host
// committed the end and died before leaving the index. The run is named as ended, its stale
// entry leaves the index at once (before, it stayed until the coordinator waited out the
// holder's TTL), and the command exits 0.
#[test]
fn recover_all_clears_a_run_that_had_already_ended() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let runtime = runtime();
    let store = runtime.block_on(async {
        use rekindle::core::record::{IndexEntry, Phase};
        use rekindle::store::generation::{RunWriter, SnapshotPolicy};
        let store = open_store(&bucket).await;
        let mut random = SplitMix::new(3);
        let mut builder = Builder::new("ended-1");
        builder.step(&mut |bound| random.below(bound), true);
        builder.finish(&mut |bound| random.below(bound));
        let facts = builder.into_facts();
        RunWriter::create(
            &store,
            facts,
            rekindle::core::epoch::Epoch(1),
            SnapshotPolicy::default(),
        )
        .await
        .unwrap();
        let run = rekindle::core::fact::RunId::new("ended-1");
        let entry = IndexEntry::new(run, None, Phase::Running, "fp".into(), 1);
        rekindle::fleet::lifecycle::host_started(&store, &entry)
            .await
            .unwrap();
        store
    });
    let out = recover_all_takeover(&bucket);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("run ended-1: had already ended") && stdout.contains("nothing to recover"),
        "{stdout}"
    );
    let left = runtime.block_on(rekindle::store::index::read(
        &store,
        &rekindle::core::fact::RunId::new("ended-1"),
    ));
    assert!(left.unwrap().is_none(), "the ended run is still indexed");
}

// Proves `runs show` tells a wrong run ID from a run whose host leased it and never made its
// first commit (both have no generation), and that the commands about runs already in a store
// refuse `memory://`, which is empty in every new process, instead of reporting an empty fleet.
#[test]
fn runs_show_says_why_a_run_has_no_generation_and_memory_is_refused() {
    use rekindle::core::fact::RunId;
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    runtime().block_on(async {
        use rekindle::store::generation::{RunWriter, SnapshotPolicy};
        let store = open_store(&bucket).await;
        let host = rekindle::store::lease::Holder::new(
            &store,
            "host-7",
            std::time::Duration::from_secs(30),
        );
        host.acquire(&RunId::new("leased-only")).await.unwrap();
        let released = host.acquire(&RunId::new("released-only")).await.unwrap();
        host.release(&released).await.unwrap();
        // Two runs whose IDs are encoded in their keys, with commits: one recovered (not
        // started yet), one left out of the index.
        let mut random = SplitMix::new(9);
        for id in ["team/a", "team/b"] {
            host.acquire(&RunId::new(id)).await.unwrap();
            let mut builder = Builder::new(id);
            builder.step(&mut |bound| random.below(bound), true);
            RunWriter::create(
                &store,
                builder.into_facts(),
                rekindle::core::epoch::Epoch(1),
                SnapshotPolicy::default(),
            )
            .await
            .unwrap();
        }
        let operator = rekindle::store::lease::Holder::new(
            &store,
            "operator",
            std::time::Duration::from_secs(30),
        );
        rekindle::fleet::admission::admit(
            &store,
            &operator,
            &RunId::new("team/a"),
            &rekindle::core::fact::RecoveryId::new("rec-1"),
            false,
            rekindle::fleet::admission::Takeover::Now,
        )
        .await
        .unwrap();
    });
    let show = |run: &str| rekindle(&["runs", "show", run, "--store", bucket.to_str().unwrap()]);
    let leased = show("leased-only");
    assert_eq!(leased.status.code(), Some(1), "{leased:?}");
    let stderr = String::from_utf8_lossy(&leased.stderr);
    assert!(
        stderr
            .contains("run leased-only has no committed generation: 'host-7' leased it at epoch 1"),
        "{stderr}"
    );
    let cases = [
        (
            "released-only",
            "run released-only has no committed generation: 'host-7' leased it at epoch 1 and released it without committing",
        ),
        (
            "_rekindle-coordinator",
            "is the coordinators' leadership lease, not a run",
        ),
    ];
    for (run, says) in cases {
        let out = show(run);
        assert_eq!(out.status.code(), Some(1), "{run}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{run}: {stderr}");
    }
    // A recovery admitted and not started has no generation, but `runs show` shows its record.
    let unstarted = show("rec-1");
    assert_eq!(unstarted.status.code(), Some(0), "{unstarted:?}");
    let stdout = String::from_utf8_lossy(&unstarted.stdout);
    assert!(
        stdout.contains("recovering team/a (admitted, not started")
            && stdout.contains("recovers    team/a from its generation"),
        "{stdout}"
    );
    // `runs ls --all` lists a run whose ID is encoded in its key (it read the lease under the
    // wrong kind and dropped such runs), and explains `unfinished`.
    let listed = rekindle(&["runs", "ls", "--all", "--store", bucket.to_str().unwrap()]);
    assert_eq!(listed.status.code(), Some(0), "{listed:?}");
    let stdout = String::from_utf8_lossy(&listed.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("team/b ") && l.contains("unfinished")),
        "{stdout}"
    );
    assert!(
        String::from_utf8_lossy(&listed.stderr).contains("(unfinished: not in the index"),
        "{listed:?}"
    );
    // A state only --all lists, asked without it: said, not an empty table.
    let retired = rekindle(&[
        "runs",
        "ls",
        "--state",
        "retired",
        "--store",
        bucket.to_str().unwrap(),
    ]);
    assert_eq!(retired.status.code(), Some(1), "{retired:?}");
    assert!(
        String::from_utf8_lossy(&retired.stderr)
            .contains("--state retired: runs in that state have left the index; add --all"),
        "{retired:?}"
    );
    let missing = show("no-such-run");
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("run no-such-run does not exist in this store"),
        "{stderr}"
    );
    for args in [
        &["status", "--store", "memory://"][..],
        &["runs", "ls", "--all", "--store", "memory://"],
        &["recover", "--all", "--takeover", "--store", "memory://"],
        &["runs", "show", "r", "--store", "memory://"],
    ] {
        let out = rekindle(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("memory://: a memory store lives inside one process and starts empty"),
            "{args:?}: {stderr}"
        );
    }
}

/// The report a bench command that succeeded prints as its first line of stdout.
fn bench_report(out: &std::process::Output) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().next().unwrap_or_default()).expect("one JSON line")
}
