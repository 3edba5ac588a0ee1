//! `lethe lineage add FILE`: records a lineage edge from the command line, the same JSON as
//! `POST /v1/lineage` takes, from a file or standard input (identifiers stay out of the process
//! list).

use std::io::Read;
use std::path::Path;

use lethe_core::{MemoryId, Object, Subject, Tenant, Version};

use crate::exit::{bad, Exit};
use crate::open::open_engine;

/// The largest edge file read: 10,000 sources at most, as the API takes.
const MAX_EDGE_FILE: u64 = 4 << 20;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Edge {
    tenant: String,
    subject: String,
    target: String,
    locator: String,
    #[serde(default)]
    from: Vec<Object<Source>>,
    #[serde(default)]
    from_artifacts: Vec<Object<ArtifactRef>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Source {
    memory_id: String,
    version: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ArtifactRef {
    target: String,
    locator: String,
}

/// Exit 0 recorded; 2 bad input (nothing stored); 1 refused by a closed fence or the control
/// store failing.
pub(crate) fn add(config: &Path, file: &Path) -> Result<i32, Exit> {
    let shown = if file.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        file.display().to_string()
    };
    let mut bytes = Vec::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(MAX_EDGE_FILE + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(MAX_EDGE_FILE + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| bad(format!("cannot read the edge ({shown}): {e}")))?;
    if bytes.len() as u64 > MAX_EDGE_FILE {
        return Err(bad(format!("the edge ({shown}) is over 4 MiB")));
    }
    // A message never quotes the file: its values are identifiers.
    let edge = serde_json::from_slice::<Object<Edge>>(&bytes)
        .map(Object::into_inner)
        .map_err(|e| {
            bad(format!(
                "the edge ({shown}) is not one JSON object of tenant, subject, target, locator, \
                 from [{{memory_id, version?}}] and from_artifacts [{{target, locator}}] (line {}, \
                 column {})",
                e.line(),
                e.column()
            ))
        })?;
    let ident = |e: lethe_core::IdentError| bad(format!("the edge ({shown}): {e}"));
    let tenant = Tenant::new(edge.tenant).map_err(ident)?;
    let subject = Subject::new(edge.subject).map_err(ident)?;
    let from = edge
        .from
        .into_iter()
        .map(|Object(s)| {
            Ok((
                MemoryId::new(s.memory_id).map_err(ident)?,
                s.version.map(Version::new).transpose().map_err(ident)?,
            ))
        })
        .collect::<Result<Vec<_>, Exit>>()?;
    let artifacts: Vec<(String, String)> = edge
        .from_artifacts
        .into_iter()
        .map(|Object(a)| (a.target, a.locator))
        .collect();
    let engine = open_engine(config)?;
    engine.record_lineage_from(
        &tenant,
        &subject,
        &edge.target,
        &edge.locator,
        &from,
        &artifacts,
    )?;
    outln!("Lineage recorded: an erasure of what it names reaches the artifact.");
    Ok(0)
}
