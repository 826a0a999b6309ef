//! A lease's status word: its validity deadline, whether it is lost and whether a lost signal
//! watches it, in one atomic word, kept with other leases' words in chunks of 64.
//!
//! The renewal engine reads and moves every lease's deadline once per renewal, after the
//! batch's round trip. With the deadline inside each lease's own allocation that was a cache
//! miss per lease on the client (the servers' work in between evicts it on a shared machine):
//! the renewal path's most expensive step at 10,000 leases. Here the engine's slot keeps a
//! [`WordRef`] to the word, so a renewal touches 64 leases' deadlines per 512 bytes, and the
//! lease's other state only on the rare paths (a loss, a lease someone watches).
//!
//! Layout: bit 63 set once the lease is lost (its reason is kept beside, under a lock), bit 62
//! once a lost signal was handed out, and the low 62 bits the deadline: nanoseconds from a
//! process-wide epoch, offset by 2^61 (instants up to 73 years either side), 0 before the
//! first grant. Codes compare as the instants do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Set once the lease is lost.
pub(crate) const LOST: u64 = 1 << 63;
/// Set once a lost signal was handed out.
pub(crate) const WATCHED: u64 = 1 << 62;
/// The deadline's bits.
const DEADLINE: u64 = WATCHED - 1;
/// The code of the epoch itself.
const ZERO: i128 = 1 << 61;
/// Words per chunk.
const CHUNK: usize = 64;

type Chunk = [AtomicU64; CHUNK];

/// Every chunk of the process, and the free words.
struct Arena {
    chunks: Vec<Arc<Chunk>>,
    free: Vec<u32>,
}

static ARENA: Mutex<Arena> = Mutex::new(Arena {
    chunks: Vec::new(),
    free: Vec::new(),
});

/// The instant codes count from.
static EPOCH: LazyLock<std::time::Instant> = LazyLock::new(std::time::Instant::now);

fn arena() -> std::sync::MutexGuard<'static, Arena> {
    // Nothing panics while holding it.
    ARENA.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The code of `at` (never 0: that is "no deadline").
pub(crate) fn encode(at: Instant) -> u64 {
    let at = at.into_std();
    let epoch = *EPOCH;
    let nanos = |d: Duration| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX);
    let offset = if at >= epoch {
        nanos(at - epoch)
    } else {
        -nanos(epoch - at)
    };
    // Clamped into range: never reached (73 years either side of the epoch).
    u64::try_from((offset + ZERO).clamp(1, i128::from(DEADLINE))).unwrap_or(1)
}

/// The instant of a word's deadline bits, `None` before the first grant.
pub(crate) fn decode(word: u64) -> Option<Instant> {
    let code = i128::from(word & DEADLINE);
    if code == 0 {
        return None;
    }
    let offset = code - ZERO;
    let epoch = *EPOCH;
    let d = Duration::from_nanos(u64::try_from(offset.unsigned_abs()).unwrap_or(u64::MAX));
    let at = if offset >= 0 {
        epoch.checked_add(d)
    } else {
        epoch.checked_sub(d)
    };
    Some(Instant::from_std(at.unwrap_or(epoch)))
}

/// Whether a word says lost as of `now` (the code of an instant): lost, or its deadline
/// passed.
pub(crate) fn over(word: u64, now: u64) -> bool {
    word & LOST != 0 || (has_deadline(word) && now >= word & DEADLINE)
}

/// Whether a word holds a deadline (a grant was known).
pub(crate) fn has_deadline(word: u64) -> bool {
    word & DEADLINE != 0
}

/// Why a renewal could not move the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The lease is lost (its reason is kept beside the word).
    Lost,
    /// The deadline passed before the renewal came: the lease expired.
    Passed,
}

/// A handle on one status word; the lease's status owns the word ([`StatusWord`]), the renewal
/// engine keeps a handle while the lease is alive.
#[derive(Clone)]
pub(crate) struct WordRef {
    chunk: Arc<Chunk>,
    /// Its place in the arena (the chunk's, times [`CHUNK`], plus its place in the chunk).
    index: u32,
}

impl WordRef {
    fn atomic(&self) -> &AtomicU64 {
        &self.chunk[self.index as usize % CHUNK]
    }

    pub(crate) fn load(&self) -> u64 {
        self.atomic().load(Ordering::SeqCst)
    }

    /// Moves the deadline to `deadline` unless the word is lost or its deadline passed by
    /// `now`; the word before the change.
    pub(crate) fn renew(&self, deadline: Instant, now: Instant) -> Result<u64, Refused> {
        let (code, now) = (encode(deadline), encode(now));
        let mut w = self.load();
        loop {
            if w & LOST != 0 {
                return Err(Refused::Lost);
            }
            if over(w, now) {
                return Err(Refused::Passed);
            }
            match self.atomic().compare_exchange_weak(
                w,
                (w & !DEADLINE) | code,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(prev) => return Ok(prev),
                Err(actual) => w = actual,
            }
        }
    }

    /// Sets the deadline whatever it was (the first grant); the word before.
    pub(crate) fn start(&self, deadline: Instant) -> u64 {
        let code = encode(deadline);
        let f = |w: u64| Some((w & !DEADLINE) | code);
        // `fetch_update` with a closure that always answers `Some` cannot fail.
        self.atomic()
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, f)
            .unwrap_or_else(|w| w)
    }

    /// Sets `bit` (`LOST` or `WATCHED`); the word before.
    pub(crate) fn set(&self, bit: u64) -> u64 {
        self.atomic().fetch_or(bit, Ordering::SeqCst)
    }
}

/// The status word a lease's status owns: taken from the arena, given back when dropped.
pub(crate) struct StatusWord(WordRef);

impl StatusWord {
    /// A fresh word: not lost, not watched, no deadline.
    pub(crate) fn new() -> Self {
        let mut a = arena();
        let index = a.free.pop().unwrap_or_else(|| {
            let first = u32::try_from(a.chunks.len() * CHUNK).unwrap_or(u32::MAX);
            a.chunks
                .push(Arc::new(std::array::from_fn(|_| AtomicU64::new(0))));
            // Every word of the new chunk but the first is free; taken from the lowest.
            a.free.extend((first + 1..first + CHUNK as u32).rev());
            first
        });
        let chunk = Arc::clone(&a.chunks[index as usize / CHUNK]);
        drop(a);
        let word = WordRef { chunk, index };
        word.atomic().store(0, Ordering::SeqCst);
        Self(word)
    }

    pub(crate) fn word(&self) -> &WordRef {
        &self.0
    }
}

impl Drop for StatusWord {
    fn drop(&mut self) {
        arena().free.push(self.0.index);
    }
}

impl std::fmt::Debug for StatusWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.0.load();
        f.debug_struct("StatusWord")
            .field("lost", &(w & LOST != 0))
            .field("watched", &(w & WATCHED != 0))
            .field("deadline", &decode(w))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes keep the instants' order and give them back to the nanosecond, on both sides of
    /// the epoch; 0 stays "no deadline".
    #[test]
    fn codes_keep_order_and_round_trip() {
        let epoch = Instant::from_std(*EPOCH);
        let ns = Duration::from_nanos;
        let mut instants = vec![
            epoch,
            epoch + ns(1),
            epoch + Duration::from_secs(3600 * 24 * 365),
        ];
        if let Some(before) = epoch.checked_sub(ns(1)) {
            instants.insert(0, before);
        }
        let codes: Vec<u64> = instants.iter().map(|&t| encode(t)).collect();
        assert!(codes.windows(2).all(|w| w[0] < w[1]), "{codes:?}");
        for (t, c) in instants.iter().zip(&codes) {
            assert_ne!(*c, 0);
            assert_eq!(c & !DEADLINE, 0, "flag bits untouched");
            assert_eq!(decode(*c), Some(*t));
            assert_eq!(decode(c | LOST | WATCHED), Some(*t));
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(LOST | WATCHED), None);
    }

    /// A renewal moves the deadline and keeps the flags; it is refused once the word is lost
    /// or its deadline passed, and `start` sets a deadline whatever it was.
    #[test]
    fn renewals_are_refused_once_lost_or_passed() {
        let w = StatusWord::new();
        let r = w.word();
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(r.load(), 0, "a fresh word");
        assert_eq!(r.renew(now + s(1), now), Ok(0), "no deadline yet: renewed");
        assert_eq!(r.set(WATCHED) & WATCHED, 0);
        let before = r.renew(now + s(2), now).expect("renewed");
        assert_eq!(decode(before), Some(now + s(1)));
        assert_ne!(before & WATCHED, 0, "the flag seen by the renewal");
        assert_eq!(decode(r.load()), Some(now + s(2)));
        assert_ne!(r.load() & WATCHED, 0, "and kept");
        assert_eq!(r.renew(now + s(9), now + s(2)), Err(Refused::Passed));
        assert_eq!(
            decode(r.load()),
            Some(now + s(2)),
            "a passed deadline stays"
        );
        r.start(now + s(5));
        assert_eq!(decode(r.load()), Some(now + s(5)));
        r.set(LOST);
        assert_eq!(r.renew(now + s(9), now), Err(Refused::Lost));
        assert!(over(r.load(), encode(now)));
        assert!(!over(encode(now + s(1)), encode(now)));
        assert!(over(encode(now), encode(now)), "due at the deadline itself");
        assert!(!over(0, encode(now)), "no deadline: not over");
    }

    /// A dropped word goes back to the arena and comes out again fresh.
    #[test]
    fn dropped_words_are_reused_fresh() {
        let w = StatusWord::new();
        w.word().set(LOST | WATCHED);
        w.word().start(Instant::now());
        let index = w.0.index;
        drop(w);
        // Other tests take words meanwhile: look for ours among a few fresh ones.
        let fresh: Vec<StatusWord> = (0..CHUNK).map(|_| StatusWord::new()).collect();
        let again = fresh.iter().find(|w| w.0.index == index);
        if let Some(again) = again {
            assert_eq!(again.word().load(), 0, "reused fresh");
        }
        assert!(fresh.iter().all(|w| w.word().load() == 0));
    }
}
