//! The one public error, whose kind tells a caller what to do next.
//!
//! Each module keeps its own precise `thiserror` enum, and its own functions return it. The
//! library's entry points (`fleet::Node::start_run`, `fleet::spawn_recovery`,
//! `fleet::answer_run`, `fleet::admission::admit`, `coordinator::run`, `worker::run`,
//! `workflow::run`) return this [`Error`] instead (the tools over the fleet, `bench`, `soak` and `demo`, return their own errors, which wrap it), and every module error
//! converts into it with `?`, so a host branches on [`Error::kind`] without matching every
//! variant — as `object_store` and SlateDB do.
//!
//! The precise error stays reachable: each variant holds one module's error, and a
//! conversion unwraps the pass-through variants of the enums that only collect others
//! (`RunError`, `IndexError`, `LifecycleError::Lease`, ...), so an error sits in the variant of
//! the module that made it however it travelled: a lost lease is
//! `Error::Lease(LeaseError::Lost { .. })` whether the runner, the lifecycle or the fleet
//! passed it up.
//!
//! Messages are said once. An error that adds context to another (`RecoveryError::Source`,
//! `LifecycleError::Fence`, `GcError::Retire`, ...) writes the inner message into its own and
//! keeps the inner error as a field, not as its `source()`: `{:#}` in the binaries (anyhow)
//! prints every `source()` after the message, which would repeat it. Where the inner message
//! already names the run, the outer one does not name it again.
//!
//! This module sits above `core`, `store` and `host`: it names their errors and they never
//! import it (`tests/layers.rs` checks), so no error enum depends on the public one.

use crate::core::fact::DecodeError;
use crate::core::fingerprint::ResumeRefused;
use crate::core::fold::FoldError;
use crate::core::layout::ObjectError;
use crate::core::lifecycle::Refused;
use crate::fleet::FleetError;
use crate::fleet::lifecycle::LifecycleError;
use crate::fleet::removal::RemovalError;
use crate::fleet::runner::RunError;
use crate::fleet::workflow::WorkflowError;
use crate::host::config::ConfigError;
use crate::host::model::ModelError;
use crate::store::StoreError;
use crate::store::checkpoint::CheckpointError;
use crate::store::gc::GcError;
use crate::store::generation::GenerationError;
use crate::store::index::IndexError;
use crate::store::lease::LeaseError;
use crate::store::log::LogError;
use crate::store::recovery::RecoveryError;
use crate::store::seal::SealError;
use crate::store::tombstone::TombstoneError;

/// What the caller does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Someone else changed the state first (a lost race): reread and retry.
    Conflict,
    /// The store, the disk or the model endpoint is unavailable: back off and retry.
    Unavailable,
    /// Another writer owns the run now: stop, do not retry.
    Fenced,
    /// The named run, recovery or object does not exist: check the ID.
    NotFound,
    /// A well-formed request that the current state forbids (the run ended, was retired, is
    /// recovered under another ID, its holder is alive, its configuration changed, the event
    /// does not apply in the recovery's state): retrying it as it is fails again; change the
    /// request (another ID, `--force`, `--takeover`) or accept the state.
    Refused,
    /// The request or the configuration is wrong: fix the input.
    InvalidInput,
    /// Stored data is damaged or from a newer build: a human must look.
    Corrupt,
    /// A bug in this program.
    Internal,
}

/// The library's error: one module's precise error, with the [`ErrorKind`] it implies.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An encoded fact is over the size limit, from a newer schema, or malformed.
    #[error(transparent)]
    Decode(DecodeError),
    /// A fact breaks the run's rules: out of sequence, after the end, or answering no call.
    #[error(transparent)]
    Fold(FoldError),
    /// A stored object could not be read as the kind expected at its key.
    #[error(transparent)]
    Object(ObjectError),
    /// The run's configuration changed since it started, and the resume did not force it.
    #[error(transparent)]
    ResumeRefused(ResumeRefused),
    /// The lifecycle's rules refused an event in the recovery's current state.
    #[error(transparent)]
    EventRefused(Refused),
    /// A storage request lost a race, was denied, or failed after its retries; or the store
    /// URL or startup probe was bad.
    #[error(transparent)]
    Store(StoreError),
    /// Committing or loading a run's generations failed: fenced by a newer epoch, the run
    /// retired, a slot taken, or the chain missing, sealed with an unknown key or damaged.
    #[error(transparent)]
    Generation(GenerationError),
    /// A run's lease is held by another holder, was lost to a newer epoch, kept changing, or
    /// already exists for a new run; or a holder's identity is in use by a live process.
    #[error(transparent)]
    Lease(LeaseError),
    /// A recovery could not be admitted: its ID is taken, the run is already recovered, never
    /// started or has ended, or the record changed under the caller.
    #[error(transparent)]
    Recovery(RecoveryError),
    /// A session, loop or workflow checkpoint was refused on load or changed under its saver.
    #[error(transparent)]
    Checkpoint(CheckpointError),
    /// The tombstone under a run's key names another run: the bucket is damaged.
    #[error(transparent)]
    Tombstone(TombstoneError),
    /// Retention could not retire a run whose generations it was about to delete.
    #[error(transparent)]
    Gc(GcError),
    /// The local fact log could not be read or appended: disk I/O, another writer's lock,
    /// damage, an oversized fact or no state directory.
    #[error(transparent)]
    Log(LogError),
    /// A generation's payload could not be sealed or opened: a bad or unknown key, or damage.
    #[error(transparent)]
    Seal(SealError),
    /// The host's configuration file could not be read or is invalid.
    #[error(transparent)]
    Config(ConfigError),
    /// The model endpoint failed after its retries or did not answer with a chat completion,
    /// or the model section of the configuration is incomplete.
    #[error(transparent)]
    Model(ModelError),
    /// A lifecycle event found no recovery record or kept racing other writers, or admission
    /// could not fence the source run or found its holder alive.
    #[error(transparent)]
    Lifecycle(LifecycleError),
    /// The fleet refused to start, resume or answer a run in its current state, or a
    /// recovery's pinned source generation no longer matches its digest.
    #[error(transparent)]
    Fleet(FleetError),
    /// A workflow definition is invalid, or one of its steps was dead-lettered.
    #[error(transparent)]
    Workflow(WorkflowError),
    /// A run may not be retired now: it does not exist, is leased, or is being recovered.
    #[error(transparent)]
    Removal(RemovalError),
}

/// A result whose error is the library's [`Error`] unless another is named.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// What the caller does next.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Decode(error) => decode_kind(error),
            // Facts that break the run's rules came from storage or a buggy writer.
            Error::Fold(_) | Error::Object(_) => ErrorKind::Corrupt,
            Error::ResumeRefused(_) | Error::EventRefused(_) => ErrorKind::Refused,
            Error::Store(error) => store_kind(error),
            Error::Generation(error) => generation_kind(error),
            Error::Lease(error) => lease_kind(error),
            Error::Recovery(error) => recovery_kind(error),
            Error::Checkpoint(error) => checkpoint_kind(error),
            Error::Tombstone(error) => tombstone_kind(error),
            Error::Gc(error) => gc_kind(error),
            Error::Log(error) => log_kind(error),
            Error::Seal(error) => seal_kind(error),
            Error::Config(_) => ErrorKind::InvalidInput,
            Error::Model(error) => model_kind(error),
            Error::Lifecycle(error) => lifecycle_kind(error),
            Error::Fleet(error) => fleet_kind(error),
            Error::Workflow(error) => workflow_kind(error),
            Error::Removal(error) => removal_kind(error),
        }
    }
}

fn decode_kind(error: &DecodeError) -> ErrorKind {
    match error {
        DecodeError::TooLarge { .. } => ErrorKind::InvalidInput,
        DecodeError::FutureSchema { .. } | DecodeError::Invalid { .. } => ErrorKind::Corrupt,
    }
}

fn store_kind(error: &StoreError) -> ErrorKind {
    match error {
        StoreError::AlreadyExists { .. }
        | StoreError::Unconfirmed { .. }
        | StoreError::Changed { .. } => ErrorKind::Conflict,
        StoreError::Unavailable { .. } => ErrorKind::Unavailable,
        StoreError::Denied { .. }
        | StoreError::InvalidUrl { .. }
        | StoreError::NoStore { .. }
        | StoreError::ProbeFailed { .. } => ErrorKind::InvalidInput,
        StoreError::Failed { .. } => ErrorKind::Internal,
        StoreError::Object(_) => ErrorKind::Corrupt,
    }
}

fn generation_kind(error: &GenerationError) -> ErrorKind {
    match error {
        GenerationError::Store(error) => store_kind(error),
        GenerationError::Fenced { .. } => ErrorKind::Fenced,
        // Nothing is left to write or resume, and its ID is never reused; no other holder
        // owns it, so it is not `Fenced` (a worker hands a fenced attempt back to be offered
        // again, which for a retired run would never end).
        GenerationError::Retired { .. } | GenerationError::Interrupted { .. } => ErrorKind::Refused,
        GenerationError::Conflict { .. } | GenerationError::AlreadyExists { .. } => {
            ErrorKind::Conflict
        }
        GenerationError::NotFound { .. } => ErrorKind::NotFound,
        GenerationError::Sealed { error, .. } => seal_kind(error),
        GenerationError::Tombstone(error) => tombstone_kind(error),
        GenerationError::Corrupt { .. }
        | GenerationError::FutureFormat { .. }
        | GenerationError::ForeignRun { .. }
        | GenerationError::Discontinuous { .. }
        | GenerationError::Fold { .. } => ErrorKind::Corrupt,
    }
}

fn lease_kind(error: &LeaseError) -> ErrorKind {
    match error {
        LeaseError::Store(error) => store_kind(error),
        LeaseError::HeldByOther { .. }
        | LeaseError::Contended { .. }
        | LeaseError::StillAlive { .. }
        | LeaseError::ChangedSinceJudged { .. } => ErrorKind::Conflict,
        LeaseError::Exists { .. }
        | LeaseError::IdentityInUse { .. }
        | LeaseError::Retired { .. } => ErrorKind::Refused,
        LeaseError::Lost { .. } => ErrorKind::Fenced,
        LeaseError::Object(_) => ErrorKind::Corrupt,
    }
}

fn recovery_kind(error: &RecoveryError) -> ErrorKind {
    match error {
        RecoveryError::Store(error) => store_kind(error),
        RecoveryError::Source { error, .. } => generation_kind(error),
        RecoveryError::IdInUse { .. }
        | RecoveryError::IdIsARun { .. }
        | RecoveryError::AlreadyRecovered { .. }
        | RecoveryError::NothingToRecover { .. }
        | RecoveryError::NeverStarted { .. } => ErrorKind::Refused,
        RecoveryError::NoSuchRun { .. } => ErrorKind::NotFound,
        RecoveryError::Changed { .. } => ErrorKind::Conflict,
        RecoveryError::Object(_) => ErrorKind::Corrupt,
    }
}

fn checkpoint_kind(error: &CheckpointError) -> ErrorKind {
    match error {
        CheckpointError::Store(error) => store_kind(error),
        CheckpointError::Object(_) => ErrorKind::Corrupt,
        CheckpointError::Refused { .. } => ErrorKind::Refused,
        CheckpointError::Conflict { .. } => ErrorKind::Conflict,
    }
}

fn index_kind(error: &IndexError) -> ErrorKind {
    match error {
        IndexError::Store(error) => store_kind(error),
        IndexError::Object(_) => ErrorKind::Corrupt,
    }
}

fn tombstone_kind(error: &TombstoneError) -> ErrorKind {
    match error {
        TombstoneError::Store(error) => store_kind(error),
        TombstoneError::Object(_) | TombstoneError::ForeignRun { .. } => ErrorKind::Corrupt,
    }
}

fn gc_kind(error: &GcError) -> ErrorKind {
    match error {
        GcError::Store(error) => store_kind(error),
        GcError::Tombstone(error) => tombstone_kind(error),
        GcError::Lease(error) => lease_kind(error),
        GcError::Retire { error, .. } => generation_kind(error),
    }
}

fn log_kind(error: &LogError) -> ErrorKind {
    match error {
        LogError::Io { .. } | LogError::Poisoned { .. } => ErrorKind::Unavailable,
        LogError::Locked { .. } => ErrorKind::Conflict,
        LogError::Corrupt { .. } | LogError::FutureSchema { .. } | LogError::Fold { .. } => {
            ErrorKind::Corrupt
        }
        LogError::FactTooLarge { .. } | LogError::NoStateDir => ErrorKind::InvalidInput,
        LogError::OutOfOrder { .. } => ErrorKind::Internal,
    }
}

fn seal_kind(error: &SealError) -> ErrorKind {
    match error {
        // A key that is malformed or not configured: fix the configuration.
        SealError::BadKey { .. } | SealError::UnknownKey { .. } => ErrorKind::InvalidInput,
        SealError::Damaged { .. } => ErrorKind::Corrupt,
    }
}

fn model_kind(error: &ModelError) -> ErrorKind {
    match error {
        // Network failures, 429 and 5xx, after the client's own retries.
        ModelError::Endpoint { .. } => ErrorKind::Unavailable,
        // Another 4xx, or not a chat completion: the endpoint, model or key is wrong.
        ModelError::Garbage { .. } | ModelError::Config(_) => ErrorKind::InvalidInput,
    }
}

fn lifecycle_kind(error: &LifecycleError) -> ErrorKind {
    match error {
        LifecycleError::Refused(_) => ErrorKind::Refused,
        LifecycleError::Recovery(error) => recovery_kind(error),
        LifecycleError::Index(error) => index_kind(error),
        LifecycleError::Lease(error) => lease_kind(error),
        LifecycleError::Generation(error) => generation_kind(error),
        LifecycleError::Missing { .. } => ErrorKind::NotFound,
        LifecycleError::Contended { .. } => ErrorKind::Conflict,
        LifecycleError::Fence { error, .. } => lifecycle_kind(error),
        LifecycleError::HolderAlive { .. } => ErrorKind::Refused,
    }
}

fn fleet_kind(error: &FleetError) -> ErrorKind {
    match error {
        FleetError::ResumeRefused { .. }
        | FleetError::BeingRecovered { .. }
        | FleetError::NotWaiting { .. }
        | FleetError::IdReserved { .. }
        | FleetError::InDoubt { .. }
        | FleetError::HandedBack { .. } => ErrorKind::Refused,
        FleetError::NoSuchRun { .. } => ErrorKind::NotFound,
        FleetError::PinMismatch { .. } => ErrorKind::Corrupt,
        FleetError::FactRefused { .. } => ErrorKind::InvalidInput,
    }
}

fn workflow_kind(error: &WorkflowError) -> ErrorKind {
    match error {
        WorkflowError::Invalid { .. } | WorkflowError::StepChanged { .. } => {
            ErrorKind::InvalidInput
        }
        // Running the workflow again waits for the same dead-lettered recovery.
        WorkflowError::StepDead { .. } => ErrorKind::Refused,
    }
}

fn removal_kind(error: &RemovalError) -> ErrorKind {
    match error {
        RemovalError::NoSuchRun { .. } => ErrorKind::NotFound,
        RemovalError::NotARun { .. } => ErrorKind::InvalidInput,
        RemovalError::Leased { .. }
        | RemovalError::HolderAlive { .. }
        | RemovalError::BeingRecovered { .. } => ErrorKind::Refused,
    }
}

/// Conversions that keep the module error as it is.
macro_rules! from_module_error {
    ($($error:ty => $variant:ident),* $(,)?) => {
        $(impl From<$error> for Error {
            fn from(error: $error) -> Self {
                Error::$variant(error)
            }
        })*
    };
}

from_module_error! {
    DecodeError => Decode,
    FoldError => Fold,
    ObjectError => Object,
    ResumeRefused => ResumeRefused,
    Refused => EventRefused,
    StoreError => Store,
    LogError => Log,
    SealError => Seal,
    ConfigError => Config,
    ModelError => Model,
    FleetError => Fleet,
    WorkflowError => Workflow,
    RemovalError => Removal,
}

// Conversions that unwrap pass-through variants, so each error lands in the variant of the
// module that made it.

impl From<GenerationError> for Error {
    fn from(error: GenerationError) -> Self {
        match error {
            GenerationError::Store(error) => error.into(),
            GenerationError::Tombstone(error) => error.into(),
            error => Error::Generation(error),
        }
    }
}

impl From<LeaseError> for Error {
    fn from(error: LeaseError) -> Self {
        match error {
            LeaseError::Store(error) => error.into(),
            LeaseError::Object(error) => error.into(),
            error => Error::Lease(error),
        }
    }
}

impl From<RecoveryError> for Error {
    fn from(error: RecoveryError) -> Self {
        match error {
            RecoveryError::Store(error) => error.into(),
            RecoveryError::Object(error) => error.into(),
            error => Error::Recovery(error),
        }
    }
}

impl From<CheckpointError> for Error {
    fn from(error: CheckpointError) -> Self {
        match error {
            CheckpointError::Store(error) => error.into(),
            CheckpointError::Object(error) => error.into(),
            error => Error::Checkpoint(error),
        }
    }
}

impl From<IndexError> for Error {
    fn from(error: IndexError) -> Self {
        match error {
            IndexError::Store(error) => error.into(),
            IndexError::Object(error) => error.into(),
        }
    }
}

impl From<TombstoneError> for Error {
    fn from(error: TombstoneError) -> Self {
        match error {
            TombstoneError::Store(error) => error.into(),
            TombstoneError::Object(error) => error.into(),
            error => Error::Tombstone(error),
        }
    }
}

impl From<GcError> for Error {
    fn from(error: GcError) -> Self {
        match error {
            GcError::Store(error) => error.into(),
            GcError::Tombstone(error) => error.into(),
            GcError::Lease(error) => error.into(),
            error => Error::Gc(error),
        }
    }
}

impl From<RunError> for Error {
    fn from(error: RunError) -> Self {
        match error {
            RunError::Log(error) => error.into(),
            RunError::Generation(error) => error.into(),
            RunError::Model(error) => error.into(),
            RunError::Lease(error) => error.into(),
        }
    }
}

impl From<LifecycleError> for Error {
    fn from(error: LifecycleError) -> Self {
        match error {
            LifecycleError::Refused(error) => error.into(),
            LifecycleError::Recovery(error) => error.into(),
            LifecycleError::Index(error) => error.into(),
            LifecycleError::Lease(error) => error.into(),
            LifecycleError::Generation(error) => error.into(),
            error => Error::Lifecycle(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::epoch::Epoch;
    use crate::core::fact::{Outcome, RecoveryId, RunId, Seq};
    use crate::core::record::RecoveryState;
    use std::path::PathBuf;

    fn run() -> RunId {
        RunId::new("r-1")
    }

    fn store_error() -> StoreError {
        StoreError::Unavailable {
            op: "get",
            key: "runs/ab/r-1/lease".into(),
            attempts: 9,
            message: "503".into(),
        }
    }

    fn fenced() -> GenerationError {
        GenerationError::Fenced {
            run: run(),
            generation: 7,
            epoch: Epoch(1),
            by_epoch: Epoch(2),
        }
    }

    fn lost() -> LeaseError {
        LeaseError::Lost {
            run: run(),
            ours: Epoch(1),
            holder: "w".into(),
            epoch: Epoch(2),
        }
    }

    fn object_error() -> ObjectError {
        ObjectError::Corrupt {
            key: "k".into(),
            reason: "bad".into(),
        }
    }

    fn refused() -> Refused {
        Refused {
            recovery_id: RecoveryId::new("rec"),
            state: RecoveryState::Finished,
            assigned: None,
            event: "Start",
            reason: "it is finished",
        }
    }

    /// The message as the binaries print it (`{:#}` of anyhow): the error, then each source.
    fn rendered(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }

    // Proves every module error family maps onto the kind that says what the caller does
    // next: stop when fenced, back off when unavailable, reread on a conflict, check the ID
    // when not found, change the request when refused, fix the input, look when corrupt.
    #[test]
    fn every_module_error_has_the_kind_of_its_next_action() {
        let path = PathBuf::from("/logs/r-1.jsonl");
        let cases: Vec<(&str, Error, ErrorKind)> = vec![
            // core
            (
                "decode: too large",
                DecodeError::TooLarge { size: 9, limit: 1 }.into(),
                ErrorKind::InvalidInput,
            ),
            (
                "decode: newer schema",
                DecodeError::FutureSchema {
                    found: 9,
                    supported: 1,
                }
                .into(),
                ErrorKind::Corrupt,
            ),
            (
                "fold",
                FoldError::MetaNotFirst { seq: Seq(2) }.into(),
                ErrorKind::Corrupt,
            ),
            ("object", object_error().into(), ErrorKind::Corrupt),
            (
                "resume refused",
                ResumeRefused {
                    changes: vec!["model".into()],
                }
                .into(),
                ErrorKind::Refused,
            ),
            ("event refused", refused().into(), ErrorKind::Refused),
            // store
            (
                "store: unavailable",
                store_error().into(),
                ErrorKind::Unavailable,
            ),
            (
                "store: changed",
                StoreError::Changed { key: "k".into() }.into(),
                ErrorKind::Conflict,
            ),
            (
                "store: bad URL",
                StoreError::InvalidUrl {
                    url: "x".into(),
                    reason: "no scheme".into(),
                }
                .into(),
                ErrorKind::InvalidInput,
            ),
            ("generation: fenced", fenced().into(), ErrorKind::Fenced),
            (
                "generation: conflict",
                GenerationError::Conflict {
                    run: run(),
                    generation: 7,
                    epoch: Epoch(2),
                    by_epoch: Epoch(2),
                }
                .into(),
                ErrorKind::Conflict,
            ),
            (
                "generation: not found",
                GenerationError::NotFound { run: run() }.into(),
                ErrorKind::NotFound,
            ),
            (
                "generation: retired",
                GenerationError::Retired {
                    run: run(),
                    outcome: None,
                    final_generation: 3,
                }
                .into(),
                ErrorKind::Refused,
            ),
            (
                "generation: corrupt",
                GenerationError::Corrupt {
                    key: "k".into(),
                    reason: "bad".into(),
                }
                .into(),
                ErrorKind::Corrupt,
            ),
            (
                "generation: sealed with an unknown key",
                GenerationError::Sealed {
                    key: "k".into(),
                    error: SealError::UnknownKey {
                        key_id: "old".into(),
                    },
                }
                .into(),
                ErrorKind::InvalidInput,
            ),
            ("lease: lost", lost().into(), ErrorKind::Fenced),
            (
                "lease: held by another",
                LeaseError::HeldByOther {
                    run: run(),
                    holder: "h".into(),
                    epoch: Epoch(1),
                }
                .into(),
                ErrorKind::Conflict,
            ),
            (
                "lease: run exists",
                LeaseError::Exists { run: run() }.into(),
                ErrorKind::Refused,
            ),
            (
                "lease: run retired",
                LeaseError::Retired {
                    run: run(),
                    epoch: Epoch(4),
                }
                .into(),
                ErrorKind::Refused,
            ),
            (
                "lease: changed since judged",
                LeaseError::ChangedSinceJudged {
                    run: run(),
                    holder: "h".into(),
                    epoch: Epoch(2),
                }
                .into(),
                ErrorKind::Conflict,
            ),
            (
                "recovery: already recovered",
                RecoveryError::AlreadyRecovered {
                    source_run: run(),
                    existing: RecoveryId::new("rec"),
                }
                .into(),
                ErrorKind::Refused,
            ),
            (
                "recovery: source not found",
                RecoveryError::Source {
                    source_run: run(),
                    error: GenerationError::NotFound { run: run() },
                }
                .into(),
                ErrorKind::NotFound,
            ),
            (
                "recovery: changed",
                RecoveryError::Changed {
                    recovery_id: RecoveryId::new("rec"),
                }
                .into(),
                ErrorKind::Conflict,
            ),
            (
                "checkpoint: refused",
                CheckpointError::Refused {
                    checkpoint: "c".into(),
                    reason: "newer".into(),
                }
                .into(),
                ErrorKind::Refused,
            ),
            (
                "index: store",
                IndexError::Store(store_error()).into(),
                ErrorKind::Unavailable,
            ),
            (
                "index: object",
                IndexError::Object(object_error()).into(),
                ErrorKind::Corrupt,
            ),
            (
                "tombstone: foreign run",
                TombstoneError::ForeignRun {
                    key: "k".into(),
                    expected: run(),
                    found: RunId::new("other"),
                }
                .into(),
                ErrorKind::Corrupt,
            ),
            (
                "gc: retire a retired run",
                GcError::Retire {
                    run: run(),
                    error: GenerationError::Retired {
                        run: run(),
                        outcome: Some(Outcome::Completed),
                        final_generation: 3,
                    },
                }
                .into(),
                ErrorKind::Refused,
            ),
            (
                "gc: store",
                GcError::Store(store_error()).into(),
                ErrorKind::Unavailable,
            ),
            (
                "log: locked",
                LogError::Locked { path: path.clone() }.into(),
                ErrorKind::Conflict,
            ),
            (
                "log: io",
                LogError::Io {
                    path: path.clone(),
                    action: "open",
                    error: std::io::Error::other("disk gone"),
                }
                .into(),
                ErrorKind::Unavailable,
            ),
            (
                "log: fold",
                LogError::Fold {
                    path: path.clone(),
                    error: FoldError::MetaNotFirst { seq: Seq(2) },
                }
                .into(),
                ErrorKind::Corrupt,
            ),
            (
                "log: no state directory",
                LogError::NoStateDir.into(),
                ErrorKind::InvalidInput,
            ),
            (
                "seal: damaged",
                SealError::Damaged {
                    key_id: "k".into(),
                    reason: "tag".into(),
                }
                .into(),
                ErrorKind::Corrupt,
            ),
            (
                "seal: bad key",
                SealError::BadKey {
                    origin: "REKINDLE_SEAL_KEY".into(),
                    reason: "short".into(),
                }
                .into(),
                ErrorKind::InvalidInput,
            ),
            // host
            (
                "config",
                ConfigError::Invalid {
                    path: "rekindle.toml".into(),
                    message: "no model".into(),
                }
                .into(),
                ErrorKind::InvalidInput,
            ),
            (
                "model: endpoint",
                ModelError::Endpoint {
                    url: "http://m".into(),
                    message: "HTTP 503".into(),
                }
                .into(),
                ErrorKind::Unavailable,
            ),
            (
                "model: not a completion",
                ModelError::Garbage {
                    url: "http://m".into(),
                    message: "HTTP 401".into(),
                }
                .into(),
                ErrorKind::InvalidInput,
            ),
            // fleet
            (
                "run: fenced commit",
                RunError::Generation(fenced()).into(),
                ErrorKind::Fenced,
            ),
            (
                "run: lost lease",
                RunError::Lease(lost()).into(),
                ErrorKind::Fenced,
            ),
            (
                "run: model",
                RunError::Model(ModelError::Config("no script".into())).into(),
                ErrorKind::InvalidInput,
            ),
            (
                "lifecycle: refused",
                LifecycleError::Refused(refused()).into(),
                ErrorKind::Refused,
            ),
            (
                "lifecycle: missing",
                LifecycleError::Missing {
                    recovery_id: RecoveryId::new("rec"),
                }
                .into(),
                ErrorKind::NotFound,
            ),
            (
                "lifecycle: contended",
                LifecycleError::Contended {
                    recovery_id: RecoveryId::new("rec"),
                }
                .into(),
                ErrorKind::Conflict,
            ),
            (
                "lifecycle: holder alive",
                LifecycleError::HolderAlive {
                    run: run(),
                    holder: "h".into(),
                    epoch: Epoch(1),
                    ttl_ms: 30_000,
                }
                .into(),
                ErrorKind::Refused,
            ),
            (
                "lifecycle: fence fenced",
                LifecycleError::Fence {
                    run: run(),
                    error: Box::new(LifecycleError::Generation(fenced())),
                }
                .into(),
                ErrorKind::Fenced,
            ),
            (
                "fleet: pin mismatch",
                FleetError::PinMismatch {
                    recovery: RecoveryId::new("rec"),
                    source_run: run(),
                    generation: 3,
                    pinned: "a".into(),
                    found: "b".into(),
                }
                .into(),
                ErrorKind::Corrupt,
            ),
            (
                "fleet: being recovered",
                FleetError::BeingRecovered {
                    run: run(),
                    recovery: RecoveryId::new("rec"),
                }
                .into(),
                ErrorKind::Refused,
            ),
            (
                "workflow: invalid",
                WorkflowError::Invalid {
                    workflow: "w".into(),
                    message: "step 'a' appears twice".into(),
                }
                .into(),
                ErrorKind::InvalidInput,
            ),
            (
                "workflow: step dead",
                WorkflowError::StepDead {
                    workflow: "w".into(),
                    step: "a".into(),
                    error: "boom".into(),
                }
                .into(),
                ErrorKind::Refused,
            ),
        ];
        for (name, error, kind) in cases {
            assert_eq!(error.kind(), kind, "{name}: {error}");
        }
    }

    // Proves an error keeps the variant of the module that made it, however it travelled:
    // a fenced commit passed up by the runner is `Error::Generation`, a lost lease passed up by
    // the lifecycle is `Error::Lease`, a store error inside an index error is `Error::Store`.
    #[test]
    fn an_error_lands_in_the_variant_of_its_module() {
        assert!(matches!(
            Error::from(RunError::Generation(fenced())),
            Error::Generation(GenerationError::Fenced { .. })
        ));
        assert!(matches!(
            Error::from(LifecycleError::Lease(lost())),
            Error::Lease(LeaseError::Lost { .. })
        ));
        assert!(matches!(
            Error::from(IndexError::Store(store_error())),
            Error::Store(StoreError::Unavailable { .. })
        ));
        assert!(matches!(
            Error::from(LifecycleError::Refused(refused())),
            Error::EventRefused(_)
        ));
    }

    // Proves a message says its run once, also as the binaries print it with every source:
    // errors that add context to an error naming the run do not name it again, and keep the
    // inner error out of `source()` (anyhow's `{:#}` would print it a second time).
    #[test]
    fn a_message_names_its_run_once() {
        let cases: Vec<Error> = vec![
            RunError::Generation(fenced()).into(),
            LifecycleError::Fence {
                run: run(),
                error: Box::new(LifecycleError::Generation(fenced())),
            }
            .into(),
            LifecycleError::Fence {
                run: run(),
                error: Box::new(LifecycleError::Lease(lost())),
            }
            .into(),
            RecoveryError::Source {
                source_run: run(),
                error: GenerationError::NotFound { run: run() },
            }
            .into(),
            RecoveryError::Source {
                source_run: run(),
                error: fenced(),
            }
            .into(),
            GcError::Retire {
                run: run(),
                error: GenerationError::Retired {
                    run: run(),
                    outcome: Some(Outcome::Completed),
                    final_generation: 3,
                },
            }
            .into(),
            FleetError::ResumeRefused {
                run: run(),
                error: ResumeRefused {
                    changes: vec!["model".into()],
                },
            }
            .into(),
        ];
        for error in cases {
            let text = rendered(&error);
            assert_eq!(text.matches("\"r-1\"").count(), 1, "{text}");
        }
        let fenced = rendered(&Error::from(RunError::Generation(fenced())));
        assert_eq!(
            fenced,
            "run \"r-1\": fenced at generation 7: it was written by epoch 2, this writer holds epoch 1; another holder owns the run now"
        );
    }

    // Proves an error that carries another's message prints that message once, not again as
    // its source: a fold error in a generation, an I/O error in a fact log.
    #[test]
    fn an_inner_message_is_printed_once() {
        let fold = FoldError::MetaNotFirst { seq: Seq(2) };
        let cases: Vec<(Error, String)> = vec![
            (
                GenerationError::Fold {
                    key: "runs/ab/r-1/gen/7".into(),
                    error: fold.clone(),
                }
                .into(),
                fold.to_string(),
            ),
            (
                LogError::Io {
                    path: "/logs/r-1.jsonl".into(),
                    action: "open",
                    error: std::io::Error::other("disk gone"),
                }
                .into(),
                "disk gone".into(),
            ),
            (
                LogError::Fold {
                    path: "/logs/r-1.jsonl".into(),
                    error: fold.clone(),
                }
                .into(),
                fold.to_string(),
            ),
        ];
        for (error, inner) in cases {
            let text = rendered(&error);
            assert_eq!(text.matches(&inner).count(), 1, "{text}");
        }
    }
}
