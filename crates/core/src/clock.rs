//! The injected source of time. Nothing in Lethe reads the system clock directly, so tests
//! control time instead of sleeping.

use std::sync::Mutex;
use std::time::Duration;

use time::OffsetDateTime;

/// Where time comes from.
pub trait Clock: Send + Sync {
    /// The current time, UTC.
    fn now(&self) -> OffsetDateTime;
    /// Waits `d` (or, in tests, advances the clock by `d`).
    fn sleep(&self, d: Duration);
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The one place the system clock is read.
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    #[allow(clippy::disallowed_methods)] // The one place a thread sleeps.
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// A clock tests move by hand; `sleep` advances it instantly.
#[derive(Debug)]
pub struct ManualClock(Mutex<OffsetDateTime>);

impl ManualClock {
    /// A clock standing at `t`.
    pub fn new(t: OffsetDateTime) -> Self {
        Self(Mutex::new(t))
    }

    /// Moves the clock forward.
    pub fn advance(&self, d: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *t += d;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> OffsetDateTime {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sleep(&self, d: Duration) {
        self.advance(d);
    }
}
