//! The hostile-input corpus beyond the fold, log and store suites: each case gets a clear
//! error naming the object and the problem, and the proof that nothing else broke.

#![allow(clippy::disallowed_methods)] // real processes on real time: deadlines and pauses are wall time.

mod common;

use rekindle::core::epoch::Epoch;
use std::time::Duration;

use rekindle::core::fact::{self, Fact, FactBody, RecoveryId, RunId, Seq, ToolResult};
use rekindle::core::sample;
use rekindle::host::{Model, ModelError, ModelRequest, OpenAiModel};
use rekindle::store::generation::{self, RunWriter, SnapshotPolicy};
use rekindle::store::log::{FactLog, LogError};

const SIXTY_FOUR_MIB: usize = 64 * 1024 * 1024;

fn huge_result(seq: u64) -> Fact {
    huge_result_for(seq, "c")
}

fn huge_result_for(seq: u64, call: &str) -> Fact {
    Fact {
        seq: Seq(seq),
        at_ms: 1,
        body: FactBody::ToolResult(ToolResult {
            call_id: fact::CallId::new(call),
            output: "x".repeat(SIXTY_FOUR_MIB),
            is_error: false,
            duration_ms: 0,
        }),
    }
}

// Proves a 64 MiB fact is refused by the documented limit, in the log and in a commit, and
// the run and its other facts are untouched.
#[tokio::test]
async fn a_64_mib_fact_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let facts = sample::run("big", 10, 1);
    let (mut log, _) = FactLog::open(dir.path().join("big.jsonl")).unwrap();
    log.append_all(&facts[..3]).unwrap();
    let error = log.append(&huge_result(4)).unwrap_err();
    assert!(matches!(error, LogError::FactTooLarge { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains(&format!("over the limit of {} bytes", fact::MAX_FACT_BYTES))
    );
    drop(log);
    assert_eq!(
        rekindle::store::log::read(&dir.path().join("big.jsonl"))
            .unwrap()
            .facts,
        facts[..3]
    );

    // A 64 MiB line planted in a log is refused naming its line; a neighbour log reads fine.
    let planted = dir.path().join("planted.jsonl");
    let mut bytes = Vec::new();
    for fact in &facts[..2] {
        bytes.extend(fact::encode(fact).unwrap());
        bytes.push(b'\n');
    }
    bytes.extend(std::iter::repeat_n(b'x', SIXTY_FOUR_MIB));
    bytes.extend(b"\n");
    bytes.extend(fact::encode(&facts[2]).unwrap());
    std::fs::write(&planted, bytes).unwrap();
    let error = rekindle::store::log::read(&planted).unwrap_err();
    assert!(
        matches!(error, LogError::Corrupt { line: 3, .. }),
        "{error}"
    );

    let store = common::memory();
    let mut writer = RunWriter::create(
        &store,
        facts[..3].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await
    .unwrap();
    let pending = writer.state().pending_calls();
    let call = pending[0].call.id.as_str().to_owned();
    let error = writer
        .commit(vec![huge_result_for(4, &call)])
        .await
        .unwrap_err();
    assert!(error.to_string().contains("over the limit"), "{error}");
    writer.commit(facts[3..].to_vec()).await.unwrap();
    let loaded = generation::load(&store, &RunId::new("big"), None)
        .await
        .unwrap();
    assert_eq!(loaded.state.facts(), &facts[..]);
}

// Proves run and recovery IDs with '/', '..', NUL, newlines, unicode and 10 000 characters
// stay inside the store's directory, never collide, and round-trip.
#[tokio::test]
async fn hostile_ids_round_trip_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("bucket");
    let store = common::local(&root).await;
    let long = "z".repeat(10_000);
    let ids = [
        "../../etc/passwd",
        "..",
        "a/b/c",
        "nul\0id",
        "line\nbreak",
        "ünïcødé ✓",
        long.as_str(),
    ];
    for (i, id) in ids.iter().enumerate() {
        let mut facts = sample::run("placeholder", 12, i as u64);
        if let FactBody::Meta(meta) = &mut facts[0].body {
            meta.run_id = RunId::new(*id);
        }
        RunWriter::create(
            &store,
            facts[..5].to_vec(),
            Epoch(1),
            SnapshotPolicy::default(),
        )
        .await
        .unwrap();
        let loaded = generation::load(&store, &RunId::new(*id), None)
            .await
            .unwrap();
        assert_eq!(loaded.state.facts(), &facts[..5], "{id:?}");
        let recovery = RecoveryId::new(format!("{id}/recovery"));
        let admitted = rekindle::store::recovery::admit(&store, &RunId::new(*id), &recovery, false)
            .await
            .unwrap();
        assert_eq!(admitted.record.recovery_id, recovery);
    }
    // Nothing was written outside the bucket directory.
    let outside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name != "bucket")
        .collect();
    assert!(outside.is_empty(), "{outside:?}");
}

/// A local HTTP server answering every request with `status` and `body` after `delay`.
async fn fake_server(status: u16, body: &'static str, delay: Duration) -> String {
    use axum::http::StatusCode;
    let app = axum::Router::new().fallback(move || async move {
        rekindle::clock::sleep(delay).await;
        (StatusCode::from_u16(status).unwrap(), body)
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{address}")
}

fn request_state() -> rekindle::core::fold::RunState {
    rekindle::core::fold::fold(sample::run("m", 10, 1)[..2].to_vec()).unwrap()
}

// Proves a model endpoint that returns garbage gets a clear error naming the endpoint, and
// one that hangs times out (after bounded retries) instead of hanging the run.
#[tokio::test]
async fn model_endpoint_garbage_and_timeouts() {
    let garbage = fake_server(200, "<html>not a completion</html>", Duration::ZERO).await;
    let model = OpenAiModel::new(&garbage, "m", None, Duration::from_secs(5)).unwrap();
    let state = request_state();
    let request = || ModelRequest {
        system_prompt: "s",
        state: &state,
        tools: &[],
    };
    let error = model.complete(request()).await.unwrap_err();
    assert!(matches!(error, ModelError::Garbage { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains(&format!("{garbage}/chat/completions")),
        "{error}"
    );

    let slow = fake_server(200, "{}", Duration::from_secs(30)).await;
    let model = OpenAiModel::new(&slow, "m", None, Duration::from_millis(150)).unwrap();
    let started = std::time::Instant::now();
    let error = model.complete(request()).await.unwrap_err();
    assert!(error.to_string().contains("timed out"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(25));
}

// Proves wrong credentials give a clear "access denied" error at open, and the secret key
// never appears in it.
#[tokio::test]
async fn wrong_credentials_are_named_without_the_secret() {
    let denied = fake_server(
        403,
        "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>",
        Duration::ZERO,
    )
    .await;
    let secret = "wJalrXUtnFEMI-this-must-not-leak";
    // The store reads credentials from the environment of this test process only.
    // tokio's Command: the fake server runs on this test's runtime and must keep serving.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_rekindle"))
        .args([
            "probe",
            "--store",
            "s3://some-bucket/prefix",
            "--endpoint",
            &denied,
            "--allow-http",
        ])
        .env("AWS_ACCESS_KEY_ID", "AKIDWRONG")
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("access denied")
            || stderr.contains("AccessDenied")
            || stderr.contains("403"),
        "{stderr}"
    );
    assert!(!stderr.contains(secret), "{stderr}");
    assert_eq!(
        stderr
            .trim_end()
            .lines()
            .filter(|l| l.starts_with("error:"))
            .count(),
        1,
        "{stderr}"
    );
}

// Proves a tool that prints 1 GiB is captured within the documented bound and the run goes on.
#[tokio::test]
async fn a_tool_printing_one_gib_is_bounded() {
    use rekindle::host::{CommandTools, ToolContext, Tools};
    let tools = CommandTools::new(vec![rekindle::host::config::ToolConfig {
        name: "flood".into(),
        description: String::new(),
        schema: serde_json::json!({"type": "object"}),
        command: vec![
            "sh".into(),
            "-c".into(),
            "head -c 1073741824 /dev/zero".into(),
        ],
        timeout_ms: 60_000,
        confirm: false,
    }]);
    let call = fact::ToolCall {
        id: fact::CallId::new("c"),
        name: "flood".into(),
        arguments: "{}".into(),
    };
    let output = tools
        .call(
            &call,
            &ToolContext {
                run_id: "r".into(),
                epoch: Epoch(1),
            },
        )
        .await;
    assert!(!output.is_error);
    assert!(output.output.len() < rekindle::host::tools::MAX_OUTPUT_BYTES + 100);
    assert!(output.output.ends_with(&format!(
        "[{} more bytes not kept]",
        1_073_741_824 - rekindle::host::tools::MAX_OUTPUT_BYTES
    )));
}

// Proves an API key echoed back by a hostile endpoint never reaches the error message. (The
// key is taken from an environment variable every process has, HOME, so the test needs no
// environment changes.)
#[tokio::test]
async fn an_echoed_api_key_is_redacted() {
    let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        (
            axum::http::StatusCode::UNAUTHORIZED,
            format!("bad credentials: {auth}"),
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let key = std::env::var("HOME").unwrap();
    assert!(key.len() >= 4, "HOME is too short to stand in for a key");
    let model = OpenAiModel::new(
        &format!("http://{address}"),
        "m",
        Some("HOME".into()),
        Duration::from_secs(5),
    )
    .unwrap();
    let state = request_state();
    let error = model
        .complete(ModelRequest {
            system_prompt: "s",
            state: &state,
            tools: &[],
        })
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("bad credentials: Bearer [redacted]"),
        "{text}"
    );
    assert!(!text.contains(&format!("Bearer {key}")), "{text}");
}
