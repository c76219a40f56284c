//! The index of runs that are not done: one small object per run under `index/`, so the
//! coordinator finds interrupted runs by listing the index, never the whole bucket.
//!
//! A host writes its run's entry when the run starts and updates it when the run parks or its
//! holder changes; the entry is deleted once the run has ended (and any recovery finished).
//! [`IndexScan`] lists the index and fetches only entries whose ETag changed since the last
//! scan, so a steady fleet costs one LIST per page per scan. Never decides what a run needs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt;

use crate::core::fact::RunId;
use crate::core::layout::{self, ObjectError};
use crate::core::record::{INDEX_ENTRY_KIND, IndexEntry, Phase};
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

/// The coordinator's incremental view of the index, small per run: like [`IndexScan`], but a
/// run its host drives (phase Running, a holder named, no recovery) is kept only as who holds
/// it and the TTL it declared — the only things a tick needs of it until its holder is judged
/// gone — and every other entry (those the control plane acts on) in full. A version is kept
/// as a hash of the listed ETag. About 235 bytes per run its host drives, measured
/// (the slot, its key, the hash table's slack: see ARCHITECTURE.md's coordinator-memory
/// invariant).
#[derive(Debug, Default)]
pub struct IndexWatch {
    slots: HashMap<Box<str>, Slot>,
    /// One copy of each holder's key, shared by the slots of its runs.
    holders: std::collections::HashSet<Arc<str>>,
    /// Scans so far: a slot not listed by the latest is dropped.
    pass: u32,
}

#[derive(Debug)]
struct Slot {
    version: u64,
    pass: u32,
    kept: Kept,
}

#[derive(Debug)]
enum Kept {
    Held {
        holder: Arc<str>,
        ttl_ms: Option<u64>,
    },
    Other(Box<IndexEntry>),
}

/// The runs that heartbeat key holds, as one [`IndexWatch::scan`] listed them: how many, and
/// the longest TTL their entries declare.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    /// Runs the holder drives.
    pub runs: usize,
    /// The longest TTL their entries declare, if any does.
    pub ttl_ms: Option<u64>,
}

/// One [`IndexWatch::scan`]: the entries the control plane acts on, in full, by run ID; the
/// holders of the runs their hosts drive; the keys that could not be read.
#[derive(Debug, Default)]
pub struct Scanned {
    /// Every entry that is not a run its host drives, sorted by run ID.
    pub entries: Vec<IndexEntry>,
    /// Each holder of runs its host drives (by heartbeat key), with what it holds.
    pub holders: BTreeMap<Arc<str>, Holding>,
    /// Entries that could not be read.
    pub bad: Vec<BadEntry>,
}

fn version_of(etag: &ETag) -> u64 {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same on every run, so nothing depends on a random seed.
    let mut hasher = std::hash::DefaultHasher::new();
    etag.0.hash(&mut hasher);
    hasher.finish()
}

/// An entry its host drives: who holds it, and the TTL it declared.
fn held(entry: &IndexEntry) -> Option<(&str, Option<u64>)> {
    match (&entry.phase, &entry.holder, &entry.recovery_id) {
        (Phase::Running, Some(holder), None) => Some((holder.as_str(), entry.holder_ttl_ms)),
        _ => None,
    }
}

impl IndexWatch {
    /// Entries the view keeps (every entry its last scan listed).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the view keeps no entry.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn intern(&mut self, holder: &str) -> Arc<str> {
        match self.holders.get(holder) {
            Some(interned) => Arc::clone(interned),
            None => {
                let interned: Arc<str> = Arc::from(holder);
                self.holders.insert(Arc::clone(&interned));
                interned
            }
        }
    }

    /// Lists the whole index, fetching only new or changed entries (as [`IndexScan::scan`]).
    pub async fn scan(&mut self, store: &Store) -> Result<Scanned, StoreError> {
        self.scan_shards(store, &[(0, 255)]).await
    }

    /// Lists the index entries whose shards lie in `ranges` (first and last shard of each: a
    /// coordinator's partitions), fetching only new or changed entries; what the view kept of
    /// other shards goes.
    pub async fn scan_shards(
        &mut self,
        store: &Store,
        ranges: &[(u8, u8)],
    ) -> Result<Scanned, StoreError> {
        // Updated in place, and each fetched entry decoded as it lands: a second map or the
        // whole first scan's objects held at once would set the process's memory high-water
        // mark at several times what the view keeps.
        self.pass = self.pass.wrapping_add(1);
        let pass = self.pass;
        let mut fetch = Vec::new();
        let slots = &mut self.slots;
        for range in ranges {
            store
                .for_each_in_shards(layout::index_prefix(), *range, |listed| {
                    let version = listed.etag.as_ref().map(version_of);
                    match slots.get_mut(listed.key.as_str()) {
                        Some(slot) if Some(slot.version) == version => slot.pass = pass,
                        _ => fetch.push(listed),
                    }
                })
                .await?;
        }
        // In key order, once each (a retried page lists some twice): the reads go out in the
        // same order whatever order the ranges came back in.
        fetch.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        fetch.dedup_by(|a, b| a.key == b.key);
        let mut fetched = futures::stream::iter(fetch)
            .map(|listed| async move {
                let object = store.read(&listed.key).await;
                (listed, object)
            })
            .buffered(SCAN_CONCURRENCY);
        let mut bad = Vec::new();
        while let Some((listed, object)) = fetched.next().await {
            // Gone since it was listed: its slot, if any, goes with the unlisted ones.
            let Some(object) = object? else {
                continue;
            };
            let entry = match layout::decode_object::<IndexEntry>(
                &listed.key,
                INDEX_ENTRY_KIND,
                &object.bytes,
            ) {
                Ok(entry) => entry,
                Err(error) => {
                    bad.push(BadEntry {
                        key: listed.key,
                        error: error.into(),
                    });
                    continue;
                }
            };
            // Kept under the listing's ETag, which the next listing reports again if the
            // entry is unchanged.
            let version = version_of(listed.etag.as_ref().unwrap_or(&object.etag));
            let kept = match held(&entry) {
                Some((holder, ttl_ms)) => Kept::Held {
                    holder: self.intern(holder),
                    ttl_ms,
                },
                None => Kept::Other(Box::new(entry)),
            };
            let slot = Slot {
                version,
                pass,
                kept,
            };
            self.slots.insert(listed.key.into_boxed_str(), slot);
        }
        drop(fetched);
        self.slots.retain(|_, slot| slot.pass == pass);
        self.holders.retain(|holder| Arc::strong_count(holder) > 1);
        let mut holders: BTreeMap<Arc<str>, Holding> = BTreeMap::new();
        for slot in self.slots.values() {
            if let Kept::Held { holder, ttl_ms } = &slot.kept {
                hold(&mut holders, Arc::clone(holder), *ttl_ms);
            }
        }
        let mut entries: Vec<IndexEntry> = self
            .slots
            .values()
            .filter_map(|slot| match &slot.kept {
                Kept::Other(entry) => Some(IndexEntry::clone(entry)),
                Kept::Held { .. } => None,
            })
            .collect();
        entries.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        Ok(Scanned {
            entries,
            holders,
            bad,
        })
    }

    /// The entries of the runs `holders` drove at the last scan, read again now: those still
    /// driven by the same holder, sorted by run ID (one that changed since is left to the next
    /// scan). Reads side by side; one that fails is left to the next tick.
    pub async fn held_by(&self, store: &Store, holders: &BTreeSet<String>) -> Vec<IndexEntry> {
        // Owned, so that the reads' futures borrow nothing from this view.
        let mut keys: Vec<(String, Arc<str>)> = self
            .slots
            .iter()
            .filter_map(|(key, slot)| match &slot.kept {
                Kept::Held { holder, .. } if holders.contains(&**holder) => {
                    Some((key.to_string(), Arc::clone(holder)))
                }
                _ => None,
            })
            .collect();
        keys.sort_unstable();
        let read: Vec<_> = futures::stream::iter(keys)
            .map(|(key, holder)| async move {
                let entry = match store.read(&key).await {
                    Ok(Some(object)) => {
                        layout::decode_object::<IndexEntry>(&key, INDEX_ENTRY_KIND, &object.bytes)
                            .ok()
                    }
                    Ok(None) => None,
                    Err(error) => {
                        tracing::warn!(%key, %error, "cannot read the index entry of a run whose holder is gone");
                        None
                    }
                };
                entry.filter(|entry| held(entry).is_some_and(|(now, _)| now == &*holder))
            })
            .buffered(SCAN_CONCURRENCY)
            .collect()
            .await;
        let mut entries: Vec<IndexEntry> = read.into_iter().flatten().collect();
        entries.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        entries
    }
}

fn hold(holders: &mut BTreeMap<Arc<str>, Holding>, holder: Arc<str>, ttl_ms: Option<u64>) {
    let holding = holders.entry(holder).or_default();
    holding.runs += 1;
    holding.ttl_ms = holding.ttl_ms.max(ttl_ms);
}
