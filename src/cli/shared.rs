//! Pieces every binary shares: store flags and environment, parsed once into the library's
//! typed settings; logging setup; stopping on SIGTERM. Binaries stay thin: parse settings,
//! call these, call the library's `run`.
//!
//! Compiled into the binaries only, never into the library (whose API has no clap types):
//! `rekindle` has it as `cli::shared`, and the fleet binaries include this file by path. This
//! is the one place that reads the store's environment variables (`REKINDLE_SEAL_KEY*`,
//! `REKINDLE_FAULTS*`, `AWS_ALLOW_HTTP`); below it, `Store::open` takes explicit values.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use rekindle::clock::SystemClock;
use rekindle::store::faults::FaultSettings;
use rekindle::store::seal::{SealKeys, Sealer};
use rekindle::store::{RetryPolicy, S3Addressing, Store, StoreSettings, StoreUrl};

/// Where the bucket is, and how to reach it.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct StoreArgs {
    /// Store URL: s3://bucket/prefix, file:///abs/path (or a plain path), or memory://.
    /// S3 credentials, region and endpoint come from the standard AWS environment.
    #[arg(long, env = "REKINDLE_STORE")]
    pub store: StoreUrl,
    #[command(flatten)]
    pub settings: StoreSettingsArgs,
}

impl StoreArgs {
    /// Opens the store; `read_only` skips the capability probe (and never creates a local
    /// directory).
    pub(crate) async fn open(&self, read_only: bool) -> anyhow::Result<Store> {
        let settings = self.settings.settings(read_only)?;
        let new = matches!(&self.store, StoreUrl::Local { root } if !root.exists());
        let store = Store::open(&self.store, &settings, SystemClock::shared()).await?;
        if new && !read_only {
            eprintln!("note: created a new Rekindle store at {}", self.store);
        }
        Ok(store)
    }

    /// [`Self::open`] for a command that writes runs (`run`, `workflow run`): on `memory://`
    /// it says first that nothing it writes outlives this process.
    pub(crate) async fn open_for_runs(&self) -> anyhow::Result<Store> {
        if self.store.is_memory() {
            eprintln!(
                "note: {}: a memory store keeps nothing once this process exits; an interrupted run cannot be recovered and no other command sees it (give a directory or s3://bucket/prefix to keep it)",
                self.store
            );
        }
        self.open(false).await
    }

    /// Opens a store that must already exist (a command about runs in it): a location with no
    /// Rekindle store is an error naming it, not an empty store, and nothing is created
    /// there. Unless `read_only`, the capability probe runs after that check.
    pub(crate) async fn open_existing(&self, read_only: bool) -> anyhow::Result<Store> {
        if self.store.is_memory() {
            // Every process gets its own empty memory store: reading runs that another
            // process wrote there would report an empty fleet, never an error.
            anyhow::bail!(
                "{}: a memory store lives inside one process and starts empty, so it holds no runs for this command; give the directory or s3://bucket/prefix the runs are in",
                self.store
            );
        }
        let settings = self.settings.settings(true)?;
        let store = Store::open(&self.store, &settings, SystemClock::shared()).await?;
        store.check_exists().await?;
        if !read_only {
            store.probe_once().await?;
            store.check_format().await?;
        }
        Ok(store)
    }
}

/// How to reach the store, beyond its URL (every command that has a store takes these).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct StoreSettingsArgs {
    /// S3 endpoint (e.g. http://127.0.0.1:9000 for MinIO); overrides AWS_ENDPOINT_URL.
    #[arg(long, env = "REKINDLE_S3_ENDPOINT")]
    pub endpoint: Option<String>,
    /// Allow plain-HTTP S3 endpoints (also AWS_ALLOW_HTTP=true).
    #[arg(long)]
    pub allow_http: bool,
    /// Use virtual-hosted-style S3 requests instead of path-style.
    #[arg(long)]
    pub virtual_hosted_style: bool,
    /// S3 region (default: from the AWS environment or profile).
    #[arg(long)]
    pub region: Option<String>,
    /// Deadline for one store request; a stalled request is retried after it (at least 1).
    #[arg(long, env = "REKINDLE_STORE_TIMEOUT_MS", default_value_t = 30_000, value_parser = at_least_one::<u64>)]
    pub store_timeout_ms: u64,
}

impl StoreSettingsArgs {
    /// The store settings these flags and the environment give: sealing keys from
    /// `REKINDLE_SEAL_KEY` or `REKINDLE_SEAL_KEY_FILE` (with `REKINDLE_SEAL_KEY_ID` and
    /// `REKINDLE_SEAL_OLD_KEYS`), plain HTTP also from `AWS_ALLOW_HTTP`, and, for the fault
    /// tests only, `REKINDLE_FAULTS` and `REKINDLE_FAULTS_PARTITION_FILE`. `read_only` skips the
    /// capability probe.
    pub(crate) fn settings(&self, read_only: bool) -> anyhow::Result<StoreSettings> {
        Ok(StoreSettings {
            endpoint: self.endpoint.clone(),
            addressing: if self.virtual_hosted_style {
                S3Addressing::VirtualHosted
            } else {
                S3Addressing::Path
            },
            allow_http: self.allow_http
                || std::env::var("AWS_ALLOW_HTTP")
                    .is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1"),
            region: self.region.clone(),
            retry: RetryPolicy {
                attempt_timeout: Duration::from_millis(self.store_timeout_ms.max(1)),
                ..RetryPolicy::default()
            },
            sealer: sealer_from_env()?.map(Arc::new),
            faults: faults_from_env()?,
            skip_probe: read_only,
        })
    }
}

/// The sealer the environment configures, if any.
fn sealer_from_env() -> anyhow::Result<Option<Sealer>> {
    Ok(match SealKeys::from_env()? {
        Some(keys) => Some(Sealer::configure(&keys)?),
        None => None,
    })
}

/// Test-only fault injection, when the environment asks for it (the chaos tests start real
/// processes with it); the store logs a warning when it is on.
fn faults_from_env() -> anyhow::Result<Option<FaultSettings>> {
    let spec = std::env::var("REKINDLE_FAULTS").ok();
    let partition_file = std::env::var_os("REKINDLE_FAULTS_PARTITION_FILE").map(PathBuf::from);
    if spec.is_none() && partition_file.is_none() {
        return Ok(None);
    }
    let mut faults =
        FaultSettings::parse(spec.as_deref().unwrap_or("")).context("read REKINDLE_FAULTS")?;
    faults.partition_file = partition_file;
    Ok(Some(faults))
}

/// Logs to stderr, as JSON when `json`, when `REKINDLE_LOG_FORMAT=json`, or on Kubernetes
/// (`KUBERNETES_SERVICE_HOST` set) unless `REKINDLE_LOG_FORMAT=text`; in colour only on a
/// terminal and without `NO_COLOR`. `RUST_LOG` selects what is logged (default:
/// `default_level`).
pub(crate) fn init_tracing(json: bool, default_level: &str) {
    use std::io::IsTerminal;
    // Without RUST_LOG, the AWS SDK's own warnings (multi-kilobyte debug dumps while it looks
    // for credentials) stay out of the way: the store error that follows names the problem.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{default_level},aws_config=error"))
    });
    let format = std::env::var("REKINDLE_LOG_FORMAT").unwrap_or_default();
    if !matches!(format.as_str(), "" | "json" | "text") {
        eprintln!(
            "warning: REKINDLE_LOG_FORMAT={format:?} is neither json nor text; logging as text"
        );
    }
    let json = json
        || format == "json"
        || (format != "text" && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some());
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// A flag set on SIGTERM or SIGINT, for a graceful stop.
pub(crate) fn stop_on_signals() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            biased;
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("stop requested: stopping gracefully");
        flag.store(true, Ordering::SeqCst);
    });
    stop
}

/// A process identity: the given one, else the pod or host name plus the process ID.
pub(crate) fn default_id(role: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".into());
    format!("{role}-{host}-{}", std::process::id())
}

/// The state directory for local fact logs: the given one or the XDG default.
pub(crate) fn state_dir(given: Option<PathBuf>) -> Result<PathBuf, rekindle::store::log::LogError> {
    match given {
        Some(dir) => Ok(dir),
        None => rekindle::store::log::default_dir(),
    }
}

/// Runs a binary's async main on a multi-threaded runtime and turns its result into the exit
/// code, printing an error as one line (with its causes, for errors that format them with
/// `{:#}`).
pub(crate) fn run_async<E: std::fmt::Display>(
    future: impl std::future::Future<Output = Result<(), E>>,
) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(future);
    // The work is done (leases released, heartbeats retired): do not wait on idle server
    // connections or blocking threads on the way out.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What a fleet process serves: wake-ups, readiness and metrics.
pub(crate) struct Endpoint {
    /// Notified by `POST /wake`.
    pub wakeup: rekindle::fleet::wake::Wakeup,
    /// The address advertised for wake-ups, if there is one.
    pub url: Option<String>,
    /// What `/readyz` answers; the process marks itself started, draining, leading.
    pub readiness: Arc<rekindle::fleet::readiness::Readiness>,
}

/// Where a fleet process takes wake-ups and answers probes, set up before the store is opened
/// (so `/readyz` says "not ready" meanwhile, and an address in use is a startup error): the
/// `--listen` server, with the Prometheus recorder installed for `component`, advertised as
/// `advertise` (or the listen address when it names a host); else an ephemeral loopback
/// endpoint for wake-ups only, which reaches processes on this machine. It serves for the
/// rest of the process.
pub(crate) async fn endpoint(
    listen: Option<std::net::SocketAddr>,
    advertise: Option<&str>,
    component: &'static str,
) -> anyhow::Result<Endpoint> {
    if listen.is_none() && advertise.is_some() {
        anyhow::bail!(
            "--advertise needs --listen: without it, wake-ups are served on an ephemeral loopback port only this machine reaches"
        );
    }
    let (wakeup, url, readiness) = rekindle::sdk::Endpoint::open(listen, advertise, component)
        .await
        .map_err(|failure| anyhow::anyhow!(failure.message))?
        .detach();
    Ok(Endpoint {
        wakeup,
        url,
        readiness,
    })
}

/// Every flag of `command` and its subcommands as Markdown: name, environment variable,
/// default and help, generated from the clap definitions (the `--help-markdown` of each
/// binary writes `docs/flags.md`, which a test keeps current).
pub(crate) fn flags_markdown(command: &clap::Command) -> String {
    let mut out = String::new();
    let mut command = command.clone();
    command.build();
    write_flags(&mut out, &command, command.get_name());
    out
}

fn write_flags(out: &mut String, command: &clap::Command, path: &str) {
    use std::fmt::Write;
    let arguments: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set() && arg.get_id() != "help" && arg.get_id() != "version")
        .collect();
    if !arguments.is_empty() || command.get_subcommands().next().is_none() {
        let _ = writeln!(out, "### `{path}`\n");
        if let Some(about) = command.get_about() {
            let _ = writeln!(out, "{about}\n");
        }
        let _ = writeln!(out, "| flag | environment | default | meaning |");
        let _ = writeln!(out, "| --- | --- | --- | --- |");
        for arg in arguments {
            let name = match (arg.get_long(), arg.get_short()) {
                (Some(long), _) => format!("`--{long}`"),
                (None, Some(short)) => format!("`-{short}`"),
                (None, None) => format!("`<{}>`", arg.get_id().as_str().to_uppercase()),
            };
            let env = arg
                .get_env()
                .map(|env| format!("`{}`", env.to_string_lossy()))
                .unwrap_or_default();
            let default = arg
                .get_default_values()
                .iter()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(", ");
            let help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string().replace('\n', " ").replace('|', "\\|"))
                .unwrap_or_default();
            let _ = writeln!(out, "| {name} | {env} | {default} | {help} |");
        }
        out.push('\n');
    }
    for sub in command.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        write_flags(out, sub, &format!("{path} {}", sub.get_name()));
    }
}

/// Environment variables read outside the flags (by this module and the store's sealing),
/// for the reference: name, meaning.
pub(crate) const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "REKINDLE_SEAL_KEY",
        "A 256-bit key, 64 hex characters, that seals generation payloads with AES-256-GCM.",
    ),
    (
        "REKINDLE_SEAL_KEY_FILE",
        "A file holding the sealing key (instead of REKINDLE_SEAL_KEY).",
    ),
    (
        "REKINDLE_SEAL_KEY_ID",
        "The sealing key's ID, written with every sealed generation (default: derived from the key).",
    ),
    (
        "REKINDLE_SEAL_OLD_KEYS",
        "Older keys still accepted for reading (`id:hex,id:hex`), for rotation.",
    ),
    (
        "AWS_ALLOW_HTTP",
        "`true` or `1`: allow plain-HTTP S3 endpoints (as --allow-http).",
    ),
    (
        "AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ...",
        "The standard AWS environment and profile chain (IRSA on EKS) for S3 credentials, region and endpoint.",
    ),
    (
        "REKINDLE_LOG_FORMAT",
        "`json` for JSON lines, `text` for plain text (default: JSON on Kubernetes, text elsewhere).",
    ),
    (
        "KUBERNETES_SERVICE_HOST",
        "Set by Kubernetes in every pod: logs default to JSON lines.",
    ),
    (
        "NO_COLOR",
        "Set (non-empty): no colour in logs, even on a terminal (logs are never coloured off a terminal).",
    ),
    (
        "RUST_LOG",
        "Which logs are written, e.g. `info`, `rekindle=debug`, `rekindle::store=trace` (every store request).",
    ),
    (
        "HOSTNAME",
        "Part of the default process ID (`worker-<hostname>-<pid>`).",
    ),
    (
        "REKINDLE_FAULTS, REKINDLE_FAULTS_PARTITION_FILE",
        "Fault injection for the test suite only; a store opened with it logs a warning.",
    ),
];

/// The environment-only variables as a Markdown table.
pub(crate) fn environment_markdown() -> String {
    let mut out = String::from("### Environment only\n\n| variable | meaning |\n| --- | --- |\n");
    for (name, meaning) in ENVIRONMENT {
        out.push_str(&format!("| `{name}` | {} |\n", meaning.replace('|', "\\|")));
    }
    out.push('\n');
    out
}

/// Prints the flags reference and exits when the first argument is `--help-markdown`.
pub(crate) fn help_markdown<P: clap::CommandFactory>() {
    if std::env::args().nth(1).as_deref() == Some("--help-markdown") {
        print!("{}", flags_markdown(&P::command()));
        std::process::exit(0);
    }
}

/// Parses a whole number of at least 1, for flags where 0 means nothing (a concurrency, a
/// TTL, a count): refused with "must be at least 1".
/// Parses a number above zero, fractions allowed (`0.5`).
pub(crate) fn above_zero(text: &str) -> Result<f64, String> {
    let n: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if !(n > 0.0 && n.is_finite()) {
        return Err("must be above 0".into());
    }
    Ok(n)
}

pub(crate) fn at_least_one<T: std::str::FromStr + PartialOrd + From<u8>>(
    text: &str,
) -> Result<T, String> {
    let n: T = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a whole number"))?;
    if n < T::from(1) {
        return Err("must be at least 1".into());
    }
    Ok(n)
}
