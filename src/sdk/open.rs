//! Opening what a package's objects stand on: a store from a URL and plain options, a
//! configuration from its fields or a `rekindle.toml`, process IDs, the local state directory,
//! and the endpoint a worker takes wake-ups and probes on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::{Failure, Result, lift};
use crate::clock::SystemClock;
use crate::core::fact::RunId;
use crate::fleet::readiness::Readiness;
use crate::fleet::wake::{WakeSignal, Wakeup};
use crate::host::config::Config;
use crate::store::log::LogDir;
use crate::store::settings::{S3Addressing, StoreSettings, StoreUrl};
use crate::store::{RetryPolicy, Store};

/// The model kind of a configuration made from fields: its model is given by the package
/// (or absent, for hosts that journal their own loop).
const FOREIGN: &str = "foreign";

/// How a package opens a store; the defaults are the binaries'.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// An S3-compatible endpoint (MinIO, a test server); else `AWS_ENDPOINT_URL` or AWS.
    pub endpoint: Option<String>,
    /// Plain HTTP to the endpoint; else `AWS_ALLOW_HTTP`.
    pub allow_http: Option<bool>,
    /// The bucket's region; else the environment's.
    pub region: Option<String>,
    /// `https://bucket.host/` addressing instead of `https://host/bucket/`.
    pub virtual_hosted_style: bool,
    /// Each request's deadline.
    pub timeout_ms: u64,
    /// Retries of a request that failed for a reason worth retrying.
    pub retries: usize,
    /// Create the store if it is empty (else an empty store is an error naming it).
    pub create: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            endpoint: None,
            allow_http: None,
            region: None,
            virtual_hosted_style: false,
            timeout_ms: 30_000,
            retries: 8,
            create: true,
        }
    }
}

/// Opens the store at `url` (a directory, `s3://bucket/prefix`, `memory://`), with the
/// sealing keys of `REKINDLE_SEAL_KEYS` if set; a failure names the store.
pub async fn open_store(url: &str, options: &StoreOptions) -> Result<Store> {
    let named = |failure: Failure| failure.context(format!("cannot open store '{url}'"));
    let parsed = StoreUrl::parse(url).map_err(|e| named(Failure::from(crate::Error::from(e))))?;
    let sealer =
        match lift(crate::store::seal::SealKeys::from_env().map_err(Into::into)).map_err(named)? {
            Some(keys) => Some(Arc::new(
                lift(crate::store::seal::Sealer::configure(&keys).map_err(Into::into))
                    .map_err(named)?,
            )),
            None => None,
        };
    let settings = StoreSettings {
        endpoint: options.endpoint.clone(),
        addressing: if options.virtual_hosted_style {
            S3Addressing::VirtualHosted
        } else {
            S3Addressing::Path
        },
        allow_http: options.allow_http.unwrap_or_else(|| {
            std::env::var("AWS_ALLOW_HTTP")
                .is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
        }),
        region: options.region.clone(),
        retry: RetryPolicy {
            attempt_timeout: Duration::from_millis(options.timeout_ms.max(1)),
            max_retries: options.retries,
            ..RetryPolicy::default()
        },
        sealer,
        faults: None,
        skip_probe: !options.create,
    };
    let store = Store::open(&parsed, &settings, SystemClock::shared())
        .await
        .map_err(|e| named(Failure::from(crate::Error::from(e))))?;
    if !options.create {
        store
            .check_exists()
            .await
            .map_err(|e| named(Failure::from(crate::Error::from(e))))?;
    }
    Ok(store)
}

/// A configuration made from its fields, as a package's `Config` takes them.
#[derive(Clone, Debug, Default)]
pub struct ConfigOptions {
    /// The model's name (part of the fingerprint).
    pub model_name: String,
    /// The system prompt (part of the fingerprint).
    pub system_prompt: String,
    /// At most this many model turns per run.
    pub max_iterations: Option<i64>,
    /// At most this many tokens per run.
    pub max_tokens: Option<i64>,
    /// At most this many rounds of tool calls per run.
    pub max_tool_rounds: Option<i64>,
    /// At most this many steps per resume before a recovery yields its slot.
    pub steps_per_resume: Option<i64>,
    /// The model's thinking mode, if any.
    pub thinking: Option<String>,
}

/// The configuration `options` describe, with no model of its own (the package gives one)
/// and no command tools; `names` spells the fields as the package's users write them
/// (`("model_name", "max_iterations", …)` in Python, `modelName` … in JavaScript) for its
/// messages, in the order of [`ConfigOptions`]' fields.
pub fn config(options: ConfigOptions, names: [&str; 5]) -> Result<Config> {
    let [
        model_name,
        max_iterations,
        max_tokens,
        max_tool_rounds,
        steps_per_resume,
    ] = names;
    if options.model_name.trim().is_empty() {
        return Err(Failure::invalid(format!(
            "Config: {model_name} must not be empty"
        )));
    }
    let limit = |name: &str, value: Option<i64>, least: i64| -> Result<Option<u64>> {
        match value {
            Some(v) if v < least => Err(Failure::invalid(format!(
                "Config: {name} is {v}; it must be at least {least}"
            ))),
            other => Ok(other.map(|v| v as u64)),
        }
    };
    let text = "[model]\nkind = \"openai\"\nname = \"\"\nbase_url = \"http://unused\"\n";
    let mut config = Config::parse(text).map_err(Failure::invalid)?;
    config.model.kind = FOREIGN.into();
    config.model.base_url = None;
    config.model.name = options.model_name;
    config.model.thinking = options.thinking;
    config.system_prompt = options.system_prompt;
    config.budgets.max_iterations = limit(max_iterations, options.max_iterations, 1)?;
    config.budgets.max_tokens = limit(max_tokens, options.max_tokens, 1)?;
    config.budgets.max_tool_rounds = limit(max_tool_rounds, options.max_tool_rounds, 0)?;
    config.budgets.steps_per_resume = limit(steps_per_resume, options.steps_per_resume, 1)?
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX));
    config.dir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    Ok(config)
}

/// Whether `config` names a model of its own (a loaded `rekindle.toml`), rather than one the
/// package must give.
pub fn has_model(config: &Config) -> bool {
    config.model.kind != FOREIGN
}

/// A run ID from a package: refused when empty.
pub fn run_id(text: &str) -> Result<RunId> {
    if text.trim().is_empty() {
        return Err(Failure::invalid("a run ID must not be empty"));
    }
    Ok(RunId::new(text))
}

/// A recovery ID from a package: refused when empty.
pub fn recovery_id(text: &str) -> Result<crate::core::fact::RecoveryId> {
    if text.trim().is_empty() {
        return Err(Failure::invalid("a recovery ID must not be empty"));
    }
    Ok(crate::core::fact::RecoveryId::new(text))
}

/// The holder ID of a package's process, unless one is given: role, host, PID and a nonce,
/// so two hosts or workers in one process never share one (one would take the other's runs
/// over as its own).
pub fn default_id(role: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".into());
    let nonce = SystemClock::shared().nonce();
    format!(
        "{role}-{host}-{}-{}",
        std::process::id(),
        &nonce[..nonce.len().min(8)]
    )
}

/// The local fact logs' directory: `given`, or the default one.
pub fn state_dir(given: Option<PathBuf>) -> Result<LogDir> {
    let dir = match given {
        Some(dir) => dir,
        None => lift(crate::store::log::default_dir().map_err(Into::into))?,
    };
    lift(LogDir::open(dir).map_err(Into::into))
}

/// Where a fleet process takes wake-ups and answers probes: a server on a listen address
/// (`/healthz`, `/readyz`, `/metrics`, `POST /wake`), or an ephemeral loopback port for
/// wake-ups only, which reaches processes on this machine. The server stops when this is
/// dropped.
pub struct Endpoint {
    /// Notified by `POST /wake`.
    pub wakeup: Wakeup,
    /// The address advertised for wake-ups, if there is one.
    pub url: Option<String>,
    /// What `/readyz` answers; the process marks itself started, draining, leading.
    pub readiness: Arc<Readiness>,
    /// Whether the address was a listen address others may reach (not loopback only).
    pub reachable: bool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The metrics recorder is global to a process: installed once, by the first endpoint.
fn exporter(component: &'static str) -> Result<crate::metrics::Exporter> {
    static EXPORTER: OnceLock<std::result::Result<crate::metrics::Exporter, String>> =
        OnceLock::new();
    EXPORTER
        .get_or_init(|| crate::metrics::install(component))
        .clone()
        .map_err(|message| Failure {
            kind: crate::ErrorKind::Internal,
            message,
        })
}

impl Endpoint {
    /// Sets the endpoint up before the store is opened (so `/readyz` says "not ready"
    /// meanwhile, and an address in use is an error at once): on `listen`, with the Prometheus
    /// recorder installed for `component`, advertised as `advertise` (or the listen address
    /// when it names a host); without `listen`, on an ephemeral loopback port.
    pub async fn open(
        listen: Option<SocketAddr>,
        advertise: Option<&str>,
        component: &'static str,
    ) -> Result<Endpoint> {
        let wakeup: Wakeup = Arc::new(WakeSignal::new());
        let readiness = Arc::new(Readiness::default());
        let unavailable = |what: &str, error: std::io::Error| Failure {
            kind: crate::ErrorKind::Unavailable,
            message: format!("{what}: {error}"),
        };
        let Some(listen) = listen else {
            if advertise.is_some() {
                return Err(Failure::invalid(
                    "an advertised address needs a listen address: without one, wake-ups are served on an ephemeral loopback port only this machine reaches",
                ));
            }
            let url = crate::fleet::wake::serve_loopback(Arc::clone(&wakeup))
                .await
                .map_err(|e| unavailable("serve the wake-up endpoint", e))?;
            return Ok(Endpoint {
                wakeup,
                url: Some(url),
                readiness,
                reachable: false,
                tasks: Vec::new(),
            });
        };
        let url = crate::fleet::wake::advertised(listen, advertise).map_err(Failure::invalid)?;
        let listener = crate::serve::bind(listen)
            .await
            .map_err(|e| unavailable("serve health, metrics and wake-ups", e))?;
        let metrics = exporter(component)?;
        let upkeep = metrics.clone();
        let mut tasks = vec![tokio::spawn(async move {
            loop {
                crate::clock::sleep(Duration::from_secs(5)).await;
                upkeep.upkeep();
            }
        })];
        let wake = Arc::clone(&wakeup);
        let probe = Arc::clone(&readiness);
        tasks.push(tokio::spawn(async move {
            if let Err(error) =
                crate::serve::serve(listener, probe, Some(metrics), Some(wake)).await
            {
                tracing::error!(%listen, %error, "the health, metrics and wake-up server stopped");
            }
        }));
        if url.is_none() {
            tracing::warn!(%listen, "no address to advertise for wake-ups (give an advertised address, e.g. the pod IP); work reaches this process at its poll interval");
        }
        Ok(Endpoint {
            reachable: url.is_some(),
            wakeup,
            url,
            readiness,
            tasks,
        })
    }

    /// The parts, with the server left running for the rest of the process (a binary's
    /// endpoint lives as long as it does).
    pub fn detach(mut self) -> (Wakeup, Option<String>, Arc<Readiness>) {
        self.tasks.clear();
        (
            Arc::clone(&self.wakeup),
            self.url.clone(),
            Arc::clone(&self.readiness),
        )
    }

    /// The wake-ups and address a worker's options take.
    pub fn wake(&self) -> (Wakeup, Option<String>) {
        (Arc::clone(&self.wakeup), self.url.clone())
    }
}
