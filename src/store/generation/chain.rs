//! A chain of numbered immutable objects and its hint: finding the newest generation
//! without a LIST (probe from the hint, reread the hint if it moved).

use serde::{Deserialize, Serialize};

use crate::core::layout::{self, FORMAT_VERSION};
use crate::store::{ETag, Store, StoreError};

/// The chain of immutable numbered objects under one base key, with a hint object that
/// points at the newest snapshot. Shared by run generations and checkpoints.
#[derive(Clone, Debug)]
pub struct Chain {
    store: Store,
    pub(super) base: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Hint {
    format: u32,
    kind: String,
    /// A generation known to exist, at or after every generation gc may have deleted.
    generation: u64,
    /// The run was retired (see `tombstone.rs`): gc may delete every generation but the
    /// epochs' first ones, so the chain must not be probed or loaded any more. Set only after
    /// the tombstone exists and before anything is deleted; never cleared.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    retired: bool,
}

/// The envelope kind of a chain's hint object.
const HINT_KIND: &str = "chain.head";

/// The hint as read: the generation it points at, its version, and whether the run is retired.
#[derive(Clone, Debug)]
pub struct HintView {
    /// The generation the hint points at: one that exists, at or after anything gc deleted.
    pub generation: u64,
    /// The hint object's version, for moving it forward with a compare-and-swap.
    pub etag: ETag,
    /// Whether the run was retired; a retired chain must not be probed or loaded.
    pub retired: bool,
}

/// Where a chain's newest generation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Located {
    /// No generation exists.
    Empty,
    /// The newest generation.
    At(u64),
    /// The run was retired at this final generation; its chain is (being) removed.
    Retired(u64),
}

/// What creating a slot found (see [`Chain::create`]).
#[derive(Clone, Debug)]
pub enum SlotWrite {
    /// Our bytes are in the slot: written now, or by an earlier attempt whose response was
    /// lost.
    Created,
    /// Other bytes are in the slot.
    Taken,
    /// The slot is empty after a create of ours whose outcome was unknown, and the chain went
    /// on past it (the hint points beyond it, or the run was retired): gc may have collected
    /// a write of ours there, so the slot stays empty. The writer was overtaken.
    Passed,
}

/// What a writer knows of its chain's hint, to move it without reading it first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HintState {
    /// Not known: read it before moving it.
    Unknown,
    /// Known not to exist (this writer created the chain, and a hint at 1 is never written).
    Absent,
    /// This writer wrote it last, at this version.
    Written(ETag),
}

/// Slots a probe read whole, by number, for the load that follows it.
pub(super) type Fetched = std::collections::BTreeMap<u64, crate::store::Object>;

/// How many slots from the hint a load reads at once before probing on one at a time: one
/// round trip where probing one by one takes up to four. Right at a snapshot it reads two
/// slots more than the probe would (which reads the hinted slot and the next); one or two past
/// it as many (the hinted slot, the next, the third, the second); further on, fewer.
const PROBE_WINDOW: u64 = 4;

/// How often `Chain::locate` probes again when the hint moved past its result while it probed.
const PROBE_ROUNDS: usize = 8;

impl Chain {
    /// The chain under `base` (a run's, a session's, a loop's or a workflow's key prefix).
    pub fn new(store: &Store, base: String) -> Self {
        Chain {
            store: store.clone(),
            base,
        }
    }

    /// Key of slot `n` in this chain.
    pub fn key(&self, n: u64) -> String {
        layout::generation(&self.base, n)
    }

    /// The store the chain lives in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Reads the hint: a generation that exists and from which the newest is probed.
    pub async fn hint(&self) -> Result<Option<(u64, ETag)>, StoreError> {
        Ok(self
            .read_hint()
            .await?
            .map(|hint| (hint.generation, hint.etag)))
    }

    /// Reads the hint with its retirement mark. A hint that does not decode (corrupt, foreign,
    /// or from a newer format) is an error naming it, never "no hint": without the hint a
    /// load probes from 1 and, after gc, could fold a stale prefix; a takeover could fence
    /// into a free low slot.
    pub async fn read_hint(&self) -> Result<Option<HintView>, StoreError> {
        let key = layout::head(&self.base);
        let Some(object) = self.store.read(&key).await? else {
            return Ok(None);
        };
        let hint: Hint = layout::decode_object(&key, HINT_KIND, &object.bytes)?;
        Ok(Some(HintView {
            generation: hint.generation,
            etag: object.etag,
            retired: hint.retired,
        }))
    }

    /// Marks the chain retired at `final_generation` (create or compare-and-swap, retried a
    /// bounded number of times). The caller has written the run's tombstone first; gc deletes
    /// generations only after this returns, so every reader that finds one missing and rereads
    /// the hint learns why.
    pub async fn retire_hint(&self, final_generation: u64) -> Result<(), StoreError> {
        let key = layout::head(&self.base);
        for _ in 0..PROBE_ROUNDS {
            let current = match self.read_hint().await {
                // Retiring a damaged chain replaces a hint that does not decode (on its
                // version): nothing reads it as a live chain's again.
                Err(StoreError::Object(_)) => match self.store.read(&key).await? {
                    Some(object) => Some(HintView {
                        generation: 0,
                        etag: object.etag,
                        retired: false,
                    }),
                    None => None,
                },
                other => other?,
            };
            let hint = Hint {
                format: FORMAT_VERSION,
                kind: HINT_KIND.into(),
                generation: current.as_ref().map_or(final_generation, |hint| {
                    hint.generation.max(final_generation)
                }),
                retired: true,
            };
            let bytes = layout::encode_object(&hint);
            let written = match current {
                Some(hint) if hint.retired => return Ok(()),
                Some(hint) => self.store.swap(&key, bytes, &hint.etag).await.map(drop),
                None => self.store.create(&key, bytes).await.map(drop),
            };
            match written {
                Ok(()) => return Ok(()),
                Err(StoreError::Changed { .. } | StoreError::AlreadyExists { .. }) => continue,
                Err(other) => return Err(other),
            }
        }
        Err(StoreError::Unavailable {
            op: "retire hint",
            key,
            attempts: PROBE_ROUNDS,
            message: "the hint kept changing".into(),
        })
    }

    /// Moves the hint forward to `n` (never backwards). Best effort: a lost race only means
    /// a later reader probes a little further.
    pub async fn advance_hint(&self, n: u64) -> Result<(), StoreError> {
        self.advance_hint_from(n, &HintState::Unknown)
            .await
            .map(drop)
    }

    /// [`Chain::advance_hint`] from what this caller knows of the hint: a hint it wrote is
    /// moved by compare-and-swap on that version, and one it knows absent (a chain it
    /// created) is created, either without reading first (a writer moving its own hint costs
    /// one request, not two). Returns what the caller knows after.
    ///
    /// A hint at generation 1 is never written: a reader without a hint probes from 1 anyway,
    /// and gc deletes nothing below 1. A run that never snapshots past its first generation
    /// has no hint at all (one request fewer per run).
    pub async fn advance_hint_from(
        &self,
        n: u64,
        known: &HintState,
    ) -> Result<HintState, StoreError> {
        if n <= 1 {
            return Ok(known.clone());
        }
        let key = layout::head(&self.base);
        let hint = Hint {
            format: FORMAT_VERSION,
            kind: HINT_KIND.into(),
            generation: n,
            retired: false,
        };
        let bytes = layout::encode_object(&hint);
        let first_try = match known {
            HintState::Written(etag) => Some(self.store.swap(&key, bytes.clone(), etag).await),
            HintState::Absent => Some(self.store.create(&key, bytes.clone()).await),
            HintState::Unknown => None,
        };
        match first_try {
            Some(Ok(etag)) => return Ok(HintState::Written(etag)),
            // Moved meanwhile (a retirement, another writer), or it exists after all: the path
            // below decides from what is there.
            Some(Err(StoreError::Changed { .. } | StoreError::AlreadyExists { .. })) | None => {}
            Some(Err(other)) => return Err(other),
        }
        match self.read_hint().await? {
            None => match self.store.create(&key, bytes).await {
                Ok(etag) => Ok(HintState::Written(etag)),
                Err(StoreError::AlreadyExists { .. }) => Ok(HintState::Unknown),
                Err(other) => Err(other),
            },
            // A retired chain keeps its mark: moving "forward" past retirement is not a thing.
            Some(current) if current.retired || current.generation >= n => Ok(HintState::Unknown),
            Some(HintView { etag, .. }) => match self.store.swap(&key, bytes, &etag).await {
                Ok(etag) => Ok(HintState::Written(etag)),
                Err(StoreError::Changed { .. }) => Ok(HintState::Unknown),
                Err(other) => Err(other),
            },
        }
    }

    /// Whether slot `n` exists: a HEAD, or with `keep` a GET whose object is kept there (a
    /// load needs the slots it probes anyway, so probing by GET saves reading them twice).
    async fn exists(&self, n: u64, keep: &mut Option<&mut Fetched>) -> Result<bool, StoreError> {
        match keep {
            None => Ok(self.store.head(&self.key(n)).await?.is_some()),
            Some(kept) => match self.store.read(&self.key(n)).await? {
                Some(object) => {
                    kept.insert(n, object);
                    Ok(true)
                }
                None => Ok(false),
            },
        }
    }

    /// Creates slot `n`, never filling it a second time. gc may delete a slot its writer
    /// filled once the chain went on past it (see `gc.rs`), so a create whose earlier attempt
    /// may have landed (`may_have_landed`: an earlier call's; or a lost response within this
    /// one) reads the slot first, and an empty slot is created again only while the hint
    /// shows nothing can have been collected there: gc deletes a slot only below a snapshot
    /// the hint already points at, or after marking the run retired.
    pub async fn create(
        &self,
        n: u64,
        bytes: bytes::Bytes,
        may_have_landed: bool,
    ) -> Result<SlotWrite, StoreError> {
        let still_free = || async {
            Ok(match self.read_hint().await? {
                Some(hint) => !hint.retired && hint.generation <= n,
                None => true,
            })
        };
        match self
            .store
            .create_slot(&self.key(n), bytes, may_have_landed, still_free)
            .await
        {
            Ok(_) => Ok(SlotWrite::Created),
            Err(StoreError::AlreadyExists { .. }) => Ok(SlotWrite::Taken),
            Err(StoreError::Unconfirmed { .. }) => Ok(SlotWrite::Passed),
            Err(other) => Err(other),
        }
    }

    /// The newest generation number, found without a LIST (see [`Chain::locate`]). A retired
    /// chain answers its final generation, which may no longer exist.
    pub async fn latest(&self) -> Result<Option<u64>, StoreError> {
        Ok(match self.locate().await? {
            Located::Empty => None,
            Located::At(n) | Located::Retired(n) => Some(n),
        })
    }

    /// Finds the newest generation without a LIST: from the hint (or 1), probe forward
    /// exponentially for a missing slot, then binary-search the boundary, which costs
    /// O(log distance) HEAD requests. Falls back to one bounded LIST only if the hinted
    /// generation is missing (a damaged hint).
    ///
    /// Then the hint is read again. If it moved past the probed result (or the run was
    /// retired meanwhile), the probe starts over from the new hint, at most `PROBE_ROUNDS`
    /// times. Why the answer is then linearizable, at the moment of the HEAD that found the
    /// slot after it missing: slots are created in order, and gc deletes a generation only
    /// below a snapshot the hint already points at (or after marking the hint retired), and
    /// the hint only moves forward. So if any slot this probe saw missing had been deleted
    /// rather than never written, the hint had moved past it before that HEAD, hence past the
    /// probed result before the second read — which then sends us round again. If the second
    /// read shows the hint at or below the result, every missing slot seen was truly not yet
    /// written, and the result was the newest generation when its successor was probed. A
    /// successor therefore never loads a stale prefix and never puts its fence into a slot gc
    /// freed below the old writer's head (which would leave the old writer unfenced).
    pub async fn locate(&self) -> Result<Located, StoreError> {
        self.locate_keeping(None).await
    }

    /// [`Chain::locate`], probing by GET and keeping in `keep` the slots found (those of the
    /// round that gave the answer), for a load that reads them next.
    pub(super) async fn locate_keeping(
        &self,
        mut keep: Option<&mut Fetched>,
    ) -> Result<Located, StoreError> {
        let mut hint = self.read_hint().await?;
        for _ in 0..PROBE_ROUNDS {
            let start = match &hint {
                Some(hint) if hint.retired => return Ok(Located::Retired(hint.generation)),
                Some(hint) => hint.generation,
                None => 1,
            };
            if let Some(kept) = keep.as_deref_mut() {
                kept.clear();
            }
            let found = match keep.as_deref_mut() {
                Some(kept) => self.probe_window(start, kept).await?,
                None if self.exists(start, &mut None).await? => Some(self.probe_from(start).await?),
                None => None,
            };
            let probed = match found {
                Some(newest) => Some(newest),
                None if start == 1 => None,
                None => {
                    tracing::warn!(base = %self.base, hint = start, "hinted generation missing; listing");
                    self.latest_by_listing().await?
                }
            };
            let again = self.read_hint().await?;
            let moved = match (&again, probed) {
                (Some(again), _) if again.retired => true,
                (Some(again), Some(probed)) => again.generation > probed,
                // Nothing found: only a hint written since (a new chain) is worth a second look.
                (Some(again), None) => hint.as_ref().is_none_or(|hint| hint.etag != again.etag),
                (None, _) => false,
            };
            if !moved {
                return Ok(probed.map_or(Located::Empty, Located::At));
            }
            hint = again;
        }
        Err(StoreError::Unavailable {
            op: "probe",
            key: layout::head(&self.base),
            attempts: PROBE_ROUNDS,
            message: "the hint kept moving past the newest generation found".into(),
        })
    }

    /// The newest generation from `start` on for a load, which reads every slot it probes
    /// anyway: the first [`PROBE_WINDOW`] slots are read at once (one round trip where probing
    /// them one by one takes up to four), and only a chain that fills the whole window is
    /// probed on exponentially from its last slot. The answer is the slot before the first
    /// one missing, and the slots up to it are kept for the load; `None` if `start` itself is
    /// missing. Read at once, the answer is still the newest generation at one moment within
    /// the reads: slots are created in order, so when the first missing slot was read either
    /// its predecessor already existed, or it was created later, during the reads, and was the
    /// newest then. A slot missing because gc deleted it moved the hint first, which the
    /// caller's second hint read sees, as for a probe one slot at a time.
    async fn probe_window(
        &self,
        start: u64,
        kept: &mut Fetched,
    ) -> Result<Option<u64>, StoreError> {
        let read = futures::future::try_join_all((start..start + PROBE_WINDOW).map(|n| {
            let key = self.key(n);
            async move { self.store.read(&key).await }
        }))
        .await?;
        let mut newest = None;
        for (n, object) in (start..).zip(read) {
            let Some(object) = object else { break };
            kept.insert(n, object);
            newest = Some(n);
        }
        match newest {
            Some(last) if last == start + PROBE_WINDOW - 1 => {
                Ok(Some(self.probe_keeping(last, &mut Some(kept)).await?))
            }
            other => Ok(other),
        }
    }

    /// The newest generation, given that `known` exists.
    pub async fn probe_from(&self, known: u64) -> Result<u64, StoreError> {
        self.probe_keeping(known, &mut None).await
    }

    async fn probe_keeping(
        &self,
        known: u64,
        keep: &mut Option<&mut Fetched>,
    ) -> Result<u64, StoreError> {
        let (mut low, mut step) = (known, 1u64);
        let high = loop {
            let candidate = low + step;
            if self.exists(candidate, keep).await? {
                low = candidate;
                step = step.saturating_mul(2);
            } else {
                break candidate;
            }
        };
        let mut high = high;
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            if self.exists(middle, keep).await? {
                low = middle;
            } else {
                high = middle;
            }
        }
        Ok(low)
    }

    async fn latest_by_listing(&self) -> Result<Option<u64>, StoreError> {
        let prefix = format!("{}/gen/", self.base);
        let listed = self.store.list_all(&prefix).await?;
        Ok(listed
            .iter()
            .filter_map(|entry| layout::generation_number(&entry.key))
            .max())
    }
}
