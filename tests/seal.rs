//! Client-side encryption of generation payloads: sealed facts never reach the bucket in the
//! clear, plaintext generations stay readable during migration, reading a sealed generation
//! without its key fails naming the object and the key, and a sealed payload only opens under
//! the envelope it was sealed in.

mod common;

use rekindle::core::epoch::Epoch;
use std::sync::Arc;

use rekindle::core::fact::RunId;
use rekindle::core::layout;
use rekindle::core::sample;
use rekindle::store::generation::{self, GenerationError, RunWriter, SnapshotPolicy};
use rekindle::store::seal::Sealer;

const KEY: &str = "8f1c2d3e4f5061728394a5b6c7d8e9f00112233445566778899aabbccddeeff0";

// Proves a run committed plaintext, then continued sealed, loads whole with the key, shows
// no fact text in the sealed objects, and is refused (naming object and key) without it.
#[tokio::test]
async fn sealed_generations_migrate_and_need_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let plain = common::local(dir.path()).await;
    let sealer = Arc::new(Sealer::new(KEY, Some("key-2026")).unwrap());
    let sealed = plain.clone().with_sealer(Some(sealer));
    let facts = sample::run("secret-run", 40, 3);
    let run = RunId::new("secret-run");
    let policy = SnapshotPolicy::default();

    let mut writer = RunWriter::create(&plain, facts[..4].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    writer.commit(facts[4..6].to_vec()).await.unwrap();
    let mut writer = RunWriter::resume(&sealed, &run, Epoch(2), policy)
        .await
        .unwrap();
    for fact in &facts[6..] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    let loaded = generation::load(&sealed, &run, None).await.unwrap();
    assert_eq!(loaded.state.facts(), &facts[..]);
    // The plaintext generations written before sealing was switched on still read, through
    // the sealing store, and a chain mixing both (plaintext snapshot, sealed fence) loads.
    let early = generation::load(&sealed, &run, Some(3)).await.unwrap();
    assert_eq!(early.state.facts(), &facts[..6]);

    // The newest generation is sealed: its bytes carry no fact text.
    let newest = layout::generation(&layout::run_base("secret-run"), loaded.generation);
    let bytes = plain.read(&newest).await.unwrap().unwrap().bytes;
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("\"key_id\":\"key-2026\""), "{text}");
    assert!(!text.contains("test result"), "{text}");
    assert!(!text.contains("cargo test"), "{text}");

    let error = generation::load(&plain, &run, None).await.unwrap_err();
    assert!(matches!(error, GenerationError::Sealed { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        format!(
            "generation object '{newest}' is sealed: sealed with key 'key-2026', which is not configured (set REKINDLE_SEAL_KEY or REKINDLE_SEAL_OLD_KEYS)"
        )
    );

    // After rotation, the old key still opens what it sealed.
    let rotated = Arc::new(
        Sealer::new(&"1".repeat(64), Some("key-2027"))
            .unwrap()
            .with_older("key-2026", KEY)
            .unwrap(),
    );
    let reader = plain.clone().with_sealer(Some(rotated));
    assert_eq!(
        generation::load(&reader, &run, None)
            .await
            .unwrap()
            .state
            .facts(),
        &facts[..]
    );
}

/// Rewrites fields of the generation object at `key` in place, as someone with write access
/// to the bucket could.
async fn tamper(
    store: &rekindle::store::Store,
    key: &str,
    bytes: &[u8],
    edit: impl FnOnce(&mut serde_json::Value),
) {
    let mut object: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    edit(&mut object);
    store
        .put(key, serde_json::to_vec(&object).unwrap().into())
        .await
        .unwrap();
}

// Proves a sealed payload is bound to its envelope: copied into another run's generation slot
// (its run ID rewritten), or left in place with its epoch or seq range changed, it is refused
// on load with an error naming the object.
#[tokio::test]
async fn sealed_payload_moved_to_another_envelope_is_refused() {
    let sealer = Arc::new(Sealer::new(KEY, Some("key-2026")).unwrap());
    let store = common::memory().with_sealer(Some(sealer));
    let policy = SnapshotPolicy::default();
    for id in ["victim", "donor"] {
        let facts = sample::run(id, 20, 7);
        let mut writer = RunWriter::create(&store, facts[..4].to_vec(), Epoch(1), policy)
            .await
            .unwrap();
        writer.commit(facts[4..8].to_vec()).await.unwrap();
        writer.commit(facts[8..12].to_vec()).await.unwrap();
    }
    let victim = RunId::new("victim");
    let slot = |id: &str, n: u64| layout::generation(&layout::run_base(id), n);
    let original = store.read(&slot("victim", 3)).await.unwrap().unwrap().bytes;
    let refused = |error: GenerationError, key: &str, what: &str| {
        assert!(
            matches!(error, GenerationError::Sealed { .. }),
            "{what}: {error}"
        );
        assert!(error.to_string().contains(key), "{what}: {error}");
    };

    // The donor's newest delta (same slot, same seq range) copied over the victim's.
    let donor = store.read(&slot("donor", 3)).await.unwrap().unwrap().bytes;
    tamper(&store, &slot("victim", 3), &donor, |object| {
        object["run_id"] = "victim".into();
    })
    .await;
    let error = generation::load(&store, &victim, None).await.unwrap_err();
    refused(error, &slot("victim", 3), "transplanted payload");

    // The donor's delta into the victim's next free slot, renumbered.
    store
        .put(&slot("victim", 3), original.clone())
        .await
        .unwrap();
    tamper(&store, &slot("victim", 4), &donor, |object| {
        object["run_id"] = "victim".into();
        object["generation"] = 4.into();
        object["first_seq"] = 13.into();
        object["last_seq"] = 16.into();
    })
    .await;
    let error = generation::load(&store, &victim, None).await.unwrap_err();
    refused(error, &slot("victim", 4), "renumbered payload");
    store.delete(&slot("victim", 4)).await.unwrap();
    assert!(generation::load(&store, &victim, None).await.is_ok());

    // The victim's own payload under a raised epoch, or a shifted seq range.
    tamper(&store, &slot("victim", 3), &original, |object| {
        object["epoch"] = 9.into();
    })
    .await;
    let error = generation::load(&store, &victim, None).await.unwrap_err();
    refused(error, &slot("victim", 3), "changed epoch");
    tamper(&store, &slot("victim", 3), &original, |object| {
        object["first_seq"] = 8.into();
        object["last_seq"] = 11.into();
    })
    .await;
    let error = generation::load(&store, &victim, None).await.unwrap_err();
    refused(error, &slot("victim", 3), "shifted seq range");
}

// Proves a generation sealed before envelopes were bound (no `aad` marker, the plaintext
// digest kept in the clear) still loads, and is still checked against that digest.
#[tokio::test]
async fn legacy_sealed_generation_without_envelope_binding_loads() {
    use aes_gcm::aead::{Aead, Generate, KeyInit};
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as BASE64;

    let sealer = Arc::new(Sealer::new(KEY, Some("key-2026")).unwrap());
    let store = common::memory().with_sealer(Some(sealer));
    let facts = sample::run("legacy", 12, 5);
    let mut writer = RunWriter::create(
        &store,
        facts[..4].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await
    .unwrap();
    writer.commit(facts[4..8].to_vec()).await.unwrap();
    let run = RunId::new("legacy");
    let key = layout::generation(&layout::run_base("legacy"), 2);

    // Re-seal generation 2 the way the old code did: no associated data, digest in the clear.
    let mut lines = Vec::new();
    for fact in &facts[4..8] {
        lines.extend(rekindle::core::fact::encode(fact).unwrap());
        lines.push(b'\n');
    }
    let key_bytes: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&KEY[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let cipher = aes_gcm::Aes256Gcm::new_from_slice(&key_bytes).unwrap();
    let nonce = aes_gcm::Nonce::generate();
    let ciphertext = cipher.encrypt(&nonce, lines.as_slice()).unwrap();
    let bytes = store.read(&key).await.unwrap().unwrap().bytes;
    let rewrite = |digest: String| {
        let mut object: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        object["facts_sha256"] = digest.into();
        object["sealed"] = serde_json::json!({
            "algorithm": "AES-256-GCM",
            "key_id": "key-2026",
            "nonce": BASE64.encode(nonce.as_slice()),
            "ciphertext": BASE64.encode(&ciphertext),
        });
        bytes::Bytes::from(serde_json::to_vec(&object).unwrap())
    };
    store
        .put(&key, rewrite(rekindle::core::digest::sha256_hex(&lines)))
        .await
        .unwrap();
    let loaded = generation::load(&store, &run, None).await.unwrap();
    assert_eq!(loaded.state.facts(), &facts[..8]);

    store.put(&key, rewrite("0".repeat(64))).await.unwrap();
    let error = generation::load(&store, &run, None).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("facts do not match their SHA-256"),
        "{error}"
    );
}
