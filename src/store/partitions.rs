//! How many partitions the bucket's coordination is split into: a number in the format marker,
//! fixed once set.
//!
//! A bucket whose marker names no count (every bucket laid out before partitions existed, and
//! every new one nobody split) has one partition, coordinated as it always was. The count may
//! be set once, from none to N, by compare-and-swap on the marker: two coordinators started
//! with different counts cannot both win, and the loser stops with an error naming both.
//! Safety never depends on the count (every lifecycle step is a compare-and-swap of its own);
//! a fixed count keeps the coordinators' shares covering every shard exactly once.

use crate::core::layout::{self, MAX_PARTITIONS};
use crate::store::{Store, StoreError};

/// The marker as written: the layout version, its kind, and the partition count once set.
#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    format: u32,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    partitions: Option<u32>,
}

/// The bucket's partition count (1 when the marker names none, or there is no marker).
pub async fn read(store: &Store) -> Result<u32, StoreError> {
    let key = layout::format_marker();
    match store.read(key).await? {
        None => Ok(1),
        Some(object) => Ok(decode(key, &object.bytes)?.partitions.unwrap_or(1)),
    }
}

/// Splits the bucket into `wanted` partitions if it is not split yet, and returns the count it
/// has. Refuses a count out of range, and a bucket already split into another count.
pub async fn set(store: &Store, wanted: u32) -> Result<u32, StoreError> {
    let key = layout::format_marker();
    if !(1..=MAX_PARTITIONS).contains(&wanted) {
        return Err(refused(format!(
            "a bucket has 1 to {MAX_PARTITIONS} partitions (one per index shard at most), not {wanted}"
        )));
    }
    loop {
        let (marker, etag) = match store.read(key).await? {
            Some(object) => (decode(key, &object.bytes)?, Some(object.etag)),
            None => (
                Marker {
                    format: layout::FORMAT_VERSION,
                    kind: "rekindle.format".into(),
                    partitions: None,
                },
                None,
            ),
        };
        match marker.partitions {
            Some(found) if found == wanted => return Ok(found),
            Some(found) => {
                return Err(refused(format!(
                    "the bucket is split into {found} partitions; {wanted} were asked for (the count is fixed once set: drop --partitions, or set it to {found})"
                )));
            }
            // One partition is what an unsplit bucket has: nothing to write.
            None if wanted == 1 => return Ok(1),
            None => {}
        }
        let split = layout::encode_object(&Marker {
            partitions: Some(wanted),
            ..marker
        });
        let written = match &etag {
            Some(etag) => store.swap(key, split, etag).await,
            None => store.create(key, split).await,
        };
        match written {
            Ok(_) => {
                tracing::info!(partitions = wanted, "split the bucket into partitions");
                return Ok(wanted);
            }
            // Another process wrote the marker meanwhile: look again.
            Err(StoreError::Changed { .. } | StoreError::AlreadyExists { .. }) => continue,
            Err(other) => return Err(other),
        }
    }
}

fn decode(key: &str, bytes: &[u8]) -> Result<Marker, StoreError> {
    serde_json::from_slice::<Marker>(bytes).map_err(|error| StoreError::Failed {
        op: "open",
        key: key.to_owned(),
        message: format!("the format marker is not a Rekindle object ({error})"),
    })
}

fn refused(message: String) -> StoreError {
    StoreError::Failed {
        op: "partitions",
        key: layout::format_marker().to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_count_is_set_once() {
        let store = Store::memory(crate::clock::SystemClock::shared());
        assert_eq!(read(&store).await.unwrap(), 1);
        assert_eq!(set(&store, 1).await.unwrap(), 1);
        assert_eq!(set(&store, 8).await.unwrap(), 8);
        assert_eq!(read(&store).await.unwrap(), 8);
        assert_eq!(set(&store, 8).await.unwrap(), 8);
        let error = set(&store, 4).await.unwrap_err().to_string();
        assert!(
            error.contains("split into 8 partitions; 4 were asked for"),
            "{error}"
        );
        assert!(error.contains("rekindle-format"), "{error}");
        let error = set(&store, 0).await.unwrap_err().to_string();
        assert!(error.contains("not 0"), "{error}");
        assert!(set(&store, 257).await.is_err());
        // Older readers still read the marker: the layout version is where it was.
        store.check_format().await.unwrap();
    }
}
