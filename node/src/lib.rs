//! The native half of Rekindle's Node.js package (`index.cjs` is the other half).
//!
//! This crate owns only the crossing between JavaScript and the library's [`rekindle::sdk`]:
//! classes whose methods start the library's futures on napi's tokio runtime and hand back a
//! promise, and JavaScript models and tools called through weak thread-safe functions (so a
//! callback never keeps the process alive by itself; a pending promise does, while its work
//! is in flight). Durability, fencing, admission and the drive loop are the library's.
//!
//! Data crosses as JSON text. A failure is a JavaScript error whose message is the JSON
//! `{"kind", "message"}`, which `index.cjs` turns into the `RekindleError` subclass of its
//! kind; the JavaScript side adapts models and tools to one JSON string in, one out.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use napi::bindgen_prelude::{Either, Promise, PromiseRaw};
use napi::threadsafe_function::ThreadsafeFunction;
use napi::{Env, Status};
use napi_derive::napi;
use serde_json::{Value, json};

use rekindle::core::fact::{
    CallId, ConfirmationRequested, FactBody, QuestionAsked, QuestionId, RecoveryId, SessionId,
    Terminal, ToolResult, Usage, UserMessage,
};
use rekindle::fleet::admission::Takeover;
use rekindle::fleet::worker::WorkerStats;
use rekindle::fleet::{Agent, Node};
use rekindle::host::config::Config;
use rekindle::sdk::{self, Failure, ForeignCall, ModelFailure};
use rekindle::store::lease::Holder;
use rekindle::store::log::LogDir;

/// A JavaScript callback: one JSON string in, a promise of one JSON string out. Weak: it does
/// not keep the event loop alive.
type Callback = ThreadsafeFunction<String, Promise<String>, String, Status, false, true>;

/// A promise of `T` or of the failure that stopped it. Failures resolve rather than reject:
/// `index.cjs` turns a `NativeFailure` into the `RekindleError` of its kind. (A rejection
/// from napi's runtime reached JavaScript as `undefined`, with the error itself left as an
/// unhandled rejection, under `node --test`.)
type Promised<'env, T> = napi::Result<PromiseRaw<'env, Either<T, NativeFailure>>>;

/// Why a call failed: its kind (`fenced`, `conflict`, ...) and the whole message.
#[napi]
pub struct NativeFailure {
    kind: &'static str,
    message: String,
}

#[napi]
impl NativeFailure {
    /// What the caller does next.
    #[napi(getter)]
    pub fn kind(&self) -> String {
        self.kind.to_owned()
    }

    /// The error and each of its causes.
    #[napi(getter)]
    pub fn message(&self) -> String {
        self.message.clone()
    }
}

impl From<Failure> for NativeFailure {
    fn from(failure: Failure) -> Self {
        NativeFailure {
            kind: failure.kind_name(),
            message: failure.message,
        }
    }
}

/// A failure of a synchronous call, thrown as the JavaScript error `index.cjs` recognises:
/// its message is the JSON `{"kind", "message"}`.
fn thrown(failure: Failure) -> napi::Error {
    napi::Error::new(
        Status::GenericFailure,
        json!({"kind": failure.kind_name(), "message": failure.message}).to_string(),
    )
}

/// Runs the work `make` makes on the runtime; the promise resolves to its value or its
/// failure. The work is made there and boxed, not on the JavaScript thread: a debug build's
/// futures for an admission run to hundreds of kilobytes, and made on the JavaScript thread's
/// stack they left V8 short of its own (it then threw `undefined` from the call).
fn spawn<'env, T, F, M>(env: &'env Env, make: M) -> Promised<'env, T>
where
    T: napi::bindgen_prelude::ToNapiValue + Send + 'static,
    F: std::future::Future<Output = sdk::Result<T>> + Send + 'static,
    M: FnOnce() -> F + Send + 'static,
{
    env.spawn_future(async move {
        Ok(match Box::pin(make()).await {
            Ok(value) => Either::A(value),
            Err(failure) => Either::B(NativeFailure::from(failure)),
        })
    })
}

/// `spawn` for work that resolves to JSON: its value as JSON text.
fn spawn_json<'env, F, M>(env: &'env Env, make: M) -> Promised<'env, String>
where
    F: std::future::Future<Output = sdk::Result<Value>> + Send + 'static,
    M: FnOnce() -> F + Send + 'static,
{
    spawn(env, move || async move {
        make().await.map(|value| value.to_string())
    })
}

fn parse_json(what: &str, text: &str) -> sdk::Result<Value> {
    serde_json::from_str(text).map_err(|e| Failure::invalid(format!("{what} is not JSON: {e}")))
}

/// A store: a local directory, `s3://bucket/prefix`, or `memory://`.
#[napi]
pub struct NativeStore {
    inner: rekindle::store::Store,
    url: String,
}

/// How a store is opened (camelCase in JavaScript).
#[napi(object)]
pub struct StoreOpenOptions {
    /// An S3-compatible endpoint; else `AWS_ENDPOINT_URL` or AWS.
    pub endpoint: Option<String>,
    /// Plain HTTP to the endpoint; else `AWS_ALLOW_HTTP`.
    pub allow_http: Option<bool>,
    /// The bucket's region.
    pub region: Option<String>,
    /// Virtual-hosted-style addressing.
    pub virtual_hosted_style: Option<bool>,
    /// Each request's deadline.
    pub timeout_ms: Option<u32>,
    /// Retries of a request worth retrying.
    pub retries: Option<u32>,
    /// Create the store if it is empty.
    pub create: Option<bool>,
}

/// Opens the store at `url`.
#[napi]
pub fn open_store<'env>(
    env: &'env Env,
    url: String,
    options: StoreOpenOptions,
) -> Promised<'env, NativeStore> {
    let defaults = sdk::StoreOptions::default();
    let options = sdk::StoreOptions {
        endpoint: options.endpoint,
        allow_http: options.allow_http,
        region: options.region,
        virtual_hosted_style: options.virtual_hosted_style.unwrap_or(false),
        timeout_ms: options.timeout_ms.map_or(defaults.timeout_ms, u64::from),
        retries: options.retries.map_or(defaults.retries, |r| r as usize),
        create: options.create.unwrap_or(true),
    };
    spawn(env, move || async move {
        let inner = sdk::open_store(&url, &options).await?;
        Ok(NativeStore { inner, url })
    })
}

#[napi]
impl NativeStore {
    /// The URL the store was opened with.
    #[napi(getter)]
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Requests this process sent to the store so far, by kind.
    #[napi]
    pub fn requests(&self) -> String {
        sdk::requests_json(&self.inner).to_string()
    }

    /// Spawns the recovery of `source` under `recovery_id`; resolves to its record.
    #[napi]
    pub fn spawn_recovery<'env>(
        &self,
        env: &'env Env,
        source: String,
        recovery_id: String,
        force: bool,
        takeover: bool,
    ) -> Promised<'env, String> {
        let store = self.inner.clone();
        spawn_json(env, move || async move {
            let source = sdk::run_id(&source)?;
            let id = sdk::recovery_id(&recovery_id)?;
            let takeover = if takeover {
                Takeover::Now
            } else {
                Takeover::IfSilent
            };
            let holder = Holder::new(&store, sdk::default_id("js-admit"), Duration::from_secs(15));
            let record =
                rekindle::fleet::spawn_recovery(&store, &holder, &source, &id, force, takeover)
                    .await?;
            Ok(sdk::serialize(&record))
        })
    }

    /// Answers a parked run: a confirmation or a question.
    #[napi]
    pub fn answer<'env>(
        &self,
        env: &'env Env,
        run_id: String,
        call_id: Option<String>,
        approve: Option<bool>,
        question_id: Option<String>,
        text: Option<String>,
    ) -> Promised<'env, String> {
        let store = self.inner.clone();
        spawn_json(env, move || async move {
            let answer = sdk::answer(call_id, approve, question_id, text)?;
            let run = sdk::run_id(&run_id)?;
            let holder = Holder::new(
                &store,
                sdk::default_id("js-answer"),
                Duration::from_secs(15),
            );
            rekindle::fleet::answer(&store, &holder, &run, answer).await?;
            Ok(Value::Null)
        })
    }

    /// One look at the fleet: leader, workers, runs not yet done, stuck work.
    #[napi]
    pub fn status<'env>(&self, env: &'env Env) -> Promised<'env, String> {
        let store = self.inner.clone();
        spawn_json(env, move || async move {
            let overview = rekindle::fleet::overview::observe(&store).await?;
            Ok(sdk::serialize(&overview))
        })
    }

    /// A run's committed state, folded.
    #[napi]
    pub fn load<'env>(&self, env: &'env Env, run_id: String) -> Promised<'env, String> {
        let store = self.inner.clone();
        spawn_json(env, move || async move {
            let run = sdk::run_id(&run_id)?;
            let loaded = rekindle::store::generation::load(&store, &run, None)
                .await
                .map_err(rekindle::Error::from)?;
            Ok(sdk::state_json(&loaded.state))
        })
    }

    /// The recovery record of `recovery_id`, or null.
    #[napi]
    pub fn recovery<'env>(&self, env: &'env Env, recovery_id: String) -> Promised<'env, String> {
        let store = self.inner.clone();
        spawn_json(env, move || async move {
            let id = RecoveryId::new(recovery_id);
            let record = rekindle::store::recovery::read(&store, &id)
                .await
                .map_err(rekindle::Error::from)?;
            Ok(record.map_or(Value::Null, |(record, _)| sdk::serialize(&record)))
        })
    }

    /// Saves a session snapshot if the newest still has digest `expected` (none: there is
    /// none yet).
    #[napi]
    pub fn save_session<'env>(
        &self,
        env: &'env Env,
        session_id: String,
        data: String,
        expected: Option<String>,
    ) -> Promised<'env, String> {
        let store = self.inner.clone();
        spawn_json(env, move || async move {
            let contents = rekindle::store::checkpoint::SessionData {
                data: parse_json(&format!("session '{session_id}': the data"), &data)?,
                ..Default::default()
            };
            let session = SessionId::new(session_id);
            let saved = rekindle::store::checkpoint::save_session(
                &store,
                &session,
                contents,
                expected.as_deref(),
            )
            .await
            .map_err(rekindle::Error::from)?;
            Ok(json!({"generation": saved.generation, "digest": saved.digest}))
        })
    }

    /// The newest session snapshot (`data`, `generation`, `digest`), or null.
    #[napi]
    pub fn load_session<'env>(&self, env: &'env Env, session_id: String) -> Promised<'env, String> {
        let store = self.inner.clone();
        spawn_json(env, move || async move {
            let session = SessionId::new(session_id);
            let loaded = rekindle::store::checkpoint::load_session(&store, &session)
                .await
                .map_err(rekindle::Error::from)?;
            Ok(match loaded {
                Some((envelope, saved)) => json!({
                    "data": envelope.contents.data,
                    "generation": saved.generation,
                    "digest": saved.digest,
                }),
                None => Value::Null,
            })
        })
    }
}

/// A run's configuration: model name, system prompt, budgets, thinking mode.
#[napi]
pub struct NativeConfig {
    inner: Config,
}

/// A configuration's fields (camelCase in JavaScript).
#[napi(object)]
pub struct ConfigFields {
    /// The model's name.
    pub model_name: String,
    /// The system prompt.
    pub system_prompt: Option<String>,
    /// At most this many model turns per run.
    pub max_iterations: Option<i64>,
    /// At most this many tokens per run.
    pub max_tokens: Option<i64>,
    /// At most this many rounds of tool calls per run.
    pub max_tool_rounds: Option<i64>,
    /// At most this many steps per resume.
    pub steps_per_resume: Option<i64>,
    /// The model's thinking mode.
    pub thinking: Option<String>,
}

/// A tool as JavaScript declares it.
#[napi(object)]
pub struct ToolDeclaration {
    /// The tool's name.
    pub name: String,
    /// What the model is told it does.
    pub description: String,
    /// The JSON Schema of its arguments, as JSON text.
    pub schema: String,
    /// Whether a human approves each call first.
    pub confirm: bool,
}

fn specs(tools: Vec<ToolDeclaration>) -> sdk::Result<Vec<sdk::ToolSpec>> {
    tools
        .into_iter()
        .map(|t| sdk::ToolSpec::parse(t.name, t.description, &t.schema, t.confirm))
        .collect()
}

#[napi]
impl NativeConfig {
    /// A configuration from its fields.
    #[napi(factory)]
    pub fn create(fields: ConfigFields) -> napi::Result<Self> {
        let options = sdk::ConfigOptions {
            model_name: fields.model_name,
            system_prompt: fields.system_prompt.unwrap_or_default(),
            max_iterations: fields.max_iterations,
            max_tokens: fields.max_tokens,
            max_tool_rounds: fields.max_tool_rounds,
            steps_per_resume: fields.steps_per_resume,
            thinking: fields.thinking,
        };
        let names = [
            "modelName",
            "maxIterations",
            "maxTokens",
            "maxToolRounds",
            "stepsPerResume",
        ];
        let inner = sdk::config(options, names).map_err(thrown)?;
        Ok(NativeConfig { inner })
    }

    /// Reads a `rekindle.toml` (its model and command tools are used unless a model and
    /// tools are given where the configuration is used).
    #[napi(factory)]
    pub fn load(path: String) -> napi::Result<Self> {
        let inner = Config::load(std::path::Path::new(&path))
            .map_err(|e| thrown(Failure::from(rekindle::Error::from(e))))?;
        Ok(NativeConfig { inner })
    }

    /// The model's name.
    #[napi(getter)]
    pub fn model_name(&self) -> String {
        self.inner.model.name.clone()
    }

    /// The system prompt.
    #[napi(getter)]
    pub fn system_prompt(&self) -> String {
        self.inner.system_prompt.clone()
    }

    /// Whether the configuration names a model of its own (a loaded rekindle.toml).
    #[napi(getter)]
    pub fn has_model(&self) -> bool {
        sdk::has_model(&self.inner)
    }

    /// The SHA-256 of the fingerprint with these tools in place of the configuration's.
    #[napi]
    pub fn fingerprint(&self, tools: Option<Vec<ToolDeclaration>>) -> napi::Result<String> {
        match tools {
            Some(tools) => {
                sdk::fingerprint_with(&self.inner, specs(tools).map_err(thrown)?).map_err(thrown)
            }
            None => Ok(self.inner.fingerprint().sha256()),
        }
    }
}

/// A JavaScript model, adapted by `index.cjs`: asked with `{"messages", "tools", "turn"}`, it
/// answers `{"turn": {...}}`, `{"bug": message}` (its code threw, or the turn has the wrong
/// shape) or `{"failed": message}` (it could not answer).
struct JsModel(Arc<Callback>);

#[async_trait]
impl sdk::ForeignModel for JsModel {
    async fn complete(
        &self,
        messages: String,
        tools: String,
        turn: u64,
    ) -> Result<String, ModelFailure> {
        let request = format!(r#"{{"messages":{messages},"tools":{tools},"turn":{turn}}}"#);
        let answer = match self.0.call_async(request).await {
            Ok(promise) => promise.await,
            Err(error) => Err(error),
        }
        .map_err(|e| ModelFailure::Failed(e.reason.clone()))?;
        let answer: Value = serde_json::from_str(&answer)
            .map_err(|e| ModelFailure::Bug(format!("the model adapter answered no JSON: {e}")))?;
        match (&answer["turn"], &answer["bug"], &answer["failed"]) {
            (turn, _, _) if !turn.is_null() => Ok(turn.to_string()),
            (_, Value::String(bug), _) => Err(ModelFailure::Bug(bug.clone())),
            (_, _, Value::String(failed)) => Err(ModelFailure::Failed(failed.clone())),
            _ => Err(ModelFailure::Bug(format!(
                "the model adapter answered {answer}"
            ))),
        }
    }
}

/// JavaScript tools, adapted by `index.cjs`: asked with `{"name", "arguments", "runId",
/// "callId", "epoch"}`, they answer `{"output", "isError"}`.
struct JsTools(Arc<Callback>);

#[async_trait]
impl sdk::ForeignTools for JsTools {
    async fn call(&self, call: ForeignCall) -> (String, bool) {
        let request = json!({
            "name": call.name,
            "arguments": call.arguments,
            "runId": call.run_id,
            "callId": call.call_id,
            "epoch": call.epoch,
        })
        .to_string();
        let answer = match self.0.call_async(request).await {
            Ok(promise) => promise.await,
            Err(error) => Err(error),
        };
        let failed = |why: String| (format!("tool '{}' failed: {why}", call.name), true);
        match answer.map(|text| serde_json::from_str::<Value>(&text)) {
            Ok(Ok(value)) => match (&value["output"], &value["isError"]) {
                (Value::String(output), Value::Bool(is_error)) => (output.clone(), *is_error),
                _ => failed(format!("the tool adapter answered {value}")),
            },
            Ok(Err(error)) => failed(format!("the tool adapter answered no JSON: {error}")),
            Err(error) => failed(error.reason.clone()),
        }
    }
}

/// The agent of a host or worker: the configuration's own model and command tools, or the
/// JavaScript ones given.
fn agent(
    config: &NativeConfig,
    model: Option<Callback>,
    tools: Option<Callback>,
    declared: Option<Vec<ToolDeclaration>>,
) -> sdk::Result<Agent> {
    let model = model.map(|m| Arc::new(JsModel(Arc::new(m))) as Arc<dyn sdk::ForeignModel>);
    let tools = match (tools, declared) {
        (Some(tools), Some(declared)) => Some((
            Arc::new(JsTools(Arc::new(tools))) as Arc<dyn sdk::ForeignTools>,
            specs(declared)?,
        )),
        (None, None) => None,
        _ => {
            return Err(Failure::invalid(
                "tools need both their callback and their declarations",
            ));
        }
    };
    sdk::agent(&config.inner, model, tools)
}

fn state_dir(given: Option<String>) -> sdk::Result<LogDir> {
    sdk::state_dir(given.map(PathBuf::from))
}

/// A stop flag for one driven run: `set()` asks that run (only) to stop after its step.
#[napi]
pub struct NativeStop {
    flag: Arc<AtomicBool>,
}

#[napi]
impl NativeStop {
    /// A flag not yet set.
    #[napi(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        NativeStop {
            flag: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Asks the run to stop after its current step.
    #[napi]
    pub fn set(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }
}

/// How a host is made (camelCase in JavaScript).
#[napi(object)]
pub struct HostOptions {
    /// Where the local fact logs go (default: the state directory).
    pub state_dir: Option<String>,
    /// The holder ID written into this host's leases (default: random per host).
    pub holder_id: Option<String>,
    /// The TTL of its heartbeat and its runs' leases.
    pub lease_ttl_ms: Option<u32>,
}

/// A host: starts and drives runs, continues its own, runs workflows, and journals runs whose
/// loop it drives itself. It beats from `begin()` until `close()`.
#[napi]
pub struct NativeHost {
    node: Node,
    beating: Arc<Mutex<Option<Arc<sdk::Beating>>>>,
    /// The stop flags of the runs it drives now; `stop()` sets each.
    stops: Arc<Mutex<Vec<Weak<AtomicBool>>>>,
}

impl NativeHost {
    fn beating(&self) -> sdk::Result<Arc<sdk::Beating>> {
        let beating = self.beating.lock().unwrap_or_else(|e| e.into_inner());
        match &*beating {
            Some(beating) if !beating.is_closed() => Ok(Arc::clone(beating)),
            _ => Err(Failure::invalid(format!(
                "host '{}' is closed; open a new Host",
                self.node.holder.id()
            ))),
        }
    }

    /// This host's node for one call, with a stop flag of its own.
    fn node_for_call(&self, stop: Option<&NativeStop>) -> sdk::Result<Node> {
        self.beating()?;
        let flag = stop.map_or_else(|| Arc::new(AtomicBool::new(false)), |s| Arc::clone(&s.flag));
        let mut stops = self.stops.lock().unwrap_or_else(|e| e.into_inner());
        stops.retain(|weak| weak.strong_count() > 0);
        stops.push(Arc::downgrade(&flag));
        let mut node = self.node.clone();
        node.stop = flag;
        Ok(node)
    }
}

#[napi]
impl NativeHost {
    /// A host over `store` with `config`'s agent, or the JavaScript model and tools given.
    #[napi(constructor)]
    pub fn new(
        store: &NativeStore,
        config: &NativeConfig,
        model: Option<Callback>,
        tools: Option<Callback>,
        declared: Option<Vec<ToolDeclaration>>,
        options: HostOptions,
    ) -> napi::Result<Self> {
        let ttl = options.lease_ttl_ms.unwrap_or(15_000);
        if ttl == 0 {
            return Err(thrown(Failure::invalid("leaseTtlMs must be at least 1")));
        }
        let agent = agent(config, model, tools, declared).map_err(thrown)?;
        let logs = state_dir(options.state_dir).map_err(thrown)?;
        let holder = Holder::new(
            &store.inner,
            options
                .holder_id
                .unwrap_or_else(|| sdk::default_id("js-host")),
            Duration::from_millis(u64::from(ttl)),
        );
        Ok(NativeHost {
            node: Node {
                store: store.inner.clone(),
                agent,
                logs,
                holder,
                stop: Arc::new(AtomicBool::new(false)),
            },
            beating: Arc::default(),
            stops: Arc::default(),
        })
    }

    /// Beats for the first time (a holder ID a live process uses is refused), then keeps
    /// beating until `close()`.
    #[napi]
    pub fn begin<'env>(&self, env: &'env Env) -> Promised<'env, ()> {
        let holder = Arc::clone(&self.node.holder);
        let slot = Arc::clone(&self.beating);
        spawn(env, move || async move {
            let beating = Arc::new(sdk::Beating::start(holder).await?);
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(beating);
            Ok(())
        })
    }

    /// The holder ID in this host's leases.
    #[napi(getter)]
    pub fn holder_id(&self) -> String {
        self.node.holder.id().to_owned()
    }

    /// The SHA-256 of this host's configuration fingerprint.
    #[napi(getter)]
    pub fn fingerprint(&self) -> String {
        self.node.agent.fingerprint_sha256()
    }

    /// Starts run `run_id` with `prompt` and drives it until it ends, parks or is stopped.
    #[napi]
    pub fn run<'env>(
        &self,
        env: &'env Env,
        run_id: String,
        prompt: String,
        session_id: Option<String>,
        stop: Option<&NativeStop>,
    ) -> Promised<'env, String> {
        let node = self.node_for_call(stop);
        spawn_json(env, move || async move {
            let node = node?;
            let run = sdk::run_id(&run_id)?;
            let stopped = node
                .start_run(&run, session_id.map(SessionId::new), &prompt)
                .await?;
            Ok(sdk::stopped_json(&run, &stopped))
        })
    }

    /// Continues run `run_id` under its own ID (its earlier holder fenced) and drives it.
    #[napi]
    pub fn resume_run<'env>(
        &self,
        env: &'env Env,
        run_id: String,
        stop: Option<&NativeStop>,
    ) -> Promised<'env, String> {
        let node = self.node_for_call(stop);
        spawn_json(env, move || async move {
            let node = node?;
            let run = sdk::run_id(&run_id)?;
            let stopped = node.resume_run(&run).await?;
            Ok(sdk::stopped_json(&run, &stopped))
        })
    }

    /// Starts run `run_id` for a loop the host drives itself.
    #[napi]
    pub fn start<'env>(
        &self,
        env: &'env Env,
        run_id: String,
        prompt: String,
        session_id: Option<String>,
    ) -> Promised<'env, NativeJournal> {
        let node = self.node_for_call(None);
        let beating = self.beating();
        spawn(env, move || async move {
            let (node, beating) = (node?, beating?);
            let run = sdk::run_id(&run_id)?;
            let journaled = node
                .begin_run(&run, session_id.map(SessionId::new), &prompt)
                .await?;
            Ok(NativeJournal {
                inner: sdk::Journal::new(node, beating, journaled),
            })
        })
    }

    /// Takes run `run_id` over (fencing its earlier holder) for a loop the host drives.
    #[napi]
    pub fn resume<'env>(&self, env: &'env Env, run_id: String) -> Promised<'env, NativeJournal> {
        let node = self.node_for_call(None);
        let beating = self.beating();
        spawn(env, move || async move {
            let (node, beating) = (node?, beating?);
            let run = sdk::run_id(&run_id)?;
            let journaled = node.continue_run(&run).await?;
            Ok(NativeJournal {
                inner: sdk::Journal::new(node, beating, journaled),
            })
        })
    }

    /// Runs (or resumes) workflow `workflow_id` from its specs (JSON `[{"step", "prompt",
    /// "session_id"?}]`); finished steps are skipped.
    #[napi]
    pub fn parallel_resumable<'env>(
        &self,
        env: &'env Env,
        specs: String,
        workflow_id: String,
        poll_ms: u32,
    ) -> Promised<'env, String> {
        let store = self.node.store.clone();
        let agent = self.node.agent.clone();
        let open = self.beating();
        spawn_json(env, move || async move {
            open?;
            let steps: Vec<rekindle::fleet::workflow::StepSpec> =
                serde_json::from_value(parse_json("the workflow's steps", &specs)?)
                    .map_err(|e| Failure::invalid(format!("workflow '{workflow_id}': {e}")))?;
            let report = rekindle::fleet::workflow::run(
                &store,
                &agent,
                &workflow_id,
                &steps,
                Duration::from_millis(u64::from(poll_ms.max(10))),
            )
            .await?;
            Ok(json!({
                "skipped": report.skipped,
                "dispatched": report.dispatched,
                "completed": sdk::serialize(&report.completed),
            }))
        })
    }

    /// Asks every run this host drives now to stop after its current step.
    #[napi]
    pub fn stop(&self) {
        let stops = self.stops.lock().unwrap_or_else(|e| e.into_inner());
        for flag in stops.iter().filter_map(Weak::upgrade) {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// Stops the runs in flight after their step, then the heartbeat, and removes it.
    #[napi]
    pub fn close<'env>(&self, env: &'env Env) -> Promised<'env, ()> {
        self.stop();
        let beating = self
            .beating
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        spawn(env, move || async move {
            match beating {
                Some(beating) => beating.close().await,
                None => Ok(()),
            }
        })
    }
}

/// A run whose loop the host drives: each record is durable before its promise resolves.
#[napi]
pub struct NativeJournal {
    inner: sdk::Journal,
}

impl NativeJournal {
    fn record<'env>(
        &self,
        env: &'env Env,
        body: sdk::Result<FactBody>,
        close: bool,
    ) -> Promised<'env, String> {
        let journal = self.inner.clone();
        spawn_json(
            env,
            move || async move { journal.record(body?, close).await },
        )
    }
}

#[napi]
impl NativeJournal {
    /// The run.
    #[napi(getter)]
    pub fn run_id(&self) -> String {
        self.inner.run_id().to_string()
    }

    /// The committed state, or null once handed back.
    #[napi]
    pub fn state<'env>(&self, env: &'env Env) -> Promised<'env, String> {
        let journal = self.inner.clone();
        spawn_json(env, move || async move {
            Ok(journal.state().await.unwrap_or(Value::Null))
        })
    }

    /// The lease epoch this host journals at, or null once handed back.
    #[napi]
    pub fn epoch<'env>(&self, env: &'env Env) -> Promised<'env, String> {
        let journal = self.inner.clone();
        spawn_json(env, move || async move { Ok(json!(journal.epoch().await)) })
    }

    /// Records the model's turn (tool calls as JSON `[{"id", "name", "arguments"}]`).
    #[napi]
    pub fn record_model_turn<'env>(
        &self,
        env: &'env Env,
        content: Option<String>,
        tool_calls: Option<String>,
        input_tokens: i64,
        output_tokens: i64,
        reasoning: Option<String>,
    ) -> Promised<'env, String> {
        let run = self.inner.run_id().clone();
        let body = tool_calls
            .map(|text| parse_json(&format!("run \"{run}\": the tool calls"), &text))
            .transpose()
            .and_then(|calls| {
                sdk::model_turn(
                    &run,
                    content,
                    calls,
                    Usage {
                        input_tokens: input_tokens.max(0) as u64,
                        output_tokens: output_tokens.max(0) as u64,
                    },
                    reasoning,
                )
            });
        self.record(env, body, false)
    }

    /// Records a tool call's result.
    #[napi]
    pub fn record_tool_result<'env>(
        &self,
        env: &'env Env,
        call_id: String,
        output: String,
        is_error: bool,
        duration_ms: i64,
    ) -> Promised<'env, String> {
        let body = FactBody::ToolResult(ToolResult {
            call_id: CallId::new(call_id),
            output,
            is_error,
            duration_ms: duration_ms.max(0) as u64,
        });
        self.record(env, Ok(body), false)
    }

    /// Records more user input.
    #[napi]
    pub fn record_user_message<'env>(
        &self,
        env: &'env Env,
        text: String,
    ) -> Promised<'env, String> {
        let body = FactBody::UserMessage(UserMessage { content: text });
        self.record(env, Ok(body), false)
    }

    /// Parks the run until a human approves or denies tool call `call_id`; hands it back.
    #[napi]
    pub fn ask_confirmation<'env>(
        &self,
        env: &'env Env,
        call_id: String,
        prompt: String,
    ) -> Promised<'env, String> {
        let body = FactBody::ConfirmationRequested(ConfirmationRequested {
            call_id: CallId::new(call_id),
            prompt,
        });
        self.record(env, Ok(body), true)
    }

    /// Parks the run until a human answers question `question_id`; hands it back.
    #[napi]
    pub fn ask_question<'env>(
        &self,
        env: &'env Env,
        question_id: String,
        text: String,
    ) -> Promised<'env, String> {
        let body = FactBody::QuestionAsked(QuestionAsked {
            question_id: QuestionId::new(question_id),
            text,
        });
        self.record(env, Ok(body), true)
    }

    /// Ends the run with `outcome` and hands it back.
    #[napi]
    pub fn finish<'env>(
        &self,
        env: &'env Env,
        outcome: String,
        message: String,
    ) -> Promised<'env, String> {
        let body = sdk::outcome(self.inner.run_id(), &outcome)
            .map(|outcome| FactBody::Terminal(Terminal { outcome, message }));
        self.record(env, body, true)
    }

    /// Hands the run back unfinished: its lease is released.
    #[napi]
    pub fn close<'env>(&self, env: &'env Env) -> Promised<'env, ()> {
        let journal = self.inner.clone();
        spawn(env, move || async move { journal.close().await })
    }
}

/// How a worker runs (camelCase in JavaScript).
#[napi(object)]
pub struct WorkerSettings {
    /// The worker's ID (default: random per worker).
    pub worker_id: Option<String>,
    /// Recoveries run at once (default 1).
    pub concurrency: Option<u32>,
    /// More that may wait assigned to it (default: as many as run).
    pub queue: Option<u32>,
    /// The TTL of its heartbeat and its recoveries' leases (default 30 000).
    pub ttl_ms: Option<u32>,
    /// How often it reads its inbox when nothing wakes it.
    pub poll_interval_ms: Option<u32>,
    /// Serve /healthz, /readyz, /metrics and POST /wake here, e.g. `0.0.0.0:9090`.
    pub listen: Option<String>,
    /// The address the coordinator reaches /wake at.
    pub advertise: Option<String>,
    /// Where the local fact logs go.
    pub state_dir: Option<String>,
}

/// A worker: executes the recoveries the coordinator assigns to it.
#[napi]
pub struct NativeWorker {
    store: rekindle::store::Store,
    agent: Agent,
    logs: LogDir,
    setup: sdk::WorkerSetup,
    stop: Arc<AtomicBool>,
    stats: Arc<WorkerStats>,
}

#[napi]
impl NativeWorker {
    /// A worker over `store` with `config`'s agent, or the JavaScript model and tools given.
    #[napi(constructor)]
    pub fn new(
        store: &NativeStore,
        config: &NativeConfig,
        model: Option<Callback>,
        tools: Option<Callback>,
        declared: Option<Vec<ToolDeclaration>>,
        settings: WorkerSettings,
    ) -> napi::Result<Self> {
        if model.is_none() && !sdk::has_model(&config.inner) {
            return Err(thrown(Failure::invalid(
                "a worker needs a model: give it one, or a configuration loaded from a rekindle.toml with one",
            )));
        }
        let id = settings
            .worker_id
            .unwrap_or_else(|| sdk::default_id("js-worker"));
        let mut setup = sdk::WorkerSetup::new(
            id,
            settings.concurrency.unwrap_or(1),
            Duration::from_millis(u64::from(settings.ttl_ms.unwrap_or(30_000))),
        );
        setup.queue = settings.queue;
        setup.poll_interval = settings
            .poll_interval_ms
            .map(|ms| Duration::from_millis(u64::from(ms)));
        setup.listen_on(settings.listen).map_err(thrown)?;
        setup.advertise = settings.advertise;
        setup.check().map_err(thrown)?;
        Ok(NativeWorker {
            store: store.inner.clone(),
            agent: agent(config, model, tools, declared).map_err(thrown)?,
            logs: state_dir(settings.state_dir).map_err(thrown)?,
            setup,
            stop: Arc::new(AtomicBool::new(false)),
            stats: Arc::new(WorkerStats::default()),
        })
    }

    /// The worker's ID.
    #[napi(getter)]
    pub fn worker_id(&self) -> String {
        self.setup.id.clone()
    }

    /// The SHA-256 of its configuration fingerprint.
    #[napi(getter)]
    pub fn fingerprint(&self) -> String {
        self.agent.fingerprint_sha256()
    }

    /// Runs until `stop()`; then lets the running recoveries finish their step, hands them
    /// back and resolves.
    #[napi]
    pub fn run<'env>(&self, env: &'env Env) -> Promised<'env, ()> {
        let (store, agent, logs) = (self.store.clone(), self.agent.clone(), self.logs.clone());
        let (setup, stop, stats) = (
            self.setup.clone(),
            Arc::clone(&self.stop),
            Arc::clone(&self.stats),
        );
        spawn(env, move || {
            sdk::run_worker(store, agent, logs, setup, stop, stats)
        })
    }

    /// Asks the worker to stop gracefully.
    #[napi]
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Attempts started, recoveries finished, attempts failed and fenced, as JSON.
    #[napi]
    pub fn stats(&self) -> String {
        sdk::stats_json(&self.stats).to_string()
    }
}
