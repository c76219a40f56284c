//! Run generations: the immutable objects that commit a run's facts to the bucket.
//!
//! This module owns the generation object format, the chain of numbered generations
//! (`runs/<shard>/<run>/gen/<n>`), committing (exactly one create-if-absent PUT per commit),
//! fencing, the snapshot policy, finding the newest generation without a LIST, and loading a
//! run back with every continuity check. It never holds or judges leases: the epoch it writes
//! with is handed to it.
//!
//! Architecture invariant: a committed generation is never modified (brief, invariant 1).
//! Generations are created with create-if-absent and never overwritten; gc deletes only
//! superseded ones (or, once a run is retired behind its tombstone, all but the epochs'
//! first), and never the first generation of an epoch (see `gc.rs`). A retired run loads as
//! [`GenerationError::Retired`], never from what is left.
//!
//! Architecture invariant: a zombie writer cannot commit after its successor's first commit
//! (brief, invariant 2). Generation numbers are slots: a writer creates slot `n + 1` only after
//! it wrote or read slot `n`. A new lease holder's first act is a fence generation in the next
//! free slot carrying its higher epoch. The old writer's next create hits an occupied slot,
//! reads it, sees the higher epoch and stops with [`GenerationError::Fenced`]. Slots written by
//! the old writer before the fence are simply part of the chain: the fence comes after them.
//!
//! Architecture invariant: nothing acknowledged is lost (brief, invariant 8): `commit` returns
//! only after the generation holding the facts exists in the store, or after reading back the
//! occupied slot and finding our own writer nonce there (a lost response).

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::core::digest::sha256_hex;
use crate::core::fact::{self, Fact, RunId, Seq};
use crate::core::fold::{FoldError, RunState};
use crate::core::layout::{self, FORMAT_VERSION};
use crate::store::{ETag, Store, StoreError};

const KIND: &str = "run.generation";
/// How many generations are fetched at once when loading.
const LOAD_CONCURRENCY: usize = 8;
/// How often a takeover retries its fence when the old writer keeps slipping commits in.
const FENCE_ATTEMPTS: usize = 8;

/// One generation object.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Generation {
    pub format: u32,
    pub kind: String,
    pub run_id: RunId,
    pub generation: u64,
    /// A snapshot holds every fact from seq 1; a delta holds the facts since the previous
    /// generation.
    pub snapshot: bool,
    /// The snapshot generation this one builds on (itself, for a snapshot).
    pub base: u64,
    /// The lease epoch of the writer; never lower than the previous generation's.
    pub epoch: u64,
    /// A nonce unique to the writer, to recognise our own write after a lost response.
    pub writer: String,
    /// Seq range covered: `first_seq..=last_seq` (empty when `first_seq > last_seq`).
    pub first_seq: u64,
    pub last_seq: u64,
    /// First generation of each epoch so far (carried forward), so gc knows which slots a
    /// stale writer could still aim at.
    #[serde(default)]
    pub epoch_starts: Vec<(u64, u64)>,
    pub at_ms: u64,
    /// SHA-256 of the facts' encoded lines, checked on load. Empty when the facts are sealed:
    /// a plaintext digest would let anyone holding the bucket confirm guesses about the sealed
    /// facts, and the cipher's tag already authenticates them with their envelope.
    #[serde(default)]
    pub facts_sha256: String,
    /// Empty when the facts are sealed.
    #[serde(default)]
    pub facts: Vec<Fact>,
    /// The facts' JSONL, encrypted (see `seal.rs`), when client-side encryption is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<crate::store::seal::Sealed>,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("generation object '{key}' is corrupt: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("generation object '{key}' has format {found}, this build reads up to {supported}")]
    FutureFormat {
        key: String,
        found: u32,
        supported: u32,
    },
    #[error(
        "refusing generation object '{key}': it belongs to run \"{found}\", not \"{expected}\""
    )]
    ForeignRun {
        key: String,
        expected: RunId,
        found: RunId,
    },
    #[error("run \"{run}\" has no generations")]
    NotFound { run: RunId },
    #[error(
        "run \"{run}\" was retired {} at generation {final_generation}: its checkpoint was removed and its ID, epochs and recovery IDs are never reused",
        retired_outcome(.outcome)
    )]
    Retired {
        run: RunId,
        /// How the run ended; `None` when it was removed (`rekindle runs rm`) before it ended.
        outcome: Option<crate::core::fact::Outcome>,
        final_generation: u64,
    },
    #[error("run \"{run}\" already exists (generation 1 was written by another writer)")]
    AlreadyExists { run: RunId },
    #[error(
        "run \"{run}\": fenced at generation {generation}: it was written by epoch {by_epoch}, this writer holds epoch {epoch}; another holder owns the run now"
    )]
    Fenced {
        run: RunId,
        generation: u64,
        epoch: u64,
        by_epoch: u64,
    },
    #[error(
        "run \"{run}\": generation {generation} was committed by another writer at epoch {by_epoch} (ours {epoch}); reload and retry"
    )]
    Conflict {
        run: RunId,
        generation: u64,
        epoch: u64,
        by_epoch: u64,
    },
    #[error("generation object '{key}': {reason}")]
    Discontinuous { key: String, reason: String },
    /// The run's tombstone cannot be read (it names its key).
    #[error(transparent)]
    Tombstone(crate::store::tombstone::TombstoneError),
    #[error("generation object '{key}' is sealed: {error}")]
    Sealed {
        key: String,
        error: crate::store::seal::SealError,
    },
    // The inner errors are part of the message, not a `source`: as both, `{:#}` printed them
    // twice.
    #[error("generation object '{key}': {error}")]
    Fold { key: String, error: FoldError },
}

fn retired_outcome(outcome: &Option<crate::core::fact::Outcome>) -> String {
    match outcome {
        Some(outcome) => format!("after it ended ({outcome})"),
        None => "before it ended (rekindle runs rm)".into(),
    }
}

/// When a commit writes a snapshot instead of a delta.
#[derive(Clone, Copy, Debug)]
pub struct SnapshotPolicy {
    /// Always snapshot after this many deltas, bounding load cost to one snapshot plus this
    /// many deltas.
    pub max_deltas: u32,
    /// Snapshot earlier, once at least `min_deltas` deltas have accumulated twice the bytes of
    /// the last snapshot. Snapshot sizes then grow geometrically, so until `max_deltas` forces
    /// one, snapshots add at most about half the fact bytes again. Past that point a commit
    /// costs its new facts plus, amortized, 1/`max_deltas` of the run: the price of bounded
    /// loads.
    pub min_deltas: u32,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            max_deltas: 64,
            min_deltas: 8,
        }
    }
}

fn encode_facts(facts: &[Fact]) -> Result<(Vec<u8>, String), fact::DecodeError> {
    let mut lines = Vec::new();
    for fact in facts {
        lines.extend(fact::encode(fact)?);
        lines.push(b'\n');
    }
    let digest = sha256_hex(&lines);
    Ok((lines, digest))
}

fn facts_digest(facts: &[Fact]) -> Result<String, fact::DecodeError> {
    encode_facts(facts).map(|(_, digest)| digest)
}

/// The envelope fields a sealed payload is bound to, authenticated as the cipher's associated
/// data: whatever loading trusts about a generation besides its facts.
#[derive(Serialize)]
struct SealContext<'a> {
    format: u32,
    kind: &'a str,
    run_id: &'a RunId,
    generation: u64,
    epoch: u64,
    first_seq: u64,
    last_seq: u64,
    snapshot: bool,
    base: u64,
    algorithm: &'a str,
    key_id: &'a str,
}

/// The associated data for sealing `generation`'s facts with `algorithm` and key `key_id`.
fn seal_context(generation: &Generation, algorithm: &str, key_id: &str) -> Vec<u8> {
    let context = SealContext {
        format: generation.format,
        kind: &generation.kind,
        run_id: &generation.run_id,
        generation: generation.generation,
        epoch: generation.epoch,
        first_seq: generation.first_seq,
        last_seq: generation.last_seq,
        snapshot: generation.snapshot,
        base: generation.base,
        algorithm,
        key_id,
    };
    // Numbers, booleans and strings always serialize; field order is fixed by the struct.
    layout::encode_object(&context).to_vec()
}

/// Parses and checks one generation object read from `key` (a sealed one cannot be opened).
pub fn decode(key: &str, run: &RunId, bytes: &[u8]) -> Result<Generation, GenerationError> {
    decode_with(None, key, run, bytes)
}

/// [`decode`], opening a sealed generation with `sealer`.
pub fn decode_with(
    sealer: Option<&crate::store::seal::Sealer>,
    key: &str,
    run: &RunId,
    bytes: &[u8],
) -> Result<Generation, GenerationError> {
    let corrupt = |reason: String| GenerationError::Corrupt {
        key: key.to_owned(),
        reason,
    };
    let generation: Generation =
        layout::decode_object(key, KIND, bytes).map_err(|error| match error {
            layout::ObjectError::Corrupt { key, reason } => {
                GenerationError::Corrupt { key, reason }
            }
            layout::ObjectError::FutureFormat {
                key,
                found,
                supported,
            } => GenerationError::FutureFormat {
                key,
                found,
                supported,
            },
        })?;
    let mut generation = generation;
    // Payloads sealed with their envelope as associated data carry no plaintext digest: the
    // tag checks facts and envelope together. Legacy sealed payloads (no `aad` marker, written
    // before envelopes were bound) open without it and are checked against their digest.
    let mut check_digest = true;
    if let Some(sealed) = generation.sealed.take() {
        check_digest = !sealed.aad;
        let context = seal_context(&generation, &sealed.algorithm, &sealed.key_id);
        let plaintext = sealer
            .ok_or_else(|| crate::store::seal::SealError::UnknownKey {
                key_id: sealed.key_id.clone(),
            })
            .and_then(|sealer| sealer.open(&sealed, &context))
            .map_err(|error| GenerationError::Sealed {
                key: key.to_owned(),
                error,
            })?;
        generation.facts = plaintext
            .split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(fact::decode)
            .collect::<Result<_, _>>()
            .map_err(|e| corrupt(format!("sealed facts: {e}")))?;
    }
    if generation.run_id != *run {
        return Err(GenerationError::ForeignRun {
            key: key.to_owned(),
            expected: run.clone(),
            found: generation.run_id,
        });
    }
    if layout::generation_number(key) != Some(generation.generation) {
        return Err(corrupt(format!(
            "it says it is generation {}",
            generation.generation
        )));
    }
    if check_digest {
        let digest = facts_digest(&generation.facts).map_err(|e| corrupt(e.to_string()))?;
        if digest != generation.facts_sha256 {
            return Err(corrupt("facts do not match their SHA-256".into()));
        }
    }
    let expected_len = (generation.last_seq + 1).saturating_sub(generation.first_seq);
    let in_order = generation
        .facts
        .iter()
        .enumerate()
        .all(|(i, f)| f.seq == Seq(generation.first_seq + i as u64));
    if generation.facts.len() as u64 != expected_len || !in_order {
        return Err(corrupt(format!(
            "facts do not cover the declared seq range {}..={}",
            generation.first_seq, generation.last_seq
        )));
    }
    Ok(generation)
}

/// The chain of immutable numbered objects under one base key, with a hint object that
/// points at the newest snapshot. Shared by run generations and checkpoints.
#[derive(Clone, Debug)]
pub struct Chain {
    store: Store,
    base: String,
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
    pub generation: u64,
    pub etag: ETag,
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
/// How often `load` starts over when generations vanished under it after a newer snapshot.
const LOAD_ATTEMPTS: usize = 4;

impl Chain {
    pub fn new(store: &Store, base: String) -> Self {
        Chain {
            store: store.clone(),
            base,
        }
    }

    pub fn key(&self, n: u64) -> String {
        layout::generation(&self.base, n)
    }

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

/// A run loaded from the bucket.
#[derive(Debug)]
pub struct Loaded {
    pub state: RunState,
    /// The newest generation read.
    pub generation: u64,
    /// The epoch of the newest generation.
    pub epoch: u64,
    /// SHA-256 of the newest generation object's bytes, for pinning a recovery to it.
    pub digest: String,
    /// The snapshot the chain was read from.
    pub base: u64,
    pub epoch_starts: Vec<(u64, u64)>,
    /// Bytes of the snapshot read, and the deltas read after it.
    pub snapshot_bytes: u64,
    pub delta_count: u32,
    pub delta_bytes: u64,
}

/// Loads a run: the newest generation (or `up_to`), its snapshot and the deltas after it,
/// checking format, ownership, continuity, epochs and digests, and folding every fact.
///
/// A retired run (see `tombstone.rs`) is refused with [`GenerationError::Retired`], never
/// folded from the epochs' first slots gc left behind. The tombstone costs no request on the
/// hot path: the hint, read anyway, carries the retirement mark, and the tombstone itself is
/// read only when that mark is set, when no generation exists, or when a generation is
/// missing or the chain looks broken.
///
/// A generation that vanishes mid-read is what a gc does after a newer snapshot appeared
/// (it deletes only below the hinted snapshot): when the hint has moved past the generation
/// being loaded, the load starts over from the new hint, at most `LOAD_ATTEMPTS` times.
/// With `up_to` the caller asked for that generation, so there is nothing newer to go to.
pub async fn load(
    store: &Store,
    run: &RunId,
    up_to: Option<u64>,
) -> Result<Loaded, GenerationError> {
    let chain = Chain::new(store, layout::run_base(run.as_str()));
    let mut attempt = 0;
    loop {
        attempt += 1;
        let newest = match up_to {
            Some(n) => n,
            None => match chain.locate().await? {
                Located::At(n) => n,
                Located::Retired(_) => {
                    return Err(retired(store, run, &layout::head(&chain.base)).await);
                }
                Located::Empty => {
                    // Cheap here: only a run that does not exist pays the extra read.
                    return Err(match read_tombstone(store, run).await? {
                        Some(error) => error,
                        None => GenerationError::NotFound { run: run.clone() },
                    });
                }
            },
        };
        let error = match load_chain(&chain, run, newest).await {
            Ok(loaded) => return Ok(loaded),
            Err(error @ GenerationError::Discontinuous { .. }) => error,
            Err(other) => return Err(other),
        };
        if let Some(retired) = read_tombstone(store, run).await? {
            return Err(retired);
        }
        let moved_on = match chain.read_hint().await? {
            Some(hint) => hint.retired || hint.generation > newest,
            None => false,
        };
        if up_to.is_some() || !moved_on || attempt >= LOAD_ATTEMPTS {
            return Err(error);
        }
        tracing::info!(run_id = %run, generation = newest, "generations collected while loading; reloading from the new snapshot");
    }
}

/// The run's tombstone as a [`GenerationError::Retired`], if it has one.
async fn read_tombstone(
    store: &Store,
    run: &RunId,
) -> Result<Option<GenerationError>, GenerationError> {
    match crate::store::tombstone::read(store, run).await {
        Ok(tombstone) => Ok(tombstone.map(|tombstone| GenerationError::Retired {
            run: run.clone(),
            outcome: tombstone.outcome,
            final_generation: tombstone.final_generation,
        })),
        Err(crate::store::tombstone::TombstoneError::Store(error)) => Err(error.into()),
        Err(other) => Err(GenerationError::Tombstone(other)),
    }
}

/// The error for a chain whose hint says it was retired.
async fn retired(store: &Store, run: &RunId, head_key: &str) -> GenerationError {
    match read_tombstone(store, run).await {
        Ok(Some(retired)) => retired,
        Ok(None) => GenerationError::Corrupt {
            key: head_key.to_owned(),
            reason: format!(
                "it marks run \"{run}\" retired, but the run has no tombstone ('{}')",
                layout::tombstone(run.as_str())
            ),
        },
        Err(error) => error,
    }
}

/// Reads and checks the chain ending at generation `newest`.
async fn load_chain(chain: &Chain, run: &RunId, newest: u64) -> Result<Loaded, GenerationError> {
    let store = chain.store();
    let read = |n: u64| {
        let chain = chain.clone();
        async move {
            let key = chain.key(n);
            match chain.store().read(&key).await? {
                Some(object) => Ok((key, object)),
                None => Err(GenerationError::Discontinuous {
                    key,
                    reason: format!("generation {n} is missing"),
                }),
            }
        }
    };
    let (newest_key, newest_object) = read(newest).await?;
    let newest_generation = decode_with(store.sealer(), &newest_key, run, &newest_object.bytes)?;
    let digest = sha256_hex(&newest_object.bytes);
    let base = newest_generation.base;
    if base > newest {
        return Err(GenerationError::Corrupt {
            key: newest_key,
            reason: format!("it builds on snapshot {base}, which is newer than itself"),
        });
    }
    let mut objects: Vec<(String, Bytes)> = futures::stream::iter(base..newest)
        .map(read)
        .buffered(LOAD_CONCURRENCY)
        .map(|result| result.map(|(key, object)| (key, object.bytes)))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    objects.push((newest_key, newest_object.bytes));

    let mut state = RunState::default();
    let mut previous: Option<Generation> = None;
    let (mut snapshot_bytes, mut delta_count, mut delta_bytes) = (0, 0, 0);
    for (key, bytes) in &objects {
        let generation = decode_with(store.sealer(), key, run, bytes)?;
        let discontinuous = |reason: String| GenerationError::Discontinuous {
            key: key.clone(),
            reason,
        };
        match &previous {
            None => {
                if !generation.snapshot || generation.first_seq != 1 {
                    return Err(discontinuous(format!(
                        "the chain starts here but it is not a snapshot from seq 1 (newest generation {newest} builds on it)"
                    )));
                }
                snapshot_bytes = bytes.len() as u64;
            }
            Some(previous) => {
                if generation.snapshot || generation.base != base {
                    return Err(discontinuous(format!(
                        "expected a delta on snapshot {base}, found {} on {}",
                        if generation.snapshot {
                            "a snapshot"
                        } else {
                            "a delta"
                        },
                        generation.base
                    )));
                }
                if generation.epoch < previous.epoch {
                    return Err(discontinuous(format!(
                        "epoch {} is lower than epoch {} of generation {}",
                        generation.epoch, previous.epoch, previous.generation
                    )));
                }
                if generation.first_seq > previous.last_seq + 1 {
                    return Err(discontinuous(format!(
                        "facts {}..{} are missing (generation {} ends at seq {})",
                        previous.last_seq + 1,
                        generation.first_seq - 1,
                        previous.generation,
                        previous.last_seq
                    )));
                }
                delta_count += 1;
                delta_bytes += bytes.len() as u64;
            }
        }
        // Overlapping facts must be identical: the fold treats them as no-ops or refuses.
        for fact in generation.facts.iter().cloned() {
            state.apply(fact).map_err(|error| GenerationError::Fold {
                key: key.clone(),
                error,
            })?;
        }
        previous = Some(generation);
    }
    let newest_generation = previous.unwrap_or(newest_generation);
    Ok(Loaded {
        state,
        generation: newest,
        epoch: newest_generation.epoch,
        digest,
        base,
        epoch_starts: newest_generation.epoch_starts,
        snapshot_bytes,
        delta_count: if base == newest { 0 } else { delta_count },
        delta_bytes,
    })
}

/// Commits a run's facts as generations, holding one lease epoch.
#[derive(Debug)]
pub struct RunWriter {
    chain: Chain,
    run: RunId,
    epoch: u64,
    nonce: String,
    state: RunState,
    /// The newest generation in the chain as this writer knows it.
    generation: u64,
    /// Seq of the last fact committed.
    committed: Seq,
    base: u64,
    epoch_starts: Vec<(u64, u64)>,
    snapshot_bytes: u64,
    delta_count: u32,
    delta_bytes: u64,
    policy: SnapshotPolicy,
}

impl RunWriter {
    /// Starts a new run: generation 1, a snapshot of `facts` (its meta and first facts).
    pub async fn create(
        store: &Store,
        facts: Vec<Fact>,
        epoch: u64,
        policy: SnapshotPolicy,
    ) -> Result<RunWriter, GenerationError> {
        let run = match facts.first().map(|f| &f.body) {
            Some(crate::core::fact::FactBody::Meta(meta)) => meta.run_id.clone(),
            _ => {
                return Err(GenerationError::Corrupt {
                    key: "(new run)".into(),
                    reason: "a new run needs its meta fact first".into(),
                });
            }
        };
        Self::create_as(store, run, facts, epoch, policy).await
    }

    /// Starts run `run` from `facts`. A recovery run starts this way from its source's
    /// facts: its own ID, the source's history (whose meta names the source).
    pub async fn create_as(
        store: &Store,
        run: RunId,
        facts: Vec<Fact>,
        epoch: u64,
        policy: SnapshotPolicy,
    ) -> Result<RunWriter, GenerationError> {
        let state = crate::core::fold::fold(facts).map_err(|error| GenerationError::Fold {
            key: "(new run)".into(),
            error,
        })?;
        let mut writer = RunWriter {
            chain: Chain::new(store, layout::run_base(run.as_str())),
            run,
            epoch,
            nonce: store.clock().nonce(),
            state: RunState::default(),
            generation: 0,
            committed: Seq(0),
            base: 0,
            epoch_starts: Vec::new(),
            snapshot_bytes: 0,
            delta_count: 0,
            delta_bytes: 0,
            policy,
        };
        let facts = state.into_facts();
        match writer.commit_facts(facts, true).await {
            Err(GenerationError::Fenced { .. } | GenerationError::Conflict { .. }) => {
                // Generation 1 of a retired run stays forever (an epoch's first slot), so a
                // retired ID lands here; say so rather than "exists".
                Err(read_tombstone(store, &writer.run)
                    .await?
                    .unwrap_or_else(|| GenerationError::AlreadyExists {
                        run: writer.run.clone(),
                    }))
            }
            Err(other) => Err(other),
            Ok(()) => Ok(writer),
        }
    }

    /// Takes over a run at a (new, higher) lease epoch: loads it, then writes the fence
    /// generation that stops every older writer. Retries if an older writer slips a commit
    /// into the slot first (its facts are then part of the run; the fence follows them).
    pub async fn resume(
        store: &Store,
        run: &RunId,
        epoch: u64,
        policy: SnapshotPolicy,
    ) -> Result<RunWriter, GenerationError> {
        let mut last_error = None;
        for _ in 0..FENCE_ATTEMPTS {
            let loaded = load(store, run, None).await?;
            if loaded.epoch > epoch {
                return Err(GenerationError::Fenced {
                    run: run.clone(),
                    generation: loaded.generation,
                    epoch,
                    by_epoch: loaded.epoch,
                });
            }
            let mut writer = RunWriter {
                chain: Chain::new(store, layout::run_base(run.as_str())),
                run: run.clone(),
                epoch,
                nonce: store.clock().nonce(),
                committed: loaded.state.last_seq(),
                state: loaded.state,
                generation: loaded.generation,
                base: loaded.base,
                epoch_starts: loaded.epoch_starts,
                snapshot_bytes: loaded.snapshot_bytes,
                delta_count: loaded.delta_count,
                delta_bytes: loaded.delta_bytes,
                policy,
            };
            if loaded.epoch == epoch {
                // Our own epoch already fenced this run (a restart of the same holding).
                return Ok(writer);
            }
            match writer.commit_facts(Vec::new(), false).await {
                Ok(()) => {
                    // The fence went into the slot after the newest generation loaded. If the
                    // old writer moved on to a newer snapshot meanwhile and gc freed that slot
                    // (the hint then points past it), the fence sits below the old writer's
                    // head and stops nobody: fence again from the new hint. One GET per
                    // takeover; the grace period makes the retry rare.
                    match writer.chain.read_hint().await? {
                        Some(hint) if hint.retired || hint.generation > writer.generation => {
                            tracing::warn!(run_id = %run, epoch, generation = writer.generation, hint = hint.generation, "fence landed in a collected slot; fencing again");
                            last_error = Some(GenerationError::Conflict {
                                run: run.clone(),
                                generation: writer.generation,
                                epoch,
                                by_epoch: loaded.epoch,
                            });
                        }
                        _ => return Ok(writer),
                    }
                }
                Err(error @ GenerationError::Conflict { .. }) => last_error = Some(error),
                Err(other) => return Err(other),
            }
        }
        Err(last_error.unwrap_or(GenerationError::NotFound { run: run.clone() }))
    }

    pub fn state(&self) -> &RunState {
        &self.state
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn run_id(&self) -> &RunId {
        &self.run
    }

    /// The newest generation this writer committed or saw.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The snapshot generation the newest generation builds on (equal to it for a snapshot).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Seq of the last committed fact.
    pub fn committed(&self) -> Seq {
        self.committed
    }

    /// Commits every fact of `state` not yet committed, in one PUT. `facts` must continue the
    /// run (they are folded first; a fact that breaks the run's rules is refused unwritten).
    pub async fn commit(&mut self, facts: Vec<Fact>) -> Result<(), GenerationError> {
        if facts.is_empty() {
            return Ok(());
        }
        self.commit_facts(facts, false).await
    }

    async fn commit_facts(&mut self, facts: Vec<Fact>, first: bool) -> Result<(), GenerationError> {
        // The new facts are folded into the live state directly (no copy of the whole run per
        // commit); if anything fails before the generation lands, the state is rolled back to
        // the committed prefix.
        let mut new_facts = Vec::with_capacity(facts.len());
        for fact in facts {
            // Already committed facts must be identical (the fold checks) and are skipped.
            let is_new = fact.seq > self.committed;
            let applied = if is_new {
                self.state
                    .apply(fact.clone())
                    .map(|applied| (applied, Some(fact)))
            } else {
                self.state.apply(fact).map(|applied| (applied, None))
            };
            match applied {
                // A fact repeated within one commit is folded once and written once.
                Ok((crate::core::fold::Applied::Appended, Some(fact))) => new_facts.push(fact),
                Ok(_) => {}
                Err(error) => {
                    self.roll_back()?;
                    return Err(GenerationError::Fold {
                        key: "(commit)".into(),
                        error,
                    });
                }
            }
        }
        let written = self.write(new_facts, first).await;
        if written.is_err() {
            self.roll_back()?;
        }
        written
    }

    /// Returns the state to the committed facts after a commit that did not land.
    fn roll_back(&mut self) -> Result<(), GenerationError> {
        let mut facts = std::mem::take(&mut self.state).into_facts();
        facts.truncate(self.committed.0 as usize);
        // A prefix of facts that folded before folds again.
        self.state = crate::core::fold::fold(facts).map_err(|error| GenerationError::Fold {
            key: "(rollback)".into(),
            error,
        })?;
        Ok(())
    }

    /// Writes the generation holding `new_facts` (already folded into the state) in the next
    /// slot: a delta, or a snapshot of the whole run when the policy says so. If the slot turns
    /// out to hold a generation this writer wrote earlier (a lost acknowledgement), it is
    /// adopted and the facts it lacks go into the slot after it.
    async fn write(&mut self, new_facts: Vec<Fact>, first: bool) -> Result<(), GenerationError> {
        let (mut new_facts, mut first) = (new_facts, first);
        // Each turn either lands or adopts a slot and moves past it; only slots this writer
        // wrote are adopted, so the loop ends.
        loop {
            match self.write_slot(new_facts, first).await? {
                None => return Ok(()),
                Some(remaining) if remaining.is_empty() => return Ok(()),
                Some(remaining) => (new_facts, first) = (remaining, false),
            }
        }
    }

    /// One slot of [`write`](Self::write): `None` when the generation landed, or the facts
    /// still to write after adopting our own earlier generation found in the slot.
    async fn write_slot(
        &mut self,
        new_facts: Vec<Fact>,
        first: bool,
    ) -> Result<Option<Vec<Fact>>, GenerationError> {
        let n = self.generation + 1;
        let encode = |facts: &[Fact]| {
            encode_facts(facts).map_err(|e| GenerationError::Corrupt {
                key: self.chain.key(n),
                reason: e.to_string(),
            })
        };
        // Each payload is encoded once: the lines give its size, its digest and, when
        // sealing, the plaintext.
        let (new_lines, new_digest) = encode(&new_facts)?;
        let snapshot = first
            || self.delta_count + 1 >= self.policy.max_deltas
            || (self.delta_count + 1 >= self.policy.min_deltas
                && self.delta_bytes + new_lines.len() as u64 >= 2 * self.snapshot_bytes);
        let mut epoch_starts = self.epoch_starts.clone();
        if epoch_starts
            .last()
            .is_none_or(|&(epoch, _)| epoch < self.epoch)
        {
            epoch_starts.push((self.epoch, n));
        }
        let (facts, lines, digest) = if snapshot {
            let all = self.state.facts().to_vec();
            let (lines, digest) = encode(&all)?;
            (all, lines, digest)
        } else {
            (new_facts, new_lines, new_digest)
        };
        let mut generation = Generation {
            format: FORMAT_VERSION,
            kind: KIND.into(),
            run_id: self.run.clone(),
            generation: n,
            snapshot,
            base: if snapshot { n } else { self.base },
            epoch: self.epoch,
            writer: self.nonce.clone(),
            first_seq: if snapshot { 1 } else { self.committed.0 + 1 },
            last_seq: self.state.last_seq().0,
            epoch_starts: epoch_starts.clone(),
            at_ms: self.chain.store().clock().wall_ms(),
            facts_sha256: digest,
            facts,
            sealed: None,
        };
        if let Some(sealer) = self.chain.store().sealer() {
            // Sealed with the envelope as associated data, so the payload cannot be moved
            // under another run, slot, epoch or seq range; no plaintext digest is kept.
            let context = seal_context(&generation, crate::store::seal::ALGORITHM, sealer.key_id());
            generation.sealed = Some(sealer.seal(&lines, &context));
            generation.facts = Vec::new();
            generation.facts_sha256 = String::new();
        }
        let bytes =
            Bytes::from(
                serde_json::to_vec(&generation).map_err(|e| GenerationError::Corrupt {
                    key: self.chain.key(n),
                    reason: e.to_string(),
                })?,
            );
        let size = bytes.len() as u64;
        let key = self.chain.key(n);
        match self.chain.store().create(&key, bytes).await {
            Ok(_) => {}
            Err(StoreError::AlreadyExists { .. }) => {
                let (ours, size) = self.occupied(n, &key).await?;
                return self.adopt(n, &key, ours, size).await.map(Some);
            }
            Err(other) => return Err(other.into()),
        }
        self.landed(n, snapshot, size, epoch_starts).await;
        Ok(None)
    }

    /// Bookkeeping after generation `n` (of `size` bytes) is known to be in the chain, written
    /// by this writer or adopted after a lost response: the committed prefix, the epoch
    /// starts, the snapshot counters, and the head hint for a snapshot (best effort).
    async fn landed(&mut self, n: u64, snapshot: bool, size: u64, epoch_starts: Vec<(u64, u64)>) {
        self.generation = n;
        self.committed = self.state.last_seq();
        self.epoch_starts = epoch_starts;
        if snapshot {
            self.base = n;
            self.snapshot_bytes = size;
            self.delta_count = 0;
            self.delta_bytes = 0;
            if let Err(error) = self.chain.advance_hint(n).await {
                tracing::warn!(run_id = %self.run, generation = n, %error, "could not advance the head hint");
            }
        } else {
            self.delta_count += 1;
            self.delta_bytes += size;
        }
    }

    /// Slot `n` is taken. Returns the generation in it (and its size in bytes) if this writer
    /// wrote it; otherwise tells a fencing successor from a conflict.
    async fn occupied(&self, n: u64, key: &str) -> Result<(Generation, u64), GenerationError> {
        let (other, size) = match self.chain.store().read(key).await? {
            Some(object) => (
                decode_with(self.chain.store().sealer(), key, &self.run, &object.bytes)?,
                object.bytes.len() as u64,
            ),
            None => {
                return Err(GenerationError::Discontinuous {
                    key: key.to_owned(),
                    reason: "the slot was reported taken but is empty".into(),
                });
            }
        };
        // Our nonce: an earlier commit of ours landed although we were told it failed (its
        // response was lost and the store's own read-back could not run, e.g. retries ran
        // out). The bytes differ from this attempt's (a later `at_ms`), so only the nonce
        // tells it is ours, not another writer's conflict.
        if other.writer == self.nonce {
            return Ok((other, size));
        }
        Err(if other.epoch > self.epoch {
            tracing::info!(run_id = %self.run, epoch = self.epoch, by_epoch = other.epoch, generation = n, "fenced");
            GenerationError::Fenced {
                run: self.run.clone(),
                generation: n,
                epoch: self.epoch,
                by_epoch: other.epoch,
            }
        } else {
            GenerationError::Conflict {
                run: self.run.clone(),
                generation: n,
                epoch: self.epoch,
                by_epoch: other.epoch,
            }
        })
    }

    /// Takes our own generation `ours`, found in slot `n`, as committed: the state becomes the
    /// committed prefix plus its facts, the bookkeeping follows it, and the facts of the
    /// current commit it does not hold are returned to be written after it.
    async fn adopt(
        &mut self,
        n: u64,
        key: &str,
        ours: Generation,
        size: u64,
    ) -> Result<Vec<Fact>, GenerationError> {
        let discontinuous = |reason: String| GenerationError::Discontinuous {
            key: key.to_owned(),
            reason,
        };
        if ours.first_seq > self.committed.0 + 1 || (!ours.snapshot && ours.base != self.base) {
            return Err(discontinuous(format!(
                "our own generation covers seqs {}..={} on snapshot {}, but this writer committed up to seq {} on snapshot {}",
                ours.first_seq, ours.last_seq, ours.base, self.committed.0, self.base
            )));
        }
        tracing::info!(run_id = %self.run, epoch = self.epoch, generation = n, "adopted our own generation after a lost acknowledgement");
        // The facts of this commit, already folded: set aside, then folded again after the
        // adopted generation's (which may hold fewer, more, or the same).
        let pending = self
            .state
            .facts()
            .get(self.committed.0 as usize..)
            .unwrap_or_default()
            .to_vec();
        self.roll_back()?;
        for fact in ours.facts {
            // Facts up to `committed` (all of them, in a snapshot) must be identical.
            self.state
                .apply(fact)
                .map_err(|error| GenerationError::Fold {
                    key: key.to_owned(),
                    error,
                })?;
        }
        self.landed(n, ours.snapshot, size, ours.epoch_starts).await;
        let mut remaining = Vec::new();
        for fact in pending {
            match self.state.apply(fact.clone()) {
                Ok(crate::core::fold::Applied::Appended) => remaining.push(fact),
                Ok(crate::core::fold::Applied::Duplicate) => {}
                Err(error) => {
                    return Err(GenerationError::Fold {
                        key: "(commit)".into(),
                        error,
                    });
                }
            }
        }
        Ok(remaining)
    }
}
