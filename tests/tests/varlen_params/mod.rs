//! The comptime values the varlen attention kernels take for one packed batch of
//! `kiln_tests::varlen` (that crate cannot name the example's comptime struct).

use kiln_examples::attention::AttentionParams;
use kiln_tests::varlen::Varlen;

/// `c`'s comptime values with `block_n` keys and `block_m` query rows per block.
pub fn params(c: &Varlen, block_n: usize, block_m: usize) -> AttentionParams {
    AttentionParams {
        d: c.d,
        dv: 0,
        causal: c.causal,
        block_n,
        kv_group: c.h / c.h_kv,
        dtype: c.dtype,
        window_left: c.window.0,
        window_right: c.window.1,
        attention_chunk: 0,
        softcap: c.softcap,
        block_m,
    }
}
