//! Session snapshots, loop checkpoints and workflow checkpoints.
//!
//! Each is a chain of immutable envelopes (create-if-absent, numbered like run generations),
//! so a reader sees a whole previous envelope or a whole next one, never a mix. Session saves
//! are compare-and-swap on the digest of the envelope the saver last read. Loading refuses an
//! envelope from a newer format, and one that belongs to another run, session or workflow with
//! `refusing to resume checkpoint '<id>': <why>`. Never interprets the host's payloads.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::core::digest::sha256_hex;
use crate::core::fact::{Outcome, RunId, SessionId};
use crate::core::fold::{Message, RunState};
use crate::core::layout::{self, FORMAT_VERSION, ObjectError};
use crate::store::generation::{Chain, SlotWrite};
use crate::store::{Store, StoreError};

const SESSION_KIND: &str = "session.snapshot";
const LOOP_KIND: &str = "loop.checkpoint";
const WORKFLOW_KIND: &str = "workflow.checkpoint";
/// The hint is moved forward every this many saves, bounding the probe on load.
const HINT_EVERY: u64 = 8;

/// Why saving or loading a session, loop or workflow checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The store failed underneath; see [`StoreError`] for whether retrying can help.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored envelope is corrupt or from a newer format; leave it alone and upgrade
    /// rather than overwrite it.
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// The newest envelope belongs to another run, session or workflow; resuming from it
    /// would mix histories, so the caller must not resume.
    #[error("refusing to resume checkpoint '{checkpoint}': {reason}")]
    Refused {
        /// Key of the envelope that was refused.
        checkpoint: String,
        /// Whose it is instead, or what else is wrong with it.
        reason: String,
    },
    /// Another saver wrote the session since this caller read it; reload the session, reapply
    /// the change and save again with the new digest.
    #[error(
        "session \"{session}\" changed since it was read: expected digest {expected}, found {found}; reload and retry"
    )]
    Conflict {
        /// The session whose save was refused.
        session: SessionId,
        /// Digest the caller passed as the one it last read (`(none)` for a first save).
        expected: String,
        /// Digest of the newest saved envelope (`(none)` if nothing is saved yet).
        found: String,
    },
}

/// What a session holds, opaque to Rekindle. Saved and loaded as one atomic envelope.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionData {
    /// The host's own session state.
    #[serde(default)]
    pub data: Value,
    /// Files and other outputs the session produced.
    #[serde(default)]
    pub artifacts: Value,
    /// Traces and run records.
    #[serde(default)]
    pub runs: Value,
    /// Reports from verifying the session's work.
    #[serde(default)]
    pub verification_reports: Value,
    /// Tasks handed to subagents.
    #[serde(default)]
    pub subagent_tasks: Value,
    /// Findings from reviews of the session's work.
    #[serde(default)]
    pub review_findings: Value,
}

/// The stored form of one session snapshot: a header plus the session's contents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionEnvelope {
    /// Layout format the envelope was written with; newer ones are refused on load.
    pub format: u32,
    /// Object kind tag, always `session.snapshot`.
    pub kind: String,
    /// The session this snapshot belongs to; loading refuses an envelope of another session.
    pub session_id: SessionId,
    /// Position of this envelope in the session's chain, starting at 1.
    pub generation: u64,
    /// Wall-clock time of the save, in milliseconds since the Unix epoch.
    pub saved_at_ms: u64,
    /// Nonce of the write, so identical bytes can only come from the same save.
    pub writer: String,
    /// The host's session contents, flattened into the envelope.
    #[serde(flatten)]
    pub contents: SessionData,
}

/// A saved session: its generation and the digest to pass to the next save.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    /// Generation number the snapshot was saved at.
    pub generation: u64,
    /// SHA-256 of the saved envelope: what the next save must pass as `expected`.
    pub digest: String,
}

async fn save_in_chain(chain: &Chain, n: u64, bytes: Bytes) -> Result<bool, StoreError> {
    match chain.create(n, bytes, false).await? {
        SlotWrite::Created => {
            if n.is_multiple_of(HINT_EVERY) {
                chain.advance_hint(n).await?;
            }
            Ok(true)
        }
        SlotWrite::Taken | SlotWrite::Passed => Ok(false),
    }
}

/// Reads the newest envelope of a chain: its generation, bytes and digest.
async fn newest(chain: &Chain) -> Result<Option<(u64, Bytes, String)>, StoreError> {
    let Some(n) = chain.latest().await? else {
        return Ok(None);
    };
    match chain.store().read(&chain.key(n)).await? {
        Some(object) => {
            let digest = sha256_hex(&object.bytes);
            Ok(Some((n, object.bytes, digest)))
        }
        None => Ok(None),
    }
}

/// Saves a session snapshot if the newest saved one still has digest `expected` (`None`
/// when the caller believes there is none yet).
pub async fn save_session(
    store: &Store,
    session: &SessionId,
    contents: SessionData,
    expected: Option<&str>,
) -> Result<Saved, CheckpointError> {
    let chain = Chain::new(store, layout::session_base(session.as_str()));
    let current = newest(&chain).await?;
    let found = current.as_ref().map(|(_, _, digest)| digest.as_str());
    if found != expected {
        return Err(CheckpointError::Conflict {
            session: session.clone(),
            expected: expected.unwrap_or("(none)").to_owned(),
            found: found.unwrap_or("(none)").to_owned(),
        });
    }
    let n = current.map_or(1, |(n, _, _)| n + 1);
    let envelope = SessionEnvelope {
        format: FORMAT_VERSION,
        kind: SESSION_KIND.into(),
        session_id: session.clone(),
        generation: n,
        saved_at_ms: store.clock().wall_ms(),
        writer: store.clock().nonce(),
        contents,
    };
    let bytes = layout::encode_object(&envelope);
    let digest = sha256_hex(&bytes);
    if save_in_chain(&chain, n, bytes).await? {
        Ok(Saved {
            generation: n,
            digest,
        })
    } else {
        let found = newest(&chain)
            .await?
            .map_or_else(|| "(none)".to_owned(), |(_, _, digest)| digest);
        Err(CheckpointError::Conflict {
            session: session.clone(),
            expected: expected.unwrap_or("(none)").to_owned(),
            found,
        })
    }
}

/// Loads the newest session snapshot and its digest.
pub async fn load_session(
    store: &Store,
    session: &SessionId,
) -> Result<Option<(SessionEnvelope, Saved)>, CheckpointError> {
    let chain = Chain::new(store, layout::session_base(session.as_str()));
    let Some((n, bytes, digest)) = newest(&chain).await? else {
        return Ok(None);
    };
    let key = chain.key(n);
    let envelope: SessionEnvelope = layout::decode_object(&key, SESSION_KIND, &bytes)?;
    if envelope.session_id != *session {
        return Err(CheckpointError::Refused {
            checkpoint: key,
            reason: format!(
                "it belongs to session \"{}\", not \"{session}\"",
                envelope.session_id
            ),
        });
    }
    Ok(Some((
        envelope,
        Saved {
            generation: n,
            digest,
        },
    )))
}

/// A loop checkpoint, written after each tool result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoopCheckpoint {
    /// Layout format the checkpoint was written with; newer ones are refused on load.
    pub format: u32,
    /// Object kind tag, always `loop.checkpoint`.
    pub kind: String,
    /// The run this checkpoint belongs to; loading refuses a checkpoint of another run.
    pub run_id: RunId,
    /// The session the run belongs to, if any; loading checks it when a session is given.
    #[serde(default)]
    pub session_id: Option<SessionId>,
    /// Model turns the run had taken when the checkpoint was written.
    pub turns: u64,
    /// Tool calls the run had made when the checkpoint was written.
    pub tool_calls: u64,
    /// The conversation so far, as chat messages.
    pub messages: Vec<Value>,
    /// Wall-clock time the checkpoint was taken, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

impl LoopCheckpoint {
    /// The checkpoint of a folded run, at time `at_ms`.
    pub fn of(state: &RunState, at_ms: u64) -> Option<LoopCheckpoint> {
        let messages = state
            .messages()
            .map(|message| match message {
                Message::User(content) => serde_json::json!({"role": "user", "content": content}),
                Message::Assistant(turn) => serde_json::json!({
                    "role": "assistant",
                    "content": turn.content,
                    "tool_calls": turn.tool_calls.iter().map(|c| serde_json::json!({
                        "id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}
                    })).collect::<Vec<_>>(),
                }),
                Message::Tool {
                    call_id, output, ..
                } => {
                    serde_json::json!({"role": "tool", "tool_call_id": call_id, "content": output})
                }
            })
            .collect();
        Some(LoopCheckpoint {
            format: FORMAT_VERSION,
            kind: LOOP_KIND.into(),
            run_id: state.run_id()?.clone(),
            session_id: state.session_id().cloned(),
            turns: state.counters().model_turns,
            tool_calls: state.counters().tool_calls,
            messages,
            at_ms,
        })
    }
}

/// Appends a loop checkpoint; returns its generation.
pub async fn save_loop(store: &Store, checkpoint: &LoopCheckpoint) -> Result<u64, CheckpointError> {
    let chain = Chain::new(store, layout::loop_base(checkpoint.run_id.as_str()));
    let bytes = layout::encode_object(checkpoint);
    // A bounded number of tries: a concurrent saver of the same run is a bug upstream.
    for _ in 0..4 {
        let n = chain.latest().await?.map_or(1, |n| n + 1);
        if save_in_chain(&chain, n, bytes.clone()).await? {
            return Ok(n);
        }
    }
    Err(StoreError::Changed {
        key: layout::loop_base(checkpoint.run_id.as_str()),
    }
    .into())
}

/// Loads the newest loop checkpoint of `run`, refusing one of another run or session.
pub async fn load_loop(
    store: &Store,
    run: &RunId,
    session: Option<&SessionId>,
) -> Result<Option<LoopCheckpoint>, CheckpointError> {
    let chain = Chain::new(store, layout::loop_base(run.as_str()));
    let Some((n, bytes, _)) = newest(&chain).await? else {
        return Ok(None);
    };
    let key = chain.key(n);
    let checkpoint: LoopCheckpoint = layout::decode_object(&key, LOOP_KIND, &bytes)?;
    let refuse = |reason: String| CheckpointError::Refused {
        checkpoint: key.clone(),
        reason,
    };
    if checkpoint.run_id != *run {
        return Err(refuse(format!(
            "it belongs to run \"{}\", not \"{run}\"",
            checkpoint.run_id
        )));
    }
    if let Some(session) = session
        && checkpoint.session_id.as_ref() != Some(session)
    {
        return Err(refuse(format!(
            "it belongs to session {:?}, not \"{session}\"",
            checkpoint.session_id.as_ref().map(SessionId::as_str)
        )));
    }
    Ok(Some(checkpoint))
}

/// One finished step of a workflow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepOutcome {
    /// Name of the step in the workflow's definition.
    pub step: String,
    /// The run that carried out the step.
    pub run_id: RunId,
    /// How the step's run finished.
    pub outcome: Outcome,
    /// The run's closing message (for a failure, why it failed); empty when there is none.
    #[serde(default)]
    pub message: String,
    /// SHA-256 of the step's spec (prompt and session) it ran with, so a re-run with a
    /// changed spec is refused instead of skipped; absent in checkpoints written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_sha256: Option<String>,
}

/// The stored form of a workflow's progress: which steps have finished, and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowCheckpoint {
    /// Layout format the checkpoint was written with; newer ones are refused on load.
    pub format: u32,
    /// Object kind tag, always `workflow.checkpoint`.
    pub kind: String,
    /// The workflow this checkpoint belongs to; loading refuses one of another workflow.
    pub workflow_id: String,
    /// Every step finished so far, in the order they were recorded.
    pub completed: Vec<StepOutcome>,
    /// Wall-clock time of the save, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// Records the workflow's finished steps as a new checkpoint generation. Fails with a
/// conflict if another node saved one since `expected_generation`.
pub async fn save_workflow(
    store: &Store,
    workflow: &str,
    completed: Vec<StepOutcome>,
    expected_generation: Option<u64>,
) -> Result<u64, CheckpointError> {
    let chain = Chain::new(store, layout::workflow_base(workflow));
    let n = expected_generation.map_or(1, |n| n + 1);
    let checkpoint = WorkflowCheckpoint {
        format: FORMAT_VERSION,
        kind: WORKFLOW_KIND.into(),
        workflow_id: workflow.to_owned(),
        completed,
        at_ms: store.clock().wall_ms(),
    };
    let bytes = layout::encode_object(&checkpoint);
    if save_in_chain(&chain, n, bytes).await? {
        Ok(n)
    } else {
        Err(StoreError::AlreadyExists { key: chain.key(n) }.into())
    }
}

/// Loads the newest checkpoint of a workflow, with its generation.
pub async fn load_workflow(
    store: &Store,
    workflow: &str,
) -> Result<Option<(WorkflowCheckpoint, u64)>, CheckpointError> {
    let chain = Chain::new(store, layout::workflow_base(workflow));
    let Some((n, bytes, _)) = newest(&chain).await? else {
        return Ok(None);
    };
    let key = chain.key(n);
    let checkpoint: WorkflowCheckpoint = layout::decode_object(&key, WORKFLOW_KIND, &bytes)?;
    if checkpoint.workflow_id != workflow {
        return Err(CheckpointError::Refused {
            checkpoint: key,
            reason: format!(
                "it belongs to workflow \"{}\", not \"{workflow}\"",
                checkpoint.workflow_id
            ),
        });
    }
    Ok(Some((checkpoint, n)))
}
