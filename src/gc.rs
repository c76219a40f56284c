//! Retention: removing superseded generations and finished recovery records.
//!
//! Architecture invariant: gc never frees a slot a stale writer could reuse. A stale writer
//! can only aim at the slot right after the last generation it knew, which is always the
//! first generation of some later epoch (the fence its successor wrote) — or a slot it wrote
//! itself, whose content is already part of a later snapshot. gc therefore keeps, for every
//! run, the newest snapshot and everything after it, plus the first generation of every epoch
//! (listed in each generation's `epoch_starts`); it deletes the other generations below the
//! snapshot. A run that ended longer ago than the retention period (not leased, not in the
//! index) has its whole checkpoint removed by the same rule: only its epochs' first slots
//! stay, a few small objects. gc lists the bucket: it is a maintenance command, never part of
//! a hot loop.

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
    /// Finished runs whose checkpoints were removed (all but their epochs' first slots).
    pub runs_removed: u64,
    pub recoveries_deleted: u64,
    /// Objects that could not be read, with the reason; they were left alone.
    pub skipped: Vec<String>,
}

/// A run that ended (terminal fact), is not leased, not in the index, and whose newest
/// generation is older than the retention period.
async fn finished_long_ago(
    store: &Store,
    run: &RunId,
    retention: Duration,
    now_ms: u64,
) -> Result<bool, StoreError> {
    let Ok(loaded) = generation::load(store, run, None).await else {
        return Ok(false);
    };
    if loaded.state.terminal().is_none() {
        return Ok(false);
    }
    if store
        .head(&layout::index_entry(run.as_str()))
        .await?
        .is_some()
    {
        return Ok(false);
    }
    let released = match crate::lease::read_lease(store, run).await {
        Ok(Some(view)) => view.lease.released,
        Ok(None) => true,
        Err(_) => false,
    };
    let newest = Chain::new(store, layout::run_base(run.as_str()));
    let at_ms = match store.read(&newest.key(loaded.generation)).await? {
        Some(object) => generation::decode_with(
            store.sealer(),
            &newest.key(loaded.generation),
            run,
            &object.bytes,
        )
        .map_or(u64::MAX, |g| g.at_ms),
        None => u64::MAX,
    };
    Ok(released && at_ms.saturating_add(retention.as_millis() as u64) < now_ms)
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
        let snapshot_generation =
            match generation::decode_with(store.sealer(), &snapshot_key, &run_id, &object.bytes) {
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
        if finished_long_ago(store, &run_id, retention, now_ms).await? {
            // The whole checkpoint goes, but for the first slot of every epoch: a stale
            // writer of this run could still aim there and must find it taken.
            let mut epoch_starts = keep.clone();
            if let Ok(loaded) = generation::load(store, &run_id, None).await {
                epoch_starts.extend(loaded.epoch_starts.iter().map(|&(_, g)| g));
            }
            for key in keys.iter().filter(|k| k.starts_with(&format!("{base}/"))) {
                let fence = layout::generation_number(key)
                    .is_some_and(|n| epoch_starts.contains(&n))
                    && key.starts_with(&prefix);
                if !fence {
                    store.delete(key).await?;
                }
            }
            report.runs_removed += 1;
            continue;
        }
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
