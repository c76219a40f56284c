//! Recovery records: the durable, idempotent admission of a recovery under a host-chosen ID.
//!
//! This module owns the format of `recoveries/<shard>/<recovery>` and the source run's
//! `recovered-by` claim, and creating them. It never executes a recovery and never changes a
//! record after creating it: every later change is a lifecycle event (`fleet/lifecycle.rs`), which
//! is the only caller of `swap`.
//!
//! Architecture invariant: the same recovery ID is executed at most once (brief, invariant 5).
//! Admission is create-if-absent on both the source's claim and the record, so on every node
//! and after every restart, admitting the same ID for the same source returns the existing
//! record; the same ID for another source is refused as a conflict; another ID for an
//! already-claimed source is refused naming the existing one. State changes are
//! compare-and-swap on the record's ETag.

use serde::{Deserialize, Serialize};

use crate::core::fact::{Outcome, RecoveryId, RunId};
use crate::core::layout::{self, FORMAT_VERSION};
use crate::core::record::{RecoveryRecord, RecoveryState};
use crate::store::generation::{self, GenerationError};
use crate::store::{ETag, Store, StoreError};

const RECORD_KIND: &str = "recovery";
const CLAIM_KIND: &str = "recovery.claim";

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Claim {
    format: u32,
    kind: String,
    source_run: RunId,
    recovery_id: RecoveryId,
    /// Unique to the admission that wrote it: two admissions of the same ID write different
    /// bytes, so the store's lost-ack adoption (identical bytes are ours) cannot mistake
    /// another admission's claim for this one's.
    #[serde(default)]
    nonce: String,
}

/// Why admitting, reading or updating a recovery record failed.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// The store failed underneath; see [`StoreError`] for whether retrying can help.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The source run cannot be loaded. `error` names the run (or its object) already, and is
    /// part of the message rather than its `source`, so the message names both once.
    #[error("cannot recover: {error}")]
    Source {
        /// The run that was to be recovered.
        source_run: RunId,
        /// Why it cannot be loaded.
        error: GenerationError,
    },
    /// The recovery ID was already admitted for another source run; the host must choose
    /// another ID for this source.
    #[error(
        "recovery ID '{recovery_id}' is already used for run \"{existing_source}\", not \"{requested_source}\""
    )]
    IdInUse {
        /// The recovery ID asked for.
        recovery_id: RecoveryId,
        /// The run it was admitted for earlier.
        existing_source: RunId,
        /// The run this admission asked for.
        requested_source: RunId,
    },
    /// The recovery ID is already a run's ID; a recovery runs under its own ID, so the host
    /// must choose a new one.
    #[error(
        "recovery ID '{recovery_id}' already names a run (\"{recovery_id}\" has a lease); a recovery runs as a run of its own ID, so it must be new"
    )]
    IdIsARun {
        /// The recovery ID that names a run.
        recovery_id: RecoveryId,
    },
    /// The source run is already claimed by another recovery; follow that one instead of
    /// starting a second.
    #[error("run \"{source_run}\" is already being recovered as '{existing}'")]
    AlreadyRecovered {
        /// The run asked for.
        source_run: RunId,
        /// The recovery that claimed it.
        existing: RecoveryId,
    },
    /// The source run's first slot holds only a fence: it never committed, so there is
    /// nothing to recover; start it afresh.
    #[error(
        "run \"{source_run}\" never made its first commit (its first slot was claimed by a fence); there is nothing to recover"
    )]
    NeverStarted {
        /// The run that never started.
        source_run: RunId,
    },
    /// No run has this ID in the store: no lease, no generation (a typo, or another store).
    #[error(
        "run \"{source_run}\" does not exist in this store (no lease, no generation); check the run ID (the runs not done are listed by `runs`)"
    )]
    NoSuchRun {
        /// The run asked for.
        source_run: RunId,
    },
    /// The source run has already ended; nothing is recovered and the caller moves on.
    #[error("run \"{source_run}\" has ended ({outcome}); there is nothing to recover")]
    NothingToRecover {
        /// The run that ended.
        source_run: RunId,
        /// How it ended.
        outcome: Outcome,
    },
    /// The record or claim is corrupt, foreign or from a newer format; leave it alone and
    /// report it.
    #[error(transparent)]
    Object(#[from] layout::ObjectError),
    /// The record changed since it was read (another node moved the lifecycle on); reread it
    /// and decide again.
    #[error("recovery '{recovery_id}' was changed by someone else; reread and retry")]
    Changed {
        /// The recovery whose record changed.
        recovery_id: RecoveryId,
    },
}

/// The outcome of an admission.
#[derive(Clone, Debug)]
pub struct Admission {
    /// The record as stored.
    pub record: RecoveryRecord,
    /// Its version, for the lifecycle's next compare-and-swap.
    pub etag: ETag,
    /// False when the record already existed (a replay of the same admission).
    pub created: bool,
}

/// The record stored under `key`, a key a listing of `recoveries/` returned. The key's last
/// segment is the recovery ID only for a plain ID (an encoded one is a hash, see
/// `layout::encode_id`), so the record names its ID itself.
pub async fn read_listed(
    store: &Store,
    key: &str,
) -> Result<Option<(RecoveryRecord, ETag)>, RecoveryError> {
    match store.read(key).await? {
        None => Ok(None),
        Some(object) => {
            let record: RecoveryRecord = layout::decode_object(key, RECORD_KIND, &object.bytes)?;
            if layout::recovery(record.recovery_id.as_str()) != key {
                return Err(layout::ObjectError::Corrupt {
                    key: key.to_owned(),
                    reason: format!("it is the record of '{}'", record.recovery_id),
                }
                .into());
            }
            Ok(Some((record, object.etag)))
        }
    }
}

/// Reads a recovery record.
pub async fn read(
    store: &Store,
    recovery_id: &RecoveryId,
) -> Result<Option<(RecoveryRecord, ETag)>, RecoveryError> {
    // The key names the ID (`encode_id` gives two IDs two keys), so a record whose key is its
    // own is this ID's.
    read_listed(store, &layout::recovery(recovery_id.as_str())).await
}

async fn read_claim(store: &Store, source: &RunId) -> Result<Option<Claim>, RecoveryError> {
    let key = layout::recovered_by(source.as_str());
    match store.read(&key).await? {
        None => Ok(None),
        Some(object) => Ok(Some(layout::decode_object(
            &key,
            CLAIM_KIND,
            &object.bytes,
        )?)),
    }
}

/// Claims `source` for `recovery_id` (create-if-absent). Returns whether this call created
/// the claim; refuses a source already claimed by another ID. Admission claims before it
/// fences and pins, so any other writer of the source that checks the claim after taking
/// its lease either sees it or is fenced by what follows.
pub async fn claim(
    store: &Store,
    source: &RunId,
    recovery_id: &RecoveryId,
) -> Result<bool, RecoveryError> {
    let claim_key = layout::recovered_by(source.as_str());
    let claim = Claim {
        format: FORMAT_VERSION,
        kind: CLAIM_KIND.into(),
        source_run: source.clone(),
        recovery_id: recovery_id.clone(),
        nonce: store.clock().nonce(),
    };
    let claim_bytes = layout::encode_object(&claim);
    match store.create(&claim_key, claim_bytes).await {
        Ok(_) => Ok(true),
        Err(StoreError::AlreadyExists { .. }) => match read_claim(store, source).await? {
            Some(existing) if existing.recovery_id == *recovery_id => Ok(false),
            Some(existing) => Err(RecoveryError::AlreadyRecovered {
                source_run: source.clone(),
                existing: existing.recovery_id,
            }),
            None => Err(layout::ObjectError::Corrupt {
                key: claim_key,
                reason: "reported existing, then missing".into(),
            }
            .into()),
        },
        Err(other) => Err(other.into()),
    }
}

/// Gives back a claim this admission created when no record follows it (the source turned
/// out to have ended or never started). Only a claim naming `recovery_id` is removed.
pub async fn release_claim(
    store: &Store,
    source: &RunId,
    recovery_id: &RecoveryId,
) -> Result<(), RecoveryError> {
    if read(store, recovery_id).await?.is_some() {
        return Ok(());
    }
    if let Some(claim) = read_claim(store, source).await?
        && claim.recovery_id == *recovery_id
    {
        store.delete(&layout::recovered_by(source.as_str())).await?;
    }
    Ok(())
}

/// The recovery ID that claimed `source`, if any.
pub async fn claimed_by(
    store: &Store,
    source: &RunId,
) -> Result<Option<RecoveryId>, RecoveryError> {
    Ok(read_claim(store, source)
        .await?
        .map(|claim| claim.recovery_id))
}

/// Creates the claim and the record of a recovery of `source` under `recovery_id`,
/// idempotently. Callers go through `fleet::admission::admit`, which fences the source first.
pub async fn admit(
    store: &Store,
    source: &RunId,
    recovery_id: &RecoveryId,
    force: bool,
) -> Result<Admission, RecoveryError> {
    let replay = |record: RecoveryRecord, etag: ETag| -> Result<Admission, RecoveryError> {
        if record.source_run == *source {
            Ok(Admission {
                record,
                etag,
                created: false,
            })
        } else {
            Err(RecoveryError::IdInUse {
                recovery_id: recovery_id.clone(),
                existing_source: record.source_run,
                requested_source: source.clone(),
            })
        }
    };
    if let Some((record, etag)) = read(store, recovery_id).await? {
        return replay(record, etag);
    }
    if let Some(claim) = read_claim(store, source).await?
        && claim.recovery_id != *recovery_id
    {
        return Err(RecoveryError::AlreadyRecovered {
            source_run: source.clone(),
            existing: claim.recovery_id,
        });
    }
    let loaded = generation::load(store, source, None)
        .await
        .map_err(|source_error| match source_error {
            // A run retired after it ended: as ended as it was before gc.
            GenerationError::Retired {
                outcome: Some(outcome),
                ..
            } => RecoveryError::NothingToRecover {
                source_run: source.clone(),
                outcome,
            },
            error => RecoveryError::Source {
                source_run: source.clone(),
                error,
            },
        })?;
    // Refused before the claim is written: an ended or never-started source keeps no claim.
    check_recoverable(source, &loaded.state)?;
    let claimed_now = claim(store, source, recovery_id).await?;
    let pin = Pin {
        generation: loaded.generation,
        digest: loaded.digest.clone(),
        epoch: loaded.epoch,
        state: &loaded.state,
        base: loaded.base,
    };
    create_pinned(store, source, recovery_id, force, pin, claimed_now).await
}

/// Refuses a source that ended (nothing to recover) or never started (nothing was
/// acknowledged).
fn check_recoverable(
    source: &RunId,
    state: &crate::core::fold::RunState,
) -> Result<(), RecoveryError> {
    if let Some(terminal) = state.terminal() {
        return Err(RecoveryError::NothingToRecover {
            source_run: source.clone(),
            outcome: terminal.outcome,
        });
    }
    if state.meta().is_none() {
        return Err(RecoveryError::NeverStarted {
            source_run: source.clone(),
        });
    }
    Ok(())
}

/// The source generation a recovery is pinned to, and the source's state there.
#[derive(Debug)]
pub struct Pin<'a> {
    /// The source's newest generation when the recovery was admitted (after its fence).
    pub generation: u64,
    /// SHA-256 of that generation object's bytes.
    pub digest: String,
    /// The epoch that generation was written at.
    pub epoch: crate::core::epoch::Epoch,
    /// The source's state as of that generation.
    pub state: &'a crate::core::fold::RunState,
    /// The snapshot that generation builds on.
    pub base: u64,
}

/// Creates the record of a recovery of `source` pinned at `pin`, for a caller that has
/// already refused a taken ID and claimed the source (`claimed_now`: by this call, so the
/// claim is given back if the ID turns out to be another source's). Refuses a source that
/// ended or never started, writing nothing. A replay returns the existing record.
pub async fn create_pinned(
    store: &Store,
    source: &RunId,
    recovery_id: &RecoveryId,
    force: bool,
    pin: Pin<'_>,
    claimed_now: bool,
) -> Result<Admission, RecoveryError> {
    check_recoverable(source, pin.state)?;
    let now = store.clock().wall_ms();
    let record = RecoveryRecord {
        format: FORMAT_VERSION,
        kind: RECORD_KIND.into(),
        recovery_id: recovery_id.clone(),
        source_run: source.clone(),
        source_generation: pin.generation,
        source_digest: pin.digest,
        source_base: Some(pin.base),
        source_epoch: pin.epoch,
        state: RecoveryState::Admitted,
        force,
        attempts: 0,
        failures: 0,
        last_error: None,
        assigned_to: None,
        result: None,
        session_id: pin.state.session_id().cloned(),
        fingerprint_sha256: pin
            .state
            .meta()
            .map(|meta| meta.fingerprint.sha256())
            .unwrap_or_default(),
        admitted_at_ms: now,
        updated_at_ms: now,
        parked_at: None,
        abandoned_by: None,
        declined_by: None,
    };
    let key = layout::recovery(recovery_id.as_str());
    let bytes = layout::encode_object(&record);
    match store.create(&key, bytes).await {
        Ok(etag) => {
            tracing::info!(recovery_id = %recovery_id, source_run = %source, generation = record.source_generation, "recovery admitted");
            Ok(Admission {
                record,
                etag,
                created: true,
            })
        }
        Err(StoreError::AlreadyExists { .. }) => {
            let (existing, etag) =
                read(store, recovery_id)
                    .await?
                    .ok_or_else(|| layout::ObjectError::Corrupt {
                        key: key.clone(),
                        reason: "reported existing, then missing".into(),
                    })?;
            if existing.source_run == *source {
                return Ok(Admission {
                    record: existing,
                    etag,
                    created: false,
                });
            }
            if claimed_now {
                // The ID went to another source in the meantime: give the claim back.
                release_claim(store, source, recovery_id).await?;
            }
            Err(RecoveryError::IdInUse {
                recovery_id: recovery_id.clone(),
                existing_source: existing.source_run,
                requested_source: source.clone(),
            })
        }
        Err(other) => Err(other.into()),
    }
}

/// Replaces a record by compare-and-swap on the version read. Only the lifecycle calls this:
/// it decides the new record with its pure transition function first.
pub(crate) async fn swap(
    store: &Store,
    next: &RecoveryRecord,
    etag: &ETag,
) -> Result<ETag, RecoveryError> {
    let key = layout::recovery(next.recovery_id.as_str());
    let bytes = layout::encode_object(next);
    match store.swap(&key, bytes, etag).await {
        Ok(etag) => Ok(etag),
        Err(StoreError::Changed { .. }) => Err(RecoveryError::Changed {
            recovery_id: next.recovery_id.clone(),
        }),
        Err(other) => Err(other.into()),
    }
}
