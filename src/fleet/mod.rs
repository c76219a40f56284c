//! The fleet: running runs on a node (the host path, recovery execution, answering a parked
//! run), every way a recovery comes to exist (`admission`), and the processes that move
//! recoveries (the coordinator, the worker).
//!
//! This face lists the modules by group, holds [`FleetError`] and re-exports what callers
//! use; the sequence around the drive loop (the lease, the index entry, seeding the local
//! log, the resume guard, what is recorded when a run stops) is `node`'s. The decision of
//! *which* run to recover and *where* is the coordinator's.
//!
//! A host journals a run, stops part-way (as a crash would leave it), and the run is
//! recovered under a host-chosen ID, all on an in-memory bucket:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::time::Duration;
//!
//! use rekindle::clock::SystemClock;
//! use rekindle::core::fact::{RecoveryId, RunId};
//! use rekindle::fleet::admission::Takeover;
//! use rekindle::fleet::runner::Stopped;
//! use rekindle::fleet::{Agent, Node, spawn_recovery};
//! use rekindle::host::config::Config;
//! use rekindle::store::{Store, lease::Holder, log::LogDir};
//!
//! // An agent whose scripted model answers twice, then finishes.
//! let dir = tempfile::tempdir()?;
//! std::fs::write(
//!     dir.path().join("script.json"),
//!     r#"[{"content": "thinking"}, {"content": "done"}]"#,
//! )?;
//! std::fs::write(
//!     dir.path().join("rekindle.toml"),
//!     "[model]\nkind = \"scripted\"\nname = \"m\"\nscript = \"script.json\"\n",
//! )?;
//! let agent = Agent::from_config(Config::load(&dir.path().join("rekindle.toml"))?)?;
//! let store = Store::memory(SystemClock::shared());
//! let node = |name: &str, stop: bool| -> Result<Node, Box<dyn std::error::Error>> {
//!     Ok(Node {
//!         store: store.clone(),
//!         agent: agent.clone(),
//!         logs: LogDir::open(dir.path().join(name))?,
//!         holder: Holder::new(&store, name, Duration::from_secs(5)),
//!         stop: Arc::new(AtomicBool::new(stop)),
//!     })
//! };
//!
//! // The host journals the run's opening facts, then stops before the model's turn: the
//! // run is interrupted, and everything it acknowledged is committed.
//! let run = RunId::new("r-1");
//! let host = node("host", true)?;
//! let stopped = host.start_run(&run, None, "say hello").await?;
//! assert!(matches!(stopped, Stopped::StopRequested));
//!
//! // Another node recovers it under an ID of the host's choosing, and finishes it.
//! let worker = node("worker", false)?;
//! let id = RecoveryId::new("r-1-recovery");
//! let record = spawn_recovery(&store, &worker.holder, &run, &id, false, Takeover::Now).await?;
//! let (stopped, _generation) = worker.execute_recovery(&record).await?;
//! assert!(matches!(stopped, Stopped::Finished(_)));
//!
//! // Admitting the same ID again is a replay: the same recovery, not a second one.
//! let again = spawn_recovery(&store, &worker.holder, &run, &id, false, Takeover::Now).await?;
//! assert_eq!(again.recovery_id, record.recovery_id);
//! # let _ = Ordering::SeqCst;
//! # Ok(())
//! # }
//! ```

// How a run runs on a node: the agent, the drive loop, a node's runs, answering a parked one,
// workflows.
mod agent;
mod answer;
mod node;
pub mod runner;
pub mod workflow;
// How a recovery comes to exist and moves: every way it is admitted, its record's lifecycle,
// who is alive, the coordinator, the worker, wake-ups, readiness, removing a run.
pub mod admission;
pub mod coordinator;
pub mod lifecycle;
pub mod liveness;
pub mod readiness;
pub mod removal;
pub mod wake;
pub mod worker;
// What an operator looks at.
pub mod overview;
pub mod timeline;
// Tools over the fleet: benchmarks, the soak, the demo.
pub mod bench;
pub mod demo;
pub mod soak;

use crate::core::record::{IndexEntry, Phase, RecoveryRecord, RecoveryState};
use crate::fleet::admission::Takeover;
use crate::fleet::lifecycle::LifecycleError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::clock::Clock;
use crate::core::fact::{
    ConfirmationAnswered, Fact, FactBody, Meta, QuestionAnswered, RecoveryId, RunId, Seq,
    SessionId, UserMessage,
};
use crate::core::fingerprint::ResumeRefused;
use crate::core::lifecycle::Event;
use crate::error::{Error, Result};
use crate::fleet::runner::{Runner, Stopped};
use crate::host::config::Config;
use crate::host::{CommandTools, Model, ModelError, OpenAiModel, ScriptedModel, Tools};
use crate::store::Store;
use crate::store::generation::{self, GenerationError, RunWriter, SnapshotPolicy};
use crate::store::index;
use crate::store::lease::{Held, Holder, LeaseError};
use crate::store::log::LogDir;
use crate::store::recovery;

/// What only this module refuses; everything else its functions pass up as the module error
/// that made it, inside the public [`Error`].
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The agent's configuration changed since the run started, and the recovery was not
    /// forced. `error` does not name the run; it is part of the message rather than its
    /// `source`.
    #[error("refusing to resume run \"{run}\": {error}")]
    ResumeRefused {
        /// The recovery run that was not resumed.
        run: RunId,
        /// Which parts of the configuration changed.
        error: ResumeRefused,
    },
    #[error(
        "recovery '{recovery}': source run \"{source_run}\" generation {generation} has digest {found}, the record pinned {pinned}"
    )]
    /// The source generation a recovery was pinned to at admission no longer has the digest
    /// the record pinned, so seeding from it would continue a different state.
    PinMismatch {
        /// The recovery being executed.
        recovery: RecoveryId,
        /// The interrupted run it continues.
        source_run: RunId,
        /// The source generation the record pinned.
        generation: u64,
        /// The digest the record pinned at admission.
        pinned: String,
        /// The digest that generation has now.
        found: String,
    },
    #[error(
        "run \"{run}\" is being continued by recovery '{recovery}'; answer it when that recovery parks (`rekindle answer {run}` then reaches it)"
    )]
    /// A host's own parked run was answered after a recovery claimed it; answer the recovery
    /// once it parks.
    BeingRecovered {
        /// The run that was answered.
        run: RunId,
        /// The recovery that continues it.
        recovery: RecoveryId,
    },
    #[error(
        "run ID \"{run}\" is {why}; a run started here needs an ID no recovery uses or will use"
    )]
    /// A host tried to start a run under an ID that a recovery uses or the coordinator
    /// reserves for one.
    IdReserved {
        /// The refused run ID.
        run: RunId,
        /// Whose the ID is: reserved for the fleet's recoveries, or a recovery's.
        why: String,
    },
    /// A host journaling its own loop gave a fact the run's rules refuse (a result for a call
    /// the model did not make, a fact after the end, ...); nothing was written.
    #[error("run \"{run}\" refuses the {kind} fact: {error}")]
    FactRefused {
        /// The run being journaled.
        run: RunId,
        /// The refused fact's kind.
        kind: &'static str,
        /// The rule it breaks.
        error: crate::core::fold::FoldError,
    },
    /// A host journaling its own loop recorded a new fact while the commit of the one before
    /// failed and may have landed; that fact must be recorded again first.
    #[error(
        "run \"{run}\": the commit of its {kind} fact failed and may have landed; record that fact again before anything else (or resume the run)"
    )]
    InDoubt {
        /// The run being journaled.
        run: RunId,
        /// The kind of the fact in doubt.
        kind: &'static str,
    },
    /// An answer came for a run that never existed (it never took a lease).
    #[error("run \"{run}\" is not parked waiting for {what}: no such run (it never took a lease)")]
    NoSuchRun {
        /// The run that was answered.
        run: RunId,
        /// What the answer was for.
        what: String,
    },
    /// A host journaling its own loop recorded a fact after handing the run back.
    #[error(
        "run \"{run}\": this journal handed the run back ({why}); resume the run to journal more"
    )]
    HandedBack {
        /// The run.
        run: RunId,
        /// How it was handed back.
        why: String,
    },
    #[error("run \"{run}\" is not parked waiting for {what}{now}")]
    /// An answer came for a run that is not parked waiting for it: the run has ended, runs,
    /// or waits for another call or question.
    NotWaiting {
        /// The run that was answered.
        run: RunId,
        /// What the answer was for: confirmation of a call, or an answer to a question.
        what: String,
        /// What the run does instead, when known (", it waits for ...").
        now: String,
    },
}

pub use self::admission::{recover_interrupted, spawn_recovery, spawn_recovery_admitted};
pub use self::agent::Agent;
pub use self::answer::{Answer, answer, answer_run};
pub use self::node::{Journaled, Node, opening_facts};
