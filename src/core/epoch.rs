//! The lease epoch: a number that only grows, one per holding of a run's lease. Every
//! generation carries its writer's epoch, so a writer with a lower one is fenced.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A lease epoch. Serialises as a bare number, as it always has in the bucket.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch before any lease was held: every real holding is above it.
    pub const ZERO: Epoch = Epoch(0);

    /// The epoch of the next holding.
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }

    /// The number, for the bucket's keys, metrics and a tool's `REKINDLE_EPOCH`.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
