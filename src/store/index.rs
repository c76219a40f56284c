//! The index of runs that are not done: one small object per run under `index/`, so the
//! coordinator finds interrupted runs by listing the index, never the whole bucket.
//!
//! A host writes its run's entry when the run starts and updates it when the run parks or its
//! holder changes; the entry is deleted once the run has ended (and any recovery finished).
//! [`IndexScan`] lists the index and fetches only entries whose ETag changed since the last
//! scan, so a steady fleet costs one LIST per page per scan. Never decides what a run needs.

use std::collections::HashMap;

use futures::StreamExt;

use crate::core::fact::RunId;
use crate::core::layout::{self, ObjectError};
use crate::core::record::{INDEX_ENTRY_KIND, IndexEntry};
use crate::store::{ETag, Store, StoreError};

/// Why reading or writing an index entry failed.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The store failed underneath; see [`StoreError`] for whether retrying can help.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The entry is not a Rekindle index entry, is corrupt, or is from a newer format; it is
    /// skipped and reported, never overwritten.
    #[error(transparent)]
    Object(#[from] ObjectError),
}

/// Writes (or replaces) a run's entry; returns its version.
pub async fn put(store: &Store, entry: &IndexEntry) -> Result<ETag, IndexError> {
    let bytes = layout::encode_object(entry);
    Ok(store
        .put(&layout::index_entry(entry.run_id.as_str()), bytes)
        .await?)
}

/// Replaces a run's entry only if it is still at version `expected`; `false` if someone
/// else rewrote it meanwhile (and it was left as they wrote it).
pub async fn swap(store: &Store, entry: &IndexEntry, expected: &ETag) -> Result<bool, IndexError> {
    let bytes = layout::encode_object(entry);
    match store
        .swap(&layout::index_entry(entry.run_id.as_str()), bytes, expected)
        .await
    {
        Ok(_) => Ok(true),
        Err(StoreError::Changed { .. }) => Ok(false),
        Err(other) => Err(other.into()),
    }
}

/// Reads a run's entry.
pub async fn read(store: &Store, run: &RunId) -> Result<Option<IndexEntry>, IndexError> {
    let key = layout::index_entry(run.as_str());
    match store.read(&key).await? {
        None => Ok(None),
        Some(object) => Ok(Some(layout::decode_object(
            &key,
            INDEX_ENTRY_KIND,
            &object.bytes,
        )?)),
    }
}

/// Removes a run's entry (idempotent).
pub async fn remove(store: &Store, run: &RunId) -> Result<(), IndexError> {
    store.delete(&layout::index_entry(run.as_str())).await?;
    Ok(())
}

/// An entry that could not be read: reported, never fatal to the scan.
#[derive(Debug)]
pub struct BadEntry {
    /// Key of the entry under `index/`.
    pub key: String,
    /// Why it could not be read.
    pub error: IndexError,
}

/// Entries read at once by a scan: after an outage every entry changes at once, and on a
/// store with S3's 20–30 ms per request each batch is a round trip before the first
/// recovery is assigned.
const SCAN_CONCURRENCY: usize = 256;

/// Incremental scans of the index, caching entries by ETag.
#[derive(Debug, Default)]
pub struct IndexScan {
    cache: HashMap<String, (ETag, IndexEntry)>,
}

impl IndexScan {
    /// Lists the whole index, fetching only new or changed entries. Returns the live
    /// entries, and the keys that could not be read (a foreign or corrupt object does not
    /// hide the others).
    pub async fn scan(
        &mut self,
        store: &Store,
    ) -> Result<(Vec<IndexEntry>, Vec<BadEntry>), StoreError> {
        let mut seen = HashMap::new();
        let mut bad = Vec::new();
        let mut fetch = Vec::new();
        for listed in store.list_all(layout::index_prefix()).await? {
            let cached = self
                .cache
                .remove(&listed.key)
                .filter(|(etag, _)| listed.etag.as_ref() == Some(etag));
            match cached {
                Some(hit) => {
                    seen.insert(listed.key.clone(), hit);
                }
                None => fetch.push(listed),
            }
        }
        // New or changed entries are read side by side: after an outage every entry changes
        // at once, and one GET after another would take a round trip each.
        let fetched: Vec<_> = futures::stream::iter(fetch)
            .map(|listed| async move {
                let object = store.read(&listed.key).await;
                (listed, object)
            })
            .buffered(SCAN_CONCURRENCY)
            .collect()
            .await;
        for (listed, object) in fetched {
            let Some(object) = object? else {
                continue;
            };
            match layout::decode_object::<IndexEntry>(&listed.key, INDEX_ENTRY_KIND, &object.bytes)
            {
                // Cached under the listing's ETag, which the next listing reports again if
                // the entry is unchanged.
                Ok(entry) => {
                    seen.insert(
                        listed.key.clone(),
                        (listed.etag.clone().unwrap_or(object.etag), entry),
                    );
                }
                Err(error) => bad.push(BadEntry {
                    key: listed.key.clone(),
                    error: error.into(),
                }),
            }
        }
        self.cache = seen;
        let mut entries: Vec<IndexEntry> = self.cache.values().map(|(_, e)| e.clone()).collect();
        entries.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        Ok((entries, bad))
    }
}
