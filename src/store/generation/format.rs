//! The generation object: its format, the error every generation operation reports, the
//! snapshot policy, encoding and sealing context, and decoding with every per-object check.
//! No I/O.

use serde::{Deserialize, Serialize};

use crate::core::digest::sha256_hex;
use crate::core::epoch::Epoch;
use crate::core::fact::{self, Fact, RunId, Seq};
use crate::core::fold::FoldError;
use crate::core::layout;
use crate::store::StoreError;

pub(super) const KIND: &str = "run.generation";

/// One generation object.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Generation {
    /// Layout format the generation was written with; newer ones are refused on load.
    pub format: u32,
    /// Object kind tag, always `run.generation`.
    pub kind: String,
    /// The run this generation belongs to; loading refuses a generation of another run.
    pub run_id: RunId,
    /// This generation's slot number in the run's chain, starting at 1.
    pub generation: u64,
    /// A snapshot holds every fact from seq 1; a delta holds the facts since the previous
    /// generation.
    pub snapshot: bool,
    /// The snapshot generation this one builds on (itself, for a snapshot).
    pub base: u64,
    /// The lease epoch of the writer; never lower than the previous generation's.
    pub epoch: Epoch,
    /// A nonce unique to the writer, to recognise our own write after a lost response;
    /// prefixed by the writing process's holder ID and `/` when it is known (a run's timeline
    /// reads it, [`Generation::writer_holder`]).
    pub writer: String,
    /// Seq range covered: `first_seq..=last_seq` (empty when `first_seq > last_seq`).
    pub first_seq: u64,
    /// Last seq covered (inclusive).
    pub last_seq: u64,
    /// First generation of each epoch so far (carried forward), so gc knows which slots a
    /// stale writer could still aim at.
    #[serde(default)]
    pub epoch_starts: Vec<(Epoch, u64)>,
    /// Wall-clock time of the commit, in milliseconds since the Unix epoch.
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

impl Generation {
    /// The holder ID of the process that wrote this generation, when its writer named it.
    pub fn writer_holder(&self) -> Option<&str> {
        self.writer.rsplit_once('/').map(|(holder, _)| holder)
    }
}

/// Why committing, fencing or loading a run's generations failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    /// The store failed underneath; see [`StoreError`] for whether retrying can help.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A generation object does not decode or fails a per-object check (digest, seq range);
    /// the run cannot be loaded from it and needs an operator's attention.
    #[error("generation object '{key}' is corrupt: {reason}")]
    Corrupt {
        /// Key of the generation object.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A generation was written by a newer build; upgrade Rekindle before loading this run.
    #[error("generation object '{key}' has format {found}, this build reads up to {supported}")]
    FutureFormat {
        /// Key of the generation object.
        key: String,
        /// The format the object declares.
        found: u32,
        /// The newest format this build reads.
        supported: u32,
    },
    /// A generation object names another run than the chain it sits in; the bucket is
    /// damaged or was copied wrongly, and the run must not be resumed from it.
    #[error(
        "refusing generation object '{key}': it belongs to run \"{found}\", not \"{expected}\""
    )]
    ForeignRun {
        /// Key of the generation object.
        key: String,
        /// The run whose chain was being read.
        expected: RunId,
        /// The run the object says it belongs to.
        found: RunId,
    },
    /// The run has no generation at all: it was never started, or the ID is wrong.
    #[error("run \"{run}\" has no generations")]
    NotFound {
        /// The run that was looked for.
        run: RunId,
    },
    /// The run was retired behind its tombstone and its chain partly removed; it can be
    /// neither loaded nor resumed, and its ID is never reused.
    #[error(
        "run \"{run}\" was retired {} at generation {final_generation}: its checkpoint was removed and its ID, epochs and recovery IDs are never reused",
        retired_outcome(.outcome)
    )]
    Retired {
        /// The retired run.
        run: RunId,
        /// How the run ended; `None` when it was removed (`rekindle runs rm`) before it ended.
        outcome: Option<crate::core::fact::Outcome>,
        /// The run's last generation before it was retired.
        final_generation: u64,
    },
    /// A commit's future was dropped while it wrote; this writer commits nothing more.
    #[error(
        "run \"{run}\": an earlier commit was cancelled mid-write and may or may not have landed; resume the run (it loads what landed) before committing more"
    )]
    Interrupted {
        /// The run.
        run: RunId,
    },
    /// Another writer created the run's first generation first; pick another run ID or load
    /// the existing run instead.
    #[error("run \"{run}\" already exists (generation 1 was written by another writer)")]
    AlreadyExists {
        /// The run that already exists.
        run: RunId,
    },
    /// A writer with a higher lease epoch committed to the slot this writer aimed at: another
    /// holder owns the run now, so this writer must stop without committing.
    #[error(
        "run \"{run}\": fenced at generation {generation}: it was written by epoch {by_epoch}, this writer holds epoch {epoch}; another holder owns the run now"
    )]
    Fenced {
        /// The run that was fenced.
        run: RunId,
        /// The slot where the higher epoch was found.
        generation: u64,
        /// This writer's lease epoch.
        epoch: Epoch,
        /// The epoch of the generation occupying the slot.
        by_epoch: Epoch,
    },
    /// Another writer at the same or a lower epoch committed the slot first (or a fence landed
    /// in a slot gc had freed); reload the run and retry.
    #[error(
        "run \"{run}\": generation {generation} was committed by another writer at epoch {by_epoch} (ours {epoch}); reload and retry"
    )]
    Conflict {
        /// The run being committed.
        run: RunId,
        /// The slot that was taken.
        generation: u64,
        /// This writer's lease epoch.
        epoch: Epoch,
        /// The epoch of the generation occupying the slot.
        by_epoch: Epoch,
    },
    /// Two neighbouring generations do not link (a missing slot, a seq gap, a lower epoch,
    /// a wrong base); loading retries from a newer hint, then gives up.
    #[error("generation object '{key}': {reason}")]
    Discontinuous {
        /// Key of the later generation of the broken link.
        key: String,
        /// Which chain rule it breaks.
        reason: String,
    },
    /// The run's tombstone cannot be read (it names its key).
    #[error(transparent)]
    Tombstone(crate::store::tombstone::TombstoneError),
    /// A sealed generation could not be opened: its key is not configured, or the payload
    /// fails to authenticate (tampered with, or moved under another envelope).
    #[error("generation object '{key}' is sealed: {error}")]
    Sealed {
        /// Key of the generation object.
        key: String,
        /// Why unsealing failed.
        error: crate::store::seal::SealError,
    },
    // The inner errors are part of the message, not a `source`: as both, `{:#}` printed them
    // twice.
    /// A generation's facts do not fold onto the run's history (for example, a seq reused
    /// with different content); the chain is inconsistent and must not be resumed.
    #[error("generation object '{key}': {error}")]
    Fold {
        /// Key of the generation whose facts were refused.
        key: String,
        /// Why the fold refused them.
        error: FoldError,
    },
}

impl GenerationError {
    /// Whether the chain itself is damaged (an object that does not decode, its hint
    /// included, belongs to another run, breaks continuity or the fold, or cannot be
    /// unsealed): waiting or retrying cannot make it load. A store failure, a missing or
    /// retired run and a lost race are not damage.
    pub fn is_damage(&self) -> bool {
        if let GenerationError::Store(StoreError::Object(_)) = self {
            return true;
        }
        !matches!(
            self,
            GenerationError::Store(_)
                | GenerationError::NotFound { .. }
                | GenerationError::Retired { .. }
                | GenerationError::Interrupted { .. }
                | GenerationError::AlreadyExists { .. }
                | GenerationError::Fenced { .. }
                | GenerationError::Conflict { .. }
        )
    }
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

pub(super) fn encode_facts(facts: &[Fact]) -> Result<(Vec<u8>, String), fact::DecodeError> {
    let mut lines = Vec::new();
    for fact in facts {
        lines.extend(fact::encode(fact)?);
        lines.push(b'\n');
    }
    let digest = sha256_hex(&lines);
    Ok((lines, digest))
}

pub(super) fn facts_digest(facts: &[Fact]) -> Result<String, fact::DecodeError> {
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
    epoch: Epoch,
    first_seq: u64,
    last_seq: u64,
    snapshot: bool,
    base: u64,
    algorithm: &'a str,
    key_id: &'a str,
}

/// The associated data for sealing `generation`'s facts with `algorithm` and key `key_id`.
pub(super) fn seal_context(generation: &Generation, algorithm: &str, key_id: &str) -> Vec<u8> {
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

/// The chain rule between neighbours, loading a run whose newest generation `newest` builds on
/// snapshot `base`: the first generation read (`previous` is `None`) is that snapshot, from
/// seq 1; every later one is a delta on the same snapshot, at an epoch no lower than the one
/// before it, with no facts missing in between (overlaps are the fold's to check). Returns why
/// the link is broken.
pub(super) fn check_link(
    previous: Option<&Generation>,
    generation: &Generation,
    base: u64,
    newest: u64,
) -> Result<(), String> {
    let Some(previous) = previous else {
        if !generation.snapshot || generation.first_seq != 1 {
            return Err(format!(
                "the chain starts here but it is not a snapshot from seq 1 (newest generation {newest} builds on it)"
            ));
        }
        return Ok(());
    };
    if generation.snapshot || generation.base != base {
        return Err(format!(
            "expected a delta on snapshot {base}, found {} on {}",
            if generation.snapshot {
                "a snapshot"
            } else {
                "a delta"
            },
            generation.base
        ));
    }
    if generation.epoch < previous.epoch {
        return Err(format!(
            "epoch {} is lower than epoch {} of generation {}",
            generation.epoch, previous.epoch, previous.generation
        ));
    }
    if generation.first_seq > previous.last_seq + 1 {
        return Err(format!(
            "facts {}..{} are missing (generation {} ends at seq {})",
            previous.last_seq + 1,
            generation.first_seq - 1,
            previous.generation,
            previous.last_seq
        ));
    }
    Ok(())
}
