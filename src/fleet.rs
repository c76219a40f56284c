//! Running runs: the host path (start a run here), recovery execution (continue an
//! interrupted run under its recovery ID), and answering a parked run.
//!
//! This module owns the sequence around the drive loop: taking the lease, the index entry,
//! seeding the local log, the resume guard, and what is recorded when a run stops. The
//! decision of *which* run to recover and *where* is the coordinator's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::clock::Clock;
use crate::config::Config;
use crate::fact::{
    ConfirmationAnswered, Fact, FactBody, Meta, QuestionAnswered, RecoveryId, RunId, Seq,
    SessionId, UserMessage,
};
use crate::fingerprint::ResumeRefused;
use crate::generation::{self, GenerationError, RunWriter, SnapshotPolicy};
use crate::host::{CommandTools, Model, ModelError, OpenAiModel, ScriptedModel, Tools};
use crate::index::{self, IndexEntry, IndexError, Phase};
use crate::lease::{Held, Holder, LeaseError};
use crate::log::{LogDir, LogError};
use crate::recovery::{self, RecoveryError, RecoveryRecord, RecoveryResult, RecoveryState};
use crate::runner::{RunError, Runner, Stopped};
use crate::store::Store;

/// A configured agent: model, tools, prompt, budgets.
#[derive(Clone)]
pub struct Agent {
    pub config: Config,
    pub model: Arc<dyn Model>,
    pub tools: Arc<dyn Tools>,
}

impl Agent {
    pub fn from_config(config: Config) -> Result<Agent, ModelError> {
        let model: Arc<dyn Model> = match config.model.kind.as_str() {
            "scripted" => {
                let script = config.model.script.as_ref().ok_or_else(|| {
                    ModelError::Config("model.script is required for a scripted model".into())
                })?;
                Arc::new(ScriptedModel::load(&config.resolve(script))?)
            }
            _ => {
                let base_url = config.model.base_url.as_deref().ok_or_else(|| {
                    ModelError::Config("model.base_url is required for an openai model".into())
                })?;
                let timeout =
                    std::time::Duration::from_millis(config.model.timeout_ms.unwrap_or(120_000));
                Arc::new(OpenAiModel::new(
                    base_url,
                    &config.model.name,
                    config.model.api_key_env.clone(),
                    timeout,
                )?)
            }
        };
        let tools: Arc<dyn Tools> = Arc::new(CommandTools::new(config.tools.clone()));
        Ok(Agent {
            config,
            model,
            tools,
        })
    }

    pub fn fingerprint_sha256(&self) -> String {
        self.config.fingerprint().sha256()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Generation(#[from] GenerationError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    #[error("refusing to resume run \"{run}\": {source}")]
    ResumeRefused {
        run: RunId,
        #[source]
        source: ResumeRefused,
    },
    #[error(
        "recovery '{recovery}': source run \"{source_run}\" generation {generation} has digest {found}, the record pinned {pinned}"
    )]
    PinMismatch {
        recovery: RecoveryId,
        source_run: RunId,
        generation: u64,
        pinned: String,
        found: String,
    },
    #[error("cannot fence run \"{run}\": {message}")]
    Fence { run: RunId, message: String },
    #[error("run \"{run}\" is not parked waiting for {what}")]
    NotWaiting { run: RunId, what: String },
}

/// What a host needs to start or continue runs on this node.
#[derive(Clone)]
pub struct Node {
    pub store: Store,
    pub agent: Agent,
    pub logs: LogDir,
    pub holder: Arc<Holder>,
    pub stop: Arc<AtomicBool>,
}

impl Node {
    fn clock(&self) -> &Arc<dyn Clock> {
        self.store.clock()
    }

    fn runner(&self, writer: RunWriter, log: crate::log::FactLog, held: Held) -> Runner {
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
            stop: Arc::clone(&self.stop),
            lease_suspect,
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
                tokio::time::sleep(interval).await;
                // The runner dropped its end: the run is done here.
                if Arc::strong_count(&suspect) == 1 {
                    return;
                }
                match holder.check(&held).await {
                    Ok(()) => {}
                    Err(error @ LeaseError::Lost { .. }) => {
                        tracing::info!(run_id = %held.run, epoch = held.epoch, %error, "lease lost; stopping");
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
        entry
    }

    /// Starts a run on this node and drives it until it ends, parks or is asked to stop.
    pub async fn start_run(
        &self,
        run: &RunId,
        session: Option<SessionId>,
        prompt: &str,
    ) -> Result<Stopped, FleetError> {
        let held = self.holder.acquire(run).await?;
        let now = self.clock().wall_ms();
        let facts = opening_facts(run, session.clone(), &self.agent, prompt, now);
        index::put(
            &self.store,
            &self.entry(run, session.clone(), Phase::Running),
        )
        .await?;
        self.logs.remove_log(run.as_str())?;
        let (mut log, _) = self.logs.open_log(run.as_str())?;
        log.append_all(&facts)?;
        let writer = RunWriter::create_as(
            &self.store,
            run.clone(),
            facts,
            held.epoch,
            SnapshotPolicy::default(),
        )
        .await?;
        let runner = self.runner(writer, log, held.clone());
        Ok(self.finish_drive(runner, held, session, None).await?.0)
    }

    /// Drives until the run is no longer runnable here, then records where it stands.
    async fn finish_drive(
        &self,
        mut runner: Runner,
        held: Held,
        session: Option<SessionId>,
        source: Option<(&RunId, &RecoveryRecord)>,
    ) -> Result<(Stopped, u64), FleetError> {
        let run = held.run.clone();
        let stopped = loop {
            match runner.drive().await? {
                // The host keeps going past the per-call step cap; each call commits first.
                Stopped::StepCap if source.is_none() => continue,
                other => break other,
            }
        };
        // Done driving: drop the runner (and its lease watcher) before releasing the lease.
        let generation = runner.writer.generation();
        drop(runner);
        match &stopped {
            Stopped::Finished(_) => {
                index::remove(&self.store, &run).await?;
                if let Some((source_run, _)) = source {
                    index::remove(&self.store, source_run).await?;
                }
                self.holder.release(&held).await?;
            }
            Stopped::Parked(_) | Stopped::WaitingForInput => {
                let index_run = source.map_or(&run, |(s, _)| s);
                let mut entry = self.entry(index_run, session, Phase::Parked);
                entry.holder = None;
                entry.recovery_id = source.map(|(_, r)| r.recovery_id.clone());
                index::put(&self.store, &entry).await?;
                self.holder.release(&held).await?;
            }
            Stopped::StepCap | Stopped::StopRequested => {
                // Yielded: release so another node resumes at once.
                self.holder.release(&held).await?;
            }
        }
        Ok((stopped, generation))
    }

    /// Continues an interrupted run under its recovery ID: takes the recovery run's lease,
    /// seeds it from the pinned source generation (or continues it if an earlier attempt
    /// already started it), checks the resume guard, and drives it.
    pub async fn execute_recovery(&self, record: &RecoveryRecord) -> Result<Stopped, FleetError> {
        let run = RunId::new(record.recovery_id.as_str());
        let held = self
            .holder
            .acquire_or_wait_from(
                &run,
                record.source_epoch + 1,
                self.holder.ttl() / 4,
                self.holder.ttl() * 3,
            )
            .await?;
        let policy = SnapshotPolicy::default();
        // Continue the recovery run if an earlier attempt started it, else seed it.
        let writer = match RunWriter::resume(&self.store, &run, held.epoch, policy).await {
            Ok(writer) => writer,
            Err(GenerationError::NotFound { .. }) => {
                let source = generation::load(
                    &self.store,
                    &record.source_run,
                    Some(record.source_generation),
                )
                .await?;
                if source.digest != record.source_digest {
                    return Err(FleetError::PinMismatch {
                        recovery: record.recovery_id.clone(),
                        source_run: record.source_run.clone(),
                        generation: record.source_generation,
                        pinned: record.source_digest.clone(),
                        found: source.digest,
                    });
                }
                match RunWriter::create_as(
                    &self.store,
                    run.clone(),
                    source.state.into_facts(),
                    held.epoch,
                    policy,
                )
                .await
                {
                    Ok(writer) => writer,
                    Err(GenerationError::AlreadyExists { .. }) => {
                        RunWriter::resume(&self.store, &run, held.epoch, policy).await?
                    }
                    Err(other) => return Err(other.into()),
                }
            }
            Err(other) => return Err(other.into()),
        };
        if let Some(meta) = writer.state().meta() {
            meta.fingerprint
                .check_resume(&self.agent.config.fingerprint(), record.force)
                .map_err(|source| FleetError::ResumeRefused {
                    run: run.clone(),
                    source,
                })?;
        }
        self.logs.remove_log(run.as_str())?;
        let (mut log, _) = self.logs.open_log(run.as_str())?;
        log.append_all(writer.state().facts())?;
        tracing::info!(recovery_id = %record.recovery_id, source_run = %record.source_run, epoch = held.epoch, "recovery started");
        let session = writer.state().session_id().cloned();
        let runner = self.runner(writer, log, held.clone());
        let (stopped, final_generation) = self
            .finish_drive(runner, held, session, Some((&record.source_run, record)))
            .await?;
        if let Stopped::Finished(terminal) = &stopped {
            let (current, etag) = recovery::read(&self.store, &record.recovery_id)
                .await?
                .ok_or_else(|| RecoveryError::Changed {
                    recovery_id: record.recovery_id.clone(),
                })?;
            recovery::update(&self.store, &current, &etag, |r| {
                r.state = RecoveryState::Finished;
                r.result = Some(RecoveryResult {
                    outcome: terminal.outcome,
                    message: terminal.message.clone(),
                    final_generation,
                });
            })
            .await?;
            tracing::info!(recovery_id = %record.recovery_id, outcome = %terminal.outcome, "recovery finished");
        }
        Ok(stopped)
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

/// Spawns a recovery of `source` under the host-chosen `recovery_id`: fences the source
/// (takes its lease over and writes a fence generation, so its old host can never commit
/// again), admits the recovery pinned to the source's newest generation, and marks the run
/// in the index so the fleet executes it. Idempotent: the same ID again returns the
/// existing recovery; another ID for the same source is refused naming the first.
pub async fn spawn_recovery(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    recovery_id: &RecoveryId,
    force: bool,
) -> Result<RecoveryRecord, FleetError> {
    if recovery::read(store, recovery_id).await?.is_none() {
        crate::coordinator::fence_source(store, holder, source)
            .await
            .map_err(|error| FleetError::Fence {
                run: source.clone(),
                message: error.to_string(),
            })?;
    }
    let admission = recovery::admit(store, source, recovery_id, force).await?;
    let fingerprint = generation::load(store, source, Some(admission.record.source_generation))
        .await?
        .state
        .meta()
        .map(|m| m.fingerprint.sha256())
        .unwrap_or_default();
    let mut entry = IndexEntry::new(
        source.clone(),
        None,
        Phase::Recovering,
        fingerprint,
        store.clock().wall_ms(),
    );
    entry.recovery_id = Some(recovery_id.clone());
    index::put(store, &entry).await?;
    Ok(admission.record)
}

/// Records a human's answer to a parked run (by its run ID: the recovery run if it has
/// one). Takes the lease briefly; the fleet then resumes the run.
pub async fn answer(
    store: &Store,
    holder: &Arc<Holder>,
    run: &RunId,
    answer: Answer,
) -> Result<(), FleetError> {
    let held = holder.acquire(run).await?;
    let result = async {
        let mut writer =
            RunWriter::resume(store, run, held.epoch, SnapshotPolicy::default()).await?;
        let parked = writer.state().parked().cloned();
        let body = match (&answer, parked) {
            (
                Answer::Confirm { call_id, approve },
                Some(crate::fold::Parked::Confirmation {
                    call_id: waiting, ..
                }),
            ) if *call_id == waiting => FactBody::ConfirmationAnswered(ConfirmationAnswered {
                call_id: call_id.clone(),
                approved: *approve,
                note: None,
            }),
            (
                Answer::Question { question_id, text },
                Some(crate::fold::Parked::Question {
                    question_id: waiting,
                    ..
                }),
            ) if *question_id == waiting => FactBody::QuestionAnswered(QuestionAnswered {
                question_id: question_id.clone(),
                text: text.clone(),
            }),
            (answer, _) => {
                return Err(FleetError::NotWaiting {
                    run: run.clone(),
                    what: answer.describe(),
                });
            }
        };
        let fact = Fact {
            seq: Seq(writer.state().last_seq().0 + 1),
            at_ms: store.clock().wall_ms(),
            body,
        };
        writer.commit(vec![fact]).await?;
        Ok(())
    }
    .await;
    holder.release(&held).await?;
    result
}

/// A human's answer.
#[derive(Clone, Debug)]
pub enum Answer {
    Confirm {
        call_id: crate::fact::CallId,
        approve: bool,
    },
    Question {
        question_id: crate::fact::QuestionId,
        text: String,
    },
}

impl Answer {
    fn describe(&self) -> String {
        match self {
            Answer::Confirm { call_id, .. } => format!("confirmation of call '{call_id}'"),
            Answer::Question { question_id, .. } => {
                format!("an answer to question '{question_id}'")
            }
        }
    }
}
