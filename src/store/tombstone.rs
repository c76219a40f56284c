//! Terminal markers: what stays of a run after retention removed its checkpoint.
//!
//! This module owns `runs/<shard>/<run>/tombstone`, a small create-if-absent object written
//! before gc (or `rekindle runs rm`) deletes any of a run's generations. It records how the run
//! ended, its last epoch, its final generation and the first generation of every epoch, so that
//! a run, its epochs and its slots are never reused after the chain is gone: `generation::load`
//! turns a retired run into [`GenerationError::Retired`](crate::store::generation::GenerationError)
//! instead of folding what is left, and the next gc finishes a retirement a crash interrupted
//! from the tombstone alone. It never deletes anything itself (see `gc.rs`).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::core::epoch::Epoch;
use crate::core::fact::{Outcome, RunId};
use crate::core::layout::{self, FORMAT_VERSION};
use crate::store::{Store, StoreError};

const KIND: &str = "run.tombstone";

/// Why a run was retired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetiredBy {
    /// gc: the run ended longer ago than the retention period.
    Retention,
    /// `rekindle runs rm`: an operator retired it now, ended or not.
    Removal,
}

/// The terminal marker of a retired run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// Layout format the tombstone was written with; newer ones are refused on read.
    pub format: u32,
    /// Object kind tag, always `run.tombstone`.
    pub kind: String,
    /// The retired run; a tombstone naming another run is refused.
    pub run_id: RunId,
    /// How the run ended; `None` when it was removed before it ended.
    pub outcome: Option<Outcome>,
    /// The highest epoch that ever wrote or held the run; a new holder would need a higher one.
    pub last_epoch: Epoch,
    /// The newest generation when the run was retired.
    pub final_generation: u64,
    /// The first generation of every epoch: the slots gc keeps so stale writers stay fenced.
    pub epoch_starts: Vec<(Epoch, u64)>,
    /// Who retired the run: retention in gc, or an operator's `rekindle runs rm`.
    pub retired_by: RetiredBy,
    /// Wall-clock time of the retirement, in milliseconds since the Unix epoch.
    pub retired_at_ms: u64,
}

impl Tombstone {
    /// A tombstone of the current format for `run`, recording how and when it was retired.
    pub fn new(
        run: &RunId,
        outcome: Option<Outcome>,
        last_epoch: Epoch,
        final_generation: u64,
        epoch_starts: Vec<(Epoch, u64)>,
        retired_by: RetiredBy,
        retired_at_ms: u64,
    ) -> Tombstone {
        Tombstone {
            format: FORMAT_VERSION,
            kind: KIND.into(),
            run_id: run.clone(),
            outcome,
            last_epoch,
            final_generation,
            epoch_starts,
            retired_by,
            retired_at_ms,
        }
    }
}

/// Why reading or writing a tombstone failed.
#[derive(Debug, thiserror::Error)]
pub enum TombstoneError {
    /// The store failed underneath; see [`StoreError`] for whether retrying can help.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The tombstone is corrupt or from a newer format; leave the run as it is and report
    /// it rather than retire it again.
    #[error(transparent)]
    Object(#[from] layout::ObjectError),
    /// The tombstone under a run's key names another run; the bucket is damaged, and the run
    /// must not be retired or reused from it.
    #[error("tombstone '{key}' belongs to run \"{found}\", not \"{expected}\"")]
    ForeignRun {
        /// Key of the tombstone.
        key: String,
        /// The run whose tombstone was read.
        expected: RunId,
        /// The run the tombstone says it belongs to.
        found: RunId,
    },
}

/// Parses a tombstone object read from `key` (gc reads them without knowing the run first).
pub fn decode(key: &str, bytes: &[u8]) -> Result<Tombstone, TombstoneError> {
    Ok(layout::decode_object(key, KIND, bytes)?)
}

/// Reads the tombstone of `run`, if it was retired.
pub async fn read(store: &Store, run: &RunId) -> Result<Option<Tombstone>, TombstoneError> {
    let key = layout::tombstone(run.as_str());
    let Some(object) = store.read(&key).await? else {
        return Ok(None);
    };
    let tombstone = decode(&key, &object.bytes)?;
    if tombstone.run_id != *run {
        return Err(TombstoneError::ForeignRun {
            key,
            expected: run.clone(),
            found: tombstone.run_id,
        });
    }
    Ok(Some(tombstone))
}

/// Writes `tombstone` if the run has none yet and returns the one that is there: the first
/// retirement wins, so a gc finishing a crashed retirement keeps what the first one recorded.
pub async fn write(store: &Store, tombstone: &Tombstone) -> Result<Tombstone, TombstoneError> {
    let key = layout::tombstone(tombstone.run_id.as_str());
    let bytes = Bytes::from(serde_json::to_vec(tombstone).map_err(|error| {
        layout::ObjectError::Corrupt {
            key: key.clone(),
            reason: error.to_string(),
        }
    })?);
    match store.create(&key, bytes).await {
        Ok(_) => {
            tracing::info!(run_id = %tombstone.run_id, final_generation = tombstone.final_generation, retired_by = ?tombstone.retired_by, "run retired");
            Ok(tombstone.clone())
        }
        Err(StoreError::AlreadyExists { .. }) => {
            read(store, &tombstone.run_id).await?.ok_or_else(|| {
                layout::ObjectError::Corrupt {
                    key,
                    reason: "reported existing, then missing".into(),
                }
                .into()
            })
        }
        Err(other) => Err(other.into()),
    }
}
