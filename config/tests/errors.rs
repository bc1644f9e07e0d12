//! Every key's error path: wrong type, out of range, unknown key at every level, with positions.

mod common;

use common::{errors, full_sample, leaves, tables, HOST};
use rpcrdma_config::*;

/// Required keys of array-of-table elements, appended after the line under test.
fn required_after(header: &str, key: &str) -> String {
    let mut s = String::new();
    if header == "[[listeners]]" && key != "address" {
        s.push_str("address = \"127.0.0.1\"\n");
    }
    if header == "[[peers]]" {
        if key != "name" {
            s.push_str("name = \"p\"\n");
        }
        if key != "address" {
            s.push_str("address = \"127.0.0.1\"\n");
        }
    }
    s
}

/// Splits `a.b[].c` into the TOML header (`[a.b]` or `[[a.b]]`) and the key `c`.
fn header_and_key(path: &str) -> (String, String) {
    let (table, key) = path.rsplit_once('.').expect("every leaf is inside a table");
    let header = match table.strip_suffix("[]") {
        Some(arr) => format!("[[{arr}]]"),
        None => format!("[{table}]"),
    };
    (header, key.to_owned())
}

/// The path a diagnostic names for `path` (the element of an array is `x[0]`).
fn reported_path(path: &str) -> String {
    path.replace("[]", "[0]")
}

#[test]
fn wrong_type_for_every_key_is_located() {
    let all = leaves(&full_sample());
    assert_eq!(all.len(), 59, "the sample sets every key of the schema");
    for (path, good) in all {
        let bad = match good {
            toml::Value::String(_) => "1",
            _ => "\"wrong\"",
        };
        let (header, key) = header_and_key(&path);
        let text = format!("{header}\n{key} = {bad}\n{}", required_after(&header, &key));
        let errs = errors(&text);
        assert_eq!(errs.len(), 1, "{path}: {errs:#?}");
        let e = &errs[0];
        assert_eq!(e.path, reported_path(&path), "{path}");
        assert_eq!((e.line, e.column), (2, key.len() + 4), "{path}: {e}");
        assert!(
            e.message.contains("invalid type") || e.message.contains("wanted"),
            "{path}: {}",
            e.message
        );
        assert!(
            e.hint
                .as_deref()
                .is_some_and(|h| h.starts_with("expected ")),
            "{path}: {e}"
        );
    }
}

#[test]
fn unknown_key_at_every_table_level_is_located_with_allowed_keys() {
    let tables = tables();
    assert_eq!(tables.len(), 13, "{tables:?}");
    for header in tables {
        let text = if header.is_empty() {
            "zzz = 1\n".to_owned()
        } else {
            format!("{header}\nzzz = 1\n{}", required_after(&header, "zzz"))
        };
        let errs = errors(&text);
        assert_eq!(errs.len(), 1, "{header}: {errs:#?}");
        let e = &errs[0];
        let line = if header.is_empty() { 1 } else { 2 };
        assert_eq!((e.line, e.column), (line, 1), "{header}: {e}");
        assert_eq!(e.message, "unknown field `zzz`", "{header}");
        let hint = e.hint.as_deref().unwrap_or_default();
        assert!(
            hint.starts_with("expected ") && hint.contains('`'),
            "{header}: {hint}"
        );
    }
}

#[test]
fn unknown_enum_value_lists_allowed_values() {
    for (text, path, allowed) in [
        (
            "[daemon]\nlog-format = \"xml\"\n",
            "daemon.log-format",
            "`human` or `json`",
        ),
        (
            "[daemon]\nlog-level = \"loud\"\n",
            "daemon.log-level",
            "`trace`",
        ),
        (
            "[cpu.idle]\npolicy = \"nap\"\n",
            "cpu.idle.policy",
            "`spin`, `backoff`, `yield`",
        ),
        (
            "[provider]\nkind = \"rxe\"\n",
            "provider.kind",
            "`soft`, `ibv`, `mem`",
        ),
        (
            "[provider.ibv]\nexposure = \"mw\"\n",
            "provider.ibv.exposure",
            "`auto`, `memory-window`, `region`",
        ),
    ] {
        let errs = errors(text);
        assert_eq!(errs.len(), 1, "{text}");
        let e = &errs[0];
        assert_eq!(e.path, path);
        assert_eq!(e.line, 2);
        assert!(e.message.starts_with("unknown variant"), "{e}");
        assert!(
            e.hint.as_deref().unwrap_or_default().contains(allowed),
            "{e}"
        );
    }
}

#[test]
fn enum_given_a_number_still_gets_allowed_values() {
    let errs = errors("[daemon]\nlog-level = 3\n");
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].line, errs[0].column), (2, 13));
    assert_eq!(
        errs[0].hint.as_deref(),
        Some("expected one of `error`, `warn`, `info`, `debug`, `trace`")
    );
}

#[test]
fn integer_overflow_and_negative_are_type_errors() {
    for v in ["-1", "4294967296"] {
        let errs = errors(&format!("[transport]\ncredits = {v}\n"));
        assert_eq!(errs.len(), 1, "{v}");
        assert_eq!((errs[0].line, errs[0].column), (2, 11), "{v}");
        assert_eq!(errs[0].hint.as_deref(), Some("expected u32"), "{v}");
    }
}

/// (section header, key line, path, column of the value, hint fragment)
const OUT_OF_RANGE: &[(&str, &str, &str, usize, &str)] = &[
    (
        "[cpu]",
        "poll-cores = [0, 7]",
        "cpu.poll-cores[1]",
        18,
        "usable core ids: 0, 1",
    ),
    (
        "[cpu]",
        "poll-cores = [1, 1]",
        "cpu.poll-cores[1]",
        18,
        "one poll thread per core",
    ),
    (
        "[cpu]",
        "control-core = 2",
        "cpu.control-core",
        16,
        "usable core ids: 0, 1",
    ),
    (
        "[cpu.idle]",
        "backoff-max-us = 0",
        "cpu.idle.backoff-max-us",
        18,
        "1..=1000000",
    ),
    (
        "[cpu.idle]",
        "park-after-us = 10",
        "cpu.idle.park-after-us",
        17,
        "at least 100",
    ),
    (
        "[provider.ibv]",
        "port = 0",
        "provider.ibv.port",
        8,
        "1..=255",
    ),
    (
        "[provider.ibv]",
        "gid-index = 256",
        "provider.ibv.gid-index",
        13,
        "0..=255",
    ),
    (
        "[provider.ibv]",
        "ird = 0",
        "provider.ibv.ird",
        7,
        "1..=255",
    ),
    (
        "[provider.ibv]",
        "ord = 256",
        "provider.ibv.ord",
        7,
        "1..=255",
    ),
    (
        "[provider.ibv]",
        "device = \"\"",
        "provider.ibv.device",
        10,
        "device name",
    ),
    (
        "[provider.soft]",
        "fpdu-size = 100",
        "provider.soft.fpdu-size",
        13,
        "256..=65535",
    ),
    (
        "[provider.soft]",
        "fpdu-size = 65536",
        "provider.soft.fpdu-size",
        13,
        "256..=65535",
    ),
    (
        "[provider.soft]",
        "max-pending = 0",
        "provider.soft.max-pending",
        15,
        "1..=65536",
    ),
    (
        "[provider.soft]",
        "mpa-revision = 3",
        "provider.soft.mpa-revision",
        16,
        "1, 2",
    ),
    (
        "[provider.soft]",
        "ird = 0",
        "provider.soft.ird",
        7,
        "1..=128",
    ),
    (
        "[provider.soft]",
        "ord = 129",
        "provider.soft.ord",
        7,
        "1..=128",
    ),
    (
        "[transport]",
        "version = 3",
        "transport.version",
        11,
        "1, 2",
    ),
    (
        "[transport]",
        "inline-send = 512",
        "transport.inline-send",
        15,
        "1024..=262144",
    ),
    (
        "[transport]",
        "inline-send = 263168\n[pools]\nsend-buffer-size = 524288",
        "transport.inline-send",
        15,
        "1024..=262144",
    ),
    (
        "[transport]",
        "credits = 0",
        "transport.credits",
        11,
        "1..=4096",
    ),
    (
        "[transport]",
        "backchannel-credits = 4097\n[pools]\nsend-buffers = 99999\nrecv-buffers = 99999",
        "transport.backchannel-credits",
        23,
        "0..=4096",
    ),
    (
        "[transport]",
        "ddp-threshold = 0",
        "transport.ddp-threshold",
        17,
        "1..=262144",
    ),
    (
        "[transport]",
        "max-segments-per-chunk = 0",
        "transport.max-segments-per-chunk",
        26,
        "1..=16",
    ),
    (
        "[transport]",
        "max-chunks-per-list = 5",
        "transport.max-chunks-per-list",
        23,
        "1..=4",
    ),
    (
        "[transport]",
        "v2-first-message-timeout-ms = 0",
        "transport.v2-first-message-timeout-ms",
        31,
        "1..=600000",
    ),
    (
        "[transport.xcharext]",
        "min-rbsiz = 512",
        "transport.xcharext.min-rbsiz",
        13,
        "1024..=",
    ),
    (
        "[transport.xcharext]",
        "max-rbsiz = 1024\nmin-rbsiz = 2048",
        "transport.xcharext.max-rbsiz",
        13,
        "at least 2048",
    ),
    (
        "[pools]",
        "connections = 0",
        "pools.connections",
        15,
        "1..=65536",
    ),
    (
        "[pools]",
        "send-buffers = 10",
        "pools.send-buffers",
        16,
        "at least 548",
    ),
    (
        "[pools]",
        "recv-buffers = 11",
        "pools.recv-buffers",
        16,
        "at least 12",
    ),
    (
        "[pools]",
        "send-buffer-size = 2048",
        "pools.send-buffer-size",
        20,
        "at least 4096",
    ),
    (
        "[pools]",
        "recv-buffer-size = 4096",
        "pools.recv-buffer-size",
        20,
        "at least 8192",
    ),
    (
        "[daemon]",
        "app-socket = \"\"",
        "daemon.app-socket",
        14,
        "socket path",
    ),
    (
        "[daemon]",
        "admin-socket = \"/tmp/rpcrdmad/app.sock\"",
        "daemon.admin-socket",
        16,
        "two different",
    ),
    (
        "[daemon]",
        "metrics-listen = \"localhost\"",
        "daemon.metrics-listen",
        18,
        "ip:port",
    ),
    ("[apps]", "max-apps = 0", "apps.max-apps", 12, "1..=4096"),
    (
        "[apps]",
        "sq-entries = 100",
        "apps.sq-entries",
        14,
        "2, 4, 8",
    ),
    ("[apps]", "cq-entries = 1", "apps.cq-entries", 14, "2, 4, 8"),
    (
        "[apps]",
        "arena-size = 65537",
        "apps.arena-size",
        14,
        "multiple of 4096",
    ),
    (
        "[apps]",
        "arena-size = 4096",
        "apps.arena-size",
        14,
        "65536..=",
    ),
    (
        "[[listeners]]",
        "address = \"localhost:20049\"",
        "listeners[0].address",
        11,
        "ip:port",
    ),
    (
        "[[peers]]",
        "address = \"1.2.3.4:99999\"\nname = \"p\"",
        "peers[0].address",
        11,
        "ip:port",
    ),
    (
        "[[peers]]",
        "name = \"\"\naddress = \"::1\"",
        "peers[0].name",
        8,
        "non-empty",
    ),
    (
        "[[peers]]",
        "reconnect-initial-ms = 0\nname = \"p\"\naddress = \"::1\"",
        "peers[0].reconnect-initial-ms",
        24,
        "1..=3600000",
    ),
    (
        "[[peers]]",
        "reconnect-max-ms = 5\nname = \"p\"\naddress = \"::1\"",
        "peers[0].reconnect-max-ms",
        20,
        "at least 100",
    ),
];

#[test]
fn out_of_range_values_are_located_with_allowed_range() {
    for &(header, line, path, column, hint) in OUT_OF_RANGE {
        let text = format!("{header}\n{line}\n");
        let errs = errors(&text);
        let at_path: Vec<_> = errs.iter().filter(|e| e.path == path).collect();
        assert_eq!(at_path.len(), 1, "{text}: {errs:#?}");
        let e = at_path[0];
        assert_eq!((e.line, e.column), (2, column), "{text}: {e}");
        assert!(
            e.hint.as_deref().unwrap_or_default().contains(hint),
            "{text}: {e}"
        );
        assert_eq!(errs.len(), 1, "{text}: no knock-on errors: {errs:#?}");
    }
}

#[test]
fn several_type_errors_reported_in_one_run_in_source_order() {
    let text = "\
[transport]
credits = \"many\"
version = true
[transport.xcharext]
min-rbsiz = \"big\"
[apps]
bogus = 1
[[peers]]
name = 5
address = \"::1\"
[[peers]]
name = \"b\"
address = []
";
    let errs = errors(text);
    let got: Vec<_> = errs
        .iter()
        .map(|e| (e.line, e.column, e.path.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (2, 11, "transport.credits"),
            (3, 11, "transport.version"),
            (5, 13, "transport.xcharext.min-rbsiz"),
            (7, 1, "apps.bogus"),
            (9, 8, "peers[0].name"),
            (13, 11, "peers[1].address"),
        ]
    );
}

#[test]
fn several_semantic_errors_reported_in_one_run() {
    let text = "\
[cpu]
poll-cores = [5]
[transport]
version = 2
inline-recv = 2048
[apps]
sq-entries = 3
[[peers]]
name = \"a\"
address = \"192.0.2.1\"
[[peers]]
name = \"a\"
address = \"192.0.2.2\"
";
    let errs = errors(text);
    let got: Vec<_> = errs
        .iter()
        .map(|e| (e.line, e.column, e.path.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (2, 15, "cpu.poll-cores[0]"),
            (5, 15, "transport.inline-recv"),
            (12, 8, "peers[1].name"),
            (7, 14, "apps.sq-entries"),
        ]
    );
}

#[test]
fn several_syntax_errors_reported_in_one_run() {
    let report = check("a = \nb = [1,\n[x\n", "s.toml", &HOST);
    assert!(report.config.is_none());
    let got: Vec<_> = report
        .diagnostics
        .iter()
        .map(|d| (d.line, d.column))
        .collect();
    assert_eq!(got.first(), Some(&(1, 5)), "{}", report.diagnostics);
    assert!(got.iter().any(|&(l, _)| l == 3), "{}", report.diagnostics);
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "sorted, no duplicates: {got:?}"
    );
}

#[test]
fn display_renders_file_line_column_and_help() {
    let report = check("[transport]\ninline-send = 512\n", "conf/x.toml", &HOST);
    let text = report.diagnostics.to_string();
    assert!(
        text.starts_with(
            "error: `transport.inline-send` = 512 cannot be advertised (RFC 8797 expresses 1 KiB to 256 KiB)\n --> conf/x.toml:2:15\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("  = help: allowed: 1024..=262144, a multiple of 1024"),
        "{text}"
    );
    assert!(text.ends_with("1 error(s), 0 warning(s)"), "{text}");
}
