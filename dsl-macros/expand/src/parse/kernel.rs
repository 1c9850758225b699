//! `#[kernel(...)]`: the attribute's options and the function item.

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Block, Expr, Ident, ItemFn, MetaNameValue, Token, Visibility};

use super::body::check_body;
use super::signature::{Signature, parse_signature};
use super::{Errors, int_literal};

/// The options of `#[kernel(...)]`.
pub struct KernelArgs {
    /// Warps per thread block (`num_warps = N` or `num_warps = P`, P a `usize` comptime
    /// parameter; default 4).
    pub num_warps: Warps,
    /// The tile of the problem each block covers along x, y and z (`grid = [block_m, 1, 1]`):
    /// the generated grid function launches `cdiv(extent, tile)` blocks per axis. `None`: one
    /// block per unit of extent.
    pub grid: Option<[GridTile; 3]>,
}

/// One axis of `grid = [..]`: a literal number of units per block, or a comptime parameter's.
pub enum GridTile {
    /// An integer literal.
    Literal(syn::LitInt),
    /// A comptime parameter (a field of the kernel's comptime struct), a `usize`.
    Param(Ident),
}

/// `num_warps = ..`: a literal, or a comptime parameter's value (which the autotuner may
/// vary; the build checks it is in 1..=32).
pub enum Warps {
    /// An integer literal in 1..=32.
    Literal(u32),
    /// A comptime parameter (a field of the kernel's comptime struct), a `usize`.
    Param(Ident),
}

/// What `grid = ..` must be.
const GRID_HINT: &str = "write `grid = [X, Y, Z]`, each the units of the problem one block covers along that axis: an integer literal or a `usize` comptime parameter";

/// The three tiles of `grid = [x, y, z]`, or why not.
fn grid_tiles(value: &Expr, errors: &mut Errors) -> Option<[GridTile; 3]> {
    let Expr::Array(a) = value else {
        errors.at(value, GRID_HINT);
        return None;
    };
    let tiles: Vec<GridTile> = a
        .elems
        .iter()
        .filter_map(|e| match e {
            Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(i),
                ..
            }) => Some(GridTile::Literal(i.clone())),
            Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
                p.path.get_ident().cloned().map(GridTile::Param)
            }
            other => {
                errors.at(other, GRID_HINT);
                None
            }
        })
        .collect();
    if a.elems.len() != 3 {
        errors.at(a, GRID_HINT);
        return None;
    }
    tiles.try_into().ok()
}

impl Parse for KernelArgs {
    fn parse(input: ParseStream) -> syn::Result<KernelArgs> {
        let options = Punctuated::<MetaNameValue, Token![,]>::parse_terminated(input)?;
        let mut errors = Errors::default();
        let mut num_warps = Warps::Literal(4);
        let mut grid = None;
        for o in &options {
            if o.path.is_ident("num_warps") {
                match (&o.value, int_literal(&o.value)) {
                    (_, Some(n)) if (1..=32).contains(&n) => num_warps = Warps::Literal(n),
                    (Expr::Path(p), _) if p.qself.is_none() && p.path.get_ident().is_some() => {
                        if let Some(id) = p.path.get_ident() {
                            num_warps = Warps::Param(id.clone());
                        }
                    }
                    _ => errors.at(
                        &o.value,
                        "`num_warps` must be an integer literal in 1..=32 or a `usize` comptime \
                         parameter",
                    ),
                }
            } else if o.path.is_ident("grid") {
                grid = grid_tiles(&o.value, &mut errors);
            } else {
                errors.at(
                    &o.path,
                    "unknown `#[kernel]` option; the options are `num_warps = N` and `grid = [X, Y, Z]`",
                );
            }
        }
        errors.finish(KernelArgs { num_warps, grid })
    }
}

/// A kernel function, checked.
pub struct KernelFn {
    /// Attributes kept on the generated struct (doc comments and the like).
    pub attrs: Vec<Attribute>,
    /// The function's visibility, given to the generated struct.
    pub vis: Visibility,
    /// The kernel's name.
    pub name: Ident,
    /// Comptime and launch parameters.
    pub signature: Signature,
    /// The body as written (rewritten when generating).
    pub body: Block,
}

/// Attributes that still mean something on the generated struct (docs, lints, `cfg`).
const KEPT_ATTRS: &[&str] = &["doc", "cfg", "allow", "expect", "warn", "deny"];

/// Checks `item` as a kernel: the signature's parameter kinds and the body's constructs.
pub fn parse_kernel(item: ItemFn) -> syn::Result<KernelFn> {
    let mut errors = Errors::default();
    let signature = parse_signature(&item.sig, &mut errors);
    check_body(&item.block, &mut errors);
    for a in &item.attrs {
        if !KEPT_ATTRS.iter().any(|k| a.path().is_ident(k)) {
            errors.at(
                a,
                format_args!(
                    "this attribute cannot go on a kernel; kept attributes: {}",
                    KEPT_ATTRS.join(", ")
                ),
            );
        }
    }
    errors.finish(KernelFn {
        attrs: item.attrs,
        vis: item.vis,
        name: item.sig.ident,
        signature,
        body: *item.block,
    })
}

/// Checks that every comptime parameter `grid = [..]` and `num_warps = ..` name is one of `k`'s (a comptime
/// struct parameter's fields are checked by the compiler, at the same tokens).
pub fn check_grid(args: &KernelArgs, k: &KernelFn) -> syn::Result<()> {
    let mut errors = Errors::default();
    let sig = &k.signature;
    let warps = match &args.num_warps {
        Warps::Param(p) => Some(p),
        Warps::Literal(_) => None,
    };
    let grid = args.grid.iter().flatten().filter_map(|t| match t {
        GridTile::Param(p) => Some(p),
        GridTile::Literal(_) => None,
    });
    for p in grid.chain(warps) {
        if sig.comptime_struct.is_none() && !sig.comptime.iter().any(|c| c.name == *p) {
            let known: Vec<String> = sig.comptime.iter().map(|c| c.name.to_string()).collect();
            errors.at(
                p,
                format_args!(
                    "`{p}` is not a comptime parameter of `{}`; its comptime parameters are: {}",
                    k.name,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            );
        }
    }
    errors.finish(())
}
