//! The one public error, whose kind tells a caller what to do next.
//!
//! Each module keeps its own precise error enum; this type wraps them so hosts can branch on
//! [`ErrorKind`] without matching every variant. It never loses the module error's message.

use crate::fact::DecodeError;
use crate::fingerprint::ResumeRefused;
use crate::fold::FoldError;
use crate::log::LogError;

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
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
