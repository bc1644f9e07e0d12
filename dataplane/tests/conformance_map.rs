//! CONFORMANCE.md maps every REQUIREMENTS ID, and every test it names exists.
#![forbid(unsafe_code)]

use std::fs;

#[test]
fn every_requirement_is_mapped_and_every_named_test_exists() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let ids = fs::read_to_string(format!("{dir}/requirements-ids.txt")).unwrap();
    let map = fs::read_to_string(format!("{dir}/CONFORMANCE.md")).unwrap();
    let sources = [
        fs::read_to_string(format!("{dir}/src/conn/tests.rs")).unwrap(),
        fs::read_to_string(format!("{dir}/tests/e2e.rs")).unwrap(),
        fs::read_to_string(format!("{dir}/tests/pool_scaling.rs")).unwrap(),
        fs::read_to_string(format!("{dir}/tests/threads.rs")).unwrap(),
    ]
    .concat();
    let rows: Vec<&str> = map
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ID"))
        .collect();
    for id in ids.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let row = rows
            .iter()
            .find(|r| r.split('|').nth(1).map(str::trim) == Some(id))
            .unwrap_or_else(|| panic!("{id} is not in CONFORMANCE.md"));
        let cols: Vec<&str> = row.split('|').collect();
        let (tests, note) = (cols[2].trim(), cols[3].trim());
        assert!(
            tests != "—" || !note.is_empty(),
            "{id}: no test and no reason"
        );
        for name in tests.split('`').skip(1).step_by(2) {
            assert!(
                sources.contains(&format!("fn {name}(")),
                "{id}: test {name} does not exist"
            );
        }
    }
}
