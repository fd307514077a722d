//! JSON files of the planners (roofline profiles here, plan files in the engine): read, or
//! written with their directory created, errors naming the path.

use std::path::Path;

/// A JSON file that cannot be read, parsed or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Json { path: String, source: serde_json::Error },
}

pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, FileError> {
    let p = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Io { path: p(), source })?;
    serde_json::from_str(&text).map_err(|source| FileError::Json { path: p(), source })
}

/// Pretty-printed, a newline at the end.
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), FileError> {
    write_text(path, serde_json::to_string_pretty(value).expect("plain data serializes") + "\n")
}

/// On one line: for files of long number arrays (activation statistics), which pretty
/// printing would double.
pub fn write_json_compact<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), FileError> {
    write_text(path, serde_json::to_string(value).expect("plain data serializes"))
}

fn write_text(path: &Path, text: String) -> Result<(), FileError> {
    let io = |source| FileError::Io { path: path.display().to_string(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    std::fs::write(path, text).map_err(io)
}
