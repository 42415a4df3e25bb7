//! `palisade ranges update`: download the configured sources into the data dir, atomically.
//!
//! Each download is checked before it replaces anything: HTTP 200, at most 100 MiB, and it
//! must parse as a range file with at least one range. It is written to a temporary file in
//! the target folder and renamed over the old one, so a reader never sees half a file and a
//! failed source keeps its previous file. A download may take as long as it keeps moving:
//! only one that sends nothing for the idle timeout is given up. On a terminal each
//! download shows a progress bar (on stderr; nothing when it is not a terminal).

use std::path::Path;
use std::time::Duration;

use super::parse::parse_ranges_as;
use crate::config::SourceSettings;

/// Largest download accepted.
pub const MAX_BYTES: usize = 100 * 1024 * 1024;

/// Downloads every source; returns, per source, the number of ranges written or why not.
pub async fn update(
    data_dir: &Path,
    sources: &[SourceSettings],
    idle: Duration,
) -> Vec<(String, Result<usize, String>)> {
    let client = match reqwest::Client::builder()
        .connect_timeout(idle)
        .user_agent(concat!("palisade/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(client) => client,
        Err(err) => {
            return sources
                .iter()
                .map(|s| (s.name.clone(), Err(format!("HTTP client: {err}"))))
                .collect();
        }
    };
    let mut results = Vec::with_capacity(sources.len());
    for source in sources.iter().filter(|s| !s.url.is_empty()) {
        results.push((
            format!("ranges/{}/{}", source.class, source.name),
            update_one(&client, data_dir, source, idle).await,
        ));
    }
    results
}

async fn update_one(
    client: &reqwest::Client,
    data_dir: &Path,
    source: &SourceSettings,
    idle: Duration,
) -> Result<usize, String> {
    let stalled = || {
        format!(
            "{}: no data for {} s; the previous file is kept",
            source.url,
            idle.as_secs()
        )
    };
    let mut response = tokio::time::timeout(idle, client.get(&source.url).send())
        .await
        .map_err(|_| stalled())?
        .map_err(|e| format!("{}: {e}", source.url))?;
    if !response.status().is_success() {
        return Err(format!("{} answered {}", source.url, response.status()));
    }
    if response
        .content_length()
        .is_some_and(|len| len > MAX_BYTES as u64)
    {
        return Err(format!("{} is larger than {MAX_BYTES} bytes", source.url));
    }
    let progress = match response.content_length() {
        Some(len) => indicatif::ProgressBar::new(len),
        None => indicatif::ProgressBar::no_length(),
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template("{msg} {bytes}/{total_bytes} {wide_bar} {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    progress.set_message(source.name.clone());
    let mut body = Vec::new();
    loop {
        let chunk = tokio::time::timeout(idle, response.chunk())
            .await
            .map_err(|_| {
                progress.abandon();
                stalled()
            })?
            .map_err(|e| format!("{}: {e}", source.url))?;
        let Some(chunk) = chunk else { break };
        if body.len() + chunk.len() > MAX_BYTES {
            progress.abandon();
            return Err(format!("{} is larger than {MAX_BYTES} bytes", source.url));
        }
        body.extend_from_slice(&chunk);
        progress.inc(chunk.len() as u64);
    }
    progress.finish_and_clear();
    let text = String::from_utf8(body).map_err(|_| format!("{} is not UTF-8 text", source.url))?;
    let ranges = parse_ranges_as(&text, source.format)
        .map_err(|e| format!("{}: {e}; the previous file is kept", source.url))?;
    if ranges.is_empty() {
        return Err(format!(
            "{} holds no ranges; the previous file is kept",
            source.url
        ));
    }
    let folder = data_dir.join("ranges").join(&source.class);
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    let target = folder.join(&source.name);
    let temporary = folder.join(format!(".{}.download", source.name));
    std::fs::write(&temporary, text.as_bytes())
        .map_err(|e| format!("{}: {e}", temporary.display()))?;
    std::fs::rename(&temporary, &target).map_err(|e| format!("{}: {e}", target.display()))?;
    Ok(ranges.len())
}
