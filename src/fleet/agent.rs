//! The agent a node runs: its configuration, model and tools, and the fingerprint of that
//! configuration that the resume guard compares.
//!
//! It never touches the store.

use super::*;

/// A configured agent: model, tools, prompt, budgets.
#[derive(Clone)]
pub struct Agent {
    /// The configuration the agent was built from; its fingerprint guards every resume.
    pub config: Config,
    /// The model the agent asks for each turn.
    pub model: Arc<dyn Model>,
    /// The tools the model may call.
    pub tools: Arc<dyn Tools>,
}

impl Agent {
    /// Builds the configured model (scripted or OpenAI-compatible) and command tools; a model
    /// section missing its script or base URL is an error.
    pub fn from_config(config: Config) -> Result<Agent> {
        let model: Arc<dyn Model> = match config.model.kind.as_str() {
            "scripted" => {
                let script = config.model.script.as_ref().ok_or_else(|| {
                    ModelError::Config("model.script is required for a scripted model".into())
                })?;
                Arc::new(ScriptedModel::load(&config.resolve(script))?)
            }
            _ => {
                let base_url = config.model.base_url.as_deref().ok_or_else(|| {
                    ModelError::Config("model.base_url is required for an openai model".into())
                })?;
                let timeout =
                    std::time::Duration::from_millis(config.model.timeout_ms.unwrap_or(120_000));
                Arc::new(OpenAiModel::new(
                    base_url,
                    &config.model.name,
                    config.model.api_key_env.clone(),
                    timeout,
                )?)
            }
        };
        let tools: Arc<dyn Tools> = Arc::new(CommandTools::new(config.tools.clone()));
        Ok(Agent {
            config,
            model,
            tools,
        })
    }

    /// The SHA-256 of the configuration's fingerprint, recorded in the run's index entry.
    pub fn fingerprint_sha256(&self) -> String {
        self.config.fingerprint().sha256()
    }
}
