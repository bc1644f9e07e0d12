//! Diagnostics: structured findings with a position, rendered like rustc.

use std::fmt;

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Legal but probably not what the operator wants.
    Warning,
    /// The daemon refuses to start with this configuration.
    Error,
}

/// One finding about a configuration, with where it is and what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// Name of the checked source (a file path, or a label such as `<admin>`).
    pub file: String,
    /// 1-based line; 0 when the configuration did not come from text (e.g. built in code).
    pub line: usize,
    /// 1-based column in characters; 0 when `line` is 0.
    pub column: usize,
    /// Dotted key path the finding is about, e.g. `transport.inline-send` or `peers[1].name`.
    pub path: String,
    /// What is wrong.
    pub message: String,
    /// What would be accepted (allowed values or range), when known.
    pub hint: Option<String>,
}

impl Diagnostic {
    /// True for an error (as opposed to a warning).
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        writeln!(f, "{level}: {}", self.message)?;
        if self.line == 0 {
            write!(f, " --> {}", self.file)?;
        } else {
            write!(f, " --> {}:{}:{}", self.file, self.line, self.column)?;
        }
        if !self.path.is_empty() {
            write!(f, "\n  = key: {}", self.path)?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "\n  = help: {hint}")?;
        }
        Ok(())
    }
}

/// All findings of one check, in source order for syntax and type errors, then semantic ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// True if any finding is an error.
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Diagnostic::is_error)
    }

    /// Number of errors.
    pub fn error_count(&self) -> usize {
        self.0.iter().filter(|d| d.is_error()).count()
    }

    /// The findings in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.0 {
            writeln!(f, "{d}\n")?;
        }
        let errors = self.error_count();
        let warnings = self.0.len() - errors;
        write!(f, "{errors} error(s), {warnings} warning(s)")
    }
}

impl std::error::Error for Diagnostics {}

/// Maps byte offsets of one text to 1-based line and character column.
#[derive(Debug)]
pub(crate) struct LineIndex<'a> {
    text: &'a str,
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self { text }
    }

    /// Line and column of `offset` (clamped to the text and to a char boundary).
    pub(crate) fn position(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_index_counts_lines_and_chars() {
        let idx = LineIndex::new("ab\nçd\n");
        assert_eq!(idx.position(0), (1, 1));
        assert_eq!(idx.position(2), (1, 3));
        assert_eq!(idx.position(3), (2, 1));
        // 'ç' is two bytes: offset 5 is the 'd', second character of line 2.
        assert_eq!(idx.position(5), (2, 2));
        // Inside a multi-byte char: clamps back to its start.
        assert_eq!(idx.position(4), (2, 1));
        assert_eq!(idx.position(999), (3, 1));
    }

    #[test]
    fn display_renders_like_rustc() {
        let d = Diagnostic {
            severity: Severity::Error,
            file: "a.toml".into(),
            line: 3,
            column: 7,
            path: "transport.version".into(),
            message: "unsupported version 3".into(),
            hint: Some("allowed: 1, 2".into()),
        };
        assert_eq!(
            d.to_string(),
            "error: unsupported version 3\n --> a.toml:3:7\n  = key: transport.version\n  = help: allowed: 1, 2"
        );
    }
}
