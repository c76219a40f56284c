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

    /// Reads the hint with its retirement mark.
    pub async fn read_hint(&self) -> Result<Option<HintView>, StoreError> {
        let key = layout::head(&self.base);
        Ok(self.store.read(&key).await?.and_then(|object| {
            serde_json::from_slice::<Hint>(&object.bytes)
                .ok()
                .map(|hint| HintView {
                    generation: hint.generation,
                    etag: object.etag,
                    retired: hint.retired,
                })
        }))
    }

    /// Marks the chain retired at `final_generation` (create or compare-and-swap, retried a
    /// bounded number of times). The caller has written the run's tombstone first; gc deletes
    /// generations only after this returns, so every reader that finds one missing and rereads
    /// the hint learns why.
    pub async fn retire_hint(&self, final_generation: u64) -> Result<(), StoreError> {
        let key = layout::head(&self.base);
        for _ in 0..PROBE_ROUNDS {
            let current = self.read_hint().await?;
            let hint = Hint {
                format: FORMAT_VERSION,
                kind: "chain.head".into(),
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
        let key = layout::head(&self.base);
        let hint = Hint {
            format: FORMAT_VERSION,
            kind: "chain.head".into(),
            generation: n,
            retired: false,
        };
        let bytes = layout::encode_object(&hint);
        if n == 1 {
            // A new chain has no hint yet: create it without reading first (if one exists
            // after all, the path below decides).
            match self.store.create(&key, bytes.clone()).await {
                Ok(_) => return Ok(()),
                Err(StoreError::AlreadyExists { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        match self.read_hint().await? {
            None => match self.store.create(&key, bytes).await {
                Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
                Err(other) => Err(other),
            },
            // A retired chain keeps its mark: moving "forward" past retirement is not a thing.
            Some(current) if current.retired || current.generation >= n => Ok(()),
            Some(HintView { etag, .. }) => match self.store.swap(&key, bytes, &etag).await {
                Ok(_) | Err(StoreError::Changed { .. }) => Ok(()),
                Err(other) => Err(other),
            },
        }
    }

    async fn exists(&self, n: u64) -> Result<bool, StoreError> {
        Ok(self.store.head(&self.key(n)).await?.is_some())
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
        let mut hint = self.read_hint().await?;
        for _ in 0..PROBE_ROUNDS {
            let start = match &hint {
                Some(hint) if hint.retired => return Ok(Located::Retired(hint.generation)),
                Some(hint) => hint.generation,
                None => 1,
            };
            let probed = if self.exists(start).await? {
                Some(self.probe_from(start).await?)
            } else if start == 1 {
                None
            } else {
                tracing::warn!(base = %self.base, hint = start, "hinted generation missing; listing");
                self.latest_by_listing().await?
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

    /// The newest generation, given that `known` exists.
    pub async fn probe_from(&self, known: u64) -> Result<u64, StoreError> {
        let (mut low, mut step) = (known, 1u64);
        let high = loop {
            let candidate = low + step;
            if self.exists(candidate).await? {
                low = candidate;
                step = step.saturating_mul(2);
            } else {
                break candidate;
            }
        };
        let mut high = high;
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            if self.exists(middle).await? {
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
