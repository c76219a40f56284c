//! What the language packages (`python/`, `node/`) share, so that they cannot drift apart:
//! opening a store and a configuration from plain options, models and tools written in
//! another language behind two plain-JSON calls ([`ForeignModel`], [`ForeignTools`]), a
//! host's heartbeat ([`Beating`]), a run whose loop the host drives ([`Journal`]), the
//! endpoint a worker takes wake-ups and probes on ([`Endpoint`]), and the JSON shapes the
//! packages return. A package owns only the crossing into its language (its types, threads,
//! promises or interpreter lock); every rule of the protocol is the library's.
//!
//! Every call here fails with a [`Failure`]: the [`ErrorKind`](crate::ErrorKind) a package
//! turns into its exception class, and a message written for a library user (the whole chain
//! of causes, no command-line flags).

mod foreign;
mod journal;
mod open;
mod shapes;
mod worker;

pub use foreign::{
    ForeignCall, ForeignModel, ForeignTools, ModelFailure, ToolSpec, agent, fingerprint_with,
};
pub use journal::{Beating, Journal, answer, model_turn, outcome};
pub use open::{
    ConfigOptions, Endpoint, StoreOptions, config, default_id, has_model, open_store, recovery_id,
    run_id, state_dir,
};
pub use shapes::{requests_json, serialize, state_json, stats_json, stopped_json};
pub use worker::{WorkerSetup, run_worker};

use crate::{Error, ErrorKind};

/// A failed call of a language package: what to do next and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What the caller does next; a package picks its exception class by it.
    pub kind: ErrorKind,
    /// The whole message: the error and each of its causes, once each.
    pub message: String,
}

impl Failure {
    /// A wrong argument or option, named in `message`.
    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            kind: ErrorKind::InvalidInput,
            message: message.into(),
        }
    }

    /// The same failure with `context` in front of its message.
    pub fn context(self, context: impl std::fmt::Display) -> Failure {
        Failure {
            kind: self.kind,
            message: format!("{context}: {}", self.message),
        }
    }

    /// The kind as the packages spell it (`fenced`, `conflict`, `unavailable`, `not_found`,
    /// `refused`, `invalid_input`, `corrupt`, `internal`).
    pub fn kind_name(&self) -> &'static str {
        kind_name(self.kind)
    }
}

/// `kind` as the packages spell it.
pub fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Conflict => "conflict",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Fenced => "fenced",
        ErrorKind::NotFound => "not_found",
        ErrorKind::Refused => "refused",
        ErrorKind::InvalidInput => "invalid_input",
        ErrorKind::Corrupt => "corrupt",
        _ => "internal",
    }
}

impl From<Error> for Failure {
    /// The library's error with each `source()` appended once, as the binaries print it.
    fn from(error: Error) -> Failure {
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(inner) = source {
            let text = inner.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = inner.source();
        }
        Failure {
            kind: error.kind(),
            message,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// A result of the packages' shared calls.
pub type Result<T, E = Failure> = std::result::Result<T, E>;

/// The library's result as a package's.
pub(crate) fn lift<T>(result: crate::Result<T>) -> Result<T> {
    result.map_err(Failure::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_every_cause_once_and_keeps_its_kind() {
        let error: Error = crate::fleet::FleetError::HandedBack {
            run: crate::core::fact::RunId::new("r-1"),
            why: "it finished".into(),
        }
        .into();
        let failure = Failure::from(error);
        assert_eq!(failure.kind_name(), "refused");
        assert!(failure.message.contains("r-1"), "{}", failure.message);
        let named = failure.context("run \"r-1\"");
        assert!(named.message.starts_with("run \"r-1\": "));
        assert_eq!(Failure::invalid("x").kind_name(), "invalid_input");
    }
}
