//! `rekindle.toml`: the model, the tools, the system prompt and the budgets of a run.
//!
//! This module owns parsing the file and the fingerprint that the resume guard compares.
//! It never contacts a model or starts a tool.
//!
//! ```toml
//! system_prompt = "You are a careful assistant."
//!
//! [model]
//! kind = "scripted"              # or "openai" (any chat-completions endpoint)
//! name = "demo-model"
//! script = "script.json"          # scripted: turns, relative to this file
//! # base_url = "http://127.0.0.1:8000/v1"   # openai
//! # api_key_env = "OPENAI_API_KEY"
//! # timeout_ms = 60000
//!
//! [budgets]
//! max_iterations = 20
//! max_tool_rounds = 10
//! steps_per_resume = 32
//!
//! [[tools]]
//! name = "shell"
//! description = "Run a shell command"
//! schema = { type = "object", properties = { cmd = { type = "string" } } }
//! command = ["sh", "-c", "cat"]
//! timeout_ms = 10000
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::core::fingerprint::{Budgets, Fingerprint, ToolSpec};

/// Default cap on steps one resume call may take before yielding the run back.
pub const DEFAULT_STEPS_PER_RESUME: u32 = 32;

/// A parsed `rekindle.toml`: everything a run is driven with.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The system prompt sent with every model request; only its hash is fingerprinted.
    #[serde(default)]
    pub system_prompt: String,
    /// The `[model]` section: which model answers the run's turns.
    pub model: ModelConfig,
    /// The `[budgets]` section: the run's limits.
    #[serde(default)]
    pub budgets: BudgetConfig,
    /// The `[[tools]]` entries: the commands the model may call.
    #[serde(default)]
    pub tools: Vec<ToolConfig>,
    /// The directory of the config file; relative paths are resolved against it.
    #[serde(skip)]
    pub dir: PathBuf,
}

/// The `[model]` section: which model answers a run's turns, and how to reach it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// `scripted` or `openai`.
    pub kind: String,
    /// The model's name, sent to the endpoint and recorded in the fingerprint.
    pub name: String,
    /// A scripted model's JSON file of turns, relative to the config file; required for one.
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// An openai model's chat-completions base URL (`.../v1`); required for one.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// How long one request to an openai model may take, in ms; 120 000 when unset.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The model's thinking/reasoning mode ("off", "low", "high", ...), recorded in the
    /// fingerprint so a resume under another mode is refused.
    #[serde(default)]
    pub thinking: Option<String>,
}

/// The `[budgets]` section: how far a run may go, and how much one resume may do.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Most model turns the run may take; unlimited when unset.
    pub max_iterations: Option<u64>,
    /// Most tokens (input plus output, over all model turns) the run may spend.
    pub max_tokens: Option<u64>,
    /// After this many model turns that called tools, the model is called with no tools.
    pub max_tool_rounds: Option<u64>,
    /// Steps one resume call may take before yielding the run back; not fingerprinted.
    pub steps_per_resume: Option<u32>,
}

/// One `[[tools]]` entry: a command the model may call.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// The name the model calls the tool by; unique in the file.
    pub name: String,
    /// What the tool does, as shown to the model.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of the call's arguments, shown to the model and fingerprinted.
    #[serde(default = "empty_schema")]
    pub schema: serde_json::Value,
    /// Program and arguments; the call's arguments arrive as JSON on stdin.
    pub command: Vec<String>,
    /// How long a call may run before its process is killed, in ms; 30 000 by default.
    #[serde(default = "default_tool_timeout")]
    pub timeout_ms: u64,
    /// A human must approve each call before it runs.
    #[serde(default)]
    pub confirm: bool,
}

fn empty_schema() -> serde_json::Value {
    serde_json::json!({"type": "object"})
}

fn default_tool_timeout() -> u64 {
    30_000
}

/// Why a config file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    // The I/O error is part of the message, not a `source`: as both, `{:#}` printed it twice.
    #[error("config {path}: cannot read: {error}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// The underlying I/O failure.
        error: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key, or declares an unknown model kind, a
    /// tool with an empty command, or the same tool twice.
    #[error("config {path}: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

impl Config {
    /// Reads and parses the config file at `path`, resolving its relative paths against the
    /// file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        let mut config = Config::parse(&text).map_err(|message| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        config.dir = path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_owned);
        Ok(config)
    }

    /// Parses and checks config text; the error is a message naming the problem. Relative
    /// paths resolve against the current directory until `dir` is set.
    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        if !matches!(config.model.kind.as_str(), "scripted" | "openai") {
            return Err(format!(
                "model.kind is '{}'; expected 'scripted' or 'openai'",
                config.model.kind
            ));
        }
        for (i, tool) in config.tools.iter().enumerate() {
            if tool.command.is_empty() {
                return Err(format!("tools[{i}] '{}' has an empty command", tool.name));
            }
            if config.tools[..i].iter().any(|t| t.name == tool.name) {
                return Err(format!("tool '{}' is declared twice", tool.name));
            }
        }
        Ok(config)
    }

    /// The run's limits as the fingerprint records them (the step cap is not one of them).
    pub fn budgets(&self) -> Budgets {
        Budgets {
            max_iterations: self.budgets.max_iterations,
            max_tokens: self.budgets.max_tokens,
            max_tool_rounds: self.budgets.max_tool_rounds,
        }
    }

    /// Steps one resume call may take: the configured cap, at least 1, or
    /// [`DEFAULT_STEPS_PER_RESUME`].
    pub fn steps_per_resume(&self) -> u32 {
        self.budgets
            .steps_per_resume
            .unwrap_or(DEFAULT_STEPS_PER_RESUME)
            .max(1)
    }

    /// The fingerprint the resume guard compares: hashes of prompt and tools, never text.
    pub fn fingerprint(&self) -> Fingerprint {
        let specs: Vec<ToolSpec<'_>> = self
            .tools
            .iter()
            .map(|tool| ToolSpec {
                name: &tool.name,
                schema: &tool.schema,
            })
            .collect();
        Fingerprint::new(
            &self.model.name,
            &self.system_prompt,
            &specs,
            self.model.thinking.as_deref(),
            self.budgets(),
        )
    }

    /// `path` as written in the config file: absolute as it is, relative to the file's
    /// directory otherwise.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.dir.join(path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
system_prompt = "Be careful."
[model]
kind = "scripted"
name = "demo"
script = "script.json"
[budgets]
max_tool_rounds = 3
[[tools]]
name = "shell"
schema = { type = "object" }
command = ["sh", "-c", "cat"]
"#;

    // Proves a config parses, defaults the step cap, and fingerprints without the prompt.
    #[test]
    fn parses_and_fingerprints() {
        let config = Config::parse(SAMPLE).unwrap();
        assert_eq!(config.steps_per_resume(), 32);
        assert_eq!(config.tools[0].timeout_ms, 30_000);
        let fingerprint = config.fingerprint();
        assert_eq!(fingerprint.budgets.max_tool_rounds, Some(3));
        assert!(
            !serde_json::to_string(&fingerprint)
                .unwrap()
                .contains("careful")
        );
    }

    // Proves bad configs are refused with a message naming the problem.
    #[test]
    fn bad_configs_are_refused() {
        let unknown = SAMPLE.replace("kind = \"scripted\"", "kind = \"magic\"");
        assert!(Config::parse(&unknown).unwrap_err().contains("'magic'"));
        let twice = format!("{SAMPLE}\n[[tools]]\nname = \"shell\"\ncommand = [\"true\"]\n");
        assert!(
            Config::parse(&twice)
                .unwrap_err()
                .contains("declared twice")
        );
        let typo = SAMPLE.replace("max_tool_rounds", "max_tool_round");
        assert!(Config::parse(&typo).is_err());
    }
}
