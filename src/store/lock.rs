//! The local directory backend's per-key lock, which makes its compare-and-swap, overwrite
//! and delete atomic across processes (object_store's `LocalFileSystem` has create-if-absent
//! but no compare-and-swap), and the directory fsync after a delete.

use super::*;

impl Store {
    /// Runs `section` under the local lock of `key`, in a task of its own. A caller that stops
    /// waiting (the per-attempt deadline in `retrying` drops its future) does not cancel the
    /// task, and dropping a `JoinHandle` does not either: the lock is released only after the
    /// section, and object_store's blocking write inside it, have finished. A caller that gave
    /// up while the task still waited for the lock never has its write done later: the task
    /// then skips the section.
    pub(super) async fn locked<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        section: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Store, String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.locked_then(op, key, false, section).await
    }

    /// [`Self::locked`]; with `forget`, a section that succeeded (the key was deleted) also
    /// removes the key's lock file, still holding it, so lock files do not outlive their
    /// keys (see [`local_lock`] for why that is safe).
    pub(super) async fn locked_then<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        forget: bool,
        section: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Store, String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let Backend::Local { root } = &self.backend else {
            return section(self.clone(), key.to_owned()).await;
        };
        let root = root.clone();
        let store = self.clone();
        let owned = key.to_owned();
        let abandoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Set when this future is dropped or finishes, whichever comes first.
        let _caller = Abandon(Arc::clone(&abandoned));
        tokio::spawn(async move {
            let lock = local_lock(&root, &owned).await?;
            if abandoned.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable {
                    op,
                    key: owned,
                    attempts: 1,
                    message: "the caller gave up while waiting for the local lock".into(),
                });
            }
            let done = section(store, owned).await;
            if forget && done.is_ok() {
                lock.forget().await;
            }
            done
        })
        .await
        .map_err(|error| StoreError::Failed {
            op,
            key: key.to_owned(),
            message: format!("the locked section stopped: {error}"),
        })?
    }

    /// Makes a local delete durable: fsyncs the directory that held `key` (object_store's
    /// `with_fsync` covers writes, not standalone deletes). A directory that does not exist
    /// holds nothing to sync.
    pub(super) async fn sync_parent_directory(&self, key: &str) -> Result<(), StoreError> {
        let Backend::Local { root } = &self.backend else {
            return Ok(());
        };
        // Local keys have no prefix, and layout keys use only characters that object_store
        // maps to the file system unchanged, so this is the directory it deleted from.
        let Some(directory) = root
            .join(self.path(key).as_ref())
            .parent()
            .map(|p| p.to_path_buf())
        else {
            return Ok(());
        };
        let syncs = Arc::clone(&self.local_directory_syncs);
        let synced = tokio::task::spawn_blocking(move || {
            match std::fs::File::open(&directory).and_then(|dir| dir.sync_all()) {
                Ok(()) => {
                    syncs.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(error) => Err(format!("fsync {}: {error}", directory.display())),
            }
        })
        .await
        .map_err(|error| error.to_string())
        .and_then(|inner| inner);
        synced.map_err(|message| StoreError::Failed {
            op: "delete",
            key: key.to_owned(),
            message,
        })
    }
}

/// Marks a locked section's caller as gone when dropped.
struct Abandon(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Abandon {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A held per-key lock: the open lock file (locked) and its path.
struct LocalLock {
    file: std::fs::File,
    path: std::path::PathBuf,
}

impl LocalLock {
    /// Removes the lock file while holding it, then releases it. Best effort: a lock file
    /// left behind only takes space. One unlink, done in place (see [`local_lock`]).
    async fn forget(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.file);
    }
}

/// Takes the per-key lock that makes compare-and-swap, overwrite and delete atomic on the
/// local directory backend (object_store's local backend has create-if-absent but no
/// compare-and-swap). An exclusive `flock` on `<root>/.rekindle-locks/<sha256(key)>` is held
/// for the duration; the kernel drops it if the process dies.
///
/// The lock is first tried in place, without blocking: a free lock is a few system calls of
/// microseconds, and a trip to tokio's blocking pool (a thread woken, the caller's task woken
/// again) costs more CPU than they do. Only a lock another holder has is waited for on the
/// blocking pool, where `flock` may block as long as that holder takes.
///
/// Architecture invariant: a lock file is removed only by its holder (a delete of its key,
/// [`LocalLock::forget`]), and a lock counts only if its file is still the one at the path
/// once locked: a waiter that was blocked on a file its holder then removed finds the path
/// gone or naming another file, lets go and locks the path anew. So two processes never hold
/// the lock of one key at once, and lock files stay bounded by the keys that exist.
async fn local_lock(root: &std::path::Path, key: &str) -> Result<LocalLock, StoreError> {
    let dir = root.join(".rekindle-locks");
    let path = dir.join(crate::core::digest::sha256_hex(key.as_bytes()));
    let failed = |message: String| StoreError::Failed {
        op: "lock",
        key: key.to_owned(),
        message,
    };
    if let Some(lock) = lock_path(&dir, &path, false).map_err(failed)? {
        return Ok(lock);
    }
    tokio::task::spawn_blocking(move || {
        lock_path(&dir, &path, true).map(|lock| lock.expect("a blocking lock is always taken"))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|inner| inner)
    .map_err(failed)
}

/// Locks the lock file at `path` (see [`local_lock`]); without `wait`, `None` if another
/// holder has it.
fn lock_path(
    dir: &std::path::Path,
    path: &std::path::Path,
    wait: bool,
) -> Result<Option<LocalLock>, String> {
    use std::os::unix::fs::MetadataExt;
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
    };
    loop {
        // The directory is made once, by the first lock that finds it missing.
        let file = match open() {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("create {}: {e}", dir.display()))?;
                open()
            }
            other => other,
        }
        .map_err(|e| format!("open {}: {e}", path.display()))?;
        if wait {
            file.lock()
                .map_err(|e| format!("lock {}: {e}", path.display()))?;
        } else {
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(format!("lock {}: {e}", path.display()));
                }
            }
        }
        let held = file
            .metadata()
            .map_err(|e| format!("stat {}: {e}", path.display()))?;
        match std::fs::metadata(path) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                return Ok(Some(LocalLock {
                    file,
                    path: path.to_owned(),
                }));
            }
            // Removed (or replaced) by the holder we waited for: try the path again.
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(format!("stat {}: {error}", path.display())),
        }
    }
}

#[cfg(test)]
mod lock_tests {
    use super::local_lock;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    // Proves a lock file removed by its holder never lets two holders in at once: one waiter
    // blocked on the removed file and one newcomer on the new file take turns, in whichever
    // order they come.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_removed_lock_file_keeps_the_lock_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let holders = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let first = local_lock(&root, "k").await.unwrap();
        let take = |root: std::path::PathBuf| {
            let (holders, most) = (Arc::clone(&holders), Arc::clone(&most));
            tokio::spawn(async move {
                let lock = local_lock(&root, "k").await.unwrap();
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                crate::clock::sleep(Duration::from_millis(100)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                lock.forget().await;
            })
        };
        let waiter = take(root.clone());
        // The waiter opens the file and blocks on it; then the holder removes it.
        crate::clock::sleep(Duration::from_millis(200)).await;
        first.forget().await;
        let newcomer = take(root.clone());
        waiter.await.unwrap();
        newcomer.await.unwrap();
        assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
        let left = std::fs::read_dir(root.join(".rekindle-locks"))
            .unwrap()
            .count();
        assert_eq!(left, 0, "every lock file was removed by its last holder");
    }
}
