//! Models and tools written in a package's language, behind two plain-JSON calls: the
//! package adapts whatever its users pass (a function, an object with `complete()`, an
//! OpenAI-compatible client) to [`ForeignModel::complete`] and [`ForeignTools::call`], and
//! [`agent`] builds the library's [`Agent`] from them.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::{Failure, Result, lift};
use crate::core::fact::{ModelTurn, ToolCall};
use crate::fleet::Agent;
use crate::host::config::{Config, ToolConfig};
use crate::host::model::{ModelError, ModelRequest, chat_messages, chat_tools};
use crate::host::tools::{ToolContext, ToolDefinition, ToolOutput};
use crate::host::{CommandTools, Model, Tools};

/// Why a foreign model gave no turn.
#[derive(Debug)]
pub enum ModelFailure {
    /// A bug in the model's code or a turn of the wrong shape: not retried away, it is
    /// invalid input, as a malformed response from an endpoint is.
    Bug(String),
    /// The model could not be reached or failed: the run stays interrupted where it was.
    Failed(String),
}

/// A model in the package's language.
#[async_trait]
pub trait ForeignModel: Send + Sync {
    /// One assistant turn as JSON (`{"content", "tool_calls": [{"id", "name",
    /// "arguments"}], "usage": {"input_tokens", "output_tokens"}, "reasoning"}`), given the
    /// chat-completions `messages` and `tools` as JSON arrays and the turns before this one.
    async fn complete(
        &self,
        messages: String,
        tools: String,
        turn: u64,
    ) -> std::result::Result<String, ModelFailure>;
}

/// One tool call, as a foreign tool receives it.
#[derive(Clone, Debug)]
pub struct ForeignCall {
    /// The tool's name.
    pub name: String,
    /// The arguments as the model wrote them (a JSON object, as text).
    pub arguments: String,
    /// The run making the call.
    pub run_id: String,
    /// The call's ID in the run: with the run ID, the call's idempotency key.
    pub call_id: String,
    /// The lease epoch the call runs at (higher after a recovery).
    pub epoch: u64,
}

/// Tools in the package's language.
#[async_trait]
pub trait ForeignTools: Send + Sync {
    /// Runs `call`; answers its output and whether it failed (a failed call is a result the
    /// model sees, not an error of the run).
    async fn call(&self, call: ForeignCall) -> (String, bool);
}

/// A tool as a package declares it: part of the configuration's fingerprint.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    /// The tool's name, unique among the tools.
    pub name: String,
    /// What the model is told it does.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub schema: Value,
    /// Whether a human approves each call first (the run parks until the answer).
    pub confirm: bool,
}

impl ToolSpec {
    /// A spec whose schema is JSON text, as packages pass it; refused when it is not JSON.
    pub fn parse(name: String, description: String, schema: &str, confirm: bool) -> Result<Self> {
        let schema = serde_json::from_str(schema)
            .map_err(|e| Failure::invalid(format!("tool '{name}': its schema is not JSON: {e}")))?;
        Ok(ToolSpec {
            name,
            description,
            schema,
            confirm,
        })
    }
}

fn tool_configs(tools: Vec<ToolSpec>) -> Result<Vec<ToolConfig>> {
    let mut configs: Vec<ToolConfig> = Vec::new();
    for tool in tools {
        if configs.iter().any(|t| t.name == tool.name) {
            return Err(Failure::invalid(format!(
                "tool '{}' is given twice",
                tool.name
            )));
        }
        configs.push(ToolConfig {
            name: tool.name,
            description: tool.description,
            schema: tool.schema,
            command: Vec::new(),
            timeout_ms: 0,
            confirm: tool.confirm,
        });
    }
    Ok(configs)
}

/// The fingerprint of `config` with `tools` in place of its own (the SHA-256 a worker is
/// matched by).
pub fn fingerprint_with(config: &Config, tools: Vec<ToolSpec>) -> Result<String> {
    let mut config = config.clone();
    config.tools = tool_configs(tools)?;
    Ok(config.fingerprint().sha256())
}

struct Foreign {
    model: Arc<dyn ForeignModel>,
    name: String,
}

#[async_trait]
impl Model for Foreign {
    async fn complete(
        &self,
        request: ModelRequest<'_>,
    ) -> std::result::Result<ModelTurn, ModelError> {
        let messages = Value::from(chat_messages(request.system_prompt, request.state)).to_string();
        let tools = Value::from(chat_tools(request.tools)).to_string();
        let turn = request.state.counters().model_turns;
        let url = format!("model '{}'", self.name);
        match self.model.complete(messages, tools, turn).await {
            Ok(text) => serde_json::from_str(&text).map_err(|e| ModelError::Garbage {
                url,
                message: e.to_string(),
            }),
            Err(ModelFailure::Bug(message)) => Err(ModelError::Garbage { url, message }),
            Err(ModelFailure::Failed(message)) => Err(ModelError::Endpoint { url, message }),
        }
    }
}

/// The model of a host that drives its own loop: never asked.
struct HostDriven;

#[async_trait]
impl Model for HostDriven {
    async fn complete(
        &self,
        _request: ModelRequest<'_>,
    ) -> std::result::Result<ModelTurn, ModelError> {
        Err(ModelError::Config(
            "this host has no model: give the Host a model (or a configuration loaded from a rekindle.toml with one) for Rekindle to drive runs; start() and resume() journal runs without one".into(),
        ))
    }
}

struct ForeignToolbox {
    tools: Arc<dyn ForeignTools>,
    definitions: Vec<ToolDefinition>,
    confirm: HashSet<String>,
}

#[async_trait]
impl Tools for ForeignToolbox {
    fn definitions(&self) -> Vec<ToolDefinition> {
        self.definitions.clone()
    }

    fn needs_confirmation(&self, name: &str) -> bool {
        self.confirm.contains(name)
    }

    async fn call(&self, call: &ToolCall, context: &ToolContext) -> ToolOutput {
        let started = crate::clock::Stopwatch::start();
        let (output, is_error) = self
            .tools
            .call(ForeignCall {
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                run_id: context.run_id.clone(),
                call_id: call.id.to_string(),
                epoch: context.epoch.0,
            })
            .await;
        ToolOutput {
            output,
            is_error,
            duration_ms: started.elapsed().as_millis() as u64,
        }
    }
}

/// The agent a package's host or worker runs: `config`'s own model and command tools, or the
/// foreign model and tools given (the tools replace the config's `[[tools]]`). Without a
/// model, a configuration made from fields gets one that refuses to be asked (a host that
/// journals its own loop needs none).
pub fn agent(
    config: &Config,
    model: Option<Arc<dyn ForeignModel>>,
    tools: Option<(Arc<dyn ForeignTools>, Vec<ToolSpec>)>,
) -> Result<Agent> {
    let mut config = config.clone();
    let tools: Arc<dyn Tools> = match tools {
        Some((foreign, specs)) => {
            config.tools = tool_configs(specs)?;
            let definitions = config
                .tools
                .iter()
                .map(|t| ToolDefinition {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    schema: t.schema.clone(),
                })
                .collect();
            let confirm = config
                .tools
                .iter()
                .filter(|t| t.confirm)
                .map(|t| t.name.clone())
                .collect();
            Arc::new(ForeignToolbox {
                tools: foreign,
                definitions,
                confirm,
            })
        }
        None => Arc::new(CommandTools::new(config.tools.clone())),
    };
    let model: Arc<dyn Model> = match model {
        Some(model) => Arc::new(Foreign {
            model,
            name: config.model.name.clone(),
        }),
        None if !super::has_model(&config) => Arc::new(HostDriven),
        None => lift(Agent::from_config(config.clone()))?.model,
    };
    Ok(Agent {
        config,
        model,
        tools,
    })
}
