//! Fencing tokens and owner values.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrayvec::ArrayString;

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
/// exactly our own grant. It identifies; it does not order (see [`FencingToken`]). Owners are
/// equal when their text is.
#[derive(Clone)]
pub struct Owner(Repr);

/// An owner's text: a random one inline (every lease keeps one, and every renewal reads it: no
/// allocation of its own), one read back from a backend shared.
#[derive(Clone)]
enum Repr {
    Random(ArrayString<{ OWNER_BYTES * 2 }>),
    Raw(Arc<str>),
}

impl Owner {
    /// A fresh random owner value from the OS CSPRNG.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; OWNER_BYTES];
        getrandom::fill(&mut bytes)?;
        let mut hex = ArrayString::new();
        for b in bytes {
            for nibble in [b >> 4, b & 0xf] {
                hex.push(char::from(HEX[usize::from(nibble)]));
            }
        }
        Ok(Self(Repr::Random(hex)))
    }

    /// An owner value read back from a backend (for example by [`inspect`]).
    ///
    /// [`inspect`]: crate::LockBackend::inspect
    pub fn from_raw(value: impl Into<Arc<str>>) -> Self {
        Self(Repr::Raw(value.into()))
    }

    /// The value as stored by backends.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Random(hex) => hex.as_str(),
            Repr::Raw(raw) => raw,
        }
    }
}

impl PartialEq for Owner {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Owner {}

impl Hash for Owner {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fmt_as_str!(Owner);

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

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
        // The same text read back from a backend is the same owner, whichever way it is kept.
        let back = Owner::from_raw(a.as_str());
        assert_eq!(back, a);
        let state = std::hash::RandomState::new();
        assert_eq!(state.hash_one(&back), state.hash_one(&a));
        Ok(())
    }

    #[test]
    fn tokens_order_by_value() {
        assert!(FencingToken::new(2) > FencingToken::new(1));
        assert_eq!(u64::from(FencingToken::new(7)), 7);
    }
}
