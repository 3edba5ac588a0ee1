//! Targets at once: one thread a target, their progress passed back to the caller's thread.

use lethe_adapters::Target;

use crate::{at_once, Engine};

use super::*;

impl Engine {
    /// Runs `work` on each of `targets` at once, one thread a target, and passes their
    /// progress to `progress` on this thread as it comes. Returns the results in configuration
    /// order. Targets are independent stores, so their inventories, erasures and verifications
    /// overlap; each still journals before it acts, and a run killed mid-way resumes per target
    /// (what one finished is journaled as finished). The journal serializes its own writes.
    pub(super) fn each_target<'t, T: Send>(
        &self,
        targets: Vec<&'t Target>,
        progress: &mut dyn FnMut(Progress),
        work: impl Fn(&'t Target, &dyn Fn(Progress)) -> T + Sync,
    ) -> Vec<(&'t Target, T)> {
        // `at_once` runs the targets on a thread of its own while this one passes their progress
        // on; the channel closes when the last target's sender is dropped.
        let (tx, rx) = std::sync::mpsc::channel::<Progress>();
        let (work, all) = (&work, &targets);
        let results = std::thread::scope(|s| {
            let running = s.spawn(move || {
                at_once(all, |t| {
                    let tx = tx.clone();
                    work(t, &move |p| drop(tx.send(p)))
                })
            });
            for p in rx {
                progress(p);
            }
            running
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        });
        targets.into_iter().zip(results).collect()
    }
}
