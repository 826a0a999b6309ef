//! Capturing what leasehold logs, for tests that expect a warning (or its absence).
//!
//! ```
//! let logs = leasehold_test_support::logs::capture();
//! tracing::warn!(target: "leasehold.plaintext", "a password in clear");
//! assert!(logs.text().contains("a password in clear"));
//! ```

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::subscriber::DefaultGuard;
use tracing_subscriber::fmt::MakeWriter;

/// The log lines (`WARN` and above) of the current thread, captured while this lives.
///
/// It is the thread's default subscriber: a `#[tokio::test]` on the default current-thread
/// runtime sees everything its tasks log.
pub struct Captured {
    buffer: Buffer,
    _guard: DefaultGuard,
}

impl Captured {
    /// Everything captured so far, one event a line.
    pub fn text(&self) -> String {
        let bytes = self.buffer.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Starts capturing this thread's warnings and errors.
pub fn capture() -> Captured {
    let buffer = Buffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(buffer.clone())
        .finish();
    Captured {
        _guard: tracing::subscriber::set_default(subscriber),
        buffer,
    }
}

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl io::Write for Buffer {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buffer {
    type Writer = Buffer;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
