//! Rekindle recovers interrupted AI-agent runs.
//!
//! A run journals every model turn and tool result as an immutable [`fact::Fact`]; the pure
//! [`fold`] turns facts into resumable [`fold::RunState`]; the local [`log`] keeps a run's facts
//! durably on disk; the [`fingerprint`] guards against resuming under a different
//! configuration. See ARCHITECTURE.md for the map and the invariants.

pub mod error;
pub mod fact;
pub mod fingerprint;
pub mod fold;
pub mod log;
pub mod sample;

pub use error::{Error, ErrorKind, Result};
