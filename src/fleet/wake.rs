//! Wake-ups: how work moves at once instead of at the next timer.
//!
//! The bucket stays the only source of truth; a wake-up only cuts a process's wait short so
//! it reads the bucket now. It may name recoveries (their IDs, nothing else): an admission
//! names the one it admitted, so the leading coordinator forwards the name to a worker with a
//! free slot at once ([`forward`]: the worker answers whether it claims fresh admissions now)
//! and reads that record, assigning it if no worker claims it, without waiting for the index
//! entry and the next scan (`coordinator`'s named assignment). A named ID is a hint to look,
//! never data to act on: the receiver reads the record from the bucket and changes it only by
//! compare-and-swap, as always, so a forged wake-up costs at most a read per ID (a worker also
//! lends the ID a slot for that read, and may claim a fresh admission any worker may start),
//! and only [`MAX_NAMED`] IDs are kept. It never holds the receiver's own scans off. Each worker and coordinator serves
//! `POST /wake` and advertises the address (a worker in its registration, every process in
//! its heartbeat, the leading coordinator in each worker's inbox). An admission wakes the
//! leading coordinator, which assigns at once and wakes the workers whose inboxes changed; a
//! worker whose recovery ends starts the next one waiting in its queue and wakes the
//! coordinator, which refills the queue (or fills the freed slot).
//!
//! A lost wake-up costs only time: every loop still polls the bucket at its interval, so a
//! process that cannot be reached (another network, a firewall, a crash) is served as before.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

use crate::core::fact::{RecoveryId, RunId};
use crate::core::layout;
use crate::store::Store;
use crate::store::lease;

/// How long a wake-up may take before it is given up (it is only a hint).
const POKE_TIMEOUT: Duration = Duration::from_millis(500);

/// Recovery IDs kept from wake-ups until the receiver looks at them; more are dropped (the
/// receiver's scan finds them anyway).
pub const MAX_NAMED: usize = 1024;

/// Longest recovery ID a wake-up may name; longer lines are ignored (and not sent).
const MAX_NAMED_ID_BYTES: usize = 512;

/// Largest wake-up body sent (the IDs of a batch of admissions); the receiver takes twice
/// that before it refuses one.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// The receiving end of wake-ups: a loop waits on it beside its poll timer.
pub type Wakeup = Arc<WakeSignal>;

/// What a wake-up leaves for its receiver: the signal that cuts its wait short, and the
/// recovery IDs wake-ups named since it last looked.
#[derive(Debug, Default)]
pub struct WakeSignal {
    notify: Notify,
    named: std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>,
    plain: std::sync::atomic::AtomicBool,
    /// How many more fresh admissions named to it the receiver claims now (a worker's free
    /// slots beyond the names waiting; 0 while stopping): its answer to a naming wake-up says
    /// whether it claims them all ([`forward`]). Guarded by `named`'s lock.
    claims: std::sync::atomic::AtomicUsize,
}

impl WakeSignal {
    /// A signal nobody has woken yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// What the receiver waits on.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }

    /// Wakes the receiver (one waiter; a wake-up with nobody waiting is kept for the next),
    /// naming nothing: a plain wake-up.
    pub fn notify_one(&self) {
        self.plain.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// Remembers `ids` for the receiver (up to [`MAX_NAMED`] in all), then wakes it. Naming
    /// none is a plain wake-up (see [`WakeSignal::take_plain`]).
    pub fn name(&self, ids: impl IntoIterator<Item = RecoveryId>) {
        let mut any = false;
        let mut dropped = false;
        {
            let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
            for id in ids {
                any = true;
                if named.len() >= MAX_NAMED && !named.contains(&id) {
                    dropped = true;
                    break;
                }
                named.insert(id);
            }
        }
        // Naming nothing, or more than is kept: the receiver looks at everything.
        if any && !dropped {
            self.notify.notify_one();
        } else {
            self.notify_one();
        }
    }

    /// Whether a wake-up that named nothing came since the last call: the receiver should
    /// look at everything, not only at what was named.
    pub fn take_plain(&self) -> bool {
        self.plain.swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// Says how many fresh admissions named to it the receiver claims from now on (0: none).
    /// Names taken after this call (see [`WakeSignal::take_named`]) include every name a
    /// wake-up was answered "claiming" for before it.
    pub fn set_claims(&self, claims: usize) {
        let _named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        self.claims
            .store(claims, std::sync::atomic::Ordering::SeqCst);
    }

    /// [`WakeSignal::set_claims`] from the receiver's free slots: less the names it holds and
    /// has not taken yet (each will take a slot), counted under the same lock as a claim, so
    /// a name that came since the receiver last took its names is not claimed twice over.
    pub fn set_free_slots(&self, free: usize) {
        let named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        self.claims.store(
            free.saturating_sub(named.len()),
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// [`WakeSignal::name`], answering whether the receiver claims them all: only if all are
    /// kept and they fit in what it claims now, which they then use up.
    pub fn name_claiming(&self, ids: Vec<RecoveryId>) -> bool {
        let claiming = {
            let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
            let budget = self.claims.load(std::sync::atomic::Ordering::SeqCst);
            let new = ids.iter().filter(|id| !named.contains(*id)).count();
            let fits = !ids.is_empty() && new <= budget && named.len() + new <= MAX_NAMED;
            if fits {
                self.claims
                    .store(budget - new, std::sync::atomic::Ordering::SeqCst);
                named.extend(ids.iter().cloned());
            }
            fits
        };
        if claiming {
            self.notify.notify_one();
        } else {
            self.name(ids);
        }
        claiming
    }

    /// The recovery IDs named since the last call, in ID order.
    pub fn take_named(&self) -> Vec<RecoveryId> {
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *named).into_iter().collect()
    }
}

/// The recovery IDs a wake-up's body names: one per line, blank and over-long lines skipped.
fn named_in(body: &[u8]) -> Vec<RecoveryId> {
    String::from_utf8_lossy(body)
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && line.len() <= MAX_NAMED_ID_BYTES)
        .take(MAX_NAMED)
        .map(RecoveryId::new)
        .collect()
}

/// The route that wakes `wakeup`, to merge into a process's HTTP server. The body, if any,
/// names recoveries to look at, one ID per line.
pub fn route(wakeup: Wakeup) -> axum::Router {
    axum::Router::new()
        .route(
            "/wake",
            axum::routing::post(move |body: axum::body::Bytes| {
                let claiming = wakeup.name_claiming(named_in(&body));
                async move { if claiming { CLAIMING } else { "woken" } }
            }),
        )
        .layer(axum::extract::DefaultBodyLimit::max(2 * MAX_BODY_BYTES))
}

/// Serves only `POST /wake` on an ephemeral loopback port (for a process started without
/// `--listen`, and for in-process fleets); returns the address to advertise.
pub async fn serve_loopback(wakeup: Wakeup) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, route(wakeup)).await {
            tracing::warn!(%error, "the wake-up endpoint stopped");
        }
    });
    Ok(url)
}

/// The scheme of in-process wake-up addresses ([`serve_local`]).
const LOCAL_SCHEME: &str = "local://";

/// Receivers served in this process, by name; a name is served until [`withdraw_local`].
fn locals() -> &'static std::sync::Mutex<std::collections::HashMap<String, Wakeup>> {
    static LOCALS: OnceLock<std::sync::Mutex<std::collections::HashMap<String, Wakeup>>> =
        OnceLock::new();
    LOCALS.get_or_init(Default::default)
}

/// Serves `wakeup` inside this process as `local://<name>`, the address to advertise: for a
/// fleet whose processes share one (an embedded fleet, the deterministic simulation, where
/// no socket may be waited on). A wake-up sent there takes the same path as `POST /wake`
/// (the same names kept, the same claim answered); one sent from another process, or to a
/// name not served, fails as an unreachable address does. Serving a name again replaces it.
pub fn serve_local(name: &str, wakeup: &Wakeup) -> String {
    let mut locals = locals().lock().unwrap_or_else(|e| e.into_inner());
    locals.insert(name.to_owned(), Arc::clone(wakeup));
    format!("{LOCAL_SCHEME}{name}")
}

/// Stops serving `local://<name>` (the process it stood for died or froze): wake-ups sent
/// there fail from now on, as to a process that does not answer.
pub fn withdraw_local(name: &str) {
    let mut locals = locals().lock().unwrap_or_else(|e| e.into_inner());
    locals.remove(name);
}

/// For a `local://` address, the receiver served there, or the error of one not answering;
/// `None` for any other address.
fn local(url: &str) -> Option<Result<Wakeup, String>> {
    let name = url.strip_prefix(LOCAL_SCHEME)?;
    let locals = locals().lock().unwrap_or_else(|e| e.into_inner());
    Some(
        locals
            .get(name)
            .cloned()
            .ok_or_else(|| format!("{url}: nothing in this process is served there")),
    )
}

/// The URL to advertise for a server on `listen`: `advertise` if given (an `http(s)://` URL,
/// a `host:port`, or a host or IP that gets the listen port), else the listen address itself
/// when it names one host (`0.0.0.0` and `[::]` do not: give `advertise`, e.g. the pod IP, or
/// wake-ups to this process fall back to polling). A malformed `advertise` is an error.
pub fn advertised(listen: SocketAddr, advertise: Option<&str>) -> Result<Option<String>, String> {
    let Some(given) = advertise.map(str::trim) else {
        return Ok((!listen.ip().is_unspecified()).then(|| format!("http://{listen}")));
    };
    let refuse = |why: &str| Err(format!("advertised address '{given}': {why}"));
    if given.contains("://") {
        let url = match reqwest::Url::parse(given) {
            Ok(url) => url,
            Err(error) => return refuse(&error.to_string()),
        };
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
            return refuse("expected http://host[:port] or https://host[:port]");
        }
        if url.path() != "/" || url.query().is_some() {
            return refuse("give the server's address only, without a path");
        }
        return Ok(Some(url.as_str().trim_end_matches('/').to_owned()));
    }
    if let Ok(address) = given.parse::<SocketAddr>() {
        return Ok(Some(format!("http://{address}")));
    }
    if let Ok(ip) = given.parse::<std::net::IpAddr>() {
        return Ok(Some(format!(
            "http://{}",
            SocketAddr::new(ip, listen.port())
        )));
    }
    let hostname = !given.is_empty()
        && given.len() <= 253
        && given
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if !hostname {
        return refuse("expected a URL, host:port, an IP address or a host name");
    }
    Ok(Some(format!("http://{given}:{}", listen.port())))
}

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .timeout(POKE_TIMEOUT)
            .connect_timeout(POKE_TIMEOUT)
            .build()
            .unwrap_or_default()
    })
}

/// Wakes the process at `url`. An error means it did not answer (gone, unreachable, slow);
/// the caller may treat it as a hint that the process is not there, never as proof.
pub async fn poke(url: &str) -> Result<(), String> {
    poke_naming(url, &[]).await
}

/// Wakes each of the coordinators at `urls` (side by side) and names `recoveries` to each:
/// the first failure is the error, after every one was tried.
pub async fn poke_all(urls: &[String], recoveries: &[RecoveryId]) -> Result<(), String> {
    let pokes = urls.iter().map(|url| poke_naming(url, recoveries));
    futures::future::join_all(pokes)
        .await
        .into_iter()
        .collect::<Result<Vec<()>, String>>()
        .map(|_| ())
}

/// Wakes the process at `url` and names `recoveries` for it to look at (see [`poke`]). IDs a
/// body cannot carry (longer than the receiver keeps, or with a line break or surrounding
/// blanks) and those past [`MAX_NAMED`] or the body's size are left out: they are found as
/// without a name, by the receiver's scan or inbox.
pub async fn poke_naming(url: &str, recoveries: &[RecoveryId]) -> Result<(), String> {
    if let Some(local) = local(url) {
        local?.name_claiming(sent(recoveries));
        return Ok(());
    }
    let body = wake_body(recoveries);
    let response = client()
        .post(format!("{url}/wake"))
        .body(body)
        .send()
        .await
        .map_err(|error| format!("{url}: {error}"))?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("{url}: {}", response.status()))
    }
}

/// The answer of a receiver that claims the fresh admissions a wake-up named to it.
const CLAIMING: &str = "claiming";

/// Forwards `recoveries` to the worker at `url` (see `coordinator::named::assign_named`): wakes it
/// naming them, and returns the ones it answered that it claims: all it was sent (see
/// [`sent`]) if it has a free slot for each and is not stopping, else none. One that answers
/// otherwise (full, stopping, or a build that does not claim) was still woken and named them;
/// the caller assigns them as usual.
pub async fn forward(url: &str, recoveries: &[RecoveryId]) -> Result<Vec<RecoveryId>, String> {
    let sent = sent(recoveries);
    if let Some(local) = local(url) {
        let claiming = local?.name_claiming(sent.clone());
        return Ok(if claiming { sent } else { Vec::new() });
    }
    let response = client()
        .post(format!("{url}/wake"))
        .body(wake_body(&sent))
        .send()
        .await
        .map_err(|error| format!("{url}: {error}"))?;
    if !response.status().is_success() {
        return Err(format!("{url}: {}", response.status()));
    }
    let answer = response
        .text()
        .await
        .map_err(|error| format!("{url}: {error}"))?;
    Ok(if answer == CLAIMING { sent } else { Vec::new() })
}

/// The IDs of `recoveries` a wake-up's body carries: those it can name ([`carried`]), up to
/// [`MAX_NAMED`] and the body's size.
pub fn sent(recoveries: &[RecoveryId]) -> Vec<RecoveryId> {
    let mut size = 0;
    let mut sent = Vec::new();
    for id in recoveries.iter().filter(|id| carried(id)).take(MAX_NAMED) {
        if size + id.as_str().len() + 1 > MAX_BODY_BYTES {
            break;
        }
        size += id.as_str().len() + 1;
        sent.push(id.clone());
    }
    sent
}

/// Whether a wake-up can name `id` (the receiver keeps it as sent): not empty, no longer
/// than it keeps, without line breaks or surrounding blanks. One it cannot name is found as
/// without a name, so a sender must not count on the wake-up for it.
pub fn carried(id: &RecoveryId) -> bool {
    let id = id.as_str();
    !id.is_empty()
        && id.len() <= MAX_NAMED_ID_BYTES
        && !id.contains(['\n', '\r'])
        && id.trim() == id
}

/// The body of a wake-up naming `recoveries` (see [`poke_naming`]).
fn wake_body(recoveries: &[RecoveryId]) -> String {
    let mut body = String::new();
    for id in sent(recoveries) {
        body.push_str(id.as_str());
        body.push('\n');
    }
    body
}

/// Where the leading coordinator takes wake-ups, if one leads and advertises one: its lease
/// names its heartbeat, which carries the address (two GETs).
pub async fn coordinator_url(store: &Store) -> Option<String> {
    let run = RunId::new(layout::COORDINATOR_LEASE_RUN);
    let view = lease::read_lease(store, &run).await.ok()??;
    if view.lease.released {
        return None;
    }
    let (beat, _) = lease::read_heartbeat(store, &view.lease.heartbeat)
        .await
        .ok()??;
    (beat.holder_nonce == view.lease.holder_nonce)
        .then_some(beat.wake)
        .flatten()
}

/// Wakes the leading coordinator, if one can be found; best effort (it also scans on its
/// timer).
pub async fn wake_coordinator(store: &Store) {
    wake_coordinator_naming(store, &[]).await;
}

/// Wakes the leading coordinator and names `recoveries` (admitted, waiting for a worker) for
/// it to assign at once; best effort.
pub async fn wake_coordinator_naming(store: &Store, recoveries: &[RecoveryId]) {
    if let Some(url) = coordinator_url(store).await
        && let Err(error) = poke_naming(&url, recoveries).await
    {
        // The leader advertises an address this process cannot reach: a misconfiguration
        // (a network policy, a wrong --advertise) that delays recovery to its next scan.
        tracing::warn!(%error, "cannot wake the leading coordinator at its advertised address; it finds the work at its next scan");
    }
}

/// Wakes the leading coordinator after each of many admissions, looking its address up once
/// (a batch such as `rekindle recover --all` should not pay two GETs per run).
#[derive(Debug)]
pub struct CoordinatorWaker {
    store: Store,
    url: tokio::sync::OnceCell<Option<String>>,
}

impl CoordinatorWaker {
    /// A waker for the coordinator leading on `store`, looked up at the first wake-up.
    pub fn new(store: &Store) -> Self {
        CoordinatorWaker {
            store: store.clone(),
            url: tokio::sync::OnceCell::new(),
        }
    }

    /// Looks the coordinator's address up now (two reads), so the first wake-up does not
    /// wait for them: run it beside the work whose end wakes the coordinator.
    pub async fn prepare(&self) {
        self.url.get_or_init(|| coordinator_url(&self.store)).await;
    }

    /// Wakes the coordinator, if one leads and advertises an address; best effort.
    pub async fn wake(&self) {
        self.wake_naming(&[]).await;
    }

    /// Wakes the coordinator and names `recoveries` (just admitted) for it to assign; best
    /// effort.
    pub async fn wake_naming(&self, recoveries: &[RecoveryId]) {
        let url = self.url.get_or_init(|| coordinator_url(&self.store)).await;
        if let Some(url) = url
            && let Err(error) = poke_naming(url, recoveries).await
        {
            tracing::warn!(%error, "cannot wake the leading coordinator at its advertised address; it finds the work at its next scan");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves a receiver claims a batch of names only while it has a claim for each new one
    // (names it already holds cost none), all or none, and that claims are used up: a full
    // or stopping worker (no claims) is still named them, without claiming.
    #[test]
    fn names_are_claimed_only_within_the_receivers_claims() {
        let signal = WakeSignal::new();
        let ids = |names: &[&str]| {
            names
                .iter()
                .map(|n| RecoveryId::new(*n))
                .collect::<Vec<_>>()
        };
        assert!(!signal.name_claiming(ids(&["a"])), "no claims yet");
        signal.set_claims(2);
        assert!(
            !signal.name_claiming(ids(&["b", "c", "d"])),
            "three for two"
        );
        assert!(
            signal.name_claiming(ids(&["a", "e"])),
            "a is held already: one claim"
        );
        assert!(signal.name_claiming(ids(&["f"])), "the last claim");
        assert!(!signal.name_claiming(ids(&["g"])), "used up");
        assert!(
            !signal.name_claiming(Vec::new()),
            "a plain wake-up claims nothing"
        );
        assert_eq!(
            signal.take_named(),
            ids(&["a", "b", "c", "d", "e", "f", "g"]),
            "every name is kept, claimed or not"
        );
    }

    // Proves an in-process address answers as `POST /wake` does (a forward to a receiver
    // with a free slot is claimed, a plain poke wakes it) and, once withdrawn, fails as an
    // unreachable address, so the sender falls back to assigning as usual.
    #[tokio::test]
    async fn a_local_address_answers_like_the_route_until_withdrawn() {
        let signal: Wakeup = Arc::new(WakeSignal::new());
        let url = serve_local("wake-test-local", &signal);
        assert_eq!(url, "local://wake-test-local");
        let ids = vec![RecoveryId::new("recovery-of-a")];
        assert_eq!(forward(&url, &ids).await, Ok(Vec::new()), "no free slot");
        signal.set_free_slots(1);
        assert_eq!(forward(&url, &ids).await, Ok(ids.clone()), "claimed");
        assert_eq!(signal.take_named(), ids);
        poke(&url).await.expect("a plain poke");
        assert!(signal.take_plain());
        withdraw_local("wake-test-local");
        let error = poke(&url).await.expect_err("withdrawn");
        assert!(error.contains("local://wake-test-local"), "{error}");
        assert!(forward(&url, &ids).await.is_err());
    }

    // Proves free slots are claimed less the names the receiver holds and has not taken: a
    // name that came after the receiver counted its slots is not claimed twice over.
    #[test]
    fn names_not_taken_yet_use_up_free_slots() {
        let signal = WakeSignal::new();
        signal.set_free_slots(2);
        assert!(signal.name_claiming(vec![RecoveryId::new("a")]));
        // The receiver counts its slots again before it took "a": still two free.
        signal.set_free_slots(2);
        assert!(signal.name_claiming(vec![RecoveryId::new("b")]));
        assert!(
            !signal.name_claiming(vec![RecoveryId::new("c")]),
            "a and b hold both slots"
        );
    }

    // Proves a wake-up's body carries only IDs the receiver keeps (no line breaks, blanks or
    // over-long ones), within its size, and that the receiver reads back what was sent.
    #[test]
    fn a_body_names_only_what_the_receiver_keeps() {
        let ids = [
            RecoveryId::new("a"),
            RecoveryId::new("two\nlines"),
            RecoveryId::new(" padded"),
            RecoveryId::new("x".repeat(MAX_NAMED_ID_BYTES + 1)),
            RecoveryId::new(""),
            RecoveryId::new("b"),
        ];
        let body = wake_body(&ids);
        assert_eq!(body, "a\nb\n");
        assert_eq!(
            named_in(body.as_bytes()),
            vec![RecoveryId::new("a"), RecoveryId::new("b")]
        );
        let many: Vec<RecoveryId> = (0..5000)
            .map(|i| RecoveryId::new(format!("{i:0>400}")))
            .collect();
        let body = wake_body(&many);
        assert!(body.len() <= MAX_BODY_BYTES, "{}", body.len());
        assert!(named_in(body.as_bytes()).len() > 100);
        let signal = WakeSignal::new();
        signal.name(named_in(wake_body(&many).as_bytes()));
        assert!(
            !signal.take_plain(),
            "a name that fits is not a plain wake-up"
        );
        // More than is kept: the receiver must look at everything.
        signal.name(many.clone());
        assert_eq!(signal.take_named().len(), MAX_NAMED);
        assert!(signal.take_plain());
        signal.name(Vec::new());
        assert!(signal.take_plain());
    }

    // Proves what is advertised for each form of --advertise, and that malformed ones are
    // refused rather than advertised as an address nobody can reach.
    #[test]
    fn advertised_addresses() {
        let listen: SocketAddr = "0.0.0.0:9090".parse().unwrap();
        let on = |given: &str| advertised(listen, Some(given));
        assert_eq!(advertised(listen, None), Ok(None));
        assert_eq!(
            advertised("127.0.0.1:9091".parse().unwrap(), None),
            Ok(Some("http://127.0.0.1:9091".into()))
        );
        assert_eq!(on("10.0.0.5"), Ok(Some("http://10.0.0.5:9090".into())));
        assert_eq!(on("10.0.0.5:81"), Ok(Some("http://10.0.0.5:81".into())));
        assert_eq!(on("fd00::5"), Ok(Some("http://[fd00::5]:9090".into())));
        assert_eq!(
            on("coordinator"),
            Ok(Some("http://coordinator:9090".into()))
        );
        assert_eq!(
            on("http://w1.local:80/"),
            Ok(Some("http://w1.local".into()))
        );
        for bad in [
            "not a host",
            "ftp://x",
            "",
            "http://",
            "http://x/path",
            "a:b:c",
        ] {
            assert!(on(bad).is_err(), "{bad:?} was accepted: {:?}", on(bad));
        }
    }
}
