//! Retention: removing superseded generations and finished recovery records.
//!
//! Architecture invariant: gc never frees a slot a stale writer could reuse. A stale writer
//! can only aim at the slot right after the last generation it knew, which is always the
//! first generation of some later epoch (the fence its successor wrote) — or a slot it wrote
//! itself, whose content is already part of a later snapshot. gc therefore keeps, for every
//! run, the newest snapshot and everything after it, plus the first generation of every epoch
//! (listed in each generation's `epoch_starts`); it deletes the other generations below the
//! snapshot. gc lists the bucket: it is a maintenance command, never part of a hot loop.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;

use crate::fact::RunId;
use crate::generation::{self, Chain};
use crate::layout;
use crate::recovery::{self, RecoveryState};
use crate::store::{Store, StoreError};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    pub runs_scanned: u64,
    pub generations_deleted: u64,
    pub recoveries_deleted: u64,
    /// Objects that could not be read, with the reason; they were left alone.
    pub skipped: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    Store(#[from] StoreError),
}

const PAGE: usize = 1000;

/// Lists every key under `prefix`, page by page.
async fn list_all(store: &Store, prefix: &str) -> Result<Vec<String>, StoreError> {
    let mut keys = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list(prefix, after.as_deref(), PAGE).await?;
        let full = page.len() == PAGE;
        after = page.last().map(|listed| listed.key.clone());
        keys.extend(page.into_iter().map(|listed| listed.key));
        if !full {
            return Ok(keys);
        }
    }
}

/// Runs one gc pass. Recovery records that finished (or were dead-lettered) more than
/// `retention` before `now_ms` are deleted.
pub async fn collect(store: &Store, retention: Duration, now_ms: u64) -> Result<GcReport, GcError> {
    let mut report = GcReport::default();
    let keys = list_all(store, layout::runs_prefix()).await?;
    // Group generation keys by the run they belong to ("runs/<shard>/<run>").
    let mut runs: BTreeSet<String> = BTreeSet::new();
    for key in &keys {
        if let Some((base, _)) = key.split_once("/gen/")
            && !base.ends_with("/loop")
        {
            runs.insert(base.to_owned());
        }
    }
    for base in runs {
        report.runs_scanned += 1;
        let chain = Chain::new(store, base.clone());
        let Some((snapshot, _)) = chain.hint().await? else {
            continue;
        };
        let snapshot_key = chain.key(snapshot);
        let Some(object) = store.read(&snapshot_key).await? else {
            report
                .skipped
                .push(format!("{snapshot_key}: hinted snapshot missing"));
            continue;
        };
        // The run ID is inside the object; decode without knowing it first.
        let run_id = serde_json::from_slice::<serde_json::Value>(&object.bytes)
            .ok()
            .and_then(|v| v.get("run_id").and_then(|r| r.as_str()).map(RunId::new));
        let Some(run_id) = run_id else {
            report
                .skipped
                .push(format!("{snapshot_key}: not a run generation"));
            continue;
        };
        let snapshot_generation = match generation::decode(&snapshot_key, &run_id, &object.bytes) {
            Ok(generation) if generation.snapshot => generation,
            Ok(_) => {
                report.skipped.push(format!(
                    "{snapshot_key}: hinted generation is not a snapshot"
                ));
                continue;
            }
            Err(error) => {
                report.skipped.push(error.to_string());
                continue;
            }
        };
        let keep: BTreeSet<u64> = snapshot_generation
            .epoch_starts
            .iter()
            .map(|&(_, generation)| generation)
            .collect();
        let prefix = format!("{base}/gen/");
        for key in keys.iter().filter(|k| k.starts_with(&prefix)) {
            if let Some(n) = layout::generation_number(key)
                && n < snapshot
                && !keep.contains(&n)
            {
                store.delete(key).await?;
                report.generations_deleted += 1;
            }
        }
    }

    for key in list_all(store, layout::recoveries_prefix()).await? {
        let Some(object) = store.read(&key).await? else {
            continue;
        };
        let record: recovery::RecoveryRecord =
            match layout::decode_object(&key, "recovery", &object.bytes) {
                Ok(record) => record,
                Err(error) => {
                    report.skipped.push(error.to_string());
                    continue;
                }
            };
        let done = matches!(
            record.state,
            RecoveryState::Finished | RecoveryState::DeadLettered
        );
        if done && record.updated_at_ms + (retention.as_millis() as u64) < now_ms {
            store.delete(&key).await?;
            report.recoveries_deleted += 1;
        }
    }
    Ok(report)
}
