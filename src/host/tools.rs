//! Tools: a call in, a result out.
//!
//! [`CommandTools`] runs the command declared in `rekindle.toml` for each call: the call's
//! arguments as JSON on stdin, `REKINDLE_RUN_ID`, `REKINDLE_CALL_ID` and `REKINDLE_EPOCH` in
//! its environment (so a downstream system can de-duplicate a repeated call), a timeout after
//! which the process is killed, and stdout/stderr captured up to a bound.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::core::epoch::Epoch;
use crate::core::fact::ToolCall;
use crate::host::config::ToolConfig;

/// Most bytes kept of a tool's stdout and of its stderr; the rest is drained and counted.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// A tool as the model is told about it in a request.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDefinition {
    /// The name the model calls the tool by.
    pub name: String,
    /// What the tool does.
    pub description: String,
    /// The JSON Schema of the call's arguments.
    pub schema: serde_json::Value,
}

/// Identity handed to a tool so repeated calls can be recognised downstream.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The run's original ID, the same across its recoveries (`REKINDLE_RUN_ID`).
    pub run_id: String,
    /// The epoch the call is made at; a new epoch means the run was interrupted and resumed
    /// (`REKINDLE_EPOCH`).
    pub epoch: Epoch,
}

/// What one tool call produced, as journaled in its result fact.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    /// The text the model sees: the call's stdout, then its stderr and exit code if any.
    pub output: String,
    /// Whether the call failed (could not start, exited non-zero, timed out).
    pub is_error: bool,
    /// How long the call took, in ms.
    pub duration_ms: u64,
}

/// The tools a run's model may call; a host can implement its own.
#[async_trait]
pub trait Tools: Send + Sync {
    /// The tools offered to the model with each request that allows tool calls.
    fn definitions(&self) -> Vec<ToolDefinition>;
    /// Whether a human must approve this tool's calls first.
    fn needs_confirmation(&self, name: &str) -> bool;
    /// Runs one call. Failures are results (`is_error`), not errors: the model sees them.
    async fn call(&self, call: &ToolCall, context: &ToolContext) -> ToolOutput;
}

/// Tools that run commands, as declared in the config.
#[derive(Clone, Debug)]
pub struct CommandTools {
    tools: Vec<ToolConfig>,
}

impl CommandTools {
    /// Tools for the `[[tools]]` entries of a config.
    pub fn new(tools: Vec<ToolConfig>) -> Self {
        CommandTools { tools }
    }
}

async fn read_bounded(mut reader: impl tokio::io::AsyncRead + Unpin) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut dropped = 0u64;
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => return (kept, dropped),
            Ok(n) => {
                let room = MAX_OUTPUT_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..n.min(room)]);
                dropped += n.saturating_sub(room) as u64;
            }
        }
    }
}

fn render(bytes: &[u8], dropped: u64) -> String {
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    if dropped > 0 {
        text.push_str(&format!("\n[{dropped} more bytes not kept]"));
    }
    text
}

#[async_trait]
impl Tools for CommandTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        self.tools
            .iter()
            .map(|t| ToolDefinition {
                name: t.name.clone(),
                description: t.description.clone(),
                schema: t.schema.clone(),
            })
            .collect()
    }

    fn needs_confirmation(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.name == name && t.confirm)
    }

    async fn call(&self, call: &ToolCall, context: &ToolContext) -> ToolOutput {
        let started = crate::clock::Stopwatch::start();
        let fail = |output: String| ToolOutput {
            output,
            is_error: true,
            duration_ms: started.elapsed().as_millis() as u64,
        };
        let Some(tool) = self.tools.iter().find(|t| t.name == call.name) else {
            return fail(format!("unknown tool '{}'", call.name));
        };
        let mut command = tokio::process::Command::new(&tool.command[0]);
        command
            .args(&tool.command[1..])
            .env("REKINDLE_RUN_ID", &context.run_id)
            .env("REKINDLE_CALL_ID", call.id.as_str())
            .env("REKINDLE_EPOCH", context.epoch.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => return fail(format!("cannot start '{}': {error}", tool.command[0])),
        };
        let stdin = child.stdin.take();
        let arguments = call.arguments.clone();
        let feed = async move {
            if let Some(mut stdin) = stdin {
                let _ = stdin.write_all(arguments.as_bytes()).await;
            }
        };
        let stdout = read_bounded(child.stdout.take().expect("stdout is piped"));
        let stderr = read_bounded(child.stderr.take().expect("stderr is piped"));
        let timeout = Duration::from_millis(tool.timeout_ms);
        let run = async {
            let ((), out, err, status) = tokio::join!(feed, stdout, stderr, child.wait());
            (out, err, status)
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(((out, out_dropped), (err, err_dropped), Ok(status))) => {
                let code = status
                    .code()
                    .map_or_else(|| "killed by a signal".to_owned(), |c| c.to_string());
                let mut output = render(&out, out_dropped);
                let stderr = render(&err, err_dropped);
                if !stderr.is_empty() {
                    output.push_str(&format!("\n[stderr]\n{stderr}"));
                }
                if !status.success() {
                    output.push_str(&format!("\n[exit {code}]"));
                }
                ToolOutput {
                    output,
                    is_error: !status.success(),
                    duration_ms: started.elapsed().as_millis() as u64,
                }
            }
            Ok((_, _, Err(error))) => fail(format!("waiting for '{}' failed: {error}", tool.name)),
            Err(_) => fail(format!(
                "tool '{}' did not finish within {} ms and was killed",
                tool.name, tool.timeout_ms
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fact::CallId;

    fn tool(name: &str, script: &str, timeout_ms: u64) -> ToolConfig {
        ToolConfig {
            name: name.into(),
            description: String::new(),
            schema: serde_json::json!({"type": "object"}),
            command: vec!["sh".into(), "-c".into(), script.into()],
            timeout_ms,
            confirm: false,
        }
    }

    fn call(name: &str) -> ToolCall {
        ToolCall {
            id: CallId::new("c-7"),
            name: name.into(),
            arguments: r#"{"x":1}"#.into(),
        }
    }

    // Proves arguments arrive on stdin and identity in the environment.
    #[tokio::test]
    async fn command_gets_arguments_and_identity() {
        let tools = CommandTools::new(vec![tool(
            "echo",
            r#"cat; printf ' %s %s %s' "$REKINDLE_RUN_ID" "$REKINDLE_CALL_ID" "$REKINDLE_EPOCH""#,
            5000,
        )]);
        let context = ToolContext {
            run_id: "r-1".into(),
            epoch: Epoch(3),
        };
        let out = tools.call(&call("echo"), &context).await;
        assert_eq!(out.output, r#"{"x":1} r-1 c-7 3"#);
        assert!(!out.is_error);
    }

    // Proves failures, hangs and floods become bounded error results.
    #[tokio::test]
    async fn failures_are_results() {
        let tools = CommandTools::new(vec![
            tool("fail", "echo oops >&2; exit 3", 5000),
            tool("hang", "sleep 30", 200),
            tool("flood", "head -c 1000000 /dev/zero", 5000),
        ]);
        let context = ToolContext {
            run_id: "r".into(),
            epoch: Epoch(1),
        };
        let fail = tools.call(&call("fail"), &context).await;
        assert!(fail.is_error);
        assert!(fail.output.contains("oops") && fail.output.contains("[exit 3]"));
        let hang = tools.call(&call("hang"), &context).await;
        assert!(hang.is_error);
        assert!(
            hang.output.contains("did not finish within 200 ms"),
            "{}",
            hang.output
        );
        let flood = tools.call(&call("flood"), &context).await;
        assert!(flood.output.len() < MAX_OUTPUT_BYTES + 100);
        assert!(flood.output.contains(&format!(
            "[{} more bytes not kept]",
            1_000_000 - MAX_OUTPUT_BYTES
        )));
        let unknown = tools.call(&call("nope"), &context).await;
        assert!(unknown.is_error && unknown.output.contains("unknown tool 'nope'"));
    }
}
