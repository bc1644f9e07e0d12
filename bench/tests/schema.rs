//! The JSON documents match SCHEMA.md key by key, both ways, on real output of the binary.

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

const SCHEMA_MD: &str = include_str!("../SCHEMA.md");

/// The `| key | type | meaning |` rows of the section whose heading names `schema`.
fn documented(schema: &str) -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    let mut inside = false;
    for line in SCHEMA_MD.lines() {
        if line.starts_with("## ") {
            inside = line.contains(schema);
            continue;
        }
        if !inside {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if let [_, key, ty, ..] = cells.as_slice() {
            if let Some(k) = key.strip_prefix('`').and_then(|k| k.strip_suffix('`')) {
                rows.insert(k.to_string(), ty.to_string());
            }
        }
    }
    rows
}

fn type_ok(v: &Value, ty: &str) -> bool {
    let nullable = ty.ends_with(" or null");
    let base = ty.trim_end_matches(" or null");
    match v {
        Value::Null => nullable,
        Value::Bool(_) => base == "boolean",
        Value::Number(n) => base == "number" || (base == "integer" && (n.is_u64() || n.is_i64())),
        Value::String(_) => base == "string",
        Value::Array(a) => {
            base.starts_with("array")
                && (base != "array of string" || a.iter().all(Value::is_string))
        }
        Value::Object(_) => base == "object",
    }
}

/// Every key path in `v` (arrays of objects as `key[]`, their elements' keys as `key[].sub`), not looking
/// inside the `opaque` keys documented as a whole object.
fn paths(v: &Value, prefix: &str, opaque: &[String], out: &mut BTreeMap<String, Value>) {
    let Value::Object(m) = v else { return };
    for (k, x) in m {
        let p = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match x {
            Value::Array(a) if a.iter().any(Value::is_object) => {
                let p = format!("{p}[]");
                out.insert(p.clone(), x.clone());
                for e in a {
                    paths(e, &p, opaque, out);
                }
            }
            _ => {
                out.insert(p.clone(), x.clone());
                if !opaque.contains(&p) {
                    paths(x, &p, opaque, out);
                }
            }
        }
    }
}

fn check(doc: &Value, schema: &str) {
    let doc_rows = documented(schema);
    assert!(
        doc_rows.len() > 10,
        "SCHEMA.md section for {schema} not found"
    );
    let opaque: Vec<String> = doc_rows
        .iter()
        .filter(|(_, t)| t.as_str() == "object")
        .map(|(k, _)| k.clone())
        .collect();
    let mut found = BTreeMap::new();
    paths(doc, "", &opaque, &mut found);
    assert_eq!(doc["schema"], schema);
    for (k, v) in &found {
        if v.is_object() && !doc_rows.contains_key(k) {
            let inner = format!("{k}.");
            assert!(
                doc_rows.keys().any(|d| d.starts_with(&inner)),
                "{k} is in the output but not in SCHEMA.md"
            );
            continue;
        }
        let ty = doc_rows
            .get(k)
            .unwrap_or_else(|| panic!("{k} is in the output but not in SCHEMA.md"));
        assert!(type_ok(v, ty), "{k} = {v} is not {ty}");
    }
    for k in doc_rows.keys() {
        assert!(
            found.contains_key(k),
            "{k} is in SCHEMA.md but not in the output"
        );
    }
}

/// Runs `rpcrdma-bench ARGS... --out DIR`, which must succeed, and parses its JSON output.
fn bench_json<S: AsRef<std::ffi::OsStr>>(args: &[S], dir: &std::path::Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_rpcrdma-bench"))
        .args(args)
        .arg("--out")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn run_json_matches_the_documented_schema_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let doc = bench_json(
        &[
            "run",
            "--json",
            "--warmup",
            "0s",
            "--count",
            "20",
            "--no-progress",
            "--case",
            "null",
            "--case",
            "read/write-chunk/4KiB",
        ],
        dir.path(),
    );
    check(&doc, "rpcrdma-bench/run/1");
    assert_eq!(doc["cases"].as_array().unwrap().len(), 2);
    for f in ["hlog", "svg"] {
        let p = doc["files"][f].as_str().unwrap();
        assert!(std::fs::metadata(p).unwrap().len() > 0, "{f} not written");
    }
    // The file copy is the same document.
    let hlog = doc["files"]["hlog"].as_str().unwrap();
    let json = std::path::Path::new(hlog).with_extension("json");
    let copy: Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    assert_eq!(copy, doc);
}

/// An open-loop run fills the open-loop keys (numbers where the closed loop has null).
#[test]
fn open_loop_run_json_matches_the_documented_schema() {
    let dir = tempfile::tempdir().unwrap();
    let doc = bench_json(
        &[
            "run",
            "--json",
            "--warmup",
            "20ms",
            "--count",
            "40",
            "--rate",
            "4k",
            "--in-flight",
            "4",
            "--no-progress",
            "--case",
            "echo/inline/64",
        ],
        dir.path(),
    );
    check(&doc, "rpcrdma-bench/run/1");
    assert_eq!(doc["settings"]["rate_per_s"], 4000.0);
    let c = &doc["cases"][0];
    assert_eq!(
        (c["offered_per_s"].as_f64(), c["in_flight"].as_u64()),
        (Some(4000.0), Some(4))
    );
    assert_eq!(
        (c["count"].as_u64(), c["errors"].as_u64()),
        (Some(40), Some(0))
    );
    assert_eq!(c["co_corrected"], false);
}

#[test]
fn compare_json_matches_the_documented_schema_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let doc = bench_json(
        &[
            "compare",
            "--json",
            "--warmup",
            "50ms",
            "--duration",
            "200ms",
            "--no-progress",
        ],
        dir.path(),
    );
    check(&doc, "rpcrdma-bench/compare/1");
    // Raw ring NULL, four libtirpc rows, four of ours; libtirpc must have been built (CI installs it).
    assert_eq!(
        doc["rows"].as_array().unwrap().len(),
        9,
        "{}",
        doc["skipped"]
    );
    assert_eq!(doc["skipped"].as_array().unwrap().len(), 0);
    assert_eq!(doc["goals"].as_array().unwrap().len(), 3);
    assert!(doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["count"].as_u64().unwrap() > 0));
}

/// A stand-in for `rpcrdmad` (its documented CLI: `--version`, `--config FILE`) that plays the daemon
/// with the bench's loopback harness on the config's app socket.
fn fake_daemon(dir: &std::path::Path) -> std::path::PathBuf {
    let fake = dir.join("rpcrdmad");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && {{ echo 'rpcrdmad stand-in 0.0'; exit 0; }}\n\
             sock=$(sed -n 's/^app-socket *= *\"\\(.*\\)\"/\\1/p' \"$2\")\nexec {} loopback \"$sock\"\n",
            env!("CARGO_BIN_EXE_rpcrdma-bench")
        ),
    )
    .unwrap();
    let mut perm = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&fake, perm).unwrap();
    fake
}

#[test]
fn compare_measures_every_spawned_target_in_one_run_with_ratios_and_goals_per_target() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake_daemon(dir.path());
    let cfg = |name: &str, kind: &str| {
        let p = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &p,
            format!(
                "[daemon]\napp-socket = \"{d}/{name}.sock\"\nadmin-socket = \"{d}/{name}-admin.sock\"\n\
                 [provider]\nkind = \"{kind}\"\n",
                d = dir.path().display()
            ),
        )
        .unwrap();
        p
    };
    let (soft, mem) = (cfg("soft", "soft"), cfg("mem", "mem"));
    let os = std::ffi::OsStr::new;
    let mut args = [
        "compare",
        "--json",
        "--warmup",
        "20ms",
        "--duration",
        "100ms",
    ]
    .map(os)
    .to_vec();
    args.extend([os("--no-progress"), os("--spawn-daemons"), soft.as_os_str()]);
    args.extend([
        os("--spawn-daemons"),
        mem.as_os_str(),
        os("--rpcrdmad"),
        fake.as_os_str(),
    ]);
    let doc = bench_json(&args, dir.path());
    check(&doc, "rpcrdma-bench/compare/1");
    let labels: Vec<&str> = doc["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["rpcrdmad soft", "rpcrdmad mem"]);
    assert_eq!(doc["environment"]["target"]["provider"], "soft");
    assert_eq!(
        doc["skipped"].as_array().unwrap().len(),
        0,
        "{}",
        doc["skipped"]
    );
    let rows = doc["rows"].as_array().unwrap();
    // Raw ring NULL, four libtirpc rows, four rows per target.
    assert_eq!(rows.len(), 13);
    for l in &labels {
        let mine: Vec<_> = rows.iter().filter(|r| r["target"] == *l).collect();
        assert_eq!(mine.len(), 4, "{l}");
        assert!(mine
            .iter()
            .all(|r| r["path"] == "ours" && r["count"].as_u64() > Some(0)));
        let ratios = doc["ratios"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["target"] == *l)
            .count();
        assert_eq!(
            ratios, 5,
            "{l}: NULL vs ring and libtirpc, three more vs libtirpc"
        );
    }
    let goals = doc["goals"].as_array().unwrap();
    // Ring and READ goals for each target, the soft-iWARP goal for the soft one only.
    assert_eq!(goals.len(), 5, "{goals:#?}");
    let soft_goals: Vec<_> = goals
        .iter()
        .filter(|g| g["goal"].as_str().unwrap().starts_with("soft-iWARP"))
        .collect();
    assert_eq!(soft_goals.len(), 1);
    assert_eq!(soft_goals[0]["target"], "rpcrdmad soft");
    // The plot has a line per target and workload.
    let svg = std::fs::read_to_string(doc["svg"].as_str().unwrap()).unwrap();
    assert!(svg.contains("rpcrdmad mem NULL") && svg.contains("rpcrdmad soft READ 1 MiB"));
}
