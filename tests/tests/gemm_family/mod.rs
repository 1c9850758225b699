//! What the CPU and GPU tests of the gemm family (`gemm`, `gemm_bias_act`, `gemm_alpha_beta`)
//! share: the comptime map of one specialisation.

use std::collections::BTreeMap;

use kiln_ir::DType;
use kiln_ir::dsl::{ComptimeValue, KernelDef, Spec};

/// The comptime map of `def` for one tile `(BM, BN, BK, STAGES)`, B layout, dtype and extra
/// values (`act`), the rest at their defaults.
pub fn comptime(
    def: &dyn KernelDef,
    (bm, bn, bk, stages): (usize, usize, usize, usize),
    b_col_major: bool,
    dtype: DType,
    extra: &[(&str, String)],
) -> BTreeMap<String, ComptimeValue> {
    let mut o: Vec<(String, String)> = [
        ("BM", bm.to_string()),
        ("BN", bn.to_string()),
        ("BK", bk.to_string()),
        ("STAGES", stages.to_string()),
        ("b_col_major", b_col_major.to_string()),
        ("dtype", dtype.to_string()),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect();
    o.extend(extra.iter().map(|(n, v)| (n.to_string(), v.clone())));
    Spec::from_defaults(def, &o)
        .unwrap_or_else(|e| panic!("{e}"))
        .comptime
}
