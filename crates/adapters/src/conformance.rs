//! The conformance suite every adapter passes: seed several subjects, erase one, verify zero,
//! erase again, and check every other subject kept every row, byte for byte.
//!
//! The suite is store-agnostic: a [`Case`] gives it a freshly seeded store, a snapshot of every
//! row with its owner as the seeder knows it (not as the adapter computes it), and the adapter.

use std::collections::BTreeMap;

use lethe_core::Scope;

use crate::{Adapter, Applicability};

/// One row of a store, as bytes, with the owner the seeder wrote it for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    /// Table (or key space) name.
    pub table: String,
    /// Every column's bytes, in a fixed encoding.
    pub bytes: Vec<u8>,
    /// `(tenant, subject)` the seeder wrote it for.
    pub owner: (String, String),
}

/// A seeded store under test.
pub trait Case {
    /// The adapter for the seeded store.
    fn adapter(&self) -> &dyn Adapter;
    /// Every row in the store now, with its owner from the seeder's ground truth.
    fn snapshot(&self) -> Vec<Row>;
    /// Every row but `tenant`/`subject`'s: what an erase of that subject must leave as it was,
    /// byte for byte.
    fn others(&self, tenant: &str, subject: &str) -> Vec<Row> {
        let me = (tenant.to_string(), subject.to_string());
        self.snapshot()
            .into_iter()
            .filter(|r| r.owner != me)
            .collect()
    }
}

/// What one run of the suite found, for assertions with good messages.
#[derive(Debug)]
pub struct Outcome {
    /// Rows the inventory counted.
    pub inventoried: u64,
    /// Rows the first erase deleted.
    pub erased: u64,
    /// Rows the second erase deleted (must be 0).
    pub erased_again: u64,
    /// Residue after erasing (must be 0).
    pub residue: u64,
}

/// Erases `scope` through the case's adapter and checks the contract. Panics with a message
/// naming the broken rule. `owner_of_scope` says whether a row owner falls in the scope.
pub fn run(
    case: &dyn Case,
    scope: &Scope,
    in_scope: &dyn Fn(&(String, String)) -> bool,
    batch: usize,
) -> Outcome {
    let a = case.adapter();
    assert_eq!(
        a.check_scope(scope).expect("scope is expressible"),
        Applicability::Applies
    );
    let before = case.snapshot();
    let expected: u64 = before.iter().filter(|r| in_scope(&r.owner)).count() as u64;
    let inv = a.inventory(scope).expect("inventory");
    assert_eq!(
        inv.count, expected,
        "inventory counts exactly the seeded rows of the scope"
    );
    assert_eq!(case.snapshot(), before, "inventory is read-only");

    let mut erased = 0;
    for chunk in inv.locators.chunks(batch.max(1)) {
        erased += a.erase_batch(scope, chunk).expect("erase");
    }
    assert_eq!(erased, expected, "erase deletes exactly the inventory");

    let after = case.snapshot();
    let kept: Vec<&Row> = before.iter().filter(|r| !in_scope(&r.owner)).collect();
    let after_refs: Vec<&Row> = after.iter().collect();
    assert_eq!(
        after_refs, kept,
        "every other subject kept every row, byte for byte, and nothing of the scope is left"
    );

    let residue = a.verify(scope, &inv.locators).expect("verify");
    assert_eq!(residue, 0, "verify counts zero after the erase");
    assert_eq!(case.snapshot(), after, "verify is read-only");

    let mut erased_again = 0;
    for chunk in inv.locators.chunks(batch.max(1)) {
        erased_again += a.erase_batch(scope, chunk).expect("second erase");
    }
    assert_eq!(erased_again, 0, "a second erase deletes nothing");
    assert_eq!(case.snapshot(), after, "a second erase changes nothing");
    assert_eq!(
        a.inventory(scope).expect("inventory").count,
        0,
        "nothing left to inventory"
    );

    Outcome {
        inventoried: inv.count,
        erased,
        erased_again,
        residue,
    }
}

/// Counts rows per owner, for readable failure messages.
pub fn per_owner(rows: &[Row]) -> BTreeMap<(String, String), usize> {
    let mut m = BTreeMap::new();
    for r in rows {
        *m.entry(r.owner.clone()).or_insert(0) += 1;
    }
    m
}

/// Checks that `after` is `before` minus exactly `gone` rows, each of which `is_erased` accepts:
/// every other row is still there, byte for byte. For erasures narrower than a subject (one
/// memory), where the owner alone does not say which rows go.
pub fn assert_only_removed(
    before: &[Row],
    after: &[Row],
    gone: usize,
    is_erased: &dyn Fn(&Row) -> bool,
) {
    let mut left: Vec<&Row> = after.iter().collect();
    let mut removed = Vec::new();
    for r in before {
        match left.iter().position(|a| *a == r) {
            Some(i) => {
                left.remove(i);
            }
            None => removed.push(r),
        }
    }
    assert!(
        left.is_empty(),
        "rows appeared or changed: {} not in the snapshot before",
        left.len()
    );
    assert_eq!(removed.len(), gone, "exactly the erased rows went");
    assert!(
        removed.iter().all(|r| is_erased(r)),
        "only the erased item's rows went"
    );
}
