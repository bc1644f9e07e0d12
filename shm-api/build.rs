//! Declares the `loom` cfg so `--cfg loom` builds pass `unexpected_cfgs` (the crate inherits workspace lints).
fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
