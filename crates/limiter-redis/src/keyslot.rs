//! Redis Cluster's key slots, as the cluster computes them: which keys one script may touch
//! together, and which calls and batches span slots.

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first
/// `{` and the next `}`, when not empty) or of the whole key, modulo 16384.
pub(crate) fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from `CLUSTER KEYSLOT` on a Redis Cluster.
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("somekey"), 11058);
        assert_eq!(key_slot("foo{hash_tag}"), 2515);
        assert_eq!(key_slot("{hash_tag}bar"), 2515);
        // An empty tag hashes the whole key.
        assert_eq!(key_slot("{}foo"), key_slot("{}foo"));
        assert_ne!(key_slot("{}foo"), key_slot("foo"));
    }
}
