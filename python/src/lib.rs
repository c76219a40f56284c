//! `rekindle._native`: the Python package's bindings over the Rekindle library.
//!
//! This crate owns only the crossing between Python and the library: opening stores, building
//! an [`Agent`] whose model and tools are Python objects, running the library's futures on one
//! shared tokio runtime with the GIL released, and turning [`rekindle::Error`] into Python
//! exceptions by its [`ErrorKind`]. Durability, fencing, admission and the drive loop are the
//! library's; nothing here writes to a store on its own.
//!
//! The Python side (`python/rekindle/__init__.py`) adapts models and tools to two plain-JSON
//! calls, `_complete(messages, tools, turn)` and `_call(name, arguments, run_id, call_id,
//! epoch)`, so this crate never inspects Python types beyond strings, numbers and lists.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use serde_json::{Value, json};

use rekindle::core::fact::{
    CallId, ConfirmationRequested, FactBody, QuestionAsked, QuestionId, RecoveryId, RunId,
    SessionId, Terminal, ToolResult, Usage, UserMessage,
};
use rekindle::fleet::admission::Takeover;
use rekindle::fleet::runner::Stopped;
use rekindle::fleet::worker::WorkerStats;
use rekindle::fleet::{Agent, Node};
use rekindle::host::config::Config as RustConfig;
use rekindle::sdk::{self, Failure, ForeignCall, ModelFailure};
use rekindle::store::lease::Holder;
use rekindle::store::log::LogDir;
use rekindle::{Error, ErrorKind};

create_exception!(
    rekindle,
    RekindleError,
    PyException,
    "Base of every Rekindle error; `kind` says what to do next."
);
create_exception!(
    rekindle,
    ConflictError,
    RekindleError,
    "Someone else changed the state first: reread and retry."
);
create_exception!(
    rekindle,
    UnavailableError,
    RekindleError,
    "The store, the disk or the model is unavailable: back off and retry."
);
create_exception!(
    rekindle,
    FencedError,
    RekindleError,
    "Another writer owns the run now: stop, do not retry."
);
create_exception!(
    rekindle,
    NotFoundError,
    RekindleError,
    "The named run, recovery or object does not exist."
);
create_exception!(
    rekindle,
    RefusedError,
    RekindleError,
    "The current state forbids the request: change the request or accept the state."
);
create_exception!(
    rekindle,
    InvalidInputError,
    RekindleError,
    "The request or the configuration is wrong: fix the input."
);
create_exception!(
    rekindle,
    CorruptError,
    RekindleError,
    "Stored data is damaged or from a newer build: a human must look."
);
create_exception!(rekindle, InternalError, RekindleError, "A bug in Rekindle.");

/// A failure as the Python exception of its kind, with the whole message.
fn py_failure(failure: Failure) -> PyErr {
    let message = failure.message;
    match failure.kind {
        ErrorKind::Conflict => ConflictError::new_err(message),
        ErrorKind::Unavailable => UnavailableError::new_err(message),
        ErrorKind::Fenced => FencedError::new_err(message),
        ErrorKind::NotFound => NotFoundError::new_err(message),
        ErrorKind::Refused => RefusedError::new_err(message),
        ErrorKind::InvalidInput => InvalidInputError::new_err(message),
        ErrorKind::Corrupt => CorruptError::new_err(message),
        _ => InternalError::new_err(message),
    }
}

/// The library's error as the Python exception of its kind (each `source()` appended once,
/// as the binaries print it).
fn py_error(error: Error) -> PyErr {
    py_failure(error.into())
}

fn invalid(message: impl Into<String>) -> PyErr {
    InvalidInputError::new_err(message.into())
}

/// The one runtime every call of the package runs on.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("rekindle")
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// How often a blocking call looks at Python's pending signals (Ctrl-C, a handler that calls
/// `stop()`) while the library works without the GIL.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// What a blocking call does when a Python signal handler raises (Ctrl-C's
/// `KeyboardInterrupt`) while it waits.
#[derive(Clone, Copy)]
enum OnSignal<'a> {
    /// Drop the work where it is (as a crash would leave it, which every library write is safe
    /// against) and raise at once. Only for work that owns no state that outlives the call.
    Abort,
    /// Let the work finish, then raise: for work on state the caller keeps (a journal's
    /// writer, which must never be left mid-commit).
    Finish,
    /// Set the flag (a graceful stop after the current step), let the work end, then raise;
    /// a second signal drops the work where it is.
    Stop(&'a Arc<AtomicBool>),
}

/// Runs `work` on the runtime with the GIL released, looking at Python's signals every
/// [`SIGNAL_CHECK`] and reacting as `on_signal` says.
fn block<T: Send + 'static>(
    py: Python<'_>,
    on_signal: OnSignal<'_>,
    work: impl Future<Output = T> + Send + 'static,
) -> PyResult<T> {
    let mut task = runtime().spawn(work);
    let mut interrupted: Option<PyErr> = None;
    loop {
        let done = py.detach(|| {
            runtime().block_on(async { tokio::time::timeout(SIGNAL_CHECK, &mut task).await })
        });
        match done {
            Ok(Ok(value)) => {
                return match interrupted {
                    Some(error) => Err(error),
                    None => Ok(value),
                };
            }
            Ok(Err(join)) => {
                return Err(InternalError::new_err(format!(
                    "a Rekindle task failed: {join}"
                )));
            }
            Err(_elapsed) => {
                let Err(error) = py.check_signals() else {
                    continue;
                };
                match (on_signal, interrupted.is_some()) {
                    (OnSignal::Abort, _) | (OnSignal::Stop(_), true) => {
                        task.abort();
                        return Err(error);
                    }
                    (OnSignal::Stop(stop), false) => {
                        stop.store(true, Ordering::SeqCst);
                        interrupted = Some(error);
                    }
                    (OnSignal::Finish, _) => {
                        interrupted.get_or_insert(error);
                    }
                }
            }
        }
    }
}

/// `block` for the library's fallible calls that own no state beyond the call.
fn call<T: Send + 'static>(
    py: Python<'_>,
    work: impl Future<Output = rekindle::Result<T>> + Send + 'static,
) -> PyResult<T> {
    block(py, OnSignal::Abort, work)?.map_err(py_error)
}

/// `call` for the shared calls of the language packages.
fn shared<T: Send + 'static>(
    py: Python<'_>,
    work: impl Future<Output = sdk::Result<T>> + Send + 'static,
) -> PyResult<T> {
    block(py, OnSignal::Abort, work)?.map_err(py_failure)
}

/// A JSON value as the Python object `json.loads` makes of it.
fn to_py(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    let json = py.import("json")?;
    Ok(json.call_method1("loads", (value.to_string(),))?.unbind())
}

/// A Python object as JSON, through `json.dumps` (anything it cannot encode is an error).
fn from_py(py: Python<'_>, object: &Bound<'_, PyAny>) -> PyResult<Value> {
    let json = py.import("json")?;
    let text: String = json.call_method1("dumps", (object,))?.extract()?;
    serde_json::from_str(&text).map_err(|e| invalid(format!("not JSON: {e}")))
}

use sdk::{serialize, state_json, stopped_json};

/// A run ID from Python: refused when empty.
fn parse_run_id(text: &str) -> PyResult<RunId> {
    sdk::run_id(text).map_err(py_failure)
}

fn open_state_dir(given: Option<PathBuf>) -> PyResult<LogDir> {
    sdk::state_dir(given).map_err(py_failure)
}

/// A Rekindle store: a local directory, `s3://bucket/prefix`, or `memory://`.
#[pyclass(frozen, module = "rekindle")]
struct Store {
    inner: rekindle::store::Store,
    url: String,
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (url, *, endpoint=None, allow_http=None, region=None, virtual_hosted_style=false, timeout_ms=30_000, retries=8, create=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &str,
        endpoint: Option<String>,
        allow_http: Option<bool>,
        region: Option<String>,
        virtual_hosted_style: bool,
        timeout_ms: u64,
        retries: usize,
        create: bool,
    ) -> PyResult<Self> {
        let options = sdk::StoreOptions {
            endpoint,
            allow_http,
            region,
            virtual_hosted_style,
            timeout_ms,
            retries,
            create,
        };
        let named = url.to_owned();
        let inner = shared(py, async move { sdk::open_store(&named, &options).await })?;
        Ok(Store {
            url: url.to_owned(),
            inner,
        })
    }

    /// The URL the store was opened with.
    #[getter]
    fn url(&self) -> String {
        self.url.clone()
    }

    /// Requests this process sent to the store so far, by kind (`get`, `put`,
    /// `conditional_put`, ...), with `requests` their total.
    fn requests(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &sdk::requests_json(&self.inner))
    }

    /// Spawns the recovery of `source_run_id` under `recovery_id` (JSON of its record).
    #[pyo3(signature = (source_run_id, recovery_id, *, force=false, takeover=false))]
    fn spawn_recovery(
        &self,
        py: Python<'_>,
        source_run_id: &str,
        recovery_id: &str,
        force: bool,
        takeover: bool,
    ) -> PyResult<Py<PyAny>> {
        let store = self.inner.clone();
        let source = parse_run_id(source_run_id)?;
        let id = sdk::recovery_id(recovery_id).map_err(py_failure)?;
        let takeover = if takeover {
            Takeover::Now
        } else {
            Takeover::IfSilent
        };
        let record = call(py, async move {
            let holder = Holder::new(&store, sdk::default_id("py-admit"), Duration::from_secs(15));
            rekindle::fleet::spawn_recovery(&store, &holder, &source, &id, force, takeover).await
        })?;
        to_py(py, &serialize(&record))
    }

    /// Answers a parked run: a confirmation (`call_id`, `approve`) or a question
    /// (`question_id`, `text`).
    #[pyo3(signature = (run_id, *, call_id=None, approve=None, question_id=None, text=None))]
    fn answer(
        &self,
        py: Python<'_>,
        run_id: &str,
        call_id: Option<String>,
        approve: Option<bool>,
        question_id: Option<String>,
        text: Option<String>,
    ) -> PyResult<()> {
        let answer = sdk::answer(call_id, approve, question_id, text).map_err(|_| {
            invalid("answer takes either call_id= and approve= or question_id= and text=")
        })?;
        let store = self.inner.clone();
        let run = parse_run_id(run_id)?;
        call(py, async move {
            let holder = Holder::new(
                &store,
                sdk::default_id("py-answer"),
                Duration::from_secs(15),
            );
            rekindle::fleet::answer(&store, &holder, &run, answer).await
        })
    }

    /// One look at the fleet: the leader, workers, runs not yet done, stuck work.
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let store = self.inner.clone();
        let overview = call(py, async move {
            rekindle::fleet::overview::observe(&store).await
        })?;
        to_py(py, &serialize(&overview))
    }

    /// The runs not yet done, each with its state and recovery.
    fn runs(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let store = self.inner.clone();
        let overview = call(py, async move {
            rekindle::fleet::overview::observe(&store).await
        })?;
        to_py(py, &serialize(&overview.runs))
    }

    /// A run's committed state, folded: its messages, pending tool calls, park, end.
    fn load(&self, py: Python<'_>, run_id: &str) -> PyResult<Py<PyAny>> {
        let store = self.inner.clone();
        let run = parse_run_id(run_id)?;
        let loaded = call(py, async move {
            Ok(rekindle::store::generation::load(&store, &run, None).await?)
        })?;
        to_py(py, &state_json(&loaded.state))
    }

    /// The recovery record of `recovery_id`, or `None`.
    fn recovery(&self, py: Python<'_>, recovery_id: &str) -> PyResult<Py<PyAny>> {
        let store = self.inner.clone();
        let id = RecoveryId::new(recovery_id);
        let record = call(py, async move {
            Ok(rekindle::store::recovery::read(&store, &id).await?)
        })?;
        to_py(
            py,
            &record.map_or(Value::Null, |(record, _)| serialize(&record)),
        )
    }

    /// Saves a session snapshot if the newest one still has digest `expected` (`None`: there
    /// is none yet); raises `ConflictError` otherwise. Returns its generation and digest.
    #[pyo3(signature = (session_id, data, *, expected=None))]
    fn save_session(
        &self,
        py: Python<'_>,
        session_id: &str,
        data: &Bound<'_, PyAny>,
        expected: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let contents = rekindle::store::checkpoint::SessionData {
            data: from_py(py, data)?,
            ..Default::default()
        };
        let store = self.inner.clone();
        let session = SessionId::new(session_id);
        let saved = call(py, async move {
            Ok(rekindle::store::checkpoint::save_session(
                &store,
                &session,
                contents,
                expected.as_deref(),
            )
            .await?)
        })?;
        to_py(
            py,
            &json!({"generation": saved.generation, "digest": saved.digest}),
        )
    }

    /// The newest session snapshot (`data`, `generation`, `digest`), or `None`.
    fn load_session(&self, py: Python<'_>, session_id: &str) -> PyResult<Py<PyAny>> {
        let store = self.inner.clone();
        let session = SessionId::new(session_id);
        let loaded = call(py, async move {
            Ok(rekindle::store::checkpoint::load_session(&store, &session).await?)
        })?;
        let value = match loaded {
            Some((envelope, saved)) => json!({
                "data": envelope.contents.data,
                "generation": saved.generation,
                "digest": saved.digest,
            }),
            None => Value::Null,
        };
        to_py(py, &value)
    }

    fn __repr__(&self) -> String {
        format!("rekindle.Store({:?})", self.url)
    }
}

/// A run's configuration: model name, system prompt, budgets, thinking mode; the fingerprint
/// a resume is checked against and work is placed by.
#[pyclass(frozen, module = "rekindle")]
#[derive(Clone)]
struct Config {
    inner: RustConfig,
}

#[pymethods]
impl Config {
    #[new]
    #[pyo3(signature = (model_name, *, system_prompt=String::new(), max_iterations=None, max_tokens=None, max_tool_rounds=None, steps_per_resume=None, thinking=None))]
    fn new(
        model_name: String,
        system_prompt: String,
        max_iterations: Option<i64>,
        max_tokens: Option<i64>,
        max_tool_rounds: Option<i64>,
        steps_per_resume: Option<i64>,
        thinking: Option<String>,
    ) -> PyResult<Self> {
        let options = sdk::ConfigOptions {
            model_name,
            system_prompt,
            max_iterations,
            max_tokens,
            max_tool_rounds,
            steps_per_resume,
            thinking,
        };
        let names = [
            "model_name",
            "max_iterations",
            "max_tokens",
            "max_tool_rounds",
            "steps_per_resume",
        ];
        let inner = sdk::config(options, names).map_err(py_failure)?;
        Ok(Config { inner })
    }

    /// Reads a `rekindle.toml` (its model and command tools are used unless `model=` and
    /// `tools=` are given where the config is used).
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Self> {
        let inner = RustConfig::load(&path).map_err(|e| py_error(e.into()))?;
        Ok(Config { inner })
    }

    #[getter]
    fn model_name(&self) -> String {
        self.inner.model.name.clone()
    }

    #[getter]
    fn system_prompt(&self) -> String {
        self.inner.system_prompt.clone()
    }

    /// The SHA-256 of the configuration's fingerprint with these tools (a list of
    /// `(name, description, schema_json, confirm)`, as the package's `Tool`s give them).
    #[pyo3(signature = (tools=None))]
    fn fingerprint(&self, tools: Option<Vec<ToolSpecTuple>>) -> PyResult<String> {
        match tools {
            Some(tools) => {
                sdk::fingerprint_with(&self.inner, tool_specs(tools)?).map_err(py_failure)
            }
            None => Ok(self.inner.fingerprint().sha256()),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "rekindle.Config(model_name={:?}, fingerprint={})",
            self.inner.model.name,
            &self.inner.fingerprint().sha256()[..12]
        )
    }
}

/// A tool as the Python side declares it: name, description, JSON Schema, confirm.
type ToolSpecTuple = (String, String, String, bool);

fn tool_specs(tools: Vec<ToolSpecTuple>) -> PyResult<Vec<sdk::ToolSpec>> {
    tools
        .into_iter()
        .map(|(name, description, schema, confirm)| {
            sdk::ToolSpec::parse(name, description, &schema, confirm).map_err(py_failure)
        })
        .collect()
}

/// A Python model: the package's adapter answers `_complete(messages_json, tools_json,
/// turn)` with one assistant turn as JSON.
struct PythonModel {
    adapter: Arc<Py<PyAny>>,
}

#[async_trait]
impl sdk::ForeignModel for PythonModel {
    async fn complete(
        &self,
        messages: String,
        tools: String,
        turn: u64,
    ) -> Result<String, ModelFailure> {
        let adapter = Arc::clone(&self.adapter);
        let answered = tokio::task::spawn_blocking(move || {
            Python::attach(|py| {
                adapter
                    .bind(py)
                    .call_method1("_complete", (messages, tools, turn))
                    .and_then(|turn| turn.extract::<String>())
                    .map_err(|error| {
                        if is_programming_error(py, &error) {
                            ModelFailure::Bug(error.to_string())
                        } else {
                            ModelFailure::Failed(error.to_string())
                        }
                    })
            })
        })
        .await;
        answered.unwrap_or_else(|e| Err(ModelFailure::Failed(e.to_string())))
    }
}

/// Whether a model's exception is a bug in its code (`TypeError`, `ValueError`, `KeyError`,
/// `AttributeError`, `NameError`, `IndexError`) rather than a failure to reach the model.
fn is_programming_error(py: Python<'_>, error: &PyErr) -> bool {
    use pyo3::exceptions::{
        PyAttributeError, PyIndexError, PyKeyError, PyNameError, PyTypeError, PyValueError,
    };
    error.is_instance_of::<PyTypeError>(py)
        || error.is_instance_of::<PyValueError>(py)
        || error.is_instance_of::<PyKeyError>(py)
        || error.is_instance_of::<PyAttributeError>(py)
        || error.is_instance_of::<PyNameError>(py)
        || error.is_instance_of::<PyIndexError>(py)
}

/// Python tools: the package's adapter runs `_call(name, arguments, run_id, call_id, epoch)`
/// and answers `(output, is_error)`.
struct PythonTools {
    adapter: Arc<Py<PyAny>>,
}

#[async_trait]
impl sdk::ForeignTools for PythonTools {
    async fn call(&self, call: ForeignCall) -> (String, bool) {
        let adapter = Arc::clone(&self.adapter);
        let name = call.name.clone();
        let args = (
            call.name,
            call.arguments,
            call.run_id,
            call.call_id,
            call.epoch,
        );
        let result = tokio::task::spawn_blocking(move || {
            Python::attach(|py| -> PyResult<(String, bool)> {
                adapter.bind(py).call_method1("_call", args)?.extract()
            })
        })
        .await;
        match result {
            Ok(Ok(pair)) => pair,
            Ok(Err(error)) => (format!("tool '{name}' failed: {error}"), true),
            Err(error) => (format!("tool '{name}' failed: {error}"), true),
        }
    }
}

/// The agent a host or worker runs: the config's own model and command tools, or the Python
/// model and tools given (which replace the config's `[[tools]]`).
fn agent(
    config: &Config,
    model: Option<Bound<'_, PyAny>>,
    tools: Option<Bound<'_, PyAny>>,
) -> PyResult<Agent> {
    let tools = match tools {
        Some(adapter) => {
            let specs: Vec<ToolSpecTuple> = adapter.call_method0("_specs")?.extract()?;
            let foreign: Arc<dyn sdk::ForeignTools> = Arc::new(PythonTools {
                adapter: Arc::new(adapter.unbind()),
            });
            Some((foreign, tool_specs(specs)?))
        }
        None => None,
    };
    let model = model.map(|adapter| {
        Arc::new(PythonModel {
            adapter: Arc::new(adapter.unbind()),
        }) as Arc<dyn sdk::ForeignModel>
    });
    sdk::agent(&config.inner, model, tools).map_err(py_failure)
}

/// Starts a host's heartbeat (see [`sdk::Beating`]).
fn start_beating(py: Python<'_>, holder: Arc<Holder>) -> PyResult<sdk::Beating> {
    shared(py, async move { sdk::Beating::start(holder).await })
}

/// A stop flag for one `Host.run` / `resume_run` call: `set()` asks that run (only) to stop
/// after its current step.
#[pyclass(frozen, module = "rekindle")]
struct StopToken {
    flag: Arc<AtomicBool>,
}

#[pymethods]
impl StopToken {
    #[new]
    fn new() -> Self {
        StopToken {
            flag: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Asks the run to stop after its current step.
    fn set(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked.
    fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

/// A host: starts runs and drives them with its model and tools, continues its own runs,
/// runs workflows, and journals runs whose loop it drives itself.
#[pyclass(module = "rekindle")]
struct Host {
    node: Node,
    /// Shared with every `JournalRun` this host started: the heartbeat lasts while any of
    /// them (or the host) is alive and not closed.
    beating: Arc<sdk::Beating>,
    /// The stop flags of the runs this host drives now; `stop()` sets each.
    stops: Arc<std::sync::Mutex<Vec<std::sync::Weak<AtomicBool>>>>,
}

impl Host {
    /// This host's node for one call, with a stop flag of its own (a stop ends the runs in
    /// flight, not the host): refused once the host is closed.
    fn node_for_call(&self, token: Option<&StopToken>) -> PyResult<(Node, Arc<AtomicBool>)> {
        if self.beating.is_closed() {
            return Err(invalid(format!(
                "host '{}' is closed; open a new Host",
                self.node.holder.id()
            )));
        }
        let flag = token.map_or_else(|| Arc::new(AtomicBool::new(false)), |t| Arc::clone(&t.flag));
        let mut stops = self.stops.lock().unwrap_or_else(|e| e.into_inner());
        stops.retain(|weak| weak.strong_count() > 0);
        stops.push(Arc::downgrade(&flag));
        let mut node = self.node.clone();
        node.stop = Arc::clone(&flag);
        Ok((node, flag))
    }

    /// Drives a run on `node` until it stops; a signal asks it to stop after its step.
    fn drive(
        &self,
        py: Python<'_>,
        run: RunId,
        flag: &Arc<AtomicBool>,
        work: impl Future<Output = rekindle::Result<Stopped>> + Send + 'static,
    ) -> PyResult<Py<PyAny>> {
        let stopped = block(py, OnSignal::Stop(flag), work)?.map_err(py_error)?;
        to_py(py, &stopped_json(&run, &stopped))
    }
}

#[pymethods]
impl Host {
    #[new]
    #[pyo3(signature = (store, config, *, model=None, tools=None, state_dir=None, holder_id=None, lease_ttl_ms=15_000))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store: &Store,
        config: &Config,
        model: Option<Bound<'_, PyAny>>,
        tools: Option<Bound<'_, PyAny>>,
        state_dir: Option<PathBuf>,
        holder_id: Option<String>,
        lease_ttl_ms: u64,
    ) -> PyResult<Self> {
        if lease_ttl_ms == 0 {
            return Err(invalid("lease_ttl_ms must be at least 1"));
        }
        let agent = agent(config, model, tools)?;
        let logs = open_state_dir(state_dir)?;
        let holder = Holder::new(
            &store.inner,
            holder_id.unwrap_or_else(|| sdk::default_id("py-host")),
            Duration::from_millis(lease_ttl_ms),
        );
        let beating = Arc::new(start_beating(py, Arc::clone(&holder))?);
        Ok(Host {
            node: Node {
                store: store.inner.clone(),
                agent,
                logs,
                holder,
                stop: Arc::new(AtomicBool::new(false)),
            },
            beating,
            stops: Arc::default(),
        })
    }

    /// The holder ID this host writes into its runs' leases.
    #[getter]
    fn holder_id(&self) -> String {
        self.node.holder.id().to_owned()
    }

    /// The SHA-256 of this host's configuration fingerprint.
    #[getter]
    fn fingerprint(&self) -> String {
        self.node.agent.fingerprint_sha256()
    }

    /// Starts run `run_id` with `prompt` and drives it until it ends, parks or is stopped.
    #[pyo3(signature = (run_id, prompt, *, session_id=None, stop=None))]
    fn run(
        &self,
        py: Python<'_>,
        run_id: &str,
        prompt: &str,
        session_id: Option<String>,
        stop: Option<PyRef<'_, StopToken>>,
    ) -> PyResult<Py<PyAny>> {
        let (node, flag) = self.node_for_call(stop.as_deref())?;
        let run = parse_run_id(run_id)?;
        let prompt = prompt.to_owned();
        let driven = run.clone();
        self.drive(py, run, &flag, async move {
            node.start_run(&driven, session_id.map(SessionId::new), &prompt)
                .await
        })
    }

    /// Continues run `run_id` under its own ID (its earlier holder is fenced) and drives it.
    #[pyo3(signature = (run_id, *, stop=None))]
    fn resume_run(
        &self,
        py: Python<'_>,
        run_id: &str,
        stop: Option<PyRef<'_, StopToken>>,
    ) -> PyResult<Py<PyAny>> {
        let (node, flag) = self.node_for_call(stop.as_deref())?;
        let run = parse_run_id(run_id)?;
        let driven = run.clone();
        self.drive(
            py,
            run,
            &flag,
            async move { node.resume_run(&driven).await },
        )
    }

    /// Starts run `run_id` for a loop the host drives itself: returns a `JournalRun`.
    #[pyo3(signature = (run_id, prompt, *, session_id=None))]
    fn start(
        &self,
        py: Python<'_>,
        run_id: &str,
        prompt: &str,
        session_id: Option<String>,
    ) -> PyResult<JournalRun> {
        let (node, _) = self.node_for_call(None)?;
        let run = parse_run_id(run_id)?;
        let prompt = prompt.to_owned();
        let begun = node.clone();
        let journaled = block(py, OnSignal::Finish, async move {
            begun
                .begin_run(&run, session_id.map(SessionId::new), &prompt)
                .await
        })?
        .map_err(py_error)?;
        Ok(JournalRun::new(node, Arc::clone(&self.beating), journaled))
    }

    /// Takes run `run_id` over (fencing its earlier holder) for a loop the host drives itself.
    fn resume(&self, py: Python<'_>, run_id: &str) -> PyResult<JournalRun> {
        let (node, _) = self.node_for_call(None)?;
        let run = parse_run_id(run_id)?;
        let continued = node.clone();
        let journaled = block(py, OnSignal::Finish, async move {
            continued.continue_run(&run).await
        })?
        .map_err(py_error)?;
        Ok(JournalRun::new(node, Arc::clone(&self.beating), journaled))
    }

    /// Runs (or resumes) workflow `workflow_id`: each spec (`{"step", "prompt",
    /// "session_id"?}`) becomes a run the fleet executes; finished steps are skipped.
    #[pyo3(signature = (specs, workflow_id, *, poll_ms=500))]
    fn parallel_resumable(
        &self,
        py: Python<'_>,
        specs: &Bound<'_, PyAny>,
        workflow_id: &str,
        poll_ms: u64,
    ) -> PyResult<Py<PyAny>> {
        let steps: Vec<rekindle::fleet::workflow::StepSpec> =
            serde_json::from_value(from_py(py, specs)?)
                .map_err(|e| invalid(format!("workflow '{workflow_id}': {e}")))?;
        let store = self.node.store.clone();
        let agent = self.node.agent.clone();
        let workflow = workflow_id.to_owned();
        let report = call(py, async move {
            rekindle::fleet::workflow::run(
                &store,
                &agent,
                &workflow,
                &steps,
                Duration::from_millis(poll_ms.max(10)),
            )
            .await
        })?;
        to_py(
            py,
            &json!({
                "skipped": report.skipped,
                "dispatched": report.dispatched,
                "completed": serialize(&report.completed),
            }),
        )
    }

    /// Asks every run this host drives now to stop after its current step; later runs are
    /// not affected.
    fn stop(&self) {
        let stops = self.stops.lock().unwrap_or_else(|e| e.into_inner());
        for flag in stops.iter().filter_map(std::sync::Weak::upgrade) {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// Stops the runs in flight after their step, stops the heartbeat and removes it: what
    /// this host leaves unfinished (journal runs still open too) is the fleet's to recover at
    /// once. Later calls on this host are refused.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.stop();
        let beating = Arc::clone(&self.beating);
        shared(py, async move { beating.close().await })
    }
}

/// A run whose loop the host drives: each `record_*` is durable (local log, then one
/// conditional PUT) before it returns.
#[pyclass(module = "rekindle")]
struct JournalRun {
    inner: sdk::Journal,
}

impl JournalRun {
    fn new(node: Node, beating: Arc<sdk::Beating>, journaled: rekindle::fleet::Journaled) -> Self {
        JournalRun {
            inner: sdk::Journal::new(node, beating, journaled),
        }
    }

    /// Records one fact; with `close`, then hands the run back (it ended or parked). Never
    /// dropped mid-commit: a signal is raised after the commit returns.
    fn record(&self, py: Python<'_>, body: FactBody, close: bool) -> PyResult<Py<PyAny>> {
        let journal = self.inner.clone();
        let state = block(py, OnSignal::Finish, async move {
            journal.record(body, close).await
        })?
        .map_err(py_failure)?;
        to_py(py, &state)
    }
}

#[pymethods]
impl JournalRun {
    #[getter]
    fn run_id(&self) -> String {
        self.inner.run_id().to_string()
    }

    /// The committed state (`None` once handed back).
    fn state(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let journal = self.inner.clone();
        let state = block(py, OnSignal::Finish, async move { journal.state().await })?;
        to_py(py, &state.unwrap_or(Value::Null))
    }

    /// The lease epoch this host journals at (a tool's idempotency key includes it).
    #[getter]
    fn epoch(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        let journal = self.inner.clone();
        block(py, OnSignal::Finish, async move { journal.epoch().await })
    }

    /// Records the model's turn: its text and the tool calls it made (`{"id", "name",
    /// "arguments"}`, arguments a JSON string or an object). Returns the state after it.
    #[pyo3(signature = (content=None, tool_calls=None, *, input_tokens=0, output_tokens=0, reasoning=None))]
    fn record_model_turn(
        &self,
        py: Python<'_>,
        content: Option<String>,
        tool_calls: Option<&Bound<'_, PyAny>>,
        input_tokens: u64,
        output_tokens: u64,
        reasoning: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let calls = tool_calls.map(|list| from_py(py, list)).transpose()?;
        let usage = Usage {
            input_tokens,
            output_tokens,
        };
        let body = sdk::model_turn(self.inner.run_id(), content, calls, usage, reasoning)
            .map_err(py_failure)?;
        self.record(py, body, false)
    }

    /// Records a tool call's result.
    #[pyo3(signature = (call_id, output, *, is_error=false, duration_ms=0))]
    fn record_tool_result(
        &self,
        py: Python<'_>,
        call_id: &str,
        output: String,
        is_error: bool,
        duration_ms: u64,
    ) -> PyResult<Py<PyAny>> {
        let body = FactBody::ToolResult(ToolResult {
            call_id: CallId::new(call_id),
            output,
            is_error,
            duration_ms,
        });
        self.record(py, body, false)
    }

    /// Records more user input (after a final answer, the run continues with it).
    fn record_user_message(&self, py: Python<'_>, text: String) -> PyResult<Py<PyAny>> {
        let body = FactBody::UserMessage(UserMessage { content: text });
        self.record(py, body, false)
    }

    /// Parks the run until a human approves or denies tool call `call_id` (`Store.answer`);
    /// the run is handed back: the fleet continues it after the answer.
    fn ask_confirmation(
        &self,
        py: Python<'_>,
        call_id: &str,
        prompt: String,
    ) -> PyResult<Py<PyAny>> {
        let body = FactBody::ConfirmationRequested(ConfirmationRequested {
            call_id: CallId::new(call_id),
            prompt,
        });
        self.record(py, body, true)
    }

    /// Parks the run until a human answers question `question_id`; handed back as above.
    fn ask_question(&self, py: Python<'_>, question_id: &str, text: String) -> PyResult<Py<PyAny>> {
        let body = FactBody::QuestionAsked(QuestionAsked {
            question_id: QuestionId::new(question_id),
            text,
        });
        self.record(py, body, true)
    }

    /// Ends the run (`outcome`: completed, failed, cancelled, budget, step_cap) and hands it
    /// back.
    #[pyo3(signature = (outcome="completed", message=String::new()))]
    fn finish(&self, py: Python<'_>, outcome: &str, message: String) -> PyResult<Py<PyAny>> {
        let outcome = sdk::outcome(self.inner.run_id(), outcome).map_err(py_failure)?;
        let body = FactBody::Terminal(Terminal { outcome, message });
        self.record(py, body, true)
    }

    /// Hands the run back unfinished: its lease is released, and the fleet recovers it once
    /// this host stops beating (or this host resumes it later).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let journal = self.inner.clone();
        block(py, OnSignal::Finish, async move { journal.close().await })?.map_err(py_failure)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Leaving a `with` block hands the run back if it is still open (see `close`).
    fn __exit__(
        &self,
        py: Python<'_>,
        _kind: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        format!("rekindle.JournalRun({:?})", self.inner.run_id().as_str())
    }
}

/// A worker: executes the recoveries the coordinator assigns to it, with this process's
/// model and tools; a full fleet member, as `rekindle-worker` is.
#[pyclass(module = "rekindle")]
struct Worker {
    store: rekindle::store::Store,
    agent: Agent,
    logs: LogDir,
    setup: sdk::WorkerSetup,
    stop: Arc<AtomicBool>,
    stats: Arc<WorkerStats>,
}

#[pymethods]
impl Worker {
    #[new]
    #[pyo3(signature = (store, config, *, model=None, tools=None, worker_id=None, concurrency=1, queue=None, ttl_ms=30_000, poll_interval_ms=None, listen=None, advertise=None, state_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        store: &Store,
        config: &Config,
        model: Option<Bound<'_, PyAny>>,
        tools: Option<Bound<'_, PyAny>>,
        worker_id: Option<String>,
        concurrency: u32,
        queue: Option<u32>,
        ttl_ms: u64,
        poll_interval_ms: Option<u64>,
        listen: Option<String>,
        advertise: Option<String>,
        state_dir: Option<PathBuf>,
    ) -> PyResult<Self> {
        if model.is_none() && !sdk::has_model(&config.inner) {
            return Err(invalid(
                "a worker needs a model: pass model= or a Config.load()ed rekindle.toml with one",
            ));
        }
        let mut setup = sdk::WorkerSetup::new(
            worker_id.unwrap_or_else(|| sdk::default_id("py-worker")),
            concurrency,
            Duration::from_millis(ttl_ms),
        );
        setup.queue = queue;
        setup.poll_interval = poll_interval_ms.map(Duration::from_millis);
        setup.listen_on(listen).map_err(py_failure)?;
        setup.advertise = advertise;
        setup.check().map_err(py_failure)?;
        Ok(Worker {
            store: store.inner.clone(),
            agent: agent(config, model, tools)?,
            logs: open_state_dir(state_dir)?,
            setup,
            stop: Arc::new(AtomicBool::new(false)),
            stats: Arc::new(WorkerStats::default()),
        })
    }

    #[getter]
    fn worker_id(&self) -> String {
        self.setup.id.clone()
    }

    #[getter]
    fn fingerprint(&self) -> String {
        self.agent.fingerprint_sha256()
    }

    /// Runs until `stop()` (from a signal handler or another thread) or Ctrl-C; then lets the
    /// running recoveries finish their step, hands them back and returns.
    fn run(&self, py: Python<'_>) -> PyResult<()> {
        let work = sdk::run_worker(
            self.store.clone(),
            self.agent.clone(),
            self.logs.clone(),
            self.setup.clone(),
            Arc::clone(&self.stop),
            Arc::clone(&self.stats),
        );
        block(py, OnSignal::Stop(&self.stop), work)?.map_err(py_failure)
    }

    /// Asks the worker to stop gracefully.
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Attempts started, recoveries finished, attempts failed and fenced so far.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &sdk::stats_json(&self.stats))
    }
}

/// Rekindle's native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Store>()?;
    m.add_class::<Config>()?;
    m.add_class::<Host>()?;
    m.add_class::<JournalRun>()?;
    m.add_class::<Worker>()?;
    m.add_class::<StopToken>()?;
    for (name, class, kind) in [
        ("RekindleError", py.get_type::<RekindleError>(), "error"),
        ("ConflictError", py.get_type::<ConflictError>(), "conflict"),
        (
            "UnavailableError",
            py.get_type::<UnavailableError>(),
            "unavailable",
        ),
        ("FencedError", py.get_type::<FencedError>(), "fenced"),
        ("NotFoundError", py.get_type::<NotFoundError>(), "not_found"),
        ("RefusedError", py.get_type::<RefusedError>(), "refused"),
        (
            "InvalidInputError",
            py.get_type::<InvalidInputError>(),
            "invalid_input",
        ),
        ("CorruptError", py.get_type::<CorruptError>(), "corrupt"),
        ("InternalError", py.get_type::<InternalError>(), "internal"),
    ] {
        class.setattr("kind", kind)?;
        m.add(name, class)?;
    }
    Ok(())
}
