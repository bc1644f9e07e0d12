//! Parsing: TOML text to [`Config`] with every syntax and type error located.
//!
//! serde stops at the first error, so a failing document is re-deserialized one subtree at a
//! time (each table key, each array element) to report every failing key in one run.

use std::ops::Range;

use toml::de::{DeArray, DeTable, DeValue};
use toml::Spanned;

use crate::check::{Path, Seg};
use crate::diag::{Diagnostic, LineIndex, Severity};
use crate::Config;

/// A parsed document kept for locating keys named by semantic checks.
pub(crate) struct Doc<'i> {
    root: Spanned<DeTable<'i>>,
    lines: LineIndex<'i>,
    file: String,
}

impl<'i> Doc<'i> {
    /// Line and column of the value at `path`, if that key is in the document.
    pub(crate) fn locate_exact(&self, path: &Path) -> Option<(usize, usize)> {
        let (found, span) = self.walk(path);
        (found == path.segs().len()).then(|| self.lines.position(span.start))
    }

    /// Line and column of the value at `path`, or of its nearest present ancestor.
    pub(crate) fn locate(&self, path: &Path) -> (usize, usize) {
        self.lines.position(self.walk(path).1.start)
    }

    /// How many segments of `path` exist, and the span of the deepest one.
    fn walk(&self, path: &Path) -> (usize, Range<usize>) {
        let mut found = 0;
        let mut span: Range<usize> = 0..0;
        let mut cur: Option<&DeValue<'i>> = None;
        let mut table: Option<&DeTable<'i>> = Some(self.root.get_ref());
        for seg in path.segs() {
            let next = match (seg, table, cur) {
                (Seg::Key(k), Some(t), _) => t.get(*k),
                (Seg::Index(i), _, Some(DeValue::Array(a))) => a.get(*i),
                _ => None,
            };
            let Some(next) = next else { break };
            found += 1;
            span = next.span();
            cur = Some(next.get_ref());
            table = next.get_ref().as_table();
        }
        (found, span)
    }

    pub(crate) fn file(&self) -> &str {
        &self.file
    }
}

/// Outcome of parsing: the config (if every key deserialized) and the findings so far.
pub(crate) struct Parsed<'i> {
    pub(crate) config: Option<Config>,
    pub(crate) doc: Doc<'i>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

/// Parses `text` (named `file` in diagnostics) into a [`Config`] without semantic checks.
pub(crate) fn parse<'i>(text: &'i str, file: &str) -> Parsed<'i> {
    let (root, syntax_errors) = DeTable::parse_recoverable(text);
    let doc = Doc {
        root,
        lines: LineIndex::new(text),
        file: file.to_owned(),
    };
    let mut diagnostics = Vec::new();
    if !syntax_errors.is_empty() {
        for e in &syntax_errors {
            diagnostics.push(from_toml_error(&doc, e, String::new()));
        }
        diagnostics.sort_by_key(|d| (d.line, d.column));
        diagnostics.dedup();
        return Parsed {
            config: None,
            doc,
            diagnostics,
        };
    }
    match deserialize(doc.root.clone()) {
        Ok(config) => Parsed {
            config: Some(config),
            doc,
            diagnostics,
        },
        Err(_) => {
            let mut probe = Probe {
                doc: &doc,
                out: &mut diagnostics,
            };
            let root = doc.root.get_ref();
            let mut stack = Vec::new();
            probe.table(root, &mut stack);
            diagnostics.sort_by_key(|d| (d.line, d.column));
            if diagnostics.is_empty() {
                // Unreachable in practice: the whole failed but no part did. Report the whole.
                if let Err(e) = deserialize(doc.root.clone()) {
                    diagnostics.push(from_toml_error(&doc, &e, String::new()));
                }
            }
            Parsed {
                config: None,
                doc,
                diagnostics,
            }
        }
    }
}

fn deserialize(root: Spanned<DeTable<'_>>) -> Result<Config, toml::de::Error> {
    serde::Deserialize::deserialize(toml::de::Deserializer::from(root))
}

/// One step from the root to a probed subtree: the key or index, and the span of its value.
#[derive(Clone)]
enum Step<'i> {
    Key(Spanned<std::borrow::Cow<'i, str>>, Range<usize>),
    Index(usize, Range<usize>),
}

struct Probe<'a, 'i> {
    doc: &'a Doc<'i>,
    out: &'a mut Vec<Diagnostic>,
}

impl<'i> Probe<'_, 'i> {
    /// Probes each key of `table` alone; recurses into failing tables and arrays of tables.
    fn table(&mut self, table: &DeTable<'i>, stack: &mut Vec<Step<'i>>) {
        for (key, value) in table.iter() {
            stack.push(Step::Key(key.clone(), value.span()));
            self.value(value, stack);
            stack.pop();
        }
    }

    fn value(&mut self, value: &Spanned<DeValue<'i>>, stack: &mut Vec<Step<'i>>) {
        let Err(err) = deserialize(wrap(stack, value.clone())) else {
            return;
        };
        match value.get_ref() {
            DeValue::Table(t) if !t.is_empty() => {
                let before = self.out.len();
                self.table(t, stack);
                if self.out.len() == before {
                    self.push(&err, stack);
                }
            }
            DeValue::Array(a) if a.iter().any(|v| v.get_ref().is_table()) => {
                let before = self.out.len();
                for (i, item) in a.iter().enumerate() {
                    stack.push(Step::Index(i, item.span()));
                    if let Err(e) = deserialize(wrap(stack, item.clone())) {
                        let depth = stack.len();
                        descend_to_error(item, &e, stack);
                        self.push(&e, stack);
                        stack.truncate(depth);
                    }
                    stack.pop();
                }
                if self.out.len() == before {
                    self.push(&err, stack);
                }
            }
            _ => self.push(&err, stack),
        }
    }

    fn push(&mut self, err: &toml::de::Error, stack: &[Step<'i>]) {
        let path = stack.iter().fold(String::new(), |mut acc, step| {
            match step {
                Step::Key(k, _) => {
                    if !acc.is_empty() {
                        acc.push('.');
                    }
                    acc.push_str(k.get_ref());
                }
                Step::Index(i, _) => acc.push_str(&format!("[{i}]")),
            }
            acc
        });
        self.out.push(from_toml_error(self.doc, err, path));
    }
}

/// Extends `stack` with the keys of `value` whose values contain the error's position, so an
/// error inside an array element names the key (`peers[0].name`) rather than the element.
fn descend_to_error<'i>(
    value: &Spanned<DeValue<'i>>,
    err: &toml::de::Error,
    stack: &mut Vec<Step<'i>>,
) {
    let Some(at) = err.span().map(|s| s.start) else {
        return;
    };
    let mut cur = value;
    while let DeValue::Table(t) = cur.get_ref() {
        let Some((k, v)) = t.iter().find(|(_, v)| v.span().contains(&at)) else {
            return;
        };
        stack.push(Step::Key(k.clone(), v.span()));
        cur = v;
    }
}

/// Builds a document holding only `leaf` at the position `stack` names, keeping original spans.
fn wrap<'i>(stack: &[Step<'i>], leaf: Spanned<DeValue<'i>>) -> Spanned<DeTable<'i>> {
    let mut value = leaf;
    for (depth, step) in stack.iter().enumerate().rev() {
        let parent_span = match depth.checked_sub(1).and_then(|d| stack.get(d)) {
            Some(Step::Key(_, span)) | Some(Step::Index(_, span)) => span.clone(),
            None => 0..0,
        };
        value = match step {
            Step::Key(k, _) => {
                let mut t = DeTable::new();
                t.insert(k.clone(), value);
                Spanned::new(parent_span, DeValue::Table(t))
            }
            Step::Index(_, _) => {
                let mut a = DeArray::new();
                a.push(value);
                Spanned::new(parent_span, DeValue::Array(a))
            }
        };
    }
    match value.into_inner() {
        DeValue::Table(t) => Spanned::new(0..0, t),
        _ => Spanned::new(0..0, DeTable::new()),
    }
}

/// Converts a toml/serde error into a diagnostic; serde's "…, expected X" tail becomes the hint.
fn from_toml_error(doc: &Doc<'_>, err: &toml::de::Error, path: String) -> Diagnostic {
    let (line, column) = doc.lines.position(err.span().map_or(0, |s| s.start));
    let raw = err.message().trim_end();
    let (message, hint) = match raw.split_once(", expected ") {
        Some((m, h)) => (m.to_owned(), Some(format!("expected {h}"))),
        None => (raw.to_owned(), enum_hint(&path)),
    };
    Diagnostic {
        severity: Severity::Error,
        file: doc.file.clone(),
        line,
        column,
        path,
        message,
        hint,
    }
}

/// Allowed values of enum keys, for errors where serde names none (e.g. a number given).
fn enum_hint(path: &str) -> Option<String> {
    let last = path.rsplit('.').next().unwrap_or(path);
    let values = match last {
        "log-format" => "`human` or `json`",
        "log-level" => "one of `error`, `warn`, `info`, `debug`, `trace`",
        "policy" => "`spin`, `backoff` or `yield`",
        "kind" | "provider" => "`soft`, `ibv` or `mem`",
        "receive-queue" => "`shared` or `per-connection`",
        "exposure" => "`auto`, `memory-window` or `region`",
        _ => return None,
    };
    Some(format!("expected {values}"))
}
