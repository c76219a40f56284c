//! The records the lifecycle changes, as data: a recovery record and the index entry of the
//! run it continues. Their I/O lives in `store::recovery` and `store::index`.

use serde::{Deserialize, Serialize};

use crate::core::epoch::Epoch;
use crate::core::fact::{Outcome, RecoveryId, RunId, SessionId};
use crate::core::layout::FORMAT_VERSION;

/// The `kind` of an index entry object.
pub const INDEX_ENTRY_KIND: &str = "index.entry";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryState {
    /// Waiting for an attempt; `assigned_to` names the worker it is offered to, if any.
    Admitted,
    /// An attempt is live on `assigned_to`.
    Running,
    /// Waiting for a human's answer; no attempt runs until it is recorded.
    Parked,
    /// Ended; `result` says how. Terminal.
    Finished,
    /// Given up after too many failed attempts; `last_error` says why. Terminal.
    DeadLettered,
}

impl RecoveryState {
    /// No event leaves a terminal state.
    pub fn is_terminal(self) -> bool {
        matches!(self, RecoveryState::Finished | RecoveryState::DeadLettered)
    }

    /// The state as users read it.
    pub fn describe(self) -> &'static str {
        match self {
            RecoveryState::Admitted => "admitted",
            RecoveryState::Running => "running",
            RecoveryState::Parked => "parked",
            RecoveryState::Finished => "finished",
            RecoveryState::DeadLettered => "dead-lettered",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryResult {
    pub outcome: Outcome,
    pub message: String,
    pub final_generation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryRecord {
    pub format: u32,
    pub kind: String,
    pub recovery_id: RecoveryId,
    pub source_run: RunId,
    /// The source generation the recovery resumes from, and the SHA-256 of its object.
    pub source_generation: u64,
    pub source_digest: String,
    /// The epoch of that generation; the recovery run's epochs start above it.
    #[serde(default)]
    pub source_epoch: Epoch,
    pub state: RecoveryState,
    /// Admitted despite a configuration mismatch (skips the resume guard).
    #[serde(default)]
    pub force: bool,
    /// Attempts started (for operators; never a reason to give up).
    #[serde(default)]
    pub attempts: u32,
    /// Attempts that failed (an error, or the worker died mid-attempt); dead-lettering counts
    /// only these. Yields at the step cap, parks and graceful hand-backs are not failures.
    #[serde(default)]
    pub failures: u32,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub assigned_to: Option<String>,
    #[serde(default)]
    pub result: Option<RecoveryResult>,
    /// The source's session and configuration fingerprint, so the index entry can be
    /// rebuilt from the record alone.
    #[serde(default)]
    pub session_id: Option<crate::core::fact::SessionId>,
    #[serde(default)]
    pub fingerprint_sha256: String,
    pub admitted_at_ms: u64,
    pub updated_at_ms: u64,
    /// While parked: the recovery run's newest generation when it parked. A generation after
    /// it means an answer was committed (its `Answer` transition may have been lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked_at: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Running,
    Parked,
    Recovering,
    /// Recovery failed too often; set aside with its last error.
    Dead,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    pub format: u32,
    pub kind: String,
    pub run_id: RunId,
    #[serde(default)]
    pub session_id: Option<SessionId>,
    pub phase: Phase,
    /// Heartbeat key of the process running the run; when it stops beating for a TTL, the
    /// run is interrupted.
    #[serde(default)]
    pub holder: Option<String>,
    /// The lease TTL the holder declared: the coordinator judges it silent only after this
    /// long (or its own TTL, if longer), never after a shorter TTL of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_ttl_ms: Option<u64>,
    /// The recovery that continues this run, once admitted.
    #[serde(default)]
    pub recovery_id: Option<crate::core::fact::RecoveryId>,
    /// SHA-256 of the run's fingerprint, so work goes only to matching workers.
    pub fingerprint_sha256: String,
    pub updated_at_ms: u64,
}

impl IndexEntry {
    pub fn new(
        run_id: RunId,
        session_id: Option<SessionId>,
        phase: Phase,
        fingerprint_sha256: String,
        now_ms: u64,
    ) -> Self {
        IndexEntry {
            format: FORMAT_VERSION,
            kind: INDEX_ENTRY_KIND.into(),
            run_id,
            session_id,
            phase,
            holder: None,
            holder_ttl_ms: None,
            recovery_id: None,
            fingerprint_sha256,
            updated_at_ms: now_ms,
        }
    }
}
