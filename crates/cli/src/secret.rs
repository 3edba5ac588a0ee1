//! Reading a secret file: a `[[serve.token]]`'s bearer token, a `[[serve.alert]]`'s HMAC key,
//! or the token a DPO command (`lethe request`, `lethe approve`) identifies its user by.

use std::path::Path;

use crate::exit::{bad, Exit};

/// Shortest secret accepted: a bearer token is a password.
pub(crate) const MIN_SECRET_LEN: usize = 16;

/// The secret in `path` (one line): readable by its owner only, at least
/// [`MIN_SECRET_LEN`] visible ASCII characters. `what` names it in messages.
pub(crate) fn read_secret_file(path: &Path, what: &str) -> Result<String, Exit> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("{what} {shown}: {e}")))?;
    // A secret is a password: as with the key file, refuse one others can read.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| bad(format!("{what} {shown}: {e}")))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(bad(format!(
                "{what} {shown} is readable by group or others (mode {:o}); chmod 600 it",
                mode & 0o777
            )));
        }
    }
    let secret = text.trim().to_string();
    // Visible ASCII only: a header value is bytes, and a client sends a non-ASCII token in
    // whatever encoding it likes, so such a token would start a server no one can use.
    if secret.len() < MIN_SECRET_LEN || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(format!(
            "{what} {shown}: a secret must be one line of at least {MIN_SECRET_LEN} \
             visible ASCII characters (no spaces, no accented letters)"
        )));
    }
    Ok(secret)
}

/// The `[[serve.token]]` whose token is the one in `token_file`, if its role is one of
/// `roles`: who runs a DPO command, as the server would know them. Returns its name.
pub(crate) fn holder(
    config: &Path,
    token_file: Option<&Path>,
    roles: &[lethe_engine::config::Role],
) -> Result<String, Exit> {
    let token_file = token_file.ok_or_else(|| {
        bad("who are you? give --token-file FILE (or LETHE_TOKEN_FILE): your token of [[serve.token]]")
    })?;
    let cfg = lethe_engine::Config::load(config).map_err(crate::exit::config)?;
    let given = read_secret_file(token_file, "--token-file")?;
    let mut found = None;
    for t in &cfg.serve.tokens {
        // A token file that cannot be read is skipped: it cannot be the one given.
        if let Ok(secret) = read_secret_file(&t.token_file, "serve.token_file") {
            if secret.as_bytes() == given.as_bytes() {
                found = Some(t);
            }
        }
    }
    let t = found.ok_or_else(|| {
        bad("--token-file: that token is not one of [serve]'s [[serve.token]]; use yours")
    })?;
    let admin = t.role == lethe_engine::config::Role::Admin;
    if !admin && !roles.contains(&t.role) {
        let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
        return Err(bad(format!(
            "--token-file: token '{}' has role {}; this needs {} or admin",
            t.name,
            t.role.as_str(),
            names.join(" or ")
        )));
    }
    Ok(t.name.clone())
}
