//! The one public error, whose kind tells a caller what to do next.
//!
//! Each module keeps its own precise error enum; this type wraps them so hosts can branch on
//! [`ErrorKind`] without matching every variant. It never loses the module error's message.

use crate::core::fact::DecodeError;
use crate::core::fingerprint::ResumeRefused;
use crate::core::fold::FoldError;
use crate::store::StoreError;
use crate::store::checkpoint::CheckpointError;
use crate::store::generation::GenerationError;
use crate::store::lease::LeaseError;
use crate::store::log::LogError;
use crate::store::recovery::RecoveryError;

/// What the caller does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Someone else changed the state first: refold and retry.
    Conflict,
    /// The store or disk is unavailable: back off and retry.
    Unavailable,
    /// Another writer owns the run now: stop, do not retry.
    Fenced,
    /// The request or configuration is wrong: fix the input.
    InvalidInput,
    /// Stored data is damaged or from a newer build: a human must look.
    Corrupt,
    /// A bug in this program.
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Fold(#[from] FoldError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    ResumeRefused(#[from] ResumeRefused),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Generation(#[from] GenerationError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

fn generation_kind(error: &GenerationError) -> ErrorKind {
    match error {
        GenerationError::Store(error) => store_kind(error),
        // A retired run has nothing left to write or resume: stop, as a fenced writer does.
        GenerationError::Fenced { .. } | GenerationError::Retired { .. } => ErrorKind::Fenced,
        GenerationError::Conflict { .. } | GenerationError::AlreadyExists { .. } => {
            ErrorKind::Conflict
        }
        GenerationError::NotFound { .. } => ErrorKind::InvalidInput,
        GenerationError::Corrupt { .. }
        | GenerationError::FutureFormat { .. }
        | GenerationError::ForeignRun { .. }
        | GenerationError::Discontinuous { .. }
        | GenerationError::Sealed { .. }
        | GenerationError::Fold { .. } => ErrorKind::Corrupt,
    }
}

fn store_kind(error: &StoreError) -> ErrorKind {
    match error {
        StoreError::AlreadyExists { .. } | StoreError::Changed { .. } => ErrorKind::Conflict,
        StoreError::Unavailable { .. } => ErrorKind::Unavailable,
        StoreError::Denied { .. }
        | StoreError::InvalidUrl { .. }
        | StoreError::ProbeFailed { .. } => ErrorKind::InvalidInput,
        StoreError::Failed { .. } => ErrorKind::Internal,
    }
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            // Facts that break the run's rules came from storage or a buggy writer.
            Error::Fold(_) => ErrorKind::Corrupt,
            Error::Log(error) => match error {
                LogError::Io { .. } | LogError::Poisoned { .. } => ErrorKind::Unavailable,
                LogError::Locked { .. } => ErrorKind::Conflict,
                LogError::Corrupt { .. } | LogError::FutureSchema { .. } => ErrorKind::Corrupt,
                LogError::FactTooLarge { .. } | LogError::NoStateDir => ErrorKind::InvalidInput,
                LogError::OutOfOrder { .. } => ErrorKind::Internal,
            },
            Error::Decode(DecodeError::TooLarge { .. }) => ErrorKind::InvalidInput,
            Error::Decode(_) => ErrorKind::Corrupt,
            Error::ResumeRefused(_) => ErrorKind::InvalidInput,
            Error::Store(error) => store_kind(error),
            Error::Generation(error) => generation_kind(error),
            Error::Lease(error) => match error {
                LeaseError::Store(error) => store_kind(error),
                LeaseError::HeldByOther { .. }
                | LeaseError::Contended { .. }
                | LeaseError::StillAlive { .. }
                | LeaseError::IdentityInUse { .. } => ErrorKind::Conflict,
                LeaseError::Exists { .. } => ErrorKind::InvalidInput,
                LeaseError::Lost { .. } => ErrorKind::Fenced,
                LeaseError::Object(_) => ErrorKind::Corrupt,
            },
            Error::Recovery(error) => match error {
                RecoveryError::Store(error) => store_kind(error),
                RecoveryError::Source { source, .. } => generation_kind(source),
                RecoveryError::IdInUse { .. }
                | RecoveryError::AlreadyRecovered { .. }
                | RecoveryError::NothingToRecover { .. }
                | RecoveryError::NeverStarted { .. } => ErrorKind::InvalidInput,
                RecoveryError::Changed { .. } => ErrorKind::Conflict,
                RecoveryError::Object(_) => ErrorKind::Corrupt,
            },
            Error::Checkpoint(error) => match error {
                CheckpointError::Store(error) => store_kind(error),
                CheckpointError::Object(_) => ErrorKind::Corrupt,
                CheckpointError::Refused { .. } => ErrorKind::InvalidInput,
                CheckpointError::Conflict { .. } => ErrorKind::Conflict,
            },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fact::RunId;

    // Proves the kinds tell callers what to do: stop when fenced, back off when unavailable,
    // refold on a conflict, and look when data is corrupt.
    #[test]
    fn kinds_say_what_to_do_next() {
        let fenced = Error::from(GenerationError::Fenced {
            run: RunId::new("r"),
            generation: 3,
            epoch: 1,
            by_epoch: 2,
        });
        assert_eq!(fenced.kind(), ErrorKind::Fenced);
        let unavailable = Error::from(StoreError::Unavailable {
            op: "create",
            key: "k".into(),
            attempts: 9,
            message: "503".into(),
        });
        assert_eq!(unavailable.kind(), ErrorKind::Unavailable);
        let conflict = Error::from(StoreError::Changed { key: "k".into() });
        assert_eq!(conflict.kind(), ErrorKind::Conflict);
        let corrupt = Error::from(GenerationError::Corrupt {
            key: "k".into(),
            reason: "bad".into(),
        });
        assert_eq!(corrupt.kind(), ErrorKind::Corrupt);
        let lost = Error::from(LeaseError::Lost {
            run: RunId::new("r"),
            ours: 1,
            holder: "w".into(),
            epoch: 2,
        });
        assert_eq!(lost.kind(), ErrorKind::Fenced);
    }
}
