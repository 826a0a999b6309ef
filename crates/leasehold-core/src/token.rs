//! Fencing tokens and owner values.

use std::cell::RefCell;
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
    /// A fresh random owner value: [`OWNER_BYTES`] bytes from the OS CSPRNG, which each thread
    /// reads ahead for 32 owners at a time. Every byte is handed out once, and a forked child
    /// reads afresh rather than reuse its parent's.
    pub fn random() -> Result<Self, getrandom::Error> {
        let pid = std::process::id();
        let bytes = ENTROPY
            .try_with(|e| e.borrow_mut().take(pid))
            // The thread is exiting (its buffer is gone): one read of its own.
            .unwrap_or_else(|_| {
                let mut bytes = [0u8; OWNER_BYTES];
                getrandom::fill(&mut bytes).map(|()| bytes)
            })?;
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

/// How many owners one read of the OS CSPRNG provides.
const OWNERS_PER_READ: usize = 32;

thread_local! {
    static ENTROPY: RefCell<Entropy> = const { RefCell::new(Entropy::EMPTY) };
}

/// Random bytes read ahead from the OS CSPRNG by one thread: one `getrandom` call per
/// [`OWNERS_PER_READ`] owners instead of one per acquisition. The bytes are the kernel's, each
/// handed out once.
///
/// Each read is tagged with the id of the process that made it, and every draw checks it: a
/// child forked from a process with bytes still unused reads afresh before its first owner, so
/// parent and child never hand out the same value. That check is a `getpid` call: cheaper
/// than a `getrandom` call of 20 bytes, and most of what an owner costs now (the figures are in
/// the commit that brought this in).
#[derive(Clone)]
struct Entropy {
    /// The process that read `bytes`; 0 (no process's id) before the first read.
    pid: u32,
    /// How many of `bytes` were handed out.
    used: usize,
    bytes: [u8; OWNER_BYTES * OWNERS_PER_READ],
}

impl Entropy {
    const EMPTY: Self = Self {
        pid: 0,
        used: OWNER_BYTES * OWNERS_PER_READ,
        bytes: [0; OWNER_BYTES * OWNERS_PER_READ],
    };

    /// The next owner's bytes for process `pid`, reading afresh when all are used or when
    /// they were read by another process (this one is its forked child). A failed read leaves
    /// the buffer marked unread.
    fn take(&mut self, pid: u32) -> Result<[u8; OWNER_BYTES], getrandom::Error> {
        if self.pid != pid || self.used == self.bytes.len() {
            self.pid = 0;
            getrandom::fill(&mut self.bytes)?;
            self.pid = pid;
            self.used = 0;
        }
        let mut out = [0u8; OWNER_BYTES];
        out.copy_from_slice(&self.bytes[self.used..self.used + OWNER_BYTES]);
        self.used += OWNER_BYTES;
        Ok(out)
    }
}

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
    fn read_ahead_bytes_are_never_handed_out_twice_not_even_after_a_fork() {
        // Many owners, over several reads, on several threads: all distinct.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    (0..OWNERS_PER_READ * 5)
                        .map(|_| Owner::random().unwrap().as_str().to_owned())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all = std::collections::HashSet::new();
        for t in threads {
            for o in t.join().unwrap() {
                assert!(all.insert(o), "an owner value was handed out twice");
            }
        }
        assert_eq!(all.len(), 4 * OWNERS_PER_READ * 5);

        // A fork copies the buffer; the child (another pid) must not reuse the parent's bytes.
        let mut parent = Entropy::EMPTY;
        let first = parent.take(100).unwrap();
        let mut child = parent.clone();
        let from_parent = parent.take(100).unwrap();
        let from_child = child.take(101).unwrap();
        assert_ne!(
            from_parent, from_child,
            "the forked child reused the parent's bytes"
        );
        assert_ne!(first, from_parent);
        // The parent goes on from its buffer; the child has a buffer of its own.
        assert_eq!(parent.used, 2 * OWNER_BYTES);
        assert_eq!((child.pid, child.used), (101, OWNER_BYTES));
    }

    #[test]
    fn tokens_order_by_value() {
        assert!(FencingToken::new(2) > FencingToken::new(1));
        assert_eq!(u64::from(FencingToken::new(7)), 7);
    }
}
