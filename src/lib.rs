//! Rekindle recovers interrupted AI-agent runs.
//!
//! A run journals every model turn and tool result as an immutable [`core::fact::Fact`]; the
//! pure [`core::fold`] turns facts into resumable [`core::fold::RunState`]; the local
//! [`store::log`] keeps a run's facts durably on disk; the [`core::fingerprint`] guards against
//! resuming under a different configuration. The layers: [`core`] (pure rules and types),
//! [`store`] (durable state), [`host`] (the agent's model and tools), [`fleet`] (running and
//! recovering runs). See ARCHITECTURE.md for the map and the invariants, and [`fleet`] for a
//! run journaled and recovered end to end.
//!
//! ```
//! use rekindle::core::fold::{self, Step};
//! use rekindle::core::sample;
//!
//! // A finished sample run folds to a state whose next step is "done".
//! let facts = sample::run("r-1", 20, 7);
//! let state = fold::fold(facts.clone()).expect("a valid run");
//! assert!(matches!(state.next_step(), Step::Done { .. }));
//!
//! // Folding is incremental: the first half, then the rest, gives the same state.
//! let mut incremental = fold::fold(facts[..10].to_vec()).expect("a valid prefix");
//! for fact in facts[10..].iter().cloned() {
//!     incremental.apply(fact).expect("the rest applies");
//! }
//! assert_eq!(incremental, state);
//! ```

pub mod clock;
pub mod core;
pub mod error;
pub mod fleet;
pub mod host;
pub mod metrics;
pub mod sdk;
pub mod store;

pub mod serve;

pub use error::{Error, ErrorKind, Result};
