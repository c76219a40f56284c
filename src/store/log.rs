//! The local fact log: one append-only JSONL file per run on a worker's or host's disk.
//!
//! This module owns the file format on disk, the single-writer lock (an advisory `flock` the kernel drops when the process dies), safe file
//! names for any run ID, and the permissions of the state directory (0700) and logs (0600).
//! It does not validate run rules: that is the fold's job. It only keeps seq order.
//!
//! A log is not where a fact is durable: the bucket is (a node commits each fact's generation
//! before its next step). A log is read back only while its writer lives, and a run whose
//! writer died is seeded from the bucket, so an append is one `pwrite` to the page cache and
//! no fsync: a killed process loses nothing written, and a machine that crashed leaves at
//! worst a torn last line in a log nobody will resume from.
//!
//! Reading tolerates exactly one torn last line — the partial write a crash leaves — and
//! reports damage anywhere else with its line number. Opening a log for append cuts a torn
//! tail off first, so the next fact never lands glued to garbage.

use std::fs::{self, DirBuilder, File, OpenOptions, TryLockError};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::core::fact::{self, DecodeError, Fact, MAX_FACT_BYTES, Seq};
use crate::core::fold::{FoldError, RunState};

/// Why opening, reading or appending to a local fact log failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    // The I/O error is part of the message, not a `source`: as both, `{:#}` printed it twice.
    /// The file system refused an operation (permissions, a full disk, a missing directory);
    /// fix the disk or directory and retry.
    #[error("fact log {path}: cannot {action}: {error}")]
    Io {
        /// The log file or directory concerned.
        path: PathBuf,
        /// What was being done, phrased to follow "cannot".
        action: &'static str,
        /// The operating system's error.
        error: io::Error,
    },
    /// Another process holds the run's log (one writer per run); leave the run to it rather
    /// than write beside it.
    #[error("fact log {path} is locked by another process (one writer per run)")]
    Locked {
        /// The locked log.
        path: PathBuf,
    },
    /// A line other than the last does not parse as a fact (or a fact to append cannot be
    /// encoded): the log is damaged, and the run should be restored from its checkpoint.
    #[error("fact log {path}: line {line} is corrupt: {reason}")]
    Corrupt {
        /// The damaged log.
        path: PathBuf,
        /// Line number of the bad line, from 1 (0 for a fact that could not be encoded).
        line: u64,
        /// Why it does not parse.
        reason: String,
    },
    /// A fact was written by a newer build; upgrade Rekindle before reading this log.
    #[error(
        "fact log {path}: line {line} has schema version {found}, this build reads up to {supported}"
    )]
    FutureSchema {
        /// The log holding the fact.
        path: PathBuf,
        /// Line number of the fact, from 1.
        line: u64,
        /// The schema version the fact declares.
        found: u32,
        /// The newest schema version this build reads.
        supported: u32,
    },
    /// A fact's encoded line exceeds the size limit; it was not appended, so shrink it.
    #[error("fact log {path}: fact seq {seq} is {size} bytes, over the limit of {limit} bytes")]
    FactTooLarge {
        /// The log the fact was for.
        path: PathBuf,
        /// Seq of the refused fact.
        seq: Seq,
        /// Its encoded size in bytes.
        size: usize,
        /// The largest encoded fact allowed, in bytes.
        limit: usize,
    },
    /// An appended fact does not carry the log's next seq; the caller's view of the run is
    /// stale, and it must reread the log.
    #[error("fact log {path}: append of seq {got} refused, the next seq is {expected}")]
    OutOfOrder {
        /// The log appended to.
        path: PathBuf,
        /// The seq the next fact must have.
        expected: Seq,
        /// The seq the refused fact had.
        got: Seq,
    },
    /// An earlier write or fsync failed, so the file's state is unknown; drop this handle and
    /// reopen the log, which rereads and repairs it.
    #[error(
        "fact log {path}: an earlier write or fsync failed, so the file's state is unknown; reopen the log"
    )]
    Poisoned {
        /// The log whose state is unknown.
        path: PathBuf,
    },
    /// A fact breaks the run's rules (see [`fold`]).
    #[error("fact log {path}: {error}")]
    Fold {
        /// The log holding the fact.
        path: PathBuf,
        /// Which rule the fact breaks.
        error: FoldError,
    },
    /// Neither `XDG_STATE_HOME` nor `HOME` is an absolute path, so there is no default place
    /// for logs; set one, or pass a directory explicitly.
    #[error(
        "no state directory: set XDG_STATE_HOME or HOME to an absolute path (logs are never kept in the working directory)"
    )]
    NoStateDir,
}

/// The facts read from a log, and the torn tail that was skipped, if any.
#[derive(Debug, Default)]
pub struct Contents {
    /// The whole facts, in seq order.
    pub facts: Vec<Fact>,
    /// The unparsable last line that was skipped, if a crash left one.
    pub torn_tail: Option<TornTail>,
}

/// An unparsable last line, left by a write cut short by a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornTail {
    /// Line number of the torn line, from 1.
    pub line: u64,
    /// Its length in bytes, cut off when the log is opened for append.
    pub bytes: u64,
}

/// The default state directory for logs: `$XDG_STATE_HOME/rekindle/runs`, else
/// `$HOME/.local/state/rekindle/runs`. Never the working directory: relative values are
/// ignored, as the XDG specification requires.
pub fn default_dir() -> Result<PathBuf, LogError> {
    default_dir_from(std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME"))
}

/// [`default_dir`] with the environment passed in, so the rule can be tested.
pub fn default_dir_from(
    xdg_state_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Result<PathBuf, LogError> {
    let absolute = |value: Option<std::ffi::OsString>| {
        value.map(PathBuf::from).filter(|path| path.is_absolute())
    };
    let base = absolute(xdg_state_home)
        .or_else(|| absolute(home).map(|home| home.join(".local").join("state")))
        .ok_or(LogError::NoStateDir)?;
    Ok(base.join("rekindle").join("runs"))
}

/// The file name of a run's log: [`crate::core::layout::encode_id`] plus `.jsonl`.
///
/// An ID of 1–128 ASCII letters, digits and `_ . : -` is used as-is, unless it starts with
/// `.` (so `.` and `..` stay names of files, not directories) or with `s-` (reserved for the
/// encoded form). Every other ID — with `/`, `..`, NUL, newlines, unicode, or longer — becomes
/// `s-` plus the SHA-256 of its bytes in full hex, which no two different IDs share and which
/// cannot escape the directory.
pub fn file_name(run_id: &str) -> String {
    format!("{}.jsonl", crate::core::layout::encode_id(run_id))
}

/// How long a log nobody holds is kept before [`LogDir::open`] removes it.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// A directory of fact logs, created 0700.
#[derive(Debug, Clone)]
pub struct LogDir {
    root: PathBuf,
}

impl LogDir {
    /// Opens (creating if needed) the directory and makes it private to this user.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, LogError> {
        let root = root.into();
        let io_error = |action, source| LogError::Io {
            path: root.clone(),
            action,
            error: source,
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(|e| io_error("create the log directory", e))?;
        // A directory made earlier by someone else's umask is tightened: logs hold prompts
        // and tool outputs.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700))
            .map_err(|e| io_error("set the log directory's permissions to 0700", e))?;
        let dir = LogDir { root };
        let swept = dir.sweep_abandoned(ABANDONED_AFTER);
        if swept > 0 {
            tracing::info!(logs = swept, dir = %dir.root.display(), "removed local fact logs that processes killed earlier left");
        }
        Ok(dir)
    }

    /// Removes the logs no process holds that were last written longer than `older_than`
    /// ago; returns how many. A log is only a run's journal while its writer lives (a resumed
    /// or recovered run is seeded from the bucket, never from another process's log), and
    /// its writer holds its lock until it ends; a writer that finished removes its own, so
    /// what is left unlocked was left by a process that was killed. Best effort: a log that
    /// cannot be looked at stays.
    pub fn sweep_abandoned(&self, older_than: Duration) -> usize {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return 0;
        };
        let mut swept = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let old = entry
                .metadata()
                .ok()
                .filter(|meta| meta.is_file())
                .and_then(|meta| meta.modified().ok())
                .and_then(|at| at.elapsed().ok())
                .is_some_and(|age| age > older_than);
            if !old || path.extension().is_none_or(|ext| ext != "jsonl") {
                continue;
            }
            let Ok(file) = options().open(&path) else {
                continue;
            };
            if lock(&path, &file).is_ok()
                && is_abandoned_log(&path, &file)
                && fs::remove_file(&path).is_ok()
            {
                swept += 1;
            }
        }
        swept
    }

    /// The directory the logs are in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Path of the run's log file in this directory.
    pub fn path_for(&self, run_id: &str) -> PathBuf {
        self.root.join(file_name(run_id))
    }

    /// Opens the run's log for appending, holding its lock.
    pub fn open_log(&self, run_id: &str) -> Result<(FactLog, Contents), LogError> {
        let path = self.path_for(run_id);
        blocking(|| FactLog::open(path))
    }

    /// Deletes a run's log, e.g. before reseeding it from a checkpoint. Holding the lock
    /// while deleting keeps a live writer's log from vanishing under it; the content is not
    /// read, so a corrupt log can be replaced too.
    pub fn remove_log(&self, run_id: &str) -> Result<(), LogError> {
        let path = self.path_for(run_id);
        blocking(|| remove_locked(path))
    }
}

/// [`LogDir::remove_log`] of the log at `path`.
fn remove_locked(path: PathBuf) -> Result<(), LogError> {
    let file = match options().open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(LogError::Io {
                path,
                action: "open",
                error: source,
            });
        }
    };
    lock(&path, &file)?;
    fs::remove_file(&path).map_err(|source| LogError::Io {
        path: path.clone(),
        action: "remove",
        error: source,
    })?;
    drop(file);
    Ok(())
}

/// Runs a log's opening and removal (a read of the whole file, an unlink) without holding up
/// the other tasks of a multi-threaded tokio runtime: its worker thread hands them to another
/// thread for the duration (`block_in_place`). A fleet process runs on two worker threads,
/// and a slow disk would hold every run on the node behind it. An append is one `pwrite` to
/// the page cache and runs inline: the hand-off would cost more than the write. Outside a runtime, and on a current-thread one (the simulation's,
/// which must replay the same way every time and cannot hand tasks off), it runs inline.
fn blocking<T>(io: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(io)
        }
        _ => io(),
    }
}

/// A run's log opened for appending. Holds an exclusive `flock` for its lifetime.
#[derive(Debug)]
pub struct FactLog {
    path: PathBuf,
    file: File,
    /// Length of the file's known-good content.
    len: u64,
    next_seq: Seq,
    poisoned: bool,
}

impl FactLog {
    /// Opens or creates the log at `path`, takes its lock, reads it, and cuts off a torn tail.
    pub fn open(path: impl Into<PathBuf>) -> Result<(FactLog, Contents), LogError> {
        let path = path.into();
        let file = options()
            .create(true)
            .open(&path)
            .map_err(|source| LogError::Io {
                path: path.clone(),
                action: "open",
                error: source,
            })?;
        Self::from_file(path, file)
    }

    fn from_file(path: PathBuf, mut file: File) -> Result<(FactLog, Contents), LogError> {
        lock(&path, &file)?;
        let mut facts = Vec::new();
        let scan = scan(&path, &mut file, |fact| {
            facts.push(fact);
            Ok::<_, LogError>(())
        })?;
        let contents = Contents {
            facts,
            torn_tail: scan.torn_tail,
        };
        let mut log = FactLog {
            next_seq: Seq(contents.facts.last().map_or(1, |f| f.seq.0 + 1)),
            path,
            file,
            len: scan.good_len,
            poisoned: false,
        };
        if scan.torn_tail.is_some() {
            log.file
                .set_len(scan.good_len)
                .map_err(|source| log.io("cut off the torn last line", source))?;
        } else if scan.missing_newline {
            // The last fact is whole but its newline never made it to disk.
            log.write_at_end(b"\n")?;
        }
        Ok((log, contents))
    }

    /// Path of this log's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The seq the next appended fact must have.
    pub fn next_seq(&self) -> Seq {
        self.next_seq
    }

    /// Appends one fact: when this returns `Ok`, the fact survives this process being killed.
    pub fn append(&mut self, fact: &Fact) -> Result<(), LogError> {
        self.append_all(std::slice::from_ref(fact))
    }

    /// Appends several facts with one write (used to seed a log).
    pub fn append_all(&mut self, facts: &[Fact]) -> Result<(), LogError> {
        if self.poisoned {
            return Err(LogError::Poisoned {
                path: self.path.clone(),
            });
        }
        let mut buffer = Vec::new();
        let mut expected = self.next_seq;
        for fact in facts {
            if fact.seq != expected {
                return Err(LogError::OutOfOrder {
                    path: self.path.clone(),
                    expected,
                    got: fact.seq,
                });
            }
            let encoded = fact::encode(fact).map_err(|error| match error {
                DecodeError::TooLarge { size, limit } => LogError::FactTooLarge {
                    path: self.path.clone(),
                    seq: fact.seq,
                    size,
                    limit,
                },
                other => LogError::Corrupt {
                    path: self.path.clone(),
                    line: 0,
                    reason: format!("fact seq {} cannot be encoded: {other}", fact.seq),
                },
            })?;
            buffer.extend_from_slice(&encoded);
            buffer.push(b'\n');
            expected = Seq(expected.0 + 1);
        }
        if buffer.is_empty() {
            return Ok(());
        }
        self.write_at_end(&buffer)?;
        self.next_seq = expected;
        Ok(())
    }

    /// Writes at the end of the good content, with one `pwrite` and no fsync: the log is this
    /// process's trace of its run, read back only while the process lives (by itself, never:
    /// it holds the state; by `rekindle fold`), and a crash ends the writer, whose run is then
    /// seeded from the bucket. A fact is durable once its generation is committed, and a node
    /// commits each fact before it takes the next step. A write to the
    /// page cache survives the process being killed; only a crash of the machine can cut it,
    /// and that leaves at worst a torn last line, which a reopen cuts off. On failure the log
    /// is poisoned: only a reopen, which reads what is really there, is safe.
    fn write_at_end(&mut self, bytes: &[u8]) -> Result<(), LogError> {
        use std::os::unix::fs::FileExt;
        if let Err(source) = self.file.write_all_at(bytes, self.len) {
            self.poisoned = true;
            let _ = self.file.set_len(self.len);
            return Err(self.io("append", source));
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    fn io(&self, action: &'static str, source: io::Error) -> LogError {
        LogError::Io {
            path: self.path.clone(),
            action,
            error: source,
        }
    }
}

/// Reads a log without locking it (a live writer may be appending; a torn tail is skipped).
pub fn read(path: &Path) -> Result<Contents, LogError> {
    let file = File::open(path).map_err(|source| LogError::Io {
        path: path.to_owned(),
        action: "open",
        error: source,
    })?;
    read_from(path, file)
}

/// Reads log content from any reader; `path` only names it in errors.
pub fn read_from(path: &Path, reader: impl Read) -> Result<Contents, LogError> {
    let mut facts = Vec::new();
    let scan = scan(path, reader, |fact| {
        facts.push(fact);
        Ok::<_, LogError>(())
    })?;
    Ok(Contents {
        facts,
        torn_tail: scan.torn_tail,
    })
}

/// Reads and folds a log in one pass, without holding all facts twice.
pub fn fold(path: &Path) -> Result<(RunState, Option<TornTail>), LogError> {
    let file = File::open(path).map_err(|source| LogError::Io {
        path: path.to_owned(),
        action: "open",
        error: source,
    })?;
    fold_from(path, file)
}

/// [`fold`] from any reader; `path` only names it in errors.
pub fn fold_from(path: &Path, reader: impl Read) -> Result<(RunState, Option<TornTail>), LogError> {
    let mut state = RunState::default();
    let scan = scan(path, reader, |fact| {
        state.apply(fact).map(drop).map_err(|error| LogError::Fold {
            path: path.to_owned(),
            error,
        })
    })?;
    Ok((state, scan.torn_tail))
}

/// Takes the log's exclusive advisory lock without waiting. The kernel drops it when the
/// process exits, however it exits, so a crashed writer never leaves a stale lock behind.
fn lock(path: &Path, file: &File) -> Result<(), LogError> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(LogError::Locked {
            path: path.to_owned(),
        }),
        Err(TryLockError::Error(source)) => Err(LogError::Io {
            path: path.to_owned(),
            action: "lock",
            error: source,
        }),
    }
}

/// Whether `file`, locked by the caller, is still what `path` names (not replaced by a
/// process that removed it and opened a new log under the same name) and holds a fact log:
/// empty, or a first line that decodes as a fact. Another file that happens to end in
/// `.jsonl` in the directory is left alone.
fn is_abandoned_log(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let same = match (file.metadata(), fs::metadata(path)) {
        (Ok(held), Ok(named)) => held.dev() == named.dev() && held.ino() == named.ino(),
        _ => false,
    };
    if !same {
        return false;
    }
    let mut first = Vec::new();
    let read = BufReader::new(file)
        .take(MAX_FACT_BYTES as u64 + 1)
        .read_until(b'\n', &mut first);
    match read {
        Ok(0) => true,
        Ok(_) => fact::decode(first.strip_suffix(b"\n").unwrap_or(&first)).is_ok(),
        Err(_) => false,
    }
}

fn options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true).write(true).mode(0o600);
    options
}

struct Scan {
    torn_tail: Option<TornTail>,
    /// Bytes up to and including the last good line.
    good_len: u64,
    missing_newline: bool,
}

/// Reads every line, one bounded line at a time, handing each fact to `sink` in order.
fn scan<E: From<LogError>>(
    path: &Path,
    file: impl Read,
    mut sink: impl FnMut(Fact) -> Result<(), E>,
) -> Result<Scan, E> {
    let io_error = |source| LogError::Io {
        path: path.to_owned(),
        action: "read",
        error: source,
    };
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let mut line = Vec::new();
    let mut line_number = 0u64;
    let mut good_len = 0u64;
    let mut missing_newline = false;
    // A line that failed to parse; harmless only if nothing follows it.
    let mut unparsed: Option<(u64, u64, String)> = None;
    loop {
        line.clear();
        // One byte past the limit plus the newline tells an oversized line from a full one.
        let read = (&mut reader)
            .take(MAX_FACT_BYTES as u64 + 2)
            .read_until(b'\n', &mut line)
            .map_err(io_error)?;
        if read == 0 {
            break;
        }
        line_number += 1;
        if let Some((bad_line, _, reason)) = unparsed.take() {
            return Err(LogError::Corrupt {
                path: path.to_owned(),
                line: bad_line,
                reason,
            }
            .into());
        }
        let has_newline = line.last() == Some(&b'\n');
        let text = if has_newline {
            &line[..line.len() - 1]
        } else {
            &line[..]
        };
        match fact::decode(text) {
            Ok(fact) => {
                sink(fact)?;
                good_len += read as u64;
                missing_newline = !has_newline;
            }
            Err(DecodeError::FutureSchema { found, supported }) => {
                return Err(LogError::FutureSchema {
                    path: path.to_owned(),
                    line: line_number,
                    found,
                    supported,
                }
                .into());
            }
            Err(DecodeError::Invalid {
                reason,
                syntax: true,
            }) => unparsed = Some((line_number, read as u64, reason)),
            Err(error) => {
                return Err(LogError::Corrupt {
                    path: path.to_owned(),
                    line: line_number,
                    reason: error.to_string(),
                }
                .into());
            }
        }
    }
    let torn_tail = unparsed.map(|(line, bytes, _)| TornTail { line, bytes });
    Ok(Scan {
        torn_tail,
        good_len,
        missing_newline: missing_newline && torn_tail.is_none(),
    })
}

#[cfg(test)]
mod blocking_tests {
    use super::blocking;
    use std::time::Duration;

    // A log's fsync on the only worker thread must not stop the runtime's other tasks: the
    // other task here can answer only if the blocked thread handed it on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn blocking_log_work_leaves_the_runtime_to_other_tasks() {
        let waited = tokio::spawn(async {
            let (answer, question) = std::sync::mpsc::channel();
            let other = tokio::spawn(async move { answer.send(()).is_ok() });
            let got = blocking(|| question.recv_timeout(Duration::from_secs(10)));
            (got, other.await.unwrap())
        })
        .await
        .unwrap();
        assert_eq!(waited, (Ok(()), true), "the other task never ran");
    }

    // On a current-thread runtime (the simulation's) there is nobody to hand tasks to: the work
    // runs inline, without the panic `block_in_place` would raise there.
    #[tokio::test(flavor = "current_thread")]
    async fn on_a_current_thread_runtime_it_runs_inline() {
        assert_eq!(blocking(|| 7), 7);
    }
}
