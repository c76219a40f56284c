//! Models: one assistant turn from a conversation and tool definitions.
//!
//! [`ScriptedModel`] picks its turn from a script by the number of model turns the folded
//! state already holds, so a replay after recovery continues the script exactly where the
//! committed facts end. [`OpenAiModel`] speaks the chat-completions protocol (vLLM, Ollama,
//! llama.cpp server, hosted APIs) with timeouts and bounded retries on 429 and 5xx. The API
//! key is read from the environment at call time and never logged or stored.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::core::fact::{CallId, ModelTurn, ToolCall, Usage};
use crate::core::fold::{Message, RunState};
use crate::host::tools::ToolDefinition;

/// What the model is asked.
pub struct ModelRequest<'a> {
    /// The configured system prompt, sent first.
    pub system_prompt: &'a str,
    /// The run's committed state, whose messages are the conversation so far.
    pub state: &'a RunState,
    /// Empty when the tool-round cap was reached.
    pub tools: &'a [ToolDefinition],
}

/// Why a model produced no turn.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The endpoint could not be reached, timed out, or answered 429 or 5xx, after the
    /// client's retries.
    #[error("model endpoint {url}: {message}")]
    Endpoint {
        /// The chat-completions URL.
        url: String,
        /// What went wrong, without the URL and with the API key redacted.
        message: String,
    },
    /// The endpoint answered another 4xx, or a body that is not a chat completion.
    #[error("model endpoint {url} returned something that is not a chat completion: {message}")]
    Garbage {
        /// The chat-completions URL.
        url: String,
        /// The status or parse error, with the API key redacted.
        message: String,
    },
    /// The model section is incomplete, or the script or HTTP client cannot be set up.
    #[error("model configuration: {0}")]
    Config(String),
}

impl ModelError {
    fn is_transient(&self) -> bool {
        matches!(self, ModelError::Endpoint { .. })
    }
}

/// What answers a run's model turns; a host can implement its own.
#[async_trait]
pub trait Model: Send + Sync {
    /// The next assistant turn for the conversation in `request`.
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelTurn, ModelError>;
}

/// One scripted turn.
#[derive(Clone, Debug, Deserialize)]
pub struct ScriptedTurn {
    /// The assistant's text for the turn.
    #[serde(default)]
    pub content: Option<String>,
    /// The tool calls the turn makes; dropped when the request offers no tools.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
}

/// One tool call in a scripted turn; its call ID is derived from its position.
#[derive(Clone, Debug, Deserialize)]
pub struct ScriptedCall {
    /// The tool to call.
    pub name: String,
    /// The call's arguments, sent to the tool as JSON.
    #[serde(default)]
    pub arguments: Value,
}

/// A deterministic model for demos and tests.
#[derive(Clone, Debug)]
pub struct ScriptedModel {
    turns: Vec<ScriptedTurn>,
}

impl ScriptedModel {
    /// A model that answers the n-th model turn of a run with `turns[n]`, and finishes once
    /// they run out.
    pub fn new(turns: Vec<ScriptedTurn>) -> Self {
        ScriptedModel { turns }
    }

    /// Reads a script: a JSON array of turns (`{"content": ..., "tool_calls": [{"name":
    /// ..., "arguments": {...}}]}`).
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ModelError::Config(format!("cannot read script {}: {e}", path.display()))
        })?;
        let turns = serde_json::from_str(&text)
            .map_err(|e| ModelError::Config(format!("script {}: {e}", path.display())))?;
        Ok(ScriptedModel { turns })
    }
}

#[async_trait]
impl Model for ScriptedModel {
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelTurn, ModelError> {
        let index = request.state.counters().model_turns as usize;
        let Some(turn) = self.turns.get(index) else {
            return Ok(ModelTurn {
                content: Some("Done: the script has no more turns.".into()),
                tool_calls: Vec::new(),
                reasoning: None,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                },
            });
        };
        let tool_calls = if request.tools.is_empty() {
            Vec::new()
        } else {
            turn.tool_calls
                .iter()
                .enumerate()
                .map(|(i, call)| ToolCall {
                    // Deterministic IDs: the same turn replayed names its calls the same way.
                    id: CallId::new(format!("call_{}_{}", index + 1, i + 1)),
                    name: call.name.clone(),
                    arguments: call.arguments.to_string(),
                })
                .collect()
        };
        Ok(ModelTurn {
            content: turn.content.clone(),
            tool_calls,
            reasoning: None,
            usage: Usage {
                input_tokens: 100 + 20 * index as u64,
                output_tokens: 20,
            },
        })
    }
}

/// A chat-completions client.
#[derive(Clone, Debug)]
pub struct OpenAiModel {
    client: reqwest::Client,
    url: String,
    model: String,
    api_key_env: Option<String>,
    max_retries: usize,
}

impl OpenAiModel {
    /// A client for `model` at the chat-completions endpoint under `base_url`, authenticating
    /// with the key in environment variable `api_key_env` (if set) and giving each request up
    /// to `timeout`.
    pub fn new(
        base_url: &str,
        model: &str,
        api_key_env: Option<String>,
        timeout: Duration,
    ) -> Result<Self, ModelError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ModelError::Config(e.to_string()))?;
        Ok(OpenAiModel {
            client,
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            model: model.to_owned(),
            api_key_env,
            max_retries: 4,
        })
    }

    fn body(&self, request: &ModelRequest<'_>) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": chat_messages(request.system_prompt, request.state),
        });
        if !request.tools.is_empty() {
            body["tools"] = chat_tools(request.tools).into();
        }
        body
    }

    /// Removes the API key from text that came back from the endpoint (an endpoint may echo
    /// the request), so it never reaches an error message or a log.
    fn redact(&self, text: &str) -> String {
        match self
            .api_key_env
            .as_ref()
            .and_then(|name| std::env::var(name).ok())
        {
            Some(key) if key.len() >= 4 => text.replace(&key, "[redacted]"),
            _ => text.to_owned(),
        }
    }

    async fn once(&self, body: &Value) -> Result<ModelTurn, ModelError> {
        let endpoint = |message: String| ModelError::Endpoint {
            url: self.url.clone(),
            message,
        };
        let mut http = self.client.post(&self.url).json(body);
        if let Some(name) = &self.api_key_env
            && let Ok(key) = std::env::var(name)
        {
            http = http.bearer_auth(key);
        }
        let response = http.send().await.map_err(|e| endpoint(without_url(e)))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| endpoint(without_url(e)))?;
        if status.as_u16() == 429 || status.is_server_error() {
            return Err(endpoint(format!("HTTP {status}")));
        }
        if !status.is_success() {
            return Err(ModelError::Garbage {
                url: self.url.clone(),
                message: format!(
                    "HTTP {status}: {}",
                    self.redact(&text.chars().take(200).collect::<String>())
                ),
            });
        }
        parse_completion(&text).map_err(|message| ModelError::Garbage {
            url: self.url.clone(),
            message: self.redact(&message),
        })
    }
}

/// The conversation of a run as chat-completions messages: the system prompt, then every
/// user message, assistant turn (with its tool calls) and tool result the run committed.
pub fn chat_messages(system_prompt: &str, state: &RunState) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": system_prompt})];
    for message in state.messages() {
        messages.push(match message {
            Message::User(text) => json!({"role": "user", "content": text}),
            Message::Assistant(turn) => {
                let mut m = json!({"role": "assistant", "content": turn.content});
                if !turn.tool_calls.is_empty() {
                    m["tool_calls"] = turn
                        .tool_calls
                        .iter()
                        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                        .collect();
                }
                m
            }
            Message::Tool {
                call_id, output, ..
            } => json!({"role": "tool", "tool_call_id": call_id, "content": output}),
        });
    }
    messages
}

/// Tool definitions as the chat-completions `tools` field declares them.
pub fn chat_tools(tools: &[ToolDefinition]) -> Vec<Value> {
    tools
        .iter()
        .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.schema}}))
        .collect()
}

/// reqwest errors can repeat the URL with its query; the URL is named once by the caller.
fn without_url(error: reqwest::Error) -> String {
    if error.is_timeout() {
        "timed out".into()
    } else if error.is_connect() {
        "cannot connect".into()
    } else {
        error.without_url().to_string()
    }
}

/// Parses a chat-completions response body into one model turn.
pub fn parse_completion(text: &str) -> Result<ModelTurn, String> {
    #[derive(Deserialize)]
    struct Completion {
        choices: Vec<Choice>,
        #[serde(default)]
        usage: Option<WireUsage>,
    }
    #[derive(Deserialize)]
    struct Choice {
        message: WireMessage,
    }
    #[derive(Deserialize)]
    struct WireMessage {
        #[serde(default)]
        content: Option<String>,
        #[serde(default)]
        reasoning_content: Option<String>,
        #[serde(default)]
        tool_calls: Vec<WireCall>,
    }
    #[derive(Deserialize)]
    struct WireCall {
        id: String,
        function: WireFunction,
    }
    #[derive(Deserialize)]
    struct WireFunction {
        name: String,
        #[serde(default)]
        arguments: String,
    }
    #[derive(Deserialize)]
    struct WireUsage {
        #[serde(default)]
        prompt_tokens: u64,
        #[serde(default)]
        completion_tokens: u64,
    }
    let completion: Completion = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let choice = completion
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| "no choices".to_owned())?;
    let usage = completion.usage.map_or_else(Usage::default, |u| Usage {
        input_tokens: u.prompt_tokens,
        output_tokens: u.completion_tokens,
    });
    Ok(ModelTurn {
        content: choice.message.content,
        tool_calls: choice
            .message
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                id: CallId::new(c.id),
                name: c.function.name,
                arguments: c.function.arguments,
            })
            .collect(),
        reasoning: choice.message.reasoning_content,
        usage,
    })
}

#[async_trait]
impl Model for OpenAiModel {
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelTurn, ModelError> {
        let body = self.body(&request);
        (|| self.once(&body))
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(200))
                    .with_max_delay(Duration::from_secs(10))
                    .with_max_times(self.max_retries)
                    .with_jitter(),
            )
            .when(ModelError::is_transient)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves a chat completion with tool calls and usage parses into a model turn.
    #[test]
    fn parses_a_completion() {
        let text = r#"{"choices":[{"message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"c1","type":"function","function":{"name":"shell","arguments":"{\"cmd\":\"ls\"}"}}]}}],
            "usage":{"prompt_tokens":12,"completion_tokens":7}}"#;
        let turn = parse_completion(text).unwrap();
        assert_eq!(turn.tool_calls[0].name, "shell");
        assert_eq!(turn.tool_calls[0].arguments, r#"{"cmd":"ls"}"#);
        assert_eq!(turn.usage.input_tokens, 12);
    }

    // Proves garbage and empty answers are refused with a reason.
    #[test]
    fn refuses_garbage() {
        assert!(parse_completion("<html>").is_err());
        assert_eq!(
            parse_completion(r#"{"choices":[]}"#).unwrap_err(),
            "no choices"
        );
    }
}
