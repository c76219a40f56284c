//! Committing a run's facts: one create-if-absent PUT per commit, fencing, snapshots.

use bytes::Bytes;

use super::chain::{Chain, HintState, Located, SlotWrite};
use super::format::{
    Generation, GenerationError, KIND, SnapshotPolicy, decode_with, encode_facts, seal_context,
};
use super::load::{load, read_tombstone};
use crate::core::epoch::Epoch;
use crate::core::fact::{Fact, RunId, Seq};
use crate::core::fold::RunState;
use crate::core::layout::{self, FORMAT_VERSION};
use crate::store::Store;

/// How often a takeover retries its fence when the old writer keeps slipping commits in.
const FENCE_ATTEMPTS: usize = 8;

/// Commits a run's facts as generations, holding one lease epoch.
#[derive(Debug)]
pub struct RunWriter {
    chain: Chain,
    run: RunId,
    epoch: Epoch,
    nonce: String,
    state: RunState,
    /// The newest generation in the chain as this writer knows it.
    generation: u64,
    /// Seq of the last fact committed.
    committed: Seq,
    base: u64,
    epoch_starts: Vec<(Epoch, u64)>,
    snapshot_bytes: u64,
    delta_count: u32,
    delta_bytes: u64,
    policy: SnapshotPolicy,
    /// SHA-256 of the newest generation object's bytes, when this writer wrote or loaded it
    /// (not after adopting a generation whose response was lost).
    newest_digest: Option<String>,
    /// Set while a commit writes; still set at the next commit only if that commit's future
    /// was dropped mid-write, when nobody knows whether its generation landed.
    in_flight: bool,
    /// What this writer knows of the head hint, so the next snapshot moves it without
    /// reading it first.
    hint: HintState,
    /// A slot this writer's create left with an unknown outcome (it failed, maybe after an
    /// attempt landed): the next create there reads it first (see `Chain::create`).
    unsure: Option<u64>,
}

impl RunWriter {
    /// Starts a new run: generation 1, a snapshot of `facts` (its meta and first facts).
    pub async fn create(
        store: &Store,
        facts: Vec<Fact>,
        epoch: Epoch,
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
        epoch: Epoch,
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
            nonce: store.writer_nonce(),
            state: RunState::default(),
            generation: 0,
            committed: Seq(0),
            base: 0,
            epoch_starts: Vec::new(),
            snapshot_bytes: 0,
            delta_count: 0,
            delta_bytes: 0,
            policy,
            newest_digest: None,
            in_flight: false,
            // A new chain: its first generation never gets a hint (see `advance_hint_from`).
            hint: HintState::Absent,
            unsure: None,
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
        epoch: Epoch,
        policy: SnapshotPolicy,
    ) -> Result<RunWriter, GenerationError> {
        Self::resume_from(store, run, epoch, policy, None).await
    }

    /// [`Self::resume`], starting from `loaded` (the caller's recent load of the run) instead
    /// of loading it again. Safe however old `loaded` is: the fence is a create-if-absent in
    /// the slot after it, so a commit that landed since makes the fence fail and the run is
    /// loaded afresh.
    pub async fn resume_from(
        store: &Store,
        run: &RunId,
        epoch: Epoch,
        policy: SnapshotPolicy,
        loaded: Option<super::load::Loaded>,
    ) -> Result<RunWriter, GenerationError> {
        let mut last_error = None;
        let mut preloaded = loaded;
        for _ in 0..FENCE_ATTEMPTS {
            let loaded = match preloaded.take() {
                Some(loaded) => loaded,
                None => load(store, run, None).await?,
            };
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
                nonce: store.writer_nonce(),
                committed: loaded.state.last_seq(),
                state: loaded.state,
                generation: loaded.generation,
                base: loaded.base,
                epoch_starts: loaded.epoch_starts,
                snapshot_bytes: loaded.snapshot_bytes,
                delta_count: loaded.delta_count,
                delta_bytes: loaded.delta_bytes,
                policy,
                newest_digest: Some(loaded.digest),
                in_flight: false,
                hint: HintState::Unknown,
                unsure: None,
            };
            if loaded.epoch == epoch {
                // Our own epoch already fenced this run (a restart of the same holding) — if
                // the generation at it is ours. Every holding of a lease has its own epoch, so
                // another writer at this epoch means the epoch was never ours to hold (a
                // lease that did not reserve it): stop rather than write beside it.
                if store.writes_as(&loaded.writer) {
                    return Ok(writer);
                }
                tracing::warn!(run_id = %run, epoch = %epoch, writer = %loaded.writer, generation = loaded.generation, "another writer holds this epoch; not resuming");
                return Err(GenerationError::Fenced {
                    run: run.clone(),
                    generation: loaded.generation,
                    epoch,
                    by_epoch: loaded.epoch,
                });
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
                            tracing::warn!(run_id = %run, epoch = %epoch, generation = writer.generation, hint = hint.generation, "fence landed in a collected slot; fencing again");
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

    /// The run's state as of the newest generation this writer committed or saw.
    pub fn state(&self) -> &RunState {
        &self.state
    }

    /// The lease epoch this writer commits with.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The run this writer commits to.
    pub fn run_id(&self) -> &RunId {
        &self.run
    }

    /// The newest generation this writer committed or saw.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// SHA-256 of the newest generation object's bytes (what a recovery pins), when this
    /// writer wrote or loaded that generation itself.
    pub fn newest_digest(&self) -> Option<&str> {
        self.newest_digest.as_deref()
    }

    /// The first generation of every epoch of the chain, as the newest generation records
    /// them.
    pub fn epoch_starts(&self) -> &[(Epoch, u64)] {
        &self.epoch_starts
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
        // A commit dropped mid-write (its caller was cancelled) left the state holding facts
        // that may or may not have landed; committing on top would write a generation whose
        // seqs do not follow the landed ones. Only a fresh load knows.
        if self.in_flight {
            return Err(GenerationError::Interrupted {
                run: self.run.clone(),
            });
        }
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
        self.in_flight = true;
        let written = self.write(new_facts, first).await;
        self.in_flight = false;
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
        // A fence (a commit of no new facts) never moves the hint, even as a snapshot: a
        // fence written after a recovery pinned the run (a second admission) must not move it
        // past the pin, or gc would delete the pinned chain (see the retention contract).
        let moves_hint = snapshot && !new_facts.is_empty();
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
        let object_digest = crate::core::digest::sha256_hex(&bytes);
        match self.chain.create(n, bytes, self.unsure == Some(n)).await {
            Ok(SlotWrite::Created) => {}
            Ok(SlotWrite::Taken) => {
                let (ours, size) = match self.occupied(n, &key).await {
                    Ok(occupied) => occupied,
                    Err(error) => {
                        // The slot may have been ours and be gone by the next commit.
                        self.unsure = Some(n);
                        return Err(error);
                    }
                };
                self.newest_digest = None;
                return self.adopt(n, &key, ours, size).await.map(Some);
            }
            Ok(SlotWrite::Passed) => {
                // Should telling who overtook us fail, a retried commit must not create the
                // slot, which may have held our write.
                self.unsure = Some(n);
                return Err(self.overtaken(n, &key).await);
            }
            Err(other) => {
                // Whatever failed, an attempt may have landed before it.
                self.unsure = Some(n);
                return Err(other.into());
            }
        }
        self.newest_digest = Some(object_digest);
        self.landed(n, snapshot, moves_hint, size, epoch_starts)
            .await;
        Ok(None)
    }

    /// Bookkeeping after generation `n` (of `size` bytes) is known to be in the chain, written
    /// by this writer or adopted after a lost response: the committed prefix, the epoch
    /// starts, the snapshot counters, and the head hint for a snapshot that `moves_hint` (one
    /// that committed new facts; best effort).
    async fn landed(
        &mut self,
        n: u64,
        snapshot: bool,
        moves_hint: bool,
        size: u64,
        epoch_starts: Vec<(Epoch, u64)>,
    ) {
        self.generation = n;
        self.unsure = None;
        self.committed = self.state.last_seq();
        self.epoch_starts = epoch_starts;
        if snapshot {
            self.base = n;
            self.snapshot_bytes = size;
            self.delta_count = 0;
            self.delta_bytes = 0;
            if moves_hint {
                match self.chain.advance_hint_from(n, &self.hint).await {
                    Ok(known) => self.hint = known,
                    Err(error) => {
                        self.hint = HintState::Unknown;
                        tracing::warn!(run_id = %self.run, generation = n, %error, "could not advance the head hint");
                    }
                }
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
            None => return Err(self.overtaken(n, key).await),
        };
        // Our nonce: an earlier commit of ours landed although we were told it failed (its
        // response was lost and the store's own read-back could not run, e.g. retries ran
        // out). The bytes differ from this attempt's (a later `at_ms`), so only the nonce
        // tells it is ours, not another writer's conflict.
        if other.writer == self.nonce {
            return Ok((other, size));
        }
        Err(self.beaten(n, &other))
    }

    /// Slot `n` was taken, or held a write of ours, and is empty now: gc collected it, which
    /// it does only once the chain went on past it (or the run was retired), so the run went
    /// on without this writer. The error says who holds it now.
    async fn overtaken(&self, n: u64, key: &str) -> GenerationError {
        let empty = || GenerationError::Discontinuous {
            key: key.to_owned(),
            reason: "the slot was reported taken but is empty".into(),
        };
        let newest = match self.chain.locate().await {
            Ok(Located::At(newest)) if newest > n => newest,
            Ok(Located::Retired(_)) => {
                return match read_tombstone(self.chain.store(), &self.run).await {
                    Ok(retired) => retired.unwrap_or_else(empty),
                    Err(error) => error,
                };
            }
            Ok(_) => return empty(),
            Err(error) => return error.into(),
        };
        let newest_key = self.chain.key(newest);
        match self.chain.store().read(&newest_key).await {
            Ok(Some(object)) => {
                match decode_with(
                    self.chain.store().sealer(),
                    &newest_key,
                    &self.run,
                    &object.bytes,
                ) {
                    Ok(other) => self.beaten(newest, &other),
                    Err(error) => error,
                }
            }
            Ok(None) => empty(),
            Err(error) => error.into(),
        }
    }

    /// The error for slot `n`, taken by `other`'s generation: fenced by a higher epoch, or a
    /// conflict with the same or a lower one.
    fn beaten(&self, n: u64, other: &Generation) -> GenerationError {
        if other.epoch > self.epoch {
            tracing::info!(run_id = %self.run, epoch = %self.epoch, by_epoch = %other.epoch, generation = n, "fenced");
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
        }
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
        tracing::info!(run_id = %self.run, epoch = %self.epoch, generation = n, "adopted our own generation after a lost acknowledgement");
        // A fence of ours (no facts past the committed prefix) does not move the hint.
        let moves_hint = ours.snapshot && ours.last_seq > self.committed.0;
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
        self.landed(n, ours.snapshot, moves_hint, size, ours.epoch_starts)
            .await;
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
