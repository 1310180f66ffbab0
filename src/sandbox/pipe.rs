//! Bounded output pipes for a guest's stdout and stderr.
//!
//! A pipe keeps at most `cap` bytes. The write that would go past the cap
//! keeps what fits, records the overflow, and traps the guest: a flood stops
//! at once instead of burning CPU on output nobody will read. The runner
//! reads [`CappedPipe::overflowed`] to report `EXEC_STATUS_OUTPUT_LIMIT`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// How much a guest may write per `check_write` permit.
const PERMIT: usize = 64 * 1024;

/// The error a capped pipe traps with.
#[derive(Debug, thiserror::Error)]
#[error("{stream} exceeded its limit of {cap} bytes")]
pub struct OutputLimit {
    /// `stdout` or `stderr`.
    pub stream: &'static str,
    /// The cap.
    pub cap: usize,
}

/// A bounded, shared, in-memory output pipe.
#[derive(Debug, Clone)]
pub struct CappedPipe {
    stream: &'static str,
    cap: usize,
    buf: Arc<Mutex<BytesMut>>,
    overflowed: Arc<AtomicBool>,
}

impl CappedPipe {
    /// A pipe named `stream` that keeps at most `cap` bytes.
    pub fn new(stream: &'static str, cap: usize) -> Self {
        Self {
            stream,
            cap,
            buf: Arc::new(Mutex::new(BytesMut::new())),
            overflowed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether a write went past the cap.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    /// The bytes kept so far.
    pub fn contents(&self) -> Bytes {
        self.lock().clone().freeze()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BytesMut> {
        self.buf.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends what fits; `Err` when `data` did not fit whole.
    fn append(&self, data: &[u8]) -> Result<(), OutputLimit> {
        let mut buf = self.lock();
        let room = self.cap.saturating_sub(buf.len());
        let take = room.min(data.len());
        buf.extend_from_slice(&data[..take]);
        if take < data.len() {
            self.overflowed.store(true, Ordering::Release);
            return Err(OutputLimit {
                stream: self.stream,
                cap: self.cap,
            });
        }
        Ok(())
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes)
            .map_err(|e| StreamError::Trap(wasmtime::Error::new(e)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always grant a permit: the write past the cap is the one that
        // traps, so a guest never waits on a pipe that will not drain.
        Ok(PERMIT)
    }
}

impl tokio::io::AsyncWrite for CappedPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(
            self.append(data)
                .map(|()| data.len())
                .map_err(std::io::Error::other),
        )
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_fits_and_records_the_overflow() {
        let pipe = CappedPipe::new("stdout", 5);
        assert!(pipe.append(b"abc").is_ok());
        let err = pipe.append(b"defg").unwrap_err();
        assert_eq!(err.to_string(), "stdout exceeded its limit of 5 bytes");
        assert_eq!(&pipe.contents()[..], b"abcde");
        assert!(pipe.overflowed());
    }

    #[test]
    fn writes_up_to_the_cap_exactly_are_not_an_overflow() {
        let pipe = CappedPipe::new("stderr", 4);
        assert!(pipe.append(b"abcd").is_ok());
        assert!(!pipe.overflowed());
    }
}
