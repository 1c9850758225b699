//! Every error the `#[kernel]` macro reports, checked against the committed `.stderr` files
//! in `tests/ui/` (regenerate with `TRYBUILD=overwrite` and review the diff).

#[test]
fn kernel_macro_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
}
