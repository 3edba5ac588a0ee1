//! A fixed set of control-store connections shared by the blocking gate calls.

use std::sync::{Condvar, Mutex};

use lethe_journal::Journal;

/// Connections waiting to be used.
pub(crate) struct Pool {
    free: Mutex<Vec<Journal>>,
    returned: Condvar,
}

impl Pool {
    pub(crate) fn new(journals: Vec<Journal>) -> Self {
        assert!(!journals.is_empty(), "a pool needs at least one connection");
        Self {
            free: Mutex::new(journals),
            returned: Condvar::new(),
        }
    }

    /// Runs `f` on a free connection, waiting for one if all are busy. Call it from a blocking
    /// thread.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&Journal) -> T) -> T {
        let journal = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(j) = free.pop() {
                    break j;
                }
                free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
            }
        };
        // Given back even if `f` panics, so one bad request cannot shrink the pool.
        struct Back<'a>(&'a Pool, Option<Journal>);
        impl Drop for Back<'_> {
            fn drop(&mut self) {
                if let Some(j) = self.1.take() {
                    self.0
                        .free
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(j);
                    self.0.returned.notify_one();
                }
            }
        }
        let back = Back(self, Some(journal));
        f(back.1.as_ref().expect("set above"))
    }
}
