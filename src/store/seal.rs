//! Optional client-side encryption of generation payloads: AES-256-GCM.
//!
//! When a key is configured, a generation's facts are written sealed: the JSONL of its facts
//! encrypted with a fresh random 96-bit nonce, together with the key's ID so keys can rotate
//! (older keys stay configured for reading). The envelope — run, generation number, epoch,
//! seq range — stays in the clear, because fencing and loading need it, and is authenticated as
//! the cipher's associated data: a sealed payload moved under another envelope (another run,
//! slot, epoch or seq range) fails to open. Plaintext generations
//! remain readable, so a bucket can be migrated gradually. Reading a sealed generation without
//! its key fails with an error naming the object and the key ID. Never logs key material.
//!
//! This module parses keys from the text it is given ([`SealKeys`]) and never reads the
//! environment: the binaries read `REKINDLE_SEAL_KEY` (64 hex characters) or
//! `REKINDLE_SEAL_KEY_FILE` (a file holding them), `REKINDLE_SEAL_KEY_ID` (default: derived
//! from the key), and `REKINDLE_SEAL_OLD_KEYS` (`id:hex,id:hex`) for rotation, once, into the
//! store's settings.

use aes_gcm::aead::{Aead, Generate, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use crate::core::digest::sha256_hex;

/// The cipher every sealed payload names.
pub const ALGORITHM: &str = "AES-256-GCM";

/// A sealed payload as stored in a generation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    /// The cipher used, always [`ALGORITHM`] for payloads this build writes.
    pub algorithm: String,
    /// ID of the key that sealed the payload, so the right key is picked on rotation.
    pub key_id: String,
    /// The 96-bit nonce, base64.
    pub nonce: String,
    /// The encrypted JSONL of the facts with its authentication tag, base64.
    pub ciphertext: String,
    /// Whether the envelope was authenticated as associated data. Payloads sealed before
    /// envelopes were bound lack the field (false) and still open without it, as readers accept
    /// every older version (brief, invariant 9); such a legacy payload can still be moved into
    /// another envelope undetected, until it is rewritten (a later snapshot carries its facts
    /// sealed the new way). Clearing the flag on a new payload does not help an attacker: its
    /// tag only verifies with the associated data.
    #[serde(default)]
    pub aad: bool,
}

/// Why a sealing key could not be configured, or a sealed payload could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// A configured key cannot be read (its file), is not 64 hex characters or is otherwise
    /// malformed; fix the configuration before starting.
    #[error("encryption key {origin}: {reason}")]
    BadKey {
        /// Where the key came from (a variable or file name), never the key.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A payload was sealed with a key this process does not have; configure it (as the
    /// current key or an older one) to read the generation.
    #[error(
        "sealed with key '{key_id}', which is not configured (set REKINDLE_SEAL_KEY or REKINDLE_SEAL_OLD_KEYS)"
    )]
    UnknownKey {
        /// The key ID the payload names.
        key_id: String,
    },
    /// The payload does not decrypt or authenticate with its key: it was tampered with,
    /// moved under another envelope, or the key under that ID is wrong.
    #[error("cannot open the sealed payload with key '{key_id}': {reason}")]
    Damaged {
        /// The key ID the payload names.
        key_id: String,
        /// Why it did not open.
        reason: String,
    },
}

/// Sealing keys as configured, still as text: the current key, its ID, and older keys that
/// can still open what they sealed. The origins name where the text came from in errors
/// (an environment variable or a file), never the key itself.
#[derive(Clone, Default)]
pub struct SealKeys {
    /// 64 hex characters (surrounding whitespace is ignored).
    pub key: String,
    /// Where the key text came from (a variable or file name), for error messages.
    pub origin: String,
    /// Recorded in every sealed payload; default: derived from the key.
    pub key_id: Option<String>,
    /// `id:hex,id:hex`.
    pub older: Option<String>,
    /// Where the older keys came from (a variable or file name), for error messages.
    pub older_origin: String,
}

impl SealKeys {
    /// The keys the standard environment configures, if any: `REKINDLE_SEAL_KEY` (or the file
    /// named by `REKINDLE_SEAL_KEY_FILE`), `REKINDLE_SEAL_KEY_ID` and `REKINDLE_SEAL_OLD_KEYS`.
    /// The one place sealing reads the environment; the binaries call it at their boundary,
    /// and a host embedding the library calls it (or builds `SealKeys` itself) before opening
    /// its store: the store never looks, so a host that skips it writes plaintext.
    pub fn from_env() -> Result<Option<SealKeys>, SealError> {
        let (key, origin) = match (
            std::env::var("REKINDLE_SEAL_KEY").ok(),
            std::env::var_os("REKINDLE_SEAL_KEY_FILE").map(std::path::PathBuf::from),
        ) {
            (Some(text), _) => (text, "REKINDLE_SEAL_KEY".to_owned()),
            (None, Some(path)) => {
                let origin = format!("file {} (REKINDLE_SEAL_KEY_FILE)", path.display());
                let text = std::fs::read_to_string(&path).map_err(|error| SealError::BadKey {
                    origin: origin.clone(),
                    reason: format!("cannot read it: {error}"),
                })?;
                (text, origin)
            }
            (None, None) => return Ok(None),
        };
        Ok(Some(SealKeys {
            key,
            origin,
            key_id: std::env::var("REKINDLE_SEAL_KEY_ID").ok(),
            older: std::env::var("REKINDLE_SEAL_OLD_KEYS").ok(),
            older_origin: "REKINDLE_SEAL_OLD_KEYS".into(),
        }))
    }
}

impl std::fmt::Debug for SealKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Origins and IDs only, never key material.
        f.debug_struct("SealKeys")
            .field("origin", &self.origin)
            .field("key_id", &self.key_id)
            .field("older_origin", &self.older_origin)
            .finish_non_exhaustive()
    }
}

/// The configured keys: one to seal with, any number to open with.
pub struct Sealer {
    current: (String, Aes256Gcm),
    older: Vec<(String, Aes256Gcm)>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key IDs only, never key material.
        f.debug_struct("Sealer")
            .field("key_id", &self.current.0)
            .field(
                "older",
                &self.older.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn parse_key(origin: &str, text: &str) -> Result<([u8; 32], Aes256Gcm), SealError> {
    let bad = |reason: &str| SealError::BadKey {
        origin: origin.to_owned(),
        reason: reason.to_owned(),
    };
    let text = text.trim();
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("expected 64 hex characters (32 bytes)"));
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad("not hex"))?;
    }
    let cipher = Aes256Gcm::new_from_slice(&key).map_err(|_| bad("wrong length"))?;
    Ok((key, cipher))
}

impl Sealer {
    /// A sealer from a hex key; the ID defaults to one derived from the key.
    pub fn new(hex_key: &str, key_id: Option<&str>) -> Result<Sealer, SealError> {
        let (key, cipher) = parse_key("given", hex_key)?;
        let id = key_id.map_or_else(|| default_id(&key), str::to_owned);
        Ok(Sealer {
            current: (id, cipher),
            older: Vec::new(),
        })
    }

    /// Adds a key that can still open older generations.
    pub fn with_older(mut self, key_id: &str, hex_key: &str) -> Result<Sealer, SealError> {
        let (_, cipher) = parse_key(&format!("'{key_id}'"), hex_key)?;
        self.older.push((key_id.to_owned(), cipher));
        Ok(self)
    }

    /// The sealer `keys` configure; errors name where the bad key came from.
    pub fn configure(keys: &SealKeys) -> Result<Sealer, SealError> {
        let mut sealer =
            Sealer::new(&keys.key, keys.key_id.as_deref()).map_err(|error| match error {
                SealError::BadKey { reason, .. } => SealError::BadKey {
                    origin: keys.origin.clone(),
                    reason,
                },
                other => other,
            })?;
        if let Some(older) = &keys.older {
            for pair in older.split(',').filter(|p| !p.trim().is_empty()) {
                let (id, hex) = pair.split_once(':').ok_or_else(|| SealError::BadKey {
                    origin: keys.older_origin.clone(),
                    reason: "expected id:hex pairs separated by commas".into(),
                })?;
                sealer = sealer.with_older(id.trim(), hex)?;
            }
        }
        Ok(sealer)
    }

    /// ID of the current key, recorded in every payload it seals.
    pub fn key_id(&self) -> &str {
        &self.current.0
    }

    /// Encrypts with the current key and a fresh random nonce, authenticating `context` (the
    /// envelope the payload belongs to) as associated data.
    pub fn seal(&self, plaintext: &[u8], context: &[u8]) -> Sealed {
        let nonce = Nonce::generate();
        let payload = Payload {
            msg: plaintext,
            aad: context,
        };
        // Encryption into a Vec cannot fail for payloads below the 64 GiB GCM limit.
        let ciphertext = self.current.1.encrypt(&nonce, payload).unwrap_or_default();
        Sealed {
            algorithm: ALGORITHM.into(),
            key_id: self.current.0.clone(),
            nonce: BASE64.encode(nonce.as_slice()),
            ciphertext: BASE64.encode(ciphertext),
            aad: true,
        }
    }

    /// Decrypts with whichever configured key the payload names; `context` must be the
    /// envelope it was sealed under (ignored for a legacy payload sealed without one).
    pub fn open(&self, sealed: &Sealed, context: &[u8]) -> Result<Vec<u8>, SealError> {
        let cipher = std::iter::once(&self.current)
            .chain(&self.older)
            .find(|(id, _)| *id == sealed.key_id)
            .map(|(_, cipher)| cipher)
            .ok_or_else(|| SealError::UnknownKey {
                key_id: sealed.key_id.clone(),
            })?;
        let damaged = |reason: &str| SealError::Damaged {
            key_id: sealed.key_id.clone(),
            reason: reason.to_owned(),
        };
        let nonce_bytes = BASE64
            .decode(&sealed.nonce)
            .map_err(|_| damaged("nonce is not base64"))?;
        let nonce = Nonce::try_from(nonce_bytes.as_slice())
            .map_err(|_| damaged("nonce has the wrong length"))?;
        let ciphertext = BASE64
            .decode(&sealed.ciphertext)
            .map_err(|_| damaged("ciphertext is not base64"))?;
        let payload = Payload {
            msg: ciphertext.as_slice(),
            aad: if sealed.aad { context } else { b"" },
        };
        cipher.decrypt(&nonce, payload).map_err(|_| {
            damaged(
                "authentication failed (wrong key, tampered data, or a payload moved from another envelope)",
            )
        })
    }
}

fn default_id(key: &[u8; 32]) -> String {
    format!("k-{}", &sha256_hex(key)[..12])
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const OTHER: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1eff";

    // Proves sealing round-trips, nonces differ, tampering is caught, rotation keeps old
    // payloads readable, and an unknown key is named.
    #[test]
    fn seal_open_rotate() {
        let old = Sealer::new(KEY, Some("2025")).unwrap();
        let sealed = old.seal(b"facts", b"envelope");
        assert_ne!(old.seal(b"facts", b"envelope").nonce, sealed.nonce);
        assert_eq!(old.open(&sealed, b"envelope").unwrap(), b"facts");
        let mut tampered = sealed.clone();
        tampered.ciphertext = BASE64.encode(b"not the ciphertext at all");
        assert!(matches!(
            old.open(&tampered, b"envelope"),
            Err(SealError::Damaged { .. })
        ));
        let rotated = Sealer::new(OTHER, Some("2026"))
            .unwrap()
            .with_older("2025", KEY)
            .unwrap();
        assert_eq!(rotated.open(&sealed, b"envelope").unwrap(), b"facts");
        assert_eq!(rotated.seal(b"x", b"").key_id, "2026");
        let error = Sealer::new(OTHER, Some("2026"))
            .unwrap()
            .open(&sealed, b"envelope")
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("sealed with key '2025', which is not configured")
        );
        assert!(!format!("{rotated:?}").contains("0102"));
        assert!(Sealer::new("short", None).is_err());
    }

    // Proves configured keys parse with their rotation, a bad key is refused naming where it
    // came from (never its text), and the configuration's Debug shows no key material.
    #[test]
    fn configure_names_the_origin() {
        let keys = SealKeys {
            key: format!(" {OTHER}\n"),
            origin: "REKINDLE_SEAL_KEY".into(),
            key_id: Some("2026".into()),
            older: Some(format!("2025:{KEY}")),
            older_origin: "REKINDLE_SEAL_OLD_KEYS".into(),
        };
        let sealer = Sealer::configure(&keys).unwrap();
        assert_eq!(sealer.key_id(), "2026");
        let old = Sealer::new(KEY, Some("2025")).unwrap().seal(b"x", b"e");
        assert_eq!(sealer.open(&old, b"e").unwrap(), b"x");
        assert!(!format!("{keys:?}").contains("0102"));
        let bad = Sealer::configure(&SealKeys {
            key: "not-a-key".into(),
            ..keys.clone()
        })
        .unwrap_err();
        assert_eq!(
            bad.to_string(),
            "encryption key REKINDLE_SEAL_KEY: expected 64 hex characters (32 bytes)"
        );
        let pairs = Sealer::configure(&SealKeys {
            older: Some("no-colon".into()),
            ..keys
        })
        .unwrap_err();
        assert!(
            pairs
                .to_string()
                .starts_with("encryption key REKINDLE_SEAL_OLD_KEYS"),
            "{pairs}"
        );
    }

    // Proves the envelope is bound: another context fails, clearing the marker does not strip
    // the binding, and a legacy payload (sealed without associated data, no marker) still opens.
    #[test]
    fn envelope_is_associated_data() {
        let sealer = Sealer::new(KEY, Some("2026")).unwrap();
        let sealed = sealer.seal(b"facts", b"run a, generation 3");
        assert!(matches!(
            sealer.open(&sealed, b"run b, generation 3"),
            Err(SealError::Damaged { .. })
        ));
        let downgraded = Sealed {
            aad: false,
            ..sealed.clone()
        };
        assert!(sealer.open(&downgraded, b"anything").is_err());
        let nonce = Nonce::generate();
        let legacy = Sealed {
            algorithm: "AES-256-GCM".into(),
            key_id: "2026".into(),
            nonce: BASE64.encode(nonce.as_slice()),
            ciphertext: BASE64.encode(sealer.current.1.encrypt(&nonce, &b"old"[..]).unwrap()),
            aad: false,
        };
        let json = serde_json::to_string(&legacy)
            .unwrap()
            .replace(",\"aad\":false", "");
        let legacy: Sealed = serde_json::from_str(&json).unwrap();
        assert!(!legacy.aad);
        assert_eq!(sealer.open(&legacy, b"anything").unwrap(), b"old");
    }
}
