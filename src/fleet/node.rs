//! A node's runs: the host path (start a run here, journal it step by step), recovery
//! execution (seed the local log from the checkpoint, the resume guard, continue under the
//! recovery ID), and what is recorded when a run stops.
//!
//! Which run is recovered, and where, is the coordinator's; how a recovery comes to exist is
//! `admission`'s.

use super::*;

/// The shortest interval at which a waiting answer polls a lease.
pub(crate) const MIN_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// What a host needs to start or continue runs on this node.
#[derive(Clone)]
pub struct Node {
    /// The bucket that holds runs' generations, leases, recovery records and index entries.
    pub store: Store,
    /// The agent that drives runs on this node.
    pub agent: Agent,
    /// The state directory of this node's local fact logs.
    pub logs: LogDir,
    /// This node's lease holder, whose heartbeat keeps its runs' leases alive.
    pub holder: Arc<Holder>,
    /// Set to ask every run on this node to stop after its current step.
    pub stop: Arc<AtomicBool>,
}

/// A run this node holds and journals: its writer at the held epoch, its local log, and the
/// index entry it wrote. A host that drives its own loop appends facts with [`Self::record`],
/// each durable (local log, then one conditional PUT) before it returns, and hands the run back
/// with [`Node::close_journaled`].
pub struct Journaled {
    /// Commits the run's facts at the held epoch; its state is the committed run.
    pub writer: RunWriter,
    log: crate::store::log::FactLog,
    held: Held,
    entry: IndexEntry,
    written: crate::core::layout::ETag,
    /// A fact whose commit failed after it was journaled locally: it may have landed (a lost
    /// acknowledgement), so only the same fact, with the same seq and time, may follow.
    in_doubt: Option<Fact>,
}

impl Journaled {
    /// The run's committed state.
    pub fn state(&self) -> &crate::core::fold::RunState {
        self.writer.state()
    }

    /// The run.
    pub fn run_id(&self) -> &RunId {
        &self.held.run
    }

    /// The lease epoch this node journals at.
    pub fn epoch(&self) -> crate::core::epoch::Epoch {
        self.held.epoch
    }

    /// Appends one fact: checked against the run's rules, journaled locally (a trace), then
    /// committed (one create-if-absent PUT, fenced by any newer epoch). Returns once it is in
    /// the store.
    ///
    /// A commit that failed can be retried by recording the same fact again: it is committed
    /// as it was journaled (same seq and time), so a generation that landed without its
    /// acknowledgement is adopted, not contradicted. Any other fact is refused until then.
    pub async fn record(&mut self, body: FactBody, now_ms: u64) -> Result<()> {
        let (fact, journaled) = match self.in_doubt.take() {
            Some(fact) if fact.body == body => (fact, true),
            Some(fact) => {
                let kind = fact.body.kind();
                self.in_doubt = Some(fact);
                return Err(FleetError::InDoubt {
                    run: self.held.run.clone(),
                    kind,
                }
                .into());
            }
            None => {
                let fact = Fact {
                    seq: Seq(self.writer.state().last_seq().0 + 1),
                    at_ms: now_ms,
                    body,
                };
                // The fold's rules first, so a fact the run refuses reaches neither the log
                // nor the store.
                if let Err(error) = self.writer.state().check(&fact) {
                    return Err(FleetError::FactRefused {
                        run: self.held.run.clone(),
                        kind: fact.body.kind(),
                        error,
                    }
                    .into());
                }
                (fact, false)
            }
        };
        if !journaled {
            self.log.append(&fact)?;
        }
        if let Err(error) = self.writer.commit(vec![fact.clone()]).await {
            self.in_doubt = Some(fact);
            return Err(error.into());
        }
        Ok(())
    }

    /// The last committed fact, if `body` is it: a hand-back retried after its fact landed.
    pub fn last_is(&self, body: &FactBody) -> bool {
        self.in_doubt.is_none()
            && self
                .writer
                .state()
                .facts()
                .last()
                .is_some_and(|fact| fact.body == *body)
    }
}

impl Node {
    fn clock(&self) -> &Arc<dyn Clock> {
        self.store.clock()
    }

    fn runner(&self, writer: RunWriter, log: crate::store::log::FactLog, held: Held) -> Runner {
        let lease_suspect = Arc::new(AtomicBool::new(false));
        self.watch_lease(held.clone(), Arc::clone(&lease_suspect));
        Runner {
            writer,
            log,
            model: Arc::clone(&self.agent.model),
            tools: Arc::clone(&self.agent.tools),
            system_prompt: self.agent.config.system_prompt.clone(),
            steps_per_resume: self.agent.config.steps_per_resume(),
            clock: Arc::clone(self.clock()),
            lease: Some((Arc::clone(&self.holder), held)),
            // The lease was just taken and the writer just committed (the run's first
            // generation, a seed or a fence): proof enough for the first tool call.
            committed_at: Some(crate::clock::Stopwatch::start()),
            stop: Arc::clone(&self.stop),
            lease_suspect,
            resumed: None,
        }
    }

    /// Checks the lease every third of its TTL while the runner is alive (it holds the other
    /// end of `suspect`); on a loss, flags the runner, which stops at its next step instead of
    /// taking one more model or tool call. Commits are fenced regardless; this only saves work.
    fn watch_lease(&self, held: Held, suspect: Arc<AtomicBool>) {
        let holder = Arc::clone(&self.holder);
        tokio::spawn(async move {
            let interval = holder.ttl() / 3;
            loop {
                crate::clock::sleep(interval).await;
                // The runner dropped its end: the run is done here.
                if Arc::strong_count(&suspect) == 1 {
                    return;
                }
                match holder.check(&held).await {
                    Ok(()) => {}
                    Err(error @ LeaseError::Lost { .. }) => {
                        tracing::info!(run_id = %held.run, epoch = %held.epoch, %error, "lease lost; stopping");
                        suspect.store(true, Ordering::SeqCst);
                        return;
                    }
                    // A store hiccup is not a loss; the next check (or a fenced commit) decides.
                    Err(error) => tracing::debug!(run_id = %held.run, %error, "lease check failed"),
                }
            }
        });
    }

    fn entry(&self, run: &RunId, session: Option<SessionId>, phase: Phase) -> IndexEntry {
        let mut entry = IndexEntry::new(
            run.clone(),
            session,
            phase,
            self.agent.fingerprint_sha256(),
            self.clock().wall_ms(),
        );
        entry.holder = Some(self.holder.heartbeat_key());
        entry.holder_ttl_ms = Some(self.holder.ttl().as_millis() as u64);
        entry
    }

    /// Refuses a run ID that is, or will be, a recovery's: a recovery runs as the run of its
    /// own ID, so a host run under it would share that run's lease and chain. The coordinator's
    /// IDs (`recovery-of-<run>`) are reserved; any other is refused once its record exists.
    /// (Admission refuses a recovery ID that already names a run, so whichever comes first
    /// keeps the ID, barring two processes creating the same ID at the same moment.)
    async fn refuse_recovery_id(&self, run: &RunId) -> Result<()> {
        let why = if run
            .as_str()
            .starts_with(crate::core::assignment::RECOVERY_ID_PREFIX)
        {
            "reserved for the fleet's recoveries".to_owned()
        } else if recovery::read(&self.store, &RecoveryId::new(run.as_str()))
            .await?
            .is_some()
        {
            "a recovery's ID".to_owned()
        } else {
            return Ok(());
        };
        Err(FleetError::IdReserved {
            run: run.clone(),
            why,
        }
        .into())
    }

    /// Starts a run on this node and drives it until it ends, parks or is asked to stop.
    /// A run ID that was ever used is refused before anything is written.
    #[tracing::instrument(name = "host_run", skip_all, fields(run_id = %run, holder_id = %self.holder.id()))]
    pub async fn start_run(
        &self,
        run: &RunId,
        session: Option<SessionId>,
        prompt: &str,
    ) -> Result<Stopped> {
        let journaled = self.begin_run(run, session, prompt).await?;
        self.drive_journaled(journaled).await
    }

    /// Continues a run this host (or another host process) started, under its own ID: takes
    /// its lease (waiting out a holder that died, as a takeover does: the run's earlier
    /// incarnation is fenced), refuses a run that a recovery has claimed (that recovery
    /// continues it), checks the resume guard, and drives it until it ends, parks or is asked
    /// to stop.
    #[tracing::instrument(name = "host_resume", skip_all, fields(run_id = %run, holder_id = %self.holder.id()))]
    pub async fn resume_run(&self, run: &RunId) -> Result<Stopped> {
        let journaled = self.continue_run(run).await?;
        self.drive_journaled(journaled).await
    }

    /// Drives a run journaled on this node until it stops here, then says where it stands.
    async fn drive_journaled(&self, journaled: Journaled) -> Result<Stopped> {
        let Journaled {
            writer,
            log,
            held,
            entry,
            written,
            in_doubt: _,
        } = journaled;
        let runner = self.runner(writer, log, held.clone());
        let (stopped, _) = self.drive_until_stopped(runner, &held, false).await?;
        self.settle(&held, &entry, &written, &stopped).await?;
        if let Stopped::Finished(_) = stopped {
            // The run's history is in the bucket; its local journal has served (a host's
            // state directory would otherwise keep one file per run it ever finished).
            if let Err(error) = self.logs.remove_log(held.run.as_str()) {
                tracing::warn!(run_id = %held.run, %error, "cannot remove the local fact log");
            }
        }
        Ok(stopped)
    }

    /// Records in the index where a host's run stands after it stopped here, then releases
    /// its lease (after the index: a coordinator that sees the lease free sees the entry too).
    async fn settle(
        &self,
        held: &Held,
        entry: &IndexEntry,
        written: &crate::core::layout::ETag,
        stopped: &Stopped,
    ) -> Result<()> {
        match stopped {
            Stopped::Finished(_) => lifecycle::host_finished(&self.store, &held.run).await?,
            Stopped::Parked(_) | Stopped::WaitingForInput => {
                lifecycle::host_parked(&self.store, entry, written).await?
            }
            Stopped::StepCap | Stopped::StopRequested => {
                lifecycle::host_let_go(&self.store, entry, written).await?
            }
        }
        self.holder.release(held).await?;
        Ok(())
    }

    /// The first half of [`Self::start_run`]: refuses a used or reserved ID, takes the new
    /// run's lease, writes its index entry, journals and commits its opening facts. The run is
    /// then the caller's to drive ([`Self::start_run`]) or to journal step by step
    /// ([`Journaled`]).
    pub async fn begin_run(
        &self,
        run: &RunId,
        session: Option<SessionId>,
        prompt: &str,
    ) -> Result<Journaled> {
        self.refuse_recovery_id(run).await?;
        let held = self.holder.acquire_new(run).await?;
        let entry = self.entry(run, session.clone(), Phase::Running);
        // A failure leaves the lease and the index entry as they are: the first generation may
        // have landed without its acknowledgement, and then the run exists and is the fleet's
        // to recover once this holder stops beating (admission refuses one that never started).
        self.begin_held(run, session, prompt, &held, &entry).await
    }

    async fn begin_held(
        &self,
        run: &RunId,
        session: Option<SessionId>,
        prompt: &str,
        held: &Held,
        entry: &IndexEntry,
    ) -> Result<Journaled> {
        let now = self.clock().wall_ms();
        let facts = opening_facts(run, session, &self.agent, prompt, now);
        let written = lifecycle::host_started(&self.store, entry).await?;
        // A coordinator idling between slow scans starts watching this run now.
        let store = self.store.clone();
        tokio::spawn(async move { wake::wake_coordinator(&store).await });
        self.logs.remove_log(run.as_str())?;
        let (mut log, _) = self.logs.open_log(run.as_str())?;
        log.append_all(&facts)?;
        let writer = RunWriter::create_as(
            &self.store.writing_as(self.holder.id()),
            run.clone(),
            facts,
            held.epoch,
            SnapshotPolicy::default(),
        )
        .await?;
        Ok(Journaled {
            writer,
            log,
            held: held.clone(),
            entry: entry.clone(),
            written,
            in_doubt: None,
        })
    }

    /// The first half of [`Self::resume_run`]: the run's lease at a new epoch (its fence
    /// generation committed), its local log seeded from the committed facts, its index entry
    /// naming this holder.
    pub async fn continue_run(&self, run: &RunId) -> Result<Journaled> {
        if let Some(entry) = index::read(&self.store, run).await?
            && let Some(recovery) = entry.recovery_id
        {
            return Err(FleetError::BeingRecovered {
                run: run.clone(),
                recovery,
            }
            .into());
        }
        let ttl = crate::store::lease::read_lease(&self.store, run)
            .await?
            .map_or(self.holder.ttl(), |view| {
                std::time::Duration::from_millis(view.lease.ttl_ms)
            });
        let held = self
            .holder
            .acquire_or_wait(run, (ttl / 6).max(MIN_POLL), ttl * 2 + ttl / 2)
            .await?;
        let result = self.continue_held(run, &held).await;
        if result.is_err() {
            // Best effort: the lease expires anyway; releasing it lets the next try start now.
            let _ = self.holder.release(&held).await;
        }
        result
    }

    async fn continue_held(&self, run: &RunId, held: &Held) -> Result<Journaled> {
        // Checked after taking the lease: an admission claims before it fences, so either the
        // claim is visible now or the admission's fence comes after anything committed here.
        if let Some(recovery) = recovery::claimed_by(&self.store, run).await? {
            return Err(FleetError::BeingRecovered {
                run: run.clone(),
                recovery,
            }
            .into());
        }
        let writer = RunWriter::resume(
            &self.store.writing_as(self.holder.id()),
            run,
            held.epoch,
            SnapshotPolicy::default(),
        )
        .await?;
        let meta = writer.state().meta().cloned();
        if let Some(meta) = &meta {
            meta.fingerprint
                .check_resume(&self.agent.config.fingerprint(), false)
                .map_err(|error| FleetError::ResumeRefused {
                    run: run.clone(),
                    error,
                })?;
        }
        let phase = if writer.state().parked().is_some() {
            Phase::Parked
        } else {
            Phase::Running
        };
        let entry = self.entry(run, meta.and_then(|m| m.session_id), phase);
        let written = lifecycle::host_started(&self.store, &entry).await?;
        // A process paused since the claim check may have let an admission claim the run,
        // fence it and index its recovery, and then written its own entry over that one. Looked
        // at again now that the entry is written: a claim means the run is the recovery's, and
        // admitting the claimed ID again (idempotent) puts its entry back.
        if let Some(recovery) = recovery::claimed_by(&self.store, run).await? {
            admission::admit(
                &self.store,
                &self.holder,
                run,
                &recovery,
                false,
                Takeover::Now,
            )
            .await?;
            return Err(FleetError::BeingRecovered {
                run: run.clone(),
                recovery,
            }
            .into());
        }
        self.logs.remove_log(run.as_str())?;
        let (mut log, _) = self.logs.open_log(run.as_str())?;
        log.append_all(writer.state().facts())?;
        Ok(Journaled {
            writer,
            log,
            held: held.clone(),
            entry,
            written,
            in_doubt: None,
        })
    }

    /// Ends a journaled run's stay on this node once its host stops journaling it: records
    /// where it stands (ended, parked, or still running: the fleet recovers it once this
    /// holder stops beating) and releases its lease.
    pub async fn close_journaled(&self, journaled: &Journaled) -> Result<()> {
        let state = journaled.writer.state();
        let stopped = if let Some(terminal) = state.terminal() {
            Stopped::Finished(terminal.clone())
        } else if let Some(parked) = state.parked() {
            Stopped::Parked(parked.clone())
        } else {
            Stopped::StopRequested
        };
        self.settle(
            &journaled.held,
            &journaled.entry,
            &journaled.written,
            &stopped,
        )
        .await
    }

    /// Drives until the run is no longer runnable here. A host keeps going past the per-call
    /// step cap (each call commits first); a recovery attempt stops there and yields.
    async fn drive_until_stopped(
        &self,
        mut runner: Runner,
        held: &Held,
        yield_at_step_cap: bool,
    ) -> Result<(Stopped, u64)> {
        let stopped = loop {
            match runner.drive().await {
                Ok(Stopped::StepCap) if !yield_at_step_cap => continue,
                Ok(other) => break other,
                Err(error) => {
                    tracing::debug!(run_id = %held.run, epoch = %held.epoch, %error, "drive stopped");
                    return Err(error.into());
                }
            }
        };
        // Done driving: drop the runner (and its lease watcher) before the lease is released.
        let generation = runner.writer.generation();
        drop(runner);
        Ok((stopped, generation))
    }

    /// Continues an interrupted run under its recovery ID: takes the recovery run's lease,
    /// seeds it from the pinned source generation (or continues it if an earlier attempt
    /// already started it), checks the resume guard, drives it until it ends, parks or
    /// reaches the step cap, and releases the lease. Returns why it stopped and the newest
    /// generation. It changes no record: the caller reports the outcome as a lifecycle event.
    pub async fn execute_recovery(&self, record: &RecoveryRecord) -> Result<(Stopped, u64)> {
        self.execute_recovery_seeded(record, None).await
    }

    /// [`Node::execute_recovery`] with the pinned source as the caller loaded it, if it did
    /// (a worker reads it while it starts the attempt); only a first attempt uses it. The
    /// lease is released before the outcome is reported: a release that fails fails the
    /// attempt, whose next attempt takes the lease at a new epoch and finds the run as it is.
    #[tracing::instrument(
        name = "recovery_attempt",
        skip_all,
        fields(run_id = %record.source_run, recovery_id = %record.recovery_id, holder_id = %self.holder.id(), epoch = tracing::field::Empty)
    )]
    pub(crate) async fn execute_recovery_seeded(
        &self,
        record: &RecoveryRecord,
        seed: Option<std::result::Result<generation::Loaded, GenerationError>>,
    ) -> Result<(Stopped, u64)> {
        let run = RunId::new(record.recovery_id.as_str());
        let (floor, poll, max_wait) = (
            record.source_epoch.next(),
            self.holder.ttl() / 4,
            self.holder.ttl() * 3,
        );
        let taken = async {
            match self.take_from_abandoned(&run, record).await? {
                Some(held) => Ok(held),
                // The first attempt (the lifecycle counts every start) finds no lease: create
                // it without looking first.
                None if record.attempts <= 1 => Ok(self
                    .holder
                    .create_or_wait_from(&run, floor, poll, max_wait)
                    .await?),
                None => Ok(self
                    .holder
                    .acquire_or_wait_from(&run, floor, poll, max_wait)
                    .await?),
            }
        };
        let held = match taken.await {
            Ok(held) => held,
            // An earlier attempt ended the run and died before recording it, and gc has since
            // retired the run, reserving its lease. It ended: report that, do not fail. The
            // load says so from the tombstone once the hint is marked, and from the chain
            // before (a retirement that stopped after its reservation).
            Err(error @ Error::Lease(LeaseError::Retired { .. })) => {
                let ended = match generation::load(&self.store, &run, None).await {
                    Ok(loaded) => loaded
                        .state
                        .terminal()
                        .map(|terminal| (terminal.outcome, loaded.generation)),
                    Err(GenerationError::Retired {
                        outcome,
                        final_generation,
                        ..
                    }) => outcome.map(|outcome| (outcome, final_generation)),
                    Err(_) => None,
                };
                return ended
                    .map(|(outcome, final_generation)| ended_earlier(outcome, final_generation))
                    .ok_or(error);
            }
            Err(error) => return Err(error),
        };
        tracing::Span::current().record("epoch", held.epoch.0);
        let attempt = async {
            let policy = SnapshotPolicy::default();
            // The recovery run's generations name this worker.
            let store = &self.store.writing_as(self.holder.id());
            // Continue the recovery run if an earlier attempt started it, else seed it. The first
            // attempt (the lifecycle counts every start) cannot find one, so it seeds at once; a
            // run that exists anyway makes the seed's create fail, and it is resumed.
            let earlier = if record.attempts > 1 {
                RunWriter::resume(store, &run, held.epoch, policy).await
            } else {
                Err(GenerationError::NotFound { run: run.clone() })
            };
            let writer = match earlier {
                Ok(writer) => writer,
                // An earlier attempt ended the run and died before recording it; gc has since
                // retired the run. It ended: report that, do not fail.
                Err(GenerationError::Retired {
                    outcome: Some(outcome),
                    final_generation,
                    ..
                }) => return Ok(ended_earlier(outcome, final_generation)),
                Err(GenerationError::NotFound { .. }) => {
                    let source = match seed {
                        Some(seeded) => seeded?,
                        None => {
                            generation::load_pinned(
                                &self.store,
                                &record.source_run,
                                record.source_generation,
                                record.source_base,
                            )
                            .await?
                        }
                    };
                    if source.digest != record.source_digest {
                        return Err(FleetError::PinMismatch {
                            recovery: record.recovery_id.clone(),
                            source_run: record.source_run.clone(),
                            generation: record.source_generation,
                            pinned: record.source_digest.clone(),
                            found: source.digest,
                        }
                        .into());
                    }
                    match RunWriter::create_as(
                        store,
                        run.clone(),
                        source.state.into_facts(),
                        held.epoch,
                        policy,
                    )
                    .await
                    {
                        Ok(writer) => writer,
                        Err(GenerationError::AlreadyExists { .. }) => {
                            RunWriter::resume(store, &run, held.epoch, policy).await?
                        }
                        Err(other) => return Err(other.into()),
                    }
                }
                Err(other) => return Err(other.into()),
            };
            if let Some(meta) = writer.state().meta() {
                meta.fingerprint
                    .check_resume(&self.agent.config.fingerprint(), record.force)
                    .map_err(|error| FleetError::ResumeRefused {
                        run: run.clone(),
                        error,
                    })?;
            }
            self.logs.remove_log(run.as_str())?;
            let (mut log, _) = self.logs.open_log(run.as_str())?;
            log.append_all(writer.state().facts())?;
            tracing::info!(recovery_id = %record.recovery_id, source_run = %record.source_run, epoch = %held.epoch, "recovery started");
            let mut runner = self.runner(writer, log, held.clone());
            // After an interruption: the source's (the first attempt) or a worker's that died
            // mid-attempt (the coordinator abandoned it). Not after a clean hand-back.
            if record.attempts == 1 || record.abandoned_by.is_some() {
                let last_commit = runner.writer.state().facts().last().map_or(0, |f| f.at_ms);
                runner.resumed = Some(crate::fleet::runner::Resumed {
                    latency: (record.attempts == 1).then_some((record.admitted_at_ms, last_commit)),
                });
            }
            self.drive_until_stopped(runner, &held, true).await
        };
        match attempt.await {
            Ok(stopped) => {
                self.holder.release(&held).await?;
                Ok(stopped)
            }
            Err(error) => {
                // Nothing runs under this lease any more (the runner returned): free it for
                // the next attempt rather than leave it held while this worker lives. A lease
                // taken over since is not ours to release, and the release changes nothing.
                if let Err(release) = self.holder.release(&held).await {
                    tracing::debug!(run_id = %run, error = %release, "cannot release the recovery run's lease after a failed attempt");
                }
                Err(error)
            }
        }
    }
}

impl Node {
    /// The recovery run's lease, taken over at once when the attempt before this one was
    /// abandoned and its worker still holds the lease: the coordinator judged that worker gone
    /// (its heartbeat silent for its TTL), so watching it for another TTL would only double
    /// the wait. `None` when there is no such lease; the caller then acquires as usual.
    async fn take_from_abandoned(
        &self,
        run: &RunId,
        record: &RecoveryRecord,
    ) -> Result<Option<Held>> {
        let Some(gone) = &record.abandoned_by else {
            return Ok(None);
        };
        let Some(view) = crate::store::lease::read_lease(&self.store, run).await? else {
            return Ok(None);
        };
        if view.lease.released || view.lease.holder != *gone || gone == self.holder.id() {
            return Ok(None);
        }
        match self.holder.take_over(&view).await {
            Ok(held) => Ok(Some(held)),
            // Someone else moved it meanwhile: acquire as usual.
            Err(LeaseError::HeldByOther { .. } | LeaseError::Contended { .. }) => Ok(None),
            Err(other) => Err(other.into()),
        }
    }
}

/// The first facts of a new run: its meta (with the agent's fingerprint) and the prompt.
pub fn opening_facts(
    run: &RunId,
    session: Option<SessionId>,
    agent: &Agent,
    prompt: &str,
    now_ms: u64,
) -> Vec<Fact> {
    vec![
        Fact {
            seq: Seq(1),
            at_ms: now_ms,
            body: FactBody::Meta(Box::new(Meta {
                run_id: run.clone(),
                session_id: session,
                fingerprint: agent.config.fingerprint(),
            })),
        },
        Fact {
            seq: Seq(2),
            at_ms: now_ms,
            body: FactBody::UserMessage(UserMessage {
                content: prompt.to_owned(),
            }),
        },
    ]
}

/// How a recovery attempt reports a run an earlier attempt ended, whose checkpoint gc has
/// retired since: finished, with the outcome and final generation its tombstone recorded.
pub(crate) fn ended_earlier(
    outcome: crate::core::fact::Outcome,
    final_generation: u64,
) -> (Stopped, u64) {
    let terminal = crate::core::fact::Terminal {
        outcome,
        message: "ended in an earlier attempt (checkpoint since retired)".into(),
    };
    (Stopped::Finished(terminal), final_generation)
}
