//! The rpcrdmad TOML configuration: schema, defaults, validation.
//!
//! The same types are the admin JSON schema (`rpcrdmactl` prints and accepts them), with
//! kebab-case keys in both. [`check`] returns every finding with file, line and column;
//! [`from_str_named`] and [`from_path`] return a [`Config`] only when there is no error.
//! The reference of every key is `CONFIG.md`, checked against these types by a test.
#![forbid(unsafe_code)]

mod check;
mod diag;
mod load;
mod schema;

pub use check::{divide_share, parse_address, parse_network, HostFacts};
pub use diag::{Diagnostic, Diagnostics, Severity};
pub use ipnet::IpNet;
pub use schema::*;

/// Result of [`check`]: the config when it deserialized, and every finding.
#[derive(Debug, Clone)]
pub struct Report {
    /// The configuration, if every key deserialized (it may still have semantic errors).
    pub config: Option<Config>,
    /// Every syntax, type and semantic finding.
    pub diagnostics: Diagnostics,
}

impl Report {
    /// True if the configuration may be used (no errors; warnings allowed).
    pub fn is_ok(&self) -> bool {
        self.config.is_some() && !self.diagnostics.has_errors()
    }
}

/// Checks TOML `text` (named `file` in diagnostics) against `host`, collecting every finding.
pub fn check(text: &str, file: &str, host: &HostFacts) -> Report {
    let parsed = load::parse(text, file);
    let mut diagnostics = parsed.diagnostics;
    if let Some(cfg) = &parsed.config {
        diagnostics.extend(check::run(cfg, host, Some(&parsed.doc), parsed.doc.file()));
    }
    Report {
        config: parsed.config,
        diagnostics: Diagnostics(diagnostics),
    }
}

/// Parses and validates TOML `text` for this host; errors carry every diagnostic.
///
/// Warnings are dropped here; use [`check`] to see them.
pub fn from_str_named(text: &str, file: &str) -> Result<Config, Diagnostics> {
    let report = check(text, file, &HostFacts::detect());
    match report.config {
        Some(cfg) if !report.diagnostics.has_errors() => Ok(cfg),
        _ => Err(report.diagnostics),
    }
}

/// Why [`from_path`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path as given.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file was read but is not a valid configuration.
    #[error("{0}")]
    Invalid(Diagnostics),
}

/// Reads, parses and validates the configuration file at `path` for this host.
pub fn from_path(path: impl AsRef<std::path::Path>) -> Result<Config, LoadError> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: name.clone(),
        source,
    })?;
    from_str_named(&text, &name).map_err(LoadError::Invalid)
}

impl Config {
    /// Semantic checks on a config that did not come from text (e.g. admin JSON); positions are 0.
    pub fn validate(&self, source: &str, host: &HostFacts) -> Diagnostics {
        Diagnostics(check::run(self, host, None, source))
    }
}
