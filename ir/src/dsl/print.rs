//! `kprint!`: printing from a kernel ([`crate::device_print`] gives the line format).

use crate::device_print::parse_format;
use crate::diag::Diagnostic;
use crate::kernel::{Loc, OpKind};

use super::value::{self, AsValue, Value};

/// One argument of [`kprint!`](crate::kprint): a scalar value, or one element of a tile
/// ([`at`]).
#[derive(Clone, Debug)]
pub struct PrintArg {
    value: Value,
    element: Option<Vec<usize>>,
}

impl<T: AsValue> From<T> for PrintArg {
    fn from(v: T) -> PrintArg {
        PrintArg {
            value: v.as_value(),
            element: None,
        }
    }
}

/// Element `index` of `tile`, as a [`kprint!`](crate::kprint) argument (printed by the
/// thread that holds it).
pub fn at<const N: usize>(tile: impl AsValue, index: [usize; N]) -> PrintElement {
    PrintElement(PrintArg {
        value: tile.as_value(),
        element: Some(index.to_vec()),
    })
}

/// A tile element to print (made by [`at`]).
#[derive(Clone, Debug)]
pub struct PrintElement(PrintArg);

impl From<PrintElement> for PrintArg {
    fn from(e: PrintElement) -> PrintArg {
        e.0
    }
}

/// Emits a `print` of `format` (`{}` placeholders) with `args`; what [`kprint!`](crate::kprint)
/// expands to.
#[track_caller]
pub fn print(format: &str, args: &[PrintArg]) {
    let loc = Loc::caller();
    let pieces = match parse_format(format) {
        Ok(p) => p,
        Err(e) => {
            value::fail(Diagnostic::new(loc, e));
            return;
        }
    };
    if pieces.len() != args.len() + 1 {
        value::fail(Diagnostic::new(
            loc,
            format!(
                "`{format}` has {} placeholder(s) but {} argument(s) were given",
                pieces.len() - 1,
                args.len()
            ),
        ));
        return;
    }
    let mut elements = Vec::with_capacity(args.len());
    for a in args {
        match &a.element {
            None => elements.push(None),
            Some(idx) => match idx.iter().map(|&i| u32::try_from(i).ok()).collect() {
                Some(idx) => elements.push(Some(idx)),
                None => {
                    value::fail(Diagnostic::new(
                        loc,
                        format!("element {idx:?} is too large"),
                    ));
                    return;
                }
            },
        }
    }
    let values: Vec<Value> = args.iter().map(|a| a.value).collect();
    value::emit_effect(OpKind::Print { pieces, elements }, &values, loc);
}

/// Prints a line from the kernel, once per block: `kprint!("m = {}, o[0, 1] = {}", m,
/// at(&o, [0, 1]))`. Scalars and single tile elements ([`at`]) may be printed; the line
/// starts with the block index. On the GPU the line goes through `vprintf` (the driver
/// prints it when the host synchronises); the interpreter writes the same text.
#[macro_export]
macro_rules! kprint {
    ($format:literal $(, $arg:expr)* $(,)?) => {
        $crate::dsl::print::print($format, &[$($crate::dsl::print::PrintArg::from($arg)),*])
    };
}
