//! Rekindle recovers interrupted AI-agent runs.
//!
//! A run journals every model turn and tool result as an immutable [`fact::Fact`]; the pure
//! [`fold`] turns facts into resumable [`fold::RunState`]; the local [`log`] keeps a run's facts
//! durably on disk; the [`fingerprint`] guards against resuming under a different
//! configuration. See ARCHITECTURE.md for the map and the invariants.
//!
//! ```
//! use rekindle::fold::{self, Step};
//! use rekindle::sample;
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

pub mod checkpoint;
pub mod cli;
pub mod clock;
pub mod config;
pub mod coordinator;
pub mod demo;
pub mod error;
pub mod fact;
pub mod fingerprint;
pub mod fleet;
pub mod fold;
pub mod gc;
pub mod generation;
pub mod host;
pub mod index;
pub mod layout;
pub mod lease;
pub mod lifecycle;
pub mod log;
pub mod measure;
pub mod recovery;
pub mod runner;
pub mod sample;
pub mod seal;
pub mod serve;
pub mod store;
pub mod tombstone;
pub mod worker;
pub mod workflow;

pub use error::{Error, ErrorKind, Result};
