//! Fencing tokens and owner values.

use std::fmt;
use std::sync::Arc;

/// A number that strictly increases on every grant of the same lock, for backends that mint one.
///
/// Send it with every write to the protected resource; the resource remembers the highest token
/// it has accepted and rejects any lower one. That is the only protection against a holder that
/// was paused (GC, SIGSTOP, a slow network) past its lease and then writes as if it still held
/// the lock. A random owner value is *not* a fencing token: it is not ordered.
///
/// Which backends mint tokens, and how strong the ordering is, is declared by
/// [`Capabilities::fencing`](crate::Capabilities::fencing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value, to send to the resource.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

/// Number of random bytes in an owner value (160 bits, as the Redlock proposal asks).
pub const OWNER_BYTES: usize = 20;

/// The value that identifies one acquisition: who holds the lock.
///
/// [`Locker`](crate::Locker) makes a new one for every acquisition from the operating system's
/// CSPRNG ([`OWNER_BYTES`] bytes, lower-case hex), so release and extend can compare-and-act on
/// exactly our own grant. It identifies; it does not order (see [`FencingToken`]).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// A fresh random owner value from the OS CSPRNG.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; OWNER_BYTES];
        getrandom::fill(&mut bytes)?;
        // Hex on the stack, then one allocation for the shared string (not a `String` first).
        let mut hex = [0u8; OWNER_BYTES * 2];
        for (i, b) in bytes.into_iter().enumerate() {
            hex[2 * i] = HEX[usize::from(b >> 4)];
            hex[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        // Always ASCII; the error arm only spares an `unwrap`.
        let hex = std::str::from_utf8(&hex).map_err(|_| getrandom::Error::UNEXPECTED)?;
        Ok(Self(Arc::from(hex)))
    }

    /// An owner value read back from a backend (for example by [`inspect`]).
    ///
    /// [`inspect`]: crate::LockBackend::inspect
    pub fn from_raw(value: impl Into<Arc<str>>) -> Self {
        Self(value.into())
    }

    /// The value as stored by backends.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fmt_as_str!(Owner);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_long_random_hex_and_distinct() -> Result<(), getrandom::Error> {
        let a = Owner::random()?;
        let b = Owner::random()?;
        assert_eq!(a.as_str().len(), OWNER_BYTES * 2);
        assert!(
            a.as_str()
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
            "not lower-case hex: {a}"
        );
        assert_ne!(a, b);
        Ok(())
    }

    #[test]
    fn tokens_order_by_value() {
        assert!(FencingToken::new(2) > FencingToken::new(1));
        assert_eq!(u64::from(FencingToken::new(7)), 7);
    }
}
