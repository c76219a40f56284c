//! Time and identity sources, injected so a seeded test can replay a failure exactly.
//!
//! This is the one module allowed to read the system clock and generate random IDs (the ban
//! is in `clippy.toml`). Everything else takes a [`Clock`] and asks it. Lease expiry uses only
//! the monotonic reading, never a wall-clock comparison between machines.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of time and fresh IDs.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch, for recording in facts and objects (data only).
    fn wall_ms(&self) -> u64;
    /// A monotonic reading, only ever compared with readings of the same process.
    fn monotonic(&self) -> Duration;
    /// A fresh unique token (writer nonces, holder IDs).
    fn nonce(&self) -> String;
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    pub fn shared() -> Arc<dyn Clock> {
        Arc::new(SystemClock {
            start: Instant::now(),
        })
    }
}

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The one place the wall clock is read.
    fn wall_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }

    fn nonce(&self) -> String {
        uuid::Uuid::new_v4().simple().to_string()
    }
}

/// A clock that moves only when told to, with deterministic nonces, for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
    next_nonce: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Arc<Self> {
        Arc::new(ManualClock {
            now_ms: AtomicU64::new(start_ms),
            next_nonce: AtomicU64::new(1),
        })
    }

    pub fn advance(&self, by: Duration) {
        self.now_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn wall_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Duration {
        Duration::from_millis(self.now_ms.load(Ordering::SeqCst))
    }

    fn nonce(&self) -> String {
        format!("n{:016}", self.next_nonce.fetch_add(1, Ordering::SeqCst))
    }
}
