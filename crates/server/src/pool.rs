//! A fixed set of control-store connections shared by the blocking gate calls.

use std::sync::{Condvar, Mutex};

use lethe_journal::Journal;

/// Owns a value whose drop blocks (a synchronous PostgreSQL client shuts its own runtime down
/// when dropped, which panics inside an async runtime): drops it on a plain thread.
pub(crate) struct DropOffRuntime<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> DropOffRuntime<T> {
    pub(crate) fn new(t: T) -> Self {
        Self(Some(t))
    }
}

impl<T: Send + 'static> std::ops::Deref for DropOffRuntime<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("present until dropped")
    }
}

impl<T: Send + 'static> Drop for DropOffRuntime<T> {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = std::thread::spawn(move || drop(t)).join();
        }
    }
}

/// Connections waiting to be used.
pub(crate) struct Pool {
    free: Mutex<Vec<Journal>>,
    returned: Condvar,
}

impl Drop for Pool {
    fn drop(&mut self) {
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|p| p.into_inner()));
        drop(DropOffRuntime::new(free));
    }
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
