//! Loading a run: the newest generation, its snapshot and the deltas after it, with the
//! chain checks, retirement and reload when gc moved the chain on.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::chain::{Chain, Located};
use super::format::{GenerationError, check_link, decode_with};
use crate::core::digest::sha256_hex;
use crate::core::epoch::Epoch;
use crate::core::fact::RunId;
use crate::core::fold::RunState;
use crate::core::layout;
use crate::store::Store;

/// How many generations are fetched at once when loading.
const LOAD_CONCURRENCY: usize = 8;
/// How often `load` starts over when generations vanished under it after a newer snapshot.
const LOAD_ATTEMPTS: usize = 4;

/// A run loaded from the bucket.
#[derive(Debug)]
pub struct Loaded {
    /// The run's state, folded from every fact up to the newest generation read.
    pub state: RunState,
    /// The newest generation read.
    pub generation: u64,
    /// The epoch of the newest generation.
    pub epoch: Epoch,
    /// Who wrote the newest generation (`<holder>/<nonce>` for a process writing as a
    /// holder, see `Store::writing_as`): a writer resuming at that generation's epoch checks
    /// that the holding is its own.
    pub writer: String,
    /// SHA-256 of the newest generation object's bytes, for pinning a recovery to it.
    pub digest: String,
    /// The snapshot the chain was read from.
    pub base: u64,
    /// First generation of each epoch so far, as the newest generation carries them.
    pub epoch_starts: Vec<(Epoch, u64)>,
    /// Bytes of the snapshot generation read.
    pub snapshot_bytes: u64,
    /// Deltas read after the snapshot.
    pub delta_count: u32,
    /// Bytes of the deltas read after the snapshot.
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
    load_with(store, run, up_to, None).await
}

/// [`load`] of generation `up_to` whose snapshot is known to be `base` (a recovery's pin
/// carries it): every generation from the snapshot on is read at once (one round trip, not
/// two). A wrong `base` costs only the reads it wasted; the chain checks are the same.
pub async fn load_pinned(
    store: &Store,
    run: &RunId,
    up_to: u64,
    base: Option<u64>,
) -> Result<Loaded, GenerationError> {
    // A base further back than any snapshot policy lets deltas run is not trusted to size a
    // prefetch (a damaged or foreign record): the load then finds the snapshot itself.
    let base = base.filter(|&base| base <= up_to && up_to - base <= MAX_PINNED_PREFETCH);
    load_with(store, run, Some(up_to), base).await
}

/// The most generations a pinned load reads ahead on its record's word.
const MAX_PINNED_PREFETCH: u64 = 256;

async fn load_with(
    store: &Store,
    run: &RunId,
    up_to: Option<u64>,
    base: Option<u64>,
) -> Result<Loaded, GenerationError> {
    let chain = Chain::new(store, layout::run_base(run.as_str()));
    let mut attempt = 0;
    loop {
        attempt += 1;
        // The slots the probe read, which the load then does not read again.
        let mut fetched = super::chain::Fetched::new();
        if let (Some(up_to), Some(base)) = (up_to, base) {
            let chain = &chain;
            let read: Vec<_> = futures::stream::iter(base..=up_to)
                .map(|n| async move {
                    Ok::<_, GenerationError>((n, chain.store().read(&chain.key(n)).await?))
                })
                .buffered(LOAD_CONCURRENCY)
                .try_collect()
                .await?;
            // A missing one is left to `load_chain`, which names it.
            fetched.extend(
                read.into_iter()
                    .filter_map(|(n, object)| Some((n, object?))),
            );
        }
        let newest = match up_to {
            Some(n) => n,
            None => match chain.locate_keeping(Some(&mut fetched)).await? {
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
        let error = match load_chain(&chain, run, newest, fetched).await {
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
pub(super) async fn read_tombstone(
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
pub(super) async fn retired(store: &Store, run: &RunId, head_key: &str) -> GenerationError {
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
async fn load_chain(
    chain: &Chain,
    run: &RunId,
    newest: u64,
    mut fetched: super::chain::Fetched,
) -> Result<Loaded, GenerationError> {
    let store = chain.store();
    let mut read = |n: u64| {
        let chain = chain.clone();
        let prefetched = fetched.remove(&n);
        async move {
            let key = chain.key(n);
            if let Some(object) = prefetched {
                return Ok((key, object));
            }
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
    // Decoded once: opening a sealed payload and checking its digest is the load's CPU cost.
    let newest_generation = decode_with(store.sealer(), &newest_key, run, &newest_object.bytes)?;
    let digest = sha256_hex(&newest_object.bytes);
    let base = newest_generation.base;
    if base > newest {
        return Err(GenerationError::Corrupt {
            key: newest_key,
            reason: format!("it builds on snapshot {base}, which is newer than itself"),
        });
    }
    let older: Vec<(String, Bytes)> = futures::stream::iter(base..newest)
        .map(read)
        .buffered(LOAD_CONCURRENCY)
        .map(|result| result.map(|(key, object)| (key, object.bytes)))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let mut chain = Vec::with_capacity(older.len() + 1);
    for (key, bytes) in older {
        let generation = decode_with(store.sealer(), &key, run, &bytes)?;
        chain.push((key, bytes.len() as u64, generation));
    }
    chain.push((
        newest_key,
        newest_object.bytes.len() as u64,
        newest_generation,
    ));

    let mut state = RunState::default();
    let (mut snapshot_bytes, mut delta_count, mut delta_bytes) = (0, 0, 0);
    for (i, (key, size, generation)) in chain.iter().enumerate() {
        let previous = i.checked_sub(1).map(|p| &chain[p].2);
        check_link(previous, generation, base, newest).map_err(|reason| {
            GenerationError::Discontinuous {
                key: key.clone(),
                reason,
            }
        })?;
        if previous.is_none() {
            snapshot_bytes = *size;
        } else {
            delta_count += 1;
            delta_bytes += *size;
        }
        // Overlapping facts must be identical: the fold treats them as no-ops or refuses.
        for fact in generation.facts.iter().cloned() {
            state.apply(fact).map_err(|error| GenerationError::Fold {
                key: key.clone(),
                error,
            })?;
        }
    }
    let Some((_, _, newest_generation)) = chain.pop() else {
        unreachable!("the chain holds at least the newest generation");
    };
    Ok(Loaded {
        state,
        generation: newest,
        epoch: newest_generation.epoch,
        writer: newest_generation.writer,
        digest,
        base,
        epoch_starts: newest_generation.epoch_starts,
        snapshot_bytes,
        delta_count: if base == newest { 0 } else { delta_count },
        delta_bytes,
    })
}
