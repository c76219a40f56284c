//! The agent host: what a run talks to — a model and its tools — behind traits a host can
//! implement itself, plus the built-in scripted model, the OpenAI-compatible client and
//! command-line tools.

pub mod config;
pub mod model;
pub mod tools;

pub use model::{Model, ModelError, ModelRequest, OpenAiModel, ScriptedModel};
pub use tools::{CommandTools, ToolContext, ToolDefinition, ToolOutput, Tools};
