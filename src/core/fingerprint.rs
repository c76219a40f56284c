//! The resume guard: a fingerprint of the configuration a run was started with.
//!
//! A run must only be continued by a host whose model, prompt, tools and budgets match the
//! ones that produced its facts, or the continuation silently means something else. The
//! fingerprint stores hashes only (never the prompt or tool schemas themselves), and comparing
//! two fingerprints names exactly what changed. This module never does I/O.

use crate::core::digest::{hex, sha256_hex};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Budgets a run is held to. `None` means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    /// Most model turns the run may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u64>,
    /// Most tokens (input plus output, summed over all model turns) the run may spend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// After this many model turns that called tools, the model is called with no tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_rounds: Option<u64>,
}

/// What identifies a run's configuration, as hashes and small values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The model the run calls, by name.
    pub model: String,
    /// Lowercase hex SHA-256 of the system prompt's UTF-8 bytes.
    pub system_prompt_sha256: String,
    /// Lowercase hex SHA-256 of the canonical tool set (see [`tool_set_sha256`]).
    pub tools_sha256: String,
    /// The model's thinking/reasoning mode as configured ("off", "low", "high", ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// The budgets the run is held to.
    #[serde(default)]
    pub budgets: Budgets,
}

/// A tool as the fingerprint sees it: its name and its JSON schema.
pub struct ToolSpec<'a> {
    /// The tool's name, as the model calls it.
    pub name: &'a str,
    /// The JSON schema of the tool's arguments.
    pub schema: &'a serde_json::Value,
}

impl Fingerprint {
    /// Builds a fingerprint from the configuration itself; only hashes are kept.
    pub fn new(
        model: &str,
        system_prompt: &str,
        tools: &[ToolSpec<'_>],
        thinking: Option<&str>,
        budgets: Budgets,
    ) -> Self {
        Fingerprint {
            model: model.to_owned(),
            system_prompt_sha256: sha256_hex(system_prompt.as_bytes()),
            tools_sha256: tool_set_sha256(tools),
            thinking: thinking.map(str::to_owned),
            budgets,
        }
    }

    /// SHA-256 of the whole fingerprint, to match runs with workers cheaply.
    pub fn sha256(&self) -> String {
        sha256_hex(&crate::core::layout::encode_object(self))
    }

    /// Lists every difference from `self` (the run's) to `other` (the resuming host's), in a
    /// fixed order, one human-readable entry each. Empty means they match.
    pub fn diff(&self, other: &Fingerprint) -> Vec<String> {
        fn show<T: std::fmt::Display>(value: Option<T>) -> String {
            value.map_or_else(|| "unlimited".to_owned(), |v| v.to_string())
        }
        let mut changes = Vec::new();
        if self.model != other.model {
            changes.push(format!("model: {} -> {}", self.model, other.model));
        }
        if self.system_prompt_sha256 != other.system_prompt_sha256 {
            changes.push("system prompt: changed".to_owned());
        }
        if self.tools_sha256 != other.tools_sha256 {
            changes.push("tool set: changed".to_owned());
        }
        if self.thinking != other.thinking {
            let name = |t: &Option<String>| t.clone().unwrap_or_else(|| "default".to_owned());
            changes.push(format!(
                "thinking: {} -> {}",
                name(&self.thinking),
                name(&other.thinking)
            ));
        }
        let (a, b) = (self.budgets, other.budgets);
        for (label, old, new) in [
            ("max_iterations", a.max_iterations, b.max_iterations),
            ("max_tokens", a.max_tokens, b.max_tokens),
            ("max_tool_rounds", a.max_tool_rounds, b.max_tool_rounds),
        ] {
            if old != new {
                changes.push(format!("{label}: {} -> {}", show(old), show(new)));
            }
        }
        changes
    }

    /// The resume guard: refuses to continue a run under a different configuration unless
    /// the operator forces it.
    pub fn check_resume(
        &self,
        resuming_with: &Fingerprint,
        force: bool,
    ) -> Result<(), ResumeRefused> {
        let changes = self.diff(resuming_with);
        if changes.is_empty() || force {
            Ok(())
        } else {
            Err(ResumeRefused { changes })
        }
    }
}

/// The configuration changed since the run started, so resuming it was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration changed since the run started ({}); resume with force to accept", changes.join(", "))]
pub struct ResumeRefused {
    /// What changed, one human-readable entry each (see [`Fingerprint::diff`]).
    pub changes: Vec<String>,
}

/// SHA-256 of the tool set, independent of declaration order and of key order inside
/// schemas: tools are sorted by name and each schema is serialized with sorted keys
/// (`serde_json::Value` keeps objects in a sorted map; this crate never enables
/// `preserve_order`).
pub fn tool_set_sha256(tools: &[ToolSpec<'_>]) -> String {
    let mut sorted: Vec<(&str, String)> = tools
        .iter()
        .map(|tool| (tool.name, tool.schema.to_string()))
        .collect();
    sorted.sort();
    let mut hasher = Sha256::new();
    for (name, schema) in sorted {
        // Length prefixes keep ("ab","c") and ("a","bc") from hashing alike.
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update((schema.len() as u64).to_le_bytes());
        hasher.update(schema.as_bytes());
    }
    hex(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Fingerprint {
        let schema = json!({"type": "object", "properties": {"cmd": {"type": "string"}}});
        Fingerprint::new(
            "gpt-x",
            "You are careful.",
            &[ToolSpec {
                name: "shell",
                schema: &schema,
            }],
            Some("off"),
            Budgets {
                max_iterations: Some(20),
                max_tokens: None,
                max_tool_rounds: Some(8),
            },
        )
    }

    // Proves identical configurations match and the guard lets them through.
    #[test]
    fn same_configuration_matches() {
        assert!(base().diff(&base()).is_empty());
        assert!(base().check_resume(&base(), false).is_ok());
    }

    // Proves the diff names exactly what changed, and force overrides the guard.
    #[test]
    fn diff_names_each_change() {
        let mut other = base();
        other.model = "gpt-y".into();
        other.system_prompt_sha256 = sha256_hex(b"You are reckless.");
        other.thinking = None;
        other.budgets.max_tokens = Some(1000);
        assert_eq!(
            base().diff(&other),
            vec![
                "model: gpt-x -> gpt-y",
                "system prompt: changed",
                "thinking: off -> default",
                "max_tokens: unlimited -> 1000",
            ]
        );
        let refused = base().check_resume(&other, false).unwrap_err();
        assert!(refused.to_string().contains("model: gpt-x -> gpt-y"));
        assert!(base().check_resume(&other, true).is_ok());
    }

    // Proves the tool-set hash ignores declaration order and key order, but not content.
    #[test]
    fn tool_set_hash_is_canonical() {
        let a = json!({"b": 1, "a": {"y": 2, "x": 3}});
        let a_reordered: serde_json::Value =
            serde_json::from_str(r#"{"a": {"x": 3, "y": 2}, "b": 1}"#).unwrap();
        let b = json!({"type": "string"});
        let one = tool_set_sha256(&[
            ToolSpec {
                name: "one",
                schema: &a,
            },
            ToolSpec {
                name: "two",
                schema: &b,
            },
        ]);
        let two = tool_set_sha256(&[
            ToolSpec {
                name: "two",
                schema: &b,
            },
            ToolSpec {
                name: "one",
                schema: &a_reordered,
            },
        ]);
        assert_eq!(one, two);
        let changed = tool_set_sha256(&[ToolSpec {
            name: "one",
            schema: &a,
        }]);
        assert_ne!(one, changed);
    }

    // Proves the fingerprint never carries the prompt text.
    #[test]
    fn fingerprint_stores_hashes_only() {
        let text = serde_json::to_string(&base()).unwrap();
        assert!(!text.contains("careful"));
        assert_eq!(base().system_prompt_sha256.len(), 64);
    }
}
