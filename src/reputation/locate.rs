//! Where the range lists are when the configured folder is the default and absent.

use std::path::{Path, PathBuf};

/// Where the range lists are: `configured` when it exists.
///
/// For the default `data` when it is absent (the binary started outside its checkout):
/// the shipped data beside the binary (`data/`, `../share/palisade/data`), in
/// `/usr/local/share/palisade/data` or `/usr/share/palisade/data`, or in the source tree
/// it was built from. Says where it looked when it finds none, and how to point
/// elsewhere.
pub fn locate(configured: &Path) -> PathBuf {
    if configured.is_dir() || configured != Path::new("data") {
        return configured.to_owned();
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let candidates: Vec<PathBuf> = beside
        .iter()
        .flat_map(|dir| [dir.join("data"), dir.join("../share/palisade/data")])
        .chain([
            PathBuf::from("/usr/local/share/palisade/data"),
            PathBuf::from("/usr/share/palisade/data"),
            Path::new(env!("CARGO_MANIFEST_DIR")).join("data"),
        ])
        .collect();
    match candidates.iter().find(|dir| dir.join("ranges").is_dir()) {
        Some(found) => {
            tracing::info!(
                data_dir = %found.display(),
                "no ./data here: reputation data from the shipped folder (set PALISADE_DATA_DIR to choose)"
            );
            found.clone()
        }
        None => {
            let looked: Vec<String> = std::iter::once(configured)
                .chain(candidates.iter().map(PathBuf::as_path))
                .map(|dir| dir.display().to_string())
                .collect();
            tracing::warn!(
                looked_in = %looked.join(", "),
                "no reputation data found: set PALISADE_DATA_DIR (data_dir) to the folder of range lists"
            );
            configured.to_owned()
        }
    }
}
