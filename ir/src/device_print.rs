//! In-kernel printing: the line format shared by the interpreter and the GPU (`vprintf`).
//!
//! A `kprint!("m = {}, acc[3, 5] = {}", m, at(&acc, [3, 5]))` prints, once per block,
//! `[block (x, y, z)] m = 1.500000, acc[3, 5] = -0.250000`: integers in decimal (`%d`), floats
//! (f32, bf16 and f16, widened to double as C varargs are) with six decimals (`%f`), booleans
//! as 0 or 1, infinities as `inf`/`-inf` and NaN as `nan`. The GPU formats with the driver's
//! printf and the interpreter with [`format_value`], which writes what that printf writes.

use crate::types::DType;

/// A value to print, as the interpreter holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PrintValue {
    /// An integer (i32, or a bool as 0 or 1).
    Int(i64),
    /// A float, printed as C's `%f` prints the double it widens to.
    Float(f64),
}

/// Splits a format string at its `{}` placeholders (`{{` and `}}` print braces); the pieces
/// are one more than the placeholders.
pub fn parse_format(format: &str) -> Result<Vec<String>, String> {
    let mut pieces = Vec::new();
    let mut piece = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('{', Some('{')) | ('}', Some('}')) => {
                chars.next();
                piece.push(c);
            }
            ('{', Some('}')) => {
                chars.next();
                pieces.push(std::mem::take(&mut piece));
            }
            ('{', _) => {
                return Err(format!(
                    "`{format}`: only `{{}}` placeholders are supported (write `{{{{` for a brace)"
                ));
            }
            ('}', _) => {
                return Err(format!(
                    "`{format}`: unmatched `}}` (write `}}}}` for a brace)"
                ));
            }
            _ => piece.push(c),
        }
    }
    pieces.push(piece);
    Ok(pieces)
}

/// The line prefix naming block `(x, y, z)`.
pub fn block_prefix(block: [i32; 3]) -> String {
    format!("[block ({}, {}, {})] ", block[0], block[1], block[2])
}

/// `value` as the GPU's printf writes it for [`c_conversion`]'s conversion.
pub fn format_value(value: PrintValue) -> String {
    match value {
        PrintValue::Int(i) => i.to_string(),
        PrintValue::Float(x) if x.is_nan() => "nan".to_string(),
        PrintValue::Float(x) if x.is_infinite() => if x > 0.0 { "inf" } else { "-inf" }.to_string(),
        PrintValue::Float(x) => format!("{x:.6}"),
    }
}

/// The C conversion printing an element of `dtype` (floats are passed as doubles).
pub fn c_conversion(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::Bf16 | DType::F16 => "%f",
        DType::I32 | DType::Bool => "%d",
        DType::U32 => "%u",
    }
}

/// The whole line for `pieces` and `values` (as many values as placeholders), without the
/// newline.
pub fn format_line(block: [i32; 3], pieces: &[String], values: &[PrintValue]) -> String {
    let mut line = block_prefix(block);
    for (i, piece) in pieces.iter().enumerate() {
        line.push_str(piece);
        if let Some(&v) = values.get(i) {
            line.push_str(&format_value(v));
        }
    }
    line
}

/// `s` with C printf's `%` escaped, for a format string.
pub fn escape_percent(s: &str) -> String {
    s.replace('%', "%%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_split_at_placeholders() {
        assert_eq!(parse_format("a {} b {}").unwrap(), ["a ", " b ", ""]);
        assert_eq!(parse_format("{{x}} = {}").unwrap(), ["{x} = ", ""]);
        assert!(parse_format("{:?}").unwrap_err().contains("only `{}`"));
        assert!(parse_format("a } b").unwrap_err().contains("unmatched"));
    }

    #[test]
    fn values_print_as_c_printf_does() {
        assert_eq!(format_value(PrintValue::Float(1.5)), "1.500000");
        assert_eq!(format_value(PrintValue::Float(-0.0)), "-0.000000");
        assert_eq!(
            format_value(PrintValue::Float(1e20)),
            "100000000000000000000.000000"
        );
        assert_eq!(format_value(PrintValue::Float(f64::NEG_INFINITY)), "-inf");
        assert_eq!(format_value(PrintValue::Float(f64::NAN)), "nan");
        assert_eq!(format_value(PrintValue::Int(-7)), "-7");
        let pieces = parse_format("m = {}, n = {}").unwrap();
        assert_eq!(
            format_line(
                [1, 0, 2],
                &pieces,
                &[PrintValue::Float(0.25), PrintValue::Int(3)]
            ),
            "[block (1, 0, 2)] m = 0.250000, n = 3"
        );
    }
}
