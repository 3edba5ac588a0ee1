//! `backup-files`: a folder of backup artifacts (pg_dump archives, Redis RDB files, SQLite
//! copies, or anything else), each entry of the folder one artifact.
//!
//! - **What it holds**: copies of the targets named in `covers`, as they stood when each
//!   artifact was taken. An erasure cannot rewrite them: the target erases nothing and its
//!   inventory is empty.
//! - **When an artifact was taken**: the entry's modification time (what `pg_dump > f`,
//!   `redis-cli --rdb f` or `cp` leave; `cp -p` and `rsync -t` keep the original's, which is
//!   what is wanted for a copy of an older backup). It expires `retention_days` later.
//! - **At completion**: the artifacts taken before it, which may hold the scope, make the target
//!   `PENDING_EXPIRY` until the last of them expires (the certificate's `expires` and
//!   `artifacts`); none: `DONE` with nothing pending.
//! - **Reading**: the folder's entries (files, and folders such as `pg_dump -Fd`'s, each one
//!   artifact), filtered by `pattern`; never their content. Names starting with `.` are not
//!   artifacts (a copy in progress, `.tmp` files of tools).
//!
//! Errors: a folder that cannot be listed is `unavailable` (a mount that is down); one that is
//! not a folder is `failed`.

mod adapter;
mod config;

pub use adapter::BackupFiles;
pub use config::Config;
