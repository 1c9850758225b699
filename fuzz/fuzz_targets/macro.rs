//! Arbitrary token streams into `#[kernel]`, `#[kernel_fn]` and `#[comptime]`: the fuzzer's
//! bytes, read as text up to the first NUL as the attribute's arguments and the rest as the
//! item, whenever both lex as Rust tokens. The expansion must return tokens (the item or
//! spanned errors), never panic or hang.

#![no_main]

use std::str::FromStr;

use libfuzzer_sys::fuzz_target;
use proc_macro2::TokenStream;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (args, item) = text.split_once('\0').unwrap_or(("", &text));
    if let (Ok(args), Ok(item)) = (TokenStream::from_str(args), TokenStream::from_str(item)) {
        let _ = kiln_macros_expand::kernel(args, item.clone());
        let _ = kiln_macros_expand::kernel_fn(TokenStream::new(), item.clone());
        let _ = kiln_macros_expand::comptime(args, item);
    }
});
