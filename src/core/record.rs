//! The records the lifecycle changes, as data: a recovery record and the index entry of the
//! run it continues. Their I/O lives in `store::recovery` and `store::index`.

use serde::{Deserialize, Serialize};

use crate::core::epoch::Epoch;
use crate::core::fact::{Outcome, RecoveryId, RunId, SessionId};
use crate::core::layout::FORMAT_VERSION;

/// The `kind` of an index entry object.
pub const INDEX_ENTRY_KIND: &str = "index.entry";

/// Where a recovery stands in its lifecycle.
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

/// How a finished recovery ended, from the run's terminal fact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryResult {
    /// The outcome of the run's terminal fact.
    pub outcome: Outcome,
    /// The terminal fact's message.
    pub message: String,
    /// The recovery run's newest generation when it ended, holding its terminal fact.
    pub final_generation: u64,
}

/// The record of one recovery: the truth about it, changed only by lifecycle events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryRecord {
    /// The object format version the record was written with.
    pub format: u32,
    /// The envelope kind, always `"recovery"`.
    pub kind: String,
    /// The recovery's ID.
    pub recovery_id: RecoveryId,
    /// The interrupted run the recovery continues.
    pub source_run: RunId,
    /// The source generation the recovery resumes from.
    pub source_generation: u64,
    /// The SHA-256 of the source generation's object.
    pub source_digest: String,
    /// The snapshot the source generation builds on, so a worker reads the whole pinned
    /// chain at once. A hint: the chain checks decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_base: Option<u64>,
    /// The epoch of that generation; the recovery run's epochs start above it.
    #[serde(default)]
    pub source_epoch: Epoch,
    /// Where the recovery stands in its lifecycle.
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
    /// The error of the last failed attempt, if any.
    #[serde(default)]
    pub last_error: Option<String>,
    /// The worker the recovery is offered to or running on, if any.
    #[serde(default)]
    pub assigned_to: Option<String>,
    /// How the run ended, once the recovery finished.
    #[serde(default)]
    pub result: Option<RecoveryResult>,
    /// The source's session and configuration fingerprint, so the index entry can be
    /// rebuilt from the record alone.
    #[serde(default)]
    pub session_id: Option<crate::core::fact::SessionId>,
    /// The SHA-256 of the source run's configuration fingerprint.
    #[serde(default)]
    pub fingerprint_sha256: String,
    /// When the recovery was admitted, in wall-clock milliseconds.
    pub admitted_at_ms: u64,
    /// When the last event changed the record, in wall-clock milliseconds.
    pub updated_at_ms: u64,
    /// While parked: the recovery run's newest generation when it parked. A generation after
    /// it means an answer was committed (its `Answer` transition may have been lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked_at: Option<u64>,
    /// The worker whose attempt was the last to end, if the coordinator abandoned it after
    /// judging the worker gone: the next attempt takes the recovery run's lease over from it
    /// at once instead of watching it for another TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandoned_by: Option<String>,
    /// The worker that last declined its offer (it was stopping; its registration says it
    /// drains, and placement offers a draining worker nothing). Cleared when an attempt
    /// starts. For people and for the coordinator, which rereads the registrations when it
    /// first sees a decline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declined_by: Option<String>,
}

/// Where the index says a run not yet done stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Its holder drives it; with no holder, or a silent one, it is interrupted.
    Running,
    /// It waits for a human's answer.
    Parked,
    /// A recovery was admitted and has not finished.
    Recovering,
    /// Recovery failed too often; set aside with its last error.
    Dead,
}

/// A run's index entry: one per run not yet done, so a coordinator finds work without
/// listing the bucket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// The object format version the entry was written with.
    pub format: u32,
    /// The envelope kind, always [`INDEX_ENTRY_KIND`].
    pub kind: String,
    /// The run the entry tracks.
    pub run_id: RunId,
    /// The run's session, if it has one.
    #[serde(default)]
    pub session_id: Option<SessionId>,
    /// Where the run stands.
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
    /// When the entry was last written, in wall-clock milliseconds.
    pub updated_at_ms: u64,
}

impl IndexEntry {
    /// An entry in the current format, with no holder and no recovery yet.
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
