//! Health, readiness and Prometheus metrics over HTTP for the fleet binaries.
//!
//! `/healthz` answers 200 while the process runs; `/readyz` answers 200 once it has opened
//! the store and registered (503 before, and again while stopping); `/metrics` renders the
//! store's request counters and the component's own counters in the Prometheus text format;
//! `POST /wake` cuts the process's wait for work short (see `fleet::wake`).

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

use crate::store::Store;

/// Extra gauges and counters a component exposes: (name, help, value).
pub type Extra = Arc<dyn Fn() -> Vec<(&'static str, &'static str, f64)> + Send + Sync>;

/// Renders the metrics text.
pub fn render(
    store: &Store,
    component: &str,
    extra: &[(&'static str, &'static str, f64)],
) -> String {
    let m = store.metrics();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP rekindle_store_requests_total Store requests by kind, retries included."
    );
    let _ = writeln!(out, "# TYPE rekindle_store_requests_total counter");
    for (kind, value) in [
        ("get", m.get),
        ("head", m.head),
        ("put", m.put),
        ("conditional_put", m.conditional_put),
        ("list", m.list),
        ("delete", m.delete),
    ] {
        let _ = writeln!(
            out,
            "rekindle_store_requests_total{{component=\"{component}\",kind=\"{kind}\"}} {value}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP rekindle_store_bytes_total Bytes moved to and from the store."
    );
    let _ = writeln!(out, "# TYPE rekindle_store_bytes_total counter");
    let _ = writeln!(
        out,
        "rekindle_store_bytes_total{{component=\"{component}\",direction=\"written\"}} {}",
        m.bytes_written
    );
    let _ = writeln!(
        out,
        "rekindle_store_bytes_total{{component=\"{component}\",direction=\"read\"}} {}",
        m.bytes_read
    );
    for (name, help, value) in extra {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{component=\"{component}\"}} {value}");
    }
    out
}

/// Binds `listen` now, so an address in use is an error at startup, not a process running
/// without its endpoints.
pub async fn bind(listen: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| {
            std::io::Error::new(error.kind(), format!("cannot listen on {listen}: {error}"))
        })
}

/// Serves the endpoints on a bound listener until the process ends, with `POST /wake`
/// waking `wake` (see `fleet::wake`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    store: Store,
    component: &'static str,
    ready: Arc<AtomicBool>,
    extra: Extra,
    wake: Option<crate::fleet::wake::Wakeup>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.load(Ordering::SeqCst);
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let text = render(&store, component, &extra());
                async move { text }
            }),
        );
    let app = match wake {
        Some(wake) => app.merge(crate::fleet::wake::route(wake)),
        None => app,
    };
    let listen: SocketAddr = listener.local_addr()?;
    tracing::info!(%listen, "serving /healthz, /readyz, /metrics and /wake");
    axum::serve(listener, app).await
}
