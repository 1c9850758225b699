//! The macros on thousands of mutations of real items (the examples' `attention` and `gemm`
//! kernels, and the `AttentionParams` comptime struct; token trees deleted, duplicated,
//! swapped or replaced at any depth): every expansion must return tokens (the item, or
//! spanned errors), never panic. The `macro` fuzz target (`fuzz/`) feeds them arbitrary token
//! streams for longer.

use proc_macro2::{Group, TokenStream, TokenTree};

/// A small deterministic generator (xorshift64*); the seed is printed on failure.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The item `name` (a function or a struct) of example file `src`, without its outer
/// attributes, and the arguments of its first (the macro's).
fn example_item(src: &str, name: &str) -> (TokenStream, TokenStream) {
    let file = syn::parse_file(src).expect("the example parses");
    let (attrs, item) = file
        .items
        .into_iter()
        .find_map(|i| match i {
            syn::Item::Fn(mut f) if f.sig.ident == name => {
                let attrs = std::mem::take(&mut f.attrs);
                Some((attrs, quote::quote!(#f)))
            }
            syn::Item::Struct(mut s) if s.ident == name => {
                let attrs = std::mem::take(&mut s.attrs);
                Some((attrs, quote::quote!(#s)))
            }
            _ => None,
        })
        .expect("the item is in the file");
    let macro_attr = attrs.iter().find(|a| !a.path().is_ident("doc"));
    let args = match macro_attr.map(|a| a.meta.clone()) {
        Some(syn::Meta::List(l)) => l.tokens,
        _ => TokenStream::new(),
    };
    (args, item)
}

/// `ts` with one mutation at a random depth.
fn mutate(ts: TokenStream, rng: &mut Rng) -> TokenStream {
    let mut trees: Vec<TokenTree> = ts.into_iter().collect();
    if trees.is_empty() {
        return TokenStream::new();
    }
    let i = rng.below(trees.len());
    // Descend into a group half of the time.
    if let TokenTree::Group(g) = &trees[i]
        && rng.below(2) == 0
    {
        let mut inner = Group::new(g.delimiter(), mutate(g.stream(), rng));
        inner.set_span(g.span());
        trees[i] = TokenTree::Group(inner);
        return trees.into_iter().collect();
    }
    match rng.below(4) {
        0 => {
            trees.remove(i);
        }
        1 => {
            let t = trees[i].clone();
            trees.insert(i, t);
        }
        2 => {
            let j = rng.below(trees.len());
            trees.swap(i, j);
        }
        _ => {
            let j = rng.below(trees.len());
            trees[i] = trees[j].clone();
        }
    }
    trees.into_iter().collect()
}

#[test]
fn mutated_kernels_never_panic_the_macro() {
    let seed = std::env::var("KILN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15u64);
    let mut rng = Rng(seed | 1);
    let sources = [
        (
            include_str!("../../../examples/src/attention.rs"),
            "attention",
        ),
        (include_str!("../../../examples/src/gemm.rs"), "gemm"),
        (
            include_str!("../../../examples/src/attention.rs"),
            "AttentionParams",
        ),
    ];
    for (src, name) in sources {
        let (args, item) = example_item(src, name);
        for case in 0..1500 {
            let mut m = item.clone();
            for _ in 0..1 + rng.below(3) {
                m = mutate(m, &mut rng);
            }
            let a = if rng.below(8) == 0 {
                mutate(args.clone(), &mut rng)
            } else {
                args.clone()
            };
            let outcome = std::panic::catch_unwind(|| {
                let _ = kiln_macros_expand::kernel(a.clone(), m.clone());
                let _ = kiln_macros_expand::kernel_fn(TokenStream::new(), m.clone());
                let _ = kiln_macros_expand::comptime(a.clone(), m.clone());
            });
            assert!(
                outcome.is_ok(),
                "{name} mutation {case} (KILN_SEED={seed}) panicked the macro:\n{m}"
            );
        }
    }
}
