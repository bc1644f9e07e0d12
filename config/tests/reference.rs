//! `CONFIG.md` documents exactly the keys of the schema, with the defaults the code uses.

mod common;

use std::collections::BTreeMap;

use common::{full_sample, leaves, HOST};
use rpcrdma_config::*;

/// Rows of the reference table: key -> default column.
fn reference_rows() -> BTreeMap<String, String> {
    let text = include_str!("../CONFIG.md");
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cols: Vec<_> = line.split(" | ").collect();
        let key = cols[0]
            .trim_start_matches("| ")
            .trim_matches('`')
            .to_owned();
        let default = cols[2].to_owned();
        assert!(
            rows.insert(key.clone(), default).is_none(),
            "{key} documented twice"
        );
    }
    rows
}

/// Defaults as the code has them, rendered as TOML; element keys from a minimal element.
fn code_defaults() -> BTreeMap<String, String> {
    let minimal = "[[listeners]]\naddress = \"127.0.0.1\"\n[[peers]]\nname = \"p\"\naddress = \"127.0.0.1\"\n";
    let with_elements = check(minimal, "m.toml", &HOST)
        .config
        .expect("minimal elements");
    let mut out = BTreeMap::new();
    for cfg in [Config::default(), with_elements] {
        for (k, v) in leaves(&cfg) {
            out.insert(k, format!("`{v}`"));
        }
    }
    for required in ["listeners[].address", "peers[].name", "peers[].address"] {
        out.insert(required.to_owned(), "**required**".to_owned());
    }
    out
}

#[test]
fn reference_lists_every_key_and_no_other() {
    let documented: Vec<_> = reference_rows().into_keys().collect();
    let mut schema: Vec<_> = leaves(&full_sample()).into_iter().map(|(k, _)| k).collect();
    schema.sort();
    assert_eq!(documented, schema);
}

#[test]
fn reference_defaults_match_the_code() {
    let defaults = code_defaults();
    for (key, documented) in reference_rows() {
        let expected = defaults.get(&key).map_or("absent", String::as_str);
        assert_eq!(documented, expected, "default of `{key}` in CONFIG.md");
    }
}
