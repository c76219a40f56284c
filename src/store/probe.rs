//! The startup capability probe: whether a store keeps the conditional writes Rekindle
//! depends on (create-if-absent, compare-and-swap) before anything is written.

use super::*;

impl Store {
    /// Runs the capability probe unless this process already passed it for this URL.
    pub async fn probe_once(&self) -> Result<(), StoreError> {
        static PASSED: OnceLock<Mutex<HashMap<String, ()>>> = OnceLock::new();
        let passed = PASSED.get_or_init(Default::default);
        let cached = passed
            .lock()
            .map(|map| map.contains_key(&self.url))
            .unwrap_or(false);
        // Memory stores are distinct per open, so each one is probed.
        if cached && self.backend != Backend::Memory {
            return Ok(());
        }
        self.probe().await?;
        if let Ok(mut map) = passed.lock() {
            map.insert(self.url.clone(), ());
        }
        Ok(())
    }

    /// Verifies, against this very store, that conditional writes are enforced and atomic:
    /// a create on an existing key fails, a swap with a stale version fails, and of several
    /// concurrent creates of one key exactly one wins. Names the failed check otherwise.
    pub async fn probe(&self) -> Result<(), StoreError> {
        let run = self.clock.nonce();
        let base = format!("probe/{run}");
        let failed = |check: &'static str, detail: String| StoreError::ProbeFailed {
            url: self.url.clone(),
            check,
            detail,
        };
        let result = async {
            let key = format!("{base}/create");
            let first = self.create(&key, Bytes::from(format!("first {run}"))).await?;
            match self.create(&key, Bytes::from(format!("second {run}"))).await {
                Err(StoreError::AlreadyExists { .. }) => {}
                Ok(_) => {
                    return Err(failed(
                        "create-if-absent",
                        format!("a second create of '{key}' succeeded; the store ignores If-None-Match"),
                    ));
                }
                Err(other) => return Err(other),
            }
            let second = self.swap(&key, Bytes::from(format!("swapped {run}")), &first).await?;
            if second == first {
                return Err(failed(
                    "compare-and-swap",
                    format!("'{key}' kept its version after an update"),
                ));
            }
            match self.swap(&key, Bytes::from(format!("stale {run}")), &first).await {
                Err(StoreError::Changed { .. }) => {}
                Ok(_) => {
                    return Err(failed(
                        "compare-and-swap",
                        format!("an update of '{key}' with a stale version succeeded; the store ignores If-Match"),
                    ));
                }
                Err(other) => return Err(other),
            }
            let race = format!("{base}/race");
            let contenders = 8;
            let outcomes = futures::future::join_all((0..contenders).map(|i| {
                let race = race.clone();
                let run = run.clone();
                async move { self.create(&race, Bytes::from(format!("contender {i} {run}"))).await }
            }))
            .await;
            let mut winners = Vec::new();
            for (i, outcome) in outcomes.into_iter().enumerate() {
                match outcome {
                    Ok(_) => winners.push(i),
                    Err(StoreError::AlreadyExists { .. }) => {}
                    Err(other) => return Err(other),
                }
            }
            let stored = self.read(&race).await?.map(|o| o.bytes);
            let expected = winners
                .first()
                .map(|i| Bytes::from(format!("contender {i} {run}")));
            if winners.len() != 1 || stored != expected {
                return Err(failed(
                    "atomic create race",
                    format!(
                        "{} of {contenders} concurrent creates of '{race}' reported success",
                        winners.len()
                    ),
                ));
            }
            Ok(())
        }
        .await;
        // Clean up whatever the probe left; failures here do not matter.
        for key in [format!("{base}/create"), format!("{base}/race")] {
            let _ = self.delete(&key).await;
        }
        if let Backend::Local { root } = &self.backend {
            let _ = std::fs::remove_dir_all(root.join("probe").join(&run));
        }
        result
    }
}
