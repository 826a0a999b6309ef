//! Lock keys, validated once.

use std::str::FromStr;

use smol_str::SmolStr;

/// The longest key accepted, in bytes (UTF-8).
///
/// Every backend can store a key this long together with its prefix: Redis keys and etcd keys are
/// binary-safe, and PostgreSQL advisory locks hash the key to an integer.
pub const MAX_KEY_LEN: usize = 512;

/// Why a string is not a valid [`LockKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is the empty string.
    #[error("lock key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    #[error("lock key is {len} bytes long; the limit is {max} bytes")]
    TooLong {
        /// Length of the rejected key, in bytes.
        len: usize,
        /// The limit, [`MAX_KEY_LEN`].
        max: usize,
    },
    /// The key contains a NUL byte, which some backends and tools (C strings, psql) cannot carry.
    #[error("lock key contains a NUL byte at byte offset {offset}")]
    ContainsNul {
        /// Byte offset of the first NUL.
        offset: usize,
    },
}

/// The name of a lock: non-empty, at most [`MAX_KEY_LEN`] bytes of UTF-8, no NUL.
///
/// A `LockKey` is validated once, when it is made; every backend then maps it to its own key
/// space in a documented, stable way (see each driver's "Key mapping" section), after its
/// configured prefix. Cloning is cheap: a key of up to 23 bytes is kept inline (no allocation of
/// its own, which counts when a process holds thousands of leases), a longer one is
/// reference-counted.
///
/// ```
/// use leasehold_core::{KeyError, LockKey};
///
/// let key = LockKey::new("billing/nightly-export")?;
/// assert_eq!(key.as_str(), "billing/nightly-export");
/// assert_eq!(LockKey::new(""), Err(KeyError::Empty));
/// # Ok::<(), KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(SmolStr);

impl LockKey {
    /// Validates `key` and makes a `LockKey` of it.
    pub fn new(key: impl AsRef<str>) -> Result<Self, KeyError> {
        let key = key.as_ref();
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong {
                len: key.len(),
                max: MAX_KEY_LEN,
            });
        }
        if let Some(offset) = key.bytes().position(|b| b == 0) {
            return Err(KeyError::ContainsNul { offset });
        }
        Ok(Self(SmolStr::new(key)))
    }

    /// The key as given, without any backend prefix.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

fmt_as_str!(LockKey);

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        self.0.as_str()
    }
}

impl FromStr for LockKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        Self::new(s)
    }
}

impl TryFrom<&str> for LockKey {
    type Error = KeyError;
    fn try_from(s: &str) -> Result<Self, KeyError> {
        Self::new(s)
    }
}

impl TryFrom<String> for LockKey {
    type Error = KeyError;
    fn try_from(s: String) -> Result<Self, KeyError> {
        Self::new(s)
    }
}

/// Anything the lock API accepts as a key: a [`LockKey`] (already valid) or a string (validated
/// on the spot).
pub trait IntoLockKey {
    /// Converts into a validated key.
    fn into_lock_key(self) -> Result<LockKey, KeyError>;
}

impl IntoLockKey for LockKey {
    fn into_lock_key(self) -> Result<LockKey, KeyError> {
        Ok(self)
    }
}

impl IntoLockKey for &LockKey {
    fn into_lock_key(self) -> Result<LockKey, KeyError> {
        Ok(self.clone())
    }
}

impl IntoLockKey for &str {
    fn into_lock_key(self) -> Result<LockKey, KeyError> {
        LockKey::new(self)
    }
}

impl IntoLockKey for String {
    fn into_lock_key(self) -> Result<LockKey, KeyError> {
        LockKey::new(self)
    }
}

impl IntoLockKey for &String {
    fn into_lock_key(self) -> Result<LockKey, KeyError> {
        LockKey::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_and_boundary_keys() {
        assert!(LockKey::new("a").is_ok());
        assert!(LockKey::new("ключ/日本語").is_ok());
        assert!(LockKey::new("x".repeat(MAX_KEY_LEN)).is_ok());
    }

    #[test]
    fn rejects_with_the_reason() {
        assert_eq!(LockKey::new(""), Err(KeyError::Empty));
        assert_eq!(
            LockKey::new("x".repeat(MAX_KEY_LEN + 1)),
            Err(KeyError::TooLong {
                len: MAX_KEY_LEN + 1,
                max: MAX_KEY_LEN
            })
        );
        assert_eq!(
            LockKey::new("ab\0c"),
            Err(KeyError::ContainsNul { offset: 2 })
        );
        let msg = LockKey::new("ab\0c").unwrap_err().to_string();
        assert!(msg.contains("NUL"), "{msg}");
    }
}
